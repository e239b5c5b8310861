//! The node: builder, shared state, listeners, contacts and shutdown.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use capwire_authz::{Authorizer, BindCode, BindingState, Gate, SharedBinding};
use capwire_envelope::{NodeId, ReqId};
use capwire_manifest::{Manifest, MonitoringHandlers, NodeInfo, Registry, Version};
use capwire_transport::{
    ContactPolicy, Endpoint, EntropySource, Keypair, OsEntropy, TransportConfig,
};
use tokio::net::{TcpListener, TcpStream};
#[cfg(unix)]
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::addr::Addr;
use crate::backoff::Backoff;
use crate::config::Limits;
use crate::error::NodeError;
use crate::handler::{Handler, RouteHandler, Typed};
use crate::ledger::{Ledger, LedgerLimits};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::monitoring;
use crate::peer::Peer;
use crate::session::{self, SessionHandle};

/// A contact: a peer this node knows by name, key and address, and keeps a
/// session with (redialling with backoff when it drops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contact {
    /// A local name for the peer.
    pub name: String,
    /// The peer's identity.
    pub id: NodeId,
    /// Where to dial it.
    pub addr: Addr,
}

/// An `app.*` (or, for the framework, `core.*`) capability with its typed
/// handlers, ready to be added to a [`NodeBuilder`].
///
/// ```
/// use capwire::{Capability, HandlerError};
/// use capwire::manifest::verb;
///
/// verb! { pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
///
/// async fn say(text: String) -> Result<String, HandlerError> { Ok(text) }
///
/// let cap = Capability::new("app.echo", "1.0.0").unwrap().handle(Say, say);
/// assert_eq!(cap.id(), "app.echo");
/// ```
pub struct Capability {
    inner: capwire_manifest::Capability<RouteHandler>,
}

impl std::fmt::Debug for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capability")
            .field("id", &self.inner.id())
            .finish_non_exhaustive()
    }
}

impl Capability {
    /// A capability with a semver version and no verbs yet.
    ///
    /// # Errors
    /// When `version` is not a semver version. The id is checked when the
    /// node is built.
    pub fn new(id: &str, version: &str) -> Result<Self, NodeError> {
        let version = Version::parse(version)
            .map_err(|e| NodeError::Config(format!("capability {id}: bad version: {e}")))?;
        Ok(Self {
            inner: capwire_manifest::Capability::new(id, version),
        })
    }

    /// The capability id as given.
    pub fn id(&self) -> &str {
        self.inner.id()
    }

    /// Describes the capability's configuration (opaque text).
    pub fn params(mut self, params: impl Into<String>) -> Self {
        self.inner = self.inner.params(params);
        self
    }

    /// Adds verb `V`, handled by `handler`: an async fn taking `V::Args` and
    /// up to three extractors ([`Sender`](crate::Sender),
    /// [`Meta`](crate::Meta), [`State`](crate::State), [`Node`]).
    pub fn handle<V, M, H>(mut self, _verb: V, handler: H) -> Self
    where
        V: capwire_manifest::VerbDef,
        M: Send + Sync + 'static,
        H: Handler<V, M>,
    {
        let route: RouteHandler = Arc::new(Typed::<V, M, H>::new(handler));
        self.inner = self.inner.verb::<V>(route);
        self
    }
}

type StateMap = HashMap<TypeId, Box<dyn Any + Send + Sync>>;

/// Builds a [`Node`].
///
/// ```no_run
/// # async fn demo() -> Result<(), capwire::NodeError> {
/// use capwire::Node;
/// let node = Node::builder("my-app").listen("127.0.0.1:0".parse()?).start().await?;
/// println!("{} listening on {:?}", node.id(), node.local_addrs());
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct NodeBuilder {
    app_id: String,
    name: Option<String>,
    description: String,
    keypair: Option<Keypair>,
    listen: Vec<Addr>,
    contacts: Vec<Contact>,
    policy: ContactPolicy,
    caps: Vec<Capability>,
    limits: Limits,
    transport: TransportConfig,
    states: StateMap,
    authorizer: Option<Arc<dyn Authorizer>>,
    controller: Option<NodeId>,
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("app_id", &self.app_id)
            .field("listen", &self.listen)
            .field("contacts", &self.contacts)
            .finish_non_exhaustive()
    }
}

impl NodeBuilder {
    /// Uses this identity (default: a fresh random keypair).
    pub fn keypair(mut self, keypair: Keypair) -> Self {
        self.keypair = Some(keypair);
        self
    }

