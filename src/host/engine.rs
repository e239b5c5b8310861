//! What the container hosts share: the connection to the Docker Engine
//! (its API version negotiated with the daemon), the names and labels of
//! what they make, the checks of a placement, and the session with each
//! child over the engine's attach stream (the pipe protocol of the
//! process host, [`pipe`](super::pipe)).
//!
//! ```text
//!  parent ── Engine API (unix socket) ──► dockerd
//!    │  create/start/inspect/remove        │ runs the child: capwire node --supervised
//!    │  attach: stdin ──► requests          │  (host network, loopback port, /state volume)
//!    │          stdout ◄── ready, replies, monitoring
//!    │  events: die / start / oom ──► HostEvent::Run
//! ```
//!
//! The engine's own quirks stay here and in [`docker`](super::docker) and
//! [`swarm`](super::swarm); the roster and the protocol know nothing of
//! them.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{AttachContainerOptions, EventsOptions};
use capwire_envelope::NodeId;
use capwire_manifest::{Placement, RunState};
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::io::StreamReader;

use crate::addr::Addr;
use crate::contact::Contact;
use crate::host::pipe::{
    LinesEnd, MAX_LINE, Proc, UNWATCHED, Writer, failed, forward, info_of, lock, read_lines,
};
use crate::host::{ChildInfo, ChildRun, ChildSpec, HostError, HostEvent};
use crate::invite::Invite;

/// The image the container hosts run unless told otherwise.
pub const DEFAULT_TAG: &str = "capwire:latest";
/// The user a child runs as (`uid:gid`).
pub const CHILD_USER: &str = "10001:10001";

/// Label: the parent's key (hex).
pub(crate) const LABEL_PARENT: &str = "capwire.parent";
/// Label: the child id.
pub(crate) const LABEL_CID: &str = "capwire.cid";
/// Label: the child's name in the roster.
pub(crate) const LABEL_NAME: &str = "capwire.name";
/// Where the child's state volume is mounted.
pub(crate) const STATE_DIR: &str = "/state";
/// Docker's smallest memory limit.
const MIN_MEMORY: u64 = 6 * 1024 * 1024;
/// Longest image reference Docker takes.
const MAX_IMAGE: usize = 255;
/// Most constraints and labels of one placement.
const MAX_ITEMS: usize = 32;
/// Longest constraint or label, in bytes.
const MAX_ITEM: usize = 256;
/// Events waiting for the parent.
const EVENT_QUEUE: usize = 256;
/// How long the engine may take to answer one call.
const API_TIMEOUT: u64 = 60;

/// How children reach each other and are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Network {
    /// The host's network: each child listens on a port of its own at
    /// `ip` (loopback by default), which the host picks once and keeps
    /// across restarts. What the tests use.
    Host {
        /// The address children listen on and are reached at.
        ip: IpAddr,
    },
    /// A Docker network (a bridge, or an overlay in Swarm): each child
    /// listens on `port` inside its container, published on `advertise`
    /// at a port of the host's picking, and is reached there.
    Published {
        /// The Docker network to attach to.
        network: String,
        /// The address of the machine that peers dial.
        advertise: IpAddr,
    },
}

