//! The process host: each child is a supervised `capwire node` process,
//! started with `--supervised`: it reports on its standard output (one
//! JSON object a line) and takes the parent's requests on its standard
//! input; it exits when its standard input closes, so children never
//! outlive their parent, even one killed with SIGKILL. Each child keeps
//! its state in `BASE/CID`, so a restarted child is the same node.
//!
//! # The pipe protocol
//!
//! Between a parent and the children it starts; not part of the network
//! protocol. Each way, one JSON object a line, a line at most 64 KiB
//! (65536 bytes of UTF-8, its newline not counted):
//!
//! ```text
//! child → parent  {"event":"ready","node_id":HEX,"addrs":[ADDR..],"caps":["id@version"..]}
//!                 {"event":"monitoring","status":"off"|"pending"|"on","controller":HEX|null}
//!                 {"reply":N,"ok":true[,"invite":TEXT]} | {"reply":N,"ok":false,"error":TEXT}
//! parent → child  {"id":N,"op":"open_bind","controller":HEX}
//!                 {"id":N,"op":"close_bind"}
//!                 {"id":N,"op":"add_contact","name":TEXT,"node_id":HEX,"addr":ADDR}
//!                 {"id":N,"op":"ready"}
//! ```
//!
//! `ready` is for a parent that attaches to a child already running (a
//! container host, after the child or the parent restarted): its reply
//! carries the ready line's `node_id`, `addrs` and `caps`, and the child
//! then reports its monitoring state again.
//!
//! The child's first line is `ready`. Then it reports its monitoring
//! state, and again whenever its status or its controller changes:
//! `controller` is the key of the control plane it is bound to now
//! (`null` when it is not bound), so that the parent can tell a child
//! bound to its own control plane from one still bound to a former one.
//! The host forwards these as [`HostEvent::Monitoring`], newest state
//! first: a state the parent has not taken yet is replaced, not queued.
//! Each request gets one reply, with its `id`.
//!
//! **A child breaks the protocol** when it writes
//!
//! - a line over 64 KiB (the host stops reading at the bound, it does not
//!   wait for the newline), or bytes that are not UTF-8;
//! - a line that is not a JSON object, or an object that is neither a
//!   reply (`reply` a number and `ok` a boolean) nor an event (`event` a
//!   text);
//! - a `monitoring` event whose `status` is not one of the three, or whose
//!   `controller` is missing or neither `null` nor 64 lowercase hex digits;
//! - as its first line, anything but a well-formed `ready` line, or
//!   nothing within the ready timeout (20 s, see
//!   [`ProcessHost::ready_timeout`]).
//!
//! Events of other names, and replies nobody waits for any more (their
//! request timed out), are ignored. A child that breaks the protocol
//! before it is ready is killed and its start fails. Afterwards it is
//! killed and reaped, the host forgets it (a later
//! [`start`](Host::start) starts a new process, a [`stop`](Host::stop)
//! succeeds) and reports [`HostEvent::Exited`], whose detail says what it
//! broke.
//!
//! **Other ends.** A child whose process exits is reported exited with its
//! exit status. One that closes its output but keeps running is given 1 s
//! to exit, then killed; either way it is reaped, forgotten and reported
//! exited. [`stop`](Host::stop) closes the child's input and gives it 5 s
//! to exit before it is killed; that exit is no event. A request waits for
//! its reply as long as its caller does (the parent bounds every host call
//! with its host timeout); however the wait ends, the request leaves the
//! table of waiting replies.
//!
//! The child, in turn, stops when its input closes, and when a line from
//! its parent breaks the same rules (over 64 KiB, not UTF-8, not a JSON
//! object with a numeric `id`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire_envelope::NodeId;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, LinesCodec};

use crate::addr::Addr;
use crate::contact::Contact;
use crate::host::pipe::{
    LinesEnd, MAX_LINE, Proc, UNWATCHED, Writer, broke, failed, forward, lock, parse_ready,
    read_error, read_lines,
};
use crate::host::{ChildInfo, ChildSpec, Host, HostError, HostEvent, HostFuture};
use crate::invite::Invite;

