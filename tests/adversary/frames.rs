//! Records that break the strict CBOR profile or the frame layout (WIRE.md
//! 2.1, 2.2): each ends its session with `protocol_error` and runs
//! nothing; names the decoder accepts go on to the chokepoint instead.

use capwire::envelope::{CloseCode, ErrorCode};

use crate::kit::arena::{Arena, Expect};
use crate::kit::cbor::{
    self, NULL, bytes, control, control_with, head, nested_arrays, nested_maps, text, text_bytes,
    tmap, uint,
};
use crate::kit::{allocated_during, closed_with, err_code, ok_text};

/// Sends `record` on a fresh session: the node must close it with
/// `protocol_error` and run nothing (the record is an `app.adv/echo`
/// request wherever it is one at all).
async fn breaks(a: &Arena, what: &str, record: &[u8]) {
    let mut w = a.wire().await;
    w.send_record(record).await;
    closed_with(&mut w, CloseCode::ProtocolError, what).await;
    assert_eq!(w.responses_to("r"), 0, "{what}: no answer");
}

/// An echo request with these args.
fn echo_args(args: Vec<u8>) -> Vec<u8> {
    control("app.adv", "echo", "r", args)
}

/// 100 000 levels of arrays or maps, in the args or as the whole record:
/// a clean `protocol_error`, no stack overflow. The profile's limit is
/// exact: 33 levels break the frame, 32 are a frame (whose args then do
/// not fit the verb: `bad_args`, and the session goes on).
pub async fn deep_nesting_100k_levels(a: Arena) -> Expect {
    for (what, record) in [
        ("100k arrays in args", echo_args(nested_arrays(100_000))),
        ("100k maps in args", echo_args(nested_maps(100_000))),
        ("100k arrays as the record", nested_arrays(100_000)),
        ("100k maps as the record", nested_maps(100_000)),
        ("33 levels in args", echo_args(nested_arrays(32))),
    ] {
        breaks(&a, what, &record).await;
    }
    let mut w = a.wire().await;
    w.send(&[&echo_args(nested_arrays(31))]).await;
    assert_eq!(err_code(&w.response("r").await), ErrorCode::BadArgs);
    Expect::nothing()
}

/// Length headers claiming 2^32 to 2^64 - 1 bytes, items or pairs, in the
/// args, in a name or for the frame map itself: refused at once (the
/// claim is checked against the bytes left), without a large allocation.
pub async fn length_claims_of_2_32_to_2_64(a: Arena) -> Expect {
    let ((), heap) = allocated_during(claims(&a)).await;
    assert!(
        heap < 1 << 30,
        "{heap} bytes allocated for claims of 2^32 and more: one became an allocation"
    );
    Expect::nothing()
}

async fn claims(a: &Arena) {
    let claims: Vec<(&str, Vec<u8>)> = vec![
        ("bytes, 2^64-1", [head(2, u64::MAX), vec![0]].concat()),
        ("text, 2^64-1", [head(3, u64::MAX), vec![0x61]].concat()),
        ("array, 2^32", [head(4, 1 << 32), vec![0]].concat()),
        ("map, 2^63", [head(5, 1 << 63), vec![0, 0]].concat()),
        (
            "array, 2^32-1",
            [head(4, u32::MAX.into()), vec![0]].concat(),
        ),
    ];
    for (what, item) in &claims {
        breaks(a, &format!("args: {what}"), &echo_args(item.clone())).await;
    }
    let in_cap = control_with(
        [head(3, u64::MAX), b"app.adv".to_vec()].concat(),
        text("echo"),
        text("r"),
        vec![NULL],
    );
    breaks(a, "a cap claiming 2^64-1 bytes", &in_cap).await;
    let mut whole = head(5, u64::MAX);
    whole.extend(&echo_args(vec![NULL])[1..]);
    breaks(a, "the frame map claiming 2^64-1 pairs", &whole).await;
}

