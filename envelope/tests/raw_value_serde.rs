//! `RawValue` through serde: CBOR to `RawValue` to JSON to `RawValue` gives
//! exactly what the earlier, tree-based transcoding gave (decode into a
//! `ciborium::Value`, serialize that; deserialize a `ciborium::Value`,
//! encode that), in every step and also when a step fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use capwire_envelope::{MAX_DEPTH, RawValue, from_slice, to_vec};
use ciborium::Value;
use proptest::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The tree-based transcoding, as the reference.
#[derive(Debug)]
struct TreeRaw(RawValue);

impl Serialize for TreeRaw {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tree: Value = self.0.decode().map_err(serde::ser::Error::custom)?;
        tree.serialize(s)
    }
}

impl<'de> Deserialize<'de> for TreeRaw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let tree = Value::deserialize(d)?;
        RawValue::encode(&tree)
            .map(TreeRaw)
            .map_err(serde::de::Error::custom)
    }
}

/// Integers over the whole range the profile has (-2^64 ..= 2^64-1).
fn integer() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i8>().prop_map(i128::from),
        any::<i64>().prop_map(i128::from),
        any::<u64>().prop_map(i128::from),
        (0..=u64::MAX).prop_map(|n| -1 - i128::from(n)),
    ]
    .prop_map(|n| Value::Integer(n.try_into().unwrap()))
}

/// Any value the profile holds, NaN and infinities included, with map keys
/// of every allowed kind (text, integers, bytes, and mixed, so that JSON,
/// which turns keys into text, can make two keys equal).
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        integer(),
        any::<f64>().prop_map(Value::Float),
        any::<f32>().prop_map(|f| Value::Float(f.into())),
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0),
            Just(65504.0),
            Just(1e300)
        ]
        .prop_map(Value::Float),
        "\\PC{0,12}".prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Bytes),
    ];
    let key = prop_oneof![
        "[a-c0-2]{0,2}".prop_map(Value::Text),
        (-3i64..3).prop_map(|n| Value::Integer(n.into())),
        proptest::collection::vec(0u8..2, 0..2).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..30).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..8).prop_map(|pairs| {
                // Unique keys, so that the value is in the profile.
                let mut seen = Vec::new();
                let pairs = pairs
                    .into_iter()
                    .filter(|(k, _)| {
                        let fresh = !seen.contains(k);
                        seen.push(k.clone());
                        fresh
                    })
                    .collect();
                Value::Map(pairs)
            }),
        ]
    })
}

/// `Ok` values, or only the fact that it failed (messages may differ).
fn outcome<T, E>(r: Result<T, E>) -> Option<T> {
    r.ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn cbor_to_raw_value_is_byte_identical(v in value()) {
        let bytes = to_vec(&v).unwrap();
        let raw: RawValue = from_slice(&bytes).unwrap();
        prop_assert_eq!(raw.as_bytes(), &bytes[..]);
        let tree: TreeRaw = from_slice(&bytes).unwrap();
        prop_assert_eq!(tree.0.as_bytes(), &bytes[..]);
        // And back to CBOR, alone and inside a record.
        prop_assert_eq!(to_vec(&raw).unwrap(), bytes.clone());
        let record = to_vec(&(1u8, &raw, "x")).unwrap();
        prop_assert_eq!(record, to_vec(&(1u8, &TreeRaw(raw.clone()), "x")).unwrap());
    }

    #[test]
    fn json_round_trips_agree_with_the_tree(v in value()) {
        let raw = RawValue::from_slice(&to_vec(&v).unwrap()).unwrap();
        let tree = TreeRaw(raw.clone());

        // RawValue -> JSON text (fails alike, e.g. for byte-string keys).
        let json = outcome(serde_json::to_string(&raw));
        prop_assert_eq!(&json, &outcome(serde_json::to_string(&tree)));
        // RawValue -> serde_json::Value.
        let json_value = outcome(serde_json::to_value(&raw));
        prop_assert_eq!(&json_value, &outcome(serde_json::to_value(&tree)));

        if let Some(json) = json {
            // JSON text -> RawValue (fails alike, e.g. for keys that JSON
            // made equal).
            let back = outcome(serde_json::from_str::<RawValue>(&json));
            let tree_back = outcome(serde_json::from_str::<TreeRaw>(&json)).map(|t| t.0);
            prop_assert_eq!(&back, &tree_back);
        }
        if let Some(json_value) = json_value {
            // serde_json::Value -> RawValue.
            let back = outcome(serde_json::from_value::<RawValue>(json_value.clone()));
            let tree_back = outcome(serde_json::from_value::<TreeRaw>(json_value)).map(|t| t.0);
            prop_assert_eq!(back, tree_back);
        }
    }
}

