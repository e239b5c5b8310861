//! The strict codec against plain ciborium serde, on a small control
//! envelope (`app.echo` / `say`, req_id `42`, args `{"text": "hello"}`).
//!
//! Criterion measures each case; then, under `cargo bench`, the same bodies
//! are timed side by side and the strict/plain ratios are printed.
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::time::Instant;

use capwire_envelope::{
    CapId, ControlEnvelope, Frame, FrameRef, RawValue, ReqId, Verb, decode_frame, encode_frame,
};
use criterion::Criterion;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Args {
    text: String,
}

/// The same record for plain serde, with args as a generic value.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlainControl {
    #[serde(rename = "type")]
    kind: String,
    cap: String,
    verb: String,
    req_id: String,
    args: ciborium::Value,
}

/// The same record for plain serde, with typed args.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlainTyped {
    #[serde(rename = "type")]
    kind: String,
    cap: String,
    verb: String,
    req_id: String,
    args: Args,
}

struct Fixture {
    frame: Frame,
    plain: PlainControl,
    typed: PlainTyped,
    strict_bytes: Vec<u8>,
    plain_bytes: Vec<u8>,
    typed_bytes: Vec<u8>,
}

fn fixture() -> Fixture {
    let args = Args {
        text: "hello".into(),
    };
    let frame = Frame::Control(ControlEnvelope::new(
        CapId::try_from("app.echo").unwrap(),
        Verb::try_from("say").unwrap(),
        ReqId::from_u64(42),
        RawValue::encode(&args).unwrap(),
    ));
    let plain = PlainControl {
        kind: "control".into(),
        cap: "app.echo".into(),
        verb: "say".into(),
        req_id: "42".into(),
        args: ciborium::Value::serialized(&args).unwrap(),
    };
    let typed = PlainTyped {
        kind: "control".into(),
        cap: "app.echo".into(),
        verb: "say".into(),
        req_id: "42".into(),
        args,
    };
    let strict_bytes = frame.to_vec().unwrap();
    let mut plain_bytes = Vec::new();
    ciborium::into_writer(&plain, &mut plain_bytes).unwrap();
    let mut typed_bytes = Vec::new();
    ciborium::into_writer(&typed, &mut typed_bytes).unwrap();
    Fixture {
        frame,
        plain,
        typed,
        strict_bytes,
        plain_bytes,
        typed_bytes,
    }
}

fn strict_round_trip(f: &Fixture, buf: &mut Vec<u8>) {
    buf.clear();
    encode_frame(&f.frame, buf).unwrap();
    let decoded = decode_frame(black_box(buf)).unwrap();
    black_box(&decoded);
}

fn strict_round_trip_typed(f: &Fixture, buf: &mut Vec<u8>) {
    buf.clear();
    encode_frame(&f.frame, buf).unwrap();
    let FrameRef::Control(c) = decode_frame(black_box(buf)).unwrap() else {
        unreachable!()
    };
    black_box(c.decode_args::<Args>().unwrap());
}

fn plain_round_trip(f: &Fixture, buf: &mut Vec<u8>) {
    buf.clear();
    ciborium::into_writer(&f.plain, &mut *buf).unwrap();
    let decoded: PlainControl = ciborium::from_reader(black_box(&buf[..])).unwrap();
    black_box(decoded);
}

fn plain_round_trip_typed(f: &Fixture, buf: &mut Vec<u8>) {
    buf.clear();
    ciborium::into_writer(&f.typed, &mut *buf).unwrap();
    let decoded: PlainTyped = ciborium::from_reader(black_box(&buf[..])).unwrap();
    black_box(decoded);
}

fn strict_header(f: &Fixture) {
    black_box(decode_frame(black_box(&f.strict_bytes)).unwrap());
}

fn plain_decode(f: &Fixture) {
    let decoded: PlainControl = ciborium::from_reader(black_box(&f.plain_bytes[..])).unwrap();
    black_box(decoded);
}

