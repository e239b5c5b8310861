//! Task verbs end to end over real encrypted sessions and a real store:
//! a task that asks, reports progress and ends with its result; the same
//! submit finding the same task; args refused before a task exists;
//! cancellation; who may see a task; the control plane's pushes; pages;
//! a restart that resumes or fails what was running; quotas; a handler's
//! panic; folded events; retention; questions without answers; quiet
//! tasks outliving the stream idle bound; and version-1 peers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/core.rs"]
mod core_helpers;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capwire::envelope::{ErrorCode, ReqId};
use capwire::manifest::{
    ListTasksArgs, MonitoringDisable, NoArgs, TaskEvent, TaskEventKind, TaskState, TasksList, verb,
};
use capwire::{
    CallError, Capability, ControlEvent, HandlerError, Keypair, Limits, Node, NodeBuilder, State,
    Task, TaskError,
};
use common::{RawPeer, raw};
use core_helpers::{bind_new, events_until, eventually, remote, stranger};
use tokio::sync::Notify;

verb! {
    /// Asks whether to count, then reports 1..=n and answers n.
    pub struct Count: task "app.work" / "count", Bootstrap, u32 => u32;
}
verb! {
    /// Waits until cancelled.
    pub struct Hold: task "app.work" / "hold", Bootstrap, () => ();
}
verb! {
    /// Does n steps, one progress each; resumable: goes on after the last
    /// step it reported. Waits at step `pause` for the probe's go.
    pub struct Steps: task "app.work" / "steps", Bootstrap, StepArgs => u32;
}
verb! {
    /// Panics.
    pub struct Panic: task "app.work" / "panic", Bootstrap, () => ();
}
verb! {
    /// Answers its text at once.
    pub struct Echo: task "app.work" / "echo", Bootstrap, String => String;
}
verb! {
    /// Asks with a short time to answer.
    pub struct Impatient: task "app.work" / "impatient", Bootstrap, u64 => String;
}
verb! {
    /// Reports n progress events, as fast as it can.
    pub struct Chatty: task "app.work" / "chatty", Bootstrap, u32 => u32;
}
verb! {
    /// Quiet for this many ms, then answers.
    pub struct Quiet: task "app.work" / "quiet", Bootstrap, u64 => u64;
}

