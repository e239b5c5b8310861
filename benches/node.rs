//! Node runtime benchmarks. Every capwire figure is printed beside its
//! baselines, measured in the same run and interleaved with it (so that
//! background load hits all alike), with ratios and the target:
//!
//! - `rtt`: request/response round trip with a 64 B payload, one at a
//!   time: a raw tokio TCP echo, a snow (`Noise_XX_25519_ChaChaPoly_BLAKE2s`)
//!   echo, a tarpc echo (bincode over plain TCP: an RPC framework with no
//!   encryption at all), and capwire `Peer::request` to an echo handler
//!   that finishes inline;
//! - `pipe`: the same requests with 128 in flight, requests/s;
//! - `faf`: fire-and-forget 64 B messages on one connection: capwire
//!   notifications (envelopes/s) against one-way raw TCP and snow
//!   messages; plus capwire's `u64` tick notification on its own;
//! - `connect`: a new connection's first answer, one connection at a
//!   time: TCP connect, the Noise XX handshake (snow, capwire) and one
//!   64 B round trip; for capwire, `Node::connect` (handshake and both
//!   sides' hellos) and one `Peer::request`, each from a client node of
//!   its own that was started beforehand (a node keeps one session per
//!   peer), against a server node that already holds the earlier ones.
//!
//! Each runs in two placements:
//!
//! - `shared`: both ends on one 2-worker tokio runtime;
//! - `split`: each end on a single-threaded runtime on its own OS thread,
//!   as two processes would be: the client (the capwire client node and
//!   its caller, or the baseline's client) on one, the server on the other.
//!
//! The baselines are written the way a tokio user would (as in the
//! transport bench): 2-byte length prefix, one Noise message per payload,
//! a 64 KiB `BufReader` on the receiving side; snow writes each message
//! with its own `write_all`, raw TCP writes through a `BufWriter` flushed
//! when it is about to wait (so it batches: an upper bound).
//!
//! `cargo bench --bench node` runs everything, best of 3 (about a minute);
//! `--quick` or `CAPWIRE_BENCH_QUICK=1` runs small counts once (seconds).
//! Filters, each a comma-separated list, for profiling one figure:
//!
//! - `CAPWIRE_BENCH_ONLY=rtt,pipe,faf,connect`: sections (all by default);
//! - `CAPWIRE_BENCH_PLACEMENT=shared,split`: placements (both by default);
//! - `CAPWIRE_BENCH_STACK=capwire,snow,raw,tarpc`: stacks (all by default);
//! - `CAPWIRE_BENCH_RT=current`: the shared placement on one
//!   current-thread runtime instead of two workers;
//! - `CAPWIRE_BENCH_N=count`: messages per run, for every selected section;
//! - `CAPWIRE_BENCH_RUNS=k`: best of k (3, or 1 when quick).
//!
//! e.g. `CAPWIRE_BENCH_ONLY=pipe CAPWIRE_BENCH_STACK=capwire
//! CAPWIRE_BENCH_PLACEMENT=split CAPWIRE_BENCH_RUNS=1 target/release/deps/node-*`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use capwire::manifest::verb;
use capwire::{Capability, HandlerError, Limits, Node, Peer, State};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot};

#[path = "support/runtimes.rs"]
mod runtimes;
use runtimes::{Placement, run_on};
#[path = "support/figures.rs"]
mod figures;
use figures::ratio;
#[path = "support/opts.rs"]
mod opts;
use opts::{Opts, list, wanted};
#[path = "support/calls.rs"]
mod calls;
use calls::{per_op_us, rate_k};
#[path = "support/wire.rs"]
mod wire;
use wire::Wire;

verb! { /** Echo. */ pub struct Echo: request "app.bench" / "echo", Bootstrap, String => String; }
verb! { /** A 64 B note. */ pub struct Note: notification "app.bench" / "note", Bootstrap, String; }
verb! { /** A counter tick. */ pub struct Tick: notification "app.bench" / "tick", Bootstrap, u64; }

const PAYLOAD: usize = 64;
const WINDOW: usize = 128;

/// Messages per run of a section: (full, quick).
fn count(opts: &Opts, which: Which) -> u64 {
    let (full, quick) = match which {
        Which::Rtt => (20_000, 500),
        Which::Pipe => (300_000, 5_000),
        Which::Faf | Which::Tick => (1_000_000, 20_000),
        Which::Connect => (300, 20),
    };
    opts.count(full, quick)
}

