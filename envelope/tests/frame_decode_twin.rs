//! The property-test twin of the `frame_decode` fuzz target: random bytes,
//! CBOR-shaped token soup and mutated valid frames (every kind, `item` and
//! `credit` of protocol 2 included) never panic the decoder, and whatever
//! decodes survives a re-encode.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/frame_decode.rs"]
mod frame_decode;
#[path = "support/wire.rs"]
mod wire;

use proptest::prelude::*;
use wire::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Pieces of CBOR that frames are made of, to reach past the first byte.
fn token() -> impl Strategy<Value = Vec<u8>> {
    let fixed: Vec<Vec<u8>> = vec![
        vec![0xa0],
        vec![0xa1],
        vec![0xa2],
        vec![0xa3],
        vec![0xa4],
        vec![0xa5],
        vec![0xa6],
        vec![0xb8, 0x05],
        vec![0xbf],
        vec![0xff],
        vec![0x80],
        vec![0x81],
        vec![0x82],
        vec![0x9f],
        vec![0xc0],
        vec![0xd8, 0x20],
        vec![0xf4],
        vec![0xf5],
        vec![0xf6],
        vec![0xf7],
        vec![0xf9, 0x3c, 0x00],
        vec![0xfa, 0x3f, 0x80, 0x00, 0x00],
        vec![0x18, 0x05],
        vec![0x19, 0x05, 0xdc],
        vec![0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0x60],
        text("type"),
        text("control"),
        text("response"),
        text("hello"),
        text("cancel"),
        text("close"),
        text("keepalive"),
        text("cap"),
        text("app.echo"),
        text("verb"),
        text("say"),
        text("req_id"),
        text("42"),
        text("args"),
        text("budget_ms"),
        text("ok"),
        text("result"),
        text("err"),
        text("code"),
        text("message"),
        text("detail"),
        text("internal"),
        text("reason"),
        text("normal"),
        text("protocol"),
        text("manifest"),
        text("limits"),
        text("max_record"),
        text("max_inflight"),
        text("keepalive_ms"),
        // Protocol 2.
        text("item"),
        text("credit"),
        text("items"),
        text("bytes"),
        vec![0x1a, 0xff, 0xff, 0xff, 0xff],
        vec![0x1b, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00],
    ];
    prop_oneof![
        4 => proptest::sample::select(fixed),
        1 => proptest::collection::vec(any::<u8>(), 1..4),
    ]
}

fn soup() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(token(), 0..24).prop_map(|t| t.concat())
}

/// A valid frame of some kind, hand-built so keys come in any order.
fn valid_frame() -> impl Strategy<Value = Vec<u8>> {
    let err = map(&[("code", text("internal")), ("message", text("boom"))]);
    let limits = map(&[
        ("max_record", uint(65536)),
        ("max_inflight", uint(8)),
        ("keepalive_ms", uint(1000)),
    ]);
    let frames: Vec<Vec<(String, Vec<u8>)>> = vec![
        control_fields(),
        [
            ("type", text("response")),
            ("req_id", text("7")),
            ("ok", vec![0xf5]),
            (
                "result",
                map(&[("n", uint(300)), ("l", vec![0x82, 0x20, 0x41, 0x00])]),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        [
            ("type", text("response")),
            ("req_id", text("7")),
            ("ok", vec![0xf4]),
            ("err", err),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        [
            ("type", text("hello")),
            ("protocol", uint(1)),
            ("limits", limits),
            ("manifest", map(&[("caps", vec![0x80])])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        vec![
            ("type".to_owned(), text("close")),
            ("code".to_owned(), text("shutdown")),
            ("reason".to_owned(), text("bye")),
        ],
        vec![
            ("type".to_owned(), text("cancel")),
            ("req_id".to_owned(), text("7")),
        ],
        vec![("type".to_owned(), text("keepalive"))],
        // Protocol 2: an item (a nested item) and a credit at its bounds.
        vec![
            ("type".to_owned(), text("item")),
            ("req_id".to_owned(), text("7")),
            (
                "item".to_owned(),
                map(&[("t", text("tok")), ("n", uint(3))]),
            ),
        ],
        vec![
            ("type".to_owned(), text("credit")),
            ("req_id".to_owned(), text("7")),
            ("items".to_owned(), uint(16)),
            ("bytes".to_owned(), uint(u64::from(u32::MAX))),
        ],
    ];
    proptest::sample::select(frames)
        .prop_flat_map(|fields| Just(fields).prop_shuffle())
        .prop_map(|fields| map(&fields))
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len().max(1);
        match *m {
            Mutation::Set(i, b) if !bytes.is_empty() => bytes[i % len] = b,
            Mutation::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), b),
            Mutation::Remove(i) if !bytes.is_empty() => {
                bytes.remove(i % len);
            }
            Mutation::Truncate(i) => bytes.truncate(i % len),
            _ => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(config(10_000))]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..96)) {
        frame_decode::check(&data);
    }

    #[test]
    fn cbor_token_soup_never_panics(data in soup()) {
        frame_decode::check(&data);
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    #[test]
    fn mutated_frames_never_panic(
        frame in valid_frame(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        frame_decode::check(&mutate(frame, &mutations));
    }

    #[test]
    fn valid_frames_decode_in_any_key_order(frame in valid_frame()) {
        prop_assert!(capwire_envelope::decode_frame(&frame).is_ok());
        frame_decode::check(&frame);
    }
}
