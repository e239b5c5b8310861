//! One checked simulation run: a node (with its state in a real
//! directory) and its control plane on simulated hosts (turmoil), clients
//! of the control plane recording every operation they make with its
//! invoke and complete times and an outcome of ok, failed or unknown, while
//! a seeded schedule of faults cuts, holds and delays the link and crashes
//! and restarts the node. The histories are then checked
//! (`tests/support/checker.rs`):
//!
//! - the node's configuration (get, set, compare-and-set), linearizable
//!   as a versioned register;
//! - `app.chk/apply`, a request retried under one req_id until it is
//!   answered: its handler runs once per req_id, every answer the same;
//! - `app.chk/job` task submits retried under one req_id: one task; the
//!   same req_id reused on `app.chk/job2` refused, never given that task;
//! - each task's subscriber, resuming from its last seq plus 1 after every
//!   cut (and once more from 1 after the end): every event once, in order,
//!   through the final state;
//! - questions some tasks ask halfway, answered (`respond_to` the
//!   question's seq, retried while the answer is lost): at most one answer
//!   per question in the log, and an acknowledged one is there; cancels
//!   while tasks run: a cancel that answered a final state is the state
//!   the log ends in;
//! - grants: a third host, the delegate, presents the tokens the control
//!   plane mints for it (`app.chk/apply` only) and calls with them while
//!   the control plane revokes them; and the binding: controller calls
//!   race an unbind of the control plane (`core.monitoring/disable`) and
//!   the bind again with a new invite. No call invoked after a revocation
//!   or unbind was done is acknowledged, unless a new grant or bind may
//!   have come between.
//!
//! A fault of the schedule may also write one record of the control
//! plane's twice (a replayed record, [`DupStream`]): the node must end
//! that session (WIRE.md 1.4) and serve nothing more on it; the run counts
//! the copies and those after which nothing more came.
//!
//! A crash is a kill: the node host's tasks stop where they are and what
//! its store had not written is gone; the directory stays, and the node
//! starts again from it. The in-memory replay ledger goes with the crash
//! (WIRE.md 4.4): a client retries an `apply` only while the node has not
//! restarted since its first try (after a restart the retry would run
//! again, as documented), and gives up on it otherwise.
//!
//! Included by `tests/sim_checked.rs` (the seed sweep) and
//! `tests/checked_bugs.rs` (the same runs with a defect planted).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use capwire::envelope::{ErrorCode, RawValue, ReqId};
use capwire::manifest::{
    ConfigValue, GetConfig, NoArgs, SetConfig, SetConfigArgs, TaskEvent, TaskEventKind, TaskInfo,
    TaskState, verb,
};
use capwire::{
    CallError, Capability, HandlerError, Keypair, Limits, Node, NodeId, Peer, State, Task,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use capwire::grants::{GrantPublicKey, Right};
use capwire::manifest::MonitoringDisable;

use crate::checker::{
    self, Answer, AuthorityChange, AuthorityKind, ControllerCall, Event, Execution, History,
    LinOptions, NodeClock, Presented, RegInput, RegOutput, Register, Request, Segment, SegmentEnd,
    TaskRead, Tick, Violation,
};

const NODE: &str = "node";
const CP: &str = "cp";
const PORT: u16 = 7000;
/// The one sender every request comes from (the control plane).
const SENDER: u64 = 0;

/// Every host's date at simulated time 0, in ms (2030-03-17).
const DATE_AT_START: u64 = 1_900_000_000_000;

/// A host's wall clock in the simulation: the date at start plus the
/// simulated time, plus an offset the harness moves (the node's only).
/// The node's records its reads.
#[derive(Debug, Default)]
struct SimClock {
    offset_ms: std::sync::atomic::AtomicI64,
    /// The harness's view: steps, node starts and reads.
    seen: Option<Mutex<NodeClock>>,
}

impl SimClock {
    fn watched() -> Self {
        SimClock {
            offset_ms: Default::default(),
            seen: Some(Mutex::new(NodeClock {
                base: DATE_AT_START,
                ..NodeClock::default()
            })),
        }
    }

    /// Moves the clock by `by` ms from now on.
    fn step(&self, by: i64) {
        let offset = self.offset_ms.fetch_add(by, Ordering::SeqCst) + by;
        if let Some(seen) = &self.seen {
            lock(seen).steps.push((now_ms(), offset));
        }
    }

    fn started(&self) {
        if let Some(seen) = &self.seen {
            lock(seen).starts.push(now_ms());
        }
    }

    fn date_ms(&self) -> u64 {
        let at = DATE_AT_START as i64 + now_ms() as i64 + self.offset_ms.load(Ordering::SeqCst);
        at.max(0) as u64
    }
}

impl capwire::clock::WallClock for SimClock {
    fn now(&self) -> std::time::SystemTime {
        let date = self.date_ms();
        if let Some(seen) = &self.seen {
            lock(seen).reads.push((now_ms(), date));
        }
        std::time::UNIX_EPOCH + Duration::from_millis(date)
    }
}

/// Args of `apply`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub(crate) struct ApplyArgs {
    /// The req_id it is sent under (the handler records its runs by it).
    key: String,
    /// How long it works, in simulated ms.
    ms: u64,
}

/// Args of `job` and `job2`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub(crate) struct JobArgs {
    n: u64,
    every_ms: u64,
    /// Asks a question halfway (answered within 3 s, or not at all).
    ask: bool,
}

verb! {
    /// Counts one application of `key`; answers the node's start it ran
    /// in and the count so far.
    pub(crate) struct Apply: request "app.chk" / "apply", Controller, ApplyArgs => (u64, u64);
}
verb! {
    /// `n` progress steps, one every `every_ms`, then `n`.
    pub(crate) struct Job: task "app.chk" / "job", Controller, JobArgs => u64;
}
verb! {
    /// The same work under another verb.
    pub(crate) struct Job2: task "app.chk" / "job2", Controller, JobArgs => u64;
}

/// The handlers' runs, as the node saw them.
#[derive(Clone, Default)]
struct Runs {
    runs: Arc<Mutex<Vec<Execution>>>,
    count: Arc<AtomicU64>,
    /// Node starts so far: the one a handler runs in.
    starts: Arc<AtomicU32>,
}