/// How long a child stopped through its closed input may take to exit
/// before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a child that closed its output may take to exit before it is
/// killed.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// How long the output a child wrote before it exited is still read.
const DRAIN: Duration = Duration::from_secs(1);
/// How long a child may take to say it is ready, unless set.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Events waiting for the parent.
const EVENT_QUEUE: usize = 256;

/// A child's output, a bounded line at a time.
type Lines = FramedRead<ChildStdout, LinesCodec>;

/// Runs children as `capwire node --supervised` processes.
///
/// ```no_run
/// use capwire::host::ProcessHost;
/// use capwire::Node;
/// # async fn run() -> Result<(), capwire::NodeError> {
/// let host = ProcessHost::new("/usr/local/bin/capwire", "/var/lib/capwire/children");
/// let node = Node::builder("parent").host(host).start().await?;
/// # Ok(()) }
/// ```
pub struct ProcessHost {
    program: PathBuf,
    base: PathBuf,
    args: Vec<String>,
    ready_timeout: Duration,
    procs: Arc<Mutex<HashMap<String, Arc<Proc>>>>,
    events_tx: mpsc::Sender<HostEvent>,
    events_rx: Mutex<Option<mpsc::Receiver<HostEvent>>>,
}

impl std::fmt::Debug for ProcessHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHost")
            .field("program", &self.program)
            .field("base", &self.base)
            .field("children", &lock(&self.procs).len())
            .finish_non_exhaustive()
    }
}

/// `--flag=VALUE`, as one argument.
fn flag(name: &str, value: &OsStr) -> OsString {
    let mut arg = OsString::from(name);
    arg.push("=");
    arg.push(value);
    arg
}

/// A child process just started, not yet supervised.
struct Launched {
    child: Child,
    lines: Lines,
    proc: Arc<Proc>,
}

impl ProcessHost {
    /// Children run `program node --state=BASE/CID --name=NAME
    /// --supervised [--description=BIO] --listen=ADDR.. ARGS..` (see
    /// [`args`](Self::args));
    /// `program` is a `capwire` executable.
    pub fn new(program: impl Into<PathBuf>, base: impl Into<PathBuf>) -> Self {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        Self {
            program: program.into(),
            base: base.into(),
            args: Vec::new(),
            ready_timeout: READY_TIMEOUT,
            procs: Arc::new(Mutex::new(HashMap::new())),
            events_tx,
            events_rx: Mutex::new(Some(events_rx)),
        }
    }

