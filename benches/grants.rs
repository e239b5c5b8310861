//! Grant (delegated rights) benchmarks. Every figure is printed beside its
//! baseline, measured in the same run and interleaved with it (so that
//! background load hits all alike), with ratios and the target:
//!
//! - `call`: a controller verb (`app.bench/guarded`, an echo of 64 B) called
//!   by a worker node that presented a token granting it, against the same
//!   call from the node's bound control plane (the target: within 5%), and
//!   against the worker calling a bootstrap echo (`app.bench/open`, the same
//!   handler), which costs what any call from a node that is not the
//!   control plane costs (its monitoring copies, two per call, sent to the
//!   control plane) but no grant: round trip p50/p99 (one call at a time,
//!   the three callers in turn, in rounds) and requests/s with 128 in
//!   flight (best of the runs);
//! - `verify`: presenting a token of 1, 3 and 8 blocks (narrowings and
//!   hand-ons mixed): the pure `capwire_authz::verify` and one
//!   `Verified::allows` on this thread (median, p99, tokens/s on one
//!   core), `allows` alone, and `Peer::present` round trips to the node;
//! - `cache`: the first delegated call of a verb after a presentation
//!   (the chokepoint's cache misses: one evaluation of the token's logic)
//!   against the calls after it (cache hits), over the wire (medians of
//!   rounds of a present, a bootstrap call, one first call and four later
//!   calls) and on `Delegations::check` alone.
//!
//! The wire figures run in two placements:
//!
//! - `shared`: the node, the control plane and the worker on one
//!   2-worker tokio runtime;
//! - `split`: each of the three nodes (with its caller) on a
//!   single-threaded runtime on its own OS thread, as three processes
//!   would be.
//!
//! A call or check refused while measuring (an honest token is refused
//! `too_costly` when the thread evaluating it was kept off the CPU past
//! the evaluation's time bound, as on a very loaded machine) is left out of
//! the figures and counted at the end.
//!
//! `cargo bench --bench grants` runs everything (about 25 s);
//! `--quick` or `CAPWIRE_BENCH_QUICK=1` runs small counts once (seconds).
//! Filters, each a comma-separated list:
//!
//! - `CAPWIRE_BENCH_ONLY=call,verify,cache`: sections (all by default);
//! - `CAPWIRE_BENCH_PLACEMENT=shared,split`: placements (both by default);
//! - `CAPWIRE_BENCH_CALLER=cp,delegated,open`: callers of `call` (all by
//!   default), for profiling one;
//! - `CAPWIRE_BENCH_N=count`: calls per run, for every selected section;
//! - `CAPWIRE_BENCH_RUNS=k`: runs of the throughput figures, best of k (5,
//!   or 1 when quick).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use capwire::authz::{
    Binding, Delegations, GrantDenied, GrantKey, GrantSpec, Narrowing, Right, Verified, delegate,
    mint, narrow, verify,
};
use capwire::envelope::NodeId;
use capwire::grants::GrantPublicKey;
use capwire::manifest::verb;
use capwire::{Capability, HandlerError, Limits, Node, Peer};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::runtime::Handle;

#[path = "support/runtimes.rs"]
mod runtimes;
use runtimes::{Hosts, RtThread, run_on};
#[path = "support/figures.rs"]
mod figures;
use figures::{median, verdict};
#[path = "support/opts.rs"]
mod opts;
use opts::{Opts, list, wanted};

verb! { /** Echo, for the control plane and the holders of a grant. */
pub struct Guarded: request "app.bench" / "guarded", Controller, String => String; }
verb! { /** Echo, for anyone. */
pub struct Open: request "app.bench" / "open", Bootstrap, String => String; }

/// Calls and checks refused while measuring, by reason: an honest token
/// is refused `too_costly` when its evaluation's thread was kept off the
/// CPU past the evaluation's time bound (a loaded machine). Left out of
/// the figures, and counted at the end.
static REFUSED: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

fn refused(why: impl std::fmt::Display) {
    *REFUSED.lock().unwrap().entry(why.to_string()).or_default() += 1;
}

const PAYLOAD: usize = 64;
const WINDOW: usize = 128;
const CAP: &str = "app.bench";
const VERB: &str = "guarded";
/// Token sizes measured, in blocks.
const BLOCKS: [usize; 3] = [1, 3, 8];

// ---------------------------------------------------------------------------
// Where the nodes run

