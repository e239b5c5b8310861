//! Every "CBOR and envelopes" input of SECURITY.md, fed to the decoders,
//! with the typed error each must give.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/wire.rs"]
mod wire;

use capwire_envelope::{
    DecodeError, ErrorCode, FrameRef, IdError, MAX_DEPTH, MAX_MESSAGE_LEN, MAX_NAME_LEN,
    MAX_REQ_ID_LEN, RawValue, decode_frame, from_slice, validate,
};
use wire::*;

fn control(bytes: &[u8]) -> capwire_envelope::ControlRef<'_> {
    match decode_frame(bytes) {
        Ok(FrameRef::Control(c)) => c,
        other => panic!("not a control frame: {other:?}"),
    }
}

fn decode_err(bytes: &[u8]) -> DecodeError {
    decode_frame(bytes).expect_err("must be rejected")
}

#[test]
fn the_reference_frame_is_valid() {
    let bytes = map(&control_fields());
    let c = control(&bytes);
    assert_eq!(
        (c.cap, c.verb, c.req_id.as_str()),
        ("app.echo", "say", "42")
    );
    assert_eq!(c.budget_ms, None);
}

// --- Deep nesting -----------------------------------------------------------

#[test]
fn nesting_100k_levels_is_a_clean_error() {
    const LEVELS: usize = 100_000;
    let arrays = nested_arrays(LEVELS);
    let depth = DecodeError::DepthExceeded {
        at: MAX_DEPTH,
        max: MAX_DEPTH,
    };
    assert_eq!(validate(&arrays), Err(depth.clone()));
    assert_eq!(RawValue::from_slice(&arrays), Err(depth.clone()));
    assert_eq!(from_slice::<serde_json::Value>(&arrays), Err(depth));

    // Maps: {"a": {"a": ... null}}
    let mut maps = Vec::with_capacity(LEVELS * 3 + 1);
    for _ in 0..LEVELS {
        maps.extend_from_slice(&[0xa1, 0x61, b'a']);
    }
    maps.push(0xf6);
    assert!(matches!(
        validate(&maps),
        Err(DecodeError::DepthExceeded { max: MAX_DEPTH, .. })
    ));

    // Inside a frame, as args.
    let frame = control_with("args", arrays.clone());
    assert!(matches!(
        decode_frame(&frame),
        Err(DecodeError::DepthExceeded { max: MAX_DEPTH, .. })
    ));
    // Inside a frame, where a text string belongs: rejected without descending.
    assert_eq!(
        decode_err(&control_with("cap", arrays)),
        DecodeError::WrongType {
            field: "cap",
            expected: "a text string"
        }
    );
}

#[test]
fn nesting_up_to_the_limit_is_accepted() {
    let ok = nested_arrays(MAX_DEPTH);
    validate(&ok).unwrap();
    control(&control_with("args", ok));
    assert!(validate(&nested_arrays(MAX_DEPTH + 1)).is_err());
}

// --- Huge length headers ----------------------------------------------------