    /// Extra arguments for every child's `capwire node`, passed as they
    /// are after the host's own; a value that may start with `-` belongs
    /// in the same argument as its flag (`--app=VALUE`).
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long a child may take from its start to its ready line
    /// (default 20 s); one that takes longer is killed and its start
    /// fails.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    fn proc(&self, cid: &str) -> Result<Arc<Proc>, HostError> {
        lock(&self.procs)
            .get(cid)
            .cloned()
            .ok_or_else(|| HostError::NotFound(cid.to_owned()))
    }

    /// Starts the process and waits for its ready line.
    async fn launch(&self, spec: &ChildSpec, addrs: &[Addr]) -> Result<Launched, HostError> {
        let dir = self.base.join(&spec.cid);
        let mut cmd = Command::new(&self.program);
        // Every value goes in the same argument as its flag, so that one
        // that starts with `-` (a name such as `--help`) is never read as
        // a flag.
        cmd.arg("node")
            .arg(flag("--state", dir.as_os_str()))
            .arg(flag("--name", spec.name.as_ref()))
            .arg("--supervised");
        if !spec.bio.is_empty() {
            cmd.arg(flag("--description", spec.bio.as_ref()));
        }
        if addrs.is_empty() {
            cmd.arg("--listen=tcp://127.0.0.1:0");
        }
        for a in addrs {
            cmd.arg(format!("--listen={a}"));
        }
        cmd.args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| failed(format!("starting {}: {e}", self.program.display())))?;
        let stdin = child.stdin.take().map(|s| Box::new(s) as Writer);
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill().await;
            return Err(failed("no stdout from the child"));
        };
        let mut lines = FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE));
        // The first line says it is up (or the child failed).
        let ready = match tokio::time::timeout(self.ready_timeout, lines.next()).await {
            Ok(Some(Ok(line))) => parse_ready(&line),
            Ok(Some(Err(e))) => match read_error(&e) {
                Some(why) => Err(broke(&why)),
                None => Err(format!("reading the child's output failed: {e}")),
            },
            Ok(None) => {
                let status = exit_of(&mut child, EXIT_GRACE).await;
                return Err(failed(format!(
                    "the child's output ended before it was ready: {status}"
                )));
            }
            Err(_) => Err(format!(
                "the child did not say it was ready within {:?}",
                self.ready_timeout
            )),
        };
        match ready {
            Ok(info) => Ok(Launched {
                child,
                lines,
                proc: Arc::new(Proc::new(info, stdin)),
            }),
            Err(why) => {
                let _ = child.kill().await;
                Err(failed(format!("{why}; killed")))
            }
        }
    }

    async fn start_child(&self, spec: ChildSpec) -> Result<ChildInfo, HostError> {
        if let Ok(p) = self.proc(&spec.cid) {
            return Ok(p.info.clone());
        }
        std::fs::create_dir_all(&self.base).map_err(failed)?;
        let mut launched = match self.launch(&spec, &spec.addrs).await {
            Ok(l) => l,
            // Its old addresses may be taken: new ones then.
            Err(_) if !spec.addrs.is_empty() => self.launch(&spec, &[]).await?,
            Err(e) => return Err(e),
        };
        // In the table before its supervisor runs, which takes it out.
        let earlier = {
            let mut procs = lock(&self.procs);
            match procs.get(&spec.cid) {
                Some(p) => Some(p.clone()),
                None => {
                    procs.insert(spec.cid.clone(), launched.proc.clone());
                    None
                }
            }
        };
        if let Some(p) = earlier {
            // Another start of the same child won: this process goes.
            let _ = launched.child.kill().await;
            return Ok(p.info.clone());
        }
        let info = launched.proc.info.clone();
        tokio::spawn(supervise(
            launched,
            spec.cid.clone(),
            self.events_tx.clone(),
            self.procs.clone(),
        ));
        Ok(info)
    }

    async fn end(proc: &Proc) {
        proc.stopping.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        // Closing its input asks it to stop; it is killed if it does not.
        if let Ok(mut stdin) = tokio::time::timeout_at(deadline, proc.stdin.lock()).await {
            drop(stdin.take());
        }
        if tokio::time::timeout_at(deadline, proc.reaped.cancelled())
            .await
            .is_err()
        {
            proc.kill.cancel();
            proc.reaped.cancelled().await;
        }
    }

    async fn ask(&self, cid: &str, request: Value) -> Result<Value, HostError> {
        self.proc(cid)?.ask(request).await
    }

    async fn stop_child(&self, cid: &str) -> Result<(), HostError> {
        let proc = lock(&self.procs).remove(cid);
        if let Some(p) = proc {
            Self::end(&p).await;
        }
        let dir = self.base.join(cid);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| failed(format!("removing {}: {e}", dir.display())))?;
        }
        Ok(())
    }
}

/// Waits up to `grace` for the child to exit, then kills it; says how it
/// ended.
async fn exit_of(child: &mut Child, grace: Duration) -> String {
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => describe(status),
        Err(_) => {
            let _ = child.kill().await;
            "it closed its output and kept running; killed".to_owned()
        }
    }
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("waiting for it failed: {e}"),
    }
}