/// The runtimes the node, the control plane and the worker run on.
struct Placement {
    name: &'static str,
    node: Handle,
    cp: Handle,
    worker: Handle,
    hosts: Option<Hosts>,
}

impl Placement {
    fn shared() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let h = rt.handle().clone();
        Self {
            name: "shared",
            node: h.clone(),
            cp: h.clone(),
            worker: h,
            hosts: Some(Hosts::Workers(rt)),
        }
    }

    fn split() -> Self {
        let node = RtThread::start("bench-node");
        let cp = RtThread::start("bench-cp");
        let worker = RtThread::start("bench-worker");
        Self {
            name: "split",
            node: node.handle.clone(),
            cp: cp.handle.clone(),
            worker: worker.handle.clone(),
            hosts: Some(Hosts::Threads(vec![worker, cp, node])),
        }
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        match self.hosts.take() {
            Some(Hosts::Workers(rt)) => rt.shutdown_timeout(Duration::from_secs(1)),
            Some(Hosts::Threads(threads)) => drop(threads),
            None => {}
        }
    }
}

// ---------------------------------------------------------------------------
// Token chains

/// A holder of a token on its way: its node id and grant key.
struct Hop {
    id: NodeId,
    key: GrantKey,
}

fn hop(i: u8) -> Hop {
    Hop {
        id: NodeId::from_bytes([0x40 + i; 32]),
        key: GrantKey::from_secret(&[0x40 + i; 32]),
    }
}

/// The holder a token of `blocks` blocks is minted for: the final holder
/// itself for one block, else the first of the hops.
fn first_holder(blocks: usize, last: (NodeId, GrantPublicKey)) -> (NodeId, GrantPublicKey) {
    if blocks == 1 {
        last
    } else {
        let h = hop(0);
        (h.id, h.key.public())
    }
}

/// Grows a token minted for [`first_holder`] to `blocks` blocks ending at
/// `last`: hand-ons (each narrowing the expiry) and narrowings (to the
/// benchmarked verb) in turn, a hand-on to `last` at the end.
fn chain(
    token: String,
    blocks: usize,
    last: (NodeId, GrantPublicKey),
    expires: SystemTime,
) -> String {
    if blocks == 1 {
        return token;
    }
    let hand_on = Narrowing {
        verbs: None,
        expires: Some(expires),
    };
    let only = Narrowing {
        verbs: Some(vec![(CAP.into(), VERB.into()), (CAP.into(), "open".into())]),
        expires: None,
    };
    // Blocks after the authority block: hand-on, narrow, hand-on, ...;
    // the last hand-on goes to `last`.
    let extra = blocks - 1;
    let hand_ons = extra.div_ceil(2);
    let mut token = token;
    let mut holder = 0u8;
    let mut done_hand_ons = 0;
    for i in 0..extra {
        if i % 2 == 0 {
            done_hand_ons += 1;
            let from = hop(holder);
            let (to_id, to_key) = if done_hand_ons == hand_ons {
                last
            } else {
                let next = hop(holder + 1);
                (next.id, next.key.public())
            };
            token = delegate(&token, &from.key, &to_id, &to_key, &hand_on).unwrap();
            holder += 1;
        } else {
            token = narrow(&token, &only).unwrap();
        }
    }
    assert_eq!(
        capwire::grants::revocation_ids(&token).unwrap().len(),
        blocks
    );
    token
}

fn description(blocks: usize) -> String {
    let extra = blocks - 1;
    let hand_ons = extra.div_ceil(2);
    format!(
        "{blocks} block{} ({hand_ons} hand-on{}, {} narrowing{})",
        if blocks == 1 { "" } else { "s" },
        if hand_ons == 1 { "" } else { "s" },
        extra - hand_ons,
        if extra - hand_ons == 1 { "" } else { "s" },
    )
}

// ---------------------------------------------------------------------------
// The nodes

async fn echo(args: String) -> Result<String, HandlerError> {
    Ok(args)
}

/// A node, its bound control plane and a worker holding a grant for
/// `app.bench/guarded`, each on its placement's runtime.
struct Cluster {
    node: Node,
    cp: Node,
    worker: Node,
    /// The control plane's session to the node.
    to_node: Peer,
    /// The worker's session to the node.
    from_worker: Peer,
    /// The worker's one-block token.
    token: String,
}

