//! Inputs the fuzz targets found, decoded byte for byte, so that they stay
//! fixed. Each test names the target and what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/frame_decode.rs"]
mod frame_decode;

use capwire_envelope::{DecodeError, RawValue, validate};

/// `frame_decode`: an array holding the half-precision signaling NaN
/// `f9 fdf9` passed the profile, but transcoding it wrote the quiet NaN
/// `f9 fff9`, so a valid item did not map to itself.
#[test]
fn frame_decode_half_signaling_nan_is_refused() {
    let crash: &[u8] = &[
        0x8f, 0xa0, 0xa0, 0xf9, 0xf9, 0xf9, 0xf9, 0xf9, 0xf9, 0xf9, 0xfd, 0xf9, 0xf9, 0xf9, 0xf9,
        0xf9, 0xf9, 0xf9, 0xa0, 0x2d, 0x2d, 0x2d, 0x00, 0xf9, 0x28, 0xf9, 0xa0, 0x2d,
    ];
    assert_eq!(validate(crash), Err(DecodeError::NonMinimalFloat { at: 9 }));
    assert!(RawValue::from_slice(crash).is_err());
    frame_decode::check(crash);
}

/// The same for single precision, and the quiet NaNs next to them, which
/// stay valid and transcode to themselves.
#[test]
fn frame_decode_nans_transcode_to_themselves_or_are_refused() {
    for bad in [&[0xf9, 0x7c, 0x01][..], &[0xfa, 0x7f, 0x80, 0x00, 0x01]] {
        assert!(RawValue::from_slice(bad).is_err(), "{bad:02x?}");
        frame_decode::check(bad);
    }
    for ok in [
        &[0xf9, 0x7e, 0x00][..],
        &[0xf9, 0xff, 0xf9],
        &[0xfa, 0x7f, 0xc0, 0x00, 0x01],
        &[0xfb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 1],
    ] {
        let value = RawValue::from_slice(ok).unwrap();
        assert_eq!(value.decode::<RawValue>().unwrap(), value, "{ok:02x?}");
        frame_decode::check(ok);
    }
}
