//! The adversarial harness's kit (the node under attack, the hostile
//! peers) and its attacks, one module per part of SECURITY.md.
#![allow(unreachable_pub)]

pub mod arena;
pub mod cap;
pub mod cbor;
pub mod forge;
pub mod wire;

pub mod audit;
pub mod bind;
pub mod bounds;
pub mod chokepoint;
pub mod faults;
pub mod frames;
pub mod handshake;
pub mod ledger;
pub mod linger;
pub mod records;
pub mod streams;
pub mod tasks;
pub mod trace;

use std::time::Duration;

use capwire::envelope::{CloseCode, ErrorCode, ResponseEnvelope};
use capwire::{Direction, HandshakeFailure, Node};

use crate::kit::wire::Wire;

/// How long a node may take to close a session it should close at once.
pub const PROMPT: Duration = Duration::from_secs(5);

/// The node closes `w` with a close frame of `code`, then ends the stream.
pub async fn closed_with(w: &mut Wire, code: CloseCode, what: &str) {
    assert_eq!(w.close_code(PROMPT).await, Some(code), "{what}: close code");
    assert!(w.until_end(PROMPT).await, "{what}: the stream ends");
}

/// The error code of a response (panics on success).
#[track_caller]
pub fn err_code(r: &ResponseEnvelope) -> ErrorCode {
    match &r.outcome {
        Err(e) => e.code.clone(),
        Ok(v) => panic!("expected an error response, got {v:?}"),
    }
}

/// The text result of a response (panics on an error).
#[track_caller]
pub fn ok_text(r: &ResponseEnvelope) -> String {
    match &r.outcome {
        Ok(v) => v.decode().unwrap(),
        Err(e) => panic!("expected success, got {e:?}"),
    }
}

/// Bytes the whole process allocated while `f` ran (every thread: a
/// bound, not a measure).
pub async fn allocated_during<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    let region = stats_alloc::Region::new(crate::GLOBAL);
    let out = f.await;
    (out, region.change().bytes_allocated)
}

/// The node's count of connections that failed for `reason`.
pub fn failures(node: &Node, direction: Direction, reason: HandshakeFailure) -> u64 {
    node.stats().handshake_failures(direction, reason)
}
