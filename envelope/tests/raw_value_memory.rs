//! A `RawValue` goes through serde without a value tree: decoding one of
//! 4 MiB embedded in a struct, and serializing it, allocates a small
//! multiple of its size. Measured with a counting global allocator; this
//! file holds a single test so that nothing else allocates while it
//! measures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::alloc::System;

use capwire_envelope::{RawValue, from_slice, to_vec};
use serde::{Deserialize, Serialize};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The largest allocation, as a multiple of the value's size, the test
/// accepts for any one operation.
const MAX_RATIO: f64 = 3.0;

const SIZE: usize = 4 << 20;

/// A record carrying an opaque value, as a handler's args or result would.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Carrier {
    id: u32,
    value: RawValue,
    note: String,
}

/// Bytes allocated while running `f`.
fn allocated_by<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let region = Region::new(GLOBAL);
    let r = f();
    (r, region.change().bytes_allocated)
}

/// One byte string of about `size` bytes.
fn blob(size: usize) -> RawValue {
    RawValue::encode(&ByteString(vec![0x5a; size])).unwrap()
}

/// One array of `size` one-byte integers (what `Vec<u8>` serializes to):
/// the shape a value tree inflates most.
fn integers(size: usize) -> RawValue {
    RawValue::encode(&(0..size).map(|i| (i % 24) as u8).collect::<Vec<u8>>()).unwrap()
}

/// Many small maps (text, integers, floats, booleans, byte strings, nested
/// arrays), about `size` bytes in all.
fn records(size: usize) -> RawValue {
    #[derive(Serialize)]
    struct Entry {
        n: u64,
        neg: i64,
        label: String,
        ratio: f64,
        on: bool,
        tags: Vec<&'static str>,
        blob: ByteString,
        none: Option<u8>,
    }
    let mut entries = Vec::new();
    let mut total = 0;
    let mut i = 0u64;
    while total < size {
        let e = Entry {
            n: i * 7919,
            neg: -(i as i64) * 31,
            label: format!("entry number {i}"),
            // Exact in binary, so that JSON text gives the same float back.
            ratio: i as f64 * 0.25,
            on: i.is_multiple_of(2),
            tags: vec!["a", "bc", "def"],
            blob: ByteString(vec![i as u8; 5]),
            none: None,
        };
        total += to_vec(&e).unwrap().len();
        entries.push(e);
        i += 1;
    }
    RawValue::encode(&entries).unwrap()
}

/// A byte string (`Vec<u8>` alone serializes as an array of integers).
struct ByteString(Vec<u8>);

impl Serialize for ByteString {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

fn check(what: &str, op: &str, allocated: usize, size: usize) {
    let ratio = allocated as f64 / size as f64;
    eprintln!(
        "{what}: {op} of {size} bytes allocated {allocated} bytes ({ratio:.2}x, {:.1} MiB)",
        allocated as f64 / (1 << 20) as f64
    );
    assert!(
        ratio <= MAX_RATIO,
        "{what}: {op} allocated {allocated} bytes for a {size}-byte value ({ratio:.2}x)"
    );
}

#[test]
fn a_4_mib_raw_value_is_transcoded_without_a_value_tree() {
    for (what, value) in [
        ("byte string", blob(SIZE)),
        ("small integers", integers(SIZE)),
        ("records", records(SIZE)),
    ] {
        let size = value.as_bytes().len();
        let carrier = Carrier {
            id: 7,
            value,
            note: "end".into(),
        };

        // Serializing into the strict profile walks the value's bytes.
        let (bytes, n) = allocated_by(|| to_vec(&carrier).unwrap());
        check(what, "CBOR encode", n, size);

        // Decoding writes the value straight into its buffer.
        let (back, n) = allocated_by(|| from_slice::<Carrier>(&bytes).unwrap());
        check(what, "CBOR decode", n, size);
        assert_eq!(back, carrier, "{what}: CBOR round trip");
        assert_eq!(
            back.value.as_bytes(),
            carrier.value.as_bytes(),
            "{what}: byte-identical"
        );
        drop(back);

        // JSON, for the records (the shape JSON is used for; it has no
        // byte strings).
        if what != "records" {
            continue;
        }
        let (json, n) = allocated_by(|| serde_json::to_vec(&carrier).unwrap());
        check(what, "JSON encode", n, size);
        let (back, n) = allocated_by(|| serde_json::from_slice::<Carrier>(&json).unwrap());
        check(what, "JSON decode", n, size);
        assert_eq!(
            serde_json::to_vec(&back).unwrap(),
            json,
            "{what}: JSON round trip"
        );
    }

    // The counter does count: copying a value out allocates its size.
    let item = to_vec(&ByteString(vec![7; 1000])).unwrap();
    let (r, n) = allocated_by(|| RawValue::from_slice(&item));
    drop(r.unwrap());
    assert!(n >= item.len(), "the allocator counted {n} bytes");
}
