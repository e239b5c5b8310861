//! Task benchmarks (protocol 2). Every capwire figure is printed beside
//! its baseline, measured in the same run and interleaved with it where
//! the two can alternate (so that background load hits both alike), with
//! the ratio:
//!
//! - `latency`: one at a time, alternating: a plain request's round trip
//!   (64 B echo, the baseline); `Peer::submit` to the task's id in hand
//!   (the answer) and on to its result from `TaskHandle::result` (a task
//!   that answers its 64 B args at once, no progress); `Peer::submit` to
//!   the task's first progress event in hand (`TaskHandle::events`);
//!   medians;
//! - `events`: a task reporting many 64 B progress events as fast as the
//!   service writes them, to 1 subscriber and to 100 (all on the
//!   submitter's session, subscribed from the first event before the
//!   handler is told to go; every event kept, and the 100-subscriber run
//!   a tenth of the events): events/s each subscriber gets, all of them
//!   together, and the handler's own rate; beside one stream's 64 B
//!   items/s (`benches/streams.rs`' `small` method: items in hand from
//!   open to end), interleaved;
//! - `disk`: the redb store's file over N ended tasks (no progress: the
//!   `submitted`, `working` and `result` events, the record and the args)
//!   and over N 64 B progress events (40 tasks of 500 events each, all
//!   at once, their per-task share taken off): bytes per task and per event, in file
//!   length and in blocks the file holds;
//! - `retention`: 100,000 ended tasks in a redb store, the node started
//!   again on it with a retention that has passed for all of them: the
//!   time to start and to clean them all, and a plain request's round
//!   trip (p50/p99) measured one after the other while it cleans, beside
//!   the same count of round trips once it is done.
//!
//! `latency` and `events` run with both stores (`memory`: the node has no
//! state directory; `redb`: it has one, on the disk of the bench's
//! temporary directory, every round of task writes fsync'd) and in two
//! placements, as in the node bench:
//!
//! - `shared`: both ends on one 2-worker tokio runtime;
//! - `split`: each end on a single-threaded runtime on its own OS thread,
//!   as two processes would be.
//!
//! `disk` and `retention` run on the `shared` placement. Heap per held
//! task (open, waiting for an answer) is measured by `benches/memory.rs`
//! (`tasks`), which counts every allocation; this one runs on the plain
//! system allocator.
//!
//! `cargo bench --bench tasks` runs everything, best of 3 (about two
//! minutes on 2 cores, half of it `retention`); `--quick` or
//! `CAPWIRE_BENCH_QUICK=1` runs small counts once (under 15 s). Filters, each a comma-separated
//! list:
//!
//! - `CAPWIRE_BENCH_ONLY=latency,events,disk,retention`: sections;
//! - `CAPWIRE_BENCH_PLACEMENT=shared,split`: placements;
//! - `CAPWIRE_BENCH_STORE=memory,redb`: stores (`latency`, `events`);
//! - `CAPWIRE_BENCH_N=count`: round trips, events or tasks per run, for
//!   every selected section;
//! - `CAPWIRE_BENCH_RUNS=k`: best of k (3, or 1 when quick).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use capwire::manifest::{TaskEventKind, TaskState, verb};
use capwire::{Capability, HandlerError, Items, Limits, Node, Peer, Task, TaskHandle};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Barrier, watch};

#[path = "support/runtimes.rs"]
mod runtimes;
use runtimes::{Placement, run_on};
#[path = "support/figures.rs"]
mod figures;
use figures::{fig, keep_best, median, rate, ratio};
#[path = "support/opts.rs"]
mod opts;
use opts::{Opts, list, wanted};

// ---------------------------------------------------------------------------
// Verbs

