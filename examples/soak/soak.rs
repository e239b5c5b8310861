//! The soak: many `capwire node` processes under one control plane, calls
//! between them for a bounded time, nodes killed and restarted at a fixed
//! cadence, and a report of what was answered, what failed and why, how
//! long calls took, and what the nodes' memory did.
//!
//! Shared by `examples/soak/main.rs` (on demand, any size) and
//! `tests/soak.rs` (a short run in CI).
//!
//! ```text
//!                  control plane (this process, a library Node)
//!        binds every node; the nodes are its contacts (redialled)
//!           |  echo (request)   note (notification)   ask (request)
//!           v                                          v
//!   +--------------+  ...  +--------------+   node A --echo--> node B
//!   | capwire node |       | capwire node |   (B one of A's contacts,
//!   |  --supervised|       |  --supervised|    core.connect/introduce)
//!   +--------------+       +--------------+
//! ```
//!
//! Why processes and not nodes in this process: memory per node is then
//! the node's own (VmHWM and VmRSS from `/proc/PID/status`), not a share of
//! one heap; a restart is a real `kill -9` and a new process on the same
//! state directory and address; and each node has its own runtime, as it
//! would in production. Nodes run with `--supervised`, so that they stop
//! when this process does, however it ends.
//!
//! The built-in `app.agent` capability of `capwire node` decides the
//! traffic: `echo` (a bootstrap request) and `note` (a bootstrap
//! notification) go from the control plane to a node; `ask` (a controller
//! request) makes node A call node B's `echo`, which is the node-to-node
//! traffic (A's contacts are chosen at random, seeded). A node cannot
//! notify another node through `app.agent`, so notifications come from
//! the control plane only.
//!
//! What is checked: every request started has ended (in an answer or a
//! typed error, counted at both ends: started and ended); every error
//! involves a node that was being restarted around that time (from its
//! kill to [`SETTLE`] after it was ready again); every answer is the
//! right one; every node is still bound to the control plane at the end;
//! after the load stops, no node has calls pending, requests running or
//! bytes queued; and the memory of the nodes that were never restarted
//! grows by at most the configured factor from the end of the warm-up to
//! the end of the run.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use capwire::envelope::ErrorCode;
use capwire::manifest::{ConnectIntroduce, IntroduceArgs, MonitoringStatusRead, NoArgs, verb};
use capwire::{Addr, CallError, Contact, ControlEvent, Invite, Node, NodeId, Peer};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

verb! {
    /// `app.agent/echo` of every `capwire node`: answers `NAME: TEXT`.
    pub(crate) struct Echo: request "app.agent" / "echo", Bootstrap, String => String;
}

verb! {
    /// `app.agent/note` of every `capwire node`: a fire-and-forget note.
    pub(crate) struct Note: notification "app.agent" / "note", Bootstrap, String;
}

/// Args of `app.agent/ask`.
#[derive(Debug, Clone, Serialize, Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub(crate) struct AskArgs {
    /// The node to ask, 64 hex digits.
    pub(crate) peer: String,
    /// What to send its echo.
    pub(crate) text: String,
}

verb! {
    /// `app.agent/ask` of every `capwire node` (controller): the node calls
    /// `peer`'s echo and answers what it said.
    pub(crate) struct Ask: request "app.agent" / "ask", Controller, AskArgs => String;
}

/// How long after a restarted node is ready again its restart still
/// explains an error (its contacts redial it with a backoff that starts at
/// 100 ms).
pub(crate) const SETTLE: Duration = Duration::from_secs(3);

/// What the gauges may show once the load has stopped: monitoring copies
/// waiting (the node's queue holds 1024 at most) and ledger bytes (a
/// node's whole ledger is bounded by 64 MiB by default).
const MAX_COPIES_QUEUED: u64 = 1024;
const MAX_LEDGER_BYTES: u64 = 64 << 20;

/// A soak run.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// `capwire node` processes.
    pub(crate) nodes: usize,
    /// How long the load runs.
    pub(crate) duration: Duration,
    /// A node killed (SIGKILL) and restarted this often; none when `None`.
    pub(crate) restarts_every: Option<Duration>,
    /// Seeds the choices: contacts, calls, which node is restarted.
    pub(crate) seed: u64,
    /// Calls per second offered, in all.
    pub(crate) rate: u32,
    /// Calls at once, at most (each worker makes one call at a time).
    pub(crate) workers: usize,
    /// Contacts of each node (the nodes its `ask` may call).
    pub(crate) contacts: usize,
    /// Deadline of each call.
    pub(crate) deadline: Duration,
    /// Largest allowed ratio of a node's RSS at the end to its RSS after
    /// the warm-up.
    pub(crate) growth_limit: f64,
    /// The `capwire` binary.
    pub(crate) bin: PathBuf,
}

impl Config {
    /// The warm-up: a fifth of the run, between 2 and 10 s.
    pub(crate) fn warmup(&self) -> Duration {
        (self.duration / 5).clamp(Duration::from_secs(2), Duration::from_secs(10))
    }

