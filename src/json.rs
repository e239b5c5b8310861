//! JSON on the command line, CBOR on the wire: the mapping the `capwire`
//! tool uses for args and results.
//!
//! JSON has no byte strings, no map keys other than text, and no integers
//! beyond 64 bits, so those CBOR items are written as one-key JSON objects
//! whose key starts with `$`:
//!
//! | CBOR                               | JSON                                  |
//! |------------------------------------|---------------------------------------|
//! | `null`, `true`, `false`            | the same                              |
//! | integer in -2^63 ..= 2^64-1        | a number                              |
//! | integer below -2^63                | `{"$int": "-18446744073709551616"}`   |
//! | float (finite)                     | a number with a fraction or exponent  |
//! | float NaN (any payload), infinity   | `{"$float": "nan" \| "inf" \| "-inf"}`|
//! | text string                        | a string                              |
//! | byte string                        | `{"$bytes": "00ff"}` (lowercase hex)  |
//! | array                              | an array                              |
//! | map whose keys are all text        | an object                             |
//! | any other map                      | `{"$map": [[key, value], ...]}`       |
//!
//! A JSON number without a fraction or exponent is an integer; one with
//! them (`1.0`, `1e3`) is a float. Going from JSON to CBOR, `$int` also
//! accepts any integer in range, `$bytes` accepts upper-case hex, and a map
//! whose only key really is `"$bytes"` (or another of these names) is
//! written with `$map`: `{"$map": [["$bytes", "text"]]}`. Every value the
//! mapping produces from CBOR maps back to the same CBOR value; the keys of
//! a map written as a JSON object come back sorted, as JSON objects keep
//! them, so the bytes are the same once a map's keys are in that order.
//! JSON has one NaN: a NaN with a payload comes back as `f9 7e00`.
//!
//! ```
//! use capwire::json::{cbor_to_json, json_to_cbor};
//! let json: serde_json::Value = serde_json::from_str(
//!     r#"{"name": "x", "blob": {"$bytes": "00ff"}, "by_id": {"$map": [[1, "one"]]}}"#,
//! ).unwrap();
//! let cbor = json_to_cbor(&json).unwrap();
//! assert_eq!(cbor_to_json(&cbor).unwrap(), json);
//! ```

use capwire_envelope::RawValue;
use ciborium::value::{Integer, Value as Cbor};
use serde_json::{Map, Number, Value as Json};

/// How deeply arrays and maps may nest (the wire's limit, WIRE.md 2.1).
pub const MAX_DEPTH: usize = 32;

/// Why a JSON value has no CBOR form here, or a CBOR item no JSON form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonMapError {
    /// A `$`-form was malformed: the message says which and why.
    #[error("{0}")]
    Form(String),
    /// Arrays and maps nest deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A map key that is not an integer, text or bytes.
    #[error("a map key must be an integer, a string or {{\"$bytes\": ...}}")]
    BadKey,
    /// The value breaks the strict CBOR profile (for example a key twice).
    #[error("not a valid CBOR value: {0}")]
    Cbor(String),
}

/// The CBOR item a JSON value stands for (see the [module docs](self)).
///
/// # Errors
/// [`JsonMapError`] for a malformed `$` form, a bad map key, a nesting
/// deeper than [`MAX_DEPTH`], or a duplicate key.
pub fn json_to_cbor(json: &Json) -> Result<RawValue, JsonMapError> {
    let value = to_cbor(json, 0)?;
    RawValue::encode(&value).map_err(|e| JsonMapError::Cbor(e.to_string()))
}

/// The JSON form of a CBOR item (see the [module docs](self)).
///
/// # Errors
/// [`JsonMapError::Cbor`] if the item does not decode (it always does for
/// a [`RawValue`] a decoder of this crate produced).
pub fn cbor_to_json(cbor: &RawValue) -> Result<Json, JsonMapError> {
    let value: Cbor = cbor
        .decode()
        .map_err(|e| JsonMapError::Cbor(e.to_string()))?;
    to_json(&value, 0)
}

fn form(message: impl Into<String>) -> JsonMapError {
    JsonMapError::Form(message.into())
}

