//! The frames of protocol 2, `item` and `credit` (WIRE.md 2.2): the
//! worked example of WIRE.md 4.9 byte for byte, round trips of any
//! content in any key order, and every way a peer can break them, each
//! with its typed error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/frame_decode.rs"]
mod frame_decode;
#[path = "support/wire.rs"]
mod wire;

use capwire_envelope::{
    Credit, DecodeError, EncodeError, Frame, FrameKind, FrameRef, IdError, MAX_DEPTH,
    MAX_REQ_ID_LEN, PROTOCOL_V2, RawValue, ReqId, StreamItem, decode_frame, encode_control,
    encode_credit, encode_frame, encode_item, encode_item_serialize, encode_response_ok,
};
use proptest::prelude::*;
use wire::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn decode_err(bytes: &[u8]) -> DecodeError {
    decode_frame(bytes).expect_err("must be rejected")
}

fn item_fields(req_id: &str, item: Vec<u8>) -> Vec<(String, Vec<u8>)> {
    vec![
        ("type".into(), text("item")),
        ("req_id".into(), text(req_id)),
        ("item".into(), item),
    ]
}

fn credit_fields(req_id: &str, items: Vec<u8>, bytes: Vec<u8>) -> Vec<(String, Vec<u8>)> {
    vec![
        ("type".into(), text("credit")),
        ("req_id".into(), text(req_id)),
        ("items".into(), items),
        ("bytes".into(), bytes),
    ]
}

/// `fields` with `name`'s value replaced, or the field added.
fn with(mut fields: Vec<(String, Vec<u8>)>, name: &str, value: Vec<u8>) -> Vec<u8> {
    match fields.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = value,
        None => fields.push((name.to_owned(), value)),
    }
    map(&fields)
}

/// `fields` without `name`.
fn without(fields: Vec<(String, Vec<u8>)>, name: &str) -> Vec<u8> {
    let kept: Vec<_> = fields.into_iter().filter(|(k, _)| k != name).collect();
    map(&kept)
}

