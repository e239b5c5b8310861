//! Tasks across a crash, with real processes: a node with a state
//! directory runs tasks (WIRE.md 4.10) in a child process, is killed with
//! SIGKILL in the middle of them, and is started again on the same
//! directory. Then: a task whose verb cannot resume is `failed` with the
//! code `interrupted`; one whose verb can is resumed (its handler sees
//! `resumed()`) and completes, each of its steps done once; every event a
//! subscriber was given before the kill is in the log after it, as it was,
//! and none is there twice; and a submit retried with its req_id gets the
//! task it made, whether its answer came before the kill or was lost in
//! it.
//!
//! The child is this test binary itself, run again for one test with
//! `CAPWIRE_TASK_CRASH_STATE` set: that test then starts the node on the
//! directory named there, prints its id and address, and serves until it
//! is killed.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire::envelope::ReqId;
use capwire::manifest::{ListTasksArgs, TaskEvent, TaskEventKind, TaskState, TasksList, verb};
use capwire::{Addr, CallError, Capability, HandlerError, Keypair, Node, NodeId, Peer, Task};

verb! {
    /// Does `n` steps, `step_ms` apart, one progress each (the step's
    /// number); resumed after a restart from the step after the last one
    /// it reported.
    pub struct Steps: task "app.crash" / "steps", Bootstrap, StepArgs => Done;
}
verb! {
    /// Reports a progress every this many ms, forever; cannot resume.
    pub struct Forever: task "app.crash" / "forever", Bootstrap, u64 => ();
}

/// Args of `steps`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub struct StepArgs {
    n: u32,
    step_ms: u64,
}

/// What `steps` answers.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, capwire::JsonSchema,
)]
#[schemars(crate = "capwire::schemars")]
pub struct Done {
    steps: u32,
    /// This run was a resume.
    resumed: bool,
    /// The steps done before this run started.
    found_done: u32,
}

async fn steps(args: StepArgs, task: Task) -> Result<Done, HandlerError> {
    let mut done = 0u32;
    if task.resumed() {
        for e in task.events(1).await? {
            if e.kind == TaskEventKind::Progress {
                done = e.body.decode::<u32>().unwrap();
            }
        }
    }
    let found_done = done;
    while done < args.n {
        tokio::time::sleep(Duration::from_millis(args.step_ms)).await;
        done += 1;
        task.progress(&done).await?;
    }
    Ok(Done {
        steps: done,
        resumed: task.resumed(),
        found_done,
    })
}

async fn forever(every_ms: u64, task: Task) -> Result<(), HandlerError> {
    for n in 1u64.. {
        tokio::time::sleep(Duration::from_millis(every_ms)).await;
        task.progress(&n).await?;
    }
    Ok(())
}

const STATE: &str = "CAPWIRE_TASK_CRASH_STATE";

/// In the child: runs the node on the state directory it was given, and
/// never returns. In the test itself: nothing.
async fn serve_if_child() {
    let Some(state) = std::env::var_os(STATE) else {
        return;
    };
    let node = Node::builder("task-crash")
        .state_dir(state)
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(
            Capability::new("app.crash", "1.0.0")
                .unwrap()
                .resumable_task(Steps, steps)
                .task(Forever, forever),
        )
        .start()
        .await
        .unwrap();
    println!("\nREADY {} {}", node.id(), node.local_addrs()[0]);
    std::future::pending::<()>().await;
}

/// The node process.
struct NodeProc {
    child: Child,
    id: NodeId,
    addr: Addr,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NodeProc {
    /// Starts the node on `state`, as test `test` of this binary.
    fn start(test: &str, state: &Path) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(STATE, state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the node process starts");
        let out = child.stdout.take().unwrap();
        // Owned (killed and waited for on drop) before anything can fail.
        let mut node = Self {
            child,
            id: NodeId::from_bytes([0; 32]),
            addr: "127.0.0.1:1".parse().unwrap(),
        };
        let mut out = BufReader::new(out);
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the node process ended before it was ready"
            );
            if let Some(ready) = line.trim().strip_prefix("READY ") {
                let (id, addr) = ready.split_once(' ').unwrap();
                node.id = id.parse().unwrap();
                node.addr = addr.parse().unwrap();
                return node;
            }
        }
    }

    /// SIGKILL, and the process is gone.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// The caller: the same identity across the node's restarts (a task is
/// its submitter's to see).
async fn caller(key: &Keypair) -> Node {
    Node::builder("task-crash-caller")
        .keypair(key.clone())
        .start()
        .await
        .unwrap()
}

async fn connect(caller: &Node, node: &NodeProc) -> Peer {
    caller.connect(&node.addr, Some(node.id)).await.unwrap()
}

