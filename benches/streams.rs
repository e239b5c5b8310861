//! Stream benchmarks (protocol 2). Every capwire figure is printed beside
//! its baselines, measured in the same run and interleaved with it (so
//! that background load hits all alike), with ratios and the target:
//!
//! - `small`: 64 B items on one stream, one connection, items/s, beside
//!   capwire fire-and-forget notifications of the same 64 B byte string,
//!   and one-way 64 B messages over snow
//!   (`Noise_XX_25519_ChaChaPoly_BLAKE2s`) and raw tokio TCP;
//! - `large`: 64 KiB items on one stream, MiB/s, beside one-way 64 KiB
//!   records of capwire's own transport (`capwire_transport::Connection`,
//!   as its bench measures it), snow and raw TCP;
//! - `first`: time to the first item of a stream (from `Peer::stream` to
//!   the item in hand), beside a request/response round trip with the
//!   same 64 B payload, alternating one of each;
//! - `many`: 1,000 concurrent streams on one session, and 10,000 across
//!   100 sessions (100 client nodes): items/s and item latency (from the
//!   moment the handler makes an item to the consumer holding it), first
//!   with producers as fast as credit allows (latency is then how stale
//!   an item is when taken), then paced at half that rate (latency is the
//!   path), beside one stream's items/s of the same run;
//! - `window`: 64 B items over a range of `stream_window_items` (with
//!   the default `stream_window_bytes`), 64 KiB items over a range of
//!   `stream_window_bytes` (with 1024 items), 9 runs (each measures
//!   every window once, one after the other, so that they share its load):
//!   the best throughput of each window, the median over runs of its share
//!   of its run's best window, and the smallest window within 5% of the
//!   best by that median.
//!
//! Each runs in two placements, as in the node bench:
//!
//! - `shared`: both ends on one 2-worker tokio runtime;
//! - `split`: each end on a single-threaded runtime on its own OS thread,
//!   as two processes would be.
//!
//! The baselines are written the way a tokio user would: one Noise message
//! per payload of at most 65519 bytes with a 2-byte length prefix, each
//! with its own `write_all`; raw TCP with a 4-byte prefix through a 64 KiB
//! `BufWriter` (so it batches: an upper bound); a 64 KiB `BufReader` on
//! the receiving side of both. Items and notifications carry a CBOR byte
//! string (a 64 KiB item is 65541 bytes of window: 5 bytes of head).
//!
//! Memory of streams (an idle stream's heap on each side, a slow consumer
//! over time) is measured by `benches/memory.rs`, which counts every
//! allocation; this one runs on the plain system allocator.
//!
//! `cargo bench --bench streams` runs everything, best of 3 (a few
//! minutes); `--quick` or `CAPWIRE_BENCH_QUICK=1` runs small counts once
//! (under a minute). Filters, each a comma-separated list:
//!
//! - `CAPWIRE_BENCH_ONLY=small,large,first,many,window`: sections;
//! - `CAPWIRE_BENCH_PLACEMENT=shared,split`: placements;
//! - `CAPWIRE_BENCH_STACK=capwire,notify,transport,snow,raw`: what runs in
//!   `small` and `large` (`capwire` is the stream);
//! - `CAPWIRE_BENCH_N=count`: items per run, for every selected section;
//! - `CAPWIRE_BENCH_RUNS=k`: best of k (3, or 1 when quick).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire::manifest::verb;
use capwire::schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use capwire::transport::{
    ContactPolicy, Endpoint, Keypair, PROLOGUE, PROTOCOL_NAME, TransportConfig,
};
use capwire::{Capability, HandlerError, Items, Limits, Node, Peer, State};
use serde::de::{Error as _, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Barrier, Notify, oneshot, watch};

#[path = "support/runtimes.rs"]
mod runtimes;
use runtimes::{Placement, run_on};
#[path = "support/figures.rs"]
mod figures;
use figures::{fig, keep_best, median, rate, ratio, verdict};
#[path = "support/opts.rs"]
mod opts;
use opts::{Opts, list, wanted};

// ---------------------------------------------------------------------------
// Items: a CBOR byte string

/// A byte string, encoded as one (serde's `Vec<u8>` is an array of
/// integers); cheap to clone, so the producers do not measure copying.
#[derive(Clone, Debug)]
pub struct Blob(Bytes);

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(Bytes::copy_from_slice(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(Bytes::from(v)))
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Blob, E> {
                Err(E::custom("a text, not a byte string"))
            }
        }
        // `deserialize_byte_buf`: ciborium reads `deserialize_bytes` only
        // into its small scratch buffer.
        d.deserialize_byte_buf(V)
            .map_err(|e| D::Error::custom(format!("blob: {e}")))
    }
}