verb! {
    /// Gives up with `cancelled` and its own words.
    pub struct GiveUp: task "app.work" / "give_up", Bootstrap, String => ();
}
verb! {
    /// Counts to at most 10: its own check refuses more before a task
    /// is written.
    pub struct Bounded: task "app.work" / "bounded", Bootstrap, u32 => u32;
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
/// Args of `steps`.
pub struct StepArgs {
    n: u32,
    pause: u32,
}

/// What the handlers did.
#[derive(Debug, Default)]
struct Probe {
    started: AtomicUsize,
    ended: AtomicUsize,
    resumed: AtomicUsize,
    go: Notify,
}

/// Counts a handler's end however it ends (returned, or its future dropped).
struct Ends(Arc<Probe>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

async fn count(to: u32, task: Task, State(p): State<Arc<Probe>>) -> Result<u32, HandlerError> {
    p.started.fetch_add(1, Ordering::SeqCst);
    let go: bool = task
        .ask(&format!("count to {to}?"), Duration::from_secs(30))
        .await?;
    if !go {
        return Err(HandlerError::app("declined", "not counting").unwrap());
    }
    for n in 1..=to {
        task.progress(&n).await?;
    }
    Ok(to)
}

async fn hold(_: (), task: Task, State(p): State<Arc<Probe>>) -> Result<(), HandlerError> {
    p.started.fetch_add(1, Ordering::SeqCst);
    let _ends = Ends(p.clone());
    task.cancelled().await;
    std::future::pending::<()>().await;
    Ok(())
}

async fn steps(
    args: StepArgs,
    task: Task,
    State(p): State<Arc<Probe>>,
) -> Result<u32, HandlerError> {
    p.started.fetch_add(1, Ordering::SeqCst);
    let mut done = 0u32;
    if task.resumed() {
        p.resumed.fetch_add(1, Ordering::SeqCst);
        for e in task.events(1).await? {
            if e.kind == TaskEventKind::Progress {
                done = e.body.decode::<u32>().unwrap();
            }
        }
    }
    while done < args.n {
        if done == args.pause && !task.resumed() {
            p.go.notified().await;
        }
        done += 1;
        task.progress(&done).await?;
    }
    Ok(done)
}

async fn panic(_: (), _task: Task) -> Result<(), HandlerError> {
    panic!("a task handler panicked on purpose");
}

async fn echo(text: String, _task: Task) -> Result<String, HandlerError> {
    Ok(text)
}

async fn impatient(ms: u64, task: Task) -> Result<String, HandlerError> {
    match task
        .ask::<_, String>("anyone?", Duration::from_millis(ms))
        .await
    {
        Ok(a) => Ok(a),
        Err(TaskError::NoAnswer) => Ok("nobody answered".into()),
        Err(e) => Err(e.into()),
    }
}

async fn chatty(n: u32, task: Task) -> Result<u32, HandlerError> {
    for i in 1..=n {
        task.progress(&i).await?;
    }
    Ok(n)
}

async fn quiet(ms: u64, _task: Task) -> Result<u64, HandlerError> {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(ms)
}

async fn give_up(why: String, _task: Task) -> Result<(), HandlerError> {
    Err(HandlerError::new(ErrorCode::Cancelled, why))
}

fn at_most_ten(n: &u32) -> Result<(), HandlerError> {
    if *n > 10 {
        return Err(HandlerError::new(ErrorCode::BadArgs, "at most 10"));
    }
    Ok(())
}

async fn bounded(n: u32, _task: Task, State(p): State<Arc<Probe>>) -> Result<u32, HandlerError> {
    p.started.fetch_add(1, Ordering::SeqCst);
    Ok(n)
}

fn cap() -> Capability {
    Capability::new("app.work", "1.0.0")
        .unwrap()
        .task(GiveUp, give_up)
        .task_checked(Bounded, at_most_ten, bounded)
        .task(Count, count)
        .task(Hold, hold)
        .resumable_task(Steps, steps)
        .task(Panic, panic)
        .task(Echo, echo)
        .task(Impatient, impatient)
        .task(Chatty, chatty)
        .task(Quiet, quiet)
}

fn worker(limits: Limits) -> (NodeBuilder, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let b = Node::builder("worker")
        .listen("127.0.0.1:0".parse().unwrap())
        .limits(limits)
        .state(probe.clone())
        .capability(cap());
    (b, probe)
}

async fn started(limits: Limits) -> (Node, Arc<Probe>) {
    let (b, p) = worker(limits);
    (b.start().await.unwrap(), p)
}

async fn all_events(
    task: &capwire::TaskHandle<impl serde::de::DeserializeOwned>,
) -> Vec<TaskEvent> {
    let mut events = task.events(1).await.unwrap();
    let mut out = Vec::new();
    while let Some(e) = events.next().await {
        out.push(e.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asks_reports_progress_and_ends_with_its_result() {
    let (w, probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;

    let task = peer.submit(Count, 3).await.unwrap();
    assert_eq!(task.id().len(), 32);
    let mut events = task.events(1).await.unwrap();
    let mut seen = Vec::new();
    while let Some(e) = events.next().await {
        let e = e.unwrap();
        if e.state == TaskState::InputRequired {
            assert_eq!(e.kind, TaskEventKind::Question);
            assert_eq!(e.body.decode::<String>().unwrap(), "count to 3?");
            let info = task.get().await.unwrap();
            assert_eq!(info.question_seq, Some(e.seq));
            assert_eq!(info.question.decode::<String>().unwrap(), "count to 3?");
            task.respond(&true).await.unwrap();
        }
        seen.push(e);
    }
    let kinds: Vec<_> = seen.iter().map(|e| (e.seq, e.kind, e.state)).collect();
    use TaskEventKind as K;
    use TaskState as S;
    assert_eq!(
        kinds,
        [
            (1, K::State, S::Submitted),
            (2, K::State, S::Working),
            (3, K::Question, S::InputRequired),
            (4, K::Answer, S::Working),
            (5, K::Progress, S::Working),
            (6, K::Progress, S::Working),
            (7, K::Progress, S::Working),
            (8, K::Result, S::Completed),
        ]
    );
    assert_eq!(task.result().await.unwrap(), 3);
    let info = task.get().await.unwrap();
    assert_eq!((info.state, info.seq, info.first_seq), (S::Completed, 8, 1));
    assert_eq!(info.progress.decode::<u32>().unwrap(), 3);
    assert_eq!(info.result.decode::<u32>().unwrap(), 3);
    assert!(info.question.is_null() && info.question_seq.is_none());
    assert_eq!(
        (info.cap.as_str(), info.verb.as_str()),
        ("app.work", "count")
    );
    assert_eq!(probe.started.load(Ordering::SeqCst), 1);
    // A subscription from the middle starts there.
    let tail = task.events(7).await.unwrap().into_stream();
    let tail: Vec<_> = futures_util::StreamExt::collect::<Vec<_>>(tail).await;
    assert_eq!(
        tail.into_iter().map(|e| e.unwrap().seq).collect::<Vec<_>>(),
        [7, 8]
    );
    // The answer "no" fails the next one with the handler's own code.
    let task = peer.submit(Count, 1).await.unwrap();
    let mut events = task.events(1).await.unwrap();
    while let Some(e) = events.next().await {
        if e.unwrap().state == TaskState::InputRequired {
            task.respond(&false).await.unwrap();
        }
    }
    let err = remote(task.result().await);
    assert_eq!(err.code.as_str(), "declined");
    assert_eq!(task.get().await.unwrap().state, TaskState::Failed);
    let stats = w.stats();
    let completed = stats
        .tasks
        .iter()
        .find(|(s, _)| *s == S::Completed)
        .unwrap();
    assert_eq!(completed.1, 1);
    assert!(stats.task_events >= 12);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_submit_finds_the_same_task_and_runs_it_once() {
    let (w, probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let id = ReqId::try_from("order-17").unwrap();
    let first = peer
        .submit_with_id(Hold, (), &id, Duration::from_secs(5))
        .await
        .unwrap();
    for _ in 0..3 {
        let again = peer
            .submit_with_id(Hold, (), &id, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(again.id(), first.id());
    }
    let other = peer.submit(Hold, ()).await.unwrap();
    assert_ne!(other.id(), first.id());
    eventually("both handlers started", || async {
        probe.started.load(Ordering::SeqCst) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(probe.started.load(Ordering::SeqCst), 2, "run once per task");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn args_that_do_not_decode_are_refused_before_a_task_exists() {
    let (w, probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let err = remote(
        peer.call_raw("app.work", "count", &raw("three"), Duration::from_secs(5))
            .await,
    );
    assert_eq!(err.code, ErrorCode::BadArgs);
    let list = peer
        .request(TasksList, ListTasksArgs::default())
        .await
        .unwrap();
    assert!(list.tasks.is_empty());
    assert_eq!(probe.started.load(Ordering::SeqCst), 0);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_stops_its_handler_and_ends_cancelled() {
    let (w, probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let task = peer.submit(Hold, ()).await.unwrap();
    eventually("the handler runs", || async {
        probe.started.load(Ordering::SeqCst) == 1
    })
    .await;
    let waiter = tokio::spawn({
        let task = task.clone();
        async move { task.result().await }
    });
    let info = task.cancel().await.unwrap();
    assert_eq!(info.state, TaskState::Canceled);
    assert_eq!(info.error.unwrap().code, ErrorCode::Cancelled);
    eventually("the handler's future is dropped", || async {
        probe.ended.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(matches!(waiter.await.unwrap(), Err(CallError::Cancelled)));
    // Cancelling again changes nothing.
    let again = task.cancel().await.unwrap();
    assert_eq!((again.state, again.seq), (TaskState::Canceled, info.seq));
    let events = all_events(&task).await;
    assert_eq!(events.last().unwrap().kind, TaskEventKind::Error);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_submitter_and_the_bound_control_plane_see_a_task() {
    let (b, _probe) = worker(Limits::default());
    let bound = bind_new(b).await;
    let (_c, submitter) = stranger(&bound.node).await;
    let (_o, other) = stranger(&bound.node).await;
    let task = submitter.submit(Hold, ()).await.unwrap();

    // Someone else: told the same as for a task that does not exist.
    let theirs = other.task::<()>(task.id());
    let none = other.task::<()>("00".repeat(16));
    for handle in [&theirs, &none] {
        let e = remote(handle.get().await);
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::NotFound, "no such task")
        );
        assert_eq!(remote(handle.cancel().await).code, ErrorCode::NotFound);
        assert_eq!(remote(handle.respond(&1).await).code, ErrorCode::NotFound);
        let mut events = handle.events(1).await.unwrap();
        match events.next().await {
            Some(Err(CallError::Remote(e))) => assert_eq!(e.code, ErrorCode::NotFound),
            x => panic!("a stranger's subscription: {x:?}"),
        }
    }
    let list = other
        .request(TasksList, ListTasksArgs::default())
        .await
        .unwrap();
    assert!(list.tasks.is_empty());
    // A malformed id is bad args.
    let bad = remote(other.task::<()>("XYZ").get().await);
    assert_eq!(bad.code, ErrorCode::BadArgs);

    // The control plane sees every task, and may cancel it.
    let cp_view = bound.peer.task::<()>(task.id());
    assert_eq!(cp_view.get().await.unwrap().state, TaskState::Working);
    let list = bound
        .peer
        .request(TasksList, ListTasksArgs::default())
        .await
        .unwrap();
    assert_eq!(list.tasks.len(), 1);

    // Unbound, it is a stranger again.
    bound
        .peer
        .request(MonitoringDisable, NoArgs {})
        .await
        .unwrap();
    assert_eq!(bound.node.controller(), None);
    assert_eq!(remote(cp_view.get().await).code, ErrorCode::NotFound);
    assert_eq!(remote(cp_view.cancel().await).code, ErrorCode::NotFound);
    // The submitter still sees it.
    assert_eq!(task.get().await.unwrap().state, TaskState::Working);
    bound.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_is_told_of_each_change_of_state() {
    let (b, _probe) = worker(Limits::default());
    let bound = bind_new(b).await;
    let mut rx = bound.cp.control_events();
    let (c, submitter) = stranger(&bound.node).await;
    let task = submitter.submit(Echo, "hi".into()).await.unwrap();
    assert_eq!(task.result().await.unwrap(), "hi");
    let seen = events_until(
        &mut rx,
        "the task's completion",
        |e| matches!(e, ControlEvent::Task { change, .. } if change.state == TaskState::Completed),
    )
    .await;
    let states: Vec<_> = seen
        .into_iter()
        .filter_map(|e| match e {
            ControlEvent::Task { from, change } => {
                assert_eq!(from, bound.node.id());
                assert_eq!(change.task, task.id());
                assert_eq!(change.submitter, c.id());
                Some(change.state)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        states,
        [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::Completed
        ]
    );
    bound.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_newest_first_in_pages_and_filter() {
    let (w, _probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let t = peer.submit(Echo, format!("t{i}")).await.unwrap();
        t.result().await.unwrap();
        ids.push(t.id().to_owned());
    }
    let held = peer.submit(Hold, ()).await.unwrap();
    ids.push(held.id().to_owned());
    ids.reverse();
    let mut got = Vec::new();
    let mut before = None;
    loop {
        let page = peer
            .request(
                TasksList,
                ListTasksArgs {
                    before: before.clone(),
                    limit: Some(3),
                    ..ListTasksArgs::default()
                },
            )
            .await
            .unwrap();
        assert!(page.tasks.len() <= 3);
        got.extend(page.tasks.iter().map(|t| t.task.clone()));
        match page.next {
            Some(n) => before = Some(n),
            None => break,
        }
    }
    assert_eq!(got, ids);
    let working = peer
        .request(
            TasksList,
            ListTasksArgs {
                state: Some(TaskState::Working),
                ..ListTasksArgs::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(working.tasks.len(), 1);
    assert_eq!(working.tasks[0].task, held.id());
    let echoes = peer
        .request(
            TasksList,
            ListTasksArgs {
                verb: Some("echo".into()),
                ..ListTasksArgs::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(echoes.tasks.len(), 7);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_what_its_verb_can_resume_and_fails_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let key = Keypair::generate().unwrap();
    let (b, probe) = worker(Limits::default());
    let w = b
        .state_dir(dir.path().join("node"))
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    let client = Node::builder("client").start().await.unwrap();
    let peer = client
        .connect(&w.local_addrs()[0], Some(w.id()))
        .await
        .unwrap();
    let steps = peer
        .submit(Steps, StepArgs { n: 5, pause: 2 })
        .await
        .unwrap();
    let held = peer.submit(Hold, ()).await.unwrap();
    let done = peer.submit(Echo, "kept".into()).await.unwrap();
    assert_eq!(done.result().await.unwrap(), "kept");
    eventually("two steps are written", || async {
        steps
            .get()
            .await
            .is_ok_and(|i| i.progress.decode::<u32>().ok() == Some(2))
    })
    .await;
    w.shutdown().await;
    drop((w, probe));

    let (b, probe) = worker(Limits::default());
    let w = b
        .state_dir(dir.path().join("node"))
        .keypair(key)
        .start()
        .await
        .unwrap();
    let peer = client
        .connect(&w.local_addrs()[0], Some(w.id()))
        .await
        .unwrap();
    let steps = peer.task::<u32>(steps.id());
    let held = peer.task::<()>(held.id());
    let done = peer.task::<String>(done.id());
    assert_eq!(steps.result().await.unwrap(), 5);
    assert_eq!(probe.resumed.load(Ordering::SeqCst), 1);
    let events = all_events(&steps).await;
    let progress: Vec<u32> = events
        .iter()
        .filter(|e| e.kind == TaskEventKind::Progress)
        .map(|e| e.body.decode().unwrap())
        .collect();
    assert_eq!(progress, [1, 2, 3, 4, 5], "nothing done twice");
    assert!(events.iter().any(|e| e.kind == TaskEventKind::State
        && e.body.decode::<String>().ok().as_deref() == Some("resumed")));
    let e = remote(held.result().await);
    assert_eq!(e.code.as_str(), "interrupted");
    assert_eq!(held.get().await.unwrap().state, TaskState::Failed);
    assert_eq!(done.result().await.unwrap(), "kept", "ended tasks are kept");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_refuse_new_tasks_with_overloaded() {
    let limits = Limits {
        max_tasks: 3,
        max_tasks_per_sender: 2,
        ..Limits::default()
    };
    let (w, _probe) = started(limits).await;
    let (_a, a) = stranger(&w).await;
    let (_b, b) = stranger(&w).await;
    a.submit(Hold, ()).await.unwrap();
    a.submit(Hold, ()).await.unwrap();
    assert!(matches!(
        a.submit(Hold, ()).await,
        Err(CallError::Overloaded)
    ));
    b.submit(Hold, ()).await.unwrap();
    assert!(matches!(
        b.submit(Hold, ()).await,
        Err(CallError::Overloaded)
    ));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_fails_its_task_and_the_node_goes_on() {
    let (w, _probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let task = peer.submit(Panic, ()).await.unwrap();
    let e = remote(task.result().await);
    assert_eq!(e.code, ErrorCode::Internal);
    assert_eq!(task.get().await.unwrap().state, TaskState::Failed);
    let next = peer.submit(Echo, "still here".into()).await.unwrap();
    assert_eq!(next.result().await.unwrap(), "still here");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_events_are_folded_past_the_bound_and_the_end_is_kept() {
    let limits = Limits {
        max_task_events: 4,
        ..Limits::default()
    };
    let (w, _probe) = started(limits).await;
    let (_c, peer) = stranger(&w).await;
    let task = peer.submit(Chatty, 20).await.unwrap();
    assert_eq!(task.result().await.unwrap(), 20);
    let info = task.get().await.unwrap();
    // submitted, working, 20 progress, result: 23 events, 4 kept.
    assert_eq!((info.seq, info.first_seq), (23, 20));
    assert_eq!(info.progress.decode::<u32>().unwrap(), 20);
    let events = all_events(&task).await;
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [20, 21, 22, 23]
    );
    assert_eq!(events[3].kind, TaskEventKind::Result);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_tasks_go_when_their_retention_passes() {
    let limits = Limits {
        task_retention: Duration::from_millis(200),
        ..Limits::default()
    };
    let (w, _probe) = started(limits).await;
    let (_c, peer) = stranger(&w).await;
    let task = peer.submit(Echo, "brief".into()).await.unwrap();
    let running = peer.submit(Hold, ()).await.unwrap();
    assert_eq!(task.result().await.unwrap(), "brief");
    eventually("the ended task is gone", || async {
        matches!(task.get().await, Err(CallError::Remote(e)) if e.code == ErrorCode::NotFound)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        running.get().await.unwrap().state,
        TaskState::Working,
        "a running task is kept"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_without_an_answer_in_time_goes_back_to_working() {
    let (w, _probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let task = peer.submit(Impatient, 150).await.unwrap();
    assert_eq!(task.result().await.unwrap(), "nobody answered");
    let e = remote(task.respond(&"late").await);
    assert_eq!(e.code, ErrorCode::Conflict);
    let states: Vec<_> = all_events(&task).await.iter().map(|e| e.state).collect();
    assert_eq!(
        states,
        [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::InputRequired,
            TaskState::Working,
            TaskState::Completed
        ]
    );

    // An answer to another question than the one it waits on: conflict.
    let task = peer.submit(Impatient, 30_000).await.unwrap();
    let mut events = task.events(1).await.unwrap();
    let q = loop {
        let e = events.next().await.unwrap().unwrap();
        if e.state == TaskState::InputRequired {
            break e.seq;
        }
    };
    let e = remote(task.respond_to(Some(q + 7), &"wrong").await);
    assert_eq!(e.code, ErrorCode::Conflict);
    let info = task.respond_to(Some(q), &"right").await.unwrap();
    // The handler may have finished with the answer already.
    assert!(
        matches!(info.state, TaskState::Working | TaskState::Completed),
        "{info:?}"
    );
    assert!(info.seq > q, "the answer is written");
    assert_eq!(task.result().await.unwrap(), "right");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_task_outlives_the_stream_idle_bound() {
    let (w, _probe) = started(Limits::default()).await;
    let client = Node::builder("client")
        .limits(Limits {
            stream_idle_timeout: Duration::from_millis(200),
            ..Limits::default()
        })
        .start()
        .await
        .unwrap();
    let peer = client
        .connect(&w.local_addrs()[0], Some(w.id()))
        .await
        .unwrap();
    let task = peer.submit(Quiet, 1_000).await.unwrap();
    let events = all_events(&task).await;
    assert_eq!(events.last().unwrap().state, TaskState::Completed);
    let seqs: Vec<_> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        [1, 2, 3],
        "each event once, across the reopened subscriptions"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_peer_sees_no_task_and_cannot_reach_core_tasks() {
    let (w, _probe) = started(Limits::default()).await;
    let mut v1 = RawPeer::connect(&w).await;
    let view = &v1.node_manifest;
    assert!(view.capability("core.tasks").is_none());
    assert!(
        view.capability("app.work").is_none(),
        "it has task verbs only"
    );
    assert!(view.is_partial_view());
    v1.control("core.tasks", "list", "l1", &raw(&ListTasksArgs::default()))
        .await;
    assert_eq!(
        v1.response("l1").await.outcome.unwrap_err().code,
        ErrorCode::UnknownVerb
    );
    v1.control("app.work", "echo", "e1", &raw("x")).await;
    assert_eq!(
        v1.response("e1").await.outcome.unwrap_err().code,
        ErrorCode::UnknownVerb
    );
    let to_v1 = w.peer(v1.id);
    assert!(matches!(
        to_v1.submit(Echo, "x".into()).await,
        Err(CallError::Unsupported(_))
    ));
    // A version-2 peer sees the verbs as tasks.
    let (_c, peer) = stranger(&w).await;
    let m = peer.manifest().unwrap();
    let echo = m.capability("app.work").unwrap().verb("echo").unwrap();
    assert_eq!(echo.kind, capwire::manifest::VerbKind::Task);
    assert!(m.capability("core.tasks").is_some());
    w.shutdown().await;
}

#[test]
fn the_examples_of_wire_md_are_what_capwire_encodes() {
    use capwire::envelope::RawValue;
    use capwire::manifest::TaskSubmitted;
    let submitted = TaskSubmitted {
        task: format!("5f0c{}a1b2", "0".repeat(24)),
        state: TaskState::Submitted,
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(
        hex(&capwire::envelope::to_vec(&submitted).unwrap()),
        concat!(
            "a2647461736b7820",
            "35663063303030303030303030303030",
            "30303030303030303030303061316232",
            "657374617465697375626d6974746564"
        )
    );
    let event = TaskEvent {
        seq: 5,
        at_ms: 1_764_547_200_000,
        state: TaskState::Working,
        kind: TaskEventKind::Progress,
        body: RawValue::encode(&3u32).unwrap(),
    };
    assert_eq!(
        hex(&capwire::envelope::to_vec(&event).unwrap()),
        concat!(
            "a5637365710565",
            "61745f6d731b0000019ad7358400",
            "65737461746567776f726b696e67",
            "646b696e646870726f6772657373",
            "64626f647903"
        )
    );
}

/// The error body of a call refused for any reason a body says.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, CallError>) -> capwire::envelope::ErrorBody {
    match result {
        Err(CallError::Remote(body) | CallError::Denied(body)) => body,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_id_used_for_another_task_verb_is_duplicate_after_the_replay_window() {
    let limits = Limits {
        replay_window: Duration::from_millis(200),
        ..Limits::default()
    };
    let (w, probe) = started(limits).await;
    let (_c, peer) = stranger(&w).await;
    let id = ReqId::try_from("job-1").unwrap();
    let first = peer
        .submit_with_id(Echo, "first".into(), &id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(first.result().await.unwrap(), "first");
    // Past the ledger's window: only the task's own key is left.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let other = peer
        .submit_with_id(Hold, (), &id, Duration::from_secs(5))
        .await;
    let body = refused(other);
    assert_eq!(body.code, ErrorCode::Duplicate, "{body:?}");
    // No task was made for it, and nothing ran.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(probe.started.load(Ordering::SeqCst), 0);
    let list = peer
        .request(TasksList, ListTasksArgs::default())
        .await
        .unwrap();
    assert_eq!(list.tasks.len(), 1);
    // The same verb finds its task again (once the ledger has forgotten
    // the refused one too).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = peer
        .submit_with_id(Echo, "first".into(), &id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(again.id(), first.id());
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_sent_again_finds_its_task_after_the_ledger_released_its_answer() {
    // A small quota: a busy sender's older answers are released.
    let limits = Limits {
        replay_sender_max_bytes: 4096,
        ..Limits::default()
    };
    let (w, _probe) = started(limits).await;
    let (_c, peer) = stranger(&w).await;
    let first_id = ReqId::try_from("1000").unwrap();
    let first = peer
        .submit_with_id(Echo, "kept".into(), &first_id, Duration::from_secs(5))
        .await
        .unwrap();
    for n in 1001..1100u32 {
        let id = ReqId::try_from(n.to_string().as_str()).unwrap();
        peer.submit_with_id(Echo, "more".into(), &id, Duration::from_secs(5))
            .await
            .unwrap();
    }
    let again = peer
        .submit_with_id(Echo, "kept".into(), &first_id, Duration::from_secs(5))
        .await
        .expect("the same submit finds its task, not `duplicate`");
    assert_eq!(again.id(), first.id());
    assert_eq!(again.result().await.unwrap(), "kept");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_ended_tasks_cannot_lock_the_control_plane_out() {
    let limits = Limits {
        max_tasks: 20,
        max_tasks_per_sender: 10,
        ..Limits::default()
    };
    let (b, _probe) = worker(limits);
    let bound = bind_new(b).await;
    let mut kept = Vec::new();
    let mut strangers = Vec::new();
    'fill: for _ in 0..3 {
        let (node, peer) = stranger(&bound.node).await;
        for _ in 0..10 {
            match peer.submit(Echo, "x".into()).await {
                Ok(t) => {
                    t.result().await.unwrap();
                    kept.push((peer.clone(), t.id().to_owned()));
                }
                Err(CallError::Overloaded) => {
                    strangers.push(node);
                    break 'fill;
                }
                Err(e) => panic!("{e}"),
            }
        }
        strangers.push(node);
    }
    // Strangers together keep at most nine tenths of the node's tasks.
    assert_eq!(kept.len(), 18);
    // The control plane gets the rest, and then makes room by deleting
    // strangers' ended tasks, oldest first.
    for n in 0..5 {
        let t = bound
            .peer
            .submit(Echo, format!("cp-{n}"))
            .await
            .expect("the control plane is never locked out");
        assert_eq!(t.result().await.unwrap(), format!("cp-{n}"));
    }
    let (oldest_peer, oldest) = &kept[0];
    let gone = remote(oldest_peer.task::<String>(oldest.clone()).get().await);
    assert_eq!(gone.code, ErrorCode::NotFound);
    let (newest_peer, newest) = kept.last().unwrap();
    assert_eq!(
        newest_peer
            .task::<String>(newest.clone())
            .result()
            .await
            .unwrap(),
        "x"
    );
    bound.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_gives_up_with_cancelled_cancels_its_task_with_its_words() {
    let (w, _probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let task = peer.submit(GiveUp, "no disk left".into()).await.unwrap();
    assert!(matches!(task.result().await, Err(CallError::Cancelled)));
    let info = task.get().await.unwrap();
    assert_eq!(info.state, TaskState::Canceled);
    let error = info.error.unwrap();
    assert_eq!(error.code, ErrorCode::Cancelled);
    assert_eq!(error.message, "no disk left");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verbs_own_args_check_refuses_before_a_task_exists() {
    let (w, probe) = started(Limits::default()).await;
    let (_c, peer) = stranger(&w).await;
    let body = refused(peer.submit(Bounded, 11).await);
    assert_eq!(body.code, ErrorCode::BadArgs);
    assert_eq!(body.message, "at most 10");
    let list = peer
        .request(TasksList, ListTasksArgs::default())
        .await
        .unwrap();
    assert!(list.tasks.is_empty(), "no task was written");
    assert_eq!(probe.started.load(Ordering::SeqCst), 0);
    let ok = peer.submit(Bounded, 10).await.unwrap();
    assert_eq!(ok.result().await.unwrap(), 10);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_the_control_plane_missed_are_counted_in_the_next() {
    let (b, _probe) = worker(Limits::default());
    let w = b.start().await.unwrap();
    let (_c, submitter) = stranger(&w).await;
    // Before any control plane is bound, changes are pushed to nobody,
    // and nobody is told of them.
    submitter
        .submit(Echo, "unbound".into())
        .await
        .unwrap()
        .result()
        .await
        .unwrap();
    let key = Keypair::generate().unwrap();
    let cp = Node::builder("control-plane")
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    let invite = w.invite(Some(cp.id())).unwrap();
    cp.connect_invite(&invite).await.unwrap();
    let mut rx = cp.control_events();
    let first = submitter.submit(Echo, "seen".into()).await.unwrap();
    first.result().await.unwrap();
    let seen = events_until(
        &mut rx,
        "the first task's end",
        |e| matches!(e, ControlEvent::Task { change, .. } if change.state == TaskState::Completed),
    )
    .await;
    for e in &seen {
        if let ControlEvent::Task { change, .. } = e {
            assert_eq!(change.dropped, 0, "{change:?}");
        }
    }
    // The control plane goes away for longer than a push waits for it
    // (10 s): the first push of the next task is not delivered.
    cp.shutdown().await;
    drop((cp, rx));
    let missed = submitter.submit(Echo, "missed".into()).await.unwrap();
    missed.result().await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    let cp = Node::builder("control-plane")
        .keypair(key)
        .start()
        .await
        .unwrap();
    let mut rx = cp.control_events();
    cp.connect(&w.local_addrs()[0], Some(w.id())).await.unwrap();
    let seen = events_until(&mut rx, "a push after the gap", |e| {
        matches!(e, ControlEvent::Task { .. })
    })
    .await;
    let Some(ControlEvent::Task { change, .. }) = seen.last() else {
        panic!("a push");
    };
    assert_eq!(change.task, missed.id());
    assert!(
        change.dropped >= 1,
        "the missed push is counted: {change:?}"
    );
    assert_eq!(
        change.dropped + 1,
        change.seq,
        "each change not delivered is counted: {change:?}"
    );
    w.shutdown().await;
}