    /// The restarts the run makes: one every `restarts_every`, none at or
    /// after its end.
    pub(crate) fn planned_restarts(&self) -> usize {
        match self.restarts_every {
            Some(every) if !every.is_zero() => {
                let n = self.duration.as_secs_f64() / every.as_secs_f64();
                // Strictly before the end.
                (n.ceil() as usize).saturating_sub(1)
            }
            _ => 0,
        }
    }
}

/// splitmix64: small, seeded, good enough to pick nodes.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The next port to try in [`free_port`].
static NEXT_PORT: AtomicU64 = AtomicU64::new(0);

/// A port free now, below the kernel's ephemeral range: a node is
/// restarted on the same port, and a port from the ephemeral range could
/// meanwhile be taken as the local port of some outgoing connection.
fn free_port() -> Result<u16, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32768);
    let span = 12_000.min(low.saturating_sub(1025)).max(1);
    let base = low - span;
    // Start somewhere that depends on this process, then walk.
    let _ = NEXT_PORT.compare_exchange(
        0,
        u64::from(std::process::id()) * 7919 % span + 1,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let port = base + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free port in {base}..{low}"))
}

/// The last lines of a node's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// A `kB` field of `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in KiB.
fn status_kb(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A running `capwire node --supervised`; killed when dropped.
struct Proc {
    child: Child,
    /// Its stdin: the node stops when it closes.
    stdin: Option<ChildStdin>,
    pid: Option<u32>,
}

/// One node of the soak: where it lives, and its process.
struct Slot {
    name: String,
    dir: PathBuf,
    listen: String,
    metrics: SocketAddr,
    id: Option<NodeId>,
    proc: Option<Proc>,
    /// The largest VmHWM any of its processes reached, in KiB.
    peak_kb: u64,
    /// Killed and restarted at least once.
    restarted: bool,
    /// VmRSS at the end of the warm-up and at the end, in KiB.
    warm_kb: Option<u64>,
    end_kb: Option<u64>,
}

impl Slot {
    fn new(i: usize, base: &Path) -> Result<Self, String> {
        let name = format!("n{i:02}");
        Ok(Self {
            dir: base.join(&name),
            listen: format!("tcp://127.0.0.1:{}", free_port()?),
            metrics: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            name,
            id: None,
            proc: None,
            peak_kb: 0,
            restarted: false,
            warm_kb: None,
            end_kb: None,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(|p| p.pid)
    }

    fn sample_peak(&mut self) {
        if let Some(kb) = self.pid().and_then(|pid| status_kb(Some(pid), "VmHWM:")) {
            self.peak_kb = self.peak_kb.max(kb);
        }
    }

    fn rss_kb(&self) -> Option<u64> {
        self.pid().and_then(|pid| status_kb(Some(pid), "VmRSS:"))
    }

    /// Starts its process; the lines it prints come on the receiver.
    fn spawn(&mut self, bin: &Path) -> Result<mpsc::UnboundedReceiver<String>, String> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&self.dir)
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .map_err(|e| format!("log of {}: {e}", self.name))?;
        let mut child = Command::new(bin)
            .args(["node", "--supervised", "--name", &self.name, "--listen"])
            .arg(&self.listen)
            .arg("--metrics")
            .arg(self.metrics.to_string())
            .arg("--state")
            .arg(&self.dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| "no stdout".to_owned())?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            // Read to the end, whether or not anyone still listens.
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(line);
            }
        });
        self.proc = Some(Proc {
            pid: child.id(),
            stdin: child.stdin.take(),
            child,
        });
        Ok(rx)
    }

    /// Waits for the process's `ready` line; the node's id.
    async fn ready(
        &mut self,
        lines: &mut mpsc::UnboundedReceiver<String>,
    ) -> Result<NodeId, String> {
        let line = next_json(lines, Duration::from_secs(30), |v| v["event"] == "ready")
            .await
            .map_err(|e| {
                let log = self.dir.with_extension("log");
                format!("{}: {e}; its log: {}", self.name, log_tail(&log))
            })?;
        let id: NodeId = line["node_id"]
            .as_str()
            .and_then(|s| NodeId::try_from(s).ok())
            .ok_or_else(|| format!("{}: no node id in {line}", self.name))?;
        if let Some(known) = self.id
            && known != id
        {
            return Err(format!("{} came back as another node: {id}", self.name));
        }
        self.id = Some(id);
        Ok(id)
    }

    /// Asks the supervised node for an invite that only `controller` may
    /// use.
    async fn invite(
        &mut self,
        lines: &mut mpsc::UnboundedReceiver<String>,
        controller: NodeId,
    ) -> Result<Invite, String> {
        let request =
            format!("{{\"id\":1,\"op\":\"open_bind\",\"controller\":\"{controller}\"}}\n");
        let stdin = self
            .proc
            .as_mut()
            .and_then(|p| p.stdin.as_mut())
            .ok_or_else(|| format!("{} is not running", self.name))?;
        stdin
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("{}: {e}", self.name))?;
        let reply = next_json(lines, Duration::from_secs(10), |v| v["reply"] == 1)
            .await
            .map_err(|e| format!("{}: {e}", self.name))?;
        reply["invite"]
            .as_str()
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| format!("{}: no invite in {reply}", self.name))
    }

    /// How its process ended, when it ended by itself (it is then gone).
    fn exited(&mut self) -> Option<String> {
        let status = self.proc.as_mut()?.child.try_wait().ok()??;
        self.proc = None;
        let log = self.dir.with_extension("log");
        Some(format!(
            "the process ended by itself ({status}); its log: {}",
            log_tail(&log)
        ))
    }

    /// SIGKILL, and waits for the process to be gone.
    async fn kill_9(&mut self) {
        self.sample_peak();
        if let Some(mut p) = self.proc.take() {
            let _ = p.child.start_kill();
            let _ = p.child.wait().await;
        }
    }

    /// Closes its stdin (a supervised node then stops cleanly) and waits
    /// a moment; kills it if it is still there.
    async fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stdin = None;
            if tokio::time::timeout(Duration::from_secs(10), p.child.wait())
                .await
                .is_err()
            {
                let _ = p.child.start_kill();
                let _ = p.child.wait().await;
            }
        }
    }
}