impl JsonSchema for Blob {
    fn schema_name() -> Cow<'static, str> {
        "Blob".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "contentEncoding": "base64" })
    }
}

fn blob(size: usize) -> Blob {
    Blob(Bytes::from(vec![0x5a; size]))
}

// ---------------------------------------------------------------------------
// Verbs

verb! { /** Sends `count` items of `size` bytes, as fast as credit allows. */
pub struct Gen: stream "app.bench" / "gen", Bootstrap, (u64, u32) => Blob; }
verb! { /** Sends a ready item (stamped 0), waits for the go of its generation, then sends
`count` stamped 64 B items, `burst` every `period` µs (0: as fast as credit allows). */
pub struct Stamped: stream "app.bench" / "stamped", Bootstrap, (u64, u64, u64, u64) => (u64, Blob); }
verb! { /** A fire-and-forget byte string. */
pub struct Note: notification "app.bench" / "note", Bootstrap, Blob; }
verb! { /** Echo. */
pub struct Echo: request "app.bench" / "echo", Bootstrap, Blob => Blob; }

const SMALL: usize = 64;
const LARGE: usize = 64 * 1024;
/// The pad of a stamped item: with its array head and a 9-byte stamp the
/// item's encoding is 64 bytes.
const STAMP_PAD: usize = 52;
const SNOW_MAX_PLAIN: usize = 65535 - 16;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds since the process's epoch: both ends run in this process.
fn now_ns() -> u64 {
    u64::try_from(EPOCH.elapsed().as_nanos()).unwrap()
}

async fn gen_items((count, size): (u64, u32), mut items: Items<Blob>) -> Result<(), HandlerError> {
    let item = blob(size as usize);
    for _ in 0..count {
        items.send(item.clone()).await?;
    }
    Ok(())
}

/// The generation of `many_run` whose producers may go: both ends run in
/// this process, so the producers wait on it directly.
static GO: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);
static GENERATION: AtomicU64 = AtomicU64::new(0);

async fn stamped_items(
    (count, period_us, burst, generation): (u64, u64, u64, u64),
    mut items: Items<(u64, Blob)>,
) -> Result<(), HandlerError> {
    static PAD: [u8; STAMP_PAD] = [0x5a; STAMP_PAD];
    let pad = Blob(Bytes::from_static(&PAD));
    items.send((0, pad.clone())).await?;
    let mut go = GO.subscribe();
    if go.wait_for(|g| *g >= generation).await.is_err() {
        return Err(HandlerError::new(
            capwire::envelope::ErrorCode::Internal,
            "no go",
        ));
    }
    if period_us == 0 {
        for _ in 0..count {
            items.send((now_ns(), pad.clone())).await?;
        }
    } else {
        let mut tick = tokio::time::interval(Duration::from_micros(period_us));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent = 0;
        while sent < count {
            tick.tick().await;
            for _ in 0..burst.min(count - sent) {
                items.send((now_ns(), pad.clone())).await?;
                sent += 1;
            }
        }
    }
    Ok(())
}

/// Counts notifications; wakes the waiter when `target` is reached.
#[derive(Default)]
struct Arrivals {
    count: AtomicU64,
    target: AtomicU64,
    reached: Notify,
}

async fn note(_b: Blob, State(a): State<Arc<Arrivals>>) -> Result<(), HandlerError> {
    let n = a.count.fetch_add(1, Ordering::SeqCst) + 1;
    if n == a.target.load(Ordering::SeqCst) {
        a.reached.notify_one();
    }
    Ok(())
}

async fn echo(b: Blob) -> Result<Blob, HandlerError> {
    Ok(b)
}

fn capability() -> Capability {
    Capability::new("app.bench", "1.0.0")
        .unwrap()
        .stream(Gen, gen_items)
        .stream(Stamped, stamped_items)
        .handle(Note, note)
        .handle(Echo, echo)
}

// ---------------------------------------------------------------------------
// Where the two ends run

// ---------------------------------------------------------------------------
// Baselines: one-way messages over raw TCP, snow and capwire's transport

#[derive(Clone, Copy, PartialEq, Eq)]
enum Base {
    Transport,
    Snow,
    Raw,
}

fn snow_builder(secret: &[u8]) -> snow::Builder<'_> {
    snow::Builder::new(PROTOCOL_NAME.parse().unwrap())
        .local_private_key(secret)
        .unwrap()
        .prologue(PROLOGUE)
        .unwrap()
}