/// Why a ready child's output ended.
enum End {
    /// Its process exited.
    Exited(std::io::Result<ExitStatus>),
    /// Its output closed (or failed); the process may still run.
    Closed,
    /// It broke the pipe protocol, as said.
    Broke(String),
    /// The host had it killed (it did not stop when asked).
    Killed,
}

/// Watches a ready child until its process is gone: hands replies to
/// their requests and monitoring states to the parent, kills the child
/// when it breaks the protocol or closes its output and lingers, then
/// forgets it and reports its exit (unless the parent stopped it).
async fn supervise(
    launched: Launched,
    cid: String,
    events: mpsc::Sender<HostEvent>,
    procs: Arc<Mutex<HashMap<String, Arc<Proc>>>>,
) {
    let Launched {
        mut child,
        mut lines,
        proc,
    } = launched;
    // Whoever waits for the end hears of it even if this task is dropped
    // (the child is then killed, as its handle drops).
    let reaped = proc.reaped.clone().drop_guard();
    // The child's monitoring is a state, not a stream of events: the
    // reader keeps only the newest in a one-slot channel (never waiting,
    // so replies keep flowing), and a forwarder hands it to the host's
    // bounded event queue, waiting for room, so the last state always
    // arrives.
    let (state_tx, state_rx) = watch::channel(UNWATCHED);
    let forward = tokio::spawn(forward(state_rx, cid.clone(), events.clone()));

    let end = tokio::select! {
        () = proc.kill.cancelled() => End::Killed,
        end = read_lines(&proc, &mut lines, &state_tx) => match end {
            LinesEnd::Closed => End::Closed,
            LinesEnd::Broke(why) => End::Broke(why),
        },
        status = child.wait() => End::Exited(status),
    };
    let detail = match end {
        End::Exited(status) => {
            // What it wrote before it went still counts.
            let _ = tokio::time::timeout(DRAIN, read_lines(&proc, &mut lines, &state_tx)).await;
            describe(status)
        }
        End::Closed if proc.stopping.load(Ordering::SeqCst) => {
            // Asked to stop: it has until the host kills it.
            tokio::select! {
                status = child.wait() => describe(status),
                () = proc.kill.cancelled() => {
                    let _ = child.kill().await;
                    "killed".to_owned()
                }
            }
        }
        End::Closed => exit_of(&mut child, EXIT_GRACE).await,
        End::Broke(why) => {
            let _ = child.kill().await;
            format!("{}; killed", broke(&why))
        }
        End::Killed => {
            let _ = child.kill().await;
            "killed".to_owned()
        }
    };
    drop(lines);
    proc.gone();
    {
        let mut procs = lock(&procs);
        if procs.get(&cid).is_some_and(|p| Arc::ptr_eq(p, &proc)) {
            procs.remove(&cid);
        }
    }
    drop(reaped);
    if proc.stopping.load(Ordering::SeqCst) {
        forward.abort();
        return;
    }
    // The newest state goes out before the exit.
    drop(state_tx);
    let _ = forward.await;
    tracing::debug!(cid = %cid, detail = %detail, "child exited");
    let _ = events.send(HostEvent::Exited { cid, detail }).await;
}

