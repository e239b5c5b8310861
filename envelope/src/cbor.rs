//! The strict CBOR profile at the byte level: a header reader, the
//! validator, the header writer and a short diagnostic printer.
//!
//! Nothing here allocates in proportion to a claimed length: every length is
//! compared with the bytes that remain before it is used, and recursion is
//! bounded by [`MAX_DEPTH`].

use std::fmt::Write as _;

use half::f16;

use crate::error::DecodeError;

/// How deep arrays and maps may nest inside one data item (the item itself
/// counts as one level when it is an array or a map).
pub const MAX_DEPTH: usize = 32;

pub(crate) const MAJOR_UINT: u8 = 0;
pub(crate) const MAJOR_NEG: u8 = 1;
pub(crate) const MAJOR_BYTES: u8 = 2;
pub(crate) const MAJOR_TEXT: u8 = 3;
pub(crate) const MAJOR_ARRAY: u8 = 4;
pub(crate) const MAJOR_MAP: u8 = 5;

/// Maps up to this many entries check for duplicate keys without allocating.
const SMALL_MAP: usize = 16;

/// One decoded header. Lengths have already been checked against the input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Head {
    Uint(u64),
    /// Negative integer `-1 - n`.
    Neg(u64),
    Bytes(usize),
    Text(usize),
    Array(usize),
    Map(usize),
    Bool(bool),
    Null,
    Float(f64),
}