const HUGE: [u64; 6] = [
    1 << 32,
    (1 << 32) + 1,
    1 << 40,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

#[test]
fn length_headers_claiming_2_32_to_2_64_are_rejected() {
    for claimed in HUGE {
        for major in [BYTES, TEXT, ARRAY, MAP] {
            let mut item = head(major, claimed);
            item.extend_from_slice(b"abc");
            assert_eq!(
                validate(&item),
                Err(DecodeError::LengthTooLarge {
                    at: 0,
                    claimed,
                    remaining: 3
                }),
                "major {major}, claimed {claimed}"
            );
            assert!(matches!(
                from_slice::<serde_json::Value>(&item),
                Err(DecodeError::LengthTooLarge { .. })
            ));
            // As args, nested one level down, and as the frame map itself.
            let nested = [&[0x81][..], &item].concat();
            assert!(matches!(
                decode_frame(&control_with("args", nested)),
                Err(DecodeError::LengthTooLarge { claimed: c, .. }) if c == claimed
            ));
        }
        let frame = [head(MAP, claimed), text("type"), text("keepalive")].concat();
        assert!(matches!(
            decode_frame(&frame),
            Err(DecodeError::LengthTooLarge { at: 0, claimed: c, .. }) if c == claimed
        ));
        for field in ["cap", "verb", "req_id", "type"] {
            let value = [head(TEXT, claimed), b"x".to_vec()].concat();
            assert!(
                matches!(
                    decode_frame(&control_with(field, value)),
                    Err(DecodeError::LengthTooLarge { claimed: c, .. }) if c == claimed
                ),
                "{field}"
            );
        }
    }
}

#[test]
fn lengths_just_past_the_input_are_rejected() {
    // One more byte than is there; and a map whose pairs cannot fit.
    assert!(matches!(
        validate(&[0x63, b'a', b'b']),
        Err(DecodeError::LengthTooLarge {
            claimed: 3,
            remaining: 2,
            ..
        })
    ));
    assert!(matches!(
        validate(&[0xa2, 0x01, 0x02, 0x03]),
        Err(DecodeError::LengthTooLarge { claimed: 2, .. })
    ));
    // 0xffff_ffff in the 4-byte form.
    assert!(matches!(
        validate(&[0x9a, 0xff, 0xff, 0xff, 0xff, 0x00]),
        Err(DecodeError::LengthTooLarge {
            claimed: 0xffff_ffff,
            ..
        })
    ));
}

#[test]
fn truncated_input_is_rejected() {
    let full = map(&control_fields());
    for cut in 0..full.len() {
        let e = decode_err(&full[..cut]);
        assert!(
            matches!(
                e,
                DecodeError::Truncated { .. } | DecodeError::LengthTooLarge { .. }
            ),
            "cut at {cut}: {e:?}"
        );
    }
    assert_eq!(validate(&[]), Err(DecodeError::Truncated { at: 0 }));
    assert_eq!(
        validate(&[0x19, 0x01]),
        Err(DecodeError::Truncated { at: 1 })
    );
}

// --- Trailing bytes ---------------------------------------------------------

#[test]
fn trailing_bytes_are_rejected() {
    let mut frame = map(&control_fields());
    let end = frame.len();
    frame.push(0x00);
    assert_eq!(
        decode_err(&frame),
        DecodeError::TrailingBytes { at: end, count: 1 }
    );
    // A second, complete frame in the same record.
    let two = [map(&control_fields()), map(&control_fields())].concat();
    assert_eq!(
        decode_err(&two),
        DecodeError::TrailingBytes {
            at: end,
            count: end
        }
    );
    assert_eq!(
        validate(&[0xf6, 0xf6, 0xf6]),
        Err(DecodeError::TrailingBytes { at: 1, count: 2 })
    );
    assert!(matches!(
        from_slice::<u8>(&[0x01, 0x00]),
        Err(DecodeError::TrailingBytes { .. })
    ));
    assert!(matches!(
        RawValue::from_slice(&[0x80, 0x80]),
        Err(DecodeError::TrailingBytes { .. })
    ));
}

// --- Tags -------------------------------------------------------------------

#[test]
fn tags_are_rejected() {
    // Tag 0 (date/time) around a string, tag 2 (bignum), tag 55799 (self-describe).
    for tagged in [
        [&[0xc0][..], &text("2024-01-01T00:00:00Z")].concat(),
        vec![0xc2, 0x41, 0x01],
        vec![0xd9, 0xd9, 0xf7, 0xf6],
    ] {
        assert_eq!(validate(&tagged), Err(DecodeError::Tag { at: 0 }));
        for field in ["args", "cap", "req_id"] {
            assert!(matches!(
                decode_err(&control_with(field, tagged.clone())),
                DecodeError::Tag { .. }
            ));
        }
    }
    // A tag around the whole frame.
    let wrapped = [&[0xd9, 0xd9, 0xf7][..], &map(&control_fields())].concat();
    assert_eq!(decode_err(&wrapped), DecodeError::Tag { at: 0 });
}

#[test]
fn a_chain_of_100k_tags_is_rejected_at_the_first() {
    let mut chain = Vec::with_capacity(200_001);
    for _ in 0..100_000 {
        chain.extend_from_slice(&[0xd8, 0x20]); // tag 32 (URI)
    }
    chain.push(0xf6);
    assert_eq!(validate(&chain), Err(DecodeError::Tag { at: 0 }));
    assert_eq!(
        from_slice::<serde_json::Value>(&chain),
        Err(DecodeError::Tag { at: 0 })
    );
    let frame = control_with("args", chain);
    assert!(matches!(decode_err(&frame), DecodeError::Tag { .. }));
}

// --- Indefinite lengths -----------------------------------------------------

#[test]
fn indefinite_lengths_are_rejected() {
    for item in [
        vec![0x5f, 0x41, 0x00, 0xff],       // bytes
        vec![0x7f, 0x61, b'a', 0xff],       // text
        vec![0x9f, 0x01, 0xff],             // array
        vec![0xbf, 0x61, b'a', 0x01, 0xff], // map
        vec![0xff],                         // a stray break
    ] {
        assert_eq!(
            validate(&item),
            Err(DecodeError::IndefiniteLength { at: 0 })
        );
        assert!(matches!(
            decode_err(&control_with("args", item.clone())),
            DecodeError::IndefiniteLength { .. }
        ));
    }
    // The frame map itself.
    let mut frame = vec![0xbf];
    frame.extend(text("type"));
    frame.extend(text("keepalive"));
    frame.push(0xff);
    assert_eq!(decode_err(&frame), DecodeError::IndefiniteLength { at: 0 });
    // An indefinite text where cap belongs.
    assert!(matches!(
        decode_err(&control_with("cap", vec![0x7f, 0x61, b'a', 0xff])),
        DecodeError::IndefiniteLength { .. }
    ));
}

// --- Duplicate keys ---------------------------------------------------------

#[test]
fn duplicate_keys_are_rejected_at_every_level() {
    // Frame level: every field of a control frame, repeated.
    for (name, value) in control_fields() {
        let mut fields = control_fields();
        fields.push((name.clone(), value));
        let key_at = map(&fields[..fields.len() - 1]).len();
        assert_eq!(
            decode_err(&map(&fields)),
            // The header grows by one byte when the count passes 23; it does not here.
            DecodeError::DuplicateKey { at: key_at },
            "{name}"
        );
    }
    // Same key, same value, different order of the other keys.
    let dup_cap = map(&[
        ("cap", text("app.echo")),
        ("type", text("control")),
        ("verb", text("say")),
        ("cap", text("app.other")),
        ("req_id", text("1")),
        ("args", vec![0xf6]),
    ]);
    assert!(matches!(
        decode_err(&dup_cap),
        DecodeError::DuplicateKey { .. }
    ));
    // Inside args, nested.
    let args = map(&[("a", map(&[("x", uint(1)), ("x", uint(2))]))]);
    assert!(matches!(
        decode_err(&control_with("args", args)),
        DecodeError::DuplicateKey { .. }
    ));
    // Inside an error body and inside limits.
    let err = map(&[
        ("type", text("response")),
        ("req_id", text("1")),
        ("ok", vec![0xf4]),
        (
            "err",
            map(&[
                ("code", text("internal")),
                ("message", text("a")),
                ("message", text("b")),
            ]),
        ),
    ]);
    assert!(matches!(decode_err(&err), DecodeError::DuplicateKey { .. }));
    let hello = map(&[
        ("type", text("hello")),
        ("protocol", uint(1)),
        (
            "limits",
            map(&[
                ("max_record", uint(1)),
                ("max_inflight", uint(1)),
                ("keepalive_ms", uint(1)),
                ("max_record", uint(2)),
            ]),
        ),
        ("manifest", vec![0xf6]),
    ]);
    assert!(matches!(
        decode_err(&hello),
        DecodeError::DuplicateKey { .. }
    ));
    // Integer keys: 1 twice.
    assert!(matches!(
        validate(&[0xa2, 0x01, 0xf6, 0x01, 0xf6]),
        Err(DecodeError::DuplicateKey { at: 3 })
    ));
}

// --- Non-minimal integers ---------------------------------------------------

#[test]
fn non_minimal_integers_and_lengths_are_rejected() {
    // budget_ms = 5 written with a one-byte argument.
    let frame = control_with("budget_ms", vec![0x18, 0x05]);
    assert!(matches!(
        decode_err(&frame),
        DecodeError::NonMinimalInteger { .. }
    ));
    // budget_ms = 500 written with a four-byte argument, then eight.
    for long in [
        vec![0x1a, 0x00, 0x00, 0x01, 0xf4],
        vec![0x1b, 0, 0, 0, 0, 0, 0, 0x01, 0xf4],
    ] {
        assert!(matches!(
            decode_err(&control_with("budget_ms", long)),
            DecodeError::NonMinimalInteger { .. }
        ));
    }
    // A text length: "say" with a one-byte length argument.
    let frame = control_with("verb", vec![0x78, 0x03, b's', b'a', b'y']);
    assert!(matches!(
        decode_err(&frame),
        DecodeError::NonMinimalInteger { .. }
    ));
    // The frame map's own count.
    let mut frame = map(&control_fields());
    frame.splice(0..1, [0xb8, 0x05]);
    assert_eq!(decode_err(&frame), DecodeError::NonMinimalInteger { at: 0 });
    // Negative integers and lengths inside args, 8-byte forms of small values.
    for item in [
        vec![0x38, 0x00],
        head8(ARRAY, 0),
        head8(BYTES, 0),
        head8(0, 0xffff_ffff),
    ] {
        assert_eq!(
            validate(&item),
            Err(DecodeError::NonMinimalInteger { at: 0 })
        );
    }
    // Floats too: 1.5 as an f64 (an f16 holds it exactly).
    let f = [&[0xfb][..], &1.5f64.to_bits().to_be_bytes()].concat();
    assert_eq!(validate(&f), Err(DecodeError::NonMinimalFloat { at: 0 }));
}

// --- Unknown fields ---------------------------------------------------------

#[test]
fn unknown_fields_are_rejected() {
    let unknown = |bytes: &[u8], name: &str| {
        assert_eq!(
            decode_err(bytes),
            DecodeError::UnknownField { name: name.into() }
        );
    };
    unknown(&control_with("priority", uint(1)), "priority");
    unknown(&control_with("Cap", text("app.echo")), "Cap");
    unknown(&control_with("cap ", text("app.echo")), "cap ");
    // A field of another frame kind.
    unknown(&control_with("reason", text("x")), "reason");
    unknown(
        &map(&[("type", text("keepalive")), ("cap", text("app.echo"))]),
        "cap",
    );
    // A result in a failed response, an error in a successful one.
    let body = map(&[("code", text("internal")), ("message", text(""))]);
    unknown(
        &map(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", vec![0xf4]),
            ("err", body.clone()),
            ("result", vec![0xf6]),
        ]),
        "result",
    );
    unknown(
        &map(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", vec![0xf5]),
            ("result", vec![0xf6]),
            ("err", body),
        ]),
        "err",
    );
    // Inside the error body and the limits.
    unknown(
        &map(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", vec![0xf4]),
            (
                "err",
                map(&[
                    ("code", text("internal")),
                    ("message", text("")),
                    ("trace", text("")),
                ]),
            ),
        ]),
        "trace",
    );
    unknown(
        &map(&[
            ("type", text("hello")),
            ("protocol", uint(1)),
            (
                "limits",
                map(&[
                    ("max_record", uint(1)),
                    ("max_inflight", uint(1)),
                    ("keepalive_ms", uint(1)),
                    ("max_args", uint(1)),
                ]),
            ),
            ("manifest", vec![0xf6]),
        ]),
        "max_args",
    );
    // Unknown frame types and close codes.
    assert_eq!(
        decode_err(&map(&[("type", text("ping"))])),
        DecodeError::UnknownName {
            field: "type",
            name: "ping".into()
        }
    );
    assert_eq!(
        decode_err(&map(&[
            ("type", text("close")),
            ("code", text("Normal")),
            ("reason", text(""))
        ])),
        DecodeError::UnknownName {
            field: "code",
            name: "Normal".into()
        }
    );
    // A non-text key at frame level.
    let mut frame = map(&control_fields());
    frame[0] += 1;
    frame.extend_from_slice(&[0x01, 0x01]);
    assert!(matches!(
        decode_err(&frame),
        DecodeError::WrongType { field: "frame", .. }
    ));
}