fn now_ms() -> Tick {
    turmoil::sim_elapsed().unwrap_or_default().as_millis() as Tick
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The replay ledger is kept in memory (WIRE.md 4.4): a request is run
/// at most once per start of the node, so runs and answers are told apart
/// by the start they came from (as if each start were its own sender).
async fn apply(args: ApplyArgs, State(runs): State<Runs>) -> Result<(u64, u64), HandlerError> {
    let start = u64::from(runs.starts.load(Ordering::SeqCst));
    lock(&runs.runs).push(Execution {
        sender: start,
        req_id: args.key,
        verb: "app.chk/apply".into(),
        at: now_ms(),
    });
    tokio::time::sleep(Duration::from_millis(args.ms)).await;
    Ok((start, runs.count.fetch_add(1, Ordering::SeqCst) + 1))
}

async fn job(args: JobArgs, task: Task) -> Result<u64, HandlerError> {
    for step in 1..=args.n {
        tokio::time::sleep(Duration::from_millis(args.every_ms)).await;
        task.progress(&step).await?;
        if args.ask && step == args.n.div_ceil(2) {
            // The answer, when one comes, is the next progress.
            if let Ok(answer) = task.ask::<u64, u64>(&step, Duration::from_secs(3)).await {
                task.progress(&answer).await?;
            }
        }
    }
    Ok(args.n)
}

fn keypair(seed: u64, role: u8) -> Keypair {
    let mut bytes = [0xc3; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8] = role;
    Keypair::from_secret_bytes(bytes)
}

/// What one run checked, for the sweep's totals.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    /// Operations recorded (register operations, request and submit
    /// attempts, subscriptions).
    pub(crate) ops: u64,
    /// Of those, with an unknown outcome.
    pub(crate) unknown: u64,
    /// Faults injected: cuts of the link.
    pub(crate) cuts: u64,
    /// Faults injected: crashes of the node host.
    pub(crate) crashes: u64,
    /// Handler runs recorded.
    pub(crate) runs: u64,
    /// Task events received by subscribers.
    pub(crate) events: u64,
    /// Faults injected: records written twice.
    pub(crate) duplicates: u64,
    /// Of those, read by the node, which then wrote nothing more on that
    /// session once what it had queued was out ([`QUIET_AFTER_DUPLICATE`];
    /// writing more fails the run). The rest never reached the node: their
    /// connection was cut first.
    pub(crate) duplicates_refused: u64,
    /// Changes of authority (binds, unbinds, grants presented, revocations).
    pub(crate) authority: u64,
    /// Questions answered (acknowledged).
    pub(crate) answered: u64,
    /// Tasks cancelled (the cancel answered `cancelled`).
    pub(crate) cancelled: u64,
    /// Faults injected: steps of the node's clock.
    pub(crate) clock_steps: u64,
    /// Reads of tasks' states (gets, cancels' answers), in `ops`.
    pub(crate) task_reads: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.ops += o.ops;
        self.unknown += o.unknown;
        self.cuts += o.cuts;
        self.crashes += o.crashes;
        self.runs += o.runs;
        self.events += o.events;
        self.duplicates += o.duplicates;
        self.duplicates_refused += o.duplicates_refused;
        self.authority += o.authority;
        self.answered += o.answered;
        self.cancelled += o.cancelled;
        self.clock_steps += o.clock_steps;
        self.task_reads += o.task_reads;
    }
}

/// A fault of the schedule.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Both ways, dropped.
    Partition,
    /// Both ways, held and delivered at the heal.
    Hold,
    /// One way, dropped.
    OneWay(&'static str, &'static str),
    /// The node host killed, then started again.
    Crash,
    /// The next record the control plane writes, written twice.
    Duplicate,
}

/// What the node host and the harness share.
#[derive(Default)]
struct Shared {
    /// The invite of the node's first start.
    invite: Mutex<Option<capwire::Invite>>,
    /// The node now (gone while its host is down).
    node: Mutex<Option<Node>>,
    runs: Runs,
    /// Between the control plane and the delegate.
    board: Mutex<Board>,
    /// The records the control plane wrote twice.
    dups: Arc<Dups>,
    /// The node's wall clock, which the grant rounds move.
    node_clock: Arc<SimClock>,
    /// The other hosts' clock.
    clock: Arc<SimClock>,
}

/// What the control plane hands the delegate, and what it says back.
#[derive(Default)]
struct Board {
    /// The delegate's id and grant key, once it runs.
    delegate: Option<(NodeId, GrantPublicKey)>,
    /// Tokens minted for it, newest last, with (at least) their expiry date.
    tokens: Vec<(String, u64)>,
    /// Set when the delegate is to stop.
    stop: bool,
}

/// Everything the clients recorded.
#[derive(Default)]
struct Record {
    register: History<RegInput<RawValue>, RegOutput<RawValue>>,
    requests: Vec<Request<(u64, u64)>>,
    submits: Vec<Request<String>>,
    /// Per task: the subscriber's segments.
    subscriptions: BTreeMap<String, Vec<Segment<EventKind>>>,
    /// Changes of authority: the control plane's binding (key "cp") and
    /// the delegate's grants (key "delegate").
    authority: Vec<AuthorityChange<&'static str>>,
    /// Controller calls that needed them.
    controller_calls: Vec<ControllerCall<&'static str>>,
    /// Tokens the delegate presented.
    presented: Vec<Presented<&'static str>>,
    /// Answers given to tasks' questions: (task, question seq, answer,
    /// whether an attempt was answered ok).
    responds: Vec<(String, u64, u64, bool)>,
    /// Cancels: (task, the state its answer gave, if one came).
    cancels: Vec<(String, Option<TaskState>)>,
    /// Reads of tasks' states (gets, and cancels' answers), by task.
    task_reads: BTreeMap<String, Vec<TaskRead<TaskState>>>,
    unknown: u64,
}

/// What an event says, as compared with the task's log.
pub(crate) type EventKind = (TaskEventKind, String);

fn kind_of(e: &TaskEvent) -> Event<EventKind> {
    Event::new(e.seq, (e.kind, format!("{:?} {:?}", e.state, e.body)))
}

