//! Round trips: every frame kind (`item` and `credit` included) with
//! arbitrary contents, arbitrary names through the fast encoder, and
//! arbitrary values through the strict serde helpers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;

use capwire_envelope::{
    Cancel, CapId, Close, CloseCode, ControlEnvelope, Credit, ErrorBody, ErrorCode, Frame,
    FrameRef, Hello, Limits, MAX_NAME_LEN, RawValue, ReqId, ResponseEnvelope, StreamItem, Verb,
    decode_frame, encode_control, encode_frame, from_slice, to_vec,
};
use ciborium::Value;
use proptest::prelude::*;

fn cap() -> impl Strategy<Value = CapId> {
    "(core|app)(\\.[a-z][a-z0-9_]{0,8}){1,3}".prop_map(|s| CapId::try_from(s.as_str()).unwrap())
}

fn verb() -> impl Strategy<Value = Verb> {
    "[a-z][a-z0-9_]{0,20}".prop_map(|s| Verb::try_from(s.as_str()).unwrap())
}

fn req_id() -> impl Strategy<Value = ReqId> {
    "[!-~]{0,64}".prop_map(|s| ReqId::try_from(s.as_str()).unwrap())
}

fn nonempty_req_id() -> impl Strategy<Value = ReqId> {
    "[!-~]{1,64}".prop_map(|s| ReqId::try_from(s.as_str()).unwrap())
}

/// Any value the strict profile can hold (floats other than NaN, so that
/// values compare equal to themselves).
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Integer(n.into())),
        any::<u64>().prop_map(|n| Value::Integer(n.into())),
        any::<f64>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(Value::Float),
        any::<f32>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(|f| Value::Float(f.into())),
        ".{0,12}".prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,6}", inner.clone(), 0..6).prop_map(|m| {
                Value::Map(m.into_iter().map(|(k, v)| (Value::Text(k), v)).collect())
            }),
            proptest::collection::btree_map(any::<i64>(), inner, 0..6).prop_map(|m| {
                Value::Map(
                    m.into_iter()
                        .map(|(k, v)| (Value::Integer(k.into()), v))
                        .collect(),
                )
            }),
        ]
    })
}

fn raw() -> impl Strategy<Value = RawValue> {
    value().prop_map(|v| RawValue::encode(&v).unwrap())
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        proptest::sample::select(ErrorCode::BUILT_IN.to_vec()),
        "[a-z][a-z0-9_]{0,20}".prop_filter_map("built-in", |s| ErrorCode::app(&s).ok()),
    ]
}

fn error_body() -> impl Strategy<Value = ErrorBody> {
    (error_code(), ".{0,40}", proptest::option::of(raw())).prop_map(|(code, message, detail)| {
        ErrorBody {
            code,
            message,
            detail,
        }
    })
}

fn frame() -> impl Strategy<Value = Frame> {
    let limits = (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(a, b, c)| Limits {
        max_record: a,
        max_inflight: b,
        keepalive_ms: c,
    });
    prop_oneof![
        (any::<u32>(), raw(), limits).prop_map(|(protocol, manifest, limits)| {
            Frame::Hello(Hello {
                protocol,
                manifest,
                limits,
            })
        }),
        (
            cap(),
            verb(),
            req_id(),
            proptest::option::of(any::<u64>()),
            raw()
        )
            .prop_map(|(cap, verb, req_id, budget_ms, args)| {
                Frame::Control(ControlEnvelope {
                    cap,
                    verb,
                    req_id,
                    budget_ms,
                    args,
                })
            }),
        (nonempty_req_id(), raw()).prop_map(|(id, r)| Frame::Response(ResponseEnvelope::ok(id, r))),
        (nonempty_req_id(), error_body())
            .prop_map(|(id, e)| Frame::Response(ResponseEnvelope::err(id, e))),
        nonempty_req_id().prop_map(|req_id| Frame::Cancel(Cancel { req_id })),
        (proptest::sample::select(CloseCode::ALL.to_vec()), ".{0,60}")
            .prop_map(|(code, reason)| Frame::Close(Close { code, reason })),
        Just(Frame::Keepalive),
        (nonempty_req_id(), raw())
            .prop_map(|(req_id, item)| Frame::Item(StreamItem { req_id, item })),
        (nonempty_req_id(), any::<u32>(), any::<u32>()).prop_map(|(req_id, items, bytes)| {
            Frame::Credit(Credit {
                req_id,
                items,
                bytes,
            })
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_frame_round_trips(frame in frame()) {
        let mut bytes = Vec::new();
        encode_frame(&frame, &mut bytes).unwrap();
        let decoded = decode_frame(&bytes).unwrap();
        prop_assert_eq!(decoded.kind(), frame.kind());
        prop_assert_eq!(decoded.to_frame().unwrap(), frame);
        // Encoding is deterministic: the decoded frame encodes to the same bytes.
        let mut again = Vec::new();
        decoded.encode(&mut again).unwrap();
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn any_name_passes_the_codec_unchanged(
        cap in "\\PC{0,40}|[\\x00-\\x7f]{0,128}",
        verb in "\\PC{0,40}|[\\x00-\\x7f]{0,128}",
        id in req_id(),
        args in raw(),
    ) {
        prop_assume!(cap.len() <= MAX_NAME_LEN && verb.len() <= MAX_NAME_LEN);
        let mut bytes = Vec::new();
        encode_control(&mut bytes, &cap, &verb, &id, None, args.as_bytes()).unwrap();
        let Ok(FrameRef::Control(c)) = decode_frame(&bytes) else {
            panic!("not a control frame")
        };
        prop_assert_eq!(c.cap, cap.as_str());
        prop_assert_eq!(c.verb, verb.as_str());
        prop_assert_eq!(c.req_id, id);
        prop_assert_eq!(c.args, args.as_bytes());
    }

    #[test]
    fn values_round_trip_through_the_strict_helpers(v in value()) {
        let bytes = to_vec(&v).unwrap();
        let back: Value = from_slice(&bytes).unwrap();
        prop_assert_eq!(&back, &v);
        prop_assert_eq!(to_vec(&back).unwrap(), bytes);
        let raw = RawValue::from_slice(&to_vec(&v).unwrap()).unwrap();
        prop_assert_eq!(raw.decode::<Value>().unwrap(), v);
    }

    #[test]
    fn typed_args_round_trip(
        name in ".{0,20}",
        tags in proptest::collection::btree_map("[a-z]{1,4}", any::<i32>(), 0..20),
        ratio in any::<f32>().prop_filter("NaN", |f| !f.is_nan()),
    ) {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Args {
            name: String,
            tags: BTreeMap<String, i32>,
            ratio: f32,
            nothing: Option<u8>,
        }
        let args = Args { name, tags, ratio, nothing: None };
        let raw = RawValue::encode(&args).unwrap();
        prop_assert_eq!(raw.decode::<Args>().unwrap(), args);
    }
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Frame>();
    check::<FrameRef<'static>>();
    check::<RawValue>();
    check::<ErrorBody>();
    check::<capwire_envelope::DecodeError>();
    check::<capwire_envelope::EncodeError>();
}
