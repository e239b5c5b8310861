//! Transcoding between strict-profile bytes and serde without a value tree.
//!
//! - [`Item`] serializes a validated data item by walking its bytes and
//!   driving the target serializer directly: byte strings and text are
//!   handed over as borrowed slices, arrays and maps with their exact
//!   lengths.
//! - [`Writer`] goes the other way: a visitor that writes whatever a
//!   deserializer presents as strict-profile CBOR, straight into one
//!   buffer. An array or map whose length the format does not tell up front
//!   has its items written first and its header corrected afterwards
//!   ([`patch_head`]).
//! - [`definite_lengths`] uses the same technique to rewrite the
//!   indefinite-length arrays and maps that ciborium's serializer emits for
//!   a `Serialize` impl that does not know its length (such as a
//!   `#[serde(flatten)]` struct).
//!
//! Each direction allocates the output it produces and nothing per item.
//! Recursion is bounded by [`MAX_DEPTH`]: [`Item`] only walks validated
//! bytes, and the other two count the levels they open.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, SerializeMap, SerializeSeq};
use serde::{Deserializer, Serialize, Serializer};

use crate::cbor::{
    Cursor, Head, MAJOR_ARRAY, MAJOR_BYTES, MAJOR_MAP, MAJOR_NEG, MAJOR_TEXT, MAJOR_UINT,
    MAX_DEPTH, patch_head, skip_item, write_float, write_head,
};
use crate::error::{DecodeError, EncodeError};

/// The initial byte of an indefinite-length array.
const ARRAY_INDEFINITE: u8 = (MAJOR_ARRAY << 5) | 31;
/// The initial byte of an indefinite-length map.
const MAP_INDEFINITE: u8 = (MAJOR_MAP << 5) | 31;
/// The "break" byte that ends an indefinite-length item.
const BREAK: u8 = 0xff;

/// One data item inside bytes that have passed
/// [`validate`](crate::validate), serializable as the value it encodes.
pub(crate) struct Item<'a> {
    buf: &'a [u8],
    start: usize,
    /// Where the item ends, once it has been serialized: lets the
    /// enclosing container go on without scanning the item a second time.
    end: Cell<Option<usize>>,
}

impl<'a> Item<'a> {
    /// The item that starts `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self::at(buf, 0)
    }

    fn at(buf: &'a [u8], start: usize) -> Self {
        Self {
            buf,
            start,
            end: Cell::new(None),
        }
    }

    /// Where the item ends: remembered from serializing it, or found by
    /// skipping over it.
    fn end(&self) -> Result<usize, DecodeError> {
        if let Some(end) = self.end.get() {
            return Ok(end);
        }
        let mut cur = Cursor::at(self.buf, self.start);
        skip_item(&mut cur, MAX_DEPTH)?;
        Ok(cur.pos())
    }
}

impl Serialize for Item<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut cur = Cursor::at(self.buf, self.start);
        let ok = serialize_item(&mut cur, s)?;
        self.end.set(Some(cur.pos()));
        Ok(ok)
    }
}

/// Serializes the item at the cursor and moves past it. The serializer
/// calls are those a `ciborium::Value` of the item would make, so every
/// format sees the same value it always did.
fn serialize_item<S: Serializer>(cur: &mut Cursor<'_>, s: S) -> Result<S::Ok, S::Error> {
    let buf = cur.buf();
    let at = cur.pos();
    match cur.head().map_err(ser::Error::custom)? {
        Head::Uint(n) => serialize_uint(s, n),
        Head::Neg(n) => serialize_neg(s, n),
        Head::Bytes(n) => s.serialize_bytes(cur.take(n).map_err(ser::Error::custom)?),
        Head::Text(n) => s.serialize_str(cur.text(at, n).map_err(ser::Error::custom)?),
        Head::Bool(b) => s.serialize_bool(b),
        Head::Null => s.serialize_unit(),
        Head::Float(v) => {
            let narrow = v as f32;
            if f64::from(narrow).to_bits() == v.to_bits() {
                s.serialize_f32(narrow)
            } else {
                s.serialize_f64(v)
            }
        }
        Head::Array(n) => {
            let mut seq = s.serialize_seq(Some(n))?;
            let mut pos = cur.pos();
            for _ in 0..n {
                let item = Item::at(buf, pos);
                seq.serialize_element(&item)?;
                pos = item.end().map_err(ser::Error::custom)?;
            }
            *cur = Cursor::at(buf, pos);
            seq.end()
        }
        Head::Map(n) => {
            let mut map = s.serialize_map(Some(n))?;
            let mut pos = cur.pos();
            for _ in 0..n {
                let key = Item::at(buf, pos);
                // Keys are scalars: finding the value is a short skip.
                let value = Item::at(buf, key.end().map_err(ser::Error::custom)?);
                map.serialize_entry(&key, &value)?;
                pos = value.end().map_err(ser::Error::custom)?;
            }
            *cur = Cursor::at(buf, pos);
            map.end()
        }
    }
}