fn node_software(
    seed: u64,
    dir: PathBuf,
    cp: NodeId,
    shared: Arc<Shared>,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = turmoil::Result>>> {
    move || {
        let (dir, shared) = (dir.clone(), shared.clone());
        Box::pin(async move {
            shared.node_clock.started();
            let node = Node::builder("chk-node")
                .keypair(keypair(seed, 1))
                .wall_clock(shared.node_clock.clone())
                .limits(Limits {
                    stream_idle_timeout: Duration::from_secs(5),
                    ..Limits::default()
                })
                .capability(
                    Capability::new("app.chk", "1.0.0")?
                        .handle(Apply, apply)
                        .task(Job, job)
                        .task(Job2, job),
                )
                .state(shared.runs.clone())
                .state_dir(dir)
                .start()
                .await?;
            if node.controller().is_none() && lock(&shared.invite).is_none() {
                let invite = node.invite(Some(cp))?;
                lock(&shared.invite).replace(invite);
            }
            lock(&shared.node).replace(node.clone());
            shared.runs.starts.fetch_add(1, Ordering::SeqCst);
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
            loop {
                let (stream, peer) = listener.accept().await?;
                node.accept_stream(NodeEnd {
                    inner: stream,
                    peer,
                    read: 0,
                    dups: shared.dups.clone(),
                });
            }
        })
    }
}

/// The control plane's one session to the node, dialled again by whoever
/// finds it gone.
struct Link {
    cp: Node,
    node: NodeId,
    peer: tokio::sync::Mutex<(u64, Peer)>,
    dups: Arc<Dups>,
}

impl Link {
    /// The session now, and its generation.
    async fn get(&self) -> (u64, Peer) {
        let g = self.peer.lock().await;
        (g.0, g.1.clone())
    }

    /// Dials again, unless someone already did since generation `seen`.
    async fn redial(&self, seen: u64) {
        let mut g = self.peer.lock().await;
        if g.0 != seen {
            return;
        }
        let peer = dial_with(&self.cp, self.node, Some(&self.dups)).await;
        *g = (g.0 + 1, peer);
    }
}

async fn dial(cp: &Node, node: NodeId) -> Peer {
    dial_with(cp, node, None).await
}

/// Dials, the stream wrapped in a [`DupStream`] when `dup` is given.
async fn dial_with(cp: &Node, node: NodeId, dup: Option<&Arc<Dups>>) -> Peer {
    loop {
        let attempt = async {
            let stream = turmoil::net::TcpStream::connect((NODE, PORT)).await.ok()?;
            match dup {
                Some(d) => {
                    let addr = stream.local_addr().ok()?;
                    cp.connect_stream(DupStream::new(stream, addr, d.clone()), Some(node))
                        .await
                        .ok()
                }
                None => cp.connect_stream(stream, Some(node)).await.ok(),
            }
        };
        if let Ok(Some(peer)) = tokio::time::timeout(Duration::from_secs(2), attempt).await {
            return peer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After the node read a record written twice, what it had queued before
/// may still go out within this; anything later means it went on serving
/// the session.
const QUIET_AFTER_DUPLICATE: Tick = 50;

/// Duplicated records: the fault's switch and what came of it.
#[derive(Default)]
struct Dups {
    /// Set by the schedule: the next record written is written twice.
    armed: std::sync::atomic::AtomicBool,
    /// Each copy written, and what the node did about it.
    seen: Mutex<Vec<Copy>>,
}

/// A record the control plane wrote twice, watched from both ends of
/// its connection.
struct Copy {
    /// The control plane's end of the connection (the node's peer).
    addr: std::net::SocketAddr,
    /// When it was written, in simulated ms.
    written: Tick,
    /// Where the copy ends in the bytes the control plane wrote.
    end: u64,
    /// When the node's session read past its end.
    read: Option<Tick>,
    /// The last time the node wrote on that connection after reading it.
    wrote_after: Option<Tick>,
}

/// The node's end of a connection: tells [`Dups`] when the node read a
/// copy and whether it wrote anything after.
struct NodeEnd<S> {
    inner: S,
    peer: std::net::SocketAddr,
    read: u64,
    dups: Arc<Dups>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for NodeEnd<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read += (buf.filled().len() - before) as u64;
        for c in lock(&this.dups.seen).iter_mut() {
            if c.addr == this.peer && c.read.is_none() && this.read >= c.end {
                c.read = Some(now_ms());
            }
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for NodeEnd<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, std::task::Poll::Ready(Ok(n)) if n > 0) {
            for c in lock(&this.dups.seen).iter_mut() {
                if c.addr == this.peer && c.read.is_some() {
                    c.wrote_after = Some(now_ms());
                }
            }
        }
        r
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The control plane's side of a session's byte stream, which can write
/// one record (`len:u16be message[len]`, WIRE.md 1.2) twice: a record
/// replayed on the wire, which the node must refuse (its nonce is spent:
/// the session ends) and never act on twice.
struct DupStream<S> {
    inner: S,
    /// The record being taken apart.
    frame: Vec<u8>,
    /// What is to be written to `inner`.
    out: Vec<u8>,
    sent: usize,
    records: u64,
    /// Bytes queued so far.
    queued: u64,
    /// Whether this stream wrote its one duplicate.
    duplicated: bool,
    /// This end's address, as the node sees it.
    addr: std::net::SocketAddr,
    dups: Arc<Dups>,
}

impl<S> DupStream<S> {
    fn new(inner: S, addr: std::net::SocketAddr, dups: Arc<Dups>) -> Self {
        DupStream {
            inner,
            frame: Vec::new(),
            out: Vec::new(),
            sent: 0,
            records: 0,
            queued: 0,
            duplicated: false,
            addr,
            dups,
        }
    }

    /// Takes `buf` apart into records, queueing each (twice when armed,
    /// past the handshake's three messages).
    fn take(&mut self, mut buf: &[u8]) {
        while !buf.is_empty() {
            let need = if self.frame.len() < 2 {
                2 - self.frame.len()
            } else {
                2 + usize::from(u16::from_be_bytes([self.frame[0], self.frame[1]]))
                    - self.frame.len()
            };
            let n = need.min(buf.len());
            self.frame.extend_from_slice(&buf[..n]);
            buf = &buf[n..];
            let whole = self.frame.len() >= 2
                && self.frame.len()
                    == 2 + usize::from(u16::from_be_bytes([self.frame[0], self.frame[1]]));
            if whole {
                self.out.extend_from_slice(&self.frame);
                self.queued += self.frame.len() as u64;
                self.records += 1;
                if self.records > 3
                    && !self.duplicated
                    && self.dups.armed.swap(false, Ordering::SeqCst)
                {
                    self.out.extend_from_slice(&self.frame);
                    self.queued += self.frame.len() as u64;
                    self.duplicated = true;
                    lock(&self.dups.seen).push(Copy {
                        addr: self.addr,
                        written: now_ms(),
                        end: self.queued,
                        read: None,
                        wrote_after: None,
                    });
                }
                self.frame.clear();
            }
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> DupStream<S> {
    fn drain(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        while self.sent < self.out.len() {
            match std::pin::Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for DupStream<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        let this = self.get_mut();
        match this.drain(cx) {
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            // Bounded: at most 64 KiB waits here.
            Poll::Pending if this.out.len() - this.sent > 64 * 1024 => return Poll::Pending,
            _ => {}
        }
        this.take(buf);
        if let Poll::Ready(Err(e)) = this.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for DupStream<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

/// Whether an error says the call's answer may be lost (no answer seen).
fn lost(e: &CallError) -> bool {
    matches!(
        e,
        CallError::Timeout | CallError::PeerLost | CallError::Unreachable(_)
    )
}

fn code(e: &CallError) -> Option<&ErrorCode> {
    e.code()
}

/// How one client's attempts at one call went: its answer, when it came
/// (`None`: never).
struct Tries<T> {
    answer: Result<T, CallError>,
    at: Option<Tick>,
}

/// Sends `call` again under the same req_id while its answer is lost or
/// it is still running (`duplicate` from a ledger that has it running),
/// up to `tries` times, `keep_going` permitting; records every attempt
/// with `note`.
async fn retried<T, F, Fut>(
    link: &Link,
    tries: u32,
    keep_going: impl Fn() -> bool,
    mut note: impl FnMut(Tick, Option<Tick>, &Result<T, CallError>),
    mut call: F,
) -> Tries<T>
where
    F: FnMut(Peer) -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let mut last = Tries {
        answer: Err(CallError::Timeout),
        at: None,
    };
    for _ in 0..tries {
        if !keep_going() {
            break;
        }
        let (generation, peer) = link.get().await;
        let invoke = now_ms();
        let r = call(peer).await;
        let done = now_ms();
        let seen = match &r {
            Err(e) if lost(e) => None,
            _ => Some(done),
        };
        note(invoke, seen, &r);
        let again = match &r {
            Err(e) if lost(e) => {
                link.redial(generation).await;
                true
            }
            Err(e) if code(e) == Some(&ErrorCode::Duplicate) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                true
            }
            _ => false,
        };
        last = Tries {
            answer: r,
            at: seen,
        };
        if !again {
            break;
        }
    }
    last
}

/// One attempt of a request or a submit as its sender saw it, counted
/// among the unknown outcomes when no answer came.
fn attempt<T: Clone>(
    unknown: &mut u64,
    sender: u64,
    req_id: &ReqId,
    verb: &str,
    invoke: Tick,
    complete: Option<Tick>,
    r: &Result<T, CallError>,
) -> Request<T> {
    let answer = answer_of(r);
    if matches!(answer, Answer::Unknown) {
        *unknown += 1;
    }
    Request {
        sender,
        req_id: req_id.to_string(),
        verb: verb.into(),
        invoke,
        complete,
        answer,
    }
}

fn answer_of<T: Clone>(r: &Result<T, CallError>) -> Answer<T> {
    match r {
        Ok(v) => Answer::Ok(v.clone()),
        Err(e) if lost(e) => Answer::Unknown,
        Err(e) if code(e) == Some(&ErrorCode::Duplicate) => Answer::Duplicate,
        Err(e) => Answer::Refused(format!("{e}")),
    }
}

/// One client: `ops` operations of every kind, one at a time.
async fn client(
    id: u64,
    mut rng: StdRng,
    ops: u32,
    link: Arc<Link>,
    shared: Arc<Shared>,
    record: Arc<Mutex<Record>>,
) {
    let d = Duration::from_millis(1500);
    let mut last_version = 0u64;
    let mut used_job_ids: Vec<ReqId> = Vec::new();
    for n in 0..ops {
        // Paced, so that the operations span the schedule of faults.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..600))).await;
        let req = ReqId::try_from(format!("c{id}-{n}").as_str()).unwrap();
        match rng.random_range(0..10u32) {
            // The configuration: a read.
            0..=2 => {
                let (generation, peer) = link.get().await;
                let invoke = now_ms();
                let r = peer.request_within(GetConfig, NoArgs {}, d).await;
                let again = {
                    let mut rec = lock(&record);
                    let op = rec.register.invoke(id, RegInput::Get, invoke);
                    match r {
                        Ok(ConfigValue { value, version }) => {
                            last_version = version;
                            rec.register
                                .complete(op, now_ms(), RegOutput::Got { version, value });
                            false
                        }
                        Err(e) if lost(&e) => {
                            rec.unknown += 1;
                            true
                        }
                        Err(e) => panic!("client {id}: get_config refused: {e}"),
                    }
                };
                if again {
                    link.redial(generation).await;
                }
            }
            // The configuration: a write, or a compare-and-set on the last
            // version this client saw.
            3..=5 => {
                let value = RawValue::encode(&format!("c{id}-{n}")).unwrap();
                let cas = rng.random_bool(0.5).then_some(last_version);
                let input = match cas {
                    Some(v) => RegInput::Cas {
                        expect_version: v,
                        value: value.clone(),
                    },
                    None => RegInput::Set(value.clone()),
                };
                let invoke = now_ms();
                let args = SetConfigArgs {
                    value,
                    if_version: cas,
                };
                let tries = retried(
                    &link,
                    30,
                    || true,
                    |_, _, _| {},
                    |peer| {
                        let (args, req) = (args.clone(), req.clone());
                        async move { peer.request_with_id(SetConfig, args, &req, d).await }
                    },
                )
                .await;
                let mut rec = lock(&record);
                let op = rec.register.invoke(id, input, invoke);
                match tries.answer {
                    Ok(reply) => {
                        last_version = reply.version;
                        let at = tries.at.unwrap();
                        rec.register.complete(
                            op,
                            at,
                            RegOutput::Written {
                                version: reply.version,
                            },
                        );
                    }
                    Err(CallError::Remote(body)) if body.code == ErrorCode::Conflict => {
                        #[derive(serde::Deserialize)]
                        struct Detail {
                            version: u64,
                        }
                        let current = body
                            .detail
                            .as_ref()
                            .and_then(|d| d.decode::<Detail>().ok())
                            .expect("a conflict names the version")
                            .version;
                        last_version = current;
                        rec.register.complete(
                            op,
                            tries.at.unwrap(),
                            RegOutput::Conflict { current },
                        );
                    }
                    Err(e) if lost(&e) || code(&e) == Some(&ErrorCode::Duplicate) => {
                        rec.unknown += 1;
                    }
                    Err(e) => panic!("client {id}: set_config refused: {e}"),
                }
            }
            // A request retried under its req_id until answered, while the
            // node has not restarted since the first try.
            6..=7 => {
                let starts = shared.runs.starts.load(Ordering::SeqCst);
                let args = ApplyArgs {
                    key: req.to_string(),
                    ms: rng.random_range(0..400),
                };
                let rec2 = record.clone();
                let req2 = req.clone();
                let shared2 = shared.clone();
                retried(
                    &link,
                    30,
                    || shared2.runs.starts.load(Ordering::SeqCst) == starts,
                    |invoke, complete, r: &Result<(u64, u64), CallError>| {
                        // The start that answered, or the one asked.
                        let sender = match r {
                            Ok((start, _)) => *start,
                            Err(_) => u64::from(starts),
                        };
                        let rec = &mut *lock(&rec2);
                        let a = attempt(
                            &mut rec.unknown,
                            sender,
                            &req2,
                            "app.chk/apply",
                            invoke,
                            complete,
                            r,
                        );
                        rec.requests.push(a);
                    },
                    |peer| {
                        let (args, req) = (args.clone(), req.clone());
                        async move { peer.request_with_id(Apply, args, &req, d).await }
                    },
                )
                .await;
            }
            // A task: submitted (retried under its req_id), followed to
            // its end across cuts, resumed from the last seq plus 1; now
            // and then, a req_id of an earlier job reused on `job2`.
            _ => {
                if !used_job_ids.is_empty() && rng.random_bool(0.3) {
                    let reused = used_job_ids[rng.random_range(0..used_job_ids.len())].clone();
                    let (generation, peer) = link.get().await;
                    let invoke = now_ms();
                    let args = JobArgs {
                        n: 1,
                        every_ms: 1,
                        ask: false,
                    };
                    let r = peer
                        .submit_with_id(Job2, args, &reused, d)
                        .await
                        .map(|t| t.id().to_owned());
                    let complete = (!matches!(&r, Err(e) if lost(e))).then(now_ms);
                    {
                        let rec = &mut *lock(&record);
                        let a = attempt(
                            &mut rec.unknown,
                            SENDER,
                            &reused,
                            "app.chk/job2",
                            invoke,
                            complete,
                            &r,
                        );
                        rec.submits.push(a);
                    }
                    if matches!(&r, Err(e) if lost(e)) {
                        link.redial(generation).await;
                    }
                    continue;
                }
                used_job_ids.push(req.clone());
                let args = JobArgs {
                    n: rng.random_range(3..12),
                    every_ms: rng.random_range(50..400),
                    ask: rng.random_bool(0.4),
                };
                let cancel_after = rng
                    .random_bool(0.2)
                    .then(|| rng.random_range(0..args.n * args.every_ms));
                let rec2 = record.clone();
                let req2 = req.clone();
                let tries = retried(
                    &link,
                    40,
                    || true,
                    |invoke, complete, r: &Result<String, CallError>| {
                        let rec = &mut *lock(&rec2);
                        let a = attempt(
                            &mut rec.unknown,
                            SENDER,
                            &req2,
                            "app.chk/job",
                            invoke,
                            complete,
                            r,
                        );
                        rec.submits.push(a);
                    },
                    |peer| {
                        let (args, req) = (args.clone(), req.clone());
                        async move {
                            peer.submit_with_id(Job, args, &req, d)
                                .await
                                .map(|t| t.id().to_owned())
                        }
                    },
                )
                .await;
                if let Ok(task) = tries.answer {
                    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let poller = tokio::spawn(poll(
                        link.clone(),
                        task.clone(),
                        record.clone(),
                        rng.random(),
                        stop.clone(),
                    ));
                    let canceller = cancel_after.map(|ms| {
                        let (link, record, task) = (link.clone(), record.clone(), task.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            cancel(&link, &task, &record).await;
                        })
                    });
                    let seen_end = follow(&link, &task, &record).await;
                    if let Some(c) = canceller {
                        c.await.unwrap();
                    }
                    stop.store(true, Ordering::SeqCst);
                    poller.await.unwrap();
                    if !seen_end {
                        return;
                    }
                }
            }
        }
    }
}

/// Follows task `task` from seq 1 to its end, resuming after each cut
/// from the last seq received plus 1; then subscribes once more from 1.
/// Whether it saw the end (when not, the client stops: the check will
/// say what went wrong).
async fn follow(link: &Link, task: &str, record: &Mutex<Record>) -> bool {
    let mut next = 1u64;
    let mut finished = false;
    let mut rounds = 0;
    // A bound on resumes: a stream that never ends is shown as cut (and
    // the task's end, unseen, is a violation: see `unseen_end`).
    let mut segments = 0;
    while (!finished || rounds < 1) && segments < MAX_SEGMENTS {
        segments += 1;
        if finished {
            // Once more from the start, after the end.
            rounds += 1;
            next = 1;
        }
        let (generation, peer) = link.get().await;
        let handle = peer.task::<u64>(task);
        let mut segment = Segment {
            from: next,
            received: Vec::new(),
            end: SegmentEnd::Cut,
        };
        match tokio::time::timeout(Duration::from_secs(3), handle.events(next)).await {
            Ok(Ok(mut events)) => loop {
                match tokio::time::timeout(Duration::from_secs(8), events.next()).await {
                    Ok(Some(Ok(e))) => {
                        next = e.seq + 1;
                        segment.received.push(kind_of(&e));
                        if e.kind == TaskEventKind::Question && e.state == TaskState::InputRequired
                        {
                            respond(link, task, e.seq, record).await;
                        }
                    }
                    Ok(None) => {
                        segment.end = SegmentEnd::Finished;
                        finished = true;
                        break;
                    }
                    Ok(Some(Err(_))) | Err(_) => break,
                }
            },
            Ok(Err(e)) if !lost(&e) => panic!("task {task}: events refused: {e}"),
            _ => {}
        }
        let cut = segment.end == SegmentEnd::Cut;
        lock(record)
            .subscriptions
            .entry(task.to_owned())
            .or_default()
            .push(segment);
        if cut {
            link.redial(generation).await;
        }
    }
    finished
}

/// How a controller call went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Called {
    Ok,
    Refused,
    /// No answer came.
    Lost,
}

/// One controller call of `key`'s (an `apply` under a fresh req_id, not
/// retried), recorded.
async fn controller_call(peer: &Peer, key: &'static str, n: u64, record: &Mutex<Record>) -> Called {
    let req = ReqId::try_from(format!("{key}-{n}").as_str()).unwrap();
    let args = ApplyArgs {
        key: req.to_string(),
        ms: 0,
    };
    let invoke = now_ms();
    let r = peer
        .request_with_id(Apply, args, &req, Duration::from_millis(1500))
        .await;
    let lost = matches!(&r, Err(e) if lost(e));
    lock(record).controller_calls.push(ControllerCall {
        key,
        verb: "app.chk/apply".into(),
        invoke,
        complete: (!lost).then(now_ms),
        acknowledged: r.is_ok(),
    });
    match r {
        Ok(_) => Called::Ok,
        Err(_) if lost => Called::Lost,
        Err(_) => Called::Refused,
    }
}

/// The delegate host: a node that presents the newest token the control
/// plane minted for it and makes controller calls with it, presenting
/// again after every lost session, until told to stop.
async fn delegate(seed: u64, shared: Arc<Shared>, record: Arc<Mutex<Record>>) -> turmoil::Result {
    let me = Node::builder("chk-delegate")
        .keypair(keypair(seed, 3))
        .wall_clock(shared.clock.clone())
        .start()
        .await?;
    lock(&shared.board).delegate = Some((me.id(), me.grant_key()));
    let node_id = loop {
        if let Some(i) = lock(&shared.invite).as_ref() {
            break i.node_id;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut n = 0u64;
    let mut presented = 0usize;
    // When the newest token was last presented again after a refusal.
    let mut again_at: Option<Tick> = None;
    let mut peer: Option<Peer> = None;
    loop {
        let (stop, newest) = {
            let b = lock(&shared.board);
            (b.stop, b.tokens.len())
        };
        if stop {
            return Ok(());
        }
        if newest == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let p = match &peer {
            Some(p) => p.clone(),
            None => {
                let p = dial(&me, node_id).await;
                peer = Some(p.clone());
                presented = 0;
                p
            }
        };
        if presented < newest {
            let (token, expires) = lock(&shared.board).tokens[newest - 1].clone();
            let invoke = now_ms();
            lock(&record).presented.push(Presented {
                key: "delegate",
                invoke,
                expires,
            });
            let r = p.present(&token).await;
            match &r {
                Ok(_) => record_grant(&record, "delegate", invoke, Some(now_ms())),
                Err(e) if lost(e) => {
                    record_grant(&record, "delegate", invoke, None);
                    peer = None;
                    continue;
                }
                // Refused (revoked, or void since the binding changed).
                Err(_) => {}
            }
            presented = newest;
        }
        n += 1;
        match controller_call(&p, "delegate", n, &record).await {
            Called::Lost => peer = None,
            // Refused (expired, revoked): the newest token is presented
            // again, as a client that does not read the refusal would (at
            // most every 250 ms: a presentation is a token verified).
            Called::Refused => {
                if again_at.is_none_or(|at| now_ms() >= at + 250) {
                    again_at = Some(now_ms());
                    presented = 0;
                }
            }
            Called::Ok => {}
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

fn record_grant(record: &Mutex<Record>, key: &'static str, invoke: Tick, complete: Option<Tick>) {
    lock(record).authority.push(AuthorityChange {
        key,
        kind: AuthorityKind::Grant,
        invoke,
        complete,
    });
}

/// The control plane's side of the grants: `rounds` times, mints a token
/// for the delegate (for `app.chk/apply` only), lets it work a while, and
/// revokes it. Half the tokens are short (2 to 6 s): the node's clock is
/// then stepped past their expiry while the delegate calls, and half the
/// time set back again, as a time service correcting it would.
async fn grant_rounds(
    rng: &mut StdRng,
    cp: &Node,
    link: &Link,
    shared: &Shared,
    record: &Mutex<Record>,
    rounds: u32,
) {
    let (holder, holder_key) = loop {
        if let Some(d) = lock(&shared.board).delegate {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    for _ in 0..rounds {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2000))).await;
        let short = rng.random_bool(0.5);
        let valid_for = if short {
            Duration::from_millis(rng.random_range(2000..6000))
        } else {
            Duration::from_secs(3600)
        };
        let token = loop {
            let (generation, peer) = link.get().await;
            let minted = cp
                .grant(
                    &peer,
                    holder,
                    holder_key,
                    vec![Right::verb("app.chk", "apply")],
                    valid_for,
                )
                .await;
            match minted {
                Ok(t) => break t,
                Err(capwire::grants::GrantCallError::Call(e)) if lost(&e) => {
                    link.redial(generation).await;
                }
                Err(e) => panic!("minting a grant failed: {e}"),
            }
        };
        // Dated by the control plane's clock while `grant` ran: at most
        // now (a second more for the token's rounding).
        let expires = shared.clock.date_ms() + valid_for.as_millis() as u64 + 1000;
        lock(&shared.board).tokens.push((token.clone(), expires));
        if short {
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
            let ahead = valid_for.as_millis() as i64 + rng.random_range(1000..20_000);
            shared.node_clock.step(ahead);
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..2000))).await;
            if rng.random_bool(0.5) {
                shared.node_clock.step(-ahead);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..3000))).await;
        let id = capwire::grants::revocation_ids(&token).unwrap()[0].clone();
        let invoke = now_ms();
        let tries = retried(
            link,
            30,
            || true,
            |_, _, _| {},
            |peer| {
                let id = id.clone();
                async move { peer.revoke_grant(&id).await }
            },
        )
        .await;
        assert!(
            tries.answer.is_ok(),
            "the revocation was not answered: {:?}",
            tries.answer.err()
        );
        lock(record).authority.push(AuthorityChange {
            key: "delegate",
            kind: AuthorityKind::Revoke,
            invoke,
            complete: tries.at,
        });
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
    lock(&shared.board).stop = true;
}

/// The binding: controller calls race an unbind of the control plane
/// (`core.monitoring/disable`) and the bind again with a new invite.
async fn binding_round(
    rng: &mut StdRng,
    cp_id: NodeId,
    link: Arc<Link>,
    shared: &Shared,
    record: Arc<Mutex<Record>>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (link, record, stop) = (link.clone(), record.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let (generation, peer) = link.get().await;
                if controller_call(&peer, "cp", n, &record).await == Called::Lost {
                    link.redial(generation).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
    // Unbound: answered, or seen on the node itself when the answer is lost.
    let invoke = now_ms();
    let mut complete = None;
    while complete.is_none() {
        let (generation, peer) = link.get().await;
        match peer
            .request_within(MonitoringDisable, NoArgs {}, Duration::from_millis(1500))
            .await
        {
            Ok(()) => complete = Some(now_ms()),
            Err(e) if lost(&e) => link.redial(generation).await,
            // Already unbound (a lost answer to an earlier try).
            Err(_) => break,
        }
    }
    lock(&record).authority.push(AuthorityChange {
        key: "cp",
        kind: AuthorityKind::Unbind,
        invoke,
        complete,
    });
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
    // Bound again with a new invite.
    let invoke = now_ms();
    loop {
        let node = loop {
            if let Some(n) = lock(&shared.node).clone() {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if node.controller() == Some(cp_id) {
            break;
        }
        let Ok(invite) = node.invite(Some(cp_id)) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (generation, peer) = link.get().await;
        if let Err(e) = peer.bind(&invite).await
            && lost(&e)
        {
            link.redial(generation).await;
        }
    }
    record_grant(&record, "cp", invoke, Some(now_ms()));
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..1000))).await;
    stop.store(true, Ordering::SeqCst);
    racer.await.unwrap();
}

/// Answers the question of event `seq` of `task` (with a value made from
/// both), retried while its answer is lost; recorded.
async fn respond(link: &Link, task: &str, seq: u64, record: &Mutex<Record>) {
    let answer = 1_000_000 + seq;
    let tries = retried(
        link,
        10,
        || true,
        |_, _, _| {},
        |peer| {
            let task = task.to_owned();
            async move { peer.task::<u64>(task).respond_to(Some(seq), &answer).await }
        },
    )
    .await;
    lock(record)
        .responds
        .push((task.to_owned(), seq, answer, tries.answer.is_ok()));
}

/// Cancels `task`, retried while its answer is lost; recorded.
async fn cancel(link: &Link, task: &str, record: &Mutex<Record>) {
    let tries = retried(
        link,
        30,
        || true,
        |invoke, complete, r: &Result<TaskInfo, CallError>| {
            read_of(record, task, invoke, complete, r);
        },
        |peer| {
            let task = task.to_owned();
            async move { peer.task::<u64>(task).cancel().await }
        },
    )
    .await;
    let state = tries.answer.ok().map(|info| info.state);
    lock(record).cancels.push((task.to_owned(), state));
}

/// Records a read of `task`'s state.
fn read_of(
    record: &Mutex<Record>,
    task: &str,
    invoke: Tick,
    complete: Option<Tick>,
    r: &Result<TaskInfo, CallError>,
) {
    let rec = &mut *lock(record);
    if complete.is_none() {
        rec.unknown += 1;
    }
    rec.task_reads
        .entry(task.to_owned())
        .or_default()
        .push(TaskRead {
            invoke,
            complete,
            saw: r.as_ref().ok().map(|i| (i.seq, i.state)),
        });
}

/// Reads `task`'s state (`core.tasks/get`) every 100 to 800 ms until
/// `stop`, over whatever session the link has, recording each read.
async fn poll(
    link: Arc<Link>,
    task: String,
    record: Arc<Mutex<Record>>,
    seed: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..800))).await;
        let (generation, peer) = link.get().await;
        let invoke = now_ms();
        let r = tokio::time::timeout(Duration::from_millis(1500), peer.task::<u64>(&task).get())
            .await
            .unwrap_or(Err(CallError::Timeout));
        let lost = matches!(&r, Err(e) if lost(e));
        read_of(&record, &task, invoke, (!lost).then(now_ms), &r);
        if lost {
            link.redial(generation).await;
        }
    }
}

/// Each question is answered at most once in a task's log, and an answer
/// acknowledged is the one written; a cancel that answered a final state
/// is the state the log ends in.
fn answers_and_cancels(
    logs: &BTreeMap<String, (u64, Vec<Event<EventKind>>)>,
    responds: &[(String, u64, u64, bool)],
    cancels: &[(String, Option<TaskState>)],
) -> Result<(), Violation> {
    for (task, (_, log)) in logs {
        let mut open: Option<u64> = None;
        for e in log {
            match e.kind.0 {
                TaskEventKind::Question => open = Some(e.seq),
                TaskEventKind::Answer => match open.take() {
                    Some(_) => {}
                    None => {
                        return Err(Violation::new(
                            checker::Property::ExactlyOnceRequests,
                            format!("task {task}: an answer with no question waiting"),
                            vec![format!("seq {} {:?}", e.seq, e.kind)],
                        ));
                    }
                },
                _ => {}
            }
        }
    }
    for (task, seq, answer, acknowledged) in responds {
        let Some((_, log)) = logs.get(task) else {
            continue;
        };
        let body = format!("{:?}", RawValue::encode(answer).unwrap());
        let written = log
            .iter()
            .filter(|e| {
                e.seq > *seq && e.kind.0 == TaskEventKind::Answer && e.kind.1.contains(&body)
            })
            .count();
        if written > 1 || (*acknowledged && written == 0) {
            return Err(Violation::new(
                checker::Property::ExactlyOnceRequests,
                format!(
                    "task {task}: the answer {answer} to the question at seq {seq} \
                     (acknowledged: {acknowledged}) is in the log {written} times"
                ),
                log.iter()
                    .filter(|e| e.seq >= *seq)
                    .take(4)
                    .map(|e| format!("seq {} {:?}", e.seq, e.kind))
                    .collect(),
            ));
        }
    }
    for (task, state) in cancels {
        let (Some((_, log)), Some(state)) = (logs.get(task), state) else {
            continue;
        };
        if !state.is_final() {
            continue;
        }
        let last = log.last().map(|e| e.kind.1.clone()).unwrap_or_default();
        if !last.starts_with(&format!("{state:?} ")) {
            return Err(Violation::new(
                checker::Property::SubscriberStream,
                format!("task {task}: cancelled with the answer {state:?}, its log ends otherwise"),
                vec![last],
            ));
        }
    }
    Ok(())
}

/// Subscriptions one subscriber opens to one task at most.
const MAX_SEGMENTS: usize = 40;

/// A task that ended (its record says so, at seq `end`) whose subscriber
/// never received that last event, however often it resumed: an event
/// lost.
fn unseen_end(task: &str, end: u64, segments: &[Segment<EventKind>]) -> Result<(), Violation> {
    if segments
        .iter()
        .flat_map(|s| &s.received)
        .any(|e| e.seq == end)
    {
        return Ok(());
    }
    let mut lines: Vec<String> = segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "resume #{i} from seq {}: received {:?}, {:?}",
                s.from,
                s.received.iter().map(|e| e.seq).collect::<Vec<_>>(),
                s.end
            )
        })
        .collect();
    lines.truncate(6);
    Err(Violation::new(
        checker::Property::SubscriberStream,
        format!(
            "task {task} ended at seq {end}, and its subscriber, resuming {} times, \
             never received that event",
            segments.len()
        ),
        lines,
    ))
}

/// The task's log as the node keeps it, read over a session no fault
/// touches, checked against the task's record: a log whose last event is
/// not the one the record counts to (its final state) is shown with that
/// event missing.
/// `None` when the session was lost on the way.
async fn log_of(peer: &Peer, task: &str) -> Option<(u64, Vec<Event<EventKind>>)> {
    let handle = peer.task::<u64>(task);
    let info = match handle.get().await {
        Ok(info) => info,
        Err(e) if lost(&e) => return None,
        Err(e) => panic!("task {task} is not kept: {e}"),
    };
    let mut events = match handle.events(1).await {
        Ok(events) => events,
        Err(e) if lost(&e) => return None,
        Err(e) => panic!("task {task}: its log is not read: {e}"),
    };
    let mut log = Vec::new();
    // Read to its end, or as far as it goes.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(Ok(e))) => log.push(kind_of(&e)),
            Ok(Some(Err(e))) if lost(&e) => return None,
            Ok(Some(Err(_)) | None) | Err(_) => break,
        }
    }
    if log.last().is_none_or(|e| e.seq < info.seq) {
        log.push(Event::new(
            info.seq,
            (
                TaskEventKind::Result,
                format!("{:?}: missing from the log", info.state),
            ),
        ));
    }
    let end = if info.state.is_final() { info.seq } else { 0 };
    Some((end, log))
}

