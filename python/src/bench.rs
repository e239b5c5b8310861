//! The Rust side of the Python benchmarks (python/benches): a node whose
//! echo verb is served in Rust, and a loop of calls made in Rust, so that a
//! Python handler and a Python caller are measured against Rust in the
//! same run. Not an API.

use std::time::{Duration, Instant};

use capwire::envelope::{ErrorCode, RawValue};
use capwire::manifest::DeclaredClass;
use capwire::{Capability, HandlerError, Items, Meta, RawVerb, Sender};
use pyo3::prelude::*;

use crate::args::{node_id, value_error};
use crate::bridge::Bridge;
use crate::errors;
use crate::node::Node;

/// A node serving `app.bench/echo` (a request), `app.bench/sink` (a
/// notification) and `app.bench/flood` (a stream) in Rust.
#[pyfunction]
pub(crate) fn rust_echo_node<'py>(
    py: Python<'py>,
    bridge: Bridge,
    listen: String,
) -> PyResult<Bound<'py, PyAny>> {
    let addr: capwire::Addr = listen.parse().map_err(value_error)?;
    let on_loop = bridge.clone();
    bridge.spawn(py, async move {
        let cap = Capability::new("app.bench", "1.0.0")
            .map_err(errors::node)?
            .handle_raw(
                RawVerb::request("echo", DeclaredClass::Bootstrap),
                |args: RawValue, _: Sender, _: Meta| async move { Ok(args) },
            )
            .handle_raw(
                RawVerb::notification("sink", DeclaredClass::Bootstrap),
                |_: RawValue, _: Sender, _: Meta| async move { Ok(RawValue::null()) },
            )
            .handle_raw_stream(RawVerb::stream("flood", DeclaredClass::Bootstrap), flood);
        let node = capwire::Node::builder("bench-rust")
            .listen(addr)
            .capability(cap)
            .start()
            .await
            .map_err(errors::node)?;
        Ok(Node::from_rust(node, on_loop))
    })
}

/// `app.bench/flood`: `[n, size]` items of `size` bytes, as fast as the
/// caller's credit lets them go.
async fn flood(
    args: RawValue,
    mut items: Items<RawValue>,
    _: Sender,
    _: Meta,
) -> Result<(), HandlerError> {
    let (n, size): (u64, usize) = args
        .decode()
        .map_err(|e| HandlerError::new(ErrorCode::BadArgs, e.to_string()))?;
    let item = RawValue::encode(&ciborium::Value::Bytes(vec![7; size.min(1 << 20)]))
        .map_err(|e| HandlerError::new(ErrorCode::Internal, e.to_string()))?;
    for _ in 0..n {
        items.send(item.clone()).await?;
    }
    Ok(())
}

/// Makes `n` calls of `cap/verb` with `payload` (bytes) from `node` to
/// `peer`, one after another, in Rust; the seconds they took.
#[pyfunction]
pub(crate) fn rust_calls<'py>(
    py: Python<'py>,
    node: &Node,
    peer: &str,
    cap: String,
    verb: String,
    payload: Vec<u8>,
    n: u32,
) -> PyResult<Bound<'py, PyAny>> {
    let peer = node.inner().peer(node_id(peer)?);
    let args = RawValue::encode(&serde_bytes(payload)).map_err(value_error)?;
    node.bridge().spawn(py, async move {
        let start = Instant::now();
        for _ in 0..n {
            peer.call_raw(&cap, &verb, &args, Duration::from_secs(30))
                .await
                .map_err(errors::call)?;
        }
        Ok(start.elapsed().as_secs_f64())
    })
}

/// Bytes as a CBOR byte string.
fn serde_bytes(payload: Vec<u8>) -> ciborium::Value {
    ciborium::Value::Bytes(payload)
}