fn plain_decode_typed(f: &Fixture) {
    let decoded: PlainTyped = ciborium::from_reader(black_box(&f.typed_bytes[..])).unwrap();
    black_box(decoded);
}

fn strict_encode(f: &Fixture, buf: &mut Vec<u8>) {
    buf.clear();
    encode_frame(black_box(&f.frame), buf).unwrap();
    black_box(buf);
}

fn plain_encode(f: &Fixture, buf: &mut Vec<u8>) {
    buf.clear();
    ciborium::into_writer(black_box(&f.plain), &mut *buf).unwrap();
    black_box(buf);
}

fn benches(c: &mut Criterion) {
    let f = fixture();
    let mut buf = Vec::with_capacity(256);
    let mut g = c.benchmark_group("round_trip");
    g.bench_function("strict", |b| b.iter(|| strict_round_trip(&f, &mut buf)));
    g.bench_function("plain_value_args", |b| {
        b.iter(|| plain_round_trip(&f, &mut buf))
    });
    g.bench_function("strict_typed_args", |b| {
        b.iter(|| strict_round_trip_typed(&f, &mut buf))
    });
    g.bench_function("plain_typed_args", |b| {
        b.iter(|| plain_round_trip_typed(&f, &mut buf))
    });
    g.finish();
    let mut g = c.benchmark_group("decode");
    g.bench_function("strict_header", |b| b.iter(|| strict_header(&f)));
    g.bench_function("plain_value_args", |b| b.iter(|| plain_decode(&f)));
    g.bench_function("plain_typed_args", |b| b.iter(|| plain_decode_typed(&f)));
    g.finish();
    let mut g = c.benchmark_group("encode");
    g.bench_function("strict", |b| b.iter(|| strict_encode(&f, &mut buf)));
    g.bench_function("plain", |b| b.iter(|| plain_encode(&f, &mut buf)));
    g.finish();
}

/// Nanoseconds per call: the best of several timed batches.
fn per_call(mut body: impl FnMut()) -> f64 {
    const BATCH: u32 = 100_000;
    for _ in 0..BATCH / 10 {
        body();
    }
    (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..BATCH {
                body();
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(BATCH)
        })
        .fold(f64::INFINITY, f64::min)
}

fn print_ratios() {
    let f = fixture();
    let mut buf = Vec::with_capacity(256);
    println!(
        "\nrecord sizes: strict {} bytes, plain {} bytes",
        f.strict_bytes.len(),
        f.plain_bytes.len()
    );
    let pair = |name: &str, strict: &mut dyn FnMut(), plain: &mut dyn FnMut()| {
        let s = per_call(strict);
        let p = per_call(plain);
        println!(
            "{name:<44} strict {s:>7.1} ns  plain {p:>7.1} ns  strict/plain {:.2}x",
            s / p
        );
    };
    let b = std::cell::RefCell::new(&mut buf);
    pair(
        "encode + decode (args raw vs ciborium::Value)",
        &mut || strict_round_trip(&f, &mut b.borrow_mut()),
        &mut || plain_round_trip(&f, &mut b.borrow_mut()),
    );
    pair(
        "encode + decode (typed args both sides)",
        &mut || strict_round_trip_typed(&f, &mut b.borrow_mut()),
        &mut || plain_round_trip_typed(&f, &mut b.borrow_mut()),
    );
    pair(
        "header-only decode vs plain decode (Value)",
        &mut || strict_header(&f),
        &mut || plain_decode(&f),
    );
    pair(
        "header-only decode vs plain decode (typed)",
        &mut || strict_header(&f),
        &mut || plain_decode_typed(&f),
    );
    pair(
        "encode",
        &mut || strict_encode(&f, &mut b.borrow_mut()),
        &mut || plain_encode(&f, &mut b.borrow_mut()),
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    // `cargo bench` passes `--bench`; skip the side-by-side timing in test
    // and profiling modes.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--profile-time") {
        print_ratios();
    }
}