/// The narrowest unsigned type that holds `n`.
fn serialize_uint<S: Serializer>(s: S, n: u64) -> Result<S::Ok, S::Error> {
    if let Ok(v) = u8::try_from(n) {
        s.serialize_u8(v)
    } else if let Ok(v) = u16::try_from(n) {
        s.serialize_u16(v)
    } else if let Ok(v) = u32::try_from(n) {
        s.serialize_u32(v)
    } else {
        s.serialize_u64(n)
    }
}

/// The narrowest signed type that holds `-1 - n`.
fn serialize_neg<S: Serializer>(s: S, n: u64) -> Result<S::Ok, S::Error> {
    let v = -1 - i128::from(n);
    if let Ok(v) = i8::try_from(v) {
        s.serialize_i8(v)
    } else if let Ok(v) = i16::try_from(v) {
        s.serialize_i16(v)
    } else if let Ok(v) = i32::try_from(v) {
        s.serialize_i32(v)
    } else if let Ok(v) = i64::try_from(v) {
        s.serialize_i64(v)
    } else {
        s.serialize_i128(v)
    }
}

/// Writes the value a deserializer presents as one strict-profile data
/// item, appending to a buffer.
///
/// What it writes has definite lengths, shortest integers, lengths and
/// floats, valid text and at most [`MAX_DEPTH`] levels; map keys and their
/// uniqueness are left to [`validate`](crate::validate), which the caller
/// runs on the result.
pub(crate) struct Writer<'o> {
    out: &'o mut Vec<u8>,
    /// Arrays and maps open around the value.
    depth: usize,
    /// `Some` and newtype wrappers around the value: they add nothing to
    /// the encoding, but each is a level of recursion.
    wraps: usize,
}

impl<'o> Writer<'o> {
    /// A writer for a top-level item.
    pub(crate) fn new(out: &'o mut Vec<u8>) -> Self {
        Self {
            out,
            depth: 0,
            wraps: 0,
        }
    }

    /// A writer for an item inside the array or map this one opened.
    fn child(&mut self) -> Writer<'_> {
        Writer {
            out: self.out,
            depth: self.depth + 1,
            wraps: self.wraps,
        }
    }

    /// Fails when one more level would be too deep.
    fn check_depth<E: de::Error>(&self, levels: usize) -> Result<(), E> {
        if levels >= MAX_DEPTH {
            return Err(E::custom(EncodeError::Profile(
                DecodeError::DepthExceeded {
                    at: self.out.len(),
                    max: MAX_DEPTH,
                },
            )));
        }
        Ok(())
    }

    fn write_int<E: de::Error>(self, v: i128) -> Result<(), E> {
        let (major, n) = if v >= 0 {
            (MAJOR_UINT, u64::try_from(v))
        } else {
            (MAJOR_NEG, u64::try_from(v.unsigned_abs() - 1))
        };
        let n = n.map_err(|_| {
            E::custom(format_args!(
                "integer {v} is beyond 64 bits: the strict CBOR profile has no encoding for it"
            ))
        })?;
        write_head(self.out, major, n);
        Ok(())
    }

    fn write_string(self, major: u8, bytes: &[u8]) {
        write_head(self.out, major, bytes.len() as u64);
        self.out.extend_from_slice(bytes);
    }
}