fn req(id: &str) -> ReqId {
    ReqId::try_from(id).unwrap()
}

const DEADLINE: Duration = Duration::from_secs(5);

/// Follows the events of `task` into `into` until the subscription fails
/// (the node is killed) or the task ends.
fn follow<T: serde::de::DeserializeOwned + Send + 'static>(
    task: capwire::TaskHandle<T>,
    into: Arc<Mutex<Vec<TaskEvent>>>,
) -> tokio::task::JoinHandle<Option<CallError>> {
    tokio::spawn(async move {
        let mut events = match task.events(1).await {
            Ok(e) => e,
            Err(e) => return Some(e),
        };
        while let Some(e) = events.next().await {
            match e {
                Ok(e) => into.lock().unwrap().push(e),
                Err(e) => return Some(e),
            }
        }
        None
    })
}

async fn all_events<T: serde::de::DeserializeOwned>(
    task: &capwire::TaskHandle<T>,
) -> Vec<TaskEvent> {
    let mut events = task.events(1).await.unwrap();
    let mut out = Vec::new();
    while let Some(e) = events.next().await {
        out.push(e.unwrap());
    }
    out
}

/// Waits until `cond` holds (20 s).
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The events seen before the kill are the log's first ones, as they
/// were; the log has every seq from 1 once.
#[track_caller]
fn acknowledged_are_kept(seen: &[TaskEvent], log: &[TaskEvent]) {
    assert!(!seen.is_empty());
    assert_eq!(
        &log[..seen.len()],
        seen,
        "acknowledged events are kept as they were"
    );
    for (n, e) in (1..).zip(log) {
        assert_eq!(e.seq, n, "every seq once, in order: {log:?}");
    }
}

