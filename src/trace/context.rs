//! The W3C trace context (<https://www.w3.org/TR/trace-context/>) as a
//! value: parsed and judged once, written as the `trace` item of a control
//! frame (WIRE.md 2.2). No I/O, no tracing: what a context says and
//! whether it may be believed.

use std::fmt;
use std::sync::Arc;

/// The longest `tracestate` carried (W3C: a vendor must propagate at least
/// 512 characters; longer ones are dropped here, whole).
pub const MAX_TRACESTATE_LEN: usize = 512;

/// The most list members a `tracestate` may have (W3C: 32).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// The longest `traceparent` read: version `00` is exactly 55 bytes; a
/// later version may append fields, and 256 bytes is far beyond any.
const MAX_TRACEPARENT_LEN: usize = 256;

/// Why a trace context was not believed. It is dropped and counted; the
/// call it came with is served as if it had none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The `trace` item is not a map of `traceparent` (text) and,
    /// optionally, `tracestate` (text).
    #[error("the trace item is not a map of traceparent and tracestate texts")]
    Item,
    /// The `traceparent` does not follow the W3C grammar.
    #[error("malformed traceparent")]
    Traceparent,
    /// The trace id or the parent id is all zeros.
    #[error("all-zero trace id or parent id")]
    ZeroId,
    /// The `tracestate` is longer than [`MAX_TRACESTATE_LEN`], has more
    /// than [`MAX_TRACESTATE_MEMBERS`] members, or a member breaks the
    /// W3C grammar.
    #[error("oversize or malformed tracestate")]
    Tracestate,
    /// The context came on a session that did not agree protocol 3.
    #[error("a trace context on a session below protocol 3")]
    Version,
}

