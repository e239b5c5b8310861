//! `app.adv`: the capability every target node serves. Each handler counts
//! its runs, so an attack can assert that nothing ran; the controller verb
//! also checks, while it runs, that its sender really is the bound control
//! plane. The stream verb `gen` counts its items and how each stream
//! ended, so an attack can tell what the node's handler saw. The task
//! verbs (`chores`, `wait`, `quiz`, `big`) count their handlers' starts
//! and ends apart from `runs` (a task's handler starts after its submit is
//! answered, and a task cancelled at once may never start it): the task
//! attacks check those counts themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use capwire::manifest::verb;
use capwire::{
    Capability, HandlerError, Items, Meta, NodeHandle, Sender, State, StreamClosed, Task,
};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

verb! {
    /// Echoes text; any contact may call it.
    pub struct Echo: request "app.adv" / "echo", Bootstrap, String => String;
}
verb! {
    /// Only the bound control plane may call it.
    pub struct Admin: request "app.adv" / "admin", Controller, String => String;
}
verb! {
    /// Fire-and-forget; any contact may send it.
    pub struct Note: notification "app.adv" / "note", Bootstrap, String;
}
verb! {
    /// Waits until the test releases it (or it is cancelled); returns its tag.
    pub struct Hold: request "app.adv" / "hold", Bootstrap, u64 => u64;
}
verb! {
    /// Returns a text of this many bytes.
    pub struct Blob: request "app.adv" / "blob", Bootstrap, u32 => String;
}

verb! {
    /// A stream (protocol 2) of the items 0, 1, 2, ... up to (not
    /// including) the number asked for, as fast as credit allows.
    pub struct Gen: stream "app.adv" / "gen", Bootstrap, u32 => u32;
}

verb! {
    /// A task (protocol 2) that reports the progress 1, 2, ... up to the
    /// number asked for, and answers that number.
    pub struct Chores: task "app.adv" / "chores", Bootstrap, u32 => u32;
}
verb! {
    /// A task that waits until the test releases it, or it is cancelled.
    pub struct Wait: task "app.adv" / "wait", Bootstrap, () => ();
}
verb! {
    /// A task that reports the progress `"started"`, then asks this many
    /// questions (`"question N"`, each answered with a number), and
    /// answers the sum of the answers.
    pub struct Quiz: task "app.adv" / "quiz", Bootstrap, u32 => u32;
}
verb! {
    /// A task that reports a progress of `progress` bytes (when not 0),
    /// then answers a text of `result` bytes.
    pub struct Big: task "app.adv" / "big", Bootstrap, BigArgs => String;
}

/// Args of `big`; `pad` only makes them longer.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub struct BigArgs {
    pub progress: u32,
    pub result: u32,
    pub pad: String,
}

/// `gen` asked for this many items: it never ends on its own.
pub const FOREVER: u32 = u32::MAX;

/// What the handlers did.
#[derive(Debug)]
pub struct Tally {
    /// Every handler run, of every verb.
    pub runs: AtomicU64,
    pub echo: AtomicU64,
    pub admin: AtomicU64,
    pub note: AtomicU64,
    pub hold: AtomicU64,
    pub blob: AtomicU64,
    /// `gen` streams that started, and whose futures ended (returned or
    /// dropped).
    pub gen_streams: AtomicU64,
    pub gen_ended: AtomicU64,
    /// Items the `gen` handlers got into the session's send queue.
    pub gen_items: AtomicU64,
    /// Why `gen` handlers could not send an item, in order.
    pub gen_closed: Mutex<Vec<StreamClosed>>,
    /// `admin` runs whose sender was not the bound control plane when the
    /// handler ran: must stay 0.
    pub unbound_admin: AtomicU64,
    /// `hold` handlers whose future ended (returned or dropped).
    pub hold_ended: AtomicU64,
    /// The cancel token of every `hold` handler, in start order.
    pub tokens: Mutex<Vec<CancellationToken>>,
    /// Each permit lets one `hold` handler return.
    pub release: Semaphore,
    /// Task handlers that started, and whose futures ended (returned or
    /// dropped); not in `runs`.
    pub task_started: AtomicU64,
    pub task_ended: AtomicU64,
    /// Each permit lets one `wait` task end.
    pub release_tasks: Semaphore,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            runs: AtomicU64::new(0),
            echo: AtomicU64::new(0),
            admin: AtomicU64::new(0),
            note: AtomicU64::new(0),
            hold: AtomicU64::new(0),
            blob: AtomicU64::new(0),
            gen_streams: AtomicU64::new(0),
            gen_ended: AtomicU64::new(0),
            gen_items: AtomicU64::new(0),
            gen_closed: Mutex::new(Vec::new()),
            unbound_admin: AtomicU64::new(0),
            hold_ended: AtomicU64::new(0),
            tokens: Mutex::new(Vec::new()),
            release: Semaphore::new(0),
            task_started: AtomicU64::new(0),
            task_ended: AtomicU64::new(0),
            release_tasks: Semaphore::new(0),
        }
    }
}