/// A position in a byte slice, reading the strict profile.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// A cursor at byte `pos` of `buf` (past the end reads as truncated).
    pub(crate) fn at(buf: &'a [u8], pos: usize) -> Self {
        Self {
            buf,
            pos: pos.min(buf.len()),
        }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// The whole input, also what lies before the cursor.
    pub(crate) fn buf(&self) -> &'a [u8] {
        self.buf
    }

    /// The next byte, without moving.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes between `start` and the current position.
    pub(crate) fn since(&self, start: usize) -> &'a [u8] {
        &self.buf[start..self.pos]
    }

    /// Fails with [`DecodeError::TrailingBytes`] unless all input is consumed.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                at: self.pos,
                count,
            }),
        }
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.pos + N;
        match self.buf.get(self.pos..end) {
            Some(s) => {
                self.pos = end;
                let mut out = [0; N];
                out.copy_from_slice(s);
                Ok(out)
            }
            None => Err(DecodeError::Truncated { at: self.pos }),
        }
    }

    /// Takes `n` bytes; `n` must have been checked by [`Cursor::head`].
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.buf.get(self.pos..self.pos.saturating_add(n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(DecodeError::Truncated { at: self.pos }),
        }
    }

    /// Takes a text string of `n` bytes (from [`Head::Text`]) and checks it is UTF-8.
    pub(crate) fn text(&mut self, at: usize, n: usize) -> Result<&'a str, DecodeError> {
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { at })
    }

    /// The argument of a header with additional information `ai` (< 28),
    /// rejecting encodings longer than needed.
    fn argument(&mut self, at: usize, ai: u8) -> Result<u64, DecodeError> {
        let (value, shortest) = match ai {
            0..=23 => return Ok(u64::from(ai)),
            24 => (u64::from(self.fixed::<1>()?[0]), 24),
            25 => (u64::from(u16::from_be_bytes(self.fixed()?)), 0x100),
            26 => (u64::from(u32::from_be_bytes(self.fixed()?)), 0x1_0000),
            _ => (u64::from_be_bytes(self.fixed()?), 0x1_0000_0000),
        };
        if value < shortest {
            return Err(DecodeError::NonMinimalInteger { at });
        }
        Ok(value)
    }

    /// Reads one header, enforcing the profile on it: definite lengths only,
    /// no tags, shortest forms, only `false`/`true`/`null` as simple values,
    /// and every length or count no larger than the remaining input.
    pub(crate) fn head(&mut self) -> Result<Head, DecodeError> {
        let at = self.pos;
        let initial = self.fixed::<1>()?[0];
        let major = initial >> 5;
        let ai = initial & 0x1f;
        if major == 6 {
            return Err(DecodeError::Tag { at });
        }
        if (28..=30).contains(&ai) {
            return Err(DecodeError::Reserved { at, byte: initial });
        }
        if major == 7 {
            return self.simple(at, ai);
        }
        if ai == 31 {
            return match major {
                MAJOR_BYTES..=MAJOR_MAP => Err(DecodeError::IndefiniteLength { at }),
                _ => Err(DecodeError::Reserved { at, byte: initial }),
            };
        }
        let arg = self.argument(at, ai)?;
        let remaining = self.remaining();
        // Every array item takes at least one byte, every map pair two.
        let capacity = match major {
            MAJOR_UINT => return Ok(Head::Uint(arg)),
            MAJOR_NEG => return Ok(Head::Neg(arg)),
            MAJOR_MAP => remaining / 2,
            _ => remaining,
        };
        if arg > capacity as u64 {
            return Err(DecodeError::LengthTooLarge {
                at,
                claimed: arg,
                remaining,
            });
        }
        // `arg <= remaining`, so it fits in usize.
        let n = arg as usize;
        Ok(match major {
            MAJOR_BYTES => Head::Bytes(n),
            MAJOR_TEXT => Head::Text(n),
            MAJOR_ARRAY => Head::Array(n),
            _ => Head::Map(n),
        })
    }

    fn simple(&mut self, at: usize, ai: u8) -> Result<Head, DecodeError> {
        match ai {
            20 => Ok(Head::Bool(false)),
            21 => Ok(Head::Bool(true)),
            22 => Ok(Head::Null),
            24 => {
                let value = self.fixed::<1>()?[0];
                Err(DecodeError::SimpleValue { at, value })
            }
            25 => {
                let bits = u16::from_be_bytes(self.fixed()?);
                if is_signaling_f16(bits) {
                    return Err(DecodeError::NonMinimalFloat { at });
                }
                Ok(Head::Float(f64::from(f16::from_bits(bits))))
            }
            26 => {
                let bits = u32::from_be_bytes(self.fixed()?);
                if is_signaling_f32(bits) {
                    return Err(DecodeError::NonMinimalFloat { at });
                }
                let v = f64::from(f32::from_bits(bits));
                if fits_f16(v) {
                    return Err(DecodeError::NonMinimalFloat { at });
                }
                Ok(Head::Float(v))
            }
            27 => {
                let v = f64::from_bits(u64::from_be_bytes(self.fixed()?));
                if fits_f16(v) || fits_f32(v) {
                    return Err(DecodeError::NonMinimalFloat { at });
                }
                Ok(Head::Float(v))
            }
            31 => Err(DecodeError::IndefiniteLength { at }),
            value => Err(DecodeError::SimpleValue { at, value }),
        }
    }
}

/// `true` when a half-precision float holds `v` bit for bit (the test
/// ciborium's encoder uses to pick the shortest float).
fn fits_f16(v: f64) -> bool {
    f64::from(f16::from_f64(v)).to_bits() == v.to_bits()
}

fn fits_f32(v: f64) -> bool {
    f64::from(v as f32).to_bits() == v.to_bits()
}

/// `true` for a half-precision signaling NaN (exponent all ones, quiet bit
/// clear, some other mantissa bit set). Widening it to a double sets the
/// quiet bit, so it has no exact value to carry and no encoder writes it.
fn is_signaling_f16(bits: u16) -> bool {
    bits & 0x7e00 == 0x7c00 && bits & 0x01ff != 0
}

/// `true` for a single-precision signaling NaN (see [`is_signaling_f16`]).
fn is_signaling_f32(bits: u32) -> bool {
    bits & 0x7fc0_0000 == 0x7f80_0000 && bits & 0x003f_ffff != 0
}

