//! The handshake responder on arbitrary bytes as Noise messages 1 and 3,
//! raw or as tampered real messages: never a panic, only peer-fault errors
//! that release nothing, and a session only for the real initiator's
//! message 3.
//!
//! The body is shared with the property-test twin in
//! `transport/tests/handshake_responder_twin.rs`, which CI runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../transport/tests/support/handshake_responder.rs"]
mod handshake_responder;

fuzz_target!(|data: &[u8]| handshake_responder::check(data));
