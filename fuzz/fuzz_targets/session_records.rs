//! Decode + dispatch on the session core: a hostile peer's records, fed to
//! one session (chokepoint, ledger, bounds, jobs, answers), of protocol 1
//! or 2: on a version-2 session the peer's streams that we serve and our
//! own streams, with `item` and `credit` frames from the input. Never a
//! panic, and the core keeps its promises, credit included (see
//! `capwire::fuzzing`).
//!
//! The body is shared with its property-test twin in `src/fuzzing.rs`,
//! which CI runs with the unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| capwire::fuzzing::session_records(data));