impl<'de> DeserializeSeed<'de> for Writer<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Writer<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value the strict CBOR profile can hold")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.out.push(if v { 0xf5 } else { 0xf4 });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.write_int(i128::from(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<(), E> {
        self.write_int(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write_head(self.out, MAJOR_UINT, v);
        Ok(())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<(), E> {
        match i128::try_from(v) {
            Ok(v) => self.write_int(v),
            Err(_) => Err(E::custom(format_args!(
                "integer {v} is beyond 64 bits: the strict CBOR profile has no encoding for it"
            ))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        write_float(self.out, v);
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.write_string(MAJOR_TEXT, v.as_bytes());
        Ok(())
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
        self.write_string(MAJOR_BYTES, v);
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.out.push(0xf6);
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.check_depth(self.wraps)?;
        d.deserialize_any(Writer {
            wraps: self.wraps + 1,
            ..self
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.visit_some(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.check_depth(self.depth)?;
        let at = self.out.len();
        // The hint only sizes the header written in advance; it is
        // corrected below if the items say otherwise.
        write_head(self.out, MAJOR_ARRAY, seq.size_hint().unwrap_or(0) as u64);
        let head_len = self.out.len() - at;
        let mut count = 0u64;
        while seq.next_element_seed(self.child())?.is_some() {
            count += 1;
        }
        patch_head(self.out, at, head_len, MAJOR_ARRAY, count);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.check_depth(self.depth)?;
        let at = self.out.len();
        write_head(self.out, MAJOR_MAP, map.size_hint().unwrap_or(0) as u64);
        let head_len = self.out.len() - at;
        let mut count = 0u64;
        while map.next_key_seed(self.child())?.is_some() {
            map.next_value_seed(self.child())?;
            count += 1;
        }
        patch_head(self.out, at, head_len, MAJOR_MAP, count);
        Ok(())
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(
            "an enum or tagged value has no form in the strict CBOR profile",
        ))
    }
}

/// Rewrites one data item, giving every indefinite-length array and map
/// its definite length; everything else is copied as it is. The result
/// still has to pass [`validate`](crate::validate).
///
/// # Errors
/// [`DecodeError::IndefiniteLength`] for an indefinite-length string or a
/// stray break, [`DecodeError::DepthExceeded`] beyond [`MAX_DEPTH`], and
/// any header that breaks the profile.
pub(crate) fn definite_lengths(src: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::with_capacity(src.len());
    let mut cur = Cursor::new(src);
    copy_definite(&mut cur, &mut out, MAX_DEPTH)?;
    cur.finish()?;
    Ok(out)
}

fn copy_definite(
    cur: &mut Cursor<'_>,
    out: &mut Vec<u8>,
    depth_left: usize,
) -> Result<(), DecodeError> {
    let at = cur.pos();
    if let Some(initial @ (ARRAY_INDEFINITE | MAP_INDEFINITE)) = cur.peek() {
        if depth_left == 0 {
            return Err(DecodeError::DepthExceeded { at, max: MAX_DEPTH });
        }
        cur.take(1)?;
        let major = initial >> 5;
        let head_at = out.len();
        // Room for the header of fewer than 24 items, corrected below.
        out.push(major << 5);
        let mut count = 0u64;
        while cur.peek() != Some(BREAK) {
            // At the end of the input this fails with `Truncated`.
            copy_definite(cur, out, depth_left - 1)?;
            if major == MAJOR_MAP {
                copy_definite(cur, out, depth_left - 1)?;
            }
            count += 1;
        }
        cur.take(1)?;
        patch_head(out, head_at, 1, major, count);
        return Ok(());
    }
    let head = cur.head()?;
    out.extend_from_slice(cur.since(at));
    let items = match head {
        Head::Bytes(n) | Head::Text(n) => {
            out.extend_from_slice(cur.take(n)?);
            return Ok(());
        }
        Head::Array(n) => n,
        // `head` checked that 2 * n bytes remain, so this cannot overflow.
        Head::Map(n) => n * 2,
        _ => return Ok(()),
    };
    if depth_left == 0 {
        return Err(DecodeError::DepthExceeded { at, max: MAX_DEPTH });
    }
    for _ in 0..items {
        copy_definite(cur, out, depth_left - 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde::de::IntoDeserializer;
    use serde::de::value::{EnumAccessDeserializer, Error};

    use super::*;
    use crate::RawValue;

    /// A sequence of small integers whose size hint may be wrong.
    struct Hinted {
        items: std::ops::Range<u64>,
        hint: Option<usize>,
    }

    impl<'de> SeqAccess<'de> for Hinted {
        type Error = Error;

        fn next_element_seed<T: DeserializeSeed<'de>>(
            &mut self,
            seed: T,
        ) -> Result<Option<T::Value>, Error> {
            match self.items.next() {
                Some(n) => seed.deserialize(n.into_deserializer()).map(Some),
                None => Ok(None),
            }
        }

        fn size_hint(&self) -> Option<usize> {
            self.hint
        }
    }

    fn from_seq(items: std::ops::Range<u64>, hint: Option<usize>) -> RawValue {
        let seq = serde::de::value::SeqAccessDeserializer::new(Hinted { items, hint });
        RawValue::deserialize(seq).unwrap()
    }

    #[test]
    fn containers_get_their_real_length_whatever_the_hint() {
        for len in [0u64, 1, 23, 24, 255, 256, 70_000] {
            let expected = crate::to_vec(&(0..len).collect::<Vec<_>>()).unwrap();
            for hint in [None, Some(0), Some(3), Some(len as usize), Some(usize::MAX)] {
                let raw = from_seq(0..len, hint);
                assert_eq!(raw.as_bytes(), expected, "{len} items, hint {hint:?}");
            }
        }
    }

    #[test]
    fn enums_are_an_error_not_a_panic() {
        let e: Result<RawValue, Error> =
            RawValue::deserialize(EnumAccessDeserializer::new("Variant".into_deserializer()));
        assert!(e.unwrap_err().to_string().contains("enum"));
    }

    /// `Some(Some(Some(...)))` without end.
    struct Unending;

    impl<'de> Deserializer<'de> for Unending {
        type Error = Error;

        fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
            v.visit_some(Unending)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            struct enum identifier ignored_any
        }
    }

    #[test]
    fn wrappers_are_bounded_like_containers() {
        let e = RawValue::deserialize(Unending).unwrap_err();
        assert!(e.to_string().contains("nesting deeper"), "{e}");
    }

    #[test]
    fn indefinite_containers_get_their_counts() {
        // [_ 1, {_ "a": [_ ]}] with 30 more items in the outer array.
        let mut src = vec![ARRAY_INDEFINITE, 0x01, MAP_INDEFINITE, 0x61, b'a'];
        src.extend_from_slice(&[ARRAY_INDEFINITE, BREAK, BREAK]);
        src.extend_from_slice(&[0x02; 30]);
        src.push(BREAK);
        let out = definite_lengths(&src).unwrap();
        let mut expected = vec![0x98, 32, 0x01, 0xa1, 0x61, b'a', 0x80];
        expected.extend_from_slice(&[0x02; 30]);
        assert_eq!(out, expected);
        crate::validate(&out).unwrap();
    }

    #[test]
    fn broken_indefinite_input_is_an_error() {
        for (bad, expected) in [
            (
                &[ARRAY_INDEFINITE, 0x01][..],
                DecodeError::Truncated { at: 2 },
            ),
            (
                &[MAP_INDEFINITE, 0x01, BREAK],
                DecodeError::IndefiniteLength { at: 2 },
            ),
            (
                &[0x5f, 0x40, BREAK],
                DecodeError::IndefiniteLength { at: 0 },
            ),
            (&[BREAK], DecodeError::IndefiniteLength { at: 0 }),
            (&[0xc1, 0x00], DecodeError::Tag { at: 0 }),
            (
                &[0x80, 0x00],
                DecodeError::TrailingBytes { at: 1, count: 1 },
            ),
        ] {
            assert_eq!(definite_lengths(bad), Err(expected), "{bad:02x?}");
        }
        let deep = [
            vec![ARRAY_INDEFINITE; MAX_DEPTH + 1],
            vec![BREAK; MAX_DEPTH + 1],
        ]
        .concat();
        assert!(matches!(
            definite_lengths(&deep),
            Err(DecodeError::DepthExceeded { .. })
        ));
        let deep = [vec![0x81; MAX_DEPTH], vec![0x80]].concat();
        assert!(matches!(
            definite_lengths(&deep),
            Err(DecodeError::DepthExceeded { .. })
        ));
    }
}
