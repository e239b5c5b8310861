//! Helpers for the core capabilities' tests (`tests/core_caps.rs`): a node
//! bound to a control plane, error unpacking, waiting for control events,
//! small `app.*` capabilities that record what they saw, and a child host
//! that can hold a child's start until the test lets it go.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire::envelope::{ErrorBody, NodeId};
use capwire::host::{ChildInfo, ChildSpec, Host, HostEvent, HostFuture, InProcessHost};
use capwire::manifest::{BindReply, CopyRecord, NoArgs, Roster, verb};
use capwire::{
    CallError, Capability, Contact, ControlEvent, HandlerError, Invite, Meta, Node, NodeBuilder,
    NodeHandle, Peer, Sender, State,
};
use tokio::sync::{Semaphore, broadcast};
use tokio::time::Instant;

/// Deadline of the calls the tests make (generous: children start nodes).
pub const CALL: Duration = Duration::from_secs(20);

/// How long a test waits for something that should happen soon.
pub const SOON: Duration = Duration::from_secs(10);

/// A node builder listening on loopback TCP.
pub fn listening(app: &str) -> NodeBuilder {
    Node::builder(app).listen("127.0.0.1:0".parse().unwrap())
}

/// A node and the control plane bound to it.
pub struct Bound {
    /// The node.
    pub node: Node,
    /// Its control plane (does not listen).
    pub cp: Node,
    /// The control plane's handle on the node.
    pub peer: Peer,
    /// What the node answered the bind.
    pub reply: BindReply,
}

/// Starts `builder` and binds a fresh control plane to it with
/// `Node::invite` + `Node::connect_invite`.
pub async fn bind_new(builder: NodeBuilder) -> Bound {
    let node = builder.start().await.unwrap();
    let cp = Node::builder("control-plane").start().await.unwrap();
    let invite = node.invite(Some(cp.id())).unwrap();
    let (peer, reply) = cp.connect_invite(&invite).await.unwrap();
    assert_eq!(node.controller(), Some(cp.id()));
    Bound {
        node,
        cp,
        peer,
        reply: reply.expect("the invite carried a code"),
    }
}

/// Connects a fresh node (no capabilities) to `node`.
pub async fn stranger(node: &Node) -> (Node, Peer) {
    let other = Node::builder("stranger").start().await.unwrap();
    let peer = other
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    (other, peer)
}

/// The error body of a call the peer's handler (or runtime) answered with
/// an error.
#[track_caller]
pub fn remote<T: std::fmt::Debug>(result: Result<T, CallError>) -> ErrorBody {
    match result {
        Err(CallError::Remote(body)) => body,
        other => panic!("expected a remote error, got {other:?}"),
    }
}

/// The error body of a call the peer's chokepoint denied.
#[track_caller]
pub fn denied<T: std::fmt::Debug>(result: Result<T, CallError>) -> ErrorBody {
    match result {
        Err(CallError::Denied(body)) => body,
        other => panic!("expected a denial, got {other:?}"),
    }
}