#[test]
fn missing_fields_are_rejected() {
    for name in ["type", "cap", "verb", "req_id", "args"] {
        let fields: Vec<_> = control_fields()
            .into_iter()
            .filter(|(k, _)| k != name)
            .collect();
        assert_eq!(
            decode_err(&map(&fields)),
            DecodeError::MissingField { field: name },
        );
    }
    let response = |fields: &[(&str, Vec<u8>)]| decode_err(&map(fields));
    assert_eq!(
        response(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("result", vec![0xf6])
        ]),
        DecodeError::MissingField { field: "ok" }
    );
    assert_eq!(
        response(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", vec![0xf5])
        ]),
        DecodeError::MissingField { field: "result" }
    );
    assert_eq!(
        response(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", vec![0xf4])
        ]),
        DecodeError::MissingField { field: "err" }
    );
    assert_eq!(
        decode_err(&map(&[
            ("type", text("hello")),
            ("protocol", uint(1)),
            ("manifest", vec![0xf6])
        ])),
        DecodeError::MissingField { field: "limits" }
    );
    assert_eq!(
        decode_err(&[0xa0]),
        DecodeError::MissingField { field: "type" }
    );
}

// --- Wrong types in cap / verb / req_id --------------------------------------

#[test]
fn wrong_types_in_the_header_are_rejected() {
    let not_text: [Vec<u8>; 8] = [
        uint(7),
        vec![0x20],
        [head(BYTES, 3), b"say".to_vec()].concat(),
        vec![0x80],
        vec![0xa0],
        vec![0xf6],
        vec![0xf5],
        vec![0xf9, 0x3c, 0x00],
    ];
    for field in ["cap", "verb", "req_id", "type"] {
        for value in &not_text {
            assert_eq!(
                decode_err(&control_with(field, value.clone())),
                DecodeError::WrongType {
                    field,
                    expected: "a text string"
                },
                "{field} = {value:02x?}"
            );
        }
    }
    for value in [text("5"), vec![0x20], vec![0xf6], vec![0xf9, 0x45, 0x00]] {
        assert_eq!(
            decode_err(&control_with("budget_ms", value)),
            DecodeError::WrongType {
                field: "budget_ms",
                expected: "an unsigned integer"
            }
        );
    }
    assert!(matches!(
        decode_err(&map(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", uint(1)),
            ("result", vec![0xf6])
        ])),
        DecodeError::WrongType { field: "ok", .. }
    ));
    // The record itself must be a map.
    for record in [vec![0x80], text("control"), vec![0xf6]] {
        assert!(matches!(
            decode_err(&record),
            DecodeError::WrongType { field: "frame", .. }
        ));
    }
    assert_eq!(
        decode_err(&map(&[
            ("type", text("hello")),
            ("protocol", uint(1 << 32)),
            ("limits", vec![0xa0]),
            ("manifest", vec![0xf6])
        ])),
        DecodeError::IntegerOutOfRange { field: "protocol" }
    );
}