    /// A human-readable name (default: the app id).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A human-readable description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Listens on this address (TCP or Unix); may be called several times.
    pub fn listen(mut self, addr: Addr) -> Self {
        self.listen.push(addr);
        self
    }

    /// Adds a contact to keep a session with.
    pub fn contact(mut self, contact: Contact) -> Self {
        self.contacts.push(contact);
        self
    }

    /// Who may finish a handshake with this node (default: anyone but itself).
    pub fn contact_policy(mut self, policy: ContactPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Adds a capability with its handlers.
    pub fn capability(mut self, cap: Capability) -> Self {
        self.caps.push(cap);
        self
    }

    /// Replaces the runtime limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Replaces the transport settings.
    pub fn transport_config(mut self, config: TransportConfig) -> Self {
        self.transport = config;
        self
    }

    /// Makes `value` available to handlers through [`State<T>`](crate::State).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(TypeId::of::<T>(), Box::new(value));
        self
    }

    /// Replaces the authorizer of controller verbs (default: the sender
    /// must be the bound control plane). It is consulted only for
    /// controller verbs; if it errors or panics the envelope is denied.
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    /// Starts already bound to this control plane (e.g. restored from storage).
    pub fn bound_to(mut self, controller: NodeId) -> Self {
        self.controller = Some(controller);
        self
    }

    /// Builds the node, binds its listeners and starts accepting and dialling.
    ///
    /// # Errors
    /// A registry invariant is broken, a listener cannot bind, the keypair
    /// cannot be generated, or a setting is invalid.
    pub async fn start(self) -> Result<Node, NodeError> {
        let keypair = match self.keypair {
            Some(k) => k,
            None => Keypair::generate()?,
        };
        let id = keypair.public();
        let mut info = NodeInfo::new(id, self.app_id.clone()).with_description(self.description);
        if let Some(name) = self.name {
            info = info.with_name(name);
        }
        let core_handlers = MonitoringHandlers {
            bind: monitoring::bind_handler(),
            disable: monitoring::disable_handler(),
        };
        let mut builder = Registry::builder(info, core_handlers);
        for cap in self.caps {
            builder = builder.capability(cap.inner);
        }
        let registry = builder.build()?;
        self.transport.validate()?;
        let endpoint = Endpoint::try_new(keypair, self.transport.clone(), self.policy)?;

        let gate = match self.authorizer {
            Some(a) => Gate::from_arc(a),
            None => Gate::default(),
        };
        let binding = SharedBinding::new(BindingState::restore(self.controller));
        // Request ids continue from a random point, so that a node
        // restarted with the same identity does not reuse the ids of its
        // previous run while its peers still remember their answers.
        let mut start = [0u8; 8];
        OsEntropy
            .try_fill(&mut start)
            .map_err(|_| capwire_transport::TransportError::Rng)?;
        let first_req = u64::from_le_bytes(start) >> 1;
        let (peers_tx, _) = watch::channel(0u64);
        let limits = self.limits;
        let inner = Arc::new(Inner {
            id,
            endpoint,
            registry: RwLock::new(Arc::new(registry)),
            gate,
            binding,
            manifest_epoch: AtomicU64::new(1),
            peers: Mutex::new(HashMap::new()),
            peers_changed: peers_tx,
            contacts: Mutex::new(HashMap::new()),
            ledger: Mutex::new(Ledger::new(LedgerLimits {
                window: limits.replay_window,
                max_entries: limits.replay_max_entries,
                max_bytes: limits.replay_max_bytes,
            })),
            metrics: Metrics::default(),
            next_req: AtomicU64::new(first_req),
            next_session: AtomicU64::new(1),
            sessions: Arc::new(Semaphore::new(limits.max_sessions)),
            limits,
            states: self.states,
            local_addrs: Mutex::new(Vec::new()),
            stop_accepting: CancellationToken::new(),
            stop_handlers: CancellationToken::new(),
            shutting_down: AtomicBool::new(false),
            tracker: TaskTracker::new(),
        });
        let node = Node { inner };
        for addr in self.listen {
            node.listen(addr).await?;
        }
        for contact in self.contacts {
            node.add_contact(contact);
        }
        Ok(node)
    }
}

pub(crate) struct PeerSlot {
    pub(crate) session: Arc<SessionHandle>,
}

