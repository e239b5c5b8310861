//! Heap allocations per call in steady state, both ends counted: a
//! sequential 64 B request/response and a 64 B notification between two
//! nodes over loopback TCP. Measured with a counting global allocator;
//! this file holds a single test so that nothing else allocates while it
//! measures.
//!
//! The bounds are what the call path needs today with some room; a change
//! that adds an allocation per call (a boxed future, a copied buffer, a
//! map entry) shows up here before it shows up in a benchmark.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use capwire::manifest::verb;
use capwire::{Addr, Capability, HandlerError, Node, State};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

verb! { /** Echo. */ pub struct Echo: request "app.alloc" / "echo", Bootstrap, String => String; }
verb! { /** A 64 B note. */ pub struct Note: notification "app.alloc" / "note", Bootstrap, String; }

async fn echo(args: String) -> Result<String, HandlerError> {
    Ok(args)
}

async fn note(_text: String, State(seen): State<Arc<AtomicU64>>) -> Result<(), HandlerError> {
    seen.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Allocations per request/response round trip (both nodes, the caller's
/// args and the handler's result included), over this many calls.
const MAX_ALLOCS_PER_CALL: f64 = 10.0;
/// Allocations per notification (both nodes, the caller's args included).
const MAX_ALLOCS_PER_NOTE: f64 = 5.0;
const CALLS: u64 = 10_000;

#[tokio::test(flavor = "current_thread")]
async fn a_call_and_a_note_allocate_a_bounded_few_times_in_steady_state() {
    let seen = Arc::new(AtomicU64::new(0));
    let server = Node::builder("alloc-server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(
            Capability::new("app.alloc", "1.0.0")
                .unwrap()
                .handle(Echo, echo)
                .handle(Note, note),
        )
        .state(seen.clone())
        .start()
        .await
        .unwrap();
    let client = Node::builder("alloc-client").start().await.unwrap();
    let addr: Addr = server.local_addrs()[0].clone();
    let peer = client.connect(&addr, Some(server.id())).await.unwrap();
    let payload = "x".repeat(64);

    // Warm up: buffers, tables and counters reach their steady sizes.
    for _ in 0..2_000 {
        peer.request(Echo, payload.clone()).await.unwrap();
    }
    let region = Region::new(GLOBAL);
    for _ in 0..CALLS {
        let out = peer.request(Echo, payload.clone()).await.unwrap();
        assert_eq!(out.len(), 64);
    }
    let calls = region.change();
    let per_call = calls.allocations as f64 / CALLS as f64;
    let bytes_per_call = calls.bytes_allocated as f64 / CALLS as f64;

    for _ in 0..2_000 {
        peer.notify(Note, payload.clone()).await.unwrap();
    }
    wait_for(&seen, 2_000).await;
    let region = Region::new(GLOBAL);
    for _ in 0..CALLS {
        peer.notify(Note, payload.clone()).await.unwrap();
    }
    wait_for(&seen, 2_000 + CALLS).await;
    let notes = region.change();
    let per_note = notes.allocations as f64 / CALLS as f64;

    println!(
        "per 64 B round trip: {per_call:.2} allocations, {bytes_per_call:.0} B; \
         per 64 B notification: {per_note:.2} allocations, {:.0} B",
        notes.bytes_allocated as f64 / CALLS as f64
    );
    assert!(
        per_call <= MAX_ALLOCS_PER_CALL,
        "{per_call:.2} allocations per round trip (bound {MAX_ALLOCS_PER_CALL})"
    );
    assert!(
        per_note <= MAX_ALLOCS_PER_NOTE,
        "{per_note:.2} allocations per notification (bound {MAX_ALLOCS_PER_NOTE})"
    );
    client.shutdown().await;
    server.shutdown().await;
}

async fn wait_for(seen: &AtomicU64, n: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while seen.load(Ordering::SeqCst) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} notes arrived",
            seen.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}