// --- Empty, oversize and NUL strings ----------------------------------------

#[test]
fn odd_names_pass_the_codec_byte_for_byte() {
    // The codec does not judge names: the chokepoint answers them.
    for name in [
        "",
        "Disable",
        " bind",
        "bind ",
        "x/../y",
        "bi\0nd",
        "\0",
        "ｂｉｎｄ",
        "é",
    ] {
        for field in ["cap", "verb"] {
            let bytes = control_with(field, text(name));
            let c = control(&bytes);
            assert_eq!(if field == "cap" { c.cap } else { c.verb }, name);
        }
    }
    let longest = "n".repeat(MAX_NAME_LEN);
    assert_eq!(control(&control_with("verb", text(&longest))).verb, longest);
    // A name that is not a valid id cannot become an owned envelope.
    let bytes = control_with("verb", text("Disable"));
    assert!(matches!(
        control(&bytes).to_envelope(),
        Err(DecodeError::InvalidId(IdError::Malformed { .. }))
    ));
}

#[test]
fn oversize_strings_are_rejected() {
    let long = "n".repeat(MAX_NAME_LEN + 1);
    for field in ["cap", "verb"] {
        assert_eq!(
            decode_err(&control_with(field, text(&long))),
            DecodeError::StringTooLong {
                field,
                len: MAX_NAME_LEN + 1,
                max: MAX_NAME_LEN
            }
        );
    }
    let message = "m".repeat(MAX_MESSAGE_LEN + 1);
    let frame = map(&[
        ("type", text("response")),
        ("req_id", text("1")),
        ("ok", vec![0xf4]),
        (
            "err",
            map(&[("code", text("internal")), ("message", text(&message))]),
        ),
    ]);
    assert!(matches!(
        decode_err(&frame),
        DecodeError::StringTooLong {
            field: "message",
            ..
        }
    ));
    let reason = "r".repeat(capwire_envelope::MAX_REASON_LEN + 1);
    let frame = map(&[
        ("type", text("close")),
        ("code", text("normal")),
        ("reason", text(&reason)),
    ]);
    assert!(matches!(
        decode_err(&frame),
        DecodeError::StringTooLong {
            field: "reason",
            ..
        }
    ));
}

