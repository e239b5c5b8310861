//! The control frame's `trace` key (protocol 3, WIRE.md 2.2): an embedded
//! item the frame decoder checks only for the strict profile; any other
//! frame kind refuses it.
#![allow(clippy::unwrap_used)]

use capwire_envelope::{DecodeError, FrameRef, decode_frame};

fn text(out: &mut Vec<u8>, s: &str) {
    assert!(s.len() < 24);
    out.push(0x60 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// `{"type": kind, ...pairs}` with `extra` appended as the last pairs.
fn frame(kind: &str, pairs: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = vec![0xa0 | (1 + pairs.len()) as u8];
    text(&mut out, "type");
    text(&mut out, kind);
    for (k, v) in pairs {
        text(&mut out, k);
        out.extend_from_slice(v);
    }
    out
}

fn trace_item() -> Vec<u8> {
    let mut t = vec![0xa1];
    text(&mut t, "traceparent");
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    t.push(0x78);
    t.push(tp.len() as u8);
    t.extend_from_slice(tp.as_bytes());
    t
}

#[test]
fn a_control_frame_carries_a_trace_item_as_it_came() {
    let trace = trace_item();
    let mut cap = Vec::new();
    text(&mut cap, "app.x");
    let mut verb = Vec::new();
    text(&mut verb, "go");
    let mut req = Vec::new();
    text(&mut req, "r1");
    let record = frame(
        "control",
        &[
            ("cap", &cap),
            ("verb", &verb),
            ("req_id", &req),
            ("args", &[0xf6]),
            ("trace", &trace),
        ],
    );
    let FrameRef::Control(c) = decode_frame(&record).unwrap() else {
        panic!("a control frame");
    };
    assert_eq!(c.trace, Some(trace.as_slice()));
    // Without it: none.
    let record = frame(
        "control",
        &[
            ("cap", &cap),
            ("verb", &verb),
            ("req_id", &req),
            ("args", &[0xf6]),
        ],
    );
    let FrameRef::Control(c) = decode_frame(&record).unwrap() else {
        panic!("a control frame");
    };
    assert_eq!(c.trace, None);
    // A trace item that breaks the strict profile breaks the frame.
    let record = frame(
        "control",
        &[
            ("cap", &cap),
            ("verb", &verb),
            ("req_id", &req),
            ("args", &[0xf6]),
            ("trace", &[0x9f, 0x01, 0xff]),
        ],
    );
    assert!(decode_frame(&record).is_err());
}

#[test]
fn no_other_frame_takes_a_trace() {
    let mut req = Vec::new();
    text(&mut req, "r1");
    let record = frame("cancel", &[("req_id", &req), ("trace", &trace_item())]);
    assert!(matches!(
        decode_frame(&record),
        Err(DecodeError::UnknownField { .. })
    ));
}
