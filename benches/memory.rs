//! Memory of a node, with `stats_alloc` counting every heap allocation
//! (live heap = bytes allocated - bytes freed) and RSS read from
//! `/proc/self/status`. Its sections:
//!
//! - `idle`: heap per idle session, per side. The dialling side and the
//!   listening side run in separate processes (this binary starts itself
//!   again with `--serve K` for the listening side), so each side's heap
//!   is its own. Two layouts, N sessions each: N client nodes dialling
//!   one server node, and one client node dialling N server nodes. The
//!   heap with the nodes up and no session is subtracted; each session
//!   makes one 64 B call and is measured 200 ms after it and, in another
//!   run, after 3 s of silence (a session gives back buffers grown past
//!   2 KiB 50 ms after it last used them, the rest after 2 s quiet). Baselines from the same run: an idle
//!   raw tokio TCP connection and an idle snow session, each end a task
//!   that owns its stream (and Noise state) and waits to read.
//! - `ledger`: the replay ledger under sustained load: 128 requests in
//!   flight for 10 s against a node with default limits (one process);
//!   requests answered and refused, `Node::ledger_sizes()`, heap per
//!   remembered entry against what the ledger charges, heap and RSS.
//! - `fanin`: 1,000 client nodes (one session each) dial one listening
//!   node (its own process, default limits) at once, twice: each calling
//!   `Node::connect` once, then each retrying a failed connect; time to
//!   establish all, per-connect latency, failures by error, the server's
//!   heap and RSS before and after.
//! - `scale`: 10,000 client nodes (one session each) dial one listening
//!   node (its own process) at a paced 1,000 connects/s: per-connect
//!   latency (p50, p99, max), the server's heap and RSS per session at a
//!   quarter, a half and all of them (each after 3 s quiet: linear in
//!   sessions?), and both processes' CPU over 10 s with nothing sent (no
//!   per-session timer but the 15 s keepalive). Needs `ulimit -n` of at
//!   least 10,100 in each process (it says so, and skips, when lower);
//!   `CAPWIRE_BENCH_SCALE_N` sets the count, `CAPWIRE_BENCH_SCALE_PACE`
//!   the pace.
//! - `streams`: heap per open stream (protocol 2), per side, N streams on
//!   one session with the callee in its own process: beside N pending
//!   requests (the baseline), N idle streams (open, no item yet), N
//!   streams whose callee sent a full window of 64 B items the caller has
//!   not taken (heap beyond the items' bytes), what is left once all
//!   ended; and the caller's heap for one slow stream's full window whose
//!   items arrived among a bulk stream's.
//! - `tasks`: heap per held task (protocol 2), per side, N tasks from one
//!   session with the worker in its own process, once with each store
//!   (in memory; redb in a state directory): beside N pending requests
//!   (the baseline), N tasks whose handlers asked a question and wait for
//!   its answer (`input_required`), the same N once cancelled (ended,
//!   kept for their retention), and what is left once the retention
//!   passed; twice, and the second round's growth over the first (kept
//!   capacity is reused, a leak grows again).
//! - `slow`: one stream whose producer goes as fast as credit allows and
//!   whose consumer takes 10 items/s, for 10 s (`--slow`: 60 s): items
//!   sent and not taken (at most the window), the caller's buffered
//!   items, the callee's send queue and credit stalls, both heaps, once a
//!   second.
//!
//! `cargo bench --bench memory` runs all (about four minutes); `--quick` or
//! `CAPWIRE_BENCH_QUICK=1` runs small sizes (under a minute: the idle
//! sessions still need 2.5 s to become quiet, and ended tasks their 8 s
//! of retention).
//! `CAPWIRE_BENCH_ONLY=idle,ledger,fanin,scale,streams,tasks,slow` picks
//! sections; `CAPWIRE_BENCH_N` sets N for `idle`, `streams` and `tasks`
//! and the session count
//! for `fanin`; `CAPWIRE_BENCH_SECS` the length of the `ledger` and `slow`
//! runs.
//!
//! Each process needs one file descriptor per session and a few more:
//! `fanin` needs `ulimit -n` of at least 1,100 (it says so, and skips,
//! when the limit is lower).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use capwire::manifest::TaskState;
use capwire::manifest::verb;
use capwire::transport::{PROLOGUE, PROTOCOL_NAME};
use capwire::{
    Addr, CallError, Capability, HandlerError, ItemStream, Items, Limits, Node, NodeId, Peer, Task,
    TaskHandle,
};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

verb! { /** Echo. */ pub struct Echo: request "app.bench" / "echo", Bootstrap, String => String; }
verb! { /** Opens and sends nothing: an idle stream. */
pub struct Hold: stream "app.bench.streams" / "hold", Bootstrap, () => String; }
verb! { /** Sends this many 64 B items, then sends nothing more. */
pub struct Fill: stream "app.bench.streams" / "fill", Bootstrap, u32 => String; }
verb! { /** Sends 64 B items as fast as credit allows, until cancelled. */
pub struct Flood: stream "app.bench.streams" / "flood", Bootstrap, () => String; }
verb! { /** Sends `count` 64 B items, one per `period` ms, then sends nothing more. */
pub struct Drip: stream "app.bench.streams" / "drip", Bootstrap, (u32, u64) => String; }
verb! { /** Sends this many 64 KiB items, as fast as credit allows. */
pub struct Bulk: stream "app.bench.streams" / "bulk", Bootstrap, u32 => String; }
verb! { /** Answers never: the baseline of an idle stream, a pending call. */
pub struct Wait: request "app.bench.streams" / "wait", Bootstrap, () => String; }

verb! { /** Asks a question and waits for its answer: a held task. */
pub struct Held: task "app.bench.tasks" / "held", Bootstrap, () => String; }

const PAYLOAD: usize = 64;
const WINDOW: usize = 128;
/// Longer than the 2 s after which a quiet session returns its buffers.
const QUIET: Duration = Duration::from_secs(3);
/// The same, with less margin, for quick runs.
const QUIET_QUICK: Duration = Duration::from_millis(2500);

fn quiet(quick: bool) -> Duration {
    if quick { QUIET_QUICK } else { QUIET }
}

async fn echo(args: String) -> Result<String, HandlerError> {
    Ok(args)
}

async fn hold_open(_: (), _items: Items<String>) -> Result<(), HandlerError> {
    std::future::pending().await
}

async fn fill(n: u32, mut items: Items<String>) -> Result<(), HandlerError> {
    let item = "x".repeat(PAYLOAD);
    for _ in 0..n {
        items.send(item.clone()).await?;
    }
    std::future::pending().await
}

async fn flood(_: (), mut items: Items<String>) -> Result<(), HandlerError> {
    let item = "x".repeat(PAYLOAD);
    loop {
        items.send(item.clone()).await?;
    }
}

async fn drip(
    (count, period_ms): (u32, u64),
    mut items: Items<String>,
) -> Result<(), HandlerError> {
    let item = "x".repeat(PAYLOAD);
    let mut tick = tokio::time::interval(Duration::from_millis(period_ms));
    for _ in 0..count {
        tick.tick().await;
        items.send(item.clone()).await?;
    }
    std::future::pending().await
}

async fn bulk(count: u32, mut items: Items<String>) -> Result<(), HandlerError> {
    let item = "x".repeat(64 * 1024);
    for _ in 0..count {
        items.send(item.clone()).await?;
    }
    Ok(())
}

async fn wait(_: ()) -> Result<String, HandlerError> {
    std::future::pending().await
}