verb! { /** Echo: the plain request. */
pub struct Echo: request "app.bench.tasks" / "echo", Bootstrap, String => String; }
verb! { /** Answers its args at once: a task with no progress. */
pub struct Done: task "app.bench.tasks" / "done", Bootstrap, String => String; }
verb! { /** Reports its args as one progress event, then answers them. */
pub struct First: task "app.bench.tasks" / "first", Bootstrap, String => String; }
verb! { /** Waits for the go of its generation, then reports `count` 64 B progress
events as fast as they are written, and answers `count`. */
pub struct Chatty: task "app.bench.tasks" / "chatty", Bootstrap, (u64, u64) => u64; }
verb! { /** Sends `count` 64 B items, as fast as credit allows: the stream baseline. */
pub struct Gen: stream "app.bench.tasks" / "gen", Bootstrap, u64 => String; }

const PAYLOAD: usize = 64;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds since the process's epoch: both ends run in this process.
fn now_ns() -> u64 {
    u64::try_from(EPOCH.elapsed().as_nanos()).unwrap()
}

fn payload() -> String {
    "x".repeat(PAYLOAD)
}

/// The generation of `events_run` whose handler may go: both ends run in
/// this process, so the handler waits on it directly.
static GO: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// When the last `chatty` handler's last progress event was written.
static CHATTY_DONE_NS: AtomicU64 = AtomicU64::new(0);

async fn echo(s: String) -> Result<String, HandlerError> {
    Ok(s)
}

async fn done(s: String, _task: Task) -> Result<String, HandlerError> {
    Ok(s)
}

async fn first(s: String, task: Task) -> Result<String, HandlerError> {
    task.progress(&s).await?;
    Ok(s)
}

async fn chatty((count, generation): (u64, u64), task: Task) -> Result<u64, HandlerError> {
    let mut go = GO.subscribe();
    if go.wait_for(|g| *g >= generation).await.is_err() {
        return Err(HandlerError::new(
            capwire::envelope::ErrorCode::Internal,
            "no go",
        ));
    }
    let item = payload();
    for _ in 0..count {
        task.progress(&item).await?;
    }
    CHATTY_DONE_NS.store(now_ns(), Ordering::SeqCst);
    Ok(count)
}

async fn gen_items(count: u64, mut items: Items<String>) -> Result<(), HandlerError> {
    let item = payload();
    for _ in 0..count {
        items.send(item.clone()).await?;
    }
    Ok(())
}

fn capability() -> Capability {
    Capability::new("app.bench.tasks", "1.0.0")
        .unwrap()
        .handle(Echo, echo)
        .task(Done, done)
        .task(First, first)
        .task(Chatty, chatty)
        .stream(Gen, gen_items)
}

// ---------------------------------------------------------------------------
// Where the two ends run

// ---------------------------------------------------------------------------
// Nodes

#[derive(Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Memory,
    Redb,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redb => "redb",
        }
    }
}

/// Limits that let a bench keep many tasks: the default bounds on tasks
/// kept (10,000; 1,000 per submitter) would refuse submits long before a
/// run ends, since ended tasks are kept for a day.
fn roomy(tasks: usize) -> Limits {
    Limits {
        // A sender that is neither the control plane nor a contact keeps
        // at most nine tenths of `max_tasks` (WIRE.md 4.10).
        max_tasks: tasks.saturating_mul(10) / 9 + 1,
        max_tasks_per_sender: tasks,
        ..Limits::default()
    }
}

/// A server node with its store, one client node and its session.
struct Pair {
    server: Node,
    client: Node,
    peer: Peer,
    /// The state directory (redb) and what keeps it.
    dir: Option<(tempfile::TempDir, PathBuf)>,
}

fn start_server(p: &Placement, limits: Limits, state: Option<PathBuf>) -> Node {
    run_on(&p.server, async move {
        let mut b = Node::builder("bench-server")
            .listen("127.0.0.1:0".parse().unwrap())
            .limits(limits)
            .capability(capability());
        if let Some(dir) = state {
            b = b.state_dir(dir);
        }
        b.start().await.unwrap()
    })
}

fn start_client(p: &Placement, server: &Node) -> (Node, Peer) {
    let (addr, id) = (server.local_addrs()[0].clone(), server.id());
    run_on(&p.client, async move {
        let client = Node::builder("bench-client").start().await.unwrap();
        let peer = client.connect(&addr, Some(id)).await.unwrap();
        (client, peer)
    })
}