/// `CAPWIRE_BENCH_RT=current`: the shared placement on one current-thread
/// runtime.
fn shared_current() -> bool {
    std::env::var("CAPWIRE_BENCH_RT").as_deref() == Ok("current")
}

// ---------------------------------------------------------------------------
// Where the two ends run

// ---------------------------------------------------------------------------
// Baselines: raw TCP and snow, both with 2-byte length prefixes

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    Capwire,
    Snow,
    Raw,
    Tarpc,
}

impl Stack {
    fn name(self) -> &'static str {
        match self {
            Stack::Capwire => "capwire",
            Stack::Snow => "snow",
            Stack::Raw => "raw",
            Stack::Tarpc => "tarpc",
        }
    }
}

const STACKS: [Stack; 4] = [Stack::Capwire, Stack::Snow, Stack::Raw, Stack::Tarpc];

enum Serve {
    Echo,
    /// Echoes on every connection it accepts, each on its own task.
    EchoAll(Stack),
    /// Receives `n` messages and reports when the last one arrived.
    Sink(u64, oneshot::Sender<Instant>),
}

async fn echo_on(mut wire: Wire) {
    let mut msg = Vec::new();
    while wire.recv(&mut msg).await {
        wire.send(&msg).await;
        if !wire.buffered() {
            wire.flush().await;
        }
    }
}

async fn serve(stack: Stack, mode: Serve, ready: oneshot::Sender<std::net::SocketAddr>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    ready.send(listener.local_addr().unwrap()).unwrap();
    if let Serve::EchoAll(stack) = mode {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((s, _)) = listener.accept().await {
            conns.spawn(
                async move { echo_on(Wire::open(s, stack == Stack::Snow, false).await).await },
            );
            while conns.try_join_next().is_some() {}
        }
        return;
    }
    let (s, _) = listener.accept().await.unwrap();
    let mut wire = Wire::open(s, stack == Stack::Snow, false).await;
    let mut msg = Vec::new();
    match mode {
        Serve::Echo | Serve::EchoAll(_) => echo_on(wire).await,
        Serve::Sink(n, last) => {
            for _ in 0..n {
                assert!(wire.recv(&mut msg).await);
            }
            let _ = last.send(Instant::now());
        }
    }
}

/// One baseline figure, run from the client end; the server is spawned
/// on `server`.
async fn baseline(server: Handle, stack: Stack, which: Which, n: u64) -> f64 {
    let (ready_tx, ready_rx) = oneshot::channel();
    let (last_tx, last_rx) = oneshot::channel();
    let mode = if which == Which::Faf {
        Serve::Sink(n, last_tx)
    } else {
        Serve::Echo
    };
    if which == Which::Connect {
        return baseline_connect(server, stack, n).await;
    }
    let srv = server.spawn(serve(stack, mode, ready_tx));
    let addr = ready_rx.await.unwrap();
    let mut wire = Wire::open(
        TcpStream::connect(addr).await.unwrap(),
        stack == Stack::Snow,
        true,
    )
    .await;
    let payload = [7u8; PAYLOAD];
    let mut msg = Vec::new();
    let start = Instant::now();
    let figure = match which {
        Which::Rtt => {
            for _ in 0..n {
                wire.send(&payload).await;
                wire.flush().await;
                assert!(wire.recv(&mut msg).await);
                assert_eq!(msg.len(), PAYLOAD);
            }
            per_op_us(start.elapsed(), n)
        }
        Which::Pipe => {
            wire.pipelined(&payload, n, WINDOW as u64).await;
            rate_k(start.elapsed(), n)
        }
        Which::Faf => {
            for _ in 0..n {
                wire.send(&payload).await;
            }
            wire.flush().await;
            let end = last_rx.await.unwrap();
            rate_k(end - start, n)
        }
        Which::Tick | Which::Connect => unreachable!("capwire only / baseline_connect"),
    };
    drop(wire);
    srv.await.unwrap();
    figure
}