#[test]
fn the_worked_example_of_wire_4_9_is_exact() {
    let id = ReqId::try_from("9").unwrap();
    let control = hex("a5 64 74797065 67 636f6e74726f6c
                          63 636170 67 6170702e6c6c6d
                          64 76657262 68 67656e6572617465
                          66 7265715f6964 61 39
                          64 61726773 62 6869");
    let credit = hex("a4 64 74797065 66 637265646974
                         66 7265715f6964 61 39
                         65 6974656d73 10
                         65 6279746573 1a 00010000");
    let item = hex("a3 64 74797065 64 6974656d
                       66 7265715f6964 61 39
                       64 6974656d 65 48656c6c6f");
    let response = hex("a4 64 74797065 68 726573706f6e7365
                           66 7265715f6964 61 39
                           62 6f6b f5
                           66 726573756c74 f6");
    assert_eq!(
        (control.len(), credit.len(), item.len(), response.len()),
        (57, 40, 31, 36),
        "the sizes WIRE.md gives"
    );
    let hi = capwire_envelope::to_vec("hi").unwrap();
    let mut out = Vec::new();
    encode_control(&mut out, "app.llm", "generate", &id, None, &hi).unwrap();
    assert_eq!(out, control);
    let mut out = Vec::new();
    encode_credit(&mut out, &id, 16, 65536).unwrap();
    assert_eq!(out, credit);
    let hello = capwire_envelope::to_vec("Hello").unwrap();
    assert_eq!(
        hello.len(),
        6,
        "an item of \"Hello\" costs 6 bytes of credit"
    );
    let mut out = Vec::new();
    encode_item(&mut out, &id, &hello).unwrap();
    assert_eq!(out, item);
    let mut out = Vec::new();
    assert_eq!(encode_item_serialize(&mut out, &id, "Hello").unwrap(), 6);
    assert_eq!(out, item, "both item encoders write the same bytes");
    let mut out = Vec::new();
    encode_response_ok(&mut out, &id, &[0xf6]).unwrap();
    assert_eq!(out, response);

    match decode_frame(&credit).unwrap() {
        FrameRef::Credit(c) => assert_eq!((c.req_id.as_str(), c.items, c.bytes), ("9", 16, 65536)),
        other => panic!("{other:?}"),
    }
    match decode_frame(&item).unwrap() {
        FrameRef::Item(i) => assert_eq!((i.req_id.as_str(), i.item), ("9", &hello[..])),
        other => panic!("{other:?}"),
    }
    // The fuzz target's seeds for these frames are these bytes.
    assert_eq!(
        &include_bytes!("../../fuzz/seeds/frame_decode/item")[..],
        &item[..]
    );
    assert_eq!(
        &include_bytes!("../../fuzz/seeds/frame_decode/credit")[..],
        &credit[..]
    );
    for (bytes, kind) in [(&credit, FrameKind::Credit), (&item, FrameKind::Item)] {
        let f = decode_frame(bytes).unwrap();
        assert_eq!(f.kind(), kind);
        assert_eq!(kind.since(), PROTOCOL_V2, "{kind} is a frame of protocol 2");
        frame_decode::check(bytes);
    }
}

#[test]
fn the_encoders_refuse_what_would_break_the_frame() {
    let mut out = vec![7];
    assert!(matches!(
        encode_item(&mut out, &ReqId::EMPTY, &[0xf6]),
        Err(EncodeError::InvalidId(IdError::Empty { .. }))
    ));
    assert!(matches!(
        encode_credit(&mut out, &ReqId::EMPTY, 1, 1),
        Err(EncodeError::InvalidId(IdError::Empty { .. }))
    ));
    for bad in [
        &[0xf7][..],
        &[0xc0, 0x00],
        &[0x9f, 0xff],
        &[0xf6, 0xf6],
        &[],
    ] {
        assert!(
            matches!(
                encode_item(&mut out, &ReqId::from_u64(1), bad),
                Err(EncodeError::Profile(_))
            ),
            "{bad:02x?}"
        );
    }
    assert_eq!(out, [7], "a refused frame leaves the buffer as it was");
}

// --- Round trips --------------------------------------------------------------

fn req_id() -> impl Strategy<Value = ReqId> {
    "[!-~]{1,64}".prop_map(|s| ReqId::try_from(s.as_str()).unwrap())
}

/// Items of many shapes: numbers, texts, byte strings, nested arrays and
/// maps, up to the nesting the profile allows.
fn raw_item() -> impl Strategy<Value = RawValue> {
    prop_oneof![
        any::<u64>().prop_map(|n| RawValue::encode(&n).unwrap()),
        any::<i64>().prop_map(|n| RawValue::encode(&n).unwrap()),
        ".{0,40}".prop_map(|s| RawValue::encode(&s).unwrap()),
        proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(
                |b| RawValue::from_slice(&[head(BYTES, b.len() as u64), b].concat()).unwrap()
            ),
        (0..=MAX_DEPTH).prop_map(|n| RawValue::from_slice(&nested_arrays(n)).unwrap()),
        proptest::collection::btree_map("[a-z]{0,4}", any::<u32>(), 0..6)
            .prop_map(|m| RawValue::encode(&m).unwrap()),
    ]
}

fn stream_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (req_id(), raw_item()).prop_map(|(req_id, item)| Frame::Item(StreamItem { req_id, item })),
        (req_id(), any::<u32>(), any::<u32>()).prop_map(|(req_id, items, bytes)| Frame::Credit(
            Credit {
                req_id,
                items,
                bytes
            }
        )),
        (
            req_id(),
            prop_oneof![Just(0u32), Just(u32::MAX)],
            prop_oneof![Just(0u32), Just(u32::MAX)]
        )
            .prop_map(|(req_id, items, bytes)| Frame::Credit(Credit {
                req_id,
                items,
                bytes
            })),
    ]
}

/// The fields of a frame as encoded, so they can be shuffled.
fn fields_of(frame: &Frame) -> Vec<(String, Vec<u8>)> {
    match frame {
        Frame::Item(i) => item_fields(i.req_id.as_str(), i.item.as_bytes().to_vec()),
        Frame::Credit(c) => credit_fields(
            c.req_id.as_str(),
            uint(u64::from(c.items)),
            uint(u64::from(c.bytes)),
        ),
        other => panic!("not a stream frame: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn stream_frames_round_trip(frame in stream_frame()) {
        let mut bytes = Vec::new();
        encode_frame(&frame, &mut bytes).unwrap();
        let decoded = decode_frame(&bytes).unwrap();
        prop_assert_eq!(decoded.kind(), frame.kind());
        prop_assert_eq!(decoded.to_frame().unwrap(), frame.clone());
        let mut again = Vec::new();
        decoded.encode(&mut again).unwrap();
        prop_assert_eq!(&again, &bytes);
        // The hand-built frame, keys in table order, is the same bytes.
        prop_assert_eq!(map(&fields_of(&frame)), bytes.clone());
        frame_decode::check(&bytes);
    }

    #[test]
    fn stream_frames_decode_in_any_key_order(
        fields in stream_frame().prop_map(|f| fields_of(&f)).prop_shuffle(),
    ) {
        let bytes = map(&fields);
        let decoded = decode_frame(&bytes).unwrap();
        prop_assert!(matches!(decoded, FrameRef::Item(_) | FrameRef::Credit(_)));
        frame_decode::check(&bytes);
    }

    #[test]
    fn any_serializable_item_costs_its_encoded_length(text in ".{0,300}", n in any::<u64>()) {
        let id = ReqId::from_u64(n);
        let mut out = Vec::new();
        let len = encode_item_serialize(&mut out, &id, &text).unwrap();
        let FrameRef::Item(i) = decode_frame(&out).unwrap() else {
            panic!("not an item")
        };
        prop_assert_eq!(i.item.len(), len);
        prop_assert_eq!(i.item, &capwire_envelope::to_vec(&text).unwrap()[..]);
    }
}

// --- Bad input ----------------------------------------------------------------

#[test]
fn missing_fields_are_rejected() {
    for name in ["type", "req_id", "item"] {
        assert_eq!(
            decode_err(&without(item_fields("1", uint(1)), name)),
            DecodeError::MissingField { field: name },
            "item without {name}"
        );
    }
    for name in ["type", "req_id", "items", "bytes"] {
        assert_eq!(
            decode_err(&without(credit_fields("1", uint(1), uint(1)), name)),
            DecodeError::MissingField { field: name },
            "credit without {name}"
        );
    }
}

#[test]
fn unknown_fields_and_fields_of_other_kinds_are_rejected() {
    let unknown = |bytes: Vec<u8>, name: &str| {
        assert_eq!(
            decode_err(&bytes),
            DecodeError::UnknownField { name: name.into() },
            "{name}"
        );
    };
    // Fields of another frame kind (each with a value of its own type),
    // the other stream frame's included.
    let foreign = [
        ("items", uint(1)),
        ("bytes", uint(1)),
        ("item", uint(1)),
        ("args", vec![0xf6]),
        ("result", vec![0xf6]),
        ("ok", vec![0xf5]),
        ("cap", text("app.echo")),
        ("verb", text("say")),
        ("budget_ms", uint(1)),
        ("code", text("normal")),
        ("reason", text("")),
    ];
    for (name, value) in &foreign {
        if !["item"].contains(name) {
            unknown(with(item_fields("1", uint(1)), name, value.clone()), name);
        }
        if !["items", "bytes"].contains(name) {
            unknown(
                with(credit_fields("1", uint(1), uint(1)), name, value.clone()),
                name,
            );
        }
    }
    // Near misses.
    unknown(with(item_fields("1", uint(1)), "Item", uint(1)), "Item");
    unknown(
        with(credit_fields("1", uint(1), uint(1)), "window", uint(1)),
        "window",
    );
    // Stream fields in frames of protocol 1.
    unknown(with(control_fields(), "items", uint(1)), "items");
    unknown(
        map(&[
            ("type", text("cancel")),
            ("req_id", text("1")),
            ("item", uint(1)),
        ]),
        "item",
    );
    // Other spellings of the kinds.
    for kind in ["Item", "items", "Credit", "grant", "credits"] {
        assert_eq!(
            decode_err(&with(item_fields("1", uint(1)), "type", text(kind))),
            DecodeError::UnknownName {
                field: "type",
                name: kind.into()
            },
            "{kind}"
        );
    }
}

#[test]
fn duplicate_keys_are_rejected() {
    for (name, value) in item_fields("1", uint(1)) {
        let mut fields = item_fields("1", uint(1));
        let at = map(&fields).len();
        fields.push((name.clone(), value));
        assert_eq!(
            decode_err(&map(&fields)),
            DecodeError::DuplicateKey { at },
            "item: {name}"
        );
    }
    for (name, value) in credit_fields("1", uint(1), uint(1)) {
        let mut fields = credit_fields("1", uint(1), uint(1));
        let at = map(&fields).len();
        fields.push((name.clone(), value));
        assert_eq!(
            decode_err(&map(&fields)),
            DecodeError::DuplicateKey { at },
            "credit: {name}"
        );
    }
    // Inside the item.
    let item = map(&[("a", uint(1)), ("a", uint(2))]);
    assert!(matches!(
        decode_err(&map(&item_fields("1", item))),
        DecodeError::DuplicateKey { .. }
    ));
}

#[test]
fn credit_counts_must_be_unsigned_and_at_most_2_32_minus_1() {
    let max = u64::from(u32::MAX);
    let most = map(&credit_fields("1", uint(max), uint(max)));
    let ok = decode_frame(&most).unwrap();
    assert!(matches!(ok, FrameRef::Credit(c) if c.items == u32::MAX && c.bytes == u32::MAX));
    for field in ["items", "bytes"] {
        for value in [max + 1, 1 << 40, u64::MAX] {
            assert_eq!(
                decode_err(&with(
                    credit_fields("1", uint(1), uint(1)),
                    field,
                    uint(value)
                )),
                DecodeError::IntegerOutOfRange { field },
                "{field} = {value}"
            );
        }
        let wrong: [Vec<u8>; 7] = [
            vec![0x20],                                                 // -1
            vec![0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // -2^64
            text("5"),
            vec![0xf6],
            vec![0xf5],
            vec![0x80],
            vec![0xf9, 0x3c, 0x00], // 1.0
        ];
        for value in wrong {
            assert_eq!(
                decode_err(&with(
                    credit_fields("1", uint(1), uint(1)),
                    field,
                    value.clone()
                )),
                DecodeError::WrongType {
                    field,
                    expected: "an unsigned integer"
                },
                "{field} = {value:02x?}"
            );
        }
        // Not in the shortest form.
        assert!(matches!(
            decode_err(&with(
                credit_fields("1", uint(1), uint(1)),
                field,
                vec![0x18, 0x05]
            )),
            DecodeError::NonMinimalInteger { .. }
        ));
    }
}

#[test]
fn stream_frames_need_a_valid_req_id() {
    let frames = |id: Vec<u8>| {
        [
            with(item_fields("1", uint(1)), "req_id", id.clone()),
            with(credit_fields("1", uint(1), uint(1)), "req_id", id),
        ]
    };
    for f in frames(text("")) {
        assert!(
            matches!(
                decode_err(&f),
                DecodeError::InvalidId(IdError::Empty { .. })
            ),
            "an empty req_id names no stream"
        );
    }
    for f in frames(text(&"x".repeat(MAX_REQ_ID_LEN + 1))) {
        assert!(matches!(
            decode_err(&f),
            DecodeError::InvalidId(IdError::TooLong { .. })
        ));
    }
    for id in ["a b", "a\0b", "é"] {
        for f in frames(text(id)) {
            assert!(
                matches!(
                    decode_err(&f),
                    DecodeError::InvalidId(IdError::Malformed { .. })
                ),
                "{id:?}"
            );
        }
    }
    for f in frames(uint(9)) {
        assert_eq!(
            decode_err(&f),
            DecodeError::WrongType {
                field: "req_id",
                expected: "a text string"
            }
        );
    }
    let longest = "~".repeat(MAX_REQ_ID_LEN);
    for f in frames(text(&longest)) {
        assert!(decode_frame(&f).is_ok());
    }
}

#[test]
fn an_item_must_be_one_valid_data_item() {
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("a tag", vec![0xc0, 0x60]),
        ("indefinite", vec![0x9f, 0xff]),
        ("undefined", vec![0xf7]),
        ("a non-minimal integer", vec![0x18, 0x05]),
        ("a non-minimal float", vec![0xfa, 0x3f, 0x80, 0x00, 0x00]),
        ("invalid UTF-8", vec![0x62, 0xc3, 0x28]),
        ("reserved", vec![0x1c]),
        ("too deep", nested_arrays(MAX_DEPTH + 1)),
        (
            "a claimed length past the input",
            [head(BYTES, u64::MAX), vec![0]].concat(),
        ),
    ];
    for (what, item) in bad {
        let e = decode_err(&map(&item_fields("1", item)));
        assert!(
            !matches!(
                e,
                DecodeError::MissingField { .. } | DecodeError::UnknownField { .. }
            ),
            "{what}: {e:?}"
        );
    }
    // Nested to the limit: accepted.
    let deep = nested_arrays(MAX_DEPTH);
    assert!(decode_frame(&map(&item_fields("1", deep))).is_ok());
    // The item is one data item: a second one after it is another key.
    let mut two = map(&item_fields("1", uint(1)));
    two.push(0x01);
    assert!(matches!(
        decode_err(&two),
        DecodeError::TrailingBytes { .. }
    ));
    // Truncated anywhere: refused.
    let whole = map(&item_fields("12", text("abc")));
    for cut in 0..whole.len() {
        assert!(decode_frame(&whole[..cut]).is_err(), "cut at {cut}");
    }
    let whole = map(&credit_fields("12", uint(70_000), uint(300)));
    for cut in 0..whole.len() {
        assert!(decode_frame(&whole[..cut]).is_err(), "cut at {cut}");
    }
}