impl Pair {
    fn start(p: &Placement, store: StoreKind, limits: Limits) -> Self {
        let dir = (store == StoreKind::Redb).then(|| {
            let tmp = tempfile::tempdir().unwrap();
            let state = tmp.path().join("state");
            (tmp, state)
        });
        let server = start_server(p, limits, dir.as_ref().map(|d| d.1.clone()));
        let (client, peer) = start_client(p, &server);
        Self {
            server,
            client,
            peer,
            dir,
        }
    }

    fn store_file(&self) -> PathBuf {
        self.dir.as_ref().unwrap().1.join("state.redb")
    }

    fn stop(self, p: &Placement) {
        let Self {
            server,
            client,
            dir,
            ..
        } = self;
        run_on(&p.client, async move { client.shutdown().await });
        run_on(&p.server, async move { server.shutdown().await });
        drop(dir);
    }
}

/// Tasks the node keeps, in all.
fn tasks_kept(node: &Node) -> usize {
    node.stats().tasks.iter().map(|(_, n)| n).sum()
}

/// Tasks the node keeps in `state`.
fn tasks_in(node: &Node, state: TaskState) -> usize {
    node.stats()
        .tasks
        .iter()
        .find(|(s, _)| *s == state)
        .map_or(0, |(_, n)| *n)
}

// ---------------------------------------------------------------------------
// Figures

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// The `p`-quantile of sorted samples.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

// ---------------------------------------------------------------------------
// latency: submit to answer, first progress and result, against a request

/// `n` rounds, each of a request, a `done` task and a `first` task, one
/// at a time: medians in µs of [round trip, submit to id, submit to
/// result, submit to first progress].
async fn latency_run(peer: Peer, n: u64) -> [f64; 4] {
    let text = payload();
    let mut samples: [Vec<f64>; 4] = Default::default();
    for _ in 0..n {
        let t = Instant::now();
        let back = peer.request(Echo, text.clone()).await.unwrap();
        samples[0].push(us(t));
        assert_eq!(back.len(), PAYLOAD);

        let t = Instant::now();
        let task = peer.submit(Done, text.clone()).await.unwrap();
        samples[1].push(us(t));
        let result = task.result().await.unwrap();
        samples[2].push(us(t));
        assert_eq!(result.len(), PAYLOAD);

        let t = Instant::now();
        let task = peer.submit(First, text.clone()).await.unwrap();
        let mut events = task.events(1).await.unwrap();
        loop {
            let e = events.next().await.unwrap().unwrap();
            if e.kind == TaskEventKind::Progress {
                break;
            }
        }
        samples[3].push(us(t));
        // The rest of its events, to its end, untimed.
        while let Some(e) = events.next().await {
            e.unwrap();
        }
    }
    samples.map(median)
}

fn latency(opts: &Opts, p: &Placement, store: StoreKind) {
    // Each task is three writes one after the other (submitted, working,
    // result): with redb, three fsyncs.
    let n = match store {
        StoreKind::Memory => opts.count(2_000, 200),
        StoreKind::Redb => opts.count(150, 40),
    };
    let runs = opts.runs;
    let pair = Pair::start(p, store, roomy(1 << 20));
    // Warm up: the first of each builds what is built once.
    run_on(&p.client, latency_run(pair.peer.clone(), 5));
    let mut best: [Option<f64>; 4] = [None; 4];
    for _ in 0..runs {
        let m = run_on(&p.client, latency_run(pair.peer.clone(), n));
        for (b, v) in best.iter_mut().zip(m) {
            keep_best(b, v, false);
        }
    }
    let [rtt, answer, result, first] = best;
    for (what, v) in [
        ("submit -> task id", answer),
        ("submit -> result, no progress", result),
        ("submit -> first progress", first),
    ] {
        println!(
            "{:<6} {:<6} {:<30} {:>9} {:>9}  {:<4} {:>8}",
            p.name,
            store.name(),
            format!("{what} ({n})"),
            fig(v, 1.0),
            fig(rtt, 1.0),
            "µs",
            ratio(v, rtt),
        );
    }
    pair.stop(p);
}

