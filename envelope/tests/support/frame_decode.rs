//! The body of the `frame_decode` fuzz target, shared with its property-test
//! twin (`tests/frame_decode_twin.rs`): whatever the bytes, decoding never
//! panics, and a frame that decodes encodes again to bytes that decode to the
//! same frame. The whole input is also tried as one raw item: it is a
//! `RawValue` exactly when it passes `validate`, and a valid item
//! transcodes to itself.

use capwire_envelope::{FrameRef, RawValue, decode_frame, validate};

/// Checks one input. Panics only when a property is broken.
pub(crate) fn check(data: &[u8]) {
    let valid = validate(data).is_ok();
    match RawValue::from_slice(data) {
        Ok(value) => {
            assert!(valid, "from_slice accepted what validate refuses");
            assert_eq!(value.as_bytes(), data, "from_slice changed the bytes");
            let again = value.decode::<RawValue>().expect("a valid item transcodes");
            assert_eq!(again, value, "transcoding changed a valid item");
        }
        Err(_) => assert!(!valid, "from_slice refused what validate accepts"),
    }
    let Ok(frame) = decode_frame(data) else {
        return;
    };
    let mut again = Vec::new();
    frame
        .encode(&mut again)
        .expect("a decoded frame encodes again");
    let back = decode_frame(&again).expect("a re-encoded frame decodes");
    assert_eq!(back, frame, "decode(encode(frame)) differs from frame");

    // Raw items are valid on their own, and ciborium reads every one of them.
    let raw: &[&[u8]] = match &frame {
        FrameRef::Hello(h) => &[h.manifest],
        FrameRef::Control(c) => {
            let _ = c.to_envelope();
            &[c.args]
        }
        FrameRef::Response(r) => match &r.outcome {
            Ok(result) => &[result],
            Err(body) => match &body.detail {
                Some(detail) => &[detail.as_bytes()],
                None => &[],
            },
        },
        FrameRef::Item(i) => &[i.item],
        _ => &[],
    };
    for item in raw {
        let value = RawValue::from_slice(item).expect("a raw item is valid");
        value
            .decode::<RawValue>()
            .expect("a valid item deserializes");
    }
    let _ = frame.to_frame();
}