impl Default for Network {
    fn default() -> Self {
        Self::Host {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }
}

/// The settings of a container host, and its defaults for every child.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The engine's Unix socket; `None`: `DOCKER_HOST` when it names a
    /// `unix://` socket, otherwise `/var/run/docker.sock`.
    pub socket: Option<PathBuf>,
    /// The children's image, unless a placement names another.
    pub image: String,
    /// The children's limits and restarts, unless a placement says
    /// otherwise.
    pub defaults: Placement,
    /// Their network.
    pub network: Network,
    /// Extra arguments for every child's `capwire node`.
    pub args: Vec<String>,
    /// The start of every name the host gives (containers, services,
    /// volumes): `PREFIX-PARENT-CID`.
    pub prefix: String,
    /// The user the child runs as (`uid:gid`, never root).
    pub user: String,
    /// How long a child may take from its start to answering `ready`.
    pub ready_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            socket: None,
            image: DEFAULT_TAG.to_owned(),
            defaults: Placement {
                memory: Some(256 * 1024 * 1024),
                cpus_milli: Some(1000),
                pids: Some(256),
                restarts: Some(3),
                ..Placement::default()
            },
            network: Network::default(),
            args: Vec::new(),
            prefix: "capwire".to_owned(),
            user: CHILD_USER.to_owned(),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// Connects to the engine and negotiates the API version (Debian's
/// Docker 20.10 speaks 1.41, older than the client's own).
pub(crate) async fn connect(socket: Option<&PathBuf>) -> Result<Docker, HostError> {
    let path = match socket {
        Some(p) => p.to_string_lossy().into_owned(),
        None => match std::env::var("DOCKER_HOST") {
            Ok(h) if h.starts_with("unix://") => h,
            _ => "unix:///var/run/docker.sock".to_owned(),
        },
    };
    let unreachable = |e: &dyn std::fmt::Display| {
        HostError::Unavailable(format!("no Docker engine answers at {path}: {e}"))
    };
    let docker = Docker::connect_with_socket(&path, API_TIMEOUT, bollard::API_DEFAULT_VERSION)
        .map_err(|e| unreachable(&e))?;
    let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
        .await
        .map_err(|_| unreachable(&"no answer within 10 s"))?
        .map_err(|e| unreachable(&e))?;
    Ok(docker)
}

/// The status code of an engine's answer, if it was one.
pub(crate) fn status_of(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// An engine failure: a refusal for a 4xx answer, unavailable when the
/// engine does not answer, failed otherwise.
pub(crate) fn engine_error(what: &str, e: &bollard::errors::Error) -> HostError {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } if (400..500).contains(status_code) => HostError::Refused(format!("{what}: {message}")),
        bollard::errors::Error::DockerResponseServerError { message, .. } => {
            HostError::Failed(format!("{what}: {message}"))
        }
        _ => HostError::Unavailable(format!("{what}: the Docker engine did not answer: {e}")),
    }
}

/// The names of what a host makes for one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    /// The container (or service) name.
    pub(crate) workload: String,
    /// The state volume's name.
    pub(crate) volume: String,
}

impl Names {
    pub(crate) fn of(prefix: &str, parent: &NodeId, cid: &str) -> Self {
        // 16 hex digits of the parent's key keep names short and apart.
        let p = parent.to_string();
        let base = format!("{prefix}-{}-{cid}", &p[..16]);
        Self {
            volume: format!("{base}-state"),
            workload: base,
        }
    }
}

/// The labels of what a host makes for `spec`.
pub(crate) fn labels(spec: &ChildSpec, parent: &NodeId) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = spec
        .placement
        .labels
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    l.insert(LABEL_PARENT.to_owned(), parent.to_string());
    l.insert(LABEL_CID.to_owned(), spec.cid.clone());
    l.insert(LABEL_NAME.to_owned(), spec.name.clone());
    l
}

/// A placement's values with the host's defaults filled in.
pub(crate) fn effective(cfg: &EngineConfig, p: &Placement) -> Placement {
    let d = &cfg.defaults;
    Placement {
        image: p.image.clone().or_else(|| Some(cfg.image.clone())),
        memory: p.memory.or(d.memory),
        cpus_milli: p.cpus_milli.or(d.cpus_milli),
        pids: p.pids.or(d.pids),
        restarts: p.restarts.or(d.restarts),
        constraints: if p.constraints.is_empty() {
            d.constraints.clone()
        } else {
            p.constraints.clone()
        },
        labels: p.labels.clone(),
    }
}

