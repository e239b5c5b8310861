//! Serde through the strict profile ([`to_vec`], [`encode_into`],
//! [`from_slice`]) and [`RawValue`], an owned, validated data item.

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cbor::{self, validate};
use crate::error::{DecodeError, EncodeError};
use crate::transcode::{Item, Writer, definite_lengths};

/// Strings up to this size are decoded through a stack buffer; longer ones
/// are read into their own allocation (whose size is bounded by the input).
const SCRATCH: usize = 256;

/// Encodes `value` as one data item in the strict profile.
///
/// ```
/// let bytes = capwire_envelope::to_vec(&("a", 1)).unwrap();
/// assert_eq!(bytes, [0x82, 0x61, b'a', 0x01]);
/// ```
///
/// # Errors
/// [`EncodeError::Serialize`] when `value`'s `Serialize` fails;
/// [`EncodeError::Profile`] when it has no strict encoding (integers beyond
/// 64 bits, map keys other than integers and strings, duplicate keys, nesting
/// deeper than [`MAX_DEPTH`](crate::MAX_DEPTH)).
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    // Most values are small: one allocation instead of a few doublings.
    let mut out = Vec::with_capacity(128);
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Encodes `value` as one data item in the strict profile, appending it to
/// `out`. On error `out` is left as it was.
///
/// Values whose `Serialize` does not know its length up front (for example
/// `#[serde(flatten)]` structs) are still written with definite lengths:
/// the encoding is rewritten with the counts found, without building a
/// value tree.
///
/// # Errors
/// As [`to_vec`].
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let start = out.len();
    let result = encode_direct(value, out).and_then(|()| match validate(&out[start..]) {
        Err(DecodeError::IndefiniteLength { .. }) => {
            // ciborium wrote an array or map of unknown length as an
            // indefinite-length item: count its items and rewrite it.
            let definite = definite_lengths(&out[start..]).map_err(EncodeError::Profile)?;
            out.truncate(start);
            out.extend_from_slice(&definite);
            validate(&out[start..]).map_err(EncodeError::Profile)
        }
        other => other.map_err(EncodeError::Profile),
    });
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_direct<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    ciborium::into_writer(value, &mut *out).map_err(|e| match e {
        ciborium::ser::Error::Value(msg) => EncodeError::Serialize(msg),
        ciborium::ser::Error::Io(io) => EncodeError::Serialize(io.to_string()),
    })
}

/// Decodes one data item in the strict profile: the bytes are validated
/// first, then deserialized into `T`.
///
/// ```
/// let v: (String, u8) = capwire_envelope::from_slice(&[0x82, 0x61, b'a', 0x01]).unwrap();
/// assert_eq!(v, ("a".to_string(), 1));
/// // A non-shortest integer is rejected even though its value is fine.
/// assert!(capwire_envelope::from_slice::<u8>(&[0x18, 0x01]).is_err());
/// ```
///
/// # Errors
/// Any breach of the profile, or [`DecodeError::Deserialize`] when valid CBOR
/// does not fit `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    validate(bytes)?;
    decode_validated(bytes)
}

/// Deserializes an item that has already passed [`validate`].
pub(crate) fn decode_validated<T: DeserializeOwned>(item: &[u8]) -> Result<T, DecodeError> {
    let mut scratch = [0u8; SCRATCH];
    ciborium::de::from_reader_with_buffer(item, &mut scratch).map_err(|e| {
        DecodeError::Deserialize(match e {
            ciborium::de::Error::Semantic(_, msg) => msg,
            other => other.to_string(),
        })
    })
}

/// An owned data item that has passed the strict profile.
///
/// It holds CBOR bytes, not a decoded value: handlers decode it into their
/// own type with [`RawValue::decode`], and relays pass it on untouched.
/// Cloning is cheap (the bytes are shared).
///
/// ```
/// use capwire_envelope::RawValue;
/// let v = RawValue::encode(&[1, 2, 3]).unwrap();
/// assert_eq!(v.as_bytes(), [0x83, 1, 2, 3]);
/// assert_eq!(v.decode::<Vec<u8>>().unwrap(), [1, 2, 3]);
/// assert_eq!(format!("{v:?}"), "RawValue([1, 2, 3])");
/// assert!(RawValue::from_slice(&[0x83, 1, 2]).is_err());
/// ```
///
/// Through serde, a `RawValue` is transcoded: serialized as the value it
/// holds (in any format, e.g. JSON), and deserialized from any value the
/// profile can hold. Neither direction builds a value tree: serializing
/// walks the bytes, and deserializing writes the bytes as it goes, so the
/// memory used is about the size of the encoding. CBOR to `RawValue` to
/// CBOR gives the same bytes.
///
/// ```
/// use capwire_envelope::RawValue;
/// let v: RawValue = serde_json::from_str(r#"{"a": [1, -2, "x", null, 1.5]}"#).unwrap();
/// assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"a":[1,-2,"x",null,1.5]}"#);
/// // Values outside the profile are errors: here a duplicate key.
/// assert!(serde_json::from_str::<RawValue>(r#"{"a": 1, "a": 2}"#).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawValue(Bytes);

impl RawValue {
    /// The CBOR `null` item.
    pub fn null() -> Self {
        Self(Bytes::from_static(&[0xf6]))
    }