impl Cluster {
    fn start(p: &Placement) -> Self {
        let node = run_on(&p.node, async move {
            let cap = Capability::new(CAP, "1.0.0")
                .unwrap()
                .handle(Guarded, echo)
                .handle(Open, echo);
            Node::builder("bench-node")
                .listen("127.0.0.1:0".parse().unwrap())
                .capability(cap)
                .limits(Limits {
                    max_inflight_per_session: 4096,
                    ..Limits::default()
                })
                .start()
                .await
                .unwrap()
        });
        let cp = run_on(&p.cp, async move {
            Node::builder("bench-cp").start().await.unwrap()
        });
        let invite = node.invite(Some(cp.id())).unwrap();
        let c = cp.clone();
        let to_node = run_on(
            &p.cp,
            async move { c.connect_invite(&invite).await.unwrap().0 },
        );
        assert_eq!(node.controller(), Some(cp.id()));
        let (addr, id) = (node.local_addrs()[0].clone(), node.id());
        let (worker, from_worker) = run_on(&p.worker, async move {
            let worker = Node::builder("bench-worker").start().await.unwrap();
            let peer = worker.connect(&addr, Some(id)).await.unwrap();
            (worker, peer)
        });
        let (c, to, holder, key) = (cp.clone(), to_node.clone(), worker.id(), worker.grant_key());
        let token = run_on(&p.cp, async move {
            c.grant(
                &to,
                holder,
                key,
                vec![Right::verb(CAP, VERB)],
                Duration::from_secs(3600),
            )
            .await
            .unwrap()
        });
        let (w, t) = (from_worker.clone(), token.clone());
        run_on(&p.worker, async move {
            // Tried again only when refused for cost (a loaded machine).
            let mut tries = 0;
            loop {
                tries += 1;
                let r = match w.present(&t).await {
                    Ok(_) => w.request(Guarded, "x".into()).await.map(drop),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => break,
                    Err(e) if tries < 5 && e.to_string().contains("bounds") => refused(e),
                    Err(e) => panic!("the worker's token: {e}"),
                }
            }
        });
        Self {
            node,
            cp,
            worker,
            to_node,
            from_worker,
            token,
        }
    }

    /// A token of `blocks` blocks for the worker, minted by the control
    /// plane.
    fn token(&self, p: &Placement, blocks: usize) -> String {
        let last = (self.worker.id(), self.worker.grant_key());
        let (holder, key) = first_holder(blocks, last);
        let (c, to) = (self.cp.clone(), self.to_node.clone());
        let minted = run_on(&p.cp, async move {
            c.grant(
                &to,
                holder,
                key,
                vec![Right::verb(CAP, VERB), Right::verb(CAP, "other")],
                Duration::from_secs(3600),
            )
            .await
            .unwrap()
        });
        chain(
            minted,
            blocks,
            last,
            SystemTime::now() + Duration::from_secs(1800),
        )
    }

    fn stop(self, p: &Placement) {
        let Self {
            node,
            cp,
            worker,
            to_node,
            from_worker,
            ..
        } = self;
        drop((to_node, from_worker));
        run_on(&p.worker, async move { worker.shutdown().await });
        run_on(&p.cp, async move { cp.shutdown().await });
        run_on(&p.node, async move { node.shutdown().await });
    }
}

// ---------------------------------------------------------------------------
// Figures

/// The `q` quantile of `v` (unsorted), in the same unit; NaN for none.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The three callers of the `call` section.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The bound control plane calling `guarded`.
    ControlPlane,
    /// The worker calling `guarded` through its token.
    Delegated,
    /// The worker calling `open` (no grant needed).
    Open,
}

const CALLERS: [Caller; 3] = [Caller::ControlPlane, Caller::Delegated, Caller::Open];

impl Caller {
    fn name(self) -> &'static str {
        match self {
            Caller::ControlPlane => "cp",
            Caller::Delegated => "delegated",
            Caller::Open => "open",
        }
    }

    fn peer_and_handle<'a>(self, c: &'a Cluster, p: &'a Placement) -> (&'a Peer, &'a Handle) {
        match self {
            Caller::ControlPlane => (&c.to_node, &p.cp),
            Caller::Delegated | Caller::Open => (&c.from_worker, &p.worker),
        }
    }
}

/// One call; `false` (and counted) when refused.
async fn call(peer: &Peer, caller: Caller, payload: String) -> bool {
    let out = if caller == Caller::Open {
        peer.request(Open, payload).await
    } else {
        peer.request(Guarded, payload).await
    };
    match out {
        Ok(out) => {
            assert_eq!(out.len(), PAYLOAD);
            true
        }
        Err(e) => {
            refused(format!("{}: {e}", caller.name()));
            false
        }
    }
}