async fn write_framed(s: &mut TcpStream, msg: &[u8]) {
    let mut framed = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(msg);
    s.write_all(&framed).await.unwrap();
}

async fn read_framed<R: AsyncReadExt + Unpin>(s: &mut R, buf: &mut Vec<u8>) {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.unwrap();
    buf.resize(usize::from(u16::from_be_bytes(len)), 0);
    s.read_exact(buf).await.unwrap();
}

/// The Noise XX handshake, unbuffered.
async fn snow_handshake(s: &mut TcpStream, initiator: bool) -> snow::TransportState {
    let key = snow_builder(&[0; 32]).generate_keypair().unwrap().private;
    let (mut out, mut msg) = (vec![0u8; 65535], Vec::new());
    let hs = if initiator {
        let mut hs = snow_builder(&key).build_initiator().unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        write_framed(s, &out[..n]).await;
        read_framed(s, &mut msg).await;
        hs.read_message(&msg, &mut out).unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        write_framed(s, &out[..n]).await;
        hs
    } else {
        let mut hs = snow_builder(&key).build_responder().unwrap();
        read_framed(s, &mut msg).await;
        hs.read_message(&msg, &mut out).unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        write_framed(s, &out[..n]).await;
        read_framed(s, &mut msg).await;
        hs.read_message(&msg, &mut out).unwrap();
        hs
    };
    hs.into_transport_mode().unwrap()
}

/// The receiving end of a baseline: takes `count` messages of `size`
/// bytes and reports when the last one arrived.
async fn base_sink(
    base: Base,
    size: usize,
    count: u64,
    ready: oneshot::Sender<SocketAddr>,
) -> Instant {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    ready.send(listener.local_addr().unwrap()).unwrap();
    let (mut s, _) = listener.accept().await.unwrap();
    s.set_nodelay(true).unwrap();
    match base {
        Base::Transport => {
            let ep = Endpoint::new(
                Keypair::generate().unwrap(),
                TransportConfig::default(),
                ContactPolicy::AcceptAny,
            );
            let mut c = ep.accept(s).await.unwrap();
            for _ in 0..count {
                let r = c.recv().await.unwrap().unwrap();
                assert_eq!(r.len(), size);
            }
            Instant::now()
        }
        Base::Snow => {
            let mut t = snow_handshake(&mut s, false).await;
            let mut r = BufReader::with_capacity(64 * 1024, s);
            let (mut msg, mut plain) = (Vec::new(), vec![0u8; 65535]);
            for _ in 0..count {
                let mut got = 0;
                while got < size {
                    read_framed(&mut r, &mut msg).await;
                    got += t.read_message(&msg, &mut plain).unwrap();
                }
                assert_eq!(got, size);
            }
            Instant::now()
        }
        Base::Raw => {
            let mut r = BufReader::with_capacity(64 * 1024, s);
            let mut buf = vec![0u8; size];
            for _ in 0..count {
                let mut len = [0u8; 4];
                r.read_exact(&mut len).await.unwrap();
                assert_eq!(u32::from_be_bytes(len) as usize, size);
                r.read_exact(&mut buf).await.unwrap();
            }
            Instant::now()
        }
    }
}

/// One-way transfer of `count` messages of `size` bytes, from the client
/// end to a sink on `server`: the time from the first send to the last
/// message received.
async fn base_one_way(server: Handle, base: Base, size: usize, count: u64) -> Duration {
    let (ready_tx, ready_rx) = oneshot::channel();
    let sink = server.spawn(base_sink(base, size, count, ready_tx));
    let mut s = TcpStream::connect(ready_rx.await.unwrap()).await.unwrap();
    s.set_nodelay(true).unwrap();
    let payload = vec![0x5au8; size];
    let start;
    match base {
        Base::Transport => {
            let ep = Endpoint::new(
                Keypair::generate().unwrap(),
                TransportConfig::default(),
                ContactPolicy::AcceptAny,
            );
            let c = ep.connect(s, None).await.unwrap();
            let record = Bytes::from(payload);
            start = Instant::now();
            for _ in 0..count {
                c.send(record.clone()).await.unwrap();
            }
            let end = sink.await.unwrap_or_else(|_| panic!("sink failed"));
            c.close("").await.unwrap();
            return end - start;
        }
        Base::Snow => {
            let mut t = snow_handshake(&mut s, true).await;
            let mut out = vec![0u8; 2 + 65535];
            start = Instant::now();
            for _ in 0..count {
                for part in payload.chunks(SNOW_MAX_PLAIN) {
                    let n = t.write_message(part, &mut out[2..]).unwrap();
                    out[..2].copy_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
                    s.write_all(&out[..2 + n]).await.unwrap();
                }
            }
        }
        Base::Raw => {
            let mut w = BufWriter::with_capacity(64 * 1024, s);
            start = Instant::now();
            for _ in 0..count {
                w.write_all(&u32::try_from(size).unwrap().to_be_bytes())
                    .await
                    .unwrap();
                w.write_all(&payload).await.unwrap();
            }
            w.flush().await.unwrap();
        }
    }
    sink.await.unwrap() - start
}

