//! A parent's children follow its binding: when the parent is unbound, or
//! bound to another control plane, every child whose bind the parent
//! arranged for the former control plane is unbound from it (and its open
//! bind closed), and the roster says `off` for it from the version that
//! records the binding change on; the new control plane turns monitoring
//! on itself. Played with the in-process host and with the process host
//! (real `capwire node` children), and across a restart of the parent
//! while the children are still being released.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/core.rs"]
mod core_helpers;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use capwire::authz::BindFailure;
use capwire::envelope::{ErrorCode, NodeId};
use capwire::host::{
    ChildInfo, ChildSpec, Host, HostEvent, HostFuture, InProcessHost, ProcessHost,
};
use capwire::manifest::{
    ChildArgs, ClusterContact, ClusterCreate, ClusterList, ClusterSetMonitoring, CreateArgs,
    GetConfig, Member, MonitoringDisable, MonitoringStatus, MonitoringStatusRead, NoArgs, Roster,
    SetMonitoringArgs,
};
use capwire::{CallError, Contact, ControlEvent, Invite, Node, NodeError, Peer};
use core_helpers::{CALL, denied, eventually, listening};
use tokio::sync::Semaphore;

// ---------------------------------------------------------------------
// A host whose `close_bind` can be held, around either real host.

/// Wraps a host; while `hold` is set, `close_bind` waits for a permit of
/// `gate` (counted in `entered`), so a test can stop the parent with
/// children not yet released.
struct Holding {
    inner: Box<dyn Host>,
    hold: Arc<AtomicBool>,
    gate: Arc<Semaphore>,
    entered: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct HoldHandle {
    hold: Arc<AtomicBool>,
    entered: Arc<AtomicUsize>,
}

impl Holding {
    fn new(inner: Box<dyn Host>) -> (Self, HoldHandle) {
        let hold = Arc::new(AtomicBool::new(false));
        let entered = Arc::new(AtomicUsize::new(0));
        let handle = HoldHandle {
            hold: hold.clone(),
            entered: entered.clone(),
        };
        let host = Self {
            inner,
            hold,
            gate: Arc::new(Semaphore::new(0)),
            entered,
        };
        (host, handle)
    }
}

impl Host for Holding {
    fn start(&self, spec: ChildSpec) -> HostFuture<'_, ChildInfo> {
        self.inner.start(spec)
    }

    fn stop(&self, cid: &str) -> HostFuture<'_, ()> {
        self.inner.stop(cid)
    }

    fn open_bind(&self, cid: &str, controller: NodeId) -> HostFuture<'_, Invite> {
        self.inner.open_bind(cid, controller)
    }

    fn close_bind(&self, cid: &str) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move {
            if self.hold.load(Ordering::SeqCst) {
                self.entered.fetch_add(1, Ordering::SeqCst);
                // Never released: the parent stops while this waits.
                let _ = self.gate.acquire().await;
            }
            self.inner.close_bind(&cid).await
        })
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

#[derive(Clone, Copy, Debug)]
enum Kind {
    InProcess,
    Process,
}

fn real_host(kind: Kind, state: &Path) -> Box<dyn Host> {
    let base = state.join("children");
    match kind {
        Kind::InProcess => Box::new(InProcessHost::new().state_dir(base)),
        Kind::Process => Box::new(ProcessHost::new(env!("CARGO_BIN_EXE_capwire"), base)),
    }
}

async fn start_parent(kind: Kind, state: &Path) -> (Node, HoldHandle) {
    let (host, handle) = Holding::new(real_host(kind, state));
    let node = listening("parent")
        .state_dir(state)
        .host(host)
        .start()
        .await
        .unwrap();
    (node, handle)
}

// ---------------------------------------------------------------------
// Calls

async fn list(peer: &Peer) -> Roster {
    peer.request_within(ClusterList, NoArgs {}, CALL)
        .await
        .unwrap()
}

fn member<'a>(roster: &'a Roster, cid: &str) -> &'a Member {
    roster.members.iter().find(|m| m.cid == cid).unwrap()
}

async fn create(peer: &Peer, name: &str) -> Member {
    peer.request_within(
        ClusterCreate,
        CreateArgs {
            name: name.into(),
            bio: None,
        },
        CALL,
    )
    .await
    .unwrap()
}

async fn watch(peer: &Peer, cid: &str, enabled: bool) -> Member {
    peer.request_within(
        ClusterSetMonitoring,
        SetMonitoringArgs {
            cid: cid.into(),
            enabled,
        },
        CALL,
    )
    .await
    .unwrap()
}

async fn contact(peer: &Peer, cid: &str) -> Invite {
    peer.request_within(ClusterContact, ChildArgs { cid: cid.into() }, CALL)
        .await
        .unwrap()
        .invite
        .parse()
        .unwrap()
}