/// `n` connections one after the other, each to its first echo (mean,
/// µs); the server echoes on each (all kept open until the end).
async fn baseline_connect(server: Handle, stack: Stack, n: u64) -> f64 {
    let (ready_tx, ready_rx) = oneshot::channel();
    let srv = server.spawn(serve(stack, Serve::EchoAll(stack), ready_tx));
    let addr = ready_rx.await.unwrap();
    let payload = [7u8; PAYLOAD];
    let mut msg = Vec::new();
    let mut open = Vec::new();
    let mut total = Duration::ZERO;
    for _ in 0..n {
        let start = Instant::now();
        let mut wire = Wire::open(
            TcpStream::connect(addr).await.unwrap(),
            stack == Stack::Snow,
            true,
        )
        .await;
        wire.send(&payload).await;
        wire.flush().await;
        assert!(wire.recv(&mut msg).await);
        total += start.elapsed();
        assert_eq!(msg.len(), PAYLOAD);
        open.push(wire);
    }
    drop(open);
    srv.abort();
    per_op_us(total, n)
}

// ---------------------------------------------------------------------------
// Baseline: tarpc (bincode over TCP, no encryption), as its README serves

#[tarpc::service]
trait EchoRpc {
    async fn echo(payload: Vec<u8>) -> Vec<u8>;
}

#[derive(Clone)]
struct EchoServer;

impl EchoRpc for EchoServer {
    async fn echo(self, _: tarpc::context::Context, payload: Vec<u8>) -> Vec<u8> {
        payload
    }
}

async fn tarpc_figure(server: Handle, which: Which, n: u64) -> f64 {
    use futures_util::StreamExt;
    use tarpc::server::{BaseChannel, Channel};
    use tarpc::tokio_serde::formats::Bincode;

    let (ready_tx, ready_rx) = oneshot::channel();
    let srv = server.spawn(async move {
        let mut listener = tarpc::serde_transport::tcp::listen("127.0.0.1:0", Bincode::default)
            .await
            .unwrap();
        ready_tx.send(listener.local_addr()).unwrap();
        let transport = listener.next().await.unwrap().unwrap();
        BaseChannel::with_defaults(transport)
            .execute(EchoServer.serve())
            .for_each(|call| async move {
                tokio::spawn(call);
            })
            .await;
    });
    let addr = ready_rx.await.unwrap();
    let transport = tarpc::serde_transport::tcp::connect(addr, Bincode::default)
        .await
        .unwrap();
    let client = EchoRpcClient::new(tarpc::client::Config::default(), transport).spawn();
    let payload = vec![7u8; PAYLOAD];
    let start = Instant::now();
    let figure = match which {
        Which::Rtt => {
            for _ in 0..n {
                let out = client
                    .echo(tarpc::context::current(), payload.clone())
                    .await
                    .unwrap();
                assert_eq!(out.len(), PAYLOAD);
            }
            per_op_us(start.elapsed(), n)
        }
        Which::Pipe => {
            let mut in_flight = futures_util::stream::FuturesUnordered::new();
            let (mut sent, mut done) = (0u64, 0u64);
            while done < n {
                while in_flight.len() < WINDOW && sent < n {
                    let (client, payload) = (client.clone(), payload.clone());
                    in_flight
                        .push(async move { client.echo(tarpc::context::current(), payload).await });
                    sent += 1;
                }
                if let Some(r) = in_flight.next().await {
                    assert_eq!(r.unwrap().len(), PAYLOAD);
                    done += 1;
                }
            }
            rate_k(start.elapsed(), n)
        }
        _ => unreachable!("tarpc runs rtt and pipe"),
    };
    drop(client);
    srv.abort();
    figure
}

// ---------------------------------------------------------------------------
// capwire

/// Counts notifications; wakes the waiter when `target` is reached.
#[derive(Default)]
struct Arrivals {
    count: AtomicU64,
    target: AtomicU64,
    reached: Notify,
}

impl Arrivals {
    fn arrive(&self) {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.target.load(Ordering::SeqCst) {
            self.reached.notify_one();
        }
    }
}

async fn echo(args: String) -> Result<String, HandlerError> {
    Ok(args)
}

async fn note(_text: String, State(a): State<Arc<Arrivals>>) -> Result<(), HandlerError> {
    a.arrive();
    Ok(())
}

async fn tick(_n: u64, State(a): State<Arc<Arrivals>>) -> Result<(), HandlerError> {
    a.arrive();
    Ok(())
}