fn to_cbor(json: &Json, depth: usize) -> Result<Cbor, JsonMapError> {
    Ok(match json {
        Json::Null => Cbor::Null,
        Json::Bool(b) => Cbor::Bool(*b),
        Json::String(s) => Cbor::Text(s.clone()),
        Json::Number(n) => number(n)?,
        Json::Array(items) => {
            let depth = deeper(depth)?;
            Cbor::Array(
                items
                    .iter()
                    .map(|i| to_cbor(i, depth))
                    .collect::<Result<_, _>>()?,
            )
        }
        Json::Object(map) => {
            if let Some(special) = special_form(map, depth)? {
                return Ok(special);
            }
            let depth = deeper(depth)?;
            // In key order, whatever order the map keeps (serde_json's
            // `preserve_order`, which another crate may turn on, keeps
            // the text's).
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Cbor::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| Ok((Cbor::Text(k.clone()), to_cbor(v, depth)?)))
                    .collect::<Result<_, JsonMapError>>()?,
            )
        }
    })
}

fn deeper(depth: usize) -> Result<usize, JsonMapError> {
    if depth >= MAX_DEPTH {
        Err(JsonMapError::TooDeep)
    } else {
        Ok(depth + 1)
    }
}

fn number(n: &Number) -> Result<Cbor, JsonMapError> {
    if let Some(u) = n.as_u64() {
        Ok(Cbor::Integer(u.into()))
    } else if let Some(i) = n.as_i64() {
        Ok(Cbor::Integer(i.into()))
    } else if let Some(f) = n.as_f64() {
        Ok(Cbor::Float(f))
    } else {
        Err(form(format!("{n} is not a number CBOR can hold")))
    }
}

/// `$bytes`, `$map`, `$int`, `$float`; `None` for an ordinary object.
fn special_form(map: &Map<String, Json>, depth: usize) -> Result<Option<Cbor>, JsonMapError> {
    let mut entries = map.iter();
    let (Some((key, value)), None) = (entries.next(), entries.next()) else {
        return Ok(None);
    };
    Ok(Some(match key.as_str() {
        "$bytes" => Cbor::Bytes(hex_decode(value)?),
        "$int" => Cbor::Integer(big_int(value)?),
        "$float" => Cbor::Float(special_float(value)?),
        "$map" => {
            let depth = deeper(depth)?;
            let Json::Array(pairs) = value else {
                return Err(form("$map takes an array of [key, value] pairs"));
            };
            let mut out = Vec::with_capacity(pairs.len());
            for pair in pairs {
                let Some([k, v]) = pair.as_array().map(Vec::as_slice) else {
                    return Err(form("each $map entry is a [key, value] pair"));
                };
                let key = to_cbor(k, depth)?;
                if !matches!(key, Cbor::Integer(_) | Cbor::Text(_) | Cbor::Bytes(_)) {
                    return Err(JsonMapError::BadKey);
                }
                out.push((key, to_cbor(v, depth)?));
            }
            Cbor::Map(out)
        }
        _ => return Ok(None),
    }))
}

fn hex_decode(value: &Json) -> Result<Vec<u8>, JsonMapError> {
    let Json::String(text) = value else {
        return Err(form("$bytes takes a string of hex digits"));
    };
    if text.len() % 2 != 0 {
        return Err(form("$bytes needs an even number of hex digits"));
    }
    // Either case is read; lower case is written.
    base16ct::mixed::decode_vec(text).map_err(|_| form(format!("$bytes: {text:?} is not hex")))
}

fn big_int(value: &Json) -> Result<Integer, JsonMapError> {
    let parsed = match value {
        Json::String(text) => text.parse::<i128>().ok(),
        Json::Number(n) => n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)),
        _ => None,
    };
    parsed
        .and_then(|i| Integer::try_from(i).ok())
        .ok_or_else(|| form("$int takes an integer from -2^64 to 2^64-1, as a string"))
}

fn special_float(value: &Json) -> Result<f64, JsonMapError> {
    match value {
        Json::String(s) if s == "nan" => Ok(f64::NAN),
        Json::String(s) if s == "inf" => Ok(f64::INFINITY),
        Json::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
        Json::Number(n) => n.as_f64().ok_or_else(|| form("$float: not a number")),
        _ => Err(form("$float takes \"nan\", \"inf\", \"-inf\" or a number")),
    }
}

