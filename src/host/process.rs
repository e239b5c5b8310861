//! The process host: each child is a supervised `capwire node` process,
//! started with `--supervised`: it reports on its standard output (one
//! JSON object a line) and takes the parent's requests on its standard
//! input; it exits when its standard input closes, so children never
//! outlive their parent, even one killed with SIGKILL. Each child keeps
//! its state in `BASE/CID`, so a restarted child is the same node.
//!
//! The pipe protocol (between a parent and the children it starts; not
//! part of the network protocol):
//!
//! ```text
//! child → parent  {"event":"ready","node_id":HEX,"addrs":[ADDR..],"caps":["id@version"..]}
//!                 {"event":"monitoring","status":"off"|"pending"|"on"}
//!                 {"reply":N,"ok":true[,"invite":TEXT]} | {"reply":N,"ok":false,"error":TEXT}
//! parent → child  {"id":N,"op":"open_bind","controller":HEX}
//!                 {"id":N,"op":"close_bind"}
//!                 {"id":N,"op":"add_contact","name":TEXT,"node_id":HEX,"addr":ADDR}
//! ```

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use capwire_envelope::NodeId;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot};

use crate::addr::Addr;
use crate::host::{ChildInfo, ChildSpec, Host, HostError, HostEvent, HostFuture};
use crate::invite::Invite;
use crate::net::peers::Contact;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a child stopped through its closed input may take to exit
/// before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Longest line a child may write.
const MAX_LINE: usize = 64 * 1024;
/// Events waiting for the parent.
const EVENT_QUEUE: usize = 256;

/// A running child process.
struct Proc {
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    replies: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    next: AtomicU64,
    info: ChildInfo,
    /// Set when the parent stops it (its exit is then no event).
    stopping: AtomicBool,
    /// Takes the process when it is to be waited for.
    child: tokio::sync::Mutex<Option<Child>>,
}

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
    procs: Mutex<HashMap<String, Arc<Proc>>>,
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

fn failed(e: impl std::fmt::Display) -> HostError {
    HostError::Failed(e.to_string())
}