// ---------------------------------------------------------------------------
// events: progress events to 1 and to 100 subscribers, against a stream

/// What one `events_run` saw.
struct EventsRun {
    /// Events/s each subscriber got (the slowest's), from the go to its
    /// final event.
    per_sub: f64,
    /// Events/s all subscribers got, together.
    total: f64,
    /// Events/s the handler wrote, from the go to its last event.
    written: f64,
    /// Progress events the subscriber that got fewest got.
    fewest: u64,
}

/// A `chatty` task of `count` events, and `subs` subscriptions to it from
/// its first event, each consumed by a task of its own; the handler goes
/// once every subscriber has its `working` event.
async fn events_run(peer: Peer, count: u64, subs: usize) -> EventsRun {
    let generation = GENERATION.fetch_add(1, Ordering::SeqCst) + 1;
    let task: TaskHandle<u64> = peer.submit(Chatty, (count, generation)).await.unwrap();
    let ready = Arc::new(Barrier::new(subs + 1));
    let mut consumers = Vec::with_capacity(subs);
    for _ in 0..subs {
        let (task, ready) = (task.clone(), ready.clone());
        consumers.push(tokio::spawn(async move {
            let mut events = task.events(1).await.unwrap();
            loop {
                let e = events.next().await.unwrap().unwrap();
                if e.state == TaskState::Working {
                    break;
                }
            }
            ready.wait().await;
            let mut progress = 0u64;
            while let Some(e) = events.next().await {
                let e = e.unwrap();
                if e.kind == TaskEventKind::Progress {
                    progress += 1;
                }
            }
            (progress, now_ns())
        }));
    }
    ready.wait().await;
    let go = now_ns();
    GO.send_replace(generation);
    let (mut fewest, mut last) = (u64::MAX, 0);
    for c in consumers {
        let (n, end) = c.await.unwrap();
        fewest = fewest.min(n);
        last = last.max(end);
    }
    assert_eq!(task.result().await.unwrap(), count);
    let secs = |end: u64| Duration::from_nanos(end.saturating_sub(go).max(1));
    EventsRun {
        per_sub: rate(fewest, secs(last)),
        total: rate(fewest * subs as u64, secs(last)),
        written: rate(count, secs(CHATTY_DONE_NS.load(Ordering::SeqCst))),
        fewest,
    }
}

/// One stream of `count` 64 B items, from opening it to its end.
async fn stream_run(peer: Peer, count: u64) -> Duration {
    let start = Instant::now();
    let mut s = peer.stream(Gen, count).await.unwrap();
    let mut n = 0u64;
    while let Some(item) = s.next().await {
        assert_eq!(item.unwrap().len(), PAYLOAD);
        n += 1;
    }
    assert_eq!(n, count);
    start.elapsed()
}