pub(crate) struct Inner {
    pub(crate) id: NodeId,
    pub(crate) endpoint: Endpoint,
    pub(crate) registry: RwLock<Arc<Registry<RouteHandler>>>,
    pub(crate) gate: Gate,
    pub(crate) binding: SharedBinding,
    pub(crate) manifest_epoch: AtomicU64,
    pub(crate) peers: Mutex<HashMap<NodeId, PeerSlot>>,
    pub(crate) peers_changed: watch::Sender<u64>,
    pub(crate) contacts: Mutex<HashMap<NodeId, (Contact, CancellationToken)>>,
    pub(crate) ledger: Mutex<Ledger>,
    pub(crate) metrics: Metrics,
    pub(crate) next_req: AtomicU64,
    pub(crate) next_session: AtomicU64,
    pub(crate) sessions: Arc<Semaphore>,
    pub(crate) limits: Limits,
    states: StateMap,
    local_addrs: Mutex<Vec<Addr>>,
    pub(crate) stop_accepting: CancellationToken,
    pub(crate) stop_handlers: CancellationToken,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) tracker: TaskTracker,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    pub(crate) fn registry(&self) -> Arc<Registry<RouteHandler>> {
        self.registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn manifest(&self) -> Manifest {
        let status = self.binding.status(std::time::Instant::now());
        self.registry()
            .manifest(status, self.manifest_epoch.load(Ordering::Relaxed))
    }

    pub(crate) fn session(&self, id: &NodeId) -> Option<Arc<SessionHandle>> {
        lock(&self.peers).get(id).map(|s| s.session.clone())
    }

    pub(crate) fn next_req_id(&self) -> ReqId {
        ReqId::from_u64(self.next_req.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn bump_peers(&self) {
        self.peers_changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Bumps the manifest epoch and sends the new manifest to every peer.
    pub(crate) fn manifest_changed(self: &Arc<Self>) {
        self.manifest_epoch.fetch_add(1, Ordering::Relaxed);
        let sessions: Vec<_> = lock(&self.peers)
            .values()
            .map(|p| p.session.clone())
            .collect();
        for s in sessions {
            s.push_hello(self);
        }
    }
}

/// A running capwire node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts building a node for the application `app_id`.
    pub fn builder(app_id: impl Into<String>) -> NodeBuilder {
        NodeBuilder {
            app_id: app_id.into(),
            name: None,
            description: String::new(),
            keypair: None,
            listen: Vec::new(),
            contacts: Vec::new(),
            policy: ContactPolicy::AcceptAny,
            caps: Vec::new(),
            limits: Limits::default(),
            transport: TransportConfig::default(),
            states: HashMap::new(),
            authorizer: None,
            controller: None,
        }
    }

    /// This node's identity.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// The addresses this node listens on (with the ports actually bound).
    pub fn local_addrs(&self) -> Vec<Addr> {
        lock(&self.inner.local_addrs).clone()
    }

    /// This node's manifest: a plain local read.
    pub fn manifest(&self) -> Manifest {
        self.inner.manifest()
    }

    /// A copy of the per (cap, verb, outcome) counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// The control plane this node is bound to, if any.
    pub fn controller(&self) -> Option<NodeId> {
        self.inner.binding.snapshot().controller().copied()
    }

    /// Handler state registered with [`NodeBuilder::state`].
    pub fn state<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        self.inner
            .states
            .get(&TypeId::of::<T>())
            .and_then(|b| b.downcast_ref::<T>())
            .cloned()
    }

    /// Requests running now and finished requests remembered for replay.
    pub fn ledger_sizes(&self) -> (usize, usize) {
        let l = lock(&self.inner.ledger);
        (l.running(), l.remembered())
    }

    /// Calls waiting for an answer, over all sessions.
    pub fn pending_calls(&self) -> usize {
        lock(&self.inner.peers)
            .values()
            .map(|p| p.session.pending_len())
            .sum()
    }

    /// The peers with a live session.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        lock(&self.inner.peers).keys().copied().collect()
    }

    /// Opens a pending bind: a control plane that presents `code` within
    /// 300 s (3 attempts) through `core.monitoring/bind` becomes this node's
    /// controller. With `expected`, only that key may bind.
    ///
    /// # Errors
    /// The system random number generator failed.
    pub fn invite(&self, expected: Option<NodeId>) -> Result<Invite, NodeError> {
        let code = BindCode::random()?;
        let text = code.expose().to_owned();
        self.inner
            .binding
            .create_pending(code, expected, std::time::Instant::now());
        self.inner.manifest_changed();
        Ok(Invite {
            node_id: self.inner.id,
            addrs: self.local_addrs(),
            code: text,
        })
    }

    /// Unbinds the control plane, locally.
    pub fn unbind(&self) -> Option<NodeId> {
        let previous = self.inner.binding.unbind();
        if previous.is_some() {
            self.inner.manifest_changed();
        }
        previous
    }

    /// Starts listening on another address; returns the bound address.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn listen(&self, addr: Addr) -> Result<Addr, NodeError> {
        let bound = match addr {
            Addr::Tcp(sa) => {
                let listener = TcpListener::bind(sa).await?;
                let local = Addr::Tcp(listener.local_addr()?);
                let inner = self.inner.clone();
                self.inner
                    .tracker
                    .spawn(async move { accept_loop(&inner, &listener).await });
                local
            }
            #[cfg(unix)]
            Addr::Unix(path) => {
                let listener = UnixListener::bind(&path)?;
                let inner = self.inner.clone();
                let socket_file = path.clone();
                self.inner.tracker.spawn(async move {
                    accept_loop(&inner, &listener).await;
                    // Leave the path free for the next node to listen on.
                    drop(listener);
                    let _ = std::fs::remove_file(&socket_file);
                });
                Addr::Unix(path)
            }
            #[cfg(not(unix))]
            Addr::Unix(_) => {
                return Err(NodeError::Config(
                    "unix sockets are not supported here".into(),
                ));
            }
        };
        lock(&self.inner.local_addrs).push(bound.clone());
        Ok(bound)
    }

    /// Serves one already-connected stream (e.g. one half of an in-memory
    /// pair) as an inbound connection.
    pub fn accept_stream<S>(&self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        session::spawn_accepted(&self.inner, stream);
    }

    /// Dials `addr` once and returns the peer when its session is up. With
    /// `expected`, the handshake must prove that key.
    ///
    /// # Errors
    /// The dial, the handshake or the hello exchange failed.
    pub async fn connect(&self, addr: &Addr, expected: Option<NodeId>) -> Result<Peer, NodeError> {
        let session = dial(&self.inner, addr, expected).await?;
        Ok(Peer::new(self.clone(), session.remote()))
    }

    /// Connects over an already-open stream (e.g. one half of an in-memory
    /// pair), as the dialling side.
    ///
    /// # Errors
    /// The handshake or the hello exchange failed.
    pub async fn connect_stream<S>(
        &self,
        stream: S,
        expected: Option<NodeId>,
    ) -> Result<Peer, NodeError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let session = session::establish(&self.inner, stream, expected, true).await?;
        Ok(Peer::new(self.clone(), session.remote()))
    }

    /// Adds a contact: the node keeps a session with it, redialling with
    /// bounded exponential backoff whenever it drops.
    pub fn add_contact(&self, contact: Contact) {
        let token = self.inner.stop_accepting.child_token();
        let previous =
            lock(&self.inner.contacts).insert(contact.id, (contact.clone(), token.clone()));
        if let Some((_, old)) = previous {
            old.cancel();
        }
        let inner = self.inner.clone();
        self.inner
            .tracker
            .spawn(async move { contact_loop(inner, contact, token).await });
    }

    /// The known contacts.
    pub fn contacts(&self) -> Vec<Contact> {
        lock(&self.inner.contacts)
            .values()
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// A handle to call `id`. Calls wait (within their deadline) for a
    /// session when `id` is a contact being dialled.
    pub fn peer(&self, id: NodeId) -> Peer {
        Peer::new(self.clone(), id)
    }

    /// Waits until a session with `id` is up, or `timeout` passes.
    ///
    /// # Errors
    /// [`NodeError::Timeout`] when no session came up in time.
    pub async fn wait_for_peer(&self, id: NodeId, timeout: Duration) -> Result<Peer, NodeError> {
        session::wait_session(&self.inner, &id, Instant::now() + timeout)
            .await
            .map(|_| Peer::new(self.clone(), id))
            .ok_or(NodeError::Timeout)
    }

    /// Runs until `shutdown` resolves, then shuts down gracefully.
    pub async fn run_until<F: Future<Output = ()>>(self, shutdown: F) {
        shutdown.await;
        self.shutdown().await;
    }

    /// Graceful shutdown: stops accepting and dialling, answers new requests
    /// `cancelled`, lets running handlers finish for
    /// [`Limits::shutdown_grace`] and then cancels them (their callers get
    /// `cancelled`), closes every session with reason `shutdown`, and waits
    /// until every task of the node has ended.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutting_down.store(true, Ordering::SeqCst);
        inner.stop_accepting.cancel();
        let grace = tokio::time::sleep(inner.limits.shutdown_grace);
        tokio::pin!(grace);
        loop {
            if lock(&inner.ledger).running() == 0 {
                break;
            }
            tokio::select! {
                _ = &mut grace => break,
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        inner.stop_handlers.cancel();
        // Give cancelled handlers a moment to send their `cancelled` answers.
        let settle = Instant::now() + Duration::from_millis(500);
        while lock(&inner.ledger).running() > 0 && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let sessions: Vec<_> = lock(&inner.peers)
            .values()
            .map(|p| p.session.clone())
            .collect();
        for s in sessions {
            s.close(capwire_envelope::CloseCode::Shutdown, "node shutting down")
                .await;
        }
        inner.tracker.close();
        inner.tracker.wait().await;
    }
}

/// What a control plane needs to bind a node: its id, addresses and the
/// one-time code.
#[derive(Clone, PartialEq, Eq)]
pub struct Invite {
    /// The node's identity.
    pub node_id: NodeId,
    /// Where it listens.
    pub addrs: Vec<Addr>,
    /// The bind code.
    pub code: String,
}

impl std::fmt::Debug for Invite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invite")
            .field("node_id", &self.node_id)
            .field("addrs", &self.addrs)
            .field("code", &"<redacted>")
            .finish()
    }
}