/// A failure of one run: its seed, the property, the records that show it.
pub(crate) fn report(seed: u64, v: Violation) -> String {
    format!(
        "{}
replay with: CAPWIRE_CHK_SEED={seed} cargo test --test sim_checked -- --nocapture",
        v.with_seed(seed)
    )
}

/// Runs seed `seed`: `clients` clients of `ops` operations each, under a
/// seeded schedule of faults. Returns what was checked, or the first
/// violation.
pub(crate) fn run(seed: u64, clients: u64, ops: u32) -> Result<Counts, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let min = rng.random_range(1..5);
    let max = min + rng.random_range(1..60);
    let mut builder = turmoil::Builder::new();
    builder
        .rng_seed(seed)
        .simulation_duration(Duration::from_secs(3600))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(min))
        .max_message_latency(Duration::from_millis(max))
        .enable_random_order();
    let mut sim = builder.build();
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared {
        node_clock: Arc::new(SimClock::watched()),
        ..Shared::default()
    });
    let cp_key = keypair(seed, 2);
    sim.host(
        NODE,
        node_software(
            seed,
            dir.path().join("node"),
            cp_key.public(),
            shared.clone(),
        ),
    );

    // The schedule of faults: a few, each at a seeded time after the first
    // second, none overlapping.
    let mut schedule = Vec::new();
    let mut at = Duration::from_millis(rng.random_range(1000..3000));
    for _ in 0..rng.random_range(2..6u32) {
        let fault = match rng.random_range(0..6u32) {
            0 => Fault::Partition,
            1 => Fault::Hold,
            2 => Fault::OneWay(CP, NODE),
            3 => Fault::OneWay(NODE, CP),
            4 => Fault::Duplicate,
            _ => Fault::Crash,
        };
        let length = Duration::from_millis(rng.random_range(200..6000));
        schedule.push((at, fault, length));
        at += length + Duration::from_millis(rng.random_range(500..4000));
    }
    let crashes: Vec<(Duration, Duration)> = schedule
        .iter()
        .filter(|(_, f, _)| matches!(f, Fault::Crash))
        .map(|(at, _, len)| (*at, *len))
        .collect();
    let duplicates = schedule
        .iter()
        .filter(|(_, f, _)| matches!(f, Fault::Duplicate))
        .count() as u64;
    let cuts = schedule.len() as u64 - crashes.len() as u64 - duplicates;
    let dups = shared.dups.clone();

    let record = Arc::new(Mutex::new(Record::default()));
    {
        let (shared, record) = (shared.clone(), record.clone());
        sim.client("delegate", delegate(seed, shared, record));
    }
    let result: Arc<Mutex<Option<Result<(), Violation>>>> = Arc::default();
    let events_seen = Arc::new(AtomicU64::new(0));
    {
        let (shared, record, result) = (shared.clone(), record.clone(), result.clone());
        let dups = dups.clone();
        let events_seen = events_seen.clone();
        let client_rng = StdRng::seed_from_u64(rng.random());
        sim.client(CP, async move {
            let cp = Node::builder("chk-cp")
                .keypair(cp_key)
                .wall_clock(shared.clock.clone())
                .limits(Limits {
                    stream_idle_timeout: Duration::from_secs(5),
                    ..Limits::default()
                })
                .start()
                .await?;
            let invite = loop {
                if let Some(i) = lock(&shared.invite).clone() {
                    break i;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            let peer = dial_with(&cp, invite.node_id, Some(&dups)).await;
            peer.bind(&invite).await?;
            let link = Arc::new(Link {
                cp: cp.clone(),
                node: invite.node_id,
                peer: tokio::sync::Mutex::new((0, peer)),
                dups: dups.clone(),
            });
            let armer = dups.clone();
            // The link's faults (crashes are the driver's).
            let faults = tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                for (at, fault, length) in schedule {
                    tokio::time::sleep_until(started + at).await;
                    match fault {
                        Fault::Partition => turmoil::partition(CP, NODE),
                        Fault::Hold => turmoil::hold(CP, NODE),
                        Fault::OneWay(from, to) => turmoil::partition_oneway(from, to),
                        Fault::Duplicate => {
                            // Armed for its window only, so that no other
                            // fault comes within 500 ms of the copy.
                            armer.armed.store(true, Ordering::SeqCst);
                            tokio::time::sleep(length).await;
                            armer.armed.store(false, Ordering::SeqCst);
                            continue;
                        }
                        Fault::Crash => continue,
                    }
                    tokio::time::sleep(length).await;
                    match fault {
                        Fault::Hold => turmoil::release(CP, NODE),
                        _ => turmoil::repair(CP, NODE),
                    }
                }
            });
            let mut rng = client_rng;
            // The grants, beside the clients.
            let grants = {
                let (cp, link, shared, record) =
                    (cp.clone(), link.clone(), shared.clone(), record.clone());
                let mut rng = StdRng::seed_from_u64(rng.random());
                tokio::spawn(async move {
                    let rounds = rng.random_range(1..4);
                    grant_rounds(&mut rng, &cp, &link, &shared, &record, rounds).await;
                })
            };
            let mut running = Vec::new();
            for id in 1..=clients {
                let c = client(
                    id,
                    StdRng::seed_from_u64(rng.random()),
                    ops,
                    link.clone(),
                    shared.clone(),
                    record.clone(),
                );
                running.push(tokio::spawn(c));
            }
            for c in running {
                c.await?;
            }
            grants.await?;
            // The binding, once the clients are done (their calls need it).
            let mut binding_rng = StdRng::seed_from_u64(rng.random());
            binding_round(
                &mut binding_rng,
                cp.id(),
                link.clone(),
                &shared,
                record.clone(),
            )
            .await;
            faults.await?;
            // Every fault over (the driver's last crash may still come):
            // the last word, read again whole if a session is lost.
            let tasks: Vec<String> = lock(&record).subscriptions.keys().cloned().collect();
            let (final_read, logs) = loop {
                let (generation, _) = link.get().await;
                link.redial(generation).await;
                let (_, peer) = link.get().await;
                let final_read = match peer
                    .request_within(GetConfig, NoArgs {}, Duration::from_secs(5))
                    .await
                {
                    Ok(v) => v,
                    Err(e) if lost(&e) => continue,
                    Err(e) => panic!("the final read was refused: {e}"),
                };
                let mut logs = BTreeMap::new();
                let mut whole = true;
                for task in &tasks {
                    match log_of(&peer, task).await {
                        Some(log) => {
                            logs.insert(task.clone(), log);
                        }
                        None => {
                            whole = false;
                            break;
                        }
                    }
                }
                if whole {
                    break (final_read, logs);
                }
            };
            let mut rec = lock(&record);
            let t = now_ms();
            rec.register.push(checker::Op::ok(
                0,
                RegInput::Get,
                t,
                t,
                RegOutput::Got {
                    version: final_read.version,
                    value: final_read.value,
                },
            ));
            let executions = lock(&shared.runs.runs).clone();
            let node_clock = shared
                .node_clock
                .seen
                .as_ref()
                .map(|s| lock(s).clone())
                .unwrap_or_default();
            let check = (|| {
                checker::linearizable(
                    &Register::new(RawValue::null()),
                    &rec.register,
                    LinOptions::default(),
                )?;
                checker::exactly_once_requests(&rec.requests, &executions)?;
                checker::answers_backed_by_executions(&rec.requests, &executions)?;
                checker::exactly_once_submits(&rec.submits)?;
                checker::no_effect_after_revocation(&rec.authority, &rec.controller_calls)?;
                checker::no_effect_after_expiry(
                    &node_clock,
                    &rec.presented,
                    &rec.controller_calls,
                )?;
                answers_and_cancels(&logs, &rec.responds, &rec.cancels)?;
                for (task, segments) in &rec.subscriptions {
                    events_seen.fetch_add(
                        segments.iter().map(|s| s.received.len() as u64).sum(),
                        Ordering::Relaxed,
                    );
                    let (end, log) = &logs[task];
                    checker::subscriber_stream(SENDER, log, segments)?;
                    if *end > 0 {
                        unseen_end(task, *end, segments)?;
                    }
                }
                // Reads after streams: a log that lost an event fails the
                // stream check first, which names the event.
                for (task, reads) in &rec.task_reads {
                    if let Some((_, log)) = logs.get(task) {
                        checker::task_reads(task, log, reads, |(_, said), state| {
                            said.starts_with(&format!("{state:?} "))
                        })?;
                    }
                }
                Ok(())
            })();
            *lock(&result) = Some(check);
            Ok(())
        });
    }

    // The driver: steps the simulation, crashing and restarting the node
    // host on the schedule.
    let mut crashes_left = crashes.into_iter().peekable();
    let mut down_until: Option<Duration> = None;
    let mut crashed = 0;
    loop {
        let done = sim
            .step()
            .map_err(|e| format!("seed {seed}: the simulation failed: {e}"))?;
        if done {
            break;
        }
        let now = sim.elapsed();
        if let Some(until) = down_until
            && now >= until
        {
            sim.bounce(NODE);
            down_until = None;
        }
        if down_until.is_none()
            && let Some(&(at, length)) = crashes_left.peek()
            && now >= at + Duration::from_secs(1)
        {
            crashes_left.next();
            sim.crash(NODE);
            // The node is gone with its host: nobody may ask it anything.
            drop(lock(&shared.node).take());
            crashed += 1;
            down_until = Some(now + length);
        }
    }
    let check = lock(&result)
        .take()
        .ok_or_else(|| format!("seed {seed}: the run ended before its check"))?;
    check.map_err(|v| report(seed, v))?;
    let (duplicates, duplicates_refused) = {
        let seen = lock(&dups.seen);
        let mut refused = 0;
        for c in seen.iter() {
            match (c.read, c.wrote_after) {
                (Some(read), Some(last)) if last > read + QUIET_AFTER_DUPLICATE => {
                    return Err(format!(
                        "seed {seed}: the node read a record written twice at {read} ms \
                         (written at {}) and went on writing on that session until {last} ms",
                        c.written
                    ));
                }
                (Some(_), _) => refused += 1,
                // The session ended (a cut, a crash) before the copy came.
                (None, _) => {}
            }
        }
        (seen.len() as u64, refused)
    };
    let rec = lock(&record);
    let subscriptions: u64 = rec.subscriptions.values().map(|s| s.len() as u64).sum();
    let task_reads: u64 = rec.task_reads.values().map(|r| r.len() as u64).sum();
    Ok(Counts {
        ops: (rec.register.len()
            + rec.requests.len()
            + rec.submits.len()
            + rec.authority.len()
            + rec.controller_calls.len()) as u64
            + subscriptions
            + task_reads,
        task_reads,
        unknown: rec.unknown,
        cuts,
        crashes: crashed,
        runs: lock(&shared.runs.runs).len() as u64,
        events: events_seen.load(Ordering::Relaxed),
        duplicates,
        duplicates_refused,
        authority: rec.authority.len() as u64,
        answered: rec.responds.iter().filter(|r| r.3).count() as u64,
        cancelled: rec
            .cancels
            .iter()
            .filter(|c| c.1 == Some(TaskState::Canceled))
            .count() as u64,
        clock_steps: shared
            .node_clock
            .seen
            .as_ref()
            .map_or(0, |s| lock(s).steps.len() as u64),
    })
}