fn events(opts: &Opts, p: &Placement, store: StoreKind) {
    // Each progress event is written (with redb, fsync'd) before the
    // handler goes on; with 100 subscribers each event costs 100 reads
    // and 100 items, so that run has a tenth of the events.
    let count = |subs: usize| {
        let (full, quick) = match store {
            StoreKind::Memory => (20_000, 2_000),
            StoreKind::Redb => (1_000, 200),
        };
        let c = opts.count(full, quick);
        if subs > 1 { (c / 10).max(10) } else { c }
    };
    // Every event kept, so that no subscriber misses any that were folded
    // away (the default keeps 1,024 per task).
    let limits = Limits {
        max_task_events: count(1) + 16,
        ..roomy(1 << 20)
    };
    let pair = Pair::start(p, store, limits);
    let stream_n = opts.count(200_000, 20_000);
    let mut one: Option<f64> = None;
    let mut best: [Option<EventsRun>; 2] = [None, None];
    for _ in 0..opts.runs {
        let t = run_on(&p.client, stream_run(pair.peer.clone(), stream_n));
        keep_best(&mut one, rate(stream_n, t), true);
        for (i, subs) in [1usize, 100].into_iter().enumerate() {
            let r = run_on(&p.client, events_run(pair.peer.clone(), count(subs), subs));
            if best[i].as_ref().is_none_or(|b| r.per_sub > b.per_sub) {
                best[i] = Some(r);
            }
        }
    }
    for (subs, r) in [1usize, 100].into_iter().zip(best) {
        let r = r.unwrap();
        let count = count(subs);
        let missed = if r.fewest < count {
            format!(" (the slowest got {} of {count})", r.fewest)
        } else {
            String::new()
        };
        println!(
            "{:<6} {:<6} {:<30} {:>9.1} {:>9.1}  {:<4} {:>8}  all subscribers {:.1} k/s ({}); \
             written {:.1} k/s{missed}",
            p.name,
            store.name(),
            format!(
                "{count} events, {subs} subscriber{}",
                if subs > 1 { "s" } else { "" }
            ),
            r.per_sub / 1e3,
            one.unwrap() / 1e3,
            "k/s",
            ratio(Some(r.per_sub), one),
            r.total / 1e3,
            ratio(Some(r.total), one),
            r.written / 1e3,
        );
    }
    pair.stop(p);
}

// ---------------------------------------------------------------------------
// disk: bytes per task and per event in the redb file

/// The file's length and the bytes of blocks it holds.
fn file_size(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap();
    (m.len(), m.blocks() * 512)
}

/// Submits `n` tasks made by `submit`, at most `depth` at a time, and
/// waits for each one's result.
async fn submit_many<F, Fut>(n: u64, depth: usize, submit: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut inflight = FuturesUnordered::new();
    let mut sent = 0u64;
    while sent < n || !inflight.is_empty() {
        while sent < n && inflight.len() < depth {
            inflight.push(submit());
            sent += 1;
        }
        inflight.next().await;
    }
}

fn disk(opts: &Opts, p: &Placement) {
    let tasks = opts.count(10_000, 1_000);
    // All at once, so that a round of writes carries an event of each
    // (one event a task per fsync otherwise).
    let (event_tasks, per_task) = if opts.quick {
        (20u64, 250u64)
    } else {
        (40, 500)
    };
    let pair = Pair::start(p, StoreKind::Redb, roomy(1 << 20));
    let file = pair.store_file();
    let peer = pair.peer.clone();
    run_on(&p.client, async move {
        submit_many(100, 16, || {
            let peer = peer.clone();
            async move {
                let t = peer.submit(Done, payload()).await.unwrap();
                t.result().await.unwrap();
            }
        })
        .await;
    });
    let s0 = file_size(&file);
    let peer = pair.peer.clone();
    let t = Instant::now();
    run_on(&p.client, async move {
        submit_many(tasks, 64, || {
            let peer = peer.clone();
            async move {
                let t = peer.submit(Done, payload()).await.unwrap();
                t.result().await.unwrap();
            }
        })
        .await;
    });
    let fill = t.elapsed();
    let s1 = file_size(&file);
    let peer = pair.peer.clone();
    run_on(&p.client, async move {
        submit_many(event_tasks, usize::try_from(event_tasks).unwrap(), || {
            let peer = peer.clone();
            async move {
                // Generation 0 goes at once.
                let t = peer.submit(Chatty, (per_task, 0)).await.unwrap();
                assert_eq!(t.result().await.unwrap(), per_task);
            }
        })
        .await;
    });
    let s2 = file_size(&file);
    let per = |a: u64, b: u64, n: u64| (b as f64 - a as f64) / n as f64;
    println!(
        "{:<6} {:<6} {:<30} {:>7.0} B per task in length, {:>7.0} B in blocks; \
         {:.1} k tasks/s with 64 in flight (file {:.1} MiB)",
        p.name,
        "redb",
        format!("{tasks} ended tasks, no progress"),
        per(s0.0, s1.0, tasks),
        per(s0.1, s1.1, tasks),
        rate(tasks, fill) / 1e3,
        s1.0 as f64 / f64::from(1 << 20),
    );
    let events = event_tasks * per_task;
    let task_share = |i: usize| {
        let (a, b) = if i == 0 { (s0.0, s1.0) } else { (s0.1, s1.1) };
        per(a, b, tasks) * event_tasks as f64
    };
    let per_event = |i: usize| {
        let (a, b) = if i == 0 { (s1.0, s2.0) } else { (s1.1, s2.1) };
        ((b as f64 - a as f64) - task_share(i)) / events as f64
    };
    // redb grows its file's length in steps, ahead of what it holds: over
    // a few MiB of writes it may not grow at all.
    let length = if s2.0 > s1.0 {
        format!("{:>7.0} B per event in length", per_event(0))
    } else {
        format!("{:>7} length not grown", "")
    };
    println!(
        "{:<6} {:<6} {:<30} {length}, {:>7.0} B in blocks; the body is {} B (file {:.1} MiB)",
        p.name,
        "redb",
        format!("{events} progress events"),
        per_event(1),
        PAYLOAD + 2,
        s2.0 as f64 / f64::from(1 << 20),
    );
    pair.stop(p);
}