/// A W3C trace context: which trace a call belongs to and which span is
/// its parent, with the vendors' `tracestate`.
///
/// ```
/// use capwire::trace::TraceContext;
///
/// let cx = TraceContext::parse(
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
///     Some("vendor=opaque"),
/// )?;
/// assert_eq!(cx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(cx.sampled());
/// // A child span of the same trace: a new span id, the same trace id.
/// let child = cx.child();
/// assert_eq!(child.trace_id(), cx.trace_id());
/// assert_ne!(child.span_id(), cx.span_id());
/// # Ok::<(), capwire::trace::TraceError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
    state: Option<Arc<str>>,
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent())
            .field("tracestate", &self.state)
            .finish()
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent())
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Lower-case hex into `out`, exactly `2 * out.len()` digits.
fn unhex(text: &[u8], out: &mut [u8]) -> Result<(), TraceError> {
    if text.len() != out.len() * 2 {
        return Err(TraceError::Traceparent);
    }
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let (Some(h), Some(l)) = (hex_value(pair[0]), hex_value(pair[1])) else {
            return Err(TraceError::Traceparent);
        };
        *o = h << 4 | l;
    }
    Ok(())
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`, appended to `out`.
fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 15)]);
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    // Hex digits are ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// A CBOR text string's head and bytes (definite length, shortest form).
fn put_text(out: &mut Vec<u8>, text: &[u8]) {
    let n = text.len();
    if let Ok(small) = u8::try_from(n) {
        if small < 24 {
            out.push(0x60 | small);
        } else {
            out.extend_from_slice(&[0x78, small]);
        }
    } else if let Ok(mid) = u16::try_from(n) {
        out.push(0x79);
        out.extend_from_slice(&mid.to_be_bytes());
    } else {
        out.push(0x7a);
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    out.extend_from_slice(text);
}

/// Reads the `trace` item: a definite map of one or two text keys,
/// `traceparent` (required) and `tracestate`, each with a text value.
fn read_item(item: &[u8]) -> Option<(&str, Option<&str>)> {
    let mut at = 0usize;
    let (major, entries) = head(item, &mut at)?;
    if major != 5 || !(1..=2).contains(&entries) {
        return None;
    }
    let (mut parent, mut state) = (None, None);
    for _ in 0..entries {
        let key = text(item, &mut at)?;
        let value = text(item, &mut at)?;
        let slot = match key {
            "traceparent" => &mut parent,
            "tracestate" => &mut state,
            _ => return None,
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    (at == item.len()).then_some(())?;
    Some((parent?, state))
}

/// One CBOR head at `at`: its major type and argument (definite lengths
/// only).
fn head(bytes: &[u8], at: &mut usize) -> Option<(u8, u64)> {
    let first = *bytes.get(*at)?;
    *at += 1;
    let (major, info) = (first >> 5, first & 0x1f);
    let width = match info {
        0..=23 => return Some((major, u64::from(info))),
        24 => 1,
        25 => 2,
        26 => 4,
        27 => 8,
        _ => return None,
    };
    let raw = bytes.get(*at..*at + width)?;
    *at += width;
    Some((major, raw.iter().fold(0u64, |n, b| n << 8 | u64::from(*b))))
}

/// One CBOR text string at `at`.
fn text<'a>(bytes: &'a [u8], at: &mut usize) -> Option<&'a str> {
    let (major, len) = head(bytes, at)?;
    if major != 3 {
        return None;
    }
    let len = usize::try_from(len).ok()?;
    let raw = bytes.get(*at..at.checked_add(len)?)?;
    *at += len;
    std::str::from_utf8(raw).ok()
}

/// One `tracestate` list member's key: `simple-key` or
/// `tenant-id@system-id` (W3C trace context, 3.3.1.3.1).
fn valid_key(key: &[u8]) -> bool {
    fn part(p: &[u8], max: usize, first_digit: bool) -> bool {
        let Some(&first) = p.first() else {
            return false;
        };
        p.len() <= max
            && (first.is_ascii_lowercase() || (first_digit && first.is_ascii_digit()))
            && p.iter().all(|&c| {
                c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || matches!(c, b'_' | b'-' | b'*' | b'/')
            })
    }
    match key.iter().position(|&c| c == b'@') {
        None => part(key, 256, false),
        Some(at) => part(&key[..at], 241, true) && part(&key[at + 1..], 14, false),
    }
}

/// One member's value: 1..=256 printable characters other than `,` and
/// `=`, not ending in a space.
fn valid_value(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= 256
        && value.last() != Some(&b' ')
        && value
            .iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
}

/// Judges a `tracestate`: `Ok(None)` for one with no members.
fn check_tracestate(state: &str) -> Result<Option<Arc<str>>, TraceError> {
    if state.len() > MAX_TRACESTATE_LEN {
        return Err(TraceError::Tracestate);
    }
    let mut members = 0usize;
    for member in state.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            // Empty list members are allowed and not counted.
            continue;
        }
        members += 1;
        if members > MAX_TRACESTATE_MEMBERS {
            return Err(TraceError::Tracestate);
        }
        let Some((key, value)) = member.split_once('=') else {
            return Err(TraceError::Tracestate);
        };
        if !valid_key(key.as_bytes()) || !valid_value(value.as_bytes()) {
            return Err(TraceError::Tracestate);
        }
    }
    Ok((members > 0).then(|| Arc::from(state)))
}

impl TraceContext {
    /// Reads a `traceparent` header value and, optionally, a `tracestate`.
    ///
    /// Version `00` must be exactly `00-<32 hex>-<16 hex>-<2 hex>`, lower
    /// case; a later version (not `ff`) is read by its first four fields,
    /// as W3C asks. The trace id and the parent id must not be all zeros.
    /// A `tracestate` of more than [`MAX_TRACESTATE_LEN`] bytes or
    /// [`MAX_TRACESTATE_MEMBERS`] members, or with a malformed member, is
    /// refused with the context (a partial vendor state is not passed on).
    ///
    /// # Errors
    /// [`TraceError`] says what was wrong.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, TraceError> {
        let tp = traceparent.as_bytes();
        if tp.len() < 55 || tp.len() > MAX_TRACEPARENT_LEN {
            return Err(TraceError::Traceparent);
        }
        let mut version = [0u8; 1];
        unhex(&tp[0..2], &mut version)?;
        if version[0] == 0xff
            || tp[2] != b'-'
            || tp[35] != b'-'
            || tp[52] != b'-'
            || (version[0] == 0 && tp.len() != 55)
            || (tp.len() > 55 && tp[55] != b'-')
        {
            return Err(TraceError::Traceparent);
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flags = [0u8; 1];
        unhex(&tp[3..35], &mut trace_id)?;
        unhex(&tp[36..52], &mut span_id)?;
        unhex(&tp[53..55], &mut flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(TraceError::ZeroId);
        }
        let state = match tracestate {
            Some(s) => check_tracestate(s)?,
            None => None,
        };
        Ok(Self {
            trace_id,
            span_id,
            // Only the sampled bit is defined for version 00; other bits
            // are not passed on (W3C 3.2.2.5).
            flags: flags[0] & 1,
            state,
        })
    }

    /// A context from its parts (for bridges to other tracing APIs).
    ///
    /// # Errors
    /// [`TraceError::ZeroId`] for an all-zero id; [`TraceError::Tracestate`]
    /// as in [`TraceContext::parse`].
    pub fn from_parts(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        sampled: bool,
        tracestate: Option<&str>,
    ) -> Result<Self, TraceError> {
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(TraceError::ZeroId);
        }
        let state = match tracestate {
            Some(s) => check_tracestate(s)?,
            None => None,
        };
        Ok(Self {
            trace_id,
            span_id,
            flags: u8::from(sampled),
            state,
        })
    }

    /// A new trace: random ids from the operating system's generator.
    #[must_use]
    pub fn new_root(sampled: bool) -> Self {
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        loop {
            fill(&mut trace_id);
            fill(&mut span_id);
            if trace_id != [0; 16] && span_id != [0; 8] {
                break;
            }
        }
        Self {
            trace_id,
            span_id,
            flags: u8::from(sampled),
            state: None,
        }
    }

    /// The same trace with a new span id: what a caller that makes its
    /// own span sends on.
    #[must_use]
    pub fn child(&self) -> Self {
        let mut span_id = [0u8; 8];
        while span_id == [0; 8] {
            fill(&mut span_id);
        }
        Self {
            span_id,
            ..self.clone()
        }
    }

    /// The trace id.
    #[must_use]
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The trace id as 32 lower-case hex digits.
    #[must_use]
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id: the receiver's parent.
    #[must_use]
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The span id as 16 lower-case hex digits.
    #[must_use]
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// The caller sampled this trace (flag `01`).
    #[must_use]
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` header value, version `00`.
    #[must_use]
    pub fn traceparent(&self) -> String {
        let mut out = Vec::with_capacity(55);
        self.write_traceparent(&mut out);
        // Hex digits and dashes are ASCII.
        String::from_utf8(out).unwrap_or_default()
    }

    fn write_traceparent(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"00-");
        push_hex(out, &self.trace_id);
        out.push(b'-');
        push_hex(out, &self.span_id);
        out.push(b'-');
        push_hex(out, &[self.flags]);
    }

    /// The `tracestate` header value, if there is one.
    #[must_use]
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// Reads the `trace` item of a control frame (WIRE.md 2.2).
    ///
    /// # Errors
    /// [`TraceError::Item`] for an item of another shape; otherwise as
    /// [`TraceContext::parse`].
    pub fn from_item(item: &[u8]) -> Result<Self, TraceError> {
        let (parent, state) = read_item(item).ok_or(TraceError::Item)?;
        Self::parse(parent, state)
    }

    /// The `trace` item of a control frame (WIRE.md 2.2): a CBOR map of
    /// `traceparent` and, when there is one, `tracestate`.
    #[must_use]
    pub fn to_item(&self) -> Vec<u8> {
        let state = self.state.as_deref().map(str::as_bytes);
        let mut out = Vec::with_capacity(72 + state.map_or(0, |s| s.len() + 14));
        out.push(if state.is_some() { 0xa2 } else { 0xa1 });
        put_text(&mut out, b"traceparent");
        out.extend_from_slice(&[0x78, 55]);
        self.write_traceparent(&mut out);
        if let Some(state) = state {
            put_text(&mut out, b"tracestate");
            put_text(&mut out, state);
        }
        out
    }
}

