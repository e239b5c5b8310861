//! The replay ledger charges each remembered request its whole cost: what
//! `ledger_sizes().bytes` says it holds covers what the heap really grew
//! by. Measured with a counting global allocator; this file holds a single
//! test so that nothing else allocates while it measures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::alloc::System;

use capwire::Limits;
use common::{RawPeer, echo_node, raw};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[tokio::test(flavor = "current_thread")]
async fn the_ledger_charges_what_its_entries_really_cost() {
    let limits = Limits {
        replay_max_bytes: 1 << 30,
        replay_sender_max_bytes: 1 << 30,
        // The ledger's own cost is measured: the audit log (its entries in
        // memory) is off.
        audit: false,
        ..Limits::default()
    };
    let (server, _counters) = echo_node(limits).await;
    let mut peer = RawPeer::connect(&server).await;
    let text = "x".repeat(64);
    let mut send = async |from: u64, to: u64| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(500) {
            for n in chunk {
                peer.control("app.echo", "say", &format!("{n}"), &raw(&text))
                    .await;
            }
            for n in chunk {
                peer.response(&format!("{n}")).await;
            }
            peer.received.clear();
        }
    };
    // Warm up: buffers, tables and counters reach their steady sizes.
    send(0, 2_000).await;
    let before = server.ledger_sizes().bytes;
    let region = Region::new(GLOBAL);
    send(2_000, 22_000).await;
    let stats = region.change();
    let heap = stats.bytes_allocated as f64 - stats.bytes_deallocated as f64;
    let charged = (server.ledger_sizes().bytes - before) as f64;
    let per_entry_heap = heap / 20_000.0;
    let per_entry_charged = charged / 20_000.0;
    println!(
        "per answered 64 B request: heap {per_entry_heap:.0} B, charged {per_entry_charged:.0} B"
    );
    assert!(
        per_entry_charged >= 0.95 * per_entry_heap,
        "charged {per_entry_charged:.0} B per entry, the heap grew {per_entry_heap:.0} B"
    );
    assert!(
        per_entry_charged <= 2.0 * per_entry_heap,
        "charged {per_entry_charged:.0} B per entry, far above the heap's {per_entry_heap:.0} B"
    );
    assert_eq!(server.ledger_sizes().remembered, 22_000);
}