/// Validates one data item at the cursor and moves past it.
///
/// `depth_left` is how many more levels of arrays and maps may open here.
pub(crate) fn skip_item(cur: &mut Cursor<'_>, depth_left: usize) -> Result<(), DecodeError> {
    let at = cur.pos();
    match cur.head()? {
        Head::Uint(_) | Head::Neg(_) | Head::Bool(_) | Head::Null | Head::Float(_) => Ok(()),
        Head::Bytes(n) => cur.take(n).map(drop),
        Head::Text(n) => cur.text(at, n).map(drop),
        Head::Array(n) => {
            if depth_left == 0 {
                return Err(DecodeError::DepthExceeded { at, max: MAX_DEPTH });
            }
            for _ in 0..n {
                skip_item(cur, depth_left - 1)?;
            }
            Ok(())
        }
        Head::Map(n) => {
            if depth_left == 0 {
                return Err(DecodeError::DepthExceeded { at, max: MAX_DEPTH });
            }
            skip_map(cur, n, depth_left - 1)
        }
    }
}

/// Validates a map key: an integer, a text string or a byte string.
fn skip_key<'a>(cur: &mut Cursor<'a>) -> Result<(&'a [u8], usize), DecodeError> {
    let at = cur.pos();
    match cur.head()? {
        Head::Uint(_) | Head::Neg(_) => {}
        Head::Bytes(n) => {
            cur.take(n)?;
        }
        Head::Text(n) => {
            cur.text(at, n)?;
        }
        _ => return Err(DecodeError::MapKeyType { at }),
    }
    Ok((cur.since(at), at))
}

fn skip_map(cur: &mut Cursor<'_>, n: usize, depth_left: usize) -> Result<(), DecodeError> {
    // Keys are compared as encoded bytes: with shortest forms required and
    // only scalar keys allowed, equal bytes means equal keys and back.
    if n <= SMALL_MAP {
        let mut keys: [&[u8]; SMALL_MAP] = [&[]; SMALL_MAP];
        for i in 0..n {
            let (key, at) = skip_key(cur)?;
            if keys[..i].contains(&key) {
                return Err(DecodeError::DuplicateKey { at });
            }
            keys[i] = key;
            skip_item(cur, depth_left)?;
        }
        return Ok(());
    }
    // Grows with the entries actually read, never with the claimed count.
    let mut keys: Vec<(&[u8], usize)> = Vec::new();
    for _ in 0..n {
        keys.push(skip_key(cur)?);
        skip_item(cur, depth_left)?;
    }
    keys.sort_unstable();
    for pair in keys.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(DecodeError::DuplicateKey {
                at: pair[0].1.max(pair[1].1),
            });
        }
    }
    Ok(())
}

/// Checks that `bytes` is exactly one data item in the strict profile.
///
/// # Errors
/// The first breach of the profile found, as a [`DecodeError`].
pub fn validate(bytes: &[u8]) -> Result<(), DecodeError> {
    let mut cur = Cursor::new(bytes);
    skip_item(&mut cur, MAX_DEPTH)?;
    cur.finish()
}

/// As [`validate`], with at most `max_depth` levels of arrays and maps
/// (counting the item itself when it is one) instead of [`MAX_DEPTH`]: for
/// an item that will be embedded `MAX_DEPTH - max_depth` levels deep in
/// another (a value stored now and answered later inside a larger result).
///
/// ```
/// let nested = capwire_envelope::to_vec(&vec![vec![1u8]]).unwrap(); // 2 levels
/// assert!(capwire_envelope::validate_nested(&nested, 2).is_ok());
/// assert!(capwire_envelope::validate_nested(&nested, 1).is_err());
/// ```
///
/// # Errors
/// As [`validate`]; [`DecodeError::DepthExceeded`] beyond `max_depth`
/// (its `max` names the profile's [`MAX_DEPTH`]).
pub fn validate_nested(bytes: &[u8], max_depth: usize) -> Result<(), DecodeError> {
    let mut cur = Cursor::new(bytes);
    skip_item(&mut cur, max_depth.min(MAX_DEPTH))?;
    cur.finish()
}

/// The longest header: an initial byte and an 8-byte argument.
const MAX_HEAD_LEN: usize = 9;