// ---------------------------------------------------------------------------
// capwire

/// The server node of a placement, and the client nodes that call it.
struct Nodes {
    server: Node,
    arrivals: Arc<Arrivals>,
    /// A client with default limits, and its peer.
    client: Node,
    peer: Peer,
    /// Other clients, stopped at the end.
    others: Vec<Node>,
}

fn start_server(p: &Placement) -> (Node, Arc<Arrivals>) {
    let arrivals = Arc::new(Arrivals::default());
    let state = arrivals.clone();
    let server = run_on(&p.server, async move {
        Node::builder("bench-server")
            .listen("127.0.0.1:0".parse().unwrap())
            .capability(capability())
            .state(state)
            .start()
            .await
            .unwrap()
    });
    (server, arrivals)
}

/// `count` client nodes with `limits` on the client end, each with a
/// session to `server`.
fn clients(p: &Placement, server: &Node, limits: &Limits, count: usize) -> Vec<(Node, Peer)> {
    let (addr, id, limits) = (server.local_addrs()[0].clone(), server.id(), limits.clone());
    run_on(&p.client, async move {
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let client = Node::builder("bench-client")
                .limits(limits.clone())
                .start()
                .await
                .unwrap();
            let peer = client.connect(&addr, Some(id)).await.unwrap();
            out.push((client, peer));
        }
        out
    })
}

impl Nodes {
    fn start(p: &Placement) -> Self {
        let (server, arrivals) = start_server(p);
        let (client, peer) = clients(p, &server, &Limits::default(), 1).pop().unwrap();
        Self {
            server,
            arrivals,
            client,
            peer,
            others: Vec::new(),
        }
    }

    /// A client node of its own with `limits`: its peer.
    fn client_with(&mut self, p: &Placement, limits: &Limits) -> Peer {
        let (node, peer) = clients(p, &self.server, limits, 1).pop().unwrap();
        self.others.push(node);
        peer
    }

    fn stop(self, p: &Placement) {
        let Self {
            server,
            client,
            others,
            ..
        } = self;
        run_on(&p.client, async move {
            for n in others {
                n.shutdown().await;
            }
            client.shutdown().await;
        });
        run_on(&p.server, async move { server.shutdown().await });
    }
}

/// One stream of `count` items of `size` bytes, from opening it to its
/// end.
async fn stream_run(peer: Peer, size: usize, count: u64) -> Duration {
    let start = Instant::now();
    let mut s = peer
        .stream(Gen, (count, u32::try_from(size).unwrap()))
        .await
        .unwrap();
    let mut n = 0u64;
    while let Some(item) = s.next().await {
        assert_eq!(item.unwrap().0.len(), size);
        n += 1;
    }
    assert_eq!(n, count);
    start.elapsed()
}

/// `count` notifications of `size` bytes, until the last one was handled.
async fn notify_run(peer: Peer, arrivals: Arc<Arrivals>, size: usize, count: u64) -> Duration {
    let b = blob(size);
    let before = arrivals.count.load(Ordering::SeqCst);
    arrivals.target.store(before + count, Ordering::SeqCst);
    let reached = arrivals.reached.notified();
    tokio::pin!(reached);
    reached.as_mut().enable();
    let start = Instant::now();
    for _ in 0..count {
        peer.notify(Note, b.clone()).await.unwrap();
    }
    reached.await;
    start.elapsed()
}

// ---------------------------------------------------------------------------
// Figures

/// The `p`-quantile of sorted samples.
fn quantile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

// ---------------------------------------------------------------------------
// small and large: one stream against one-way baselines