/// Binds `cp` to `node` with a fresh invite reserved for it.
async fn bind(cp: &Node, node: &Node) -> (Peer, Roster) {
    let (peer, reply) = cp
        .connect_invite(&node.invite(Some(cp.id())).unwrap())
        .await
        .unwrap();
    let reply = reply.unwrap();
    let members: Vec<Member> = reply.members.decode().unwrap();
    (
        peer,
        Roster {
            members,
            version: reply.version,
        },
    )
}

/// Connects `cp` to the child `m` (no bind).
async fn reach(cp: &Node, m: &Member) -> Peer {
    let addr = m.addrs[0].parse().unwrap();
    cp.connect(&addr, m.node_id).await.unwrap()
}

/// Whether `cp` is the child's control plane, as the child itself says.
async fn controls(cp: &Node, m: &Member) -> bool {
    let kid = reach(cp, m).await;
    kid.request_within(MonitoringStatusRead, NoArgs {}, CALL)
        .await
        .unwrap()
        .you_are_controller
}

/// Whether `cp` is the child `cid` of `parent` controls now, with the
/// child's addresses as the parent's roster has them now; `None` while the
/// child cannot be reached (it is starting again).
async fn controls_now(cp: &Node, parent: &Node, cid: &str) -> Option<bool> {
    let m = member(&parent.roster(), cid).clone();
    let addr = m.addrs.first()?.parse().ok()?;
    let kid = cp.connect(&addr, m.node_id).await.ok()?;
    let status = kid
        .request_within(MonitoringStatusRead, NoArgs {}, CALL)
        .await
        .ok()?;
    Some(status.you_are_controller)
}