/// `n` calls one at a time: each one's round trip, in µs.
async fn rtt_batch(peer: Peer, caller: Caller, n: u64) -> Vec<f64> {
    let payload = "x".repeat(PAYLOAD);
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap());
    for _ in 0..n {
        let t = Instant::now();
        if call(&peer, caller, payload.clone()).await {
            out.push(us(t.elapsed()));
        }
    }
    out
}

/// `n` calls with [`WINDOW`] in flight: requests/s, in thousands.
async fn pipe_run(peer: Peer, caller: Caller, n: u64) -> f64 {
    let payload = "x".repeat(PAYLOAD);
    let start = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while in_flight.len() < WINDOW && sent < n {
            in_flight.push(call(&peer, caller, payload.clone()));
            sent += 1;
        }
        if in_flight.next().await.is_some() {
            done += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64() / 1e3
}

fn call_section(opts: &Opts, p: &Placement, c: &Cluster) {
    // Round trips: rounds of a batch from each caller in turn.
    let n = opts.count(12_000, 600);
    let rounds = 12u64;
    let mut lat: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds {
        for (i, &caller) in CALLERS.iter().enumerate() {
            if !wanted(&list("CAPWIRE_BENCH_CALLER"), caller.name()) {
                continue;
            }
            let (peer, h) = caller.peer_and_handle(c, p);
            lat[i].extend(run_on(h, rtt_batch(peer.clone(), caller, n / rounds)));
        }
    }
    let [mut cp, mut dl, mut op] = lat;
    let q = |v: &mut Vec<f64>| (quantile(v, 0.5), quantile(v, 0.99));
    let ((cp50, cp99), (dl50, dl99), (op50, op99)) = (q(&mut cp), q(&mut dl), q(&mut op));
    println!(
        "{:<6} {:<36} {:>9.1} {:>9.1} {:>9.1}  {:<7} {:>7.3}x {:>7.3}x  delegated/cp <= 1.05x: {}",
        p.name,
        format!("round trip p50 ({} each)", n / rounds * rounds),
        cp50,
        dl50,
        op50,
        "µs",
        dl50 / cp50,
        dl50 / op50,
        verdict(dl50 / cp50 <= 1.05),
    );
    println!(
        "{:<6} {:<36} {:>9.1} {:>9.1} {:>9.1}  {:<7} {:>7.3}x {:>7.3}x",
        p.name,
        "round trip p99",
        cp99,
        dl99,
        op99,
        "µs",
        dl99 / cp99,
        dl99 / op99,
    );
    // Throughput: best of the runs, the callers in turn within each run.
    let n = opts.count(50_000, 5_000);
    let mut best = [f64::NAN; 3];
    for _ in 0..opts.runs {
        for (i, &caller) in CALLERS.iter().enumerate() {
            if !wanted(&list("CAPWIRE_BENCH_CALLER"), caller.name()) {
                continue;
            }
            let (peer, h) = caller.peer_and_handle(c, p);
            best[i] = best[i].max(run_on(h, pipe_run(peer.clone(), caller, n)));
        }
    }
    let [cp, dl, op] = best;
    println!(
        "{:<6} {:<36} {:>9.1} {:>9.1} {:>9.1}  {:<7} {:>7.3}x {:>7.3}x  delegated/cp >= 0.95x: {}",
        p.name,
        format!("requests, {WINDOW} in flight ({n})"),
        cp,
        dl,
        op,
        "k req/s",
        dl / cp,
        dl / op,
        verdict(dl / cp >= 0.95),
    );
}

/// Pure: `verify` and one `allows` of tokens of each size, on this thread.
fn verify_pure(opts: &Opts) {
    let root = GrantKey::from_secret(&[1; 32]);
    let node = NodeId::from_bytes([7; 32]);
    let worker = hop(9);
    let last = (worker.id, worker.key.public());
    let now = SystemTime::now();
    let epoch = 3;
    for blocks in BLOCKS {
        let (holder, holder_key) = first_holder(blocks, last);
        let minted = mint(
            &root,
            &GrantSpec {
                node,
                epoch,
                holder,
                holder_key,
                rights: vec![Right::verb(CAP, VERB), Right::verb(CAP, "other")],
                expires: now + Duration::from_secs(3600),
            },
        )
        .unwrap();
        let token = chain(minted, blocks, last, now + Duration::from_secs(1800));
        let once = || -> Result<Verified, GrantDenied> {
            let v = verify(
                &token,
                &root.public(),
                &node,
                epoch,
                &worker.id,
                now,
                |_| false,
            )?;
            v.allows(CAP, VERB, now)?;
            Ok(v)
        };
        // Warm up, then measure for a while.
        let v = std::iter::repeat_with(once)
            .take(10)
            .find_map(Result::ok)
            .expect("the token verifies");
        let n = opts.count(4_000, 100) / blocks as u64;
        let mut both = Vec::with_capacity(usize::try_from(n).unwrap());
        let start = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            match std::hint::black_box(once()) {
                Ok(_) => both.push(us(t.elapsed())),
                Err(e) => refused(format!("verify: {}", e.as_str())),
            }
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        let mut allows = Vec::with_capacity(usize::try_from(n).unwrap());
        for _ in 0..n {
            let t = Instant::now();
            match v.allows(CAP, VERB, now) {
                Ok(()) => allows.push(us(t.elapsed())),
                Err(e) => refused(format!("allows: {}", e.as_str())),
            }
        }
        let (p50, p99) = (quantile(&mut both, 0.5), quantile(&mut both, 0.99));
        println!(
            "pure   {:<36} verify+allows p50 {:>7.1} µs p99 {:>7.1} µs, {:>6.0} tokens/s on one core; \
             allows alone p50 {:>6.1} µs; {} chars",
            description(blocks),
            p50,
            p99,
            rate,
            quantile(&mut allows, 0.5),
            token.len(),
        );
    }
}

/// `n` presentations of `token`, one at a time: each one's round trip.
async fn present_batch(peer: Peer, token: String, n: u64) -> Vec<f64> {
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap());
    for _ in 0..n {
        let t = Instant::now();
        match peer.present(&token).await {
            Ok(_) => out.push(us(t.elapsed())),
            Err(e) => refused(format!("present: {e}")),
        }
    }
    out
}