/// Dials `addr` and establishes a session.
pub(crate) async fn dial(
    inner: &Arc<Inner>,
    addr: &Addr,
    expected: Option<NodeId>,
) -> Result<Arc<SessionHandle>, NodeError> {
    match addr {
        Addr::Tcp(sa) => {
            let stream = TcpStream::connect(sa).await?;
            let _ = stream.set_nodelay(true);
            session::establish(inner, stream, expected, true).await
        }
        #[cfg(unix)]
        Addr::Unix(path) => {
            let stream = UnixStream::connect(path).await?;
            session::establish(inner, stream, expected, true).await
        }
        #[cfg(not(unix))]
        Addr::Unix(_) => Err(NodeError::Config(
            "unix sockets are not supported here".into(),
        )),
    }
}

async fn contact_loop(inner: Arc<Inner>, contact: Contact, token: CancellationToken) {
    let seed = u64::from_le_bytes(contact.id.as_bytes()[..8].try_into().unwrap_or([1; 8]));
    let mut backoff = Backoff::new(
        inner.limits.reconnect_initial,
        inner.limits.reconnect_max,
        seed,
    );
    loop {
        if token.is_cancelled() {
            return;
        }
        let session = match inner.session(&contact.id) {
            Some(s) => Some(s),
            None => {
                let attempt = tokio::select! {
                    _ = token.cancelled() => return,
                    r = dial(&inner, &contact.addr, Some(contact.id)) => r,
                };
                match attempt {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::debug!(peer = %contact.id, error = %e, "dial failed");
                        None
                    }
                }
            }
        };
        match session {
            Some(s) => {
                backoff.reset();
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = s.ended() => {}
                }
                // A short pause so that a peer which is going away is not
                // redialled in a tight loop.
                let delay = backoff.next_delay();
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            None => {
                let delay = backoff.next_delay();
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// A listener the accept loop can take streams from.
trait Acceptor: Send + Sync + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn accept_stream(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;
    async fn accept_stream(&self) -> std::io::Result<TcpStream> {
        let (stream, _) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

#[cfg(unix)]
impl Acceptor for UnixListener {
    type Stream = UnixStream;
    async fn accept_stream(&self) -> std::io::Result<UnixStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// Accepts connections until the node stops accepting; each is served in
/// its own task. Accept errors (e.g. out of file descriptors) are logged
/// and retried after a short pause.
async fn accept_loop<A: Acceptor>(inner: &Arc<Inner>, listener: &A) {
    loop {
        let accepted = tokio::select! {
            _ = inner.stop_accepting.cancelled() => break,
            a = listener.accept_stream() => a,
        };
        match accepted {
            Ok(stream) => session::spawn_accepted(inner, stream),
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