/// `cp`'s `get_config` on the child is refused as `unauthorized`.
async fn refused_config(cp: &Node, m: &Member) {
    let kid = reach(cp, m).await;
    let body = denied(kid.request_within(GetConfig, NoArgs {}, CALL).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
}

/// The parent with two children for `cp`: `kid`, bound to `cp` (monitoring
/// `on`), and `shy`, with a bind open for `cp` that it has not used; and
/// `shy`'s invite.
async fn watched_children(parent: &Node, peer: &Peer, cp: &Node) -> (Member, Member, Invite) {
    let kid = create(peer, "kid").await;
    let shy = create(peer, "shy").await;
    assert_eq!(
        watch(peer, &kid.cid, true).await.monitoring,
        MonitoringStatus::Pending
    );
    let (kid_peer, reply) = cp
        .connect_invite(&contact(peer, &kid.cid).await)
        .await
        .unwrap();
    assert!(reply.is_some());
    kid_peer
        .request_within(GetConfig, NoArgs {}, CALL)
        .await
        .unwrap();
    watch(peer, &shy.cid, true).await;
    let shy_invite = contact(peer, &shy.cid).await;
    assert!(shy_invite.code.is_some());
    let cid = kid.cid.clone();
    eventually("the roster shows kid watched", || {
        let on = member(&parent.roster(), &cid).monitoring == MonitoringStatus::On;
        async move { on }
    })
    .await;
    (kid, shy, shy_invite)
}

/// Every roster push `events` holds from `from` shows no child watched.
fn pushes_show_nothing_watched(
    events: &mut tokio::sync::broadcast::Receiver<ControlEvent>,
    from: NodeId,
) {
    while let Ok(event) = events.try_recv() {
        if let ControlEvent::Roster { from: f, roster } = event
            && f == from
        {
            for m in &roster.members {
                assert_eq!(
                    m.monitoring,
                    MonitoringStatus::Off,
                    "roster v{} shows {} {:?} to the new control plane",
                    roster.version,
                    m.cid,
                    m.monitoring
                );
            }
        }
    }
}

// ---------------------------------------------------------------------
// The scenarios

/// A binds the parent and watches its children; the parent is unbound and
/// bound to B. The children leave A; B sees them `off` and takes over.
async fn rebound(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let (parent, _) = start_parent(kind, &dir.path().join("parent")).await;
    let a = Node::builder("cp-a").start().await.unwrap();
    let (pa, _) = bind(&a, &parent).await;
    let (kid, shy, shy_invite) = watched_children(&parent, &pa, &a).await;

    pa.request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    let b = Node::builder("cp-b").start().await.unwrap();
    let mut b_events = b.control_events();
    let (pb, at_bind) = bind(&b, &parent).await;
    // The bind's answer tells the truth: B watches nothing.
    for m in &at_bind.members {
        assert_eq!(
            m.monitoring,
            MonitoringStatus::Off,
            "{m:?} in the bind answer"
        );
    }

    // A loses the child it controlled, and the bind it had open.
    let a2 = a.clone();
    let k = kid.clone();
    eventually("the child is released from A", move || {
        let (a, k) = (a2.clone(), k.clone());
        async move { !controls(&a, &k).await }
    })
    .await;
    refused_config(&a, &kid).await;
    let err = a.connect_invite(&shy_invite).await.unwrap_err();
    match err {
        NodeError::Bind(CallError::Denied(body)) => {
            let failure: BindFailure = body.detail.unwrap().decode().unwrap();
            assert_eq!(failure, BindFailure::NoPending);
        }
        other => panic!("A's old invite must not bind: {other:?}"),
    }
    let roster = list(&pb).await;
    assert_eq!(member(&roster, &kid.cid).monitoring, MonitoringStatus::Off);
    assert_eq!(member(&roster, &shy.cid).monitoring, MonitoringStatus::Off);
    pushes_show_nothing_watched(&mut b_events, parent.id());

    // B turns monitoring on, the way set_monitoring always does.
    assert_eq!(
        watch(&pb, &kid.cid, true).await.monitoring,
        MonitoringStatus::Pending
    );
    let (kid_b, _) = b
        .connect_invite(&contact(&pb, &kid.cid).await)
        .await
        .unwrap();
    kid_b
        .request_within(GetConfig, NoArgs {}, CALL)
        .await
        .unwrap();
    let cid = kid.cid.clone();
    let p = parent.clone();
    eventually("the roster shows kid watched by B", move || {
        let on = member(&p.roster(), &cid).monitoring == MonitoringStatus::On;
        async move { on }
    })
    .await;
    refused_config(&a, &kid).await;

    parent.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A binds the parent and watches its children; A unbinds the parent
/// (`disable`). The children leave A too.
async fn unbound(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let (parent, _) = start_parent(kind, &dir.path().join("parent")).await;
    let a = Node::builder("cp-a").start().await.unwrap();
    let (pa, _) = bind(&a, &parent).await;
    let (kid, shy, shy_invite) = watched_children(&parent, &pa, &a).await;

    pa.request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    // The roster says `off` from the version that records the unbind on.
    let roster = parent.roster();
    assert_eq!(member(&roster, &kid.cid).monitoring, MonitoringStatus::Off);
    assert_eq!(member(&roster, &shy.cid).monitoring, MonitoringStatus::Off);

    let a2 = a.clone();
    let k = kid.clone();
    eventually("the child is released from A", move || {
        let (a, k) = (a2.clone(), k.clone());
        async move { !controls(&a, &k).await }
    })
    .await;
    refused_config(&a, &kid).await;
    assert!(matches!(
        a.connect_invite(&shy_invite).await,
        Err(NodeError::Bind(_))
    ));
    parent.shutdown().await;
    a.shutdown().await;
}

/// The parent is rebound while the host cannot release the children yet,
/// and stops; started again, it releases them.
async fn restarted_midway(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("parent");
    let (parent, hold) = start_parent(kind, &state).await;
    let a = Node::builder("cp-a").start().await.unwrap();
    let (pa, _) = bind(&a, &parent).await;
    let (kid, _shy, _) = watched_children(&parent, &pa, &a).await;

    hold.hold.store(true, Ordering::SeqCst);
    pa.request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    let b = Node::builder("cp-b").start().await.unwrap();
    let (pb, at_bind) = bind(&b, &parent).await;
    assert_eq!(member(&at_bind, &kid.cid).monitoring, MonitoringStatus::Off);
    let entered = hold.entered.clone();
    eventually("the parent tries to release a child", move || {
        let n = entered.load(Ordering::SeqCst);
        async move { n >= 1 }
    })
    .await;
    // In the middle: the roster already says `off`, the child still
    // answers A.
    assert!(controls(&a, &kid).await, "the release is held");
    assert_eq!(
        member(&list(&pb).await, &kid.cid).monitoring,
        MonitoringStatus::Off
    );
    parent.shutdown().await;
    drop((pb, parent));

    let (parent, _) = start_parent(kind, &state).await;
    assert_eq!(parent.controller(), Some(b.id()));
    let pb = b
        .connect(&parent.local_addrs()[0], Some(parent.id()))
        .await
        .unwrap();
    // The child starts again (perhaps at other addresses) and is released.
    let (a2, p) = (a.clone(), parent.clone());
    let cid = kid.cid.clone();
    eventually(
        "the restarted parent releases the child from A",
        move || {
            let (a, p, cid) = (a2.clone(), p.clone(), cid.clone());
            async move { controls_now(&a, &p, &cid).await == Some(false) }
        },
    )
    .await;
    let kid = member(&list(&pb).await, &kid.cid).clone();
    refused_config(&a, &kid).await;
    assert_eq!(
        member(&list(&pb).await, &kid.cid).monitoring,
        MonitoringStatus::Off
    );
    parent.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_parent_takes_its_children_from_the_former_control_plane() {
    rebound(Kind::InProcess).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_parent_takes_its_process_children_from_the_former_control_plane() {
    rebound(Kind::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbound_parent_takes_its_children_from_the_former_control_plane() {
    unbound(Kind::InProcess).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbound_parent_takes_its_process_children_from_the_former_control_plane() {
    unbound(Kind::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_left_bound_when_the_parent_stopped_are_released_when_it_starts() {
    restarted_midway(Kind::InProcess).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_children_left_bound_when_the_parent_stopped_are_released_when_it_starts() {
    restarted_midway(Kind::Process).await;
}