impl Host for ProcessHost {
    fn start(&self, spec: ChildSpec) -> HostFuture<'_, ChildInfo> {
        Box::pin(self.start_child(spec))
    }

    fn stop(&self, cid: &str) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move { self.stop_child(&cid).await })
    }

    fn open_bind(&self, cid: &str, controller: NodeId) -> HostFuture<'_, Invite> {
        let cid = cid.to_owned();
        Box::pin(async move {
            let reply = self
                .ask(
                    &cid,
                    json!({"op": "open_bind", "controller": controller.to_string()}),
                )
                .await?;
            reply["invite"]
                .as_str()
                .and_then(|s| s.parse::<Invite>().ok())
                .ok_or_else(|| failed("the child's invite does not parse"))
        })
    }

    fn close_bind(&self, cid: &str) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move {
            self.ask(&cid, json!({"op": "close_bind"}))
                .await
                .map(|_| ())
        })
    }

    fn add_contact(&self, cid: &str, contact: Contact) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move {
            self.ask(
                &cid,
                json!({
                    "op": "add_contact",
                    "name": contact.name,
                    "node_id": contact.id.to_string(),
                    "addr": contact.addr.to_string(),
                }),
            )
            .await
            .map(|_| ())
        })
    }

    fn events(&self) -> Option<mpsc::Receiver<HostEvent>> {
        lock(&self.events_rx).take()
    }

    fn shutdown(&self) -> HostFuture<'_, ()> {
        Box::pin(async {
            let procs: Vec<Arc<Proc>> = lock(&self.procs).drain().map(|(_, p)| p).collect();
            let ends = procs.iter().map(|p| Self::end(p));
            futures_util::future::join_all(ends).await;
            Ok(())
        })
    }
}

#[cfg(all(test, unix))]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    const KEY: &str = "1111111111111111111111111111111111111111111111111111111111111111";

    /// A child that says it is ready, then runs `then` (a shell script).
    fn child_script(dir: &Path, then: &str) -> PathBuf {
        let ready = format!(r#"{{"event":"ready","node_id":"{KEY}","addrs":[],"caps":[]}}"#);
        let path = dir.join("child.sh");
        std::fs::write(&path, format!("#!/bin/sh\necho '{ready}'\n{then}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn spec() -> ChildSpec {
        ChildSpec {
            cid: "c1".into(),
            name: "silent".into(),
            bio: String::new(),
            addrs: Vec::new(),
            ..ChildSpec::default()
        }
    }

    /// Requests of `cid` waiting for their reply.
    fn waiting(host: &ProcessHost, cid: &str) -> usize {
        lock(&host.proc(cid).unwrap().replies)
            .as_ref()
            .map_or(0, HashMap::len)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_ends_unanswered_leaves_the_table_of_waiting_replies() {
        let dir = tempfile::tempdir().unwrap();
        // Reads its requests and never answers (exits when its input
        // closes).
        let program = child_script(dir.path(), "while read -r _; do :; done");
        let host = ProcessHost::new(program, dir.path().join("children"));
        host.start(spec()).await.unwrap();

        // Waiting, it is in the table; dropped, it is not.
        let mut ask = host.close_bind("c1");
        let first = tokio::time::timeout(Duration::from_millis(300), &mut ask).await;
        assert!(first.is_err(), "the child does not answer");
        assert_eq!(waiting(&host, "c1"), 1);
        drop(ask);
        assert_eq!(waiting(&host, "c1"), 0);

        // The parent's timeout around a host call drops it the same way.
        for _ in 0..3 {
            let r = tokio::time::timeout(Duration::from_millis(100), host.close_bind("c1")).await;
            assert!(r.is_err());
        }
        assert_eq!(waiting(&host, "c1"), 0);
        host.stop("c1").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_cannot_be_written_leaves_the_table_of_waiting_replies() {
        let dir = tempfile::tempdir().unwrap();
        // Closes its input, keeps its output open.
        let program = child_script(dir.path(), "exec 0<&-\nwhile :; do sleep 1; done");
        let host = ProcessHost::new(program, dir.path().join("children"));
        host.start(spec()).await.unwrap();
        // Its input may take a moment to close after the ready line.
        let mut refused = false;
        for _ in 0..50 {
            match tokio::time::timeout(Duration::from_millis(100), host.close_bind("c1")).await {
                Ok(Err(HostError::Failed(_))) => {
                    refused = true;
                    break;
                }
                Ok(other) => panic!("{other:?}"),
                Err(_) => {}
            }
        }
        assert!(refused, "the write failed");
        assert_eq!(waiting(&host, "c1"), 0);
        host.stop("c1").await.unwrap();
    }
}