/// The next line that is JSON and that `pred` accepts.
async fn next_json(
    lines: &mut mpsc::UnboundedReceiver<String>,
    within: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value, String> {
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Err(_) => return Err(format!("nothing within {within:?}")),
            Ok(None) => return Err("the process ended".into()),
            Ok(Some(line)) => {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && pred(&v)
                {
                    return Ok(v);
                }
            }
        }
    }
}

/// What a node's `/metrics` said.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Gauges {
    pub(crate) pending_calls: u64,
    pub(crate) inflight: u64,
    pub(crate) queued_bytes: u64,
    pub(crate) ledger_running: u64,
    pub(crate) ledger_remembered: u64,
    pub(crate) ledger_forgotten: u64,
    pub(crate) ledger_bytes: u64,
    pub(crate) copies_queued: u64,
    pub(crate) copies_dropped: u64,
    pub(crate) sessions: u64,
}

/// Reads a node's `/metrics`.
async fn scrape(addr: SocketAddr) -> Result<Gauges, String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| format!("{addr}: no metrics within 5 s"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut g = Gauges::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let value = value as u64;
        match series {
            "capwire_pending_calls" => g.pending_calls = value,
            "capwire_inflight" => g.inflight = value,
            "capwire_queued_bytes" => g.queued_bytes = value,
            "capwire_ledger_entries{state=\"running\"}" => g.ledger_running = value,
            "capwire_ledger_entries{state=\"remembered\"}" => g.ledger_remembered = value,
            "capwire_ledger_entries{state=\"forgotten\"}" => g.ledger_forgotten = value,
            "capwire_ledger_bytes" => g.ledger_bytes = value,
            "capwire_copies_queued" => g.copies_queued = value,
            "capwire_copies_dropped_total" => g.copies_dropped = value,
            s if s.starts_with("capwire_sessions{") => g.sessions += value,
            _ => {}
        }
    }
    Ok(g)
}

/// How a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ErrorKind {
    /// No answer within the deadline (here or at the node that asked).
    Timeout,
    /// The session ended before the answer.
    PeerLost,
    /// No session could be had.
    Unreachable,
    /// Refused by a chokepoint.
    Denied,
    /// Anything else.
    Other,
}

impl ErrorKind {
    const ALL: [ErrorKind; 5] = [
        ErrorKind::Timeout,
        ErrorKind::PeerLost,
        ErrorKind::Unreachable,
        ErrorKind::Denied,
        ErrorKind::Other,
    ];

    fn name(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::PeerLost => "peer lost",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Denied => "denied",
            ErrorKind::Other => "other",
        }
    }

    /// The kind of `e`; an `ask` whose own call failed answers
    /// `unavailable` with that error's text, which says the kind.
    fn of(e: &CallError) -> ErrorKind {
        match e {
            CallError::Timeout => ErrorKind::Timeout,
            CallError::PeerLost => ErrorKind::PeerLost,
            CallError::Unreachable(_) => ErrorKind::Unreachable,
            CallError::Denied(_) => ErrorKind::Denied,
            CallError::Remote(body) if body.code == ErrorCode::Unavailable => {
                let m = body.message.as_str();
                if m.contains("no answer within the deadline") {
                    ErrorKind::Timeout
                } else if m.contains("connection to the peer was lost") {
                    ErrorKind::PeerLost
                } else if m.contains("is not reachable") {
                    ErrorKind::Unreachable
                } else if m.contains("denied by peer") {
                    ErrorKind::Denied
                } else {
                    ErrorKind::Other
                }
            }
            _ => ErrorKind::Other,
        }
    }
}

/// What a call was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CallKind {
    /// Control plane to node: a request.
    Echo,
    /// Control plane to node A, A to node B: requests.
    Ask,
    /// Control plane to node: a notification.
    Note,
}

impl CallKind {
    fn name(self) -> &'static str {
        match self {
            CallKind::Echo => "echo",
            CallKind::Ask => "ask",
            CallKind::Note => "note",
        }
    }
}

/// One call, as it ended.
#[derive(Debug, Clone)]
struct Record {
    kind: CallKind,
    start: Instant,
    end: Instant,
    /// The nodes it went through.
    nodes: [Option<usize>; 2],
    error: Option<(ErrorKind, String)>,
}