#[test]
fn invalid_utf8_is_rejected() {
    for field in ["cap", "verb", "req_id"] {
        assert!(matches!(
            decode_err(&control_with(field, text_bytes(b"ap\xffp"))),
            DecodeError::InvalidUtf8 { .. }
        ));
    }
    // In args, and as a key.
    assert!(matches!(
        decode_err(&control_with("args", text_bytes(b"\xc3\x28"))),
        DecodeError::InvalidUtf8 { .. }
    ));
    let mut frame = map(&control_fields());
    frame[0] += 1;
    frame.extend(text_bytes(b"\xe2\x82"));
    frame.push(0xf6);
    assert!(matches!(
        decode_err(&frame),
        DecodeError::InvalidUtf8 { .. }
    ));
}

// --- Invalid ids --------------------------------------------------------------

#[test]
fn invalid_request_ids_are_rejected() {
    let huge = "9".repeat(1 << 20);
    for (req_id, expected_too_long) in [
        ("a b", false),
        ("a\0b", false),
        ("\t", false),
        ("é", false),
        ("\u{7f}", false),
        (&"x".repeat(MAX_REQ_ID_LEN + 1), true),
        (huge.as_str(), true),
    ] {
        let e = decode_err(&control_with("req_id", text(req_id)));
        if expected_too_long {
            assert!(
                matches!(e, DecodeError::InvalidId(IdError::TooLong { .. })),
                "{e:?}"
            );
        } else {
            assert!(
                matches!(e, DecodeError::InvalidId(IdError::Malformed { .. })),
                "{req_id:?}: {e:?}"
            );
        }
    }
    // The longest id is fine; the empty one means fire-and-forget.
    let max = "x".repeat(MAX_REQ_ID_LEN);
    assert_eq!(
        control(&control_with("req_id", text(&max))).req_id.as_str(),
        max
    );
    assert!(
        control(&control_with("req_id", text("")))
            .req_id
            .is_fire_and_forget()
    );
    // ... but a response or a cancel needs one.
    for frame in [
        map(&[
            ("type", text("response")),
            ("req_id", text("")),
            ("ok", vec![0xf5]),
            ("result", vec![0xf6]),
        ]),
        map(&[("type", text("cancel")), ("req_id", text(""))]),
    ] {
        assert!(matches!(
            decode_err(&frame),
            DecodeError::InvalidId(IdError::Empty { .. })
        ));
    }
}