/// One row: the stream and its baselines, best of `opts.runs`
/// interleaved runs, in items/s (`small`) or bytes/s (`large`).
fn one_stream(opts: &Opts, p: &Placement, nodes: &Nodes, size: usize) {
    let large = size == LARGE;
    let count = if large {
        opts.count(4_000, 300)
    } else {
        opts.count(1_000_000, 50_000)
    };
    // [stream, notify or transport, snow, raw]
    let mut best: [Option<f64>; 4] = [None; 4];
    let names = if large {
        ["capwire", "transport", "snow", "raw"]
    } else {
        ["capwire", "notify", "snow", "raw"]
    };
    let per = |t: Duration| {
        if large {
            rate(count * size as u64, t)
        } else {
            rate(count, t)
        }
    };
    for _ in 0..opts.runs {
        for (i, name) in names.iter().enumerate() {
            if !wanted(&list("CAPWIRE_BENCH_STACK"), name) {
                continue;
            }
            let t = match i {
                0 => run_on(&p.client, stream_run(nodes.peer.clone(), size, count)),
                1 if !large => run_on(
                    &p.client,
                    notify_run(nodes.peer.clone(), nodes.arrivals.clone(), size, count),
                ),
                _ => {
                    let base = [Base::Transport, Base::Transport, Base::Snow, Base::Raw][i];
                    run_on(&p.client, base_one_way(p.server.clone(), base, size, count))
                }
            };
            keep_best(&mut best[i], per(t), true);
        }
    }
    let [c, b1, s, r] = best;
    if large {
        let mib = f64::from(1 << 20);
        let target = c.map_or(String::new(), |c| {
            format!(">= 0.9 GB/s: {:.2} GB/s, {}", c / 1e9, verdict(c >= 0.9e9))
        });
        println!(
            "{:<6} {:<30} {:>9} {:>9} {:>9} {:>9}  {:<7} {:>8} {:>8}  {target}",
            p.name,
            format!("64 KiB items ({count})"),
            fig(c, mib),
            fig(b1, mib),
            fig(s, mib),
            fig(r, mib),
            "MiB/s",
            ratio(c, b1),
            ratio(c, s),
        );
    } else {
        let target = c.map_or(String::new(), |c| {
            format!(">= 1000 k/s: {:.2}x, {}", c / 1e6, verdict(c >= 1e6))
        });
        println!(
            "{:<6} {:<30} {:>9} {:>9} {:>9} {:>9}  {:<7} {:>8} {:>8}  {target}",
            p.name,
            format!("64 B items ({count})"),
            fig(c, 1e3),
            fig(b1, 1e3),
            fig(s, 1e3),
            fig(r, 1e3),
            "k/s",
            ratio(c, b1),
            ratio(c, s),
        );
    }
}

// ---------------------------------------------------------------------------
// first: time to the first item against a round trip

/// `n` pairs, one of each in turn: (median round trip, median time to
/// the first item), in µs.
async fn first_run(peer: Peer, n: u64) -> (f64, f64) {
    let payload = blob(SMALL);
    let (mut rtt, mut first) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let start = Instant::now();
        let back = peer.request(Echo, payload.clone()).await.unwrap();
        rtt.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(back.0.len(), SMALL);

        let start = Instant::now();
        let mut s = peer
            .stream(Gen, (1, u32::try_from(SMALL).unwrap()))
            .await
            .unwrap();
        let item = s.next().await.unwrap().unwrap();
        first.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(item.0.len(), SMALL);
        assert!(s.next().await.is_none());
    }
    (median(rtt), median(first))
}

fn first_item(opts: &Opts, p: &Placement, nodes: &Nodes) {
    let n = opts.count(10_000, 500);
    let (mut rtt, mut first) = (None, None);
    for _ in 0..opts.runs {
        let (r, f) = run_on(&p.client, first_run(nodes.peer.clone(), n));
        keep_best(&mut rtt, r, false);
        keep_best(&mut first, f, false);
    }
    let target = match (first, rtt) {
        (Some(f), Some(r)) => format!("<= 1.10x the round trip: {}", verdict(f / r <= 1.1)),
        _ => String::new(),
    };
    println!(
        "{:<6} {:<30} {:>9} {:>9}  {:<7} {:>8}  {target}",
        p.name,
        format!("first item, 64 B ({n})"),
        fig(first, 1.0),
        fig(rtt, 1.0),
        "µs",
        ratio(first, rtt),
    );
}

// ---------------------------------------------------------------------------
// many: concurrent streams

/// How the producers of `many_run` pace themselves: `burst` items every
/// `period_us` (0: as fast as credit allows).
#[derive(Clone, Copy)]
struct Pace {
    period_us: u64,
    burst: u64,
}

const FLAT_OUT: Pace = Pace {
    period_us: 0,
    burst: 0,
};

/// A pace for `streams` producers making `rate` items/s in all, with at
/// most 50,000 timer wake-ups a second over all of them (more would
/// cost more than the items).
fn pace(streams: usize, rate: f64) -> Pace {
    let per_stream = rate / streams as f64;
    let period = (streams as f64 / 50_000.0).max(1.0 / per_stream).max(1e-3);
    Pace {
        period_us: (period * 1e6).round() as u64,
        burst: (per_stream * period).round().max(1.0) as u64,
    }
}