/// What the workers count.
#[derive(Default)]
struct Tally {
    started: AtomicU64,
    ended: AtomicU64,
    records: Mutex<Vec<Record>>,
    wrong: Mutex<Vec<String>>,
}

/// What every worker needs.
struct Plan {
    peers: Vec<Peer>,
    ids: Vec<NodeId>,
    names: Vec<String>,
    contacts: Vec<Vec<usize>>,
    deadline: Duration,
    /// Each worker's pause between calls.
    every: Duration,
    seed: u64,
}

async fn worker(w: usize, plan: Arc<Plan>, tally: Arc<Tally>, end: Instant) {
    let mut rng = Rng::new(plan.seed ^ (0x5151_0000 + w as u64));
    let n = plan.peers.len();
    // Spread the workers' first calls over one pause.
    let mut next = Instant::now() + plan.every.mul_f64(rng.below(1000) as f64 / 1000.0);
    let mut count = 0u64;
    loop {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        if now >= end {
            return;
        }
        // Behind (calls slower than the pace): no burst to catch up.
        next = (next + plan.every).max(now);
        count += 1;
        let text = format!("w{w}-{count}");
        let a = rng.below(n);
        let roll = rng.below(100);
        tally.started.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let (kind, nodes, result) = if roll < 50 && !plan.contacts[a].is_empty() {
            let b = plan.contacts[a][rng.below(plan.contacts[a].len())];
            let args = AskArgs {
                peer: plan.ids[b].to_string(),
                text: text.clone(),
            };
            let r = plan.peers[a].request_within(Ask, args, plan.deadline).await;
            let expected = format!("{}: {text}", plan.names[b]);
            (
                CallKind::Ask,
                [Some(a), Some(b)],
                r.map(|got| (got, expected)),
            )
        } else if roll < 75 {
            let r = plan.peers[a]
                .request_within(Echo, text.clone(), plan.deadline)
                .await;
            let expected = format!("{}: {text}", plan.names[a]);
            (
                CallKind::Echo,
                [Some(a), None],
                r.map(|got| (got, expected)),
            )
        } else {
            let r = plan.peers[a]
                .notify_within(Note, text.clone(), plan.deadline)
                .await;
            (
                CallKind::Note,
                [Some(a), None],
                r.map(|()| (String::new(), String::new())),
            )
        };
        let end_at = Instant::now();
        tally.ended.fetch_add(1, Ordering::Relaxed);
        let error = match result {
            Ok((got, expected)) => {
                if got != expected {
                    lock(&tally.wrong).push(format!(
                        "{} {text}: {got:?}, expected {expected:?}",
                        kind.name()
                    ));
                }
                None
            }
            Err(e) => Some((ErrorKind::of(&e), e.to_string())),
        };
        lock(&tally.records).push(Record {
            kind,
            start,
            end: end_at,
            nodes,
            error,
        });
    }
}

/// A node killed and started again.
#[derive(Debug, Clone)]
pub(crate) struct Restart {
    pub(crate) node: usize,
    pub(crate) name: String,
    /// When it was killed, from the start of the load.
    pub(crate) at: Duration,
    /// From the kill to its `ready` line.
    pub(crate) down: Duration,
    killed: Instant,
    ready: Instant,
}

/// Figures of one kind of call.
#[derive(Debug, Clone, Default)]
pub(crate) struct KindFigures {
    pub(crate) made: u64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

/// What a soak run found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) nodes: usize,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) seed: u64,
    pub(crate) rate: u32,
    pub(crate) workers: usize,
    pub(crate) contacts: usize,
    pub(crate) restarts_every: Option<Duration>,
    pub(crate) planned_restarts: usize,
    pub(crate) growth_limit: f64,
    /// How long the setup (starting, binding, introducing) took.
    pub(crate) setup: Duration,

    /// Calls started and ended (answered or failed).
    pub(crate) started: u64,
    pub(crate) ended: u64,
    pub(crate) kinds: BTreeMap<&'static str, KindFigures>,
    pub(crate) errors: BTreeMap<&'static str, u64>,
    /// Requests only (echo and ask): answered.
    pub(crate) requests: KindFigures,
    /// Errors no restart explains, described (the first 20) and counted.
    pub(crate) unexplained: Vec<String>,
    pub(crate) unexplained_count: usize,
    /// Answers that were not what was asked.
    pub(crate) wrong: Vec<String>,
    pub(crate) restarts: Vec<Restart>,