#[test]
fn invalid_error_codes_are_rejected() {
    let with_code = |code: Vec<u8>| {
        map(&[
            ("type", text("response")),
            ("req_id", text("1")),
            ("ok", vec![0xf4]),
            ("err", map(&[("code", code), ("message", text("m"))])),
        ])
    };
    for bad in ["", "Bad", "bad-code", "bad code", "x\0"] {
        assert!(
            matches!(decode_err(&with_code(text(bad))), DecodeError::InvalidId(_)),
            "{bad:?}"
        );
    }
    assert!(matches!(
        decode_err(&with_code(text(&"a".repeat(1000)))),
        DecodeError::InvalidId(IdError::TooLong { .. })
    ));
    assert!(matches!(
        decode_err(&with_code(uint(3))),
        DecodeError::WrongType { field: "code", .. }
    ));
    // Known and app codes decode to what they name.
    for (wire, code) in [
        ("timeout", ErrorCode::Timeout),
        ("out_of_stock", ErrorCode::app("out_of_stock").unwrap()),
    ] {
        let bytes = with_code(text(wire));
        let Ok(FrameRef::Response(r)) = decode_frame(&bytes) else {
            panic!("not a response")
        };
        assert_eq!(r.outcome.unwrap_err().code, code);
    }
}

// --- Other simple values --------------------------------------------------------

#[test]
fn undefined_and_other_simple_values_are_rejected() {
    for (item, value) in [(vec![0xf7], 23), (vec![0xf0], 16), (vec![0xf8, 0x20], 32)] {
        assert!(matches!(
            decode_err(&control_with("args", item)),
            DecodeError::SimpleValue { value: v, .. } if v == value
        ));
    }
}