// ---------------------------------------------------------------------------
// retention: cleaning 100,000 ended tasks

/// Round trips one after the other until `stop` (and at least `min`, at
/// most `max`): the samples in µs, sorted.
async fn rtts_until(peer: Peer, stop: Arc<AtomicBool>, min: usize, max: usize) -> Vec<f64> {
    let text = payload();
    let mut v = Vec::new();
    while v.len() < max && (v.len() < min || !stop.load(Ordering::SeqCst)) {
        let t = Instant::now();
        peer.request(Echo, text.clone()).await.unwrap();
        v.push(us(t));
    }
    v.sort_by(f64::total_cmp);
    v
}

fn retention(opts: &Opts, p: &Placement) {
    let n = opts.count(100_000, 10_000);
    let limits = roomy(usize::try_from(n).unwrap() + 1_000);
    let pair = Pair::start(p, StoreKind::Redb, limits.clone());
    let peer = pair.peer.clone();
    let t = Instant::now();
    run_on(&p.client, async move {
        // Submits only: the tasks end on their own.
        submit_many(n, 256, || {
            let peer = peer.clone();
            async move {
                peer.submit(Done, payload()).await.unwrap();
            }
        })
        .await;
    });
    // The node's stats count its tasks one by one, under the lock of its
    // task table: looked at every 100 ms, not to slow what is measured.
    while tasks_in(&pair.server, TaskState::Completed) < usize::try_from(n).unwrap() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let fill = t.elapsed();
    let file = pair.store_file();
    let size = file_size(&file).0;
    let Pair {
        server,
        client,
        dir,
        ..
    } = pair;
    let (tmp, state) = dir.unwrap();
    run_on(&p.client, async move { client.shutdown().await });
    run_on(&p.server, async move { server.shutdown().await });

    // Started again with a retention that has passed for every task: the
    // node cleans them as soon as it runs (at most 1,000 a round, a round
    // at most every 50 ms for so short a retention).
    let short = Limits {
        task_retention: Duration::from_millis(100),
        ..limits
    };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let server = start_server(p, short, Some(state.clone()));
    let started = t.elapsed();
    let (client, peer) = start_client(p, &server);
    let stop = Arc::new(AtomicBool::new(false));
    let during = {
        let (peer, stop) = (peer.clone(), stop.clone());
        p.client.spawn(rtts_until(peer, stop, 100, 10_000_000))
    };
    while tasks_kept(&server) > 0 && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let cleaned = t.elapsed();
    let left = tasks_kept(&server);
    stop.store(true, Ordering::SeqCst);
    let during = p.client.block_on(during).unwrap();
    let quiet = run_on(
        &p.client,
        rtts_until(
            peer,
            Arc::new(AtomicBool::new(true)),
            during.len(),
            during.len(),
        ),
    );
    let after = file_size(&file).0;
    println!(
        "{:<6} {:<6} {:<30} filled in {:.1} s ({:.1} k tasks/s with 256 in flight), file {:.1} MiB",
        p.name,
        "redb",
        format!("{n} ended tasks"),
        fill.as_secs_f64(),
        rate(n, fill) / 1e3,
        size as f64 / f64::from(1 << 20),
    );
    println!(
        "{:<6} {:<6} {:<30} start {:.0} ms, all cleaned {:.2} s after it ({:.1} k tasks/s){}; \
         file {:.1} MiB after",
        "",
        "",
        "  started again, retention past",
        started.as_secs_f64() * 1e3,
        cleaned.as_secs_f64(),
        rate(n, cleaned) / 1e3,
        if left > 0 {
            format!(" ({left} left after 120 s)")
        } else {
            String::new()
        },
        after as f64 / f64::from(1 << 20),
    );
    let (p50, p99) = (quantile(&during, 0.5), quantile(&during, 0.99));
    let (q50, q99) = (quantile(&quiet, 0.5), quantile(&quiet, 0.99));
    println!(
        "{:<6} {:<6} {:<30} p50 {p50:.1} µs ({:.2}x), p99 {p99:.1} µs ({:.2}x); \
         without: p50 {q50:.1} µs, p99 {q99:.1} µs ({} each)",
        "",
        "",
        "  round trip while cleaning",
        p50 / q50,
        p99 / q99,
        during.len(),
    );
    run_on(&p.client, async move { client.shutdown().await });
    run_on(&p.server, async move { server.shutdown().await });
    drop(tmp);
}