const SPECIAL_KEYS: [&str; 4] = ["$bytes", "$map", "$int", "$float"];

fn to_json(value: &Cbor, depth: usize) -> Result<Json, JsonMapError> {
    Ok(match value {
        Cbor::Null => Json::Null,
        Cbor::Bool(b) => Json::Bool(*b),
        Cbor::Text(s) => Json::String(s.clone()),
        Cbor::Integer(i) => {
            let i = i128::from(*i);
            if let Ok(u) = u64::try_from(i) {
                Json::from(u)
            } else if let Ok(s) = i64::try_from(i) {
                Json::from(s)
            } else {
                one("$int", Json::String(i.to_string()))
            }
        }
        // serde_json writes a finite float with a fraction or an exponent
        // (`2.0`, `1e20`), so it reads back as a float, not an integer.
        Cbor::Float(f) => match Number::from_f64(*f) {
            Some(n) => Json::Number(n),
            None => one(
                "$float",
                Json::String(
                    if f.is_nan() {
                        "nan"
                    } else if *f > 0.0 {
                        "inf"
                    } else {
                        "-inf"
                    }
                    .into(),
                ),
            ),
        },
        Cbor::Bytes(b) => one("$bytes", Json::String(hex_encode(b))),
        Cbor::Array(items) => {
            let depth = deeper(depth)?;
            Json::Array(
                items
                    .iter()
                    .map(|i| to_json(i, depth))
                    .collect::<Result<_, _>>()?,
            )
        }
        Cbor::Map(pairs) => {
            let depth = deeper(depth)?;
            let all_text = pairs.iter().all(|(k, _)| matches!(k, Cbor::Text(_)));
            let looks_special = pairs.len() == 1
                && matches!(&pairs[0].0, Cbor::Text(k) if SPECIAL_KEYS.contains(&k.as_str()));
            if all_text && !looks_special {
                // Keys in order, whatever order the map keeps (see above).
                let mut texts: Vec<(&String, &Cbor)> = pairs
                    .iter()
                    .filter_map(|(k, v)| match k {
                        Cbor::Text(k) => Some((k, v)),
                        _ => None,
                    })
                    .collect();
                texts.sort_by(|a, b| a.0.cmp(b.0));
                let mut map = Map::new();
                for (k, v) in texts {
                    map.insert(k.clone(), to_json(v, depth)?);
                }
                Json::Object(map)
            } else {
                let entries = pairs
                    .iter()
                    .map(|(k, v)| Ok(Json::Array(vec![to_json(k, depth)?, to_json(v, depth)?])))
                    .collect::<Result<_, JsonMapError>>()?;
                one("$map", Json::Array(entries))
            }
        }
        // The strict profile has no tags; ciborium has no other variants
        // a strict item can produce.
        _ => return Err(JsonMapError::Cbor("a CBOR item JSON cannot show".into())),
    })
}

fn one(key: &str, value: Json) -> Json {
    let mut map = Map::new();
    map.insert(key.to_owned(), value);
    Json::Object(map)
}

