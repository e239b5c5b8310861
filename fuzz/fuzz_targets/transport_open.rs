//! Transport decryption after a real handshake: arbitrary, replayed,
//! tampered, cut and joined messages and length prefixes, message by
//! message (`Opener::open`) or as a stream (`RecordDecoder`). Never a
//! panic, only peer-fault errors, and never plaintext the sender did not
//! seal at that point of the stream.
//!
//! The body is shared with the property-test twin in
//! `transport/tests/transport_open_twin.rs`, which CI runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../transport/tests/support/transport_open.rs"]
mod transport_open;

fuzz_target!(|data: &[u8]| transport_open::check(data));