    /// Per node: the peak VmHWM over its processes, KiB.
    pub(crate) peak_kb: Vec<u64>,
    /// Nodes never restarted: (name, RSS after warm-up, RSS at the end), KiB.
    pub(crate) growth: Vec<(String, u64, u64)>,
    /// This process (the control plane and the soak's own tables): RSS
    /// after the warm-up and at the end, KiB.
    pub(crate) cp_rss_kb: (u64, u64),
    /// The control plane's calls waiting for answers at the end.
    pub(crate) cp_pending: usize,
    /// Gauges of every node after the warm-up and after the drain.
    pub(crate) warm_gauges: Vec<Gauges>,
    pub(crate) end_gauges: Vec<Gauges>,
    /// Monitoring copies the control plane received, and the copies the
    /// nodes said they had dropped.
    pub(crate) copies: u64,
    pub(crate) copies_gaps: u64,
    /// The nodes (names) by how many copies their current process dropped.
    pub(crate) copies_dropped_by: Vec<(String, u64)>,
    /// Nodes that were no longer bound to the control plane at the end
    /// (or could not say).
    pub(crate) not_bound: Vec<String>,
    /// Nodes whose process ended without being killed, or whose metrics
    /// could not be read.
    pub(crate) failures: Vec<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

impl Report {
    /// The largest end/warm-up RSS ratio of the nodes never restarted.
    pub(crate) fn max_growth(&self) -> Option<f64> {
        self.growth
            .iter()
            .map(|(_, w, e)| *e as f64 / (*w).max(1) as f64)
            .max_by(f64::total_cmp)
    }

    /// What the run must not show; empty when it passed.
    pub(crate) fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.started != self.ended {
            v.push(format!(
                "{} calls started, {} ended: {} never ended",
                self.started,
                self.ended,
                self.started - self.ended
            ));
        }
        if self.unexplained_count > 0 {
            v.push(format!(
                "{} errors not around a restart of a node they involve: {:?}",
                self.unexplained_count, self.unexplained
            ));
        }
        if !self.wrong.is_empty() {
            v.push(format!(
                "{} wrong answers: {:?}",
                self.wrong.len(),
                self.wrong
            ));
        }
        if self.requests.ok == 0 {
            v.push("no request was answered".into());
        }
        if self.restarts.len() != self.planned_restarts {
            v.push(format!(
                "{} restarts made, {} planned",
                self.restarts.len(),
                self.planned_restarts
            ));
        }
        if let Some(g) = self.max_growth()
            && g > self.growth_limit
        {
            let worst: Vec<String> = self
                .growth
                .iter()
                .filter(|(_, w, e)| *e as f64 / (*w).max(1) as f64 > self.growth_limit)
                .map(|(n, w, e)| format!("{n}: {:.1} -> {:.1} MiB", mib(*w), mib(*e)))
                .collect();
            v.push(format!(
                "memory grew {g:.2}x (limit {:.2}x): {worst:?}",
                self.growth_limit
            ));
        }
        for (i, g) in self.end_gauges.iter().enumerate() {
            let busy = g.pending_calls != 0
                || g.inflight != 0
                || g.queued_bytes != 0
                || g.ledger_running != 0;
            if busy || g.copies_queued > MAX_COPIES_QUEUED || g.ledger_bytes > MAX_LEDGER_BYTES {
                v.push(format!("node {i} after the drain: {g:?}"));
            }
        }
        if self.cp_pending != 0 {
            v.push(format!(
                "the control plane still waits on {} calls",
                self.cp_pending
            ));
        }
        for f in &self.failures {
            v.push(f.clone());
        }
        if !self.not_bound.is_empty() {
            v.push(format!("no longer bound: {:?}", self.not_bound));
        }
        v
    }
}

fn sum(gauges: &[Gauges], f: impl Fn(&Gauges) -> u64) -> u64 {
    gauges.iter().map(f).sum()
}

fn max(gauges: &[Gauges], f: impl Fn(&Gauges) -> u64) -> u64 {
    gauges.iter().map(f).max().unwrap_or(0)
}