fn verify_wire(opts: &Opts, p: &Placement, c: &Cluster) {
    let n = opts.count(600, 30);
    let tokens: Vec<String> = BLOCKS.iter().map(|&b| c.token(p, b)).collect();
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); BLOCKS.len()];
    // Rounds of each size in turn; then the worker's own token again.
    let rounds = 6;
    for _ in 0..rounds {
        for (i, t) in tokens.iter().enumerate() {
            let batch = n / rounds / BLOCKS[i] as u64 + 1;
            lat[i].extend(run_on(
                &p.worker,
                present_batch(c.from_worker.clone(), t.clone(), batch),
            ));
        }
    }
    // The delegated call still works with the last token presented.
    let w = c.from_worker.clone();
    run_on(&p.worker, async move {
        call(&w, Caller::Delegated, "x".repeat(PAYLOAD)).await;
    });
    // Back to the one-block token for what follows.
    run_on(
        &p.worker,
        present_batch(c.from_worker.clone(), c.token.clone(), 1),
    );
    for (i, mut l) in lat.into_iter().enumerate() {
        println!(
            "{:<6} {:<36} present round trip p50 {:>7.1} µs p99 {:>7.1} µs ({} presents)",
            p.name,
            description(BLOCKS[i]),
            quantile(&mut l, 0.5),
            quantile(&mut l, 0.99),
            l.len(),
        );
    }
}

/// Rounds of: present, a bootstrap call, the first delegated call (a
/// cache miss), four more (hits).
async fn cache_rounds(peer: Peer, token: String, rounds: u64) -> (Vec<f64>, Vec<f64>) {
    let payload = "x".repeat(PAYLOAD);
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        if let Err(e) = peer.present(&token).await {
            refused(format!("present: {e}"));
            continue;
        }
        // The node is idle again (the presentation's monitoring copies
        // sent) before the first call.
        assert_eq!(
            peer.request(Open, payload.clone()).await.unwrap().len(),
            PAYLOAD
        );
        for i in 0..5 {
            let t = Instant::now();
            if !call(&peer, Caller::Delegated, payload.clone()).await {
                continue;
            }
            let took = us(t.elapsed());
            if i == 0 {
                first.push(took);
            } else {
                later.push(took);
            }
        }
    }
    (first, later)
}