/// Every rule of the strict profile broken once (WIRE.md 2.1), plus
/// unknown fields: trailing bytes, tags, indefinite lengths, duplicate
/// keys, non-minimal integers and lengths, reserved and simple values,
/// non-shortest floats, invalid UTF-8, and keys of the wrong type.
pub async fn strict_profile_violations(a: Arena) -> Expect {
    let keepalive = tmap(&[("type", text("keepalive"))]);
    let valid = echo_args(text("x"));
    let with_budget = |budget: Vec<u8>| {
        tmap(&[
            ("type", text("control")),
            ("cap", text("app.adv")),
            ("verb", text("echo")),
            ("req_id", text("r")),
            ("budget_ms", budget),
            ("args", text("x")),
        ])
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("trailing bytes", [valid.clone(), vec![NULL]].concat()),
        (
            "trailing bytes after a keepalive",
            [keepalive.clone(), vec![0]].concat(),
        ),
        (
            "a tag around the record",
            [vec![0xc0], valid.clone()].concat(),
        ),
        (
            "the self-described CBOR tag",
            [vec![0xd9, 0xd9, 0xf7], valid.clone()].concat(),
        ),
        ("a tag in args", echo_args(vec![0xc1, 0x00])),
        (
            "a big tag in args",
            echo_args(vec![0xdb, 0, 0, 0, 1, 0, 0, 0, 0, 0x00]),
        ),
        ("an indefinite map as the record", {
            let mut v = vec![0xbf];
            v.extend(&valid[1..]);
            v.push(0xff);
            v
        }),
        (
            "an indefinite array in args",
            echo_args(vec![0x9f, 0x01, 0xff]),
        ),
        (
            "an indefinite text in args",
            echo_args(vec![0x7f, 0x61, b'a', 0xff]),
        ),
        (
            "an indefinite byte string in args",
            echo_args(vec![0x5f, 0x41, 0, 0xff]),
        ),
        ("a break byte as args", echo_args(vec![0xff])),
        ("a duplicate key: type", {
            tmap(&[
                ("type", text("control")),
                ("type", text("control")),
                ("cap", text("app.adv")),
                ("verb", text("echo")),
                ("req_id", text("r")),
                ("args", text("x")),
            ])
        }),
        ("a duplicate key: req_id", {
            tmap(&[
                ("type", text("control")),
                ("cap", text("app.adv")),
                ("verb", text("echo")),
                ("req_id", text("r")),
                ("req_id", text("s")),
                ("args", text("x")),
            ])
        }),
        (
            "a duplicate key deep in args",
            echo_args(vec![0x81, 0xa2, 0x61, b'a', 0x00, 0x61, b'a', 0x01]),
        ),
        ("a non-minimal integer", with_budget(vec![0x18, 0x05])),
        (
            "a non-minimal 8-byte integer",
            with_budget(vec![0x1b, 0, 0, 0, 0, 0, 0, 0x05, 0xdc]),
        ),
        ("a non-minimal text length", {
            let mut v = vec![0xa5, 0x78, 4];
            v.extend(b"type");
            v.extend(text("control"));
            v.extend(&valid[14..]);
            v
        }),
        ("a non-minimal map count", {
            let mut v = vec![0xb8, 5];
            v.extend(&valid[1..]);
            v
        }),
        (
            "a non-minimal array count in args",
            echo_args(vec![0x98, 1, 0x00]),
        ),
        ("reserved additional information 28", echo_args(vec![0x1c])),
        ("reserved additional information 30", echo_args(vec![0x5e])),
        ("undefined", echo_args(vec![0xf7])),
        ("simple value 0", echo_args(vec![0xe0])),
        ("a two-byte simple value", echo_args(vec![0xf8, 0x20])),
        (
            "a single float that fits in half",
            echo_args(vec![0xfa, 0x3f, 0x80, 0, 0]),
        ),
        (
            "a double that fits in single",
            echo_args(vec![0xfb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]),
        ),
        (
            "a NaN not in its shortest form",
            echo_args(vec![0xfa, 0x7f, 0xc0, 0, 0]),
        ),
        (
            "invalid UTF-8 in the verb",
            control_with(
                text("app.adv"),
                vec![0x62, 0xc3, 0x28],
                text("r"),
                vec![NULL],
            ),
        ),
        ("invalid UTF-8 in args", echo_args(vec![0x62, 0xc3, 0x28])),
        (
            "a surrogate in args",
            echo_args(vec![0x63, 0xed, 0xa0, 0x80]),
        ),
        (
            "an array as a map key in args",
            echo_args(vec![0xa1, 0x80, 0x00]),
        ),
        (
            "a float as a map key in args",
            echo_args(vec![0xa1, 0xf9, 0x3c, 0x00, 0x00]),
        ),
        ("an unknown field", {
            tmap(&[
                ("type", text("control")),
                ("cap", text("app.adv")),
                ("verb", text("echo")),
                ("req_id", text("r")),
                ("args", text("x")),
                ("sender", bytes(&[0; 32])),
            ])
        }),
        (
            "an unknown field in a keepalive",
            tmap(&[("type", text("keepalive")), ("x", uint(1))]),
        ),
        ("a response's key in a control", {
            tmap(&[
                ("type", text("control")),
                ("cap", text("app.adv")),
                ("verb", text("echo")),
                ("req_id", text("r")),
                ("args", text("x")),
                ("ok", vec![0xf5]),
            ])
        }),
        ("an empty record", Vec::new()),
        ("not a map", text("control")),
        (
            "an integer key in the frame",
            cbor::map(&[(uint(0), text("control"))]),
        ),
    ];
    for (what, record) in cases {
        breaks(&a, what, &record).await;
    }
    Expect::nothing()
}