/// The stream verbs, and the request that never answers.
fn stream_capability() -> Capability {
    Capability::new("app.bench.streams", "1.0.0")
        .unwrap()
        .stream(Hold, hold_open)
        .stream(Fill, fill)
        .stream(Flood, flood)
        .stream(Drip, drip)
        .stream(Bulk, bulk)
        .handle(Wait, wait)
}

async fn held(_: (), task: Task) -> Result<String, HandlerError> {
    let answer: String = task.ask("go on?", Duration::from_secs(3600)).await?;
    Ok(answer)
}

/// The held task (served beside the stream verbs, whose `wait` is the
/// baseline).
fn task_capability() -> Capability {
    Capability::new("app.bench.tasks", "1.0.0")
        .unwrap()
        .task(Held, held)
}

fn echo_capability() -> Capability {
    Capability::new("app.bench", "1.0.0")
        .unwrap()
        .handle(Echo, echo)
}

// ---------------------------------------------------------------------------
// Measuring

/// Heap and RSS of this process at one moment.
#[derive(Clone, Copy, Debug)]
struct Mem {
    /// Live heap bytes.
    heap: i64,
    /// Live heap blocks.
    blocks: i64,
    rss_kib: i64,
}

impl Mem {
    fn now() -> Self {
        let s = INSTRUMENTED_SYSTEM.stats();
        Self {
            heap: to_i64(s.bytes_allocated) - to_i64(s.bytes_deallocated),
            blocks: to_i64(s.allocations) - to_i64(s.deallocations),
            rss_kib: status_kib("VmRSS:"),
        }
    }

    fn line(self) -> String {
        format!("{} {} {}", self.heap, self.blocks, self.rss_kib)
    }

    fn parse(words: &[&str]) -> Self {
        Self {
            heap: words[0].parse().unwrap(),
            blocks: words[1].parse().unwrap(),
            rss_kib: words[2].parse().unwrap(),
        }
    }
}

fn to_i64(v: usize) -> i64 {
    i64::try_from(v).unwrap()
}

/// A `kB` line of `/proc/self/status` (0 where there is none).
fn status_kib(key: &str) -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
        })
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// The soft limit on open files, from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn kib(bytes: f64) -> String {
    format!("{:.1} KiB", bytes / 1024.0)
}

