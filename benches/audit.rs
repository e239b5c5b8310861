//! The audit log's cost (WIRE.md 5.6). Every figure is printed beside its
//! baseline, measured in the same run and interleaved with it, with the
//! ratio and the target:
//!
//! - `rtt`: a 64 B request (`app.bench/echo`) to a node whose audit log is
//!   on (in a state directory on disk, as a real node keeps it) against the
//!   same node with its log off: round trip p50 and p99, one call at a time,
//!   the two nodes in turn, in rounds (target: at most 1.05x);
//! - `pipelined`: requests/s with 128 in flight, log on against off, best
//!   of the runs (target: at least 0.9x);
//! - `tree`: a node whose log holds 10^6 entries (filled by pipelined
//!   calls): a `core.audit/checkpoint` after one more entry (write, sync,
//!   sign), an inclusion proof and a consistency proof, each as a round
//!   trip from the control plane, beside a plain round trip to the same
//!   node; and the log's bytes on disk per entry.
//!
//! The wire figures run in two placements: `shared` (both ends on one
//! 2-worker runtime) and `split` (each end on a single-threaded runtime of
//! its own thread, as two processes would be).
//!
//! `cargo bench --bench audit` runs everything (about a minute);
//! `--quick` or `CAPWIRE_BENCH_QUICK=1` runs small counts (seconds).
//! `CAPWIRE_BENCH_ONLY=rtt,pipelined,tree` picks sections,
//! `CAPWIRE_BENCH_PLACEMENT=shared,split` placements, `CAPWIRE_BENCH_N`
//! the calls per run, `CAPWIRE_BENCH_ENTRIES` the entries of `tree`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use capwire::manifest::{AuditCheckpoint, AuditProve, NoArgs, ProtocolVersions, ProveArgs, verb};
use capwire::{Capability, HandlerError, Limits, Node, Peer};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

#[path = "support/runtimes.rs"]
mod runtimes;
use runtimes::{Placement, run_on};
#[path = "support/figures.rs"]
mod figures;
use figures::{median, verdict};
#[path = "support/opts.rs"]
mod opts;
use opts::{Opts, wanted};

verb! { /** Echo. */
pub struct Echo: request "app.bench" / "echo", Bootstrap, String => String; }

const WINDOW: usize = 128;

async fn echo(s: String) -> Result<String, HandlerError> {
    Ok(s)
}