fn ms(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let restarts = match self.restarts_every {
            Some(e) => format!("a restart every {e:?} ({} made)", self.restarts.len()),
            None => "no restarts".into(),
        };
        writeln!(
            f,
            "soak: {} capwire node processes under one control plane, {:?} of load after {:.1?} of setup, {restarts}, seed {}",
            self.nodes, self.duration, self.setup, self.seed
        )?;
        writeln!(
            f,
            "  load      {} calls/s offered by {} workers; {} contacts per node; warm-up {:?}",
            self.rate, self.workers, self.contacts, self.warmup
        )?;
        let errors: u64 = self.errors.values().sum();
        writeln!(
            f,
            "  calls     {} started, {} ended: {} answered or sent, {} errors",
            self.started,
            self.ended,
            self.ended - errors.min(self.ended),
            errors
        )?;
        for (name, k) in &self.kinds {
            if *name == "note" {
                writeln!(
                    f,
                    "    {name:<6}  {:>8} sent   {:>6} errors (fire-and-forget: handed to the session)",
                    k.ok, k.errors
                )?;
            } else {
                writeln!(
                    f,
                    "    {name:<6}  {:>8} answered {:>4} errors   p50 {}  p99 {}  max {}",
                    k.ok,
                    k.errors,
                    ms(k.p50),
                    ms(k.p99),
                    ms(k.max)
                )?;
            }
        }
        writeln!(
            f,
            "  latency   requests answered: p50 {}  p99 {}  max {}",
            ms(self.requests.p50),
            ms(self.requests.p99),
            ms(self.requests.max)
        )?;
        let by_type: Vec<String> = ErrorKind::ALL
            .iter()
            .map(|k| format!("{} {}", k.name(), self.errors.get(k.name()).unwrap_or(&0)))
            .collect();
        writeln!(f, "  errors    {}", by_type.join(", "))?;
        writeln!(
            f,
            "            {} of {errors} around a restart of a node they went through (kill .. ready + {SETTLE:?}); {} not",
            errors as usize - self.unexplained_count.min(errors as usize),
            self.unexplained_count
        )?;
        let mut peaks = self.peak_kb.clone();
        let peak_max = peaks.iter().copied().max().unwrap_or(0);
        let peak_median = median(&mut peaks);
        writeln!(
            f,
            "  memory    peak per node (VmHWM of its processes): max {:.1} MiB, median {:.1} MiB",
            mib(peak_max),
            mib(peak_median)
        )?;
        let mut warm: Vec<u64> = self.growth.iter().map(|g| g.1).collect();
        let mut end: Vec<u64> = self.growth.iter().map(|g| g.2).collect();
        let mut ratios: Vec<f64> = self
            .growth
            .iter()
            .map(|(_, w, e)| *e as f64 / (*w).max(1) as f64)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let ratio_median = ratios.get(ratios.len() / 2).copied().unwrap_or(0.0);
        writeln!(
            f,
            "            RSS after warm-up -> end, {} nodes never restarted: median {:.1} -> {:.1} MiB; growth median {ratio_median:.2}x, max {:.2}x (limit {:.2}x)",
            self.growth.len(),
            mib(median(&mut warm)),
            mib(median(&mut end)),
            self.max_growth().unwrap_or(0.0),
            self.growth_limit
        )?;
        writeln!(
            f,
            "            this process (control plane + soak tables): RSS {:.1} -> {:.1} MiB",
            mib(self.cp_rss_kb.0),
            mib(self.cp_rss_kb.1)
        )?;
        let (w, e) = (&self.warm_gauges, &self.end_gauges);
        writeln!(
            f,
            "  gauges    after warm-up -> after the drain, all nodes: ledger remembered {} -> {}, forgotten {} -> {}, ledger bytes max {:.1} -> {:.1} KiB",
            sum(w, |g| g.ledger_remembered),
            sum(e, |g| g.ledger_remembered),
            sum(w, |g| g.ledger_forgotten),
            sum(e, |g| g.ledger_forgotten),
            max(w, |g| g.ledger_bytes) as f64 / 1024.0,
            max(e, |g| g.ledger_bytes) as f64 / 1024.0,
        )?;
        writeln!(
            f,
            "            after the drain: pending calls {}, in flight {}, queued bytes {}, ledger running {}, copies queued max {}, sessions {} ({:.1} per node)",
            sum(e, |g| g.pending_calls),
            sum(e, |g| g.inflight),
            sum(e, |g| g.queued_bytes),
            sum(e, |g| g.ledger_running),
            max(e, |g| g.copies_queued),
            sum(e, |g| g.sessions),
            sum(e, |g| g.sessions) as f64 / e.len().max(1) as f64,
        )?;
        writeln!(
            f,
            "  copies    {} monitoring copies received by the control plane; {} reported dropped",
            self.copies, self.copies_gaps
        )?;
        if !self.copies_dropped_by.is_empty() {
            let by: Vec<String> = self
                .copies_dropped_by
                .iter()
                .map(|(n, c)| format!("{n} {c}"))
                .collect();
            writeln!(
                f,
                "            dropped by (since their last start): {}",
                by.join(", ")
            )?;
        }
        let restarts: Vec<String> = self
            .restarts
            .iter()
            .map(|r| {
                format!(
                    "{} at {:.1} s (down {})",
                    r.name,
                    r.at.as_secs_f64(),
                    ms(r.down)
                )
            })
            .collect();
        if !restarts.is_empty() {
            writeln!(f, "  restarts  {}", restarts.join(", "))?;
        }
        let violations = self.violations();
        if violations.is_empty() {
            writeln!(
                f,
                "  result    ok: every call ended, errors only around restarts, answers right, all nodes bound, gauges drained, growth within {:.2}x",
                self.growth_limit
            )
        } else {
            for v in &violations {
                writeln!(f, "  VIOLATION {v}")?;
            }
            Ok(())
        }
    }
}

/// The nodes, killed (or stopped) when dropped.
struct Cluster {
    slots: Vec<Slot>,
}

impl Cluster {
    async fn stop(&mut self) {
        for s in &mut self.slots {
            s.stop().await;
        }
    }
}