/// The shortest header for `major` with argument `n`, and its length.
fn head_bytes(major: u8, n: u64) -> ([u8; MAX_HEAD_LEN], usize) {
    let m = major << 5;
    let mut head = [0; MAX_HEAD_LEN];
    let len = if n < 24 {
        head[0] = m | n as u8;
        1
    } else if n <= 0xff {
        head[0] = m | 24;
        head[1] = n as u8;
        2
    } else if n <= 0xffff {
        head[0] = m | 25;
        head[1..3].copy_from_slice(&(n as u16).to_be_bytes());
        3
    } else if n <= 0xffff_ffff {
        head[0] = m | 26;
        head[1..5].copy_from_slice(&(n as u32).to_be_bytes());
        5
    } else {
        head[0] = m | 27;
        head[1..9].copy_from_slice(&n.to_be_bytes());
        9
    };
    (head, len)
}

/// Appends a header with the shortest encoding of `n`.
pub(crate) fn write_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let (head, len) = head_bytes(major, n);
    out.extend_from_slice(&head[..len]);
}

/// Replaces the `old_len`-byte header at `at` with the shortest header for
/// `major` and `n`, moving what follows when the length changes. This is how
/// a container whose item count was not known up front gets its definite
/// length once its items are written.
pub(crate) fn patch_head(out: &mut Vec<u8>, at: usize, old_len: usize, major: u8, n: u64) {
    let (head, len) = head_bytes(major, n);
    let at = at.min(out.len());
    let end = at.saturating_add(old_len).min(out.len());
    if len == end - at {
        out[at..end].copy_from_slice(&head[..len]);
    } else {
        out.splice(at..end, head[..len].iter().copied());
    }
}

/// Appends a float in its shortest exact form (the choice ciborium's
/// encoder makes, and what [`validate`] requires).
pub(crate) fn write_float(out: &mut Vec<u8>, v: f64) {
    if fits_f16(v) {
        out.push(0xf9);
        out.extend_from_slice(&f16::from_f64(v).to_bits().to_be_bytes());
    } else if fits_f32(v) {
        out.push(0xfa);
        out.extend_from_slice(&(v as f32).to_bits().to_be_bytes());
    } else {
        out.push(0xfb);
        out.extend_from_slice(&v.to_bits().to_be_bytes());
    }
}

pub(crate) fn write_text(out: &mut Vec<u8>, s: &str) {
    write_text_bytes(out, s.as_bytes());
}

/// Writes `b`, which must be valid UTF-8, as a text string.
pub(crate) fn write_text_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_head(out, MAJOR_TEXT, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) fn write_uint(out: &mut Vec<u8>, n: u64) {
    write_head(out, MAJOR_UINT, n);
}

pub(crate) fn write_map(out: &mut Vec<u8>, pairs: usize) {
    write_head(out, MAJOR_MAP, pairs as u64);
}

pub(crate) fn write_bool(out: &mut Vec<u8>, b: bool) {
    out.push(if b { 0xf5 } else { 0xf4 });
}

/// The longest diagnostic text [`diagnostic`] produces before cutting.
const DIAG_LIMIT: usize = 160;

/// A short diagnostic-notation rendering (RFC 8949 section 8) of a
/// validated item, cut with `…` after about [`DIAG_LIMIT`] characters.
pub(crate) fn diagnostic(item: &[u8]) -> String {
    let mut out = String::new();
    let mut cur = Cursor::new(item);
    if diag_item(&mut cur, &mut out).is_err() {
        out.push('…');
    }
    out
}