/// Reads a counter.
pub fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::SeqCst)
}

fn count(tally: &Tally, verb: &AtomicU64) {
    tally.runs.fetch_add(1, Ordering::SeqCst);
    verb.fetch_add(1, Ordering::SeqCst);
}

impl Tally {
    /// The cancel token of the `n`-th `hold` handler that started.
    pub fn token(&self, n: usize) -> CancellationToken {
        self.tokens.lock().unwrap()[n].clone()
    }

    /// Why `gen` handlers stopped sending, so far.
    pub fn gen_closed(&self) -> Vec<StreamClosed> {
        self.gen_closed.lock().unwrap().clone()
    }
}

type Shared = Arc<Tally>;

async fn echo(text: String, State(t): State<Shared>) -> Result<String, HandlerError> {
    count(&t, &t.echo);
    Ok(format!("echo: {text}"))
}

async fn admin(
    text: String,
    Sender(from): Sender,
    node: NodeHandle,
    State(t): State<Shared>,
) -> Result<String, HandlerError> {
    count(&t, &t.admin);
    if node.controller() != Some(from) {
        t.unbound_admin.fetch_add(1, Ordering::SeqCst);
    }
    Ok(format!("admin: {text}"))
}

async fn note(_text: String, State(t): State<Shared>) -> Result<(), HandlerError> {
    count(&t, &t.note);
    Ok(())
}

struct Ended(Shared);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.hold_ended.fetch_add(1, Ordering::SeqCst);
    }
}

async fn hold(tag: u64, meta: Meta, State(t): State<Shared>) -> Result<u64, HandlerError> {
    let _ended = Ended(t.clone());
    t.tokens.lock().unwrap().push(meta.cancel.clone());
    count(&t, &t.hold);
    t.release.acquire().await.expect("never closed").forget();
    Ok(tag)
}

async fn blob(len: u32, State(t): State<Shared>) -> Result<String, HandlerError> {
    count(&t, &t.blob);
    Ok("b".repeat(len as usize))
}

struct GenEnded(Shared);

impl Drop for GenEnded {
    fn drop(&mut self) {
        self.0.gen_ended.fetch_add(1, Ordering::SeqCst);
    }
}

async fn generate(
    n: u32,
    mut items: Items<u32>,
    State(t): State<Shared>,
) -> Result<(), HandlerError> {
    let _ended = GenEnded(t.clone());
    count(&t, &t.gen_streams);
    for i in 0..n {
        if let Err(e) = items.send(i).await {
            t.gen_closed.lock().unwrap().push(e.clone());
            return Err(e.into());
        }
        t.gen_items.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

/// Counts a task handler's start, and its end however it ends.
struct TaskRun(Shared);

impl TaskRun {
    fn start(t: &Shared) -> Self {
        t.task_started.fetch_add(1, Ordering::SeqCst);
        Self(t.clone())
    }
}

impl Drop for TaskRun {
    fn drop(&mut self) {
        self.0.task_ended.fetch_add(1, Ordering::SeqCst);
    }
}

async fn chores(n: u32, task: Task, State(t): State<Shared>) -> Result<u32, HandlerError> {
    let _run = TaskRun::start(&t);
    for i in 1..=n {
        task.progress(&i).await?;
    }
    Ok(n)
}

async fn wait(_: (), task: Task, State(t): State<Shared>) -> Result<(), HandlerError> {
    let _run = TaskRun::start(&t);
    tokio::select! {
        p = t.release_tasks.acquire() => p.expect("never closed").forget(),
        () = task.cancelled() => {}
    }
    Ok(())
}

async fn quiz(rounds: u32, task: Task, State(t): State<Shared>) -> Result<u32, HandlerError> {
    let _run = TaskRun::start(&t);
    task.progress("started").await?;
    let mut sum = 0u32;
    for i in 0..rounds {
        let a: u32 = task
            .ask(&format!("question {i}"), Duration::from_secs(60))
            .await?;
        sum = sum.saturating_add(a);
    }
    Ok(sum)
}

async fn big(args: BigArgs, task: Task, State(t): State<Shared>) -> Result<String, HandlerError> {
    let _run = TaskRun::start(&t);
    if args.progress > 0 {
        task.progress(&"p".repeat(args.progress as usize)).await?;
    }
    Ok("r".repeat(args.result as usize))
}

/// `app.adv` 1.0.0 with every verb above.
pub fn capability() -> Capability {
    Capability::new("app.adv", "1.0.0")
        .unwrap()
        .handle(Echo, echo)
        .handle(Admin, admin)
        .handle(Note, note)
        .handle(Hold, hold)
        .handle(Blob, blob)
        .stream(Gen, generate)
        .task(Chores, chores)
        .task(Wait, wait)
        .task(Quiz, quiz)
        .task(Big, big)
}