/// What one `many_run` saw.
struct ManyRun {
    /// From the first open until every stream had its ready item.
    open: Duration,
    /// From the go until every stream ended.
    elapsed: Duration,
    /// Latencies of the items after the go, ns, sorted.
    lat: Vec<u64>,
}

/// `per_peer` streams on each of `peers`, each consumed by a task of its
/// own: all are opened and have their ready item, then the producers are
/// told to go and send `items` stamped items each at `pace`.
async fn many_run(peers: Vec<Peer>, per_peer: usize, items: u64, pace: Pace) -> ManyRun {
    let generation = GENERATION.fetch_add(1, Ordering::SeqCst) + 1;
    let ready = Arc::new(Barrier::new(peers.len() * per_peer + 1));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(peers.len() * per_peer);
    for peer in &peers {
        for _ in 0..per_peer {
            let (peer, ready) = (peer.clone(), ready.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = peer
                    .stream(Stamped, (items, pace.period_us, pace.burst, generation))
                    .await
                    .unwrap();
                let (zero, _) = s.next().await.unwrap().unwrap();
                assert_eq!(zero, 0, "the ready item");
                ready.wait().await;
                let mut lat = Vec::with_capacity(usize::try_from(items).unwrap());
                while let Some(item) = s.next().await {
                    let (t, pad) = item.unwrap();
                    lat.push(now_ns().saturating_sub(t));
                    assert_eq!(pad.0.len(), STAMP_PAD);
                }
                assert_eq!(lat.len() as u64, items);
                lat
            }));
        }
    }
    ready.wait().await;
    let open = start.elapsed();
    let go = Instant::now();
    GO.send_replace(generation);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = go.elapsed();
    lat.sort_unstable();
    ManyRun { open, elapsed, lat }
}

struct ManyFigures {
    open: Duration,
    rate: f64,
    p50_us: f64,
    p99_us: f64,
}

fn figures(total: u64, run: ManyRun) -> ManyFigures {
    ManyFigures {
        open: run.open,
        rate: rate(total, run.elapsed),
        p50_us: quantile(&run.lat, 0.5) as f64 / 1e3,
        p99_us: quantile(&run.lat, 0.99) as f64 / 1e3,
    }
}

/// How many streams one session opens with default limits, and why the
/// next one does not.
async fn streams_that_open(peer: Peer, max: usize) -> (usize, String) {
    let mut open = Vec::new();
    while open.len() < max {
        // Generation `u64::MAX` never goes: the handlers wait until the
        // streams are dropped.
        match peer.stream(Stamped, (1, 0, 0, u64::MAX)).await {
            Ok(s) => open.push(s),
            Err(e) => return (open.len(), e.to_string()),
        }
    }
    (max, "none".into())
}

fn many(opts: &Opts, p: &Placement, nodes: &mut Nodes) {
    let total = opts.count(1_000_000, 100_000);
    let defaults = Limits::default();
    let (opened, why) = run_on(&p.client, streams_that_open(nodes.peer.clone(), 1000));
    println!(
        "{:<6} {:<30} {opened} streams open at once on one session, the next: {why}",
        p.name, "with default limits"
    );
    for (sessions, per_session) in [(1usize, 1000usize), (100, 100)] {
        let streams = sessions * per_session;
        let per_stream = (total / streams as u64).max(1);
        let total = per_stream * streams as u64;
        // The window each stream may hold, over all the session's streams,
        // must fit the session's bound on windows.
        let need = per_session * defaults.stream_window_bytes as usize;
        let limits = Limits {
            max_stream_window_bytes_per_session: need
                .max(defaults.max_stream_window_bytes_per_session),
            ..Limits::default()
        };
        let raised = need > defaults.max_stream_window_bytes_per_session;
        let peers: Vec<Peer> = clients(p, &nodes.server, &limits, sessions)
            .into_iter()
            .map(|(node, peer)| {
                nodes.others.push(node);
                peer
            })
            .collect();
        let (mut one, mut sat, mut paced): (Option<f64>, Option<ManyFigures>, Option<ManyFigures>) =
            (None, None, None);
        for _ in 0..opts.runs {
            let t = run_on(&p.client, stream_run(nodes.peer.clone(), SMALL, total));
            keep_best(&mut one, rate(total, t), true);
            let f = figures(
                total,
                run_on(
                    &p.client,
                    many_run(peers.clone(), per_session, per_stream, FLAT_OUT),
                ),
            );
            // Paced at half this run's saturated rate, for about as long.
            let paced_items = (per_stream / 2).max(1);
            let g = figures(
                paced_items * streams as u64,
                run_on(
                    &p.client,
                    many_run(
                        peers.clone(),
                        per_session,
                        paced_items,
                        pace(streams, f.rate / 2.0),
                    ),
                ),
            );
            if sat.as_ref().is_none_or(|b| f.rate > b.rate) {
                sat = Some(f);
            }
            if paced.as_ref().is_none_or(|b| g.p99_us < b.p99_us) {
                paced = Some(g);
            }
        }
        let (sat, paced) = (sat.unwrap(), paced.unwrap());
        println!(
            "{:<6} {:<30} {:>7.1} k/s ({:.2}x one stream's {:.1} k/s), latency p50 {:.0} µs, \
             p99 {:.0} µs; all open in {:.0} ms{}",
            p.name,
            format!("{streams} streams / {sessions} sess."),
            sat.rate / 1e3,
            sat.rate / one.unwrap(),
            one.unwrap() / 1e3,
            sat.p50_us,
            sat.p99_us,
            sat.open.as_secs_f64() * 1e3,
            if raised {
                format!(
                    " (max_stream_window_bytes_per_session raised to {} MiB)",
                    need >> 20
                )
            } else {
                String::new()
            }
        );
        println!(
            "{:<6} {:<30} {:>7.1} k/s, latency p50 {:.0} µs, p99 {:.0} µs",
            "",
            "  paced at half that rate",
            paced.rate / 1e3,
            paced.p50_us,
            paced.p99_us,
        );
    }
}

