//! The node: the public handle of the composition root.

pub(crate) mod builder;

pub(crate) mod runtime;
pub(crate) mod shutdown;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::NodeId;
use capwire_manifest::Manifest;
use capwire_transport::canonical_node_id;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
#[cfg(unix)]
use tokio::net::UnixListener;

use crate::addr::Addr;
use crate::audit::AuditStats;
use crate::client::Peer;
use crate::contact::Contact;
use crate::core::configuration::ConfigWatch;
use crate::dispatch::metrics::MetricsSnapshot;
use crate::error::NodeError;
use crate::handle::NodeHandle;
use crate::invite::Invite;
use crate::net::counters::Direction;
use crate::net::counters::HandshakeFailure;
use crate::net::dialer;
use crate::net::listener::accept_loop;
use crate::proto::ledger::LedgerSizes;
use crate::stats::NodeStats;
use crate::time::deadline_after;
use builder::NodeBuilder;
use runtime::Runtime;

/// A running capwire node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Node {
    pub(crate) rt: Arc<Runtime>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.rt.id)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts building a node for the application `app_id`.
    pub fn builder(app_id: impl Into<String>) -> NodeBuilder {
        NodeBuilder::new(app_id.into())
    }

    /// This node's identity.
    pub fn id(&self) -> NodeId {
        self.rt.id
    }

    /// The addresses this node listens on (with the ports actually bound).
    pub fn local_addrs(&self) -> Vec<Addr> {
        self.rt
            .local_addrs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// This node's manifest: a plain local read.
    pub fn manifest(&self) -> Manifest {
        self.rt.control.manifest()
    }

    /// A copy of the per (cap, verb, outcome) counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.rt.dispatcher.metrics().snapshot()
    }

    /// What the audit log holds now (WIRE.md 5.6): its entries, the first
    /// one still kept, its bytes.
    pub fn audit_stats(&self) -> AuditStats {
        self.rt.core.audit.stats()
    }

    /// Counters for monitoring: sessions by direction, handshake failures
    /// by reason, the replay ledger's sizes, queue depths and monitoring
    /// copies. Cheap enough to call on every scrape: it takes each
    /// session's lock once, briefly.
    pub fn stats(&self) -> NodeStats {
        let limits = &self.rt.limits;
        let tap = self.rt.peers.tap();
        let (copies_sent, copies_dropped) = tap.copies();
        let mut stats = NodeStats {
            calls: self.metrics(),
            budget_used: self.rt.peers.budget_use(),
            budget_limits: (
                limits.max_inbound_sessions,
                limits.max_outbound_sessions,
                limits.reserved_sessions,
            ),
            ledger: self.ledger_sizes(),
            copies_sent,
            copies_dropped,
            copies_queued: tap.queued(),
            ..NodeStats::default()
        };
        stats.read_net(&self.rt.net.env.stats);
        stats.read_streams(&self.rt.net.env.streams);
        (stats.tasks, stats.task_events, stats.task_pushes_dropped) = self.rt.tasks.figures();
        let grants = &self.rt.core.grants.delegations;
        let counts = grants.counts();
        stats.grants_presented = counts.presented;
        stats.grant_calls = counts.calls;
        stats.grants_refused = counts.refused;
        stats.grant_holders = grants.holders();
        stats.grant_revocations = grants.revocations();
        (stats.trace_contexts_accepted, stats.trace_contexts_dropped) =
            self.rt.dispatcher.traces().figures();
        for session in self.rt.peers.sessions() {
            let core = session.lock();
            stats.pending_calls += core.pending_calls();
            stats.inflight += core.inflight();
            stats.queued_bytes += core.queued_bytes();
            let (served, called) = core.streams();
            stats.streams_served += served;
            stats.streams_called += called;
        }
        stats
    }

    /// The control plane this node is bound to, if any.
    pub fn controller(&self) -> Option<NodeId> {
        self.rt.control.binding().controller().copied()
    }

    /// The narrow handle handlers get (see [`NodeHandle`]).
    pub fn handle(&self) -> NodeHandle {
        self.rt.handle.clone()
    }

    /// The sizes of the replay ledger.
    pub fn ledger_sizes(&self) -> LedgerSizes {
        self.rt.dispatcher.ledger().sizes()
    }

    /// Calls waiting for an answer, over all sessions.
    pub fn pending_calls(&self) -> usize {
        self.rt
            .peers
            .sessions()
            .iter()
            .map(|s| s.pending_calls())
            .sum()
    }

    /// The peers' requests and notifications in flight here, over all
    /// sessions (running, or answered and waiting for the wire).
    pub fn inflight(&self) -> usize {
        self.rt
            .peers
            .sessions()
            .iter()
            .map(|s| s.lock().inflight())
            .sum()
    }

    /// Bytes of frames waiting to be sent, over all sessions.
    pub fn queued_bytes(&self) -> usize {
        self.rt
            .peers
            .sessions()
            .iter()
            .map(|s| s.lock().queued_bytes())
            .sum()
    }

    /// The peers with a live session.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        self.rt.peers.connected()
    }

    /// Sessions counted against the (inbound, outbound, reserved) budgets.
    pub fn session_budget_use(&self) -> (usize, usize, usize) {
        self.rt.peers.budget_use()
    }

    /// Inbound handshakes that may start now.
    pub fn available_handshake_slots(&self) -> usize {
        self.rt.net.accept.available()
    }

    /// Inbound connections refused so far (accept rate or per-source bound).
    pub fn refused_connections(&self) -> u64 {
        self.rt
            .net
            .refused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Opens a pending bind: a control plane that presents the code within
    /// 300 s (3 attempts) through `core.monitoring/bind` becomes this node's
    /// controller. With `expected`, only that key (in any encoding) may bind.
    ///
    /// # Errors
    /// The system random number generator failed.
    pub fn invite(&self, expected: Option<NodeId>) -> Result<Invite, NodeError> {
        let now = tokio::time::Instant::now().into_std();
        let expected = expected.map(|e| canonical_node_id(&e));
        let code = self.rt.control.open_pending(expected, now)?;
        Ok(Invite {
            node_id: self.rt.id,
            addrs: self.local_addrs(),
            code: Some(code),
        })
    }

    /// Drops the pending bind (the invite's code stops working).
    pub fn cancel_invite(&self) {
        self.rt
            .control
            .cancel_pending(tokio::time::Instant::now().into_std());
    }

    /// Unbinds the control plane, locally and durably; returns the one that
    /// was bound.
    ///
    /// # Errors
    /// [`NodeError::State`] when the change could not be written (the node
    /// is then bound to the same control plane again: nothing changed).
    ///
    /// Children the node had bound for that control plane are released
    /// from it (see `core.cluster` in WIRE.md 5.3).
    ///
    /// # Cancel safety
    /// Not cancel safe. The node is unbound at the first poll; dropped
    /// before the write is done, the binding may still be in the state
    /// directory and come back after a restart (a second call finds nothing
    /// to unbind and writes nothing).
    pub async fn unbind(&self) -> Result<Option<NodeId>, NodeError> {
        self.rt
            .core
            .unbind()
            .await
            .map_err(|e| NodeError::State(e.body().message.clone()))
    }

    /// The configuration the control plane set (`core.configuration`).
    pub fn config(&self) -> capwire_manifest::ConfigValue {
        self.rt.core.config()
    }

    /// Watches the configuration.
    pub fn watch_config(&self) -> ConfigWatch {
        ConfigWatch(self.rt.core.watch_config())
    }

    /// This node's roster of children (`core.cluster`).
    pub fn roster(&self) -> capwire_manifest::Roster {
        self.rt.core.roster()
    }

    /// Watches this node's manifest (epoch, monitoring status, ...).
    pub fn watch_manifest(&self) -> ManifestWatch {
        ManifestWatch(self.rt.control.watch())
    }

    /// The pushes other nodes send this one as their control plane:
    /// monitoring copies and roster updates, with the sender's key. Each
    /// call gives a new receiver that sees pushes from then on; a receiver
    /// that falls more than 1024 behind is told how many it missed.
    pub fn control_events(
        &self,
    ) -> tokio::sync::broadcast::Receiver<crate::core::events::ControlEvent> {
        self.rt.core.subscribe_events()
    }

    /// Starts listening on another address; returns the bound address.
    ///
    /// # Errors
    /// The address cannot be bound, or the node is shutting down.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before it completes, the node does not listen
    /// on `addr`.
    pub async fn listen(&self, addr: Addr) -> Result<Addr, NodeError> {
        if self.rt.peers.stopping().is_cancelled() {
            return Err(NodeError::Shutdown);
        }
        let net = self.rt.net.clone();
        let bound = match addr {
            Addr::Tcp(sa) => {
                let listener = TcpListener::bind(sa).await?;
                let local = Addr::Tcp(listener.local_addr()?);
                self.rt.tracker.spawn(accept_loop(net, listener));
                local
            }
            #[cfg(unix)]
            Addr::Unix(path) => {
                let listener = UnixListener::bind(&path)?;
                let socket_file = path.clone();
                self.rt.tracker.spawn(async move {
                    accept_loop(net, listener).await;
                    // Leave the path free for the next node to listen on.
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
        self.rt
            .local_addrs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(bound.clone());
        Ok(bound)
    }

    /// Serves one already-connected stream (e.g. one half of an in-memory
    /// pair, or a simulated network's stream) as an inbound connection,
    /// under the same handshake bounds as a listener's (but no per-source
    /// bound: there is no address).
    pub fn accept_stream<S>(&self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let net = self.rt.net.clone();
        let Ok(permit) = net.accept.try_permit() else {
            tracing::debug!("inbound stream refused: too many handshakes in progress");
            net.env
                .stats
                .failed(Direction::Inbound, HandshakeFailure::Capacity);
            self.rt
                .tracker
                .spawn(async move { capwire_transport::Endpoint::refuse_busy(stream).await });
            return;
        };
        self.rt
            .tracker
            .spawn(async move { net.clone().serve_inbound(stream, permit).await });
    }

    /// Dials `addr` and returns the peer when its session is up, within
    /// [`Limits::connect_timeout`](crate::Limits::connect_timeout). With
    /// `expected`, the handshake must prove that key. A peer at capacity
    /// ("busy") is retried after short pauses until the deadline.
    ///
    /// # Errors
    /// The dial, the handshake or the hello exchange failed; the peer
    /// refused the session ([`NodeError::Refused`]); the deadline passed.
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait, not a handshake already under
    /// way: its session may still open, and then stays like any other
    /// ([`Node::peer`] reaches it).
    pub async fn connect(&self, addr: &Addr, expected: Option<NodeId>) -> Result<Peer, NodeError> {
        let session = dialer::dial(&self.rt.net, addr, expected).await?;
        Ok(self.peer(session.remote()))
    }

    /// Connects over an already-open stream (e.g. one half of an in-memory
    /// pair), as the dialling side.
    ///
    /// # Errors
    /// The handshake or the hello exchange failed, or the peer refused the
    /// session; the node's connect timeout passed.
    ///
    /// # Cancel safety
    /// As [`Node::connect`].
    pub async fn connect_stream<S>(
        &self,
        stream: S,
        expected: Option<NodeId>,
    ) -> Result<Peer, NodeError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let deadline = deadline_after(self.rt.limits.connect_timeout);
        let session =
            tokio::time::timeout_at(deadline, self.rt.net.connect_stream(stream, expected))
                .await
                .map_err(|_| NodeError::Timeout)??;
        Ok(self.peer(session.remote()))
    }

    /// Adds a durable contact: the node keeps a session with it,
    /// redialling with bounded exponential backoff whenever it drops, and
    /// remembers it across restarts (with a state directory). Contacts may
    /// use the sessions kept in reserve when the budgets are used up.
    /// Returns `false` when the contact was already known as it is.
    ///
    /// # Errors
    /// The node is shutting down; the contact could not be written.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped while the contact is being written, it may
    /// be stored without being dialled in this run. Calling again with the
    /// same contact completes it.
    pub async fn add_contact(&self, mut contact: Contact) -> Result<bool, NodeError> {
        if self.rt.peers.stopping().is_cancelled() {
            return Err(NodeError::Shutdown);
        }
        contact.id = canonical_node_id(&contact.id);
        self.rt
            .core
            .add_contact(contact)
            .await
            .map_err(|e| NodeError::State(e.body().message.clone()))
    }

    /// Forgets a contact (durably) and stops dialling it; its session, if
    /// up, stays until it ends. Returns `false` when it was not a durable
    /// contact.
    ///
    /// # Errors
    /// The change could not be written.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped while the change is being written, the
    /// contact may be gone from the store but still dialled in this run.
    /// Calling again completes it.
    pub async fn remove_contact(&self, id: NodeId) -> Result<bool, NodeError> {
        let id = canonical_node_id(&id);
        let durable = self
            .rt
            .core
            .remove_contact(id)
            .await
            .map_err(|e| NodeError::State(e.body().message.clone()))?;
        Ok(self.rt.peers.remove_contact(&id) || durable)
    }

    /// Connects to the node an invite names (trying its addresses in
    /// order) and, when the invite carries a code, binds it: this node
    /// becomes its control plane. Returns the peer and, after a bind, what
    /// the node answered (its manifest, roster and configuration).
    ///
    /// # Errors
    /// [`NodeError::ConnectionLost`] (or the last dial error) when no
    /// address could be reached; the bind's failure as
    /// [`NodeError::Bind`].
    ///
    /// # Cancel safety
    /// As [`Node::connect`] and then [`Peer::bind`]: a session may open, and
    /// a bind the node has already carried out stays.
    pub async fn connect_invite(
        &self,
        invite: &Invite,
    ) -> Result<(Peer, Option<capwire_manifest::BindReply>), NodeError> {
        let mut last = NodeError::ConnectionLost("the invite names no address".into());
        let mut peer = None;
        for addr in &invite.addrs {
            match self.connect(addr, Some(invite.node_id)).await {
                Ok(p) => {
                    peer = Some(p);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let Some(peer) = peer else {
            return Err(last);
        };
        if invite.code.is_none() {
            return Ok((peer, None));
        }
        let reply = peer.bind(invite).await.map_err(NodeError::Bind)?;
        Ok((peer, Some(reply)))
    }

    /// The known contacts.
    pub fn contacts(&self) -> Vec<Contact> {
        self.rt.peers.contacts()
    }

    /// A handle to call `id` (any encoding of the key). Calls wait (within
    /// their deadline) for a session when `id` is a contact being dialled.
    pub fn peer(&self, id: NodeId) -> Peer {
        self.rt.handle.peer(id)
    }

    /// Waits until a session with `id` is up (dialled by either side), or
    /// `timeout` passes.
    ///
    /// # Errors
    /// [`NodeError::Timeout`] when no session came up in time.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_for_peer(&self, id: NodeId, timeout: Duration) -> Result<Peer, NodeError> {
        let id = canonical_node_id(&id);
        self.rt
            .peers
            .wait_any_session(&id, deadline_after(timeout))
            .await
            .map(|_| self.peer(id))
            .ok_or(NodeError::Timeout)
    }

    /// Runs until `shutdown` resolves, then shuts down gracefully.
    ///
    /// # Cancel safety
    /// Dropped while waiting for `shutdown`, it does nothing (the node runs
    /// on); dropped later, as [`Node::shutdown`].
    pub async fn run_until<F: Future<Output = ()>>(self, shutdown: F) {
        shutdown.await;
        self.shutdown().await;
    }

    /// Graceful shutdown: stops accepting and dialling, answers new requests
    /// `cancelled`, lets running handlers finish for
    /// [`Limits::shutdown_grace`](crate::Limits::shutdown_grace) and then
    /// cancels them (their callers get `cancelled`), closes every session
    /// with code `shutdown`, and waits for the node's tasks. It returns
    /// within `shutdown_grace + close_timeout + 350 ms` whatever peers do.
    /// Calling it again (from any clone) waits for the first call.
    ///
    /// # Cancel safety
    /// Not cancel safe: the steps above run in the caller's future, so a
    /// dropped call leaves the node part way (e.g. no longer accepting, its
    /// sessions still open). Calling it again runs the shutdown to the end.
    pub async fn shutdown(&self) {
        shutdown::shutdown(&self.rt).await;
    }
}

impl NodeBuilder {
    /// Builds the node, binds its listeners and starts accepting and dialling.
    ///
    /// # Errors
    /// A registry invariant is broken, a handler needs state the node was
    /// not given, a listener cannot bind, the keypair cannot be generated,
    /// the state directory cannot be opened, or a limit is invalid.
    ///
    /// # Cancel safety
    /// Not cancel safe: a start dropped after its first listener was bound
    /// leaves that listener accepting, with no [`Node`] to shut it down.
    /// Drive it to completion (it does not wait for any peer).
    pub async fn start(self) -> Result<Node, NodeError> {
        let (mut parts, listen, contacts) = self.into_parts();
        let (dir, keypair) = (parts.state_dir.clone(), parts.keypair.take());
        let opened = tokio::task::spawn_blocking(move || runtime::open_state(dir, keypair))
            .await
            .map_err(|e| NodeError::State(e.to_string()))??;
        Self::launch(parts, opened, listen, contacts).await
    }

    /// As [`start`](Self::start), on `store` (in memory: what the node
    /// holds when it starts is what `store` loads).
    #[cfg(test)]
    pub(crate) async fn start_on_store_for_testing(
        self,
        store: Arc<dyn crate::store::Store>,
    ) -> Result<Node, NodeError> {
        let (mut parts, listen, contacts) = self.into_parts();
        let keypair = match parts.keypair.take() {
            Some(k) => k,
            None => capwire_transport::Keypair::generate()?,
        };
        let opened = runtime::Opened {
            keypair,
            loaded: store.load()?,
            store,
            blocking: false,
            dir: None,
        };
        Self::launch(parts, opened, listen, contacts).await
    }

    async fn launch(
        parts: runtime::Parts,
        opened: runtime::Opened,
        listen: Vec<Addr>,
        contacts: Vec<Contact>,
    ) -> Result<Node, NodeError> {
        let node = Node {
            rt: Arc::new(runtime::build(parts, opened)?),
        };
        for addr in listen {
            if let Err(e) = node.listen(addr).await {
                node.shutdown().await;
                return Err(e);
            }
        }
        node.rt.spawn_background();
        // The builder's contacts are for this run (not written to the state).
        for mut contact in contacts {
            contact.id = canonical_node_id(&contact.id);
            node.rt.start_contact(contact);
        }
        Ok(node)
    }
}

/// Watches a node's manifest; see [`Node::watch_manifest`].
#[derive(Debug, Clone)]
pub struct ManifestWatch(pub(crate) tokio::sync::watch::Receiver<Manifest>);

impl ManifestWatch {
    /// The manifest now.
    pub fn current(&self) -> Manifest {
        self.0.borrow().clone()
    }

    /// Waits for the next change and returns it; `None` when the node is
    /// gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn changed(&mut self) -> Option<Manifest> {
        self.0.changed().await.ok()?;
        Some(self.0.borrow_and_update().clone())
    }
}