impl ProcessHost {
    /// Children run `program node --state=BASE/CID --name=NAME
    /// --supervised --listen=ADDR.. ARGS..` (see [`args`](Self::args));
    /// `program` is a `capwire` executable.
    pub fn new(program: impl Into<PathBuf>, base: impl Into<PathBuf>) -> Self {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        Self {
            program: program.into(),
            base: base.into(),
            args: Vec::new(),
            procs: Mutex::new(HashMap::new()),
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

    fn proc(&self, cid: &str) -> Result<Arc<Proc>, HostError> {
        lock(&self.procs)
            .get(cid)
            .cloned()
            .ok_or_else(|| HostError::NotFound(cid.to_owned()))
    }

    async fn spawn(&self, spec: &ChildSpec, addrs: &[Addr]) -> Result<Arc<Proc>, HostError> {
        let dir = self.base.join(&spec.cid);
        let mut cmd = Command::new(&self.program);
        // Every value goes in the same argument as its flag, so that one
        // that starts with `-` (a name such as `--help`) is never read as
        // a flag.
        cmd.arg("node")
            .arg(flag("--state", dir.as_os_str()))
            .arg(flag("--name", spec.name.as_ref()))
            .arg("--supervised");
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
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| failed("no stdout from the child"))?;
        let mut lines = BufReader::new(stdout).lines();
        // The first line says it is up (or the child failed).
        let ready = loop {
            match lines.next_line().await {
                Ok(Some(line)) if line.len() <= MAX_LINE => {
                    if let Ok(v) = serde_json::from_str::<Value>(&line)
                        && v["event"] == "ready"
                    {
                        break v;
                    }
                }
                Ok(Some(_)) => return Err(failed("the child wrote an over-long line")),
                Ok(None) | Err(_) => {
                    let status = child.wait().await.map_err(failed)?;
                    return Err(failed(format!(
                        "the child exited before it was ready: {status}"
                    )));
                }
            }
        };
        let info = parse_ready(&ready)?;
        let proc = Arc::new(Proc {
            stdin: tokio::sync::Mutex::new(stdin),
            replies: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            info,
            stopping: AtomicBool::new(false),
            child: tokio::sync::Mutex::new(Some(child)),
        });
        tokio::spawn(read_loop(
            proc.clone(),
            lines,
            spec.cid.clone(),
            self.events_tx.clone(),
        ));
        Ok(proc)
    }

    async fn start_child(&self, spec: ChildSpec) -> Result<ChildInfo, HostError> {
        if let Ok(p) = self.proc(&spec.cid) {
            return Ok(p.info.clone());
        }
        std::fs::create_dir_all(&self.base).map_err(failed)?;
        let proc = match self.spawn(&spec, &spec.addrs).await {
            Ok(p) => p,
            // Its old addresses may be taken: new ones then.
            Err(_) if !spec.addrs.is_empty() => self.spawn(&spec, &[]).await?,
            Err(e) => return Err(e),
        };
        let info = proc.info.clone();
        lock(&self.procs).insert(spec.cid.clone(), proc);
        Ok(info)
    }

    async fn end(proc: &Proc) {
        proc.stopping.store(true, Ordering::SeqCst);
        // Closing its input asks it to stop; it is killed if it does not.
        drop(proc.stdin.lock().await.take());
        if let Some(mut child) = proc.child.lock().await.take()
            && tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
        {
            let _ = child.kill().await;
        }
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

    async fn ask(&self, cid: &str, mut request: Value) -> Result<Value, HostError> {
        let proc = self.proc(cid)?;
        let id = proc.next.fetch_add(1, Ordering::Relaxed);
        request["id"] = json!(id);
        let (tx, rx) = oneshot::channel();
        lock(&proc.replies).insert(id, tx);
        let mut line = request.to_string();
        line.push('\n');
        {
            let mut stdin = proc.stdin.lock().await;
            let Some(stdin) = stdin.as_mut() else {
                return Err(failed("the child is stopping"));
            };
            stdin.write_all(line.as_bytes()).await.map_err(failed)?;
            stdin.flush().await.map_err(failed)?;
        }
        let reply = rx.await.map_err(|_| failed("the child exited"))?;
        if reply["ok"] == true {
            Ok(reply)
        } else {
            Err(failed(reply["error"].as_str().unwrap_or("refused")))
        }
    }
}

/// `--flag=VALUE`, as one argument.
fn flag(name: &str, value: &OsStr) -> OsString {
    let mut arg = OsString::from(name);
    arg.push("=");
    arg.push(value);
    arg
}

fn parse_ready(v: &Value) -> Result<ChildInfo, HostError> {
    let bad = || failed(format!("bad ready line from the child: {v}"));
    let node_id = v["node_id"]
        .as_str()
        .and_then(|s| NodeId::try_from(s).ok())
        .ok_or_else(bad)?;
    let addrs = v["addrs"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|a| {
            a.as_str()
                .and_then(|s| s.parse::<Addr>().ok())
                .ok_or_else(bad)
        })
        .collect::<Result<_, _>>()?;
    let caps = v["caps"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|c| c.as_str().map(str::to_owned).ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    Ok(ChildInfo {
        node_id,
        addrs,
        caps,
    })
}

async fn read_loop(
    proc: Arc<Proc>,
    mut lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    cid: String,
    events: mpsc::Sender<HostEvent>,
) {
    // The child's monitoring state is a state, not a stream of events: the
    // reader keeps only the newest in a one-slot channel (never waiting,
    // so replies keep flowing), and a forwarder hands it to the host's
    // bounded event queue, waiting for room, so the last state always
    // arrives.
    let (status_tx, mut status_rx) =
        tokio::sync::watch::channel(capwire_manifest::MonitoringStatus::Off);
    status_rx.mark_unchanged();
    let forward = {
        let (events, cid) = (events.clone(), cid.clone());
        tokio::spawn(async move {
            while status_rx.changed().await.is_ok() {
                let status = *status_rx.borrow_and_update();
                let event = HostEvent::Monitoring {
                    cid: cid.clone(),
                    status,
                };
                if events.send(event).await.is_err() {
                    return;
                }
            }
        })
    };
    read_lines(&proc, &mut lines, &status_tx).await;
    // The newest state goes out before the exit.
    drop(status_tx);
    let _ = forward.await;
    reap(proc, cid, events).await;
}

/// Handles the child's output lines until it ends: replies to their
/// waiters, monitoring changes into `status`.
async fn read_lines(
    proc: &Proc,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    status: &tokio::sync::watch::Sender<capwire_manifest::MonitoringStatus>,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        if line.len() > MAX_LINE {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(id) = v["reply"].as_u64() {
            if let Some(tx) = lock(&proc.replies).remove(&id) {
                let _ = tx.send(v);
            }
        } else if v["event"] == "monitoring" {
            let new = match v["status"].as_str() {
                Some("on") => capwire_manifest::MonitoringStatus::On,
                Some("pending") => capwire_manifest::MonitoringStatus::Pending,
                _ => capwire_manifest::MonitoringStatus::Off,
            };
            status.send_replace(new);
        }
    }
}

/// After the child's output ended: it exited (or is about to).
async fn reap(proc: Arc<Proc>, cid: String, events: mpsc::Sender<HostEvent>) {
    lock(&proc.replies).clear();
    if proc.stopping.load(Ordering::SeqCst) {
        return;
    }
    let detail = match proc.child.lock().await.as_mut() {
        Some(child) => match tokio::time::timeout(STOP_GRACE, child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "closed its output".to_owned(),
        },
        None => "stopped".to_owned(),
    };
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