/// `true` for an image reference Docker takes: lowercase path
/// components of `[a-z0-9._-]` (a registry host may have a port), an
/// optional `:tag` of `[A-Za-z0-9_.-]` and an optional `@digest`.
pub(crate) fn image_ok(image: &str) -> bool {
    if image.is_empty() || image.len() > MAX_IMAGE {
        return false;
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let ok = d.split_once(':').is_some_and(|(alg, hex)| {
            !alg.is_empty()
                && alg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && hex.len() >= 32
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        });
        if !ok {
            return false;
        }
    }
    let (path, tag) = match rest.rfind(':') {
        Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
            && !t.starts_with(['.', '-']);
        if !ok {
            return false;
        }
    }
    let mut parts = path.split('/').peekable();
    let mut first = true;
    while let Some(part) = parts.next() {
        let host_like =
            first && parts.peek().is_some() && (part.contains('.') || part.contains(':'));
        first = false;
        let ok = if host_like {
            part.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':')
        } else {
            !part.is_empty()
                && part.bytes().all(|b| {
                    b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || b == b'.'
                        || b == b'_'
                        || b == b'-'
                })
                && part.as_bytes()[0].is_ascii_alphanumeric()
                && part.as_bytes()[part.len() - 1].is_ascii_alphanumeric()
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Refuses a placement that makes no sense, before anything is made.
pub(crate) fn check_placement(cfg: &EngineConfig, spec: &ChildSpec) -> Result<(), HostError> {
    let p = effective(cfg, &spec.placement);
    let refuse = |m: String| Err(HostError::Refused(m));
    if let Some(image) = &p.image
        && !image_ok(image)
    {
        return refuse(format!("{image:?} is not an image name Docker takes"));
    }
    match p.memory {
        Some(m) if m < MIN_MEMORY => {
            return refuse(format!(
                "memory: at least {MIN_MEMORY} bytes (6 MiB), not {m}"
            ));
        }
        Some(m) if i64::try_from(m).is_err() => return refuse("memory: too large".to_owned()),
        _ => {}
    }
    match p.cpus_milli {
        Some(0) => return refuse("cpus: more than 0".to_owned()),
        Some(c) if c > 1_000_000 => return refuse("cpus: at most 1000".to_owned()),
        _ => {}
    }
    match p.pids {
        Some(0) => return refuse("pids: at least 1".to_owned()),
        Some(n) if i64::try_from(n).is_err() => return refuse("pids: too large".to_owned()),
        _ => {}
    }
    if p.restarts.is_some_and(|r| r > 1000) {
        return refuse("restarts: at most 1000".to_owned());
    }
    if p.constraints.len() > MAX_ITEMS || p.labels.len() > MAX_ITEMS {
        return refuse(format!(
            "at most {MAX_ITEMS} constraints and {MAX_ITEMS} labels"
        ));
    }
    for c in &p.constraints {
        let ok = c.len() <= MAX_ITEM
            && (c.contains("==") || c.contains("!="))
            && !c.chars().any(char::is_control);
        if !ok {
            return refuse(format!(
                "{c:?} is not a constraint (KEY==VALUE or KEY!=VALUE)"
            ));
        }
    }
    for l in &p.labels {
        let ok = l.len() <= MAX_ITEM
            && l.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty()
                    && !k.starts_with("capwire.")
                    && !k.starts_with("com.docker.")
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
            })
            && !l.chars().any(char::is_control);
        if !ok {
            return refuse(format!(
                "{l:?} is not a label (KEY=VALUE; the key of letters, digits, '.', '-', '_', \
                 not under capwire. or com.docker.)"
            ));
        }
    }
    if cfg.user.starts_with("0:") || cfg.user == "0" || cfg.user == "root" {
        return refuse("a child never runs as root".to_owned());
    }
    Ok(())
}

/// The child's `capwire node` arguments.
pub(crate) fn node_args(cfg: &EngineConfig, spec: &ChildSpec, listen: &Addr) -> Vec<String> {
    let mut a = vec![
        "node".to_owned(),
        format!("--state={STATE_DIR}"),
        format!("--name={}", spec.name),
        "--supervised".to_owned(),
        format!("--listen={listen}"),
    ];
    if !spec.bio.is_empty() {
        a.push(format!("--description={}", spec.bio));
    }
    a.extend(cfg.args.iter().cloned());
    a
}

/// Where the child listens (in its own view) and the port published for
/// it: the port it had, or a free one.
pub(crate) fn listen_addr(cfg: &EngineConfig, spec: &ChildSpec) -> Result<(Addr, u16), HostError> {
    let had = spec.addrs.iter().find_map(|a| match a {
        Addr::Tcp(s) => Some(s.port()),
        _ => None,
    });
    let ip = match &cfg.network {
        Network::Host { ip } => *ip,
        Network::Published { advertise, .. } => *advertise,
    };
    let port = match had {
        Some(p) if p != 0 => p,
        _ => std::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| failed(format!("no free port on {ip}: {e}")))?,
    };
    let inside = match &cfg.network {
        Network::Host { ip } => SocketAddr::new(*ip, port),
        Network::Published { .. } => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
    };
    Ok((Addr::Tcp(inside), port))
}

/// How a child is reached: in a published network, at the advertised
/// address and its port, not at what it listens on inside.
pub(crate) fn reached(cfg: &EngineConfig, mut info: ChildInfo) -> ChildInfo {
    if let Network::Published { advertise, .. } = &cfg.network {
        info.addrs = info
            .addrs
            .iter()
            .map(|a| match a {
                Addr::Tcp(s) => Addr::Tcp(SocketAddr::new(*advertise, s.port())),
                other => other.clone(),
            })
            .collect();
    }
    info
}