// ---------------------------------------------------------------------------
// window: throughput over a range of windows

const ITEM_WINDOWS: [u32; 10] = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
const BYTE_WINDOWS: [u32; 7] = [
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
];

/// One window of the sweep: its client, and what each run measured.
struct WindowRow {
    window: u32,
    peer: Peer,
    runs: Vec<f64>,
}

/// Measures every row once per run, the rows of a run one after the
/// other (in an order rotated from run to run), so that each run's rows
/// share its load; each row's figure is then judged against the best
/// row of the same run.
fn sweep(p: &Placement, rows: &mut [WindowRow], runs: usize, size: usize, count: u64) {
    for r in 0..runs {
        let k = rows.len();
        for i in 0..k {
            let row = &mut rows[(i + r) % k];
            let t = run_on(&p.client, stream_run(row.peer.clone(), size, count));
            let per = if size == LARGE {
                count * size as u64
            } else {
                count
            };
            row.runs.push(rate(per, t));
        }
    }
}

fn print_sweep(p: &Placement, rows: &[WindowRow], large: bool) {
    let defaults = Limits::default();
    let runs = rows[0].runs.len();
    // Each row's share of its run's best row, then the median over runs.
    let share: Vec<f64> = rows
        .iter()
        .map(|row| {
            median(
                (0..runs)
                    .map(|r| {
                        let top = rows.iter().map(|x| x.runs[r]).fold(0.0, f64::max);
                        row.runs[r] / top
                    })
                    .collect(),
            )
        })
        .collect();
    let top = share.iter().copied().fold(0.0, f64::max);
    let pick = rows
        .iter()
        .zip(&share)
        .find(|(_, s)| **s >= 0.95 * top)
        .map(|(r, _)| r.window);
    for (row, s) in rows.iter().zip(&share) {
        let best = row.runs.iter().copied().fold(0.0, f64::max);
        let w = row.window;
        let (label, figure, budget) = if large {
            (
                format!(
                    "bytes {:>5} KiB ({} x 64 KiB)",
                    w >> 10,
                    u64::from(w) / (LARGE as u64 + 5)
                ),
                format!("{:>7.1} MiB/s", best / f64::from(1 << 20)),
                format!(
                    "  {} streams fit a session's {} MiB",
                    defaults.max_stream_window_bytes_per_session / w as usize,
                    defaults.max_stream_window_bytes_per_session >> 20
                ),
            )
        } else {
            let bytes = defaults.stream_window_bytes;
            let fit = bytes / (SMALL as u32 + 2);
            (
                format!("items {w:>5}"),
                format!("{:>7.1} k/s  ", best / 1e3),
                if w > fit {
                    format!("  ({} KiB of window binds: {fit} items)", bytes >> 10)
                } else {
                    String::new()
                },
            )
        };
        println!(
            "{:<6} {:<30} best {figure}  median {:.2} of its run's best{}{budget}",
            p.name,
            format!("{} {label}", if large { "64 KiB," } else { "64 B," }),
            s / top,
            if Some(w) == pick {
                "  <- smallest within 5%"
            } else {
                "                       "
            },
        );
    }
}

