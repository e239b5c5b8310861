//! Frame decoding on arbitrary bytes: never a panic, and whatever decodes
//! encodes again to bytes that decode to the same frame.
//!
//! The body is shared with the property-test twin in
//! `envelope/tests/frame_decode_twin.rs`, which CI runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../envelope/tests/support/frame_decode.rs"]
mod frame_decode;

fuzz_target!(|data: &[u8]| frame_decode::check(data));