/// One child the host knows of.
pub(crate) struct Kid {
    pub(crate) names: Names,
    /// The session with its container, while attached.
    pub(crate) session: Option<Arc<Proc>>,
    /// How to reach it, as it last said.
    pub(crate) info: Option<ChildInfo>,
}

/// What both container hosts keep: the engine, the parent, the children
/// and their sessions, the events for the parent.
pub(crate) struct Shared {
    pub(crate) cfg: EngineConfig,
    docker: tokio::sync::OnceCell<Docker>,
    pub(crate) parent: OnceLock<NodeId>,
    pub(crate) kids: Mutex<HashMap<String, Kid>>,
    /// Children being stopped: their exits are no events.
    pub(crate) stopping: Mutex<HashSet<String>>,
    pub(crate) events_tx: mpsc::Sender<HostEvent>,
    pub(crate) events_rx: Mutex<Option<mpsc::Receiver<HostEvent>>>,
    /// Set once the engine's events are watched.
    pub(crate) watching: OnceLock<()>,
}

impl Shared {
    pub(crate) fn new(cfg: EngineConfig) -> Self {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        Self {
            cfg,
            docker: tokio::sync::OnceCell::new(),
            parent: OnceLock::new(),
            kids: Mutex::new(HashMap::new()),
            stopping: Mutex::new(HashSet::new()),
            events_tx,
            events_rx: Mutex::new(Some(events_rx)),
            watching: OnceLock::new(),
        }
    }

    /// The engine, connected once (a failed connection is tried again on
    /// the next call).
    pub(crate) async fn docker(&self) -> Result<Docker, HostError> {
        self.docker
            .get_or_try_init(|| connect(self.cfg.socket.as_ref()))
            .await
            .cloned()
    }

    pub(crate) fn parent_of(&self, spec: &ChildSpec) -> Result<NodeId, HostError> {
        if let Some(p) = spec.parent {
            let _ = self.parent.set(p);
            return Ok(p);
        }
        self.parent
            .get()
            .copied()
            .ok_or_else(|| failed("the host does not know its parent yet"))
    }

    /// The names of a child of this host's parent.
    pub(crate) fn names(&self, cid: &str) -> Option<Names> {
        if let Some(k) = lock(&self.kids).get(cid) {
            return Some(k.names.clone());
        }
        self.parent
            .get()
            .map(|p| Names::of(&self.cfg.prefix, p, cid))
    }

    pub(crate) fn session(&self, cid: &str) -> Result<Arc<Proc>, HostError> {
        lock(&self.kids)
            .get(cid)
            .and_then(|k| k.session.clone())
            .ok_or_else(|| HostError::NotFound(cid.to_owned()))
    }

