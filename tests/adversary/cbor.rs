//! Hand-written CBOR, byte by byte, so that an attack can put on the wire
//! exactly the items the strict profile (WIRE.md 2.1) refuses.

/// `null`.
pub const NULL: u8 = 0xf6;

/// A head in its shortest form: major type `major`, argument `n`.
pub fn head(major: u8, n: u64) -> Vec<u8> {
    let m = major << 5;
    match n {
        0..=23 => vec![m | n as u8],
        24..=0xff => vec![m | 24, n as u8],
        0x100..=0xffff => {
            let mut v = vec![m | 25];
            v.extend_from_slice(&(n as u16).to_be_bytes());
            v
        }
        0x1_0000..=0xffff_ffff => {
            let mut v = vec![m | 26];
            v.extend_from_slice(&(n as u32).to_be_bytes());
            v
        }
        _ => {
            let mut v = vec![m | 27];
            v.extend_from_slice(&n.to_be_bytes());
            v
        }
    }
}

/// An unsigned integer.
pub fn uint(n: u64) -> Vec<u8> {
    head(0, n)
}

/// A text string of any bytes (valid UTF-8 or not).
pub fn text_bytes(b: &[u8]) -> Vec<u8> {
    let mut v = head(3, b.len() as u64);
    v.extend_from_slice(b);
    v
}

/// A text string.
pub fn text(s: &str) -> Vec<u8> {
    text_bytes(s.as_bytes())
}

/// A byte string.
pub fn bytes(b: &[u8]) -> Vec<u8> {
    let mut v = head(2, b.len() as u64);
    v.extend_from_slice(b);
    v
}

/// A map of already-encoded keys and values, in the order given.
pub fn map(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut v = head(5, pairs.len() as u64);
    for (k, val) in pairs {
        v.extend_from_slice(k);
        v.extend_from_slice(val);
    }
    v
}

/// A map with text keys.
pub fn tmap(pairs: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let pairs: Vec<_> = pairs.iter().map(|(k, v)| (text(k), v.clone())).collect();
    map(&pairs)
}

/// A control frame from already-encoded field values (no budget).
pub fn control_with(cap: Vec<u8>, verb: Vec<u8>, req_id: Vec<u8>, args: Vec<u8>) -> Vec<u8> {
    tmap(&[
        ("type", text("control")),
        ("cap", cap),
        ("verb", verb),
        ("req_id", req_id),
        ("args", args),
    ])
}

/// A control frame with text fields (any bytes may be in the names).
pub fn control(cap: &str, verb: &str, req_id: &str, args: Vec<u8>) -> Vec<u8> {
    control_with(text(cap), text(verb), text(req_id), args)
}

/// `n` nested one-element arrays around `[]`.
pub fn nested_arrays(n: usize) -> Vec<u8> {
    let mut v = vec![0x81; n];
    v.push(0x80);
    v
}

/// `n` nested one-pair maps `{"a": ...}` around `null`.
pub fn nested_maps(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(3 * n + 1);
    for _ in 0..n {
        v.extend_from_slice(&[0xa1, 0x61, b'a']);
    }
    v.push(NULL);
    v
}

/// An `item` frame (protocol 2) of stream `req_id` carrying `item`.
pub fn item(req_id: &str, item: Vec<u8>) -> Vec<u8> {
    tmap(&[
        ("type", text("item")),
        ("req_id", text(req_id)),
        ("item", item),
    ])
}

/// A `credit` frame (protocol 2) for stream `req_id`; the counts may be
/// out of the frame's range (beyond 2^32-1).
pub fn credit(req_id: &str, items: u64, bytes: u64) -> Vec<u8> {
    tmap(&[
        ("type", text("credit")),
        ("req_id", text(req_id)),
        ("items", uint(items)),
        ("bytes", uint(bytes)),
    ])
}

/// A `cancel` frame.
pub fn cancel(req_id: &str) -> Vec<u8> {
    tmap(&[("type", text("cancel")), ("req_id", text(req_id))])
}

/// A successful `response` frame with an already-encoded result.
pub fn response_ok(req_id: &str, result: Vec<u8>) -> Vec<u8> {
    tmap(&[
        ("type", text("response")),
        ("req_id", text(req_id)),
        ("ok", vec![0xf5]),
        ("result", result),
    ])
}

/// A failed `response` frame with error `code`.
pub fn response_err(req_id: &str, code: &str) -> Vec<u8> {
    tmap(&[
        ("type", text("response")),
        ("req_id", text(req_id)),
        ("ok", vec![0xf4]),
        (
            "err",
            tmap(&[("code", text(code)), ("message", text("from the attacker"))]),
        ),
    ])
}