const BOTH: &str = "a_task_that_cannot_resume_fails_interrupted_and_one_that_can_resumes_once";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_cannot_resume_fails_interrupted_and_one_that_can_resumes_once() {
    serve_if_child().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let mut node = NodeProc::start(BOTH, &state);
    let key = Keypair::generate().unwrap();
    let client = caller(&key).await;
    let peer = connect(&client, &node).await;

    let forever = peer
        .submit_with_id(Forever, 10, &req("forever-1"), DEADLINE)
        .await
        .unwrap();
    let args = StepArgs { n: 40, step_ms: 25 };
    let steps_task = peer
        .submit_with_id(Steps, args.clone(), &req("steps-1"), DEADLINE)
        .await
        .unwrap();
    let (seen_forever, seen_steps) = (
        Arc::<Mutex<Vec<TaskEvent>>>::default(),
        Arc::<Mutex<Vec<TaskEvent>>>::default(),
    );
    let f1 = follow(forever.clone(), seen_forever.clone());
    let f2 = follow(steps_task.clone(), seen_steps.clone());
    until("both tasks are well under way", || {
        seen_forever.lock().unwrap().len() >= 6 && seen_steps.lock().unwrap().len() >= 10
    })
    .await;
    node.kill(); // SIGKILL mid-task
    assert!(
        f1.await.unwrap().is_some(),
        "the subscription fails with the node"
    );
    assert!(f2.await.unwrap().is_some());
    let seen_forever = seen_forever.lock().unwrap().clone();
    let seen_steps = seen_steps.lock().unwrap().clone();

    let node = NodeProc::start(BOTH, &state);
    let peer = connect(&client, &node).await;
    let forever = peer.task::<()>(forever.id());
    let steps_task = peer.task::<Done>(steps_task.id());

    // The task that cannot resume: failed, interrupted.
    let info = forever.get().await.unwrap();
    assert_eq!(info.state, TaskState::Failed, "{info:?}");
    assert_eq!(
        info.error.as_ref().unwrap().code.as_str(),
        "interrupted",
        "{info:?}"
    );
    match forever.result().await {
        Err(CallError::Remote(e)) => assert_eq!(e.code.as_str(), "interrupted"),
        other => panic!("{other:?}"),
    }
    let log = all_events(&forever).await;
    acknowledged_are_kept(&seen_forever, &log);
    let last = log.last().unwrap();
    assert_eq!(
        (last.kind, last.state),
        (TaskEventKind::Error, TaskState::Failed)
    );
    assert_eq!(last.seq, info.seq);

    // The one that can: resumed, each step done once, completed.
    let done = steps_task.result().await.unwrap();
    assert!(done.resumed, "{done:?}");
    assert_eq!(done.steps, args.n);
    let log = all_events(&steps_task).await;
    acknowledged_are_kept(&seen_steps, &log);
    let resumed: Vec<&TaskEvent> = log
        .iter()
        .filter(|e| {
            e.kind == TaskEventKind::State
                && e.body.decode::<String>().ok().as_deref() == Some("resumed")
        })
        .collect();
    assert_eq!(resumed.len(), 1, "resumed once: {log:?}");
    assert_eq!(resumed[0].state, TaskState::Working);
    assert!(resumed[0].seq > seen_steps.last().unwrap().seq);
    let steps_done: Vec<u32> = log
        .iter()
        .filter(|e| e.kind == TaskEventKind::Progress)
        .map(|e| e.body.decode().unwrap())
        .collect();
    assert_eq!(
        steps_done,
        (1..=args.n).collect::<Vec<_>>(),
        "each step once"
    );
    let found = u32::try_from(
        log.iter()
            .filter(|e| e.kind == TaskEventKind::Progress && e.seq < resumed[0].seq)
            .count(),
    )
    .unwrap();
    assert_eq!(
        done.found_done, found,
        "the resumed run went on after the last step written"
    );
    assert_eq!(log.last().unwrap().kind, TaskEventKind::Result);
    eprintln!(
        "killed after {} and {} events seen; {} steps were written before the kill",
        seen_forever.len(),
        seen_steps.len(),
        found
    );

    // The submits again, with their req_ids: the same tasks, in their
    // state now, and nothing new.
    let again = peer
        .submit_with_id(Steps, args, &req("steps-1"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(again.id(), steps_task.id());
    let again = peer
        .submit_with_id(Forever, 10, &req("forever-1"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(again.id(), forever.id());
    let list = peer
        .request(TasksList, ListTasksArgs::default())
        .await
        .unwrap();
    assert_eq!(list.tasks.len(), 2, "{list:?}");
    client.shutdown().await;
}

const BURST: &str = "submits_cut_by_a_kill_are_found_again_by_their_retry";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_cut_by_a_kill_are_found_again_by_their_retry() {
    serve_if_child().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let mut node = NodeProc::start(BURST, &state);
    let key = Keypair::generate().unwrap();
    let client = caller(&key).await;
    let peer = connect(&client, &node).await;

    // Acknowledged submits, one after another, until the node is killed.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let submits = {
        let (peer, acked) = (peer.clone(), acked.clone());
        tokio::spawn(async move {
            for i in 0u32.. {
                let args = StepArgs { n: 2, step_ms: 1 };
                match peer
                    .submit_with_id(Steps, args, &req(&format!("burst-{i}")), DEADLINE)
                    .await
                {
                    Ok(t) => acked.lock().unwrap().push(t.id().to_owned()),
                    Err(_) => return i,
                }
            }
            unreachable!()
        })
    };
    let count = acked.clone();
    until("submits are acknowledged", move || {
        count.lock().unwrap().len() >= 20
    })
    .await;
    node.kill();
    let in_flight = tokio::time::timeout(Duration::from_secs(30), submits)
        .await
        .expect("the submits stop with the node")
        .unwrap();
    let acked = acked.lock().unwrap().clone();
    assert_eq!(in_flight as usize, acked.len());

    let node = NodeProc::start(BURST, &state);
    let peer = connect(&client, &node).await;
    let args = StepArgs { n: 2, step_ms: 1 };
    // Every acknowledged submit, retried: its task.
    for (i, id) in acked.iter().enumerate() {
        let t = peer
            .submit_with_id(Steps, args.clone(), &req(&format!("burst-{i}")), DEADLINE)
            .await
            .unwrap();
        assert_eq!(t.id(), id, "burst-{i}");
    }
    // The one in flight: made before the kill or not, one task, found
    // again by another retry.
    let cut = peer
        .submit_with_id(
            Steps,
            args.clone(),
            &req(&format!("burst-{in_flight}")),
            DEADLINE,
        )
        .await
        .unwrap();
    let again = peer
        .submit_with_id(
            Steps,
            args.clone(),
            &req(&format!("burst-{in_flight}")),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(cut.id(), again.id());
    assert!(!acked.contains(&cut.id().to_owned()));
    let list = peer
        .request(
            TasksList,
            ListTasksArgs {
                limit: Some(200),
                ..ListTasksArgs::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(list.tasks.len(), acked.len() + 1, "no task made twice");
    // Each ends, each step done once (a resumed one goes on after its
    // last step).
    for t in &list.tasks {
        let task = peer.task::<Done>(t.task.clone());
        let done = task.result().await.unwrap();
        assert_eq!(done.steps, 2);
        let steps: Vec<u32> = all_events(&task)
            .await
            .iter()
            .filter(|e| e.kind == TaskEventKind::Progress)
            .map(|e| e.body.decode().unwrap())
            .collect();
        assert_eq!(steps, [1, 2], "task {}", t.task);
    }
    eprintln!("submits acknowledged before the kill: {}", acked.len());
    client.shutdown().await;
}