    /// Attaches to the child's running container, has it say who it is,
    /// and keeps the session (replacing any earlier one).
    pub(crate) async fn attach(
        self: &Arc<Self>,
        cid: &str,
        names: &Names,
        container: &str,
    ) -> Result<ChildInfo, HostError> {
        let docker = self.docker().await?;
        let options = AttachContainerOptions {
            stdin: true,
            stdout: true,
            stream: true,
            ..AttachContainerOptions::default()
        };
        let attached = docker
            .attach_container(container, Some(options))
            .await
            .map_err(|e| engine_error("attaching to the child", &e))?;
        let bytes = attached.output.filter_map(|item| async move {
            match item {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    Some(Ok::<_, std::io::Error>(message))
                }
                Ok(_) => None,
                Err(e) => Some(Err(std::io::Error::other(e))),
            }
        });
        let reader = StreamReader::new(Box::pin(bytes));
        let lines = FramedRead::new(reader, LinesCodec::new_with_max_length(MAX_LINE));
        let placeholder = ChildInfo {
            node_id: NodeId::from_bytes([0; 32]),
            addrs: Vec::new(),
            caps: Vec::new(),
        };
        let writer: Writer = Box::new(attached.input);
        let proc = Arc::new(Proc::new(placeholder, Some(writer)));
        tokio::spawn(session(self.clone(), proc.clone(), lines, cid.to_owned()));
        let asked = tokio::time::timeout(self.cfg.ready_timeout, proc.ask(json!({"op": "ready"})));
        let reply = match asked.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                proc.kill.cancel();
                return Err(e);
            }
            Err(_) => {
                proc.kill.cancel();
                return Err(failed(format!(
                    "the child did not answer within {:?}",
                    self.cfg.ready_timeout
                )));
            }
        };
        let Some(info) = info_of(&reply) else {
            proc.kill.cancel();
            return Err(failed("the child's ready reply does not parse"));
        };
        let info = reached(&self.cfg, info);
        let earlier = {
            let mut kids = lock(&self.kids);
            let kid = kids.entry(cid.to_owned()).or_insert_with(|| Kid {
                names: names.clone(),
                session: None,
                info: None,
            });
            kid.info = Some(info.clone());
            kid.session.replace(proc)
        };
        if let Some(old) = earlier {
            old.kill.cancel();
        }
        Ok(info)
    }

    /// Forgets the child and ends its session; what the engine runs stays.
    pub(crate) fn forget(&self, cid: &str) {
        let kid = lock(&self.kids).remove(cid);
        if let Some(p) = kid.and_then(|k| k.session) {
            p.stopping.store(true, Ordering::SeqCst);
            p.kill.cancel();
        }
    }

    /// Ends every session (the parent is stopping; the children run on).
    pub(crate) fn detach_all(&self) {
        for kid in lock(&self.kids).values_mut() {
            if let Some(p) = kid.session.take() {
                p.stopping.store(true, Ordering::SeqCst);
                p.kill.cancel();
            }
        }
    }

    pub(crate) async fn open_bind(
        &self,
        cid: &str,
        controller: NodeId,
    ) -> Result<Invite, HostError> {
        let reply = self
            .session(cid)?
            .ask(json!({"op": "open_bind", "controller": controller.to_string()}))
            .await?;
        reply["invite"]
            .as_str()
            .and_then(|s| s.parse::<Invite>().ok())
            .map(|i| Invite {
                addrs: lock(&self.kids)
                    .get(cid)
                    .and_then(|k| k.info.as_ref())
                    .map_or_else(|| i.addrs.clone(), |info| info.addrs.clone()),
                ..i
            })
            .ok_or_else(|| failed("the child's invite does not parse"))
    }

    pub(crate) async fn close_bind(&self, cid: &str) -> Result<(), HostError> {
        self.session(cid)?
            .ask(json!({"op": "close_bind"}))
            .await
            .map(|_| ())
    }

    pub(crate) async fn add_contact(&self, cid: &str, contact: Contact) -> Result<(), HostError> {
        self.session(cid)?
            .ask(json!({
                "op": "add_contact",
                "name": contact.name,
                "node_id": contact.id.to_string(),
                "addr": contact.addr.to_string(),
            }))
            .await
            .map(|_| ())
    }

    /// Hands the parent a change of a child's run.
    pub(crate) async fn report(&self, cid: &str, run: ChildRun, info: Option<ChildInfo>) {
        let event = HostEvent::Run {
            cid: cid.to_owned(),
            run,
            info,
        };
        let _ = self.events_tx.send(event).await;
    }

    /// The engine's container events for this parent's children, from
    /// now on (a stream that ends is opened again).
    pub(crate) fn events_for(
        docker: &Docker,
        parent: &NodeId,
    ) -> impl futures_util::Stream<
        Item = Result<bollard::models::EventMessage, bollard::errors::Error>,
    > + use<> {
        let mut filters = HashMap::new();
        filters.insert("type".to_owned(), vec!["container".to_owned()]);
        filters.insert("label".to_owned(), vec![format!("{LABEL_PARENT}={parent}")]);
        filters.insert(
            "event".to_owned(),
            vec!["die".to_owned(), "start".to_owned(), "oom".to_owned()],
        );
        docker.events(Some(EventsOptions {
            filters: Some(filters),
            ..EventsOptions::default()
        }))
    }
}

/// The session with one child: replies and monitoring states until the
/// attach stream ends (the container stopped, the engine went away) or
/// the host ends it.
async fn session<S>(shared: Arc<Shared>, proc: Arc<Proc>, mut lines: S, cid: String)
where
    S: futures_util::Stream<Item = Result<String, tokio_util::codec::LinesCodecError>>
        + Unpin
        + Send,
{
    let reaped = proc.reaped.clone().drop_guard();
    let (state_tx, state_rx) = watch::channel(UNWATCHED);
    let forwarding = tokio::spawn(forward(state_rx, cid.clone(), shared.events_tx.clone()));
    let end = tokio::select! {
        () = proc.kill.cancelled() => None,
        end = read_lines(&proc, &mut lines, &state_tx) => Some(end),
    };
    if let Some(LinesEnd::Broke(why)) = &end {
        tracing::warn!(cid = %cid, "{}", crate::host::pipe::broke(why));
    }
    proc.gone();
    {
        let mut kids = lock(&shared.kids);
        if let Some(kid) = kids.get_mut(&cid)
            && kid.session.as_ref().is_some_and(|p| Arc::ptr_eq(p, &proc))
        {
            kid.session = None;
        }
    }
    drop(reaped);
    drop(state_tx);
    let _ = forwarding.await;
}

