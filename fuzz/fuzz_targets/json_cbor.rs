//! The CLI's JSON-to-CBOR mapping (`capwire::json`) on arbitrary bytes,
//! read as JSON text and as a strict CBOR item: `json_to_cbor` gives a
//! strict item or a typed error, never a panic, and every item maps to
//! JSON and back (also through printed text) to the same bytes.
//!
//! The body is shared with the property-test twin in
//! `tests/json_cbor_twin.rs`, which CI runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/support/json_cbor.rs"]
mod json_cbor;

fuzz_target!(|data: &[u8]| json_cbor::check(data));
