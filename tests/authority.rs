//! Authority holds for running work, not only at admission (SECURITY.md,
//! promise 8): a stream of a controller verb, a control plane's
//! subscription to a task and a task of a controller verb stop when the
//! binding or the grant that admitted them ends (an unbind, a revocation,
//! an expiry), and nothing more reaches the party that lost it. Real
//! nodes, real sessions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/core.rs"]
mod core_helpers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use capwire::envelope::{ErrorBody, ErrorCode};
use capwire::grants::{Right, revocation_ids};
use capwire::manifest::{
    MonitoringDisable, NoArgs, SubscribeArgs, TaskEvent, TaskState, TasksSubscribe, verb,
};
use capwire::{
    CallError, Capability, HandlerError, ItemStream, Items, Node, NodeBuilder, Peer, State, Task,
};
use core_helpers::{Bound, bind_new, eventually, stranger};

verb! {
    /// Counts up, one item every few milliseconds, for as long as it may.
    pub struct Ticks: stream "app.feed" / "ticks", Controller, () => u64;
}
verb! {
    /// A controller's task that runs until it is stopped.
    pub struct Job: task "app.feed" / "job", Controller, () => ();
}
verb! {
    /// As `Job`, and run again after a restart.
    pub struct Lasting: task "app.feed" / "lasting", Controller, () => ();
}
verb! {
    /// Anyone's task that runs until it is stopped.
    pub struct Idle: task "app.feed" / "idle", Bootstrap, () => ();
}

/// What the handlers did.
#[derive(Debug, Default)]
struct Fed {
    /// Items handed to the stream and accepted.
    sent: AtomicU64,
    /// Task handlers running now.
    running: AtomicUsize,
}

