//! The body of the `json_cbor` fuzz target, shared with its property-test
//! twin (`tests/json_cbor_twin.rs`): the CLI's JSON-to-CBOR mapping
//! (`capwire::json`) on arbitrary bytes.
//!
//! The input is tried both ways:
//!
//! - as JSON text: if it parses, `json_to_cbor` returns a strict item or a
//!   typed error, never a panic; for every item, `cbor_to_json` gives JSON
//!   that maps back to the same bytes, and so does that JSON printed as
//!   text and parsed again (what a user of the CLI does);
//! - as one strict CBOR item: if it validates, `cbor_to_json` succeeds and
//!   its JSON maps back to the same item, up to the order of map keys (a
//!   JSON object keeps its keys sorted) and NaN payloads (every NaN is
//!   `{"$float": "nan"}`); from there on the bytes are fixed, also through
//!   text.

use capwire::envelope::{RawValue, validate};
use capwire::json::{cbor_to_json, json_to_cbor};
use ciborium::value::Value as Cbor;
use serde_json::Value as Json;

/// Checks one input. Panics only when a property is broken.
pub(crate) fn check(data: &[u8]) {
    if let Ok(json) = serde_json::from_slice::<Json>(data) {
        from_json(&json);
    }
    if let Ok(item) = RawValue::from_slice(data) {
        from_cbor(&item);
    }
}

/// `json` maps to a strict item or a typed error; an item round-trips.
pub(crate) fn from_json(json: &Json) {
    match json_to_cbor(json) {
        Ok(item) => {
            assert!(
                validate(item.as_bytes()).is_ok(),
                "json_to_cbor wrote an item outside the profile: {item:?}"
            );
            from_cbor(&item);
        }
        // A typed error with a message; nothing else to hold it to.
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// A strict item's JSON maps back to the same item, except that its maps'
/// keys may come back in another order (a JSON object keeps its keys
/// sorted) and a NaN with a payload comes back as the plain NaN; that item
/// then maps back to itself byte for byte, also through text.
pub(crate) fn from_cbor(item: &RawValue) {
    let json = match cbor_to_json(item) {
        Ok(json) => json,
        Err(e) => panic!("a strict item has no JSON form: {e} ({item:?})"),
    };
    let again = match json_to_cbor(&json) {
        Ok(again) => again,
        Err(e) => panic!("{item:?} -> {json} does not map back: {e}"),
    };
    assert_eq!(
        sorted(&again),
        sorted(item),
        "{item:?} -> {json} maps back to another value"
    );
    let json_again = cbor_to_json(&again).expect("a mapped item maps back");
    assert_eq!(json_again, json, "{again:?} maps to other JSON");
    let text = serde_json::to_string(&json).expect("a JSON value prints");
    let parsed: Json = match serde_json::from_str(&text) {
        Ok(parsed) => parsed,
        Err(e) => panic!("{item:?} printed as {text}, which does not parse: {e}"),
    };
    match json_to_cbor(&parsed) {
        Ok(third) => assert_eq!(
            third.as_bytes(),
            again.as_bytes(),
            "{item:?} printed as {text} maps back to other bytes"
        ),
        Err(e) => panic!("{item:?} printed as {text} does not map back: {e}"),
    }
}

/// The item with every map's pairs sorted by their encoded keys and every
/// NaN made the plain one.
fn sorted(item: &RawValue) -> Vec<u8> {
    fn sort(value: Cbor) -> Cbor {
        match value {
            Cbor::Array(items) => Cbor::Array(items.into_iter().map(sort).collect()),
            Cbor::Map(pairs) => {
                let mut pairs: Vec<(Vec<u8>, Cbor, Cbor)> = pairs
                    .into_iter()
                    .map(|(k, v)| {
                        let key = RawValue::encode(&k).expect("a key encodes");
                        (key.as_bytes().to_vec(), k, sort(v))
                    })
                    .collect();
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
                Cbor::Map(pairs.into_iter().map(|(_, k, v)| (k, v)).collect())
            }
            // JSON shows every NaN as `{"$float": "nan"}`: a payload is lost.
            Cbor::Float(f) if f.is_nan() => Cbor::Float(f64::NAN),
            other => other,
        }
    }
    let value: Cbor = item.decode().expect("a strict item decodes");
    RawValue::encode(&sort(value))
        .expect("a sorted item encodes")
        .as_bytes()
        .to_vec()
}
