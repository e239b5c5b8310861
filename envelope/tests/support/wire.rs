//! Hand-built CBOR for tests: headers in chosen (also non-shortest) forms,
//! and frame maps assembled field by field.
#![allow(dead_code)]

pub(crate) const BYTES: u8 = 2;
pub(crate) const TEXT: u8 = 3;
pub(crate) const ARRAY: u8 = 4;
pub(crate) const MAP: u8 = 5;

/// A header in its shortest form.
pub(crate) fn head(major: u8, n: u64) -> Vec<u8> {
    let m = major << 5;
    match n {
        0..=23 => vec![m | n as u8],
        24..=0xff => vec![m | 24, n as u8],
        0x100..=0xffff => [&[m | 25][..], &(n as u16).to_be_bytes()].concat(),
        0x1_0000..=0xffff_ffff => [&[m | 26][..], &(n as u32).to_be_bytes()].concat(),
        _ => [&[m | 27][..], &n.to_be_bytes()].concat(),
    }
}

/// A header with an 8-byte argument, whatever the value.
pub(crate) fn head8(major: u8, n: u64) -> Vec<u8> {
    [&[(major << 5) | 27][..], &n.to_be_bytes()].concat()
}

pub(crate) fn text(s: &str) -> Vec<u8> {
    [head(TEXT, s.len() as u64), s.as_bytes().to_vec()].concat()
}

pub(crate) fn text_bytes(s: &[u8]) -> Vec<u8> {
    [head(TEXT, s.len() as u64), s.to_vec()].concat()
}

pub(crate) fn uint(n: u64) -> Vec<u8> {
    head(0, n)
}

/// A map from text keys to already-encoded values, in the given order.
pub(crate) fn map<K: AsRef<str>>(fields: &[(K, Vec<u8>)]) -> Vec<u8> {
    let mut out = head(MAP, fields.len() as u64);
    for (k, v) in fields {
        out.extend(text(k.as_ref()));
        out.extend_from_slice(v);
    }
    out
}

/// The fields of a valid control frame (`app.echo` / `say`, req_id `42`,
/// args `{"text": "hello"}`).
pub(crate) fn control_fields() -> Vec<(String, Vec<u8>)> {
    [
        ("type", text("control")),
        ("cap", text("app.echo")),
        ("verb", text("say")),
        ("req_id", text("42")),
        ("args", map(&[("text", text("hello"))])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A control frame with one field's value replaced (or added).
pub(crate) fn control_with(field: &str, value: Vec<u8>) -> Vec<u8> {
    let mut fields = control_fields();
    match fields.iter_mut().find(|(k, _)| *k == field) {
        Some(slot) => slot.1 = value,
        None => fields.push((field.to_owned(), value)),
    }
    map(&fields)
}

/// `levels` arrays nested in one another.
pub(crate) fn nested_arrays(levels: usize) -> Vec<u8> {
    let mut v = vec![0x81; levels];
    v.push(0xf6);
    v
}