/// Counts a task handler out however it ends.
struct Running(Arc<Fed>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn ticks(
    _: (),
    mut items: Items<u64>,
    State(f): State<Arc<Fed>>,
) -> Result<(), HandlerError> {
    let mut n = 0;
    loop {
        n += 1;
        items.send(n).await?;
        f.sent.store(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn forever(_: (), _task: Task, State(f): State<Arc<Fed>>) -> Result<(), HandlerError> {
    f.running.fetch_add(1, Ordering::SeqCst);
    let _running = Running(f);
    std::future::pending::<()>().await;
    Ok(())
}

fn node(f: &Arc<Fed>) -> NodeBuilder {
    Node::builder("feed")
        .listen("127.0.0.1:0".parse().unwrap())
        .state(f.clone())
        .capability(
            Capability::new("app.feed", "1.0.0")
                .unwrap()
                .stream(Ticks, ticks)
                .task(Job, forever)
                .resumable_task(Lasting, forever)
                .task(Idle, forever),
        )
}

async fn bound() -> (Bound, Arc<Fed>) {
    let f = Arc::new(Fed::default());
    (bind_new(node(&f)).await, f)
}

/// Takes a few items, so the stream is known to run.
async fn running<T: serde::de::DeserializeOwned + std::fmt::Debug>(s: &mut ItemStream<T>) {
    for _ in 0..3 {
        s.next().await.unwrap().unwrap();
    }
}

/// Drains `s` after its authority ended: the items it had already
/// received before that (at most `buffered`), then its end, which must
/// come within a few seconds and be `unauthorized`.
async fn ends_unauthorized<T: serde::de::DeserializeOwned + std::fmt::Debug>(
    s: &mut ItemStream<T>,
    buffered: usize,
) -> ErrorBody {
    let mut after = 0;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.next().await {
                Some(Ok(_)) => after += 1,
                Some(Err(e)) => return e,
                None => panic!("the stream ended well"),
            }
        }
    })
    .await
    .expect("the stream ends soon after its authority");
    assert!(
        after <= buffered,
        "{after} items after the authority ended, {buffered} were already received"
    );
    match end {
        CallError::Remote(b) | CallError::Denied(b) => {
            assert_eq!(b.code, ErrorCode::Unauthorized, "{b:?}");
            b
        }
        other => panic!("expected unauthorized, got {other:?}"),
    }
}

/// The handler stopped: no item is accepted any more.
async fn stopped(f: &Fed) {
    let last = f.sent.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        f.sent.load(Ordering::SeqCst),
        last,
        "the handler still sends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_stream_ends_unauthorized_when_its_control_plane_is_unbound() {
    let (b, f) = bound().await;
    let mut s = b.peer.stream(Ticks, ()).await.unwrap();
    running(&mut s).await;
    b.peer.request(MonitoringDisable, NoArgs {}).await.unwrap();
    let buffered = s.buffered();
    let body = ends_unauthorized(&mut s, buffered).await;
    assert!(body.message.contains("binding"), "{}", body.message);
    stopped(&f).await;
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_stream_ends_when_another_control_plane_binds() {
    let (b, f) = bound().await;
    let mut s = b.peer.stream(Ticks, ()).await.unwrap();
    running(&mut s).await;
    // The node is handed to another control plane.
    let next = Node::builder("next-control-plane").start().await.unwrap();
    let invite = b.node.invite(Some(next.id())).unwrap();
    next.connect_invite(&invite).await.unwrap();
    let buffered = s.buffered();
    ends_unauthorized(&mut s, buffered).await;
    stopped(&f).await;
    b.node.shutdown().await;
}

/// A worker holding a grant for `Ticks` (and `Job`), presented.
async fn holder(b: &Bound, valid_for: Duration) -> (Node, Peer, String) {
    let worker = Node::builder("worker").start().await.unwrap();
    let from_worker = worker
        .connect(&b.node.local_addrs()[0], Some(b.node.id()))
        .await
        .unwrap();
    let token =
        b.cp.grant(
            &b.peer,
            worker.id(),
            worker.grant_key(),
            vec![
                Right::verb("app.feed", "ticks"),
                Right::verb("app.feed", "job"),
            ],
            valid_for,
        )
        .await
        .unwrap();
    from_worker.present(&token).await.unwrap();
    (worker, from_worker, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_a_grant_opened_ends_when_the_grant_is_revoked() {
    let (b, f) = bound().await;
    let (_worker, from_worker, token) = holder(&b, Duration::from_secs(600)).await;
    let mut s = from_worker.stream(Ticks, ()).await.unwrap();
    running(&mut s).await;
    b.peer
        .revoke_grant(&revocation_ids(&token).unwrap()[0])
        .await
        .unwrap();
    let buffered = s.buffered();
    let body = ends_unauthorized(&mut s, buffered).await;
    assert!(body.message.contains("revoked"), "{}", body.message);
    stopped(&f).await;
    // The control plane's own stream is not touched.
    let mut own = b.peer.stream(Ticks, ()).await.unwrap();
    running(&mut own).await;
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_a_grant_opened_ends_when_the_grant_expires() {
    let (b, f) = bound().await;
    let (_worker, from_worker, _token) = holder(&b, Duration::from_secs(3)).await;
    let mut s = from_worker.stream(Ticks, ()).await.unwrap();
    running(&mut s).await;
    // Valid through the second of its expiry: the stream ends within a
    // second or two after, not at the answer's next minute.
    let mut taken = 3;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.next().await {
                Some(Ok(_)) => taken += 1,
                Some(Err(e)) => return e,
                None => panic!("the stream ended well"),
            }
        }
    })
    .await
    .expect("the stream ends soon after the grant expires");
    match end {
        CallError::Remote(body) | CallError::Denied(body) => {
            assert_eq!(body.code, ErrorCode::Unauthorized);
            assert!(body.message.contains("expired"), "{}", body.message);
        }
        other => panic!("expected unauthorized, got {other:?}"),
    }
    // At most about five seconds of items at one item every 5 ms or more.
    assert!(taken < 1_200, "{taken} items");
    stopped(&f).await;
    b.node.shutdown().await;
}

/// The node's wall clock, moved by the test: the system's plus an offset.
#[derive(Debug, Default)]
struct Stepped(std::sync::atomic::AtomicU64);

impl capwire::clock::WallClock for Stepped {
    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now() + Duration::from_secs(self.0.load(Ordering::SeqCst))
    }
}

/// A clock stepped past the grant's expiry ends the stream it opened
/// within a second or two, not at the date the grant named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_a_grant_opened_ends_when_the_clock_is_stepped_past_its_expiry() {
    let f = Arc::new(Fed::default());
    let clock = Arc::new(Stepped::default());
    let b = bind_new(node(&f).wall_clock(clock.clone())).await;
    let (_worker, from_worker, _token) = holder(&b, Duration::from_secs(600)).await;
    let mut s = from_worker.stream(Ticks, ()).await.unwrap();
    running(&mut s).await;
    clock.0.store(3600, Ordering::SeqCst);
    // Asked again within a second: what came meanwhile (an item every
    // 5 ms or more) besides what was buffered, then the end, well before
    // the ten minutes the grant named.
    let buffered = s.buffered();
    let body = ends_unauthorized(&mut s, buffered + 400).await;
    assert!(body.message.contains("expired"), "{}", body.message);
    stopped(&f).await;
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_planes_subscription_ends_at_the_unbind_even_on_an_idle_task() {
    let (b, _f) = bound().await;
    let (_s, from_stranger) = stranger(&b.node).await;
    let task = from_stranger.submit(Idle, ()).await.unwrap();
    // The control plane sees every task, while it is bound.
    let mut events: ItemStream<TaskEvent> = b
        .peer
        .stream(
            TasksSubscribe,
            SubscribeArgs {
                task: task.id().to_owned(),
                from: None,
            },
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(events.next().await.unwrap().unwrap().state);
    }
    assert_eq!(seen, [TaskState::Submitted, TaskState::Working]);
    b.peer.request(MonitoringDisable, NoArgs {}).await.unwrap();
    // The task is idle: nothing else would wake the subscription.
    let end = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the subscription ends at once, not at the handler's time bound");
    match end {
        Some(Err(CallError::Remote(body))) => assert_eq!(body.code, ErrorCode::NotFound),
        other => panic!("expected not_found, got {other:?}"),
    }
    // Its submitter still sees it, and what happens next.
    task.cancel().await.unwrap();
    assert_eq!(task.get().await.unwrap().state, TaskState::Canceled);
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_task_fails_unauthorized_when_its_control_plane_is_unbound() {
    let (b, f) = bound().await;
    let job = b.peer.submit(Job, ()).await.unwrap();
    // A task of a bootstrap verb the control plane submitted is its own.
    let idle = b.peer.submit(Idle, ()).await.unwrap();
    eventually("both handlers run", || async {
        f.running.load(Ordering::SeqCst) == 2
    })
    .await;
    b.peer.request(MonitoringDisable, NoArgs {}).await.unwrap();
    eventually("the controller task's handler stopped", || async {
        f.running.load(Ordering::SeqCst) == 1
    })
    .await;
    // The handler stops first; the task's failed state is written next.
    eventually("its task failed", || async {
        job.get().await.unwrap().state == TaskState::Failed
    })
    .await;
    let info = job.get().await.unwrap();
    assert_eq!(info.state, TaskState::Failed);
    let error = info.error.unwrap();
    assert_eq!(error.code, ErrorCode::Unauthorized);
    assert!(error.message.contains("authority"), "{}", error.message);
    assert_eq!(idle.get().await.unwrap().state, TaskState::Working);
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_a_grant_submitted_fails_when_the_grant_is_revoked() {
    let (b, f) = bound().await;
    let (_worker, from_worker, token) = holder(&b, Duration::from_secs(600)).await;
    let job = from_worker.submit(Job, ()).await.unwrap();
    eventually("its handler runs", || async {
        f.running.load(Ordering::SeqCst) == 1
    })
    .await;
    b.peer
        .revoke_grant(&revocation_ids(&token).unwrap()[0])
        .await
        .unwrap();
    eventually("its handler stopped", || async {
        f.running.load(Ordering::SeqCst) == 0
    })
    .await;
    // The handler stops first; the task's failed state is written next.
    eventually("its task failed", || async {
        job.get().await.unwrap().state == TaskState::Failed
    })
    .await;
    let info = job.get().await.unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.error.unwrap().code, ErrorCode::Unauthorized);
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_task_resumes_after_a_restart_under_the_same_binding_and_stops_at_the_unbind()
{
    let dir = tempfile::tempdir().unwrap();
    let f = Arc::new(Fed::default());
    let b = bind_new(node(&f).state_dir(dir.path().join("node"))).await;
    let job = b.peer.submit(Lasting, ()).await.unwrap();
    eventually("its handler runs", || async {
        f.running.load(Ordering::SeqCst) == 1
    })
    .await;
    let id = job.id().to_owned();
    let Bound {
        node: first, cp, ..
    } = b;
    first.shutdown().await;
    drop(first);
    assert_eq!(f.running.load(Ordering::SeqCst), 0);

    // Started again, still bound to the same control plane: resumed, and
    // still held to the binding it was submitted under.
    let again = node(&f)
        .state_dir(dir.path().join("node"))
        .start()
        .await
        .unwrap();
    eventually("its handler runs again", || async {
        f.running.load(Ordering::SeqCst) == 1
    })
    .await;
    let peer = cp
        .connect(&again.local_addrs()[0], Some(again.id()))
        .await
        .unwrap();
    let job = peer.task::<()>(id);
    assert_eq!(job.get().await.unwrap().state, TaskState::Working);
    peer.request(MonitoringDisable, NoArgs {}).await.unwrap();
    eventually("its handler stopped", || async {
        f.running.load(Ordering::SeqCst) == 0
    })
    .await;
    // The handler stops first; the task's failed state is written next.
    eventually("its task failed", || async {
        job.get().await.unwrap().state == TaskState::Failed
    })
    .await;
    let info = job.get().await.unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.error.unwrap().code, ErrorCode::Unauthorized);
    again.shutdown().await;
}