/// Runs a soak.
///
/// # Errors
/// The setup failed: a node did not start, could not be bound or
/// introduced, or its metrics could not be read.
pub(crate) async fn run(cfg: &Config) -> Result<Report, String> {
    if cfg.nodes < 2 {
        return Err("a soak needs at least 2 nodes".into());
    }
    let tmp = tempfile::Builder::new()
        .prefix("capwire-soak")
        .tempdir()
        .map_err(|e| format!("no temporary directory: {e}"))?;
    let setup_started = Instant::now();
    let mut rng = Rng::new(cfg.seed);

    // The control plane: every node will be its contact.
    let cp = Node::builder("soak-control-plane")
        .name("soak-control-plane")
        .start()
        .await
        .map_err(|e| format!("the control plane did not start: {e}"))?;
    let copies = Arc::new(AtomicU64::new(0));
    let copies_gaps = Arc::new(AtomicU64::new(0));
    {
        let mut events = cp.control_events();
        let (copies, gaps) = (copies.clone(), copies_gaps.clone());
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(ControlEvent::Copy { record, .. }) => {
                        copies.fetch_add(1, Ordering::Relaxed);
                        gaps.fetch_add(record.dropped, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        gaps.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    // The nodes: all started at once, then each bound.
    let mut cluster = Cluster { slots: Vec::new() };
    let mut outputs = Vec::new();
    for i in 0..cfg.nodes {
        let mut slot = Slot::new(i, tmp.path())?;
        outputs.push(slot.spawn(&cfg.bin)?);
        cluster.slots.push(slot);
    }
    let mut peers = Vec::new();
    for (slot, lines) in cluster.slots.iter_mut().zip(outputs.iter_mut()) {
        let id = slot.ready(lines).await?;
        let invite = slot.invite(lines, cp.id()).await?;
        let (peer, bound) = cp
            .connect_invite(&invite)
            .await
            .map_err(|e| format!("cannot bind {}: {e}", slot.name))?;
        if bound.is_none() {
            return Err(format!("{} was not bound", slot.name));
        }
        let addr: Addr = slot
            .listen
            .parse()
            .map_err(|e| format!("{}: {e}", slot.listen))?;
        cp.add_contact(Contact {
            name: slot.name.clone(),
            id,
            addr,
        })
        .await
        .map_err(|e| format!("contact {}: {e}", slot.name))?;
        peers.push(peer);
    }
    drop(outputs);
    let ids: Vec<NodeId> = cluster.slots.iter().filter_map(|s| s.id).collect();
    let names: Vec<String> = cluster.slots.iter().map(|s| s.name.clone()).collect();

    // Each node's contacts, chosen at random: the nodes its asks call.
    let want = cfg.contacts.min(cfg.nodes - 1);
    let mut contacts: Vec<Vec<usize>> = Vec::new();
    for a in 0..cfg.nodes {
        let mut mine = Vec::new();
        while mine.len() < want {
            let b = rng.below(cfg.nodes);
            if b != a && !mine.contains(&b) {
                mine.push(b);
            }
        }
        for &b in &mine {
            let args = IntroduceArgs {
                name: names[b].clone(),
                node_id: ids[b],
                addr: cluster.slots[b].listen.clone(),
            };
            peers[a]
                .request_within(ConnectIntroduce, args, Duration::from_secs(10))
                .await
                .map_err(|e| format!("introduce {} to {}: {e}", names[b], names[a]))?;
        }
        contacts.push(mine);
    }
    let setup = setup_started.elapsed();

    // The load.
    let start = Instant::now();
    let end = start + cfg.duration;
    let plan = Arc::new(Plan {
        peers: peers.clone(),
        ids: ids.clone(),
        names: names.clone(),
        contacts,
        deadline: cfg.deadline,
        every: Duration::from_secs_f64(cfg.workers as f64 / f64::from(cfg.rate.max(1))),
        seed: cfg.seed,
    });
    let tally = Arc::new(Tally::default());
    let mut workers = JoinSet::new();
    for w in 0..cfg.workers {
        workers.spawn(worker(w, plan.clone(), tally.clone(), end));
    }

    // Meanwhile: memory samples, the warm-up figures, the restarts.
    let warm_at = start + cfg.warmup();
    let mut warm_gauges = None;
    let mut cp_warm_kb = 0;
    let mut restarts = Vec::new();
    let mut failures = Vec::new();
    let mut next_restart = cfg
        .restarts_every
        .filter(|e| !e.is_zero())
        .map(|e| start + e);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = Instant::now();
        for s in &mut cluster.slots {
            s.sample_peak();
            if let Some(gone) = s.exited() {
                failures.push(format!(
                    "{} at {:.1} s: {gone}",
                    s.name,
                    (now - start).as_secs_f64()
                ));
            }
        }
        if warm_gauges.is_none() && now >= warm_at {
            for s in &mut cluster.slots {
                s.warm_kb = if s.restarted { None } else { s.rss_kb() };
            }
            cp_warm_kb = status_kb(None, "VmRSS:").unwrap_or(0);
            let mut g = Vec::new();
            for s in &cluster.slots {
                g.push(scrape(s.metrics).await.unwrap_or_default());
            }
            warm_gauges = Some(g);
        }
        if let Some(at) = next_restart
            && now >= at
            && at < end
        {
            let i = rng.below(cfg.nodes);
            let slot = &mut cluster.slots[i];
            let killed = Instant::now();
            slot.kill_9().await;
            slot.restarted = true;
            slot.warm_kb = None;
            let mut lines = slot.spawn(&cfg.bin)?;
            slot.ready(&mut lines).await?;
            let ready = Instant::now();
            restarts.push(Restart {
                node: i,
                name: slot.name.clone(),
                at: killed - start,
                down: ready - killed,
                killed,
                ready,
            });
            next_restart = cfg.restarts_every.map(|e| at + e);
        }
        if now >= end {
            break;
        }
    }

    // The end: memory under load, then every call must end.
    for s in &mut cluster.slots {
        s.sample_peak();
        s.end_kb = s.rss_kb();
    }
    let cp_end_kb = status_kb(None, "VmRSS:").unwrap_or(0);
    let joined = tokio::time::timeout(cfg.deadline + Duration::from_secs(10), async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if joined.is_err() {
        workers.abort_all();
    }
    // The drain: notes delivered, copies sent, answers written.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut end_gauges = Vec::new();
    for s in &cluster.slots {
        match scrape(s.metrics).await {
            Ok(g) => end_gauges.push(g),
            Err(e) => {
                failures.push(format!("{}: metrics after the drain: {e}", s.name));
                end_gauges.push(Gauges::default());
            }
        }
    }
    let mut not_bound = Vec::new();
    for (peer, name) in peers.iter().zip(&names) {
        match peer
            .request_within(MonitoringStatusRead, NoArgs {}, Duration::from_secs(10))
            .await
        {
            Ok(s) if s.you_are_controller => {}
            Ok(s) => not_bound.push(format!("{name}: {s:?}")),
            Err(e) => not_bound.push(format!("{name}: {e}")),
        }
    }
    let cp_pending = cp.pending_calls();
    cluster.stop().await;
    cp.shutdown().await;

    // The figures.
    let records = std::mem::take(&mut *lock(&tally.records));
    let mut kinds: BTreeMap<&'static str, KindFigures> = BTreeMap::new();
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut latencies: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    let mut requests = Vec::new();
    let mut unexplained = Vec::new();
    let mut unexplained_count = 0;
    for r in &records {
        let k = kinds.entry(r.kind.name()).or_default();
        k.made += 1;
        match &r.error {
            None => {
                k.ok += 1;
                let took = r.end - r.start;
                latencies.entry(r.kind.name()).or_default().push(took);
                if r.kind != CallKind::Note {
                    requests.push(took);
                }
            }
            Some((kind, message)) => {
                k.errors += 1;
                *errors.entry(kind.name()).or_default() += 1;
                let explained = restarts.iter().any(|x: &Restart| {
                    r.nodes.contains(&Some(x.node))
                        && x.killed <= r.end
                        && r.start <= x.ready + SETTLE
                });
                if !explained {
                    unexplained_count += 1;
                    if unexplained.len() < 20 {
                        let via: Vec<&str> = r
                            .nodes
                            .iter()
                            .flatten()
                            .map(|&i| names[i].as_str())
                            .collect();
                        unexplained.push(format!(
                            "{} via {via:?} at {:.2} s after {}: {message}",
                            r.kind.name(),
                            (r.start - start).as_secs_f64(),
                            ms(r.end - r.start)
                        ));
                    }
                }
            }
        }
    }
    for (name, l) in &mut latencies {
        l.sort_unstable();
        if let Some(k) = kinds.get_mut(name) {
            k.p50 = percentile(l, 0.50);
            k.p99 = percentile(l, 0.99);
            k.max = l.last().copied().unwrap_or_default();
        }
    }
    requests.sort_unstable();
    let request_figures = KindFigures {
        made: records.iter().filter(|r| r.kind != CallKind::Note).count() as u64,
        ok: requests.len() as u64,
        errors: records
            .iter()
            .filter(|r| r.kind != CallKind::Note && r.error.is_some())
            .count() as u64,
        p50: percentile(&requests, 0.50),
        p99: percentile(&requests, 0.99),
        max: requests.last().copied().unwrap_or_default(),
    };
    let growth = cluster
        .slots
        .iter()
        .filter(|s| !s.restarted)
        .filter_map(|s| Some((s.name.clone(), s.warm_kb?, s.end_kb?)))
        .collect();
    let report = Report {
        nodes: cfg.nodes,
        duration: cfg.duration,
        warmup: cfg.warmup(),
        seed: cfg.seed,
        rate: cfg.rate,
        workers: cfg.workers,
        contacts: want,
        restarts_every: cfg.restarts_every,
        planned_restarts: cfg.planned_restarts(),
        growth_limit: cfg.growth_limit,
        setup,
        started: tally.started.load(Ordering::Relaxed),
        ended: tally.ended.load(Ordering::Relaxed),
        kinds,
        errors,
        requests: request_figures,
        unexplained,
        unexplained_count,
        wrong: lock(&tally.wrong).clone(),
        restarts,
        peak_kb: cluster.slots.iter().map(|s| s.peak_kb).collect(),
        growth,
        cp_rss_kb: (cp_warm_kb, cp_end_kb),
        cp_pending,
        warm_gauges: warm_gauges.unwrap_or_default(),
        end_gauges: end_gauges.clone(),
        copies: copies.load(Ordering::Relaxed),
        copies_gaps: copies_gaps.load(Ordering::Relaxed),
        copies_dropped_by: names
            .iter()
            .zip(&end_gauges)
            .filter(|(_, g)| g.copies_dropped > 0)
            .map(|(n, g)| (n.clone(), g.copies_dropped))
            .collect(),
        not_bound,
        failures,
    };
    if !report.violations().is_empty() {
        // Keep the nodes' state and logs for a look.
        let kept = tmp.keep();
        eprintln!(
            "soak: the nodes' state and logs are kept in {}",
            kept.display()
        );
    }
    Ok(report)
}