/// Polls `cond` (an async check) until it holds, or fails after [`SOON`].
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + SOON;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Receives control events until `pred` holds for one (which is returned
/// last); fails after [`SOON`], or when the receiver lagged.
pub async fn events_until(
    rx: &mut broadcast::Receiver<ControlEvent>,
    what: &str,
    mut pred: impl FnMut(&ControlEvent) -> bool,
) -> Vec<ControlEvent> {
    let deadline = Instant::now() + SOON;
    let mut seen = Vec::new();
    loop {
        let event = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) => panic!("timed out waiting for {what}; saw {seen:#?}"),
            Ok(Err(e)) => panic!("control events: {e} while waiting for {what}"),
            Ok(Ok(e)) => e,
        };
        let done = pred(&event);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// The roster pushes among `events`, as (sender, roster).
pub fn rosters(events: &[ControlEvent]) -> Vec<(NodeId, Roster)> {
    events
        .iter()
        .filter_map(|e| match e {
            ControlEvent::Roster { from, roster } => Some((*from, roster.clone())),
            _ => None,
        })
        .collect()
}

/// The monitoring copies among `events`, as (sender, copy).
pub fn copies(events: &[ControlEvent]) -> Vec<(NodeId, CopyRecord)> {
    events
        .iter()
        .filter_map(|e| match e {
            ControlEvent::Copy { from, record } => Some((*from, record.clone())),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------
// app.mon: a request and a notification that record what they saw.

verb! {
    /// Answers `pong: TEXT`; records the sender, req_id and text.
    pub struct Ping: request "app.mon" / "ping", Bootstrap, String => String;
}
verb! {
    /// Counts.
    pub struct Tick: notification "app.mon" / "tick", Bootstrap, u64;
}

/// What the `app.mon` handlers saw.
#[derive(Debug, Default)]
pub struct MonLog {
    /// (sender, req_id, text) of every ping, in order.
    pub pings: Mutex<Vec<(NodeId, String, String)>>,
    /// Ticks handled.
    pub ticks: AtomicUsize,
}

impl MonLog {
    /// The pings so far.
    pub fn pings(&self) -> Vec<(NodeId, String, String)> {
        self.pings.lock().unwrap().clone()
    }

    /// Ticks handled so far.
    pub fn ticks(&self) -> usize {
        self.ticks.load(Ordering::SeqCst)
    }
}

async fn ping(
    text: String,
    Sender(from): Sender,
    meta: Meta,
    State(log): State<Arc<MonLog>>,
) -> Result<String, HandlerError> {
    log.pings
        .lock()
        .unwrap()
        .push((from, meta.req_id.as_str().to_owned(), text.clone()));
    Ok(format!("pong: {text}"))
}

async fn tick(_n: u64, State(log): State<Arc<MonLog>>) -> Result<(), HandlerError> {
    log.ticks.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `app.mon` 1.0.0.
pub fn mon_cap() -> Capability {
    Capability::new("app.mon", "1.0.0")
        .unwrap()
        .handle(Ping, ping)
        .handle(Tick, tick)
}

/// A listening node with `app.mon`, and what its handlers see.
pub fn mon_node(app: &str) -> (NodeBuilder, Arc<MonLog>) {
    let log = Arc::new(MonLog::default());
    let builder = listening(app).capability(mon_cap()).state(log.clone());
    (builder, log)
}

// ---------------------------------------------------------------------
// app.kid: lets a test ask a child which peers it has sessions with.

verb! {
    /// The node ids (hex) of the peers the node has a live session with.
    pub struct KidPeers: request "app.kid" / "peers", Bootstrap, NoArgs => Vec<String>;
}

async fn kid_peers(_args: NoArgs, node: NodeHandle) -> Result<Vec<String>, HandlerError> {
    Ok(node
        .connected_peers()
        .iter()
        .map(ToString::to_string)
        .collect())
}

/// `app.kid` 1.0.0.
pub fn kid_cap() -> Capability {
    Capability::new("app.kid", "1.0.0")
        .unwrap()
        .handle(KidPeers, kid_peers)
}

/// An in-process host whose children have `app.kid`.
pub fn kid_host() -> InProcessHost {
    InProcessHost::new().with_factory(|_spec| Node::builder("kid").capability(kid_cap()))
}

/// Connects `cp` to a child through the invite text `core.cluster/contact`
/// gave, without binding it.
pub async fn reach_child(cp: &Node, invite_text: &str) -> Peer {
    let mut invite: Invite = invite_text.parse().unwrap();
    invite.code = None;
    let (peer, reply) = cp.connect_invite(&invite).await.unwrap();
    assert!(reply.is_none());
    peer
}

// ---------------------------------------------------------------------
// A host that holds the start of the child named `held` until released.

/// An [`InProcessHost`] whose `start` of the child named `held` waits for
/// a permit of `release`; `entered` counts such starts that began.
pub struct GatedHost {
    inner: InProcessHost,
    held: String,
    /// One permit lets one held start go on.
    pub release: Arc<Semaphore>,
    /// Held starts that began.
    pub entered: Arc<AtomicUsize>,
}

impl GatedHost {
    /// Holds children named `held`.
    pub fn new(held: &str) -> Self {
        Self {
            inner: InProcessHost::new(),
            held: held.to_owned(),
            release: Arc::new(Semaphore::new(0)),
            entered: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Host for GatedHost {
    fn start(&self, spec: ChildSpec) -> HostFuture<'_, ChildInfo> {
        Box::pin(async move {
            if spec.name == self.held {
                self.entered.fetch_add(1, Ordering::SeqCst);
                self.release.acquire().await.unwrap().forget();
            }
            self.inner.start(spec).await
        })
    }

    fn stop(&self, cid: &str) -> HostFuture<'_, ()> {
        self.inner.stop(cid)
    }

    fn open_bind(&self, cid: &str, controller: NodeId) -> HostFuture<'_, Invite> {
        self.inner.open_bind(cid, controller)
    }

    fn close_bind(&self, cid: &str) -> HostFuture<'_, ()> {
        self.inner.close_bind(cid)
    }

    fn add_contact(&self, cid: &str, contact: Contact) -> HostFuture<'_, ()> {
        self.inner.add_contact(cid, contact)
    }

    fn events(&self) -> Option<tokio::sync::mpsc::Receiver<HostEvent>> {
        self.inner.events()
    }

    fn shutdown(&self) -> HostFuture<'_, ()> {
        self.inner.shutdown()
    }
}