/// Wrong types and bad strings in the frame's fields break the frame;
/// names the decoder accepts (empty, NUL, 128 bytes) are answered by the
/// chokepoint and the session goes on; a 64-byte `req_id` and NUL bytes
/// inside args are just data.
pub async fn frame_field_types_and_strings(a: Arena) -> Expect {
    let s = |v: &str| text(v);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "cap as an integer",
            control_with(uint(7), s("echo"), s("r"), vec![NULL]),
        ),
        (
            "cap as bytes",
            control_with(bytes(b"app.adv"), s("echo"), s("r"), vec![NULL]),
        ),
        (
            "verb as null",
            control_with(s("app.adv"), vec![NULL], s("r"), vec![NULL]),
        ),
        (
            "verb as an array",
            control_with(s("app.adv"), vec![0x81, 0x00], s("r"), vec![NULL]),
        ),
        (
            "req_id as an integer",
            control_with(s("app.adv"), s("echo"), uint(1), vec![NULL]),
        ),
        (
            "req_id as a negative integer",
            control_with(s("app.adv"), s("echo"), vec![0x20], vec![NULL]),
        ),
        (
            "req_id as bytes",
            control_with(s("app.adv"), s("echo"), bytes(b"r"), vec![NULL]),
        ),
        (
            "req_id as a map",
            control_with(s("app.adv"), s("echo"), vec![0xa0], vec![NULL]),
        ),
        (
            "cap of 129 bytes",
            control(&"a".repeat(129), "echo", "r", vec![NULL]),
        ),
        (
            "verb of 129 bytes",
            control("app.adv", &"e".repeat(129), "r", vec![NULL]),
        ),
        (
            "req_id of 65 bytes",
            control("app.adv", "echo", &"r".repeat(65), vec![NULL]),
        ),
        (
            "req_id of 2^16 bytes",
            control("app.adv", "echo", &"r".repeat(65_536), vec![NULL]),
        ),
        (
            "req_id with a space",
            control("app.adv", "echo", "r 1", vec![NULL]),
        ),
        (
            "req_id with NUL",
            control("app.adv", "echo", "r\0", vec![NULL]),
        ),
        (
            "req_id with DEL",
            control("app.adv", "echo", "r\u{7f}", vec![NULL]),
        ),
        (
            "req_id with a tab",
            control("app.adv", "echo", "r\t", vec![NULL]),
        ),
        (
            "req_id not ASCII",
            control("app.adv", "echo", "r\u{e9}", vec![NULL]),
        ),
        ("budget_ms as text", {
            tmap(&[
                ("type", s("control")),
                ("cap", s("app.adv")),
                ("verb", s("echo")),
                ("req_id", s("r")),
                ("budget_ms", s("100")),
                ("args", s("x")),
            ])
        }),
        ("budget_ms negative", {
            tmap(&[
                ("type", s("control")),
                ("cap", s("app.adv")),
                ("verb", s("echo")),
                ("req_id", s("r")),
                ("budget_ms", vec![0x20]),
                ("args", s("x")),
            ])
        }),
        (
            "no args",
            tmap(&[
                ("type", s("control")),
                ("cap", s("app.adv")),
                ("verb", s("echo")),
                ("req_id", s("r")),
            ]),
        ),
        (
            "no type",
            tmap(&[
                ("cap", s("app.adv")),
                ("verb", s("echo")),
                ("req_id", s("r")),
                ("args", s("x")),
            ]),
        ),
        ("an unknown type", {
            let mut v = control("app.adv", "echo", "r", s("x"));
            v[7] = b'C';
            v
        }),
        ("type as an integer", tmap(&[("type", uint(1))])),
        (
            "a close with an unknown code",
            tmap(&[("type", s("close")), ("code", s("bye")), ("reason", s(""))]),
        ),
        ("a response with an empty req_id", {
            tmap(&[
                ("type", s("response")),
                ("req_id", s("")),
                ("ok", vec![0xf5]),
                ("result", vec![NULL]),
            ])
        }),
        (
            "a cancel with an empty req_id",
            tmap(&[("type", s("cancel")), ("req_id", s(""))]),
        ),
        (
            "a text with bytes claimed as text",
            control_with(text_bytes(&[0xff, 0xfe]), s("echo"), s("r"), vec![NULL]),
        ),
    ];
    for (what, record) in cases {
        breaks(&a, what, &record).await;
    }

    // Names the decoder accepts go to the chokepoint, on one session.
    let mut w = a.wire().await;
    let names = [
        ("", "echo"),
        ("app.adv", ""),
        ("", ""),
        ("app.adv\0", "echo"),
        ("app.adv", "echo\0"),
        ("\0", "\0"),
    ];
    let long_cap = "a".repeat(128);
    let long_verb = "e".repeat(128);
    let mut all: Vec<(&str, &str)> = names.to_vec();
    all.push((&long_cap, "echo"));
    all.push(("app.adv", &long_verb));
    for (i, (cap, verb)) in all.iter().enumerate() {
        let id = format!("n{i}");
        w.send(&[&control(cap, verb, &id, s("x"))]).await;
        assert_eq!(
            err_code(&w.response(&id).await),
            ErrorCode::UnknownVerb,
            "{cap:?}/{verb:?}"
        );
    }
    let long_id = "~".repeat(64);
    w.send(&[&control("app.adv", "echo", &long_id, s("a\0b"))])
        .await;
    assert_eq!(ok_text(&w.response(&long_id).await), "echo: a\0b");
    w.send(&[&control("app.adv", "echo", "empty", s(""))]).await;
    assert_eq!(ok_text(&w.response("empty").await), "echo: ");
    for (i, budget) in [u64::MAX, 1 << 63, u64::from(u32::MAX) + 1]
        .into_iter()
        .enumerate()
    {
        let id = format!("budget{i}");
        let frame = tmap(&[
            ("type", s("control")),
            ("cap", s("app.adv")),
            ("verb", s("echo")),
            ("req_id", s(&id)),
            ("budget_ms", uint(budget)),
            ("args", s("late")),
        ]);
        w.send(&[&frame]).await;
        assert_eq!(
            ok_text(&w.response(&id).await),
            "echo: late",
            "budget {budget}"
        );
    }
    assert!(!w.ended);
    Expect::runs(5)
}