/// A server node on the placement's server runtime, a client node (and
/// its session) on the client runtime.
struct CapwirePair {
    server: Node,
    client: Node,
    peer: Peer,
    arrivals: Arc<Arrivals>,
}

impl CapwirePair {
    fn start(p: &Placement) -> Self {
        let arrivals = Arc::new(Arrivals::default());
        let state = arrivals.clone();
        let server = run_on(&p.server, async move {
            let cap = Capability::new("app.bench", "1.0.0")
                .unwrap()
                .handle(Echo, echo)
                .handle(Note, note)
                .handle(Tick, tick);
            Node::builder("bench-server")
                .listen("127.0.0.1:0".parse().unwrap())
                .capability(cap)
                .state(state)
                .limits(Limits {
                    max_inflight_per_session: 4096,
                    ..Limits::default()
                })
                .start()
                .await
                .unwrap()
        });
        let (addr, id) = (server.local_addrs()[0].clone(), server.id());
        let (client, peer) = run_on(&p.client, async move {
            let client = Node::builder("bench-client").start().await.unwrap();
            let peer = client.connect(&addr, Some(id)).await.unwrap();
            (client, peer)
        });
        Self {
            server,
            client,
            peer,
            arrivals,
        }
    }

    fn stop(self, p: &Placement) {
        let Self { server, client, .. } = self;
        run_on(&p.client, async move { client.shutdown().await });
        run_on(&p.server, async move { server.shutdown().await });
    }
}

async fn capwire_figure(peer: Peer, arrivals: Arc<Arrivals>, which: Which, n: u64) -> f64 {
    let payload = "x".repeat(PAYLOAD);
    let start = Instant::now();
    match which {
        Which::Rtt => {
            for _ in 0..n {
                let out = peer.request(Echo, payload.clone()).await.unwrap();
                assert_eq!(out.len(), PAYLOAD);
            }
            per_op_us(start.elapsed(), n)
        }
        Which::Pipe => {
            calls::pipelined(&peer, Echo, &payload, n, WINDOW).await;
            rate_k(start.elapsed(), n)
        }
        Which::Faf | Which::Tick => {
            let before = arrivals.count.load(Ordering::SeqCst);
            arrivals.target.store(before + n, Ordering::SeqCst);
            for i in 0..n {
                if which == Which::Tick {
                    peer.notify(Tick, i).await.unwrap();
                } else {
                    peer.notify(Note, payload.clone()).await.unwrap();
                }
            }
            arrivals.reached.notified().await;
            rate_k(start.elapsed(), n)
        }
        Which::Connect => unreachable!("calls::connect_each"),
    }
}

// ---------------------------------------------------------------------------
// Figures and the table

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Rtt,
    Pipe,
    Faf,
    Tick,
    Connect,
}

impl Which {
    fn section(self) -> &'static str {
        match self {
            Which::Rtt => "rtt",
            Which::Pipe => "pipe",
            Which::Faf | Which::Tick => "faf",
            Which::Connect => "connect",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Which::Rtt => "round trip, sequential",
            Which::Pipe => "requests, 128 in flight",
            Which::Faf => "one-way 64 B messages",
            Which::Tick => "one-way u64 tick, capwire",
            Which::Connect => "connect to first answer",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Which::Rtt | Which::Connect => "µs",
            Which::Pipe => "k req/s",
            Which::Faf | Which::Tick => "k msg/s",
        }
    }

    fn higher_is_better(self) -> bool {
        !matches!(self, Which::Rtt | Which::Connect)
    }

    fn stacks(self) -> &'static [Stack] {
        match self {
            Which::Tick => &STACKS[..1],
            Which::Rtt | Which::Pipe => &STACKS,
            Which::Faf | Which::Connect => &STACKS[..3],
        }
    }

    /// The target, and whether the figures meet it.
    fn target(self, capwire: f64, snow: f64, tarpc: Option<f64>) -> String {
        let verdict = |ok: bool| if ok { "met" } else { "missed" };
        match self {
            Which::Rtt => format!(
                "capwire/snow <= 1.10x: {}; below tarpc: {}",
                verdict(capwire / snow <= 1.1),
                tarpc.map_or("-", |t| verdict(capwire < t))
            ),
            Which::Connect => format!("capwire/snow <= 1.00x: {}", verdict(capwire <= snow)),
            Which::Pipe => format!(
                ">= 200 k req/s: {:.2}x, {}",
                capwire / 200.0,
                verdict(capwire >= 200.0)
            ),
            Which::Faf | Which::Tick => format!(
                ">= 1200 k env/s: {:.2}x, {}",
                capwire / 1200.0,
                verdict(capwire >= 1200.0)
            ),
        }
    }
}