/// A node serving `app.bench/echo` with `limits` (room for the window
/// in flight), its state in `dir`.
async fn server(dir: &std::path::Path, limits: Limits) -> Node {
    let cap = Capability::new("app.bench", "1.0.0")
        .unwrap()
        .handle(Echo, echo);
    Node::builder("bench-server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(cap)
        .limits(Limits {
            max_inflight_per_session: 1024,
            ..limits
        })
        .state_dir(dir)
        .start()
        .await
        .unwrap()
}

/// The default limits, the audit log on or off.
fn audit(on: bool) -> Limits {
    Limits {
        audit: on,
        ..Limits::default()
    }
}

async fn client_of(server: &Node) -> (Node, Peer) {
    let client = Node::builder("bench-client").start().await.unwrap();
    let addr = server.local_addrs()[0].clone();
    let peer = client.connect(&addr, Some(server.id())).await.unwrap();
    (client, peer)
}

/// `n` calls one at a time: each one's time, in microseconds.
async fn one_at_a_time(peer: Peer, n: u64) -> Vec<f64> {
    let payload = "x".repeat(64);
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        peer.request(Echo, payload.clone()).await.unwrap();
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// `n` calls with `WINDOW` in flight: calls per second.
async fn pipelined(peer: Peer, n: u64) -> f64 {
    let payload = "x".repeat(64);
    let t = Instant::now();
    let mut inflight = FuturesUnordered::new();
    let mut sent = 0;
    while sent < n || !inflight.is_empty() {
        while sent < n && inflight.len() < WINDOW {
            let (peer, p) = (peer.clone(), payload.clone());
            inflight.push(async move { peer.request(Echo, p).await.unwrap() });
            sent += 1;
        }
        inflight.next().await;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn wire(opts: &Opts, placement: &Placement, sections: &Option<Vec<String>>) {
    let dir = tempfile::tempdir().unwrap();
    let (on_dir, off_dir) = (dir.path().join("on"), dir.path().join("off"));
    let (s, c) = (placement.server.clone(), placement.client.clone());
    let on = run_on(&s, async move { server(&on_dir, audit(true)).await });
    let off = run_on(&s, async move { server(&off_dir, audit(false)).await });
    let (on_node, off_node) = (on.clone(), off.clone());
    let (con, pon) = run_on(&c, async move { client_of(&on_node).await });
    let (coff, poff) = run_on(&c, async move { client_of(&off_node).await });
    let n = opts.count(2_000, 200);
    let rounds = if opts.quick { 2 } else { 10 };
    if wanted(sections, "rtt") {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            a.extend(run_on(&c, one_at_a_time(pon.clone(), n)));
            b.extend(run_on(&c, one_at_a_time(poff.clone(), n)));
        }
        let (ma, mb) = (median(a.clone()), median(b.clone()));
        let ratio = ma / mb;
        println!(
            "rtt {:<6} 64 B round trip p50: on {ma:.1} µs, off {mb:.1} µs: {ratio:.3}x (target <= 1.05x) {}; p99: on {:.1}, off {:.1} µs",
            placement.name,
            verdict(ratio <= 1.05),
            p99(a),
            p99(b)
        );
    }
    if wanted(sections, "pipelined") {
        let n = opts.count(100_000, 10_000);
        let (mut best_on, mut best_off) = (0f64, 0f64);
        for _ in 0..opts.runs {
            best_on = best_on.max(run_on(&c, pipelined(pon.clone(), n)));
            best_off = best_off.max(run_on(&c, pipelined(poff.clone(), n)));
        }
        let ratio = best_on / best_off;
        println!(
            "pipelined {:<6} {WINDOW} in flight: on {:.0}k/s, off {:.0}k/s: {ratio:.3}x (target >= 0.9x) {}",
            placement.name,
            best_on / 1e3,
            best_off / 1e3,
            verdict(ratio >= 0.9)
        );
    }
    let stats = on.audit_stats();
    println!(
        "  the log on: {} entries, {} bytes ({:.0} B/entry)",
        stats.entries,
        stats.bytes,
        stats.bytes as f64 / stats.entries.max(1) as f64
    );
    run_on(&c, async move {
        con.shutdown().await;
        coff.shutdown().await;
    });
    run_on(&s, async move {
        on.shutdown().await;
        off.shutdown().await;
    });
}

fn tree(opts: &Opts) {
    let placement = Placement::shared(false);
    let entries: u64 = std::env::var("CAPWIRE_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if opts.quick { 20_000 } else { 1_000_000 });
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let h = placement.server.clone();
    let node = run_on(&h, async move {
        let limits = Limits {
            audit_max_bytes: 4 << 30,
            ..audit(true)
        };
        server(&state, limits).await
    });
    // The control plane binds it.
    let n2 = node.clone();
    let (cp, peer) = run_on(&h, async move {
        let cp = Node::builder("bench-cp").start().await.unwrap();
        let invite = n2.invite(Some(cp.id())).unwrap();
        let peer = cp.connect_invite(&invite).await.unwrap().0;
        (cp, peer)
    });
    let t = Instant::now();
    let filled = node.audit_stats().entries;
    let _ = run_on(&h, pipelined(peer.clone(), entries.saturating_sub(filled)));
    let stats = node.audit_stats();
    println!(
        "tree: filled to {} entries in {:.1} s; {:.1} bytes on disk per entry",
        stats.entries,
        t.elapsed().as_secs_f64(),
        stats.bytes as f64 / stats.entries as f64
    );
    let k = if opts.quick { 20 } else { 200 };
    let (mut cps, mut incl, mut cons, mut plain) = (vec![], vec![], vec![], vec![]);
    for i in 0..k {
        let p = peer.clone();
        let (a, b, c, d) = run_on(&h, async move {
            // One more entry, then a checkpoint: write, sync, sign.
            p.request(ProtocolVersions, NoArgs {}).await.unwrap();
            let t = Instant::now();
            let r = p.request(AuditCheckpoint, NoArgs {}).await.unwrap();
            let a = t.elapsed();
            let t = Instant::now();
            p.request(
                AuditProve,
                ProveArgs {
                    size: r.size,
                    index: Some((r.size / k as u64) * (i as u64 % k as u64)),
                    from: None,
                },
            )
            .await
            .unwrap();
            let b = t.elapsed();
            let t = Instant::now();
            p.request(
                AuditProve,
                ProveArgs {
                    size: r.size,
                    index: None,
                    from: Some(r.size / 2 + 1 + i as u64),
                },
            )
            .await
            .unwrap();
            let c = t.elapsed();
            let t = Instant::now();
            p.request(ProtocolVersions, NoArgs {}).await.unwrap();
            (a, b, c, t.elapsed())
        });
        cps.push(a.as_secs_f64() * 1e6);
        incl.push(b.as_secs_f64() * 1e6);
        cons.push(c.as_secs_f64() * 1e6);
        plain.push(d.as_secs_f64() * 1e6);
    }
    let base = median(plain);
    for (what, v) in [
        ("checkpoint (write, sync, sign)", cps),
        ("inclusion proof", incl),
        ("consistency proof", cons),
    ] {
        let m = median(v);
        println!(
            "tree: {what} at {} entries: p50 {m:.0} µs round trip ({:.1}x a plain call's {base:.0} µs)",
            stats.entries,
            m / base
        );
    }
    run_on(&h, async move {
        cp.shutdown().await;
        node.shutdown().await;
    });
    drop(placement);
}

fn main() {
    let opts = Opts::from_env();
    let sections = opts.sections.clone();
    let placements = opts.placements.clone();
    for name in ["shared", "split"] {
        if !wanted(&placements, name) {
            continue;
        }
        if wanted(&sections, "rtt") || wanted(&sections, "pipelined") {
            let p = if name == "shared" {
                Placement::shared(false)
            } else {
                Placement::split()
            };
            wire(&opts, &p, &sections);
        }
    }
    if wanted(&sections, "tree") {
        tree(&opts);
    }
}