/// `Err(())` when the output is full or the item is not valid.
fn diag_item(cur: &mut Cursor<'_>, out: &mut String) -> Result<(), ()> {
    if out.len() > DIAG_LIMIT {
        return Err(());
    }
    let at = cur.pos();
    match cur.head().map_err(drop)? {
        Head::Uint(n) => write!(out, "{n}").map_err(drop),
        Head::Neg(n) => write!(out, "{}", -1 - i128::from(n)).map_err(drop),
        Head::Bool(b) => write!(out, "{b}").map_err(drop),
        Head::Null => write!(out, "null").map_err(drop),
        Head::Float(v) => write!(out, "{v:?}").map_err(drop),
        Head::Bytes(n) => {
            out.push_str("h'");
            for b in cur.take(n).map_err(drop)? {
                if out.len() > DIAG_LIMIT {
                    return Err(());
                }
                write!(out, "{b:02x}").map_err(drop)?;
            }
            out.push('\'');
            Ok(())
        }
        Head::Text(n) => {
            let s = cur.text(at, n).map_err(drop)?;
            let mut end = s.len().min(DIAG_LIMIT);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            write!(out, "{:?}", &s[..end]).map_err(drop)?;
            if end < s.len() { Err(()) } else { Ok(()) }
        }
        Head::Array(n) => {
            out.push('[');
            for i in 0..n {
                if i > 0 {
                    out.push_str(", ");
                }
                diag_item(cur, out)?;
            }
            out.push(']');
            Ok(())
        }
        Head::Map(n) => {
            out.push('{');
            for i in 0..n {
                if i > 0 {
                    out.push_str(", ");
                }
                diag_item(cur, out)?;
                out.push_str(": ");
                diag_item(cur, out)?;
            }
            out.push('}');
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &[u8]) -> DecodeError {
        validate(bytes).unwrap_err()
    }

    #[test]
    fn accepts_the_profile() {
        for ok in [
            &[0x00][..],
            &[0x17],
            &[0x18, 0x18],
            &[0x19, 0x01, 0x00],
            &[0x1a, 0x00, 0x01, 0x00, 0x00],
            &[0x1b, 0, 0, 0, 1, 0, 0, 0, 0],
            &[0x20],
            &[0x40],
            &[0x60],
            &[0x63, b'a', b'b', b'c'],
            &[0x80],
            &[0x82, 0x01, 0x02],
            &[0xa0],
            &[0xa2, 0x01, 0x02, 0x61, b'x', 0x03],
            &[0xf4],
            &[0xf5],
            &[0xf6],
            &[0xf9, 0x3c, 0x00],                                     // 1.0 as f16
            &[0xfa, 0x47, 0xc3, 0x50, 0x00],                         // 100000.0 as f32
            &[0xfb, 0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a], // 0.1
        ] {
            validate(ok).unwrap_or_else(|e| panic!("{ok:02x?}: {e}"));
        }
    }

    #[test]
    fn rejects_non_minimal_forms() {
        for bad in [
            &[0x18, 0x17][..],
            &[0x19, 0x00, 0xff],
            &[0x1a, 0x00, 0x00, 0xff, 0xff],
            &[0x1b, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            &[0x38, 0x00],
            &[0x78, 0x01, b'a'],
            &[0x98, 0x00],
            &[0xb8, 0x00],
        ] {
            assert_eq!(
                err(bad),
                DecodeError::NonMinimalInteger { at: 0 },
                "{bad:02x?}"
            );
        }
        // 1.0 as f32 and as f64.
        assert_eq!(
            err(&[0xfa, 0x3f, 0x80, 0, 0]),
            DecodeError::NonMinimalFloat { at: 0 }
        );
        assert_eq!(
            err(&[0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]),
            DecodeError::NonMinimalFloat { at: 0 }
        );
    }

    #[test]
    fn rejects_half_and_single_signaling_nans() {
        // Signaling NaNs: widening them to a double sets the quiet bit.
        for bad in [
            &[0xf9, 0x7c, 0x01][..],
            &[0xf9, 0xfd, 0xf9],
            &[0xfa, 0x7f, 0x80, 0x00, 0x01],
            &[0xfa, 0xff, 0xbf, 0xff, 0xff],
        ] {
            assert_eq!(
                err(bad),
                DecodeError::NonMinimalFloat { at: 0 },
                "{bad:02x?}"
            );
        }
        // Infinities, quiet NaNs (with payloads too) and a double
        // signaling NaN, which keeps its bits, are accepted.
        for ok in [
            &[0xf9, 0x7c, 0x00][..],
            &[0xf9, 0xfc, 0x00],
            &[0xf9, 0x7e, 0x00],
            &[0xf9, 0x7e, 0x01],
            &[0xf9, 0xfe, 0x00],
            &[0xfa, 0x7f, 0xc0, 0x00, 0x01],
            &[0xfb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 1],
        ] {
            validate(ok).unwrap_or_else(|e| panic!("{ok:02x?}: {e}"));
        }
    }

    #[test]
    fn rejects_simple_values_and_reserved_bytes() {
        assert_eq!(err(&[0xf7]), DecodeError::SimpleValue { at: 0, value: 23 });
        assert_eq!(err(&[0xe0]), DecodeError::SimpleValue { at: 0, value: 0 });
        assert_eq!(
            err(&[0xf8, 0xff]),
            DecodeError::SimpleValue { at: 0, value: 255 }
        );
        for byte in [0x1c, 0x3d, 0x5e, 0xfc, 0x1f, 0x3f] {
            assert_eq!(err(&[byte]), DecodeError::Reserved { at: 0, byte });
        }
        assert_eq!(err(&[0xff]), DecodeError::IndefiniteLength { at: 0 });
    }

    #[test]
    fn map_keys_are_scalars_and_unique() {
        assert_eq!(err(&[0xa1, 0x80, 0x00]), DecodeError::MapKeyType { at: 1 });
        assert_eq!(err(&[0xa1, 0xf6, 0x00]), DecodeError::MapKeyType { at: 1 });
        assert_eq!(
            err(&[0xa2, 0x61, b'a', 0x00, 0x61, b'a', 0x01]),
            DecodeError::DuplicateKey { at: 4 }
        );
        // Integer 1 and text "1" are different keys.
        validate(&[0xa2, 0x01, 0x00, 0x61, b'1', 0x00]).unwrap();
        // A large map takes the sorting path.
        let mut big = vec![0xb4];
        for i in 0..20u8 {
            write_uint(&mut big, u64::from(i));
            big.push(0xf6);
        }
        validate(&big).unwrap();
        let last = big.len() - 2;
        big[last] = 0x05;
        assert_eq!(err(&big), DecodeError::DuplicateKey { at: last });
    }

    #[test]
    fn nested_duplicates_are_found() {
        // [{"a": 0, "a": 1}]
        assert_eq!(
            err(&[0x81, 0xa2, 0x61, b'a', 0x00, 0x61, b'a', 0x01]),
            DecodeError::DuplicateKey { at: 5 }
        );
    }

    #[test]
    fn depth_limit_counts_containers() {
        let nest = |levels: usize| {
            let mut v = vec![0x81; levels - 1];
            v.push(0x80);
            v
        };
        validate(&nest(MAX_DEPTH)).unwrap();
        assert_eq!(
            err(&nest(MAX_DEPTH + 1)),
            DecodeError::DepthExceeded {
                at: MAX_DEPTH,
                max: MAX_DEPTH
            }
        );
    }

    #[test]
    fn head_writer_is_minimal() {
        for n in [0, 23, 24, 255, 256, 65535, 65536, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            write_uint(&mut out, n);
            let mut cur = Cursor::new(&out);
            assert_eq!(cur.head().unwrap(), Head::Uint(n));
            cur.finish().unwrap();
        }
    }

    #[test]
    fn diagnostic_is_short() {
        assert_eq!(
            diagnostic(&[0xa2, 0x61, b'a', 0x20, 0x61, b'b', 0x82, 0xf5, 0x42, 1, 2]),
            "{\"a\": -1, \"b\": [true, h'0102']}"
        );
        let long = crate::to_vec(&vec!["word"; 200]).unwrap();
        let d = diagnostic(&long);
        assert!(d.ends_with('…') && d.len() < DIAG_LIMIT + 20, "{d}");
    }
}