/// A child's run from what the engine says of its container.
pub(crate) fn run_of(
    state: Option<&bollard::models::ContainerState>,
    restarts: u64,
    restarting_allowed: bool,
) -> ChildRun {
    let running = state.and_then(|s| s.running).unwrap_or(false);
    let restarting = state.and_then(|s| s.restarting).unwrap_or(false);
    let exit_code = state.and_then(|s| s.exit_code);
    let oom_killed = state.and_then(|s| s.oom_killed).unwrap_or(false);
    let error = state.and_then(|s| s.error.clone()).unwrap_or_default();
    let state = if running && !restarting {
        RunState::Running
    } else if restarting || restarting_allowed {
        RunState::Restarting
    } else {
        RunState::Exited
    };
    let mut detail = match (state, exit_code) {
        (RunState::Running, _) => "running".to_owned(),
        (_, Some(code)) if oom_killed => format!("exited with code {code}: killed for memory"),
        (_, Some(code)) => format!("exited with code {code}"),
        _ => "exited".to_owned(),
    };
    if !error.is_empty() {
        detail.push_str(": ");
        detail.push_str(&error);
    }
    ChildRun {
        state,
        exit_code: if state == RunState::Running {
            None
        } else {
            exit_code
        },
        oom_killed: oom_killed && state != RunState::Running,
        restarts,
        detail,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn image_names_docker_takes() {
        for ok in [
            "capwire",
            "capwire:latest",
            "capwire:dev-1.2",
            "library/capwire:1",
            "registry.local:5000/team/capwire:v1",
            "capwire@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(image_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "Capwire",
            "capwire:",
            "cap wire",
            "capwire:lat est",
            "-capwire",
            "capwire/",
            "capwire@sha256:xyz",
            "capwire:-tag",
            &"a".repeat(300),
        ] {
            assert!(!image_ok(bad), "{bad}");
        }
    }

    fn spec(p: Placement) -> ChildSpec {
        ChildSpec {
            cid: "c1".into(),
            name: "a".into(),
            placement: p,
            parent: Some(NodeId::from_bytes([7; 32])),
            ..ChildSpec::default()
        }
    }

    #[test]
    fn placements_that_make_no_sense_are_refused() {
        let cfg = EngineConfig::default();
        assert!(check_placement(&cfg, &spec(Placement::default())).is_ok());
        for bad in [
            Placement {
                memory: Some(0),
                ..Placement::default()
            },
            Placement {
                cpus_milli: Some(0),
                ..Placement::default()
            },
            Placement {
                pids: Some(0),
                ..Placement::default()
            },
            Placement {
                image: Some("Not An Image!".into()),
                ..Placement::default()
            },
            Placement {
                labels: vec!["capwire.cid=x".into()],
                ..Placement::default()
            },
            Placement {
                constraints: vec!["node.role".into()],
                ..Placement::default()
            },
        ] {
            assert!(
                matches!(
                    check_placement(&cfg, &spec(bad.clone())),
                    Err(HostError::Refused(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn names_and_labels() {
        let parent = NodeId::from_bytes([0xab; 32]);
        let n = Names::of("capwire", &parent, "c7");
        assert_eq!(n.workload, "capwire-abababababababab-c7");
        assert_eq!(n.volume, "capwire-abababababababab-c7-state");
        let s = ChildSpec {
            cid: "c7".into(),
            name: "agent 7".into(),
            placement: Placement {
                labels: vec!["team=ml".into()],
                ..Placement::default()
            },
            ..ChildSpec::default()
        };
        let l = labels(&s, &parent);
        assert_eq!(l[LABEL_CID], "c7");
        assert_eq!(l[LABEL_NAME], "agent 7");
        assert_eq!(l["team"], "ml");
        assert_eq!(l[LABEL_PARENT], parent.to_string());
    }
}