#[test]
fn json_that_leaves_the_profile_is_an_error() {
    // Keys made equal, at any depth.
    for bad in [r#"{"a": 1, "a": 2}"#, r#"[{"k": [{"x": 0, "x": 0}]}]"#] {
        let e = serde_json::from_str::<RawValue>(bad).unwrap_err();
        assert!(e.to_string().contains("duplicate map key"), "{bad}: {e}");
    }
    // One level more than the profile allows.
    let deep = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
    serde_json::from_str::<RawValue>(&deep(MAX_DEPTH)).unwrap();
    let e = serde_json::from_str::<RawValue>(&deep(MAX_DEPTH + 1)).unwrap_err();
    assert!(e.to_string().contains("nesting deeper"), "{e}");
    // Objects nested in arrays count the same.
    let mixed = format!("{}1{}", r#"{"a":["#.repeat(17), "]}".repeat(17));
    assert!(serde_json::from_str::<RawValue>(&mixed).is_err());
}

#[test]
fn integers_beyond_64_bits_are_an_error() {
    use serde::de::IntoDeserializer;
    use serde::de::value::Error;
    fn from_i128(n: i128) -> Result<RawValue, Error> {
        RawValue::deserialize(n.into_deserializer())
    }
    fn from_u128(n: u128) -> Result<RawValue, Error> {
        RawValue::deserialize(n.into_deserializer())
    }
    let ff = [0xff; 8];
    let lowest = from_i128(-1 - i128::from(u64::MAX)).unwrap();
    assert_eq!(lowest.as_bytes(), [&[0x3b][..], &ff].concat());
    let highest = from_u128(u128::from(u64::MAX)).unwrap();
    assert_eq!(highest.as_bytes(), [&[0x1b][..], &ff].concat());
    assert_eq!(from_i128(-24).unwrap().as_bytes(), [0x37]);
    let e = from_i128(-2 - i128::from(u64::MAX)).unwrap_err();
    assert!(e.to_string().contains("beyond 64 bits"), "{e}");
    assert!(from_i128(1 + i128::from(u64::MAX)).is_err());
    assert!(from_u128(u128::MAX).is_err());
}

#[test]
fn flattened_records_carry_raw_values_with_definite_lengths() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Inner {
        detail: RawValue,
    }
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Outer {
        name: String,
        #[serde(flatten)]
        inner: Inner,
    }
    let v = Outer {
        name: "x".into(),
        inner: Inner {
            detail: RawValue::encode(&serde_json::json!({"list": [1, 2, {"k": null}]})).unwrap(),
        },
    };
    let bytes = to_vec(&v).unwrap();
    assert_eq!(bytes[0], 0xa2, "a definite map of two pairs: {bytes:02x?}");
    assert_eq!(from_slice::<Outer>(&bytes).unwrap(), v);
    let json = serde_json::to_string(&v).unwrap();
    assert_eq!(json, r#"{"name":"x","detail":{"list":[1,2,{"k":null}]}}"#);
    assert_eq!(serde_json::from_str::<Outer>(&json).unwrap(), v);
}