fn fill(buf: &mut [u8]) {
    if getrandom::getrandom(buf).is_err() {
        // No randomness from the operating system: ids that still differ
        // per call (a trace id needs uniqueness, not secrecy).
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes();
        let t = crate::time::unix_ms().to_le_bytes();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = n[i % 8] ^ t[(i + 3) % 8] ^ u8::try_from(i).unwrap_or(0).wrapping_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_context_round_trips_through_its_item() {
        let cx = TraceContext::parse(TP, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(cx.traceparent(), TP);
        let back = TraceContext::from_item(&cx.to_item()).unwrap();
        assert_eq!(back, cx);
        assert_eq!(
            back.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let plain = TraceContext::parse(TP, None).unwrap();
        assert_eq!(TraceContext::from_item(&plain.to_item()).unwrap(), plain);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ];
        for b in bad {
            assert_eq!(
                TraceContext::parse(b, None),
                Err(TraceError::Traceparent),
                "{b:?}"
            );
        }
        // A later version may add fields after a dash.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-what-comes";
        let cx = TraceContext::parse(later, None).unwrap();
        assert_eq!(
            cx.traceparent(),
            TP,
            "flags other than sampled are not passed on"
        );
    }

    #[test]
    fn zero_ids_are_refused() {
        let zero_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zero_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        assert_eq!(
            TraceContext::parse(zero_trace, None),
            Err(TraceError::ZeroId)
        );
        assert_eq!(
            TraceContext::parse(zero_span, None),
            Err(TraceError::ZeroId)
        );
    }

    #[test]
    fn tracestate_bounds_and_grammar() {
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE_LEN));
        assert_eq!(
            TraceContext::parse(TP, Some(&long)),
            Err(TraceError::Tracestate)
        );
        let many = (0..=MAX_TRACESTATE_MEMBERS)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(many.len() < MAX_TRACESTATE_LEN);
        assert_eq!(
            TraceContext::parse(TP, Some(&many)),
            Err(TraceError::Tracestate)
        );
        let just = (0..MAX_TRACESTATE_MEMBERS)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(TraceContext::parse(TP, Some(&just)).is_ok());
        for bad in [
            "novalue", "Upper=v", "k=v,=x", "k=a=b", "k=\u{7f}", "k=a\tb",
        ] {
            assert_eq!(
                TraceContext::parse(TP, Some(bad)),
                Err(TraceError::Tracestate),
                "{bad:?}"
            );
        }
        // Spaces and tabs around a member are not part of it.
        for good in [
            "t@sys=v",
            "0tenant@sys=v",
            "a=b , ,c=d",
            "k=with space",
            "k=v ",
        ] {
            assert!(TraceContext::parse(TP, Some(good)).is_ok(), "{good:?}");
        }
        assert_eq!(
            TraceContext::parse(TP, Some(" , ")).unwrap().tracestate(),
            None
        );
    }

    #[test]
    fn items_of_other_shapes_are_refused() {
        let not_map = capwire_envelope::to_vec(&TP).unwrap();
        assert_eq!(TraceContext::from_item(&not_map), Err(TraceError::Item));
        let mut extra = std::collections::BTreeMap::new();
        extra.insert("traceparent", TP);
        extra.insert("baggage", "x=y");
        let extra = capwire_envelope::to_vec(&extra).unwrap();
        assert_eq!(TraceContext::from_item(&extra), Err(TraceError::Item));
        let number =
            capwire_envelope::to_vec(&std::collections::BTreeMap::from([("traceparent", 7)]))
                .unwrap();
        assert_eq!(TraceContext::from_item(&number), Err(TraceError::Item));
    }

    #[test]
    fn the_item_is_the_strict_encoding_of_its_map() {
        let plain = TraceContext::parse(TP, None).unwrap();
        let expected =
            capwire_envelope::to_vec(&std::collections::BTreeMap::from([("traceparent", TP)]))
                .unwrap();
        assert_eq!(plain.to_item(), expected);
        // WIRE.md 2.2's example.
        assert_eq!(&plain.to_item()[..15], b"\xa1\x6btraceparent\x78\x37");
        let state = (0..30)
            .map(|i| format!("key{i}=value{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(state.len() > 255, "a text of a 2-byte length");
        let full = TraceContext::parse(TP, Some(&state)).unwrap();
        let expected = capwire_envelope::to_vec(&std::collections::BTreeMap::from([
            ("traceparent", TP),
            ("tracestate", state.as_str()),
        ]))
        .unwrap();
        assert_eq!(full.to_item(), expected);
        assert_eq!(TraceContext::from_item(&expected).unwrap(), full);
    }

    #[test]
    fn items_with_repeated_missing_or_trailing_parts_are_refused() {
        let one = TraceContext::parse(TP, None).unwrap().to_item();
        let mut twice = vec![0xa2];
        twice.extend_from_slice(&one[1..]);
        twice.extend_from_slice(&one[1..]);
        let mut trailing = one.clone();
        trailing.push(0xf6);
        let mut indefinite = vec![0xbf];
        indefinite.extend_from_slice(&one[1..]);
        indefinite.push(0xff);
        let mut cut = one.clone();
        cut.truncate(one.len() - 3);
        let only_state =
            capwire_envelope::to_vec(&std::collections::BTreeMap::from([("tracestate", "k=v")]))
                .unwrap();
        let bytes_value = {
            let mut v = vec![0xa1, 0x6b];
            v.extend_from_slice(b"traceparent");
            v.push(0x58);
            v.push(55);
            v.extend_from_slice(TP.as_bytes());
            v
        };
        for bad in [
            twice,
            trailing,
            indefinite,
            cut,
            only_state,
            bytes_value,
            vec![],
            vec![0xa0],
        ] {
            assert_eq!(
                TraceContext::from_item(&bad),
                Err(TraceError::Item),
                "{bad:02x?}"
            );
        }
    }

    #[test]
    fn roots_and_children_have_fresh_ids() {
        let a = TraceContext::new_root(true);
        let b = TraceContext::new_root(true);
        assert_ne!(a.trace_id(), b.trace_id());
        assert!(a.sampled());
        assert!(!TraceContext::new_root(false).sampled());
        let c = a.child();
        assert_eq!(c.trace_id(), a.trace_id());
        assert_ne!(c.span_id(), a.span_id());
        assert_eq!(TraceContext::parse(&c.traceparent(), None).unwrap(), c);
    }
}
