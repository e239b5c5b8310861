//! Length headers claiming 2^32..2^64 bytes or items allocate nothing: every
//! claim is checked against the remaining input first. Measured with a
//! counting global allocator; this file holds a single test so that nothing
//! else allocates while it measures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/wire.rs"]
mod wire;

use std::alloc::System;

use capwire_envelope::{DecodeError, RawValue, decode_frame, from_slice, validate};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use wire::*;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes allocated while running `f`: the least of three runs, because the
/// counter is process-wide and the test harness's own threads may allocate
/// now and then; an allocation `f` makes shows up in every run.
fn allocated_by<R>(f: impl Fn() -> R) -> (R, usize) {
    let mut least = usize::MAX;
    let mut result = None;
    for _ in 0..3 {
        let region = Region::new(GLOBAL);
        let r = f();
        least = least.min(region.change().bytes_allocated);
        result = Some(r);
    }
    match result {
        Some(r) => (r, least),
        None => unreachable!("three runs"),
    }
}

fn assert_no_allocation(what: &str, bytes: &[u8]) {
    let (r, n) = allocated_by(|| validate(bytes));
    assert!(
        matches!(r, Err(DecodeError::LengthTooLarge { .. })),
        "{what}: {r:?}"
    );
    assert_eq!(n, 0, "{what}: validate allocated {n} bytes");

    let (r, n) = allocated_by(|| RawValue::from_slice(bytes).map(drop));
    assert!(
        matches!(r, Err(DecodeError::LengthTooLarge { .. })),
        "{what}: {r:?}"
    );
    assert_eq!(n, 0, "{what}: RawValue::from_slice allocated {n} bytes");

    let (r, n) = allocated_by(|| from_slice::<serde_json::Value>(bytes).map(drop));
    assert!(
        matches!(r, Err(DecodeError::LengthTooLarge { .. })),
        "{what}: {r:?}"
    );
    assert_eq!(n, 0, "{what}: from_slice allocated {n} bytes");

    for field in ["args", "cap", "verb", "req_id", "budget_ms"] {
        let frame = control_with(field, bytes.to_vec());
        let (r, n) = allocated_by(|| decode_frame(&frame).map(drop));
        let e = r.expect_err("must be rejected");
        // A length header where a text string or integer belongs is either
        // rejected for its claim or, when it is not a string, for its type.
        assert!(
            matches!(
                e,
                DecodeError::LengthTooLarge { .. } | DecodeError::WrongType { .. }
            ),
            "{what} in {field}: {e:?}"
        );
        assert_eq!(n, 0, "{what} in {field}: decode_frame allocated {n} bytes");
    }
}

#[test]
fn huge_length_claims_allocate_nothing() {
    let claims = [
        0xffff_ffff,
        1 << 32,
        (1 << 32) + 7,
        1 << 48,
        1 << 62,
        1 << 63,
        u64::MAX,
    ];
    for claimed in claims {
        for major in [BYTES, TEXT, ARRAY, MAP] {
            let mut item = head(major, claimed);
            item.extend_from_slice(&[0; 16]);
            assert_no_allocation(&format!("major {major} claiming {claimed}"), &item);
            // The same claim nested inside arrays and maps.
            let nested = [&[0x81, 0xa1, 0x61, b'k'][..], &item].concat();
            assert_no_allocation(&format!("nested major {major} claiming {claimed}"), &nested);
        }
        // The frame map itself.
        let frame = [head(MAP, claimed), text("type"), text("keepalive")].concat();
        let (r, n) = allocated_by(|| decode_frame(&frame).map(drop));
        assert!(matches!(r, Err(DecodeError::LengthTooLarge { .. })));
        assert_eq!(n, 0, "frame map claiming {claimed}: allocated {n} bytes");
    }

    // A correct frame allocates nothing either: it is decoded in place.
    let frame = map(&control_fields());
    let (r, n) = allocated_by(|| decode_frame(&frame).map(drop));
    r.unwrap();
    assert_eq!(n, 0, "decoding a control frame allocated {n} bytes");

    // The counter does count: copying a value out allocates its size.
    let item = [head(BYTES, 1000), vec![7; 1000]].concat();
    let (r, n) = allocated_by(|| RawValue::from_slice(&item));
    drop(r.unwrap());
    assert!(n >= item.len(), "the allocator counted {n} bytes");
}