fn two_workers() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` as a task on `h` and waits for it: the work runs on the
/// runtime's workers, never on the thread that waits.
fn run_on<F>(h: &Handle, f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    h.block_on(h.spawn(f)).expect("benchmark task failed")
}

// ---------------------------------------------------------------------------
// The listening side, in a process of its own

/// `--serve K [PER_SOURCE]`: starts K listening nodes with default limits
/// (or with `max_handshakes_per_source` set to PER_SOURCE), prints
/// `ready HEAP_EMPTY HEAP_NODES ID ADDR...`, then answers `measure` with
/// `mem HEAP BLOCKS RSS_KIB SESSIONS REFUSED ...` until `quit`.
///
/// `tasks`: the node also serves the held task, with a task retention of
/// [`TASK_RETENTION`], its state in memory (`memory`) or in a state
/// directory (`redb`).
fn serve(
    k: usize,
    per_source: Option<usize>,
    streams: bool,
    tasks: Option<&str>,
    scale: Option<usize>,
) {
    let rt = two_workers();
    let mut limits = Limits {
        max_handshakes_per_source: per_source
            .unwrap_or(Limits::default().max_handshakes_per_source),
        ..Limits::default()
    };
    if let Some(n) = scale {
        // Room for `n` sessions, accepted faster than the bench paces.
        limits.max_inbound_sessions = n + 64;
        limits.accept_rate = SCALE_ACCEPT_RATE;
    }
    if tasks.is_some() {
        limits.task_retention = TASK_RETENTION;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = (tasks == Some("redb")).then(|| tmp.path().join("state"));
    let with_tasks = tasks.is_some();
    let empty = Mem::now();
    let nodes: Vec<Node> = run_on(rt.handle(), async move {
        let mut nodes = Vec::with_capacity(k);
        for _ in 0..k {
            let mut builder = Node::builder("bench-server")
                .listen("127.0.0.1:0".parse().unwrap())
                .capability(echo_capability())
                .limits(limits.clone());
            if streams {
                builder = builder.capability(stream_capability());
            }
            if with_tasks {
                builder = builder.capability(task_capability());
            }
            if let Some(dir) = &state {
                builder = builder.state_dir(dir);
            }
            nodes.push(builder.start().await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        nodes
    });
    let up = Mem::now();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| n.local_addrs()[0].to_string())
        .collect();
    println!(
        "ready {} {} {} {}",
        empty.line(),
        up.line(),
        nodes[0].id(),
        addrs.join(" ")
    );
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().trim() {
            "measure" => {
                let sessions: usize = nodes.iter().map(|n| n.connected_peers().len()).sum();
                let refused: u64 = nodes.iter().map(Node::refused_connections).sum();
                let st = nodes[0].stats();
                let held = st
                    .tasks
                    .iter()
                    .find(|(s, _)| *s == TaskState::InputRequired)
                    .map_or(0, |(_, n)| *n);
                let kept: usize = st.tasks.iter().map(|(_, n)| n).sum();
                let ledger = nodes[0].ledger_sizes();
                println!(
                    "mem {} {sessions} {refused} {} {} {} {} {} {held} {kept} {} {}",
                    Mem::now().line(),
                    st.streams_served,
                    st.queued_bytes,
                    st.stream_items_sent,
                    st.stream_credit_stalls,
                    st.inflight,
                    ledger.remembered + ledger.forgotten,
                    ledger.bytes,
                );
            }
            _ => break,
        }
    }
    run_on(rt.handle(), async move {
        let mut stops: FuturesUnordered<_> = nodes
            .iter()
            .map(|n| {
                let n = n.clone();
                async move { n.shutdown().await }
            })
            .collect();
        while stops.next().await.is_some() {}
    });
    drop(tmp);
    // The dialling side may be gone already.
    let _ = writeln!(std::io::stdout(), "bye");
}

/// The listening side, seen from the dialling side.
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Heap before and after its nodes started.
    empty: Mem,
    up: Mem,
    id: NodeId,
    addrs: Vec<Addr>,
}

/// What the listening side reported.
struct ServerMem {
    mem: Mem,
    sessions: usize,
    refused: u64,
    /// The first node's streams served, bytes queued to send, stream
    /// items sent, credit stalls, and peers' jobs in flight.
    streams_served: usize,
    queued_bytes: usize,
    items_sent: u64,
    stalls: u64,
    inflight: usize,
    /// Tasks waiting for an answer, and tasks kept in all.
    tasks_held: usize,
    tasks_kept: usize,
    /// The first node's replay ledger: finished requests remembered, and
    /// the bytes it charges for all it holds.
    ledger_entries: usize,
    ledger_bytes: usize,
}

impl Server {
    fn start(k: usize) -> Self {
        Self::start_with(k, None)
    }

    /// One node with room for `n` inbound sessions.
    fn start_scale(n: usize) -> Self {
        Self::spawn(vec!["--serve-scale".to_string(), n.to_string()])
    }

    /// User and system CPU time the server process has used.
    fn cpu(&self) -> Duration {
        cpu_of(&format!("/proc/{}/stat", self.child.id()))
    }

    /// One node that also serves the stream verbs.
    fn start_streams() -> Self {
        Self::spawn(vec!["--serve-streams".to_string()])
    }

    /// One node that also serves the stream verbs and the held task, its
    /// state in `store` (`memory` or `redb`).
    fn start_tasks(store: &str) -> Self {
        Self::spawn(vec!["--serve-tasks".to_string(), store.to_string()])
    }

    fn start_with(k: usize, per_source: Option<usize>) -> Self {
        let mut args = vec!["--serve".to_string(), k.to_string()];
        args.extend(per_source.map(|p| p.to_string()));
        Self::spawn(args)
    }

    fn spawn(args: Vec<String>) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"ready"), "server said {line:?}");
        Self {
            empty: Mem::parse(&words[1..4]),
            up: Mem::parse(&words[4..7]),
            id: words[7].parse().unwrap(),
            addrs: words[8..].iter().map(|a| a.parse().unwrap()).collect(),
            child,
            stdin,
            stdout,
        }
    }

    fn measure(&mut self) -> ServerMem {
        writeln!(self.stdin, "measure").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"mem"), "server said {line:?}");
        ServerMem {
            mem: Mem::parse(&words[1..4]),
            sessions: words[4].parse().unwrap(),
            refused: words[5].parse().unwrap(),
            streams_served: words[6].parse().unwrap(),
            queued_bytes: words[7].parse().unwrap(),
            items_sent: words[8].parse().unwrap(),
            stalls: words[9].parse().unwrap(),
            inflight: words[10].parse().unwrap(),
            tasks_held: words[11].parse().unwrap(),
            tasks_kept: words[12].parse().unwrap(),
            ledger_entries: words[13].parse().unwrap(),
            ledger_bytes: words[14].parse().unwrap(),
        }
    }

    fn stop(mut self) {
        writeln!(self.stdin, "quit").unwrap();
        let mut line = String::new();
        let _ = self.stdout.read_line(&mut line);
        let _ = self.child.wait();
    }
}

/// `count` client nodes with default limits.
async fn client_nodes(count: usize) -> Vec<Node> {
    let mut nodes = Vec::with_capacity(count);
    for _ in 0..count {
        nodes.push(Node::builder("bench-client").start().await.unwrap());
    }
    nodes
}

async fn shutdown_all(nodes: Vec<Node>) {
    let mut stops: FuturesUnordered<_> = nodes
        .into_iter()
        .map(|n| async move { n.shutdown().await })
        .collect();
    while stops.next().await.is_some() {}
}

// ---------------------------------------------------------------------------
// idle: heap per quiet session, per side

struct IdleFigures {
    client_node: f64,
    server_node: f64,
    client_session: f64,
    server_session: f64,
    client_blocks: f64,
    server_blocks: f64,
    server_rss_kib: f64,
}

/// `many_clients`: N client nodes dial one server node; otherwise one
/// client node dials N server nodes.
fn idle_layout(rt: &Runtime, n: usize, many_clients: bool, quiet: Duration) -> IdleFigures {
    let mut server = Server::start(if many_clients { 1 } else { n });
    let base = Mem::now();
    let clients = run_on(rt.handle(), async move {
        let nodes = client_nodes(if many_clients { n } else { 1 }).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        nodes
    });
    let (c0, s0) = (Mem::now(), server.measure());
    let targets: Vec<(Node, Addr)> = (0..n)
        .map(|i| {
            if many_clients {
                (clients[i].clone(), server.addrs[0].clone())
            } else {
                (clients[0].clone(), server.addrs[i].clone())
            }
        })
        .collect();
    let expected = many_clients.then_some(server.id);
    run_on(rt.handle(), async move {
        // One at a time: the figure is about sessions, not about dialling.
        // Each session makes one 64 B call.
        for (node, addr) in targets {
            let peer = node.connect(&addr, expected).await.unwrap();
            peer.request(Echo, "x".repeat(64)).await.unwrap();
        }
        tokio::time::sleep(quiet).await;
    });
    let (c1, s1) = (Mem::now(), server.measure());
    assert_eq!(s1.sessions, n, "sessions the server has");
    let per = |d: i64| d as f64 / n as f64;
    let nodes = if many_clients { n } else { 1 };
    let listeners = if many_clients { 1 } else { n };
    let figures = IdleFigures {
        client_node: (c0.heap - base.heap) as f64 / nodes as f64,
        server_node: (server.up.heap - server.empty.heap) as f64 / listeners as f64,
        client_session: per(c1.heap - c0.heap),
        server_session: per(s1.mem.heap - s0.mem.heap),
        client_blocks: per(c1.blocks - c0.blocks),
        server_blocks: per(s1.mem.blocks - s0.mem.blocks),
        server_rss_kib: per(s1.mem.rss_kib - s0.mem.rss_kib),
    };
    run_on(rt.handle(), shutdown_all(clients));
    server.stop();
    figures
}

/// The Noise XX handshake over one stream, unbuffered, 2-byte prefixes.
async fn snow_handshake(s: &mut TcpStream, initiator: bool) -> snow::TransportState {
    async fn send(s: &mut TcpStream, msg: &[u8]) {
        let mut framed = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(msg);
        s.write_all(&framed).await.unwrap();
    }
    async fn recv(s: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await.unwrap();
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut msg).await.unwrap();
        msg
    }
    let builder = || snow::Builder::new(PROTOCOL_NAME.parse().unwrap());
    let key = builder().generate_keypair().unwrap().private;
    let builder = builder()
        .local_private_key(&key)
        .unwrap()
        .prologue(PROLOGUE)
        .unwrap();
    let mut out = vec![0u8; 1024];
    let hs = if initiator {
        let mut hs = builder.build_initiator().unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        send(s, &out[..n]).await;
        hs.read_message(&recv(s).await, &mut out).unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        send(s, &out[..n]).await;
        hs
    } else {
        let mut hs = builder.build_responder().unwrap();
        hs.read_message(&recv(s).await, &mut out).unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        send(s, &out[..n]).await;
        hs.read_message(&recv(s).await, &mut out).unwrap();
        hs
    };
    hs.into_transport_mode().unwrap()
}

/// One end of an idle baseline connection: a task that owns the stream
/// (and the Noise state) and waits to read, with no buffer on the heap.
fn hold(mut s: TcpStream, noise: Option<snow::TransportState>, stop: Arc<Notify>) {
    tokio::spawn(async move {
        let noise = noise.map(Box::new);
        let mut byte = [0u8; 1];
        tokio::select! {
            r = s.read(&mut byte) => { let _ = r; }
            () = stop.notified() => {}
        }
        drop((s, noise));
    });
}

/// Heap per side of `n` idle baseline connections (both sides in this
/// process, so the figure is half the heap per connection).
fn idle_baseline(rt: &Runtime, n: usize, snow: bool) -> f64 {
    let stop = Arc::new(Notify::new());
    let stopper = stop.clone();
    let before = Mem::now();
    run_on(rt.handle(), async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        for _ in 0..n {
            let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
            let (mut a, mut b) = (a.unwrap(), b.unwrap().0);
            a.set_nodelay(true).unwrap();
            b.set_nodelay(true).unwrap();
            let (na, nb) = if snow {
                let (na, nb) =
                    tokio::join!(snow_handshake(&mut a, true), snow_handshake(&mut b, false));
                (Some(na), Some(nb))
            } else {
                (None, None)
            };
            hold(a, na, stop.clone());
            hold(b, nb, stop.clone());
        }
        drop(listener);
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    let after = Mem::now();
    stopper.notify_waiters();
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    (after.heap - before.heap) as f64 / (2 * n) as f64
}

fn idle(rt: &Runtime, quick: bool) {
    let n = env_usize("CAPWIRE_BENCH_N").unwrap_or(if quick { 20 } else { 200 });
    println!(
        "idle sessions: heap per session that made one 64 B call, 200 ms after it and after \
         {:.1} s quiet, node cost subtracted (target <= 16 KiB per side at both), N = {n}",
        quiet(quick).as_secs_f64()
    );
    println!(
        "  {:<32} {:>26} {:>26}",
        "", "dialling side", "listening side"
    );
    let raw = idle_baseline(rt, n, false);
    let snow = idle_baseline(rt, n, true);
    for (name, v) in [
        ("raw tokio TCP, a task per end", raw),
        ("snow session, a task per end", snow),
    ] {
        println!("  {name:<32} {:>26} {:>26}", kib(v), kib(v));
    }
    let mut layouts = vec![(format!("capwire: {n} client nodes -> 1"), true)];
    if !quick {
        layouts.push((format!("capwire: 1 client node -> {n}"), false));
    }
    let quiets = [Duration::from_millis(200), quiet(quick)];
    let layouts: Vec<(String, bool, Duration)> = layouts
        .into_iter()
        .flat_map(|(name, many)| quiets.map(|q| (format!("{name}, {} ms", q.as_millis()), many, q)))
        .collect();
    for (name, many_clients, quiet) in layouts {
        let f = idle_layout(rt, n, many_clients, quiet);
        let verdict = if f.client_session <= 16384.0 && f.server_session <= 16384.0 {
            "met"
        } else {
            "missed"
        };
        println!(
            "  {name:<32} {:>26} {:>26}  target {verdict}",
            format!("{} ({:.0} blocks)", kib(f.client_session), f.client_blocks),
            format!("{} ({:.0} blocks)", kib(f.server_session), f.server_blocks),
        );
        println!(
            "  {:<32} {:>26} {:>26}",
            "  ratio capwire/snow",
            format!("{:.1}x", f.client_session / snow),
            format!("{:.1}x", f.server_session / snow)
        );
        // Only the listening side's process is fresh: the dialling side's
        // RSS reuses what earlier sections freed.
        println!(
            "  {:<32} {:>26} {:>26}",
            "  RSS growth per session",
            "-",
            kib(f.server_rss_kib * 1024.0)
        );
        println!(
            "  {:<32} {:>26} {:>26}",
            "  heap per node, no session",
            kib(f.client_node),
            kib(f.server_node)
        );
    }
}

// ---------------------------------------------------------------------------
// ledger: the replay ledger under sustained pipelined load

fn ledger(rt: &Runtime, quick: bool) {
    let secs = env_usize("CAPWIRE_BENCH_SECS").unwrap_or(if quick { 2 } else { 10 });
    let run_for = Duration::from_secs(u64::try_from(secs).unwrap());
    println!(
        "replay ledger: {WINDOW} requests in flight for {secs} s, {PAYLOAD} B payload, \
         server with default limits (one process, 2 workers)"
    );
    let (server, client, peer) = run_on(rt.handle(), async {
        let server = Node::builder("bench-server")
            .listen("127.0.0.1:0".parse().unwrap())
            .capability(echo_capability())
            .start()
            .await
            .unwrap();
        let client = Node::builder("bench-client").start().await.unwrap();
        let peer = client
            .connect(&server.local_addrs()[0], Some(server.id()))
            .await
            .unwrap();
        (server, client, peer)
    });
    let before = Mem::now();
    let answered = Arc::new(AtomicU64::new(0));
    let (done, mut stopped) = tokio::sync::oneshot::channel::<()>();
    // Once a second: how the ledger and the heap grow.
    let sampler = {
        let (server, answered) = (server.clone(), answered.clone());
        rt.spawn(async move {
            let start = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = &mut stopped => break,
                }
                let l = server.ledger_sizes();
                let m = Mem::now();
                println!(
                    "  {:>5.1} s  answered {:>9}  remembered {:>8}  forgotten {:>8}  \
                     ledger {:>10}  heap {:>10}  rss {:>8}",
                    start.elapsed().as_secs_f64(),
                    answered.load(Ordering::Relaxed),
                    l.remembered,
                    l.forgotten,
                    kib(l.bytes as f64),
                    kib(m.heap as f64),
                    kib(m.rss_kib as f64 * 1024.0),
                );
            }
        })
    };
    let counter = answered.clone();
    let (elapsed, refused, first_refusal, failures) = run_on(rt.handle(), async move {
        let payload = "x".repeat(PAYLOAD);
        let start = Instant::now();
        let mut in_flight = FuturesUnordered::new();
        let mut refused = 0u64;
        let mut first_refusal = None;
        let mut failures: BTreeMap<String, u64> = BTreeMap::new();
        loop {
            while in_flight.len() < WINDOW && start.elapsed() < run_for {
                in_flight.push(peer.request(Echo, payload.clone()));
            }
            let Some(r) = in_flight.next().await else {
                break;
            };
            match r {
                Ok(_) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Err(CallError::Overloaded) => {
                    refused += 1;
                    first_refusal.get_or_insert_with(|| start.elapsed());
                }
                Err(e) => *failures.entry(e.to_string()).or_default() += 1,
            }
        }
        (start.elapsed(), refused, first_refusal, failures)
    });
    let _ = done.send(());
    let _ = rt.block_on(sampler);
    let after = Mem::now();
    let l = server.ledger_sizes();
    let n = answered.load(Ordering::Relaxed);
    println!(
        "  requests answered     {n} in {:.1} s ({:.0} k/s)",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64() / 1e3
    );
    match first_refusal {
        Some(t) => println!(
            "  refused (overloaded)  {refused}, the first after {:.1} s",
            t.as_secs_f64()
        ),
        None => println!("  refused (overloaded)  none"),
    }
    for (e, count) in &failures {
        println!("  failed                {count}: {e}");
    }
    println!(
        "  ledger_sizes          running {}, remembered {}, forgotten {}, bytes {} ({}), senders {}",
        l.running,
        l.remembered,
        l.forgotten,
        l.bytes,
        kib(l.bytes as f64),
        l.senders
    );
    if l.remembered > 0 {
        println!(
            "  bytes per remembered  {:.0} (ledger bytes / remembered entries)",
            l.bytes as f64 / l.remembered as f64
        );
    }
    println!(
        "  process heap          {} at the end ({} before the run)",
        kib(after.heap as f64),
        kib(before.heap as f64)
    );
    if l.remembered > 0 {
        println!(
            "  heap growth per remembered entry  {:.0} B ({:.2}x what the ledger charges)",
            (after.heap - before.heap) as f64 / l.remembered as f64,
            (after.heap - before.heap) as f64 / l.bytes as f64
        );
    }
    println!(
        "  process RSS           {} at the end ({} before the run)",
        kib(after.rss_kib as f64 * 1024.0),
        kib(before.rss_kib as f64 * 1024.0)
    );
    run_on(rt.handle(), async move {
        client.shutdown().await;
        server.shutdown().await;
    });
}

// ---------------------------------------------------------------------------
// fanin: many sessions dialling one node at once

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// How long a retrying caller keeps trying: the default connect timeout.
const RETRY_FOR: Duration = Duration::from_secs(10);

/// One connect, or (`retry`) connects until one succeeds or [`RETRY_FOR`]
/// passes, pausing 10 ms, doubling to 500 ms, between them. Returns the
/// time from the first attempt to the result, the errors retried, and the
/// result.
async fn connect_timed(
    node: &Node,
    addr: &Addr,
    id: NodeId,
    retry: bool,
) -> (Duration, Vec<String>, Result<(), String>) {
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    let mut retried = Vec::new();
    loop {
        match node.connect(addr, Some(id)).await {
            Ok(_) => return (start.elapsed(), retried, Ok(())),
            Err(e) if retry && start.elapsed() + pause < RETRY_FOR => {
                retried.push(e.to_string());
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => return (start.elapsed(), retried, Err(e.to_string())),
        }
    }
}

/// What one fan-in pass saw.
struct FanIn {
    total: Duration,
    latencies: Vec<Duration>,
    retried: BTreeMap<String, u64>,
    failures: BTreeMap<String, u64>,
}

/// `n` client nodes dial a fresh server process at once.
fn fanin_pass(rt: &Runtime, n: usize, retry: bool, per_source: Option<usize>, quick: bool) {
    let mut server = Server::start_with(1, per_source);
    let s0 = server.measure();
    let clients = run_on(rt.handle(), client_nodes(n));
    let (addr, id) = (server.addrs[0].clone(), server.id);
    let (mut f, clients) = run_on(rt.handle(), async move {
        let go = Arc::new(tokio::sync::Barrier::new(n + 1));
        let mut tasks = Vec::with_capacity(n);
        for node in &clients {
            let (node, addr, go) = (node.clone(), addr.clone(), go.clone());
            tasks.push(tokio::spawn(async move {
                go.wait().await;
                connect_timed(&node, &addr, id, retry).await
            }));
        }
        go.wait().await;
        let start = Instant::now();
        let mut f = FanIn {
            total: Duration::ZERO,
            latencies: Vec::with_capacity(n),
            retried: BTreeMap::new(),
            failures: BTreeMap::new(),
        };
        for t in tasks {
            let (took, retried, result) = t.await.unwrap();
            for e in retried {
                *f.retried.entry(e).or_default() += 1;
            }
            match result {
                Ok(()) => f.latencies.push(took),
                Err(e) => *f.failures.entry(e).or_default() += 1,
            }
        }
        f.total = start.elapsed();
        // The client nodes stay up until the server has been measured.
        (f, clients)
    });
    let s1 = server.measure();
    // Quick runs skip the wait for the sessions to be quiet.
    let s2 = (!quick).then(|| {
        rt.block_on(async { tokio::time::sleep(QUIET).await });
        server.measure()
    });
    f.latencies.sort_unstable();
    println!(
        "  established           {} of {n} in {} (the server has {} sessions)",
        f.latencies.len(),
        ms(f.total),
        s1.sessions
    );
    println!(
        "  connect latency       p50 {}, p99 {}, max {}{}",
        ms(percentile(&f.latencies, 0.5)),
        ms(percentile(&f.latencies, 0.99)),
        ms(f.latencies.last().copied().unwrap_or_default()),
        if retry {
            " (first attempt to success)"
        } else {
            ""
        }
    );
    println!(
        "  refused               {} (the server's refused_connections: answered busy, \
         or dropped beyond its bound on refusals in progress)",
        s1.refused - s0.refused
    );
    for (e, count) in &f.retried {
        println!("  retried               {count}: {e}");
    }
    if f.failures.is_empty() {
        println!("  failures              none");
    }
    for (e, count) in &f.failures {
        println!("  failed                {count}: {e}");
    }
    let row = |name: &str, m: Mem| {
        println!(
            "  server {name:<14} heap {:>12}  RSS {:>12}",
            kib(m.heap as f64),
            kib(m.rss_kib as f64 * 1024.0)
        );
    };
    row("before", s0.mem);
    row("after", s1.mem);
    if let Some(s2) = s2 {
        row(&format!("after {} s quiet", QUIET.as_secs()), s2.mem);
        if s2.sessions > 0 {
            println!(
                "  server heap per session, quiet: {} ({} sessions)",
                kib((s2.mem.heap - s0.mem.heap) as f64 / s2.sessions as f64),
                s2.sessions
            );
        }
    }
    run_on(rt.handle(), shutdown_all(clients));
    server.stop();
}

fn fanin(rt: &Runtime, quick: bool) {
    let n = env_usize("CAPWIRE_BENCH_N").unwrap_or(if quick { 100 } else { 1000 });
    println!(
        "fan-in: {n} client nodes (one session each) dial one node at once over loopback; \
         server in its own process, default limits"
    );
    if let Some(limit) = open_files_limit() {
        let need = u64::try_from(n).unwrap() + 100;
        if limit < need {
            println!("  open files limit {limit} < {need} needed: raise it (ulimit -n {need})");
            return;
        }
    }
    println!(" each client calls Node::connect once:");
    fanin_pass(rt, n, false, None, quick);
    println!(
        " each client retries a failed Node::connect, 10 ms doubling to 500 ms, for up to {} s:",
        RETRY_FOR.as_secs()
    );
    fanin_pass(rt, n, true, None, quick);
    // Every client here shares one source address, so the per-source bound
    // on handshakes in progress (default 16) paces the run; lifted, what is
    // left is the handshakes' own cost and the accept-rate bound.
    println!(
        " each client calls Node::connect once; server's max_handshakes_per_source \
         lifted to {n} (all clients share one address):"
    );
    fanin_pass(rt, n, false, Some(n), quick);
}

// ---------------------------------------------------------------------------
// scale: 10,000 sessions into one node

/// The bench server's accept rate in the `scale` section (the default,
/// 1,000/s, is a bound on floods; the bench paces below this).
const SCALE_ACCEPT_RATE: u32 = 5_000;
/// Connects per second the `scale` section paces its dialling at
/// (`CAPWIRE_BENCH_SCALE_PACE` sets another).
fn scale_pace() -> u64 {
    env_usize("CAPWIRE_BENCH_SCALE_PACE").map_or(1_000, |p| u64::try_from(p.max(1)).unwrap())
}

/// User plus system CPU time from a `/proc/.../stat` file.
fn cpu_of(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here;
    // the kernel counts them in USER_HZ (100 on Linux).
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// One client node per session (a node keeps one session per peer)
/// dials one server node in its own process, paced at [`scale_pace`]
/// connects per second, up to N (10,000; quick: 1,000) sessions, with
/// checkpoints at a quarter and a half of N: at each, once its
/// connects are done and the sessions have been quiet for 3 s, the
/// server's heap and RSS per session. At N: the server's and this
/// process's CPU over 10 s with nothing sent.
fn scale(rt: &Runtime, quick: bool) {
    let n = env_usize("CAPWIRE_BENCH_SCALE_N").unwrap_or(if quick { 1_000 } else { 10_000 });
    let pace = scale_pace();
    println!(
        "scale: {n} client nodes, one session each, dial one node (its own process, \
         accept rate {SCALE_ACCEPT_RATE}/s, room for {n} sessions, other limits default), \
         paced at {pace} connects/s"
    );
    if let Some(limit) = open_files_limit() {
        let need = u64::try_from(n).unwrap() + 100;
        if limit < need {
            println!("  open files limit {limit} < {need} needed: raise it (ulimit -n {need})");
            return;
        }
    }
    let quiet = if quick { QUIET_QUICK } else { QUIET };
    let mut server = Server::start_scale(n);
    let s0 = server.measure();
    let started = Instant::now();
    let clients = run_on(rt.handle(), client_nodes(n));
    let c_heap = Mem::now();
    println!(
        "  {n} client nodes started in {} ({} of heap each, this process)",
        ms(started.elapsed()),
        kib(c_heap.heap as f64 / n as f64)
    );
    let (addr, id) = (server.addrs[0].clone(), server.id);
    let mut latencies = Vec::with_capacity(n);
    let mut failures = BTreeMap::<String, u64>::new();
    let mut dialling = Duration::ZERO;
    let mut done = 0;
    println!(
        "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "sessions", "dialled in", "p50", "p99", "max", "heap/session", "RSS/session"
    );
    for stop in [n / 4, n / 2, n] {
        let batch: Vec<Node> = clients[done..stop].to_vec();
        let (addr, took) = (addr.clone(), Instant::now());
        let (mut lat, fail) = run_on(rt.handle(), async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / pace));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut tasks = Vec::with_capacity(batch.len());
            for node in batch {
                tick.tick().await;
                let addr = addr.clone();
                tasks.push(tokio::spawn(async move {
                    let t = Instant::now();
                    node.connect(&addr, Some(id))
                        .await
                        .map(|_| t.elapsed())
                        .map_err(|e| e.to_string())
                }));
            }
            let (mut lat, mut fail) = (Vec::new(), Vec::new());
            for t in tasks {
                match t.await.unwrap() {
                    Ok(d) => lat.push(d),
                    Err(e) => fail.push(e),
                }
            }
            (lat, fail)
        });
        let dialled = took.elapsed();
        dialling += dialled;
        for e in fail {
            *failures.entry(e).or_default() += 1;
        }
        lat.sort_unstable();
        sleep(rt, quiet);
        let m = server.measure();
        let per = |d: i64| d as f64 / m.sessions.max(1) as f64;
        println!(
            "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>14} {:>14}",
            m.sessions,
            ms(dialled),
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            ms(lat.last().copied().unwrap_or_default()),
            kib(per(m.mem.heap - s0.mem.heap)),
            kib(per(m.mem.rss_kib - s0.mem.rss_kib) * 1024.0),
        );
        latencies.extend(lat);
        done = stop;
    }
    latencies.sort_unstable();
    let p99 = percentile(&latencies, 0.99);
    println!(
        "  all {} connects (handshake and both hellos): p50 {}, p99 {} (target <= 5 ms: {}), \
         {} dialling in all",
        latencies.len(),
        ms(percentile(&latencies, 0.5)),
        ms(p99),
        if p99 <= Duration::from_millis(5) {
            "met"
        } else {
            "missed"
        },
        ms(dialling)
    );
    if failures.is_empty() {
        println!("  failures: none");
    }
    for (e, count) in &failures {
        println!("  failed {count}: {e}");
    }
    // Nothing is sent but keepalives (each side writes one after 15 s
    // without writing).
    let window = if quick {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(10)
    };
    let (srv0, me0) = (server.cpu(), cpu_of("/proc/self/stat"));
    sleep(rt, window);
    let (srv1, me1) = (server.cpu(), cpu_of("/proc/self/stat"));
    let pct = |d: Duration| d.as_secs_f64() / window.as_secs_f64() * 100.0;
    println!(
        "  quiet for {} s with {} sessions: server CPU {:.1}% of one core, the {} client nodes \
         {:.1}% (keepalives due in the window: up to {} per side)",
        window.as_secs(),
        server.measure().sessions,
        pct(srv1 - srv0),
        n,
        pct(me1 - me0),
        (n as u64 * window.as_secs()).div_ceil(15),
    );
    run_on(rt.handle(), shutdown_all(clients));
    server.stop();
}

// ---------------------------------------------------------------------------
// streams: heap per open stream, per side

/// The encoded length of one 64 B text item (2 bytes of head).
const ITEM_LEN: usize = PAYLOAD + 2;

/// A client node with default limits and its session to `server`.
fn stream_client(rt: &Runtime, server: &Server) -> (Node, Peer) {
    let (addr, id) = (server.addrs[0].clone(), server.id);
    run_on(rt.handle(), async move {
        let client = Node::builder("bench-client").start().await.unwrap();
        let peer = client.connect(&addr, Some(id)).await.unwrap();
        (client, peer)
    })
}

/// Asks the server until `done` says yes (within 30 s).
fn server_until(server: &mut Server, done: impl Fn(&ServerMem) -> bool) -> ServerMem {
    let start = Instant::now();
    loop {
        let m = server.measure();
        if done(&m) || start.elapsed() > Duration::from_secs(30) {
            return m;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sleep(rt: &Runtime, d: Duration) {
    rt.block_on(async { tokio::time::sleep(d).await });
}

/// Heap per call of `n` calls, (caller side, callee side, caller blocks,
/// callee blocks), against `(c0, s0)`.
fn per_call(n: usize, c0: Mem, s0: &ServerMem, c1: Mem, s1: &ServerMem) -> [f64; 4] {
    let per = |d: i64| d as f64 / n as f64;
    [
        per(c1.heap - c0.heap),
        per(s1.mem.heap - s0.mem.heap),
        per(c1.blocks - c0.blocks),
        per(s1.mem.blocks - s0.mem.blocks),
    ]
}

fn streams(rt: &Runtime, quick: bool) {
    let d = Limits::default();
    // Within the callee's bound on a session's jobs and the caller's
    // bound on a session's windows.
    let fit = (d.max_stream_window_bytes_per_session / d.stream_window_bytes as usize)
        .min(d.max_inflight_per_session);
    let n = env_usize("CAPWIRE_BENCH_N")
        .unwrap_or(if quick { 50 } else { 200 })
        .min(fit);
    // The 64 B items a window holds: its items, or fewer if its bytes bind.
    let window_items =
        (d.stream_window_items as usize).min(d.stream_window_bytes as usize / ITEM_LEN);
    println!(
        "streams: heap per open stream, N = {n} on one session, caller and callee in \
         separate processes, after {:.1} s quiet (target <= 1 KiB beyond its window); \
         window {} items, {} KiB",
        quiet(quick).as_secs_f64(),
        d.stream_window_items,
        d.stream_window_bytes >> 10
    );
    let mut server = Server::start_streams();
    let (client, peer) = stream_client(rt, &server);
    // Warm up: one of each, so that what is built once per session is.
    let p = peer.clone();
    run_on(rt.handle(), async move {
        let mut s = p.stream(Fill, 1).await.unwrap();
        s.next().await.unwrap().unwrap();
        drop(s);
        let _ = p.request_within(Wait, (), Duration::from_millis(50)).await;
        p.request(Echo, "x".into()).await.unwrap();
    });
    sleep(rt, quiet(quick));
    let (c0, s0) = (Mem::now(), server.measure());
    println!("  {:<44} {:>22} {:>22}", "", "caller side", "callee side");
    let row = |name: &str, f: [f64; 4], extra: &str| {
        println!(
            "  {name:<44} {:>22} {:>22}{extra}",
            format!("{} ({:.1} blocks)", kib(f[0]), f[2]),
            format!("{} ({:.1} blocks)", kib(f[1]), f[3]),
        );
    };

    // Baseline: n requests waiting for their answers.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let p = peer.clone();
    let calls = rt.spawn(async move {
        let mut pending: FuturesUnordered<_> = (0..n)
            .map(|_| p.request_within(Wait, (), Duration::from_secs(600)))
            .collect();
        tokio::select! {
            _ = stopped => {}
            _ = pending.next() => panic!("a call that never answers ended"),
        }
    });
    let s1 = server_until(&mut server, |m| m.inflight >= s0.inflight + n);
    assert!(
        s1.inflight >= s0.inflight + n,
        "requests in flight at the callee"
    );
    sleep(rt, quiet(quick));
    let (c1, s1) = (Mem::now(), server.measure());
    row(
        "pending request (baseline)",
        per_call(n, c0, &s0, c1, &s1),
        "",
    );
    let _ = stop.send(());
    rt.block_on(calls).unwrap();
    server_until(&mut server, |m| m.inflight <= s0.inflight);

    // Idle streams: open, no item sent.
    let p = peer.clone();
    let idle: Vec<ItemStream<String>> = run_on(rt.handle(), async move {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(p.stream(Hold, ()).await.unwrap());
        }
        v
    });
    server_until(&mut server, |m| m.streams_served >= n);
    sleep(rt, quiet(quick));
    let (c2, s2) = (Mem::now(), server.measure());
    assert_eq!(s2.streams_served, n, "streams the callee serves");
    let f = per_call(n, c0, &s0, c2, &s2);
    let verdict = if f[0] <= 1024.0 && f[1] <= 1024.0 {
        "met"
    } else {
        "missed"
    };
    row(
        "idle stream, no item yet",
        f,
        &format!("  target {verdict}"),
    );
    rt.block_on(async move { drop(idle) });
    server_until(&mut server, |m| m.streams_served == 0);

    // Streams with a full window: the callee sent a window of 64 B items,
    // the caller took none.
    let p = peer.clone();
    let w = u32::try_from(window_items).unwrap();
    let full: Vec<ItemStream<String>> = run_on(rt.handle(), async move {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(p.stream(Fill, w).await.unwrap());
        }
        v
    });
    let sent = (n * window_items) as u64;
    server_until(&mut server, |m| m.items_sent >= s0.items_sent + 1 + sent);
    let start = Instant::now();
    while full.iter().map(ItemStream::buffered).sum::<usize>() < n * window_items
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let buffered: usize = full.iter().map(ItemStream::buffered).sum();
    sleep(rt, quiet(quick));
    let (c3, s3) = (Mem::now(), server.measure());
    let f = per_call(n, c0, &s0, c3, &s3);
    let items_bytes = (window_items * ITEM_LEN) as f64;
    row(
        &format!("full window ({window_items} x 64 B items buffered)"),
        f,
        "",
    );
    let beyond = f[0] - items_bytes;
    println!(
        "  {:<44} {:>22} {:>22}  target {}",
        format!("  beyond the items' {}", kib(items_bytes)),
        kib(beyond),
        "-",
        if beyond <= 1024.0 { "met" } else { "missed" }
    );
    println!(
        "  {:<44} {:>22}",
        "  items buffered at the caller",
        format!("{buffered} of {}", n * window_items)
    );
    rt.block_on(async move { drop(full) });
    server_until(&mut server, |m| m.streams_served == 0);
    sleep(rt, quiet(quick));
    let (c4, s4) = (Mem::now(), server.measure());
    let f = per_call(n, c0, &s0, c4, &s4);
    row("after all ended (should be ~0)", f, "");

    // One stream whose items come slowly, one every 1 ms, and are not
    // taken, beside a bulk stream of 64 KiB items taken at once: the slow
    // stream's items arrive among the bulk ones.
    let p = peer.clone();
    let (drip, bulk_bytes) = run_on(rt.handle(), async move {
        let drip: ItemStream<String> = p.stream(Drip, (w, 1)).await.unwrap();
        let mut bulk_bytes = 0u64;
        let start = Instant::now();
        while ItemStream::buffered(&drip) < window_items
            && start.elapsed() < Duration::from_secs(60)
        {
            let mut b = p.stream(Bulk, 64).await.unwrap();
            while let Some(item) = b.next().await {
                bulk_bytes += item.unwrap().len() as u64;
            }
        }
        (drip, bulk_bytes)
    });
    sleep(rt, quiet(quick));
    let c5 = Mem::now();
    println!(
        "  {:<44} {:>22}  for {} of items ({} of bulk items passed meanwhile)",
        format!("one paced stream's full window, not taken,"),
        kib((c5.heap - c4.heap) as f64),
        kib(items_bytes),
        kib(bulk_bytes as f64),
    );
    println!("  {:<44}", "  beside a bulk stream (caller heap)");
    rt.block_on(async move { drop(drip) });
    server_until(&mut server, |m| m.streams_served == 0);
    run_on(rt.handle(), async move { client.shutdown().await });
    server.stop();
}

// ---------------------------------------------------------------------------
// tasks: heap per held task, per side

/// How long the task worker keeps an ended task.
const TASK_RETENTION: Duration = Duration::from_secs(8);

fn held_tasks(rt: &Runtime, quick: bool) {
    let d = Limits::default();
    // Within the worker's bound on one submitter's tasks (and on a
    // session's jobs, for the baseline).
    let n = env_usize("CAPWIRE_BENCH_N")
        .unwrap_or(if quick { 100 } else { 500 })
        .min(d.max_tasks_per_sender - 10)
        .min(d.max_inflight_per_session);
    println!(
        "tasks: heap per held task, N = {n} from one session, submitter and worker in \
         separate processes, after {:.1} s quiet; the worker keeps an ended task {} s",
        quiet(quick).as_secs_f64(),
        TASK_RETENTION.as_secs()
    );
    println!(
        "  {:<44} {:>22} {:>22}",
        "", "submitter side", "worker side"
    );
    let row = |name: &str, f: [f64; 4]| {
        println!(
            "  {name:<44} {:>22} {:>22}",
            format!("{} ({:.1} blocks)", kib(f[0]), f[2]),
            format!("{} ({:.1} blocks)", kib(f[1]), f[3]),
        );
    };
    for store in ["memory", "redb"] {
        println!("  store: {store}");
        let mut server = Server::start_tasks(store);
        let (client, peer) = stream_client(rt, &server);
        // Warm up: one task asked and answered, one request given up on,
        // so that what is built once per session and store is.
        let p = peer.clone();
        run_on(rt.handle(), async move {
            let t = p.submit(Held, ()).await.unwrap();
            while t.get().await.unwrap().state != TaskState::InputRequired {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            t.respond("go").await.unwrap();
            assert_eq!(t.result().await.unwrap(), "go");
            let _ = p.request_within(Wait, (), Duration::from_millis(50)).await;
        });
        server_until(&mut server, |m| m.tasks_held == 0 && m.inflight == 0);
        sleep(rt, quiet(quick));
        let (c0, s0) = (Mem::now(), server.measure());

        // Baseline: n requests waiting for their answers.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let p = peer.clone();
        let calls = rt.spawn(async move {
            let mut pending: FuturesUnordered<_> = (0..n)
                .map(|_| p.request_within(Wait, (), Duration::from_secs(600)))
                .collect();
            tokio::select! {
                _ = stopped => {}
                _ = pending.next() => panic!("a call that never answers ended"),
            }
        });
        let s1 = server_until(&mut server, |m| m.inflight >= s0.inflight + n);
        assert!(
            s1.inflight >= s0.inflight + n,
            "requests in flight at the worker"
        );
        sleep(rt, quiet(quick));
        let (c1, s1) = (Mem::now(), server.measure());
        row("pending request (baseline)", per_call(n, c0, &s0, c1, &s1));
        let _ = stop.send(());
        rt.block_on(calls).unwrap();
        server_until(&mut server, |m| m.inflight <= s0.inflight);

        // Twice: what the first round leaves behind once its tasks are
        // deleted is either kept capacity (reused by the second round) or
        // lost (grows again).
        let mut ends = Vec::new();
        for round in 1..=2 {
            let tag = if round == 1 { "" } else { "again: " };
            // Held tasks: each asked its question and waits for the answer.
            let p = peer.clone();
            let handles: Vec<TaskHandle<String>> = run_on(rt.handle(), async move {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(p.submit(Held, ()).await.unwrap());
                }
                v
            });
            let s2 = server_until(&mut server, |m| m.tasks_held >= n);
            assert_eq!(s2.tasks_held, n, "tasks waiting for an answer");
            sleep(rt, quiet(quick));
            let (c2, s2) = (Mem::now(), server.measure());
            row(
                &format!("{tag}held task, waiting for its answer"),
                per_call(n, c0, &s0, c2, &s2),
            );

            // Cancelled: ended, kept for the retention.
            let handles = run_on(rt.handle(), async move {
                for h in &handles {
                    let info = h.cancel().await.unwrap();
                    assert_eq!(info.state, TaskState::Canceled);
                }
                handles
            });
            server_until(&mut server, |m| m.tasks_held == 0);
            sleep(rt, quiet(quick));
            let (c3, s3) = (Mem::now(), server.measure());
            assert!(s3.tasks_kept >= n, "cancelled tasks are kept");
            row(
                &format!("{tag}cancelled, kept for retention"),
                per_call(n, c0, &s0, c3, &s3),
            );

            // The retention passed: every task deleted.
            rt.block_on(async move { drop(handles) });
            let s4 = server_until(&mut server, |m| m.tasks_kept == 0);
            assert_eq!(s4.tasks_kept, 0, "tasks left after their retention");
            let (c4, s4) = (Mem::now(), server.measure());
            row(
                &format!("{tag}retention passed"),
                per_call(n, c0, &s0, c4, &s4),
            );
            ends.push((c4, s4));
        }
        let mut ends = ends.into_iter();
        let ((c4, s4), (c5, s5)) = (ends.next().unwrap(), ends.next().unwrap());
        row(
            "  the second round's growth over the first",
            per_call(n, c4, &s4, c5, &s5),
        );
        // Each task is two requests (its submit, its cancel), which the
        // worker's replay ledger remembers for its window.
        println!(
            "  {:<44} {:>22} {:>22}",
            "  of it, the replay ledger (entries, charge)",
            "",
            format!(
                "{:.1} / task, {}",
                (s5.ledger_entries as f64 - s4.ledger_entries as f64) / n as f64,
                kib((s5.ledger_bytes as f64 - s4.ledger_bytes as f64) / n as f64)
            ),
        );
        run_on(rt.handle(), async move { client.shutdown().await });
        server.stop();
    }
}

// ---------------------------------------------------------------------------
// slow: a consumer taking 10 items/s from a producer as fast as credit allows

fn slow_consumer(rt: &Runtime, quick: bool, slow: bool) {
    let secs: u64 = env_usize("CAPWIRE_BENCH_SECS").map_or(
        if slow {
            60
        } else if quick {
            3
        } else {
            10
        },
        |s| u64::try_from(s).unwrap(),
    );
    let d = Limits::default();
    println!(
        "slow consumer: one stream of 64 B items, the producer as fast as credit allows, \
         the consumer taking 10 items/s for {secs} s{}; window {} items, {} KiB; caller and \
         callee in separate processes",
        if slow { "" } else { " (--slow: 60 s)" },
        d.stream_window_items,
        d.stream_window_bytes >> 10
    );
    let held = (d.stream_window_items as usize).min(d.stream_window_bytes as usize / ITEM_LEN);
    let mut server = Server::start_streams();
    let (client, peer) = stream_client(rt, &server);
    sleep(rt, Duration::from_millis(200));
    let (c0, s0) = (Mem::now(), server.measure());
    let mut s: ItemStream<String> =
        run_on(
            rt.handle(),
            async move { peer.stream(Flood, ()).await.unwrap() },
        );
    println!(
        "  {:>5}  {:>7} {:>9} {:>8} {:>9} {:>12} {:>8}  {:>12} {:>12}",
        "t",
        "taken",
        "sent",
        "unsent*",
        "buffered",
        "queued (B)",
        "stalls",
        "caller heap",
        "callee heap"
    );
    let mut taken = 0u64;
    let mut most_ahead = 0u64;
    let mut samples: Vec<(i64, i64)> = Vec::new();
    let start = Instant::now();
    // One item every 100 ms, the first at once, over the whole run.
    let mut tick = rt.block_on(async { tokio::time::interval(Duration::from_millis(100)) });
    for _ in 0..secs {
        (s, tick) = rt.block_on(async move {
            for _ in 0..10 {
                tick.tick().await;
                let item = s.next().await.unwrap().unwrap();
                assert_eq!(item.len(), PAYLOAD);
            }
            (s, tick)
        });
        taken += 10;
        let (c, m) = (Mem::now(), server.measure());
        let sent = m.items_sent - s0.items_sent;
        most_ahead = most_ahead.max(sent - taken);
        samples.push((c.heap - c0.heap, m.mem.heap - s0.mem.heap));
        println!(
            "  {:>4.0}s  {taken:>7} {sent:>9} {:>8} {:>9} {:>12} {:>8}  {:>12} {:>12}",
            start.elapsed().as_secs_f64(),
            sent - taken,
            ItemStream::buffered(&s),
            m.queued_bytes,
            m.stalls - s0.stalls,
            kib((c.heap - c0.heap) as f64),
            kib((m.mem.heap - s0.mem.heap) as f64),
        );
    }
    println!("  * sent and not taken: on the wire, or buffered at the caller");
    // From the third second on: a quiet session has returned the buffers
    // its first burst grew (after 2 s).
    let settled = &samples[samples.len().min(2)..];
    let spread = |f: fn(&(i64, i64)) -> i64| {
        let v: Vec<i64> = settled.iter().map(f).collect();
        v.iter()
            .max()
            .map_or(0, |max| max - v.iter().min().unwrap())
    };
    println!(
        "  items ahead of the consumer at most {most_ahead} (the window holds {held} such items): \
         {} of items, at most the window's {}",
        kib((most_ahead as usize * ITEM_LEN) as f64),
        kib((held * ITEM_LEN) as f64),
    );
    println!(
        "  heap from the third second on (max - min of the samples): caller {}, callee {}; \
         last sample: caller {}, callee {}",
        kib(spread(|s| s.0) as f64),
        kib(spread(|s| s.1) as f64),
        kib(samples.last().unwrap().0 as f64),
        kib(samples.last().unwrap().1 as f64),
    );
    rt.block_on(async move { drop(s) });
    server_until(&mut server, |m| m.streams_served == 0);
    run_on(rt.handle(), async move { client.shutdown().await });
    server.stop();
}

// ---------------------------------------------------------------------------

fn env_usize(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(
            args[i + 1].parse().unwrap(),
            args.get(i + 2).map(|p| p.parse().unwrap()),
            false,
            None,
            None,
        );
        return;
    }
    if args.iter().any(|a| a == "--serve-streams") {
        serve(1, None, true, None, None);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--serve-tasks") {
        serve(1, None, true, Some(args[i + 1].as_str()), None);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--serve-scale") {
        serve(1, None, false, None, Some(args[i + 1].parse().unwrap()));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick" || a == "--test")
        || std::env::var("CAPWIRE_BENCH_QUICK").is_ok_and(|v| v != "0");
    let only = std::env::var("CAPWIRE_BENCH_ONLY").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s.trim() == name))
    };
    let rt = two_workers();
    if wanted("idle") {
        idle(&rt, quick);
    }
    if wanted("ledger") {
        ledger(&rt, quick);
    }
    if wanted("fanin") {
        fanin(&rt, quick);
    }
    if wanted("scale") {
        scale(&rt, quick);
    }
    if wanted("streams") {
        streams(&rt, quick);
    }
    if wanted("tasks") {
        held_tasks(&rt, quick);
    }
    if wanted("slow") {
        let slow = args.iter().any(|a| a == "--slow");
        slow_consumer(&rt, quick, slow);
    }
}