fn cache_wire(opts: &Opts, p: &Placement, c: &Cluster) {
    let rounds = opts.count(1_500, 50);
    let (first, later) = run_on(
        &p.worker,
        cache_rounds(c.from_worker.clone(), c.token.clone(), rounds),
    );
    let (f, l) = (median(first), median(later));
    println!(
        "{:<6} {:<36} first call p50 {:>7.1} µs, later calls p50 {:>7.1} µs: +{:.1} µs ({:.2}x) \
         ({rounds} rounds)",
        p.name,
        "delegated call, cache miss vs hit",
        f,
        l,
        f - l,
        f / l,
    );
}

/// Pure: `Delegations::check` right after a presentation (a miss) and
/// again (a hit).
fn cache_pure(opts: &Opts) {
    let root = GrantKey::from_secret(&[1; 32]);
    let node = NodeId::from_bytes([7; 32]);
    let cp = NodeId::from_bytes([8; 32]);
    let worker = hop(9);
    let now = SystemTime::now();
    let epoch = 3;
    let token = mint(
        &root,
        &GrantSpec {
            node,
            epoch,
            holder: worker.id,
            holder_key: worker.key.public(),
            rights: vec![Right::verb(CAP, VERB)],
            expires: now + Duration::from_secs(3600),
        },
    )
    .unwrap();
    let binding = Binding::new(Some(cp), epoch);
    let d = Delegations::default();
    let n = opts.count(2_000, 100);
    let (mut miss, mut hit) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let v = match verify(
            &token,
            &root.public(),
            &node,
            epoch,
            &worker.id,
            now,
            |_| false,
        ) {
            Ok(v) => v,
            Err(e) => {
                refused(format!("verify: {}", e.as_str()));
                continue;
            }
        };
        d.present(worker.id, v, now).unwrap();
        let t = Instant::now();
        let first = d.check(&worker.id, CAP, VERB, &binding, now);
        let took = us(t.elapsed());
        match first {
            Some(Ok(_)) => miss.push(took),
            // Not cached: the next check is another miss.
            Some(Err(e)) => {
                refused(format!("check: {}", e.as_str()));
                continue;
            }
            None => unreachable!("a token was presented"),
        }
        let t = Instant::now();
        let again = d.check(&worker.id, CAP, VERB, &binding, now);
        let took = us(t.elapsed());
        match again {
            Some(Ok(_)) => hit.push(took),
            Some(Err(e)) => refused(format!("check: {}", e.as_str())),
            None => unreachable!("a token was presented"),
        }
    }
    let (m, h) = (median(miss), median(hit));
    println!(
        "pure   {:<36} miss p50 {:>7.2} µs, hit p50 {:>7.3} µs ({:.0}x)",
        "Delegations::check",
        m,
        h,
        m / h,
    );
}

fn main() {
    let opts = Opts::from_env();
    println!(
        "capwire grants: delegated controller calls, presentations, the answer cache; \
         loopback, {PAYLOAD} B payload{}",
        if opts.quick { " (quick)" } else { "" }
    );
    println!("  shared: node, control plane and worker on one 2-worker tokio runtime");
    println!("  split:  each on its own current-thread runtime and OS thread");
    let mut placements = Vec::new();
    if wanted(&opts.placements, "shared") {
        placements.push(Placement::shared());
    }
    if wanted(&opts.placements, "split") {
        placements.push(Placement::split());
    }
    let clusters: Vec<Cluster> = placements.iter().map(Cluster::start).collect();
    if wanted(&opts.sections, "call") {
        println!(
            "{:<6} {:<36} {:>9} {:>9} {:>9}  {:<7} {:>8} {:>8}  target",
            "", "controller echo", "cp", "delegated", "open", "unit", "dl/cp", "dl/open"
        );
        for (p, c) in placements.iter().zip(&clusters) {
            call_section(&opts, p, c);
        }
    }
    if wanted(&opts.sections, "verify") {
        println!("presenting a token");
        verify_pure(&opts);
        for (p, c) in placements.iter().zip(&clusters) {
            verify_wire(&opts, p, c);
        }
    }
    if wanted(&opts.sections, "cache") {
        println!("the chokepoint's answer cache");
        cache_pure(&opts);
        for (p, c) in placements.iter().zip(&clusters) {
            cache_wire(&opts, p, c);
        }
    }
    for (p, c) in placements.iter().zip(clusters) {
        c.stop(p);
    }
    let refusals = REFUSED.lock().unwrap();
    if refusals.is_empty() {
        println!("nothing refused while measuring");
    }
    for (why, n) in refusals.iter() {
        println!("refused while measuring, left out of the figures: {n} x {why}");
    }
}