// ---------------------------------------------------------------------------

fn main() {
    let opts = Opts::from_env();
    LazyLock::force(&EPOCH);
    println!(
        "capwire tasks vs baselines, loopback, best of {} interleaved runs{}",
        opts.runs,
        if opts.quick { " (quick)" } else { "" }
    );
    println!("  shared: both ends on one 2-worker tokio runtime");
    println!("  split:  each end on its own current-thread runtime and OS thread");
    println!("  memory: the node keeps its state in memory; redb: in a state directory");
    let section = |name: &str| wanted(&opts.sections, name);
    let mut placements = Vec::new();
    if wanted(&opts.placements, "shared") {
        placements.push(Placement::shared(false));
    }
    if wanted(&opts.placements, "split") {
        placements.push(Placement::split());
    }
    let stores: Vec<StoreKind> = [StoreKind::Memory, StoreKind::Redb]
        .into_iter()
        .filter(|s| wanted(&list("CAPWIRE_BENCH_STORE"), s.name()))
        .collect();
    if section("latency") {
        println!(
            "{:<6} {:<6} {:<30} {:>9} {:>9}  {:<4} {:>8}",
            "", "store", "one at a time, median", "task", "request", "unit", "/request"
        );
        for p in &placements {
            for &s in &stores {
                latency(&opts, p, s);
            }
        }
    }
    if section("events") {
        println!(
            "{:<6} {:<6} {:<30} {:>9} {:>9}  {:<4} {:>8}",
            "", "store", "64 B progress events, each sub.", "events", "stream", "unit", "/stream"
        );
        for p in &placements {
            for &s in &stores {
                events(&opts, p, s);
            }
        }
    }
    let shared = placements.iter().find(|p| p.name == "shared");
    if section("disk") {
        println!("store bytes on disk (redb file growth)");
        match shared {
            Some(p) => disk(&opts, p),
            None => println!("  (runs on the shared placement only)"),
        }
    }
    if section("retention") {
        println!("retention: ended tasks cleaned at a restart, a request's round trip meanwhile");
        match shared {
            Some(p) => retention(&opts, p),
            None => println!("  (runs on the shared placement only)"),
        }
    }
}