fn window(opts: &Opts, p: &Placement, nodes: &mut Nodes) {
    // Many windows' worth of items in each run, so that what is measured
    // is the credit loop, not the first window's head start.
    let small_n = opts.count(500_000, 50_000);
    let large_n = opts.count(1_500, 200);
    // Differences of a few percent need more runs than the other figures.
    let runs = if opts.quick || std::env::var_os("CAPWIRE_BENCH_RUNS").is_some() {
        opts.runs
    } else {
        opts.runs.max(9)
    };
    // 64 B items over item windows with the default bytes window (which
    // binds once it holds fewer 64 B items than the item window); 64 KiB
    // items over bytes windows with an item window that never binds.
    let bytes = Limits::default().stream_window_bytes;
    let mut small: Vec<WindowRow> = ITEM_WINDOWS
        .iter()
        .map(|&items| {
            let limits = Limits {
                stream_window_items: items,
                stream_window_bytes: bytes,
                ..Limits::default()
            };
            WindowRow {
                window: items,
                peer: nodes.client_with(p, &limits),
                runs: Vec::new(),
            }
        })
        .collect();
    let mut large: Vec<WindowRow> = BYTE_WINDOWS
        .iter()
        .map(|&bytes| {
            let limits = Limits {
                stream_window_items: 1024,
                stream_window_bytes: bytes,
                ..Limits::default()
            };
            WindowRow {
                window: bytes,
                peer: nodes.client_with(p, &limits),
                runs: Vec::new(),
            }
        })
        .collect();
    sweep(p, &mut small, runs, SMALL, small_n);
    print_sweep(p, &small, false);
    sweep(p, &mut large, runs, LARGE, large_n);
    print_sweep(p, &large, true);
}

// ---------------------------------------------------------------------------

fn main() {
    let opts = Opts::from_env();
    LazyLock::force(&EPOCH);
    println!(
        "capwire streams vs baselines, loopback, best of {} interleaved runs{}",
        opts.runs,
        if opts.quick { " (quick)" } else { "" }
    );
    println!("  shared: both ends on one 2-worker tokio runtime");
    println!(
        "  split:  each end on its own current-thread runtime and OS thread \
         (client node and consumer | server node and producer)"
    );
    let d = Limits::default();
    println!(
        "  default window: {} items, {} KiB",
        d.stream_window_items,
        d.stream_window_bytes >> 10
    );
    let section = |name: &str| wanted(&opts.sections, name);
    let mut placements = Vec::new();
    if wanted(&opts.placements, "shared") {
        placements.push(Placement::shared(false));
    }
    if wanted(&opts.placements, "split") {
        placements.push(Placement::split());
    }
    let mut nodes: Vec<Nodes> = placements.iter().map(Nodes::start).collect();
    if section("small") {
        println!(
            "{:<6} {:<30} {:>9} {:>9} {:>9} {:>9}  {:<7} {:>8} {:>8}  target",
            "",
            "one stream, one session",
            "stream",
            "notify",
            "snow",
            "raw tcp",
            "unit",
            "/notify",
            "/snow"
        );
        for (p, n) in placements.iter().zip(&nodes) {
            one_stream(&opts, p, n, SMALL);
        }
    }
    if section("large") {
        println!(
            "{:<6} {:<30} {:>9} {:>9} {:>9} {:>9}  {:<7} {:>8} {:>8}  target",
            "",
            "one stream, one session",
            "stream",
            "transport",
            "snow",
            "raw tcp",
            "unit",
            "/transp.",
            "/snow"
        );
        for (p, n) in placements.iter().zip(&nodes) {
            one_stream(&opts, p, n, LARGE);
        }
    }
    if section("first") {
        println!(
            "{:<6} {:<30} {:>9} {:>9}  {:<7} {:>8}  target",
            "", "sequential, one at a time", "stream", "request", "unit", "/request"
        );
        for (p, n) in placements.iter().zip(&nodes) {
            first_item(&opts, p, n);
        }
    }
    if section("many") {
        println!("concurrent streams of 64 B items (p99: from made to taken)");
        for (p, n) in placements.iter().zip(&mut nodes) {
            many(&opts, p, n);
        }
    }
    if section("window") {
        println!(
            "throughput by window, one stream: each window once per run, the rows of a run \
             together; best figure, and the median over runs of its share of its run's best"
        );
        for (p, n) in placements.iter().zip(&mut nodes) {
            window(&opts, p, n);
        }
    }
    for (p, n) in placements.iter().zip(nodes) {
        n.stop(p);
    }
}