fn fmt_figure(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// Best of `opts.runs` interleaved runs of each stack; prints one row.
fn measure(opts: &Opts, p: &Placement, pair: &CapwirePair, which: Which) {
    let n = count(opts, which);
    let mut best: [Option<f64>; 4] = [None; 4];
    for _ in 0..opts.runs {
        for (i, &stack) in which.stacks().iter().enumerate() {
            if !wanted(&list("CAPWIRE_BENCH_STACK"), stack.name()) {
                continue;
            }
            let v = match stack {
                Stack::Capwire if which == Which::Connect => {
                    let (addr, id) = (pair.server.local_addrs()[0].clone(), pair.server.id());
                    run_on(&p.client, async move {
                        per_op_us(
                            calls::connect_each(&addr, id, n, Echo, &"x".repeat(PAYLOAD)).await,
                            1,
                        )
                    })
                }
                Stack::Capwire => run_on(
                    &p.client,
                    capwire_figure(pair.peer.clone(), pair.arrivals.clone(), which, n),
                ),
                Stack::Tarpc => run_on(&p.client, tarpc_figure(p.server.clone(), which, n)),
                _ => run_on(&p.client, baseline(p.server.clone(), stack, which, n)),
            };
            best[i] = Some(match best[i] {
                None => v,
                Some(b) if which.higher_is_better() => b.max(v),
                Some(b) => b.min(v),
            });
        }
    }
    let [c, s, r, t] = best;
    let target = match (c, s) {
        (Some(c), Some(s)) => which.target(c, s, t),
        (Some(c), None) if !matches!(which, Which::Rtt | Which::Connect) => {
            which.target(c, f64::NAN, t)
        }
        _ => String::new(),
    };
    println!(
        "{:<6} {:<34} {:>9} {:>9} {:>9} {:>9}  {:<8} {:>8} {:>8} {:>8}  {target}",
        p.name,
        format!("{} ({n})", which.label()),
        fmt_figure(c),
        fmt_figure(s),
        fmt_figure(r),
        fmt_figure(t),
        which.unit(),
        ratio(c, s),
        ratio(c, r),
        ratio(c, t),
    );
}

fn main() {
    let opts = Opts::from_env();
    println!(
        "capwire node vs snow vs raw tokio TCP vs tarpc, loopback, {PAYLOAD} B payload, \
         best of {} interleaved runs{}",
        opts.runs,
        if opts.quick { " (quick)" } else { "" }
    );
    println!(
        "  shared: both ends on one {}",
        if shared_current() {
            "current-thread tokio runtime"
        } else {
            "2-worker tokio runtime"
        }
    );
    println!(
        "  split:  each end on its own current-thread runtime and OS thread \
         (client node and caller | server node)"
    );
    println!(
        "{:<6} {:<34} {:>9} {:>9} {:>9} {:>9}  {:<8} {:>8} {:>8} {:>8}  target",
        "", "", "capwire", "snow", "raw tcp", "tarpc", "unit", "cw/snow", "cw/raw", "cw/tarpc"
    );
    let mut placements = Vec::new();
    if wanted(&opts.placements, "shared") {
        placements.push(Placement::shared(shared_current()));
    }
    if wanted(&opts.placements, "split") {
        placements.push(Placement::split());
    }
    let pairs: Vec<CapwirePair> = placements.iter().map(CapwirePair::start).collect();
    for which in [
        Which::Rtt,
        Which::Pipe,
        Which::Faf,
        Which::Tick,
        Which::Connect,
    ] {
        if !wanted(&opts.sections, which.section()) {
            continue;
        }
        for (p, pair) in placements.iter().zip(&pairs) {
            measure(&opts, p, pair, which);
        }
    }
    for (p, pair) in placements.iter().zip(pairs) {
        pair.stop(p);
    }
}