    /// Encodes a value.
    ///
    /// # Errors
    /// As [`to_vec`].
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, EncodeError> {
        // A boxed slice (the vector shrunk in place) becomes `Bytes` with no
        // shared header to allocate.
        to_vec(value).map(|v| Self(v.into_boxed_slice().into()))
    }

    /// Decodes into `T`.
    ///
    /// # Errors
    /// [`DecodeError::Deserialize`] when the item does not fit `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        decode_validated(&self.0)
    }

    /// Validates and copies one data item.
    ///
    /// # Errors
    /// Any breach of the strict profile.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        validate(bytes)?;
        Ok(Self(Bytes::copy_from_slice(bytes)))
    }

    /// Validates one data item and keeps the buffer without copying.
    ///
    /// # Errors
    /// Any breach of the strict profile.
    pub fn from_bytes(bytes: Bytes) -> Result<Self, DecodeError> {
        validate(&bytes)?;
        Ok(Self(bytes))
    }

    /// Wraps bytes that hold one data item already checked against the
    /// strict profile (for example a slice of a record that
    /// [`decode_frame`](crate::decode_frame) accepted), without checking
    /// them again.
    ///
    /// Nothing unsafe happens if they do not: decoding stays memory-safe
    /// and bounded, but the value may then not be in the strict profile, so
    /// only pass bytes a decoder of this crate has validated.
    pub fn dangerous_from_validated(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// Copies an item that has already passed validation.
    pub(crate) fn from_validated(bytes: &[u8]) -> Self {
        Self(Bytes::copy_from_slice(bytes))
    }

    /// The encoded item.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The encoded item, as shared bytes.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// `true` for the `null` item.
    pub fn is_null(&self) -> bool {
        *self.0 == [0xf6]
    }
}

impl Default for RawValue {
    /// `null`.
    fn default() -> Self {
        Self::null()
    }
}

impl fmt::Debug for RawValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawValue({})", cbor::diagnostic(&self.0))
    }
}

impl AsRef<[u8]> for RawValue {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Serialize for RawValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Item::new(&self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = Vec::new();
        d.deserialize_any(Writer::new(&mut out))?;
        validate(&out).map_err(|e| serde::de::Error::custom(EncodeError::Profile(e)))?;
        Ok(Self(out.into()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Flat {
        name: String,
        #[serde(flatten)]
        inner: Inner,
    }

    #[test]
    fn flatten_is_encoded_with_definite_lengths() {
        let v = Flat {
            name: "x".into(),
            inner: Inner { a: 7 },
        };
        let bytes = to_vec(&v).unwrap();
        assert_eq!(bytes[0], 0xa2, "{bytes:02x?}");
        assert_eq!(from_slice::<Flat>(&bytes).unwrap(), v);
    }

    #[test]
    fn values_outside_the_profile_do_not_encode() {
        let mut out = vec![9];
        let e = encode_into(&u128::MAX, &mut out).unwrap_err();
        assert!(
            matches!(e, EncodeError::Profile(DecodeError::Tag { .. })),
            "{e}"
        );
        assert_eq!(out, [9], "out is restored");
        let mut keyed = BTreeMap::new();
        keyed.insert(vec![1u8], 1);
        assert!(matches!(
            to_vec(&keyed),
            Err(EncodeError::Profile(DecodeError::MapKeyType { .. }))
        ));
        let mut deep = serde_json::json!(0);
        for _ in 0..crate::MAX_DEPTH + 1 {
            deep = serde_json::json!([deep]);
        }
        assert!(matches!(
            to_vec(&deep),
            Err(EncodeError::Profile(DecodeError::DepthExceeded { .. }))
        ));
    }

    #[test]
    fn floats_use_the_shortest_exact_form() {
        for v in [
            0.0,
            -0.0,
            1.5,
            0.1,
            1e300,
            f64::INFINITY,
            f64::NAN,
            65504.0,
            3.4e38,
        ] {
            let bytes = to_vec(&v).unwrap();
            let back: f64 = from_slice(&bytes).unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v}");
        }
        let f: f32 = from_slice(&to_vec(&1.1f32).unwrap()).unwrap();
        assert_eq!(f, 1.1f32);
    }

    #[test]
    fn type_mismatch_is_a_deserialize_error() {
        let bytes = to_vec(&"text").unwrap();
        assert!(matches!(
            from_slice::<u32>(&bytes),
            Err(DecodeError::Deserialize(_))
        ));
    }

    #[test]
    fn raw_value_transcodes_through_serde() {
        let v = RawValue::encode(&serde_json::json!({"b": [1, "x"], "a": null})).unwrap();
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json, serde_json::json!({"b": [1, "x"], "a": null}));
        let back: RawValue = serde_json::from_value(json).unwrap();
        assert_eq!(
            back.decode::<serde_json::Value>().unwrap(),
            v.decode::<serde_json::Value>().unwrap()
        );
        assert!(RawValue::null().is_null());
        assert_eq!(RawValue::default(), RawValue::null());
        let strings = RawValue::encode("a long string").unwrap();
        assert_eq!(strings.decode::<String>().unwrap(), "a long string");
        let long = "y".repeat(SCRATCH * 4);
        assert_eq!(
            RawValue::encode(&long).unwrap().decode::<String>().unwrap(),
            long
        );
        let bytes = ciborium::Value::Bytes(vec![7; SCRATCH * 4]);
        let back: ciborium::Value = RawValue::encode(&bytes).unwrap().decode().unwrap();
        assert_eq!(back, bytes);
    }
}