fn hex_encode(bytes: &[u8]) -> String {
    base16ct::lower::encode_string(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str) -> Json {
        let json: Json = serde_json::from_str(text).expect("test JSON parses");
        let cbor = json_to_cbor(&json).expect("maps to CBOR");
        let back = cbor_to_json(&cbor).expect("maps back");
        assert_eq!(
            json_to_cbor(&back).expect("maps again"),
            cbor,
            "{text} must map back to the same CBOR"
        );
        back
    }

    #[test]
    fn plain_json_maps_to_itself() {
        for text in [
            "null",
            "true",
            "[1, -2, 18446744073709551615, -9223372036854775808]",
            r#"{"a": {"b": ["c", 1.5, false]}}"#,
            r#""text""#,
        ] {
            let json: Json = serde_json::from_str(text).expect("parses");
            assert_eq!(round_trip(text), json);
        }
    }

    /// Keys come out in order both ways, whatever order the map keeps
    /// and the text or the CBOR had.
    #[test]
    fn object_keys_are_in_order_both_ways() {
        let json: Json = serde_json::from_str(r#"{"step": 1, "of": 3}"#).expect("parses");
        let cbor = to_cbor(&json, 0).expect("maps to CBOR");
        let Cbor::Map(pairs) = &cbor else {
            panic!("{cbor:?}");
        };
        assert_eq!(pairs[0].0, Cbor::Text("of".into()));
        let back = to_json(
            &Cbor::Map(vec![
                (Cbor::Text("step".into()), Cbor::Integer(1.into())),
                (Cbor::Text("of".into()), Cbor::Integer(3.into())),
            ]),
            0,
        )
        .expect("maps back");
        assert_eq!(back.to_string(), r#"{"of":3,"step":1}"#);
    }

    #[test]
    fn integers_and_floats_stay_apart() {
        let one = json_to_cbor(&serde_json::json!(1)).expect("maps");
        assert_eq!(one.as_bytes(), &[0x01]);
        let float = json_to_cbor(&serde_json::json!(1.0)).expect("maps");
        assert_eq!(float.as_bytes(), &[0xf9, 0x3c, 0x00]);
        assert_eq!(cbor_to_json(&float).expect("maps"), serde_json::json!(1.0));
        assert!(cbor_to_json(&float).expect("maps").is_f64());
    }

    #[test]
    fn bytes_big_integers_and_odd_keys_have_dollar_forms() {
        let back = round_trip(r#"{"$bytes": "00FFab"}"#);
        assert_eq!(back, serde_json::json!({"$bytes": "00ffab"}));
        let cbor = json_to_cbor(&back).expect("maps");
        assert_eq!(cbor.as_bytes(), &[0x43, 0x00, 0xff, 0xab]);

        let back = round_trip(r#"{"$int": "-18446744073709551616"}"#);
        assert_eq!(back, serde_json::json!({"$int": "-18446744073709551616"}));

        let back = round_trip(r#"{"$map": [[1, "one"], [{"$bytes": "01"}, null]]}"#);
        assert_eq!(
            back,
            serde_json::json!({"$map": [[1, "one"], [{"$bytes": "01"}, null]]})
        );

        // A text-keyed map that looks like a form stays a map.
        let back = round_trip(r#"{"$map": [["$bytes", "not hex"]]}"#);
        assert_eq!(back, serde_json::json!({"$map": [["$bytes", "not hex"]]}));

        for f in ["nan", "inf", "-inf"] {
            let back = round_trip(&format!(r#"{{"$float": "{f}"}}"#));
            assert_eq!(back, serde_json::json!({"$float": f}));
        }
    }

    #[test]
    fn malformed_forms_and_keys_are_typed_errors() {
        for (text, want) in [
            (r#"{"$bytes": "abc"}"#, "even"),
            (r#"{"$bytes": "zz"}"#, "not hex"),
            (r#"{"$bytes": 1}"#, "string"),
            (r#"{"$int": "1e999"}"#, "$int"),
            (r#"{"$map": 1}"#, "pairs"),
            (r#"{"$map": [[1]]}"#, "pair"),
            (r#"{"$float": true}"#, "$float"),
        ] {
            let json: Json = serde_json::from_str(text).expect("parses");
            let err = json_to_cbor(&json).expect_err(text).to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        let json = serde_json::json!({"$map": [[[1], 2]]});
        assert_eq!(json_to_cbor(&json), Err(JsonMapError::BadKey));
        let json = serde_json::json!({"$map": [[1, "a"], [1, "b"]]});
        assert!(matches!(json_to_cbor(&json), Err(JsonMapError::Cbor(_))));
    }

    #[test]
    fn nesting_is_bounded_by_the_wire_limit() {
        let mut ok = Json::Null;
        for _ in 0..MAX_DEPTH {
            ok = Json::Array(vec![ok]);
        }
        let cbor = json_to_cbor(&ok).expect("32 levels are allowed");
        assert_eq!(cbor_to_json(&cbor).expect("maps back"), ok);
        let deep = Json::Array(vec![ok]);
        assert_eq!(json_to_cbor(&deep), Err(JsonMapError::TooDeep));
    }
}
