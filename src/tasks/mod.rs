//! The task service: the one writer of a node's tasks (`core.tasks`).
//!
//! Every change to a task (a submit, an event from its handler, an answer,
//! a cancel, the end of its retention) is a command to one actor, which
//! decides it against the tasks as they will be once written, writes a
//! whole round of commands in one store transaction (group commit: one
//! fsync for many events), and only then publishes the round: answers
//! its callers, wakes the task's subscribers, starts new tasks' handlers,
//! hands answers to waiting handlers and cancels cancelled ones, and
//! queues state changes for the control plane. Reads (`get`, `list`,
//! `subscribe`) see only what is written.
//!
//! ```text
//!  submit / progress / ask / respond / cancel ──► actor ──► one batch ──► store (fsync)
//!                                                   │
//!               replies, subscribers, handlers ◄────┴── published once written
//! ```
//!
//! A task's handler runs on the node's task tracker, outside any session:
//! the submitter may go away and come back. On shutdown handlers stop
//! without writing anything; when the node starts again, a task that had
//! not ended is resumed when its verb has a resume handler, and is
//! `failed` with the code `interrupted` otherwise.

pub(crate) mod table;
pub(crate) mod task;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use capwire_authz::SharedBinding;
use capwire_envelope::{ErrorBody, ErrorCode, NodeId, RawValue};
use capwire_manifest::{TaskChanged, TaskEvent, TaskEventKind, TaskInfo, TaskState, TaskSubmitted};
use futures_util::FutureExt;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::{AuditLog, Entry, Kind};
use crate::authority::{Authorities, Authority, Basis};
use crate::store::{Store, StoreError, TaskAuthority, TaskEventRecord, TaskRecord, TaskTrace};
use crate::time::unix_ms;
use crate::trace::TraceContext;
pub(crate) use table::{Change, TaskId, TaskLimits, TaskTable};
use tracing::Instrument;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A boxed, sendable future.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What runs a task's handler: given the task's context, the handler's
/// future (its result item, or its error).
pub(crate) type Start =
    Box<dyn FnOnce(task::Task) -> BoxFuture<Result<RawValue, ErrorBody>> + Send>;

/// Finds the resume handler of a task verb after a restart: given the
/// task's verb and args, what runs it again (`None`: the verb has no
/// resume handler). `fresh`: the task's handler had not started, so any
/// task verb may start it (not only one that can resume).
pub(crate) trait Resumer: Send + Sync + 'static {
    fn resume(
        &self,
        cap: &str,
        verb: &str,
        submitter: NodeId,
        req_id: &str,
        args: RawValue,
        fresh: bool,
    ) -> Option<Start>;
}

/// Commands are queued at most this deep; callers wait beyond.
const QUEUE: usize = 4096;
/// Commands decided and written in one round, at most.
const ROUND: usize = 512;
/// Ended tasks deleted in one round, at most.
const EXPIRE_ROUND: usize = 1000;
/// How often retention is looked at, at most.
const EXPIRE_EVERY: Duration = Duration::from_secs(10);
/// State changes waiting to be pushed to the control plane, at most.
const PUSH_QUEUE: usize = 1024;

enum Cmd {
    Submit {
        sender: NodeId,
        req_id: String,
        cap: String,
        verb: String,
        args: Vec<u8>,
        start: Start,
        /// For a controller verb: the authority it was admitted on.
        authority: Option<Arc<Authority>>,
        /// The submit's trace context.
        trace: Option<TraceContext>,
        reply: oneshot::Sender<Result<TaskSubmitted, ErrorBody>>,
    },
    Append {
        id: TaskId,
        kind: TaskEventKind,
        state: TaskState,
        body: Vec<u8>,
        error: Option<ErrorBody>,
        reply: Option<oneshot::Sender<Result<u64, ErrorBody>>>,
    },
    Respond {
        id: TaskId,
        question_seq: Option<u64>,
        answer: Vec<u8>,
        reply: oneshot::Sender<Result<(), ErrorBody>>,
    },
    Cancel {
        id: TaskId,
        by: NodeId,
        reply: oneshot::Sender<Result<(), ErrorBody>>,
    },
    /// The question of event `question_seq` went unanswered: back to
    /// `working`, unless it was answered meanwhile (`false`).
    Unask {
        id: TaskId,
        question_seq: u64,
        reply: oneshot::Sender<Result<bool, ErrorBody>>,
    },
    Expire,
}

/// What a task's handler is traced as: its verb, and the trace context of
/// its submit.
struct Traced {
    cap: String,
    verb: String,
    trace: Option<TraceContext>,
}

/// What to do once a round is written.
enum Done {
    Reply(
        oneshot::Sender<Result<TaskSubmitted, ErrorBody>>,
        Result<TaskSubmitted, ErrorBody>,
    ),
    Seq(
        Option<oneshot::Sender<Result<u64, ErrorBody>>>,
        Result<u64, ErrorBody>,
    ),
    Unit(
        oneshot::Sender<Result<(), ErrorBody>>,
        Result<(), ErrorBody>,
    ),
    Flag(
        oneshot::Sender<Result<bool, ErrorBody>>,
        Result<bool, ErrorBody>,
    ),
    Run(TaskId, Start, bool, Option<Arc<Authority>>, Traced),
    /// The answer, and the seq of its event.
    Answer(TaskId, RawValue, u64),
    Stop(TaskId),
}

/// A running handler, as the service knows it.
#[derive(Debug)]
struct Run {
    cancel: CancellationToken,
    /// The handler waits for an answer here.
    answer: Option<oneshot::Sender<(RawValue, u64)>>,
    /// Whether an answer fits the type the handler asked for.
    fits: Option<AnswerCheck>,
}

/// Tells whether an answer decodes to the type a question asked for.
pub(crate) type AnswerCheck = fn(&RawValue) -> Result<(), String>;

/// The node's tasks.
pub(crate) struct TaskService {
    cmds: mpsc::Sender<Cmd>,
    /// Taken by the actor when it starts.
    inbox: Mutex<Option<mpsc::Receiver<Cmd>>>,
    /// The tasks as written.
    published: Mutex<TaskTable>,
    store: Arc<dyn Store>,
    blocking: bool,
    pub(crate) limits: TaskLimits,
    /// The node's binding (who the control plane is) and what running
    /// work holds its authority from.
    binding: Arc<SharedBinding>,
    authorities: Arc<Authorities>,
    /// Where task state changes are recorded.
    audit: Arc<AuditLog>,
    watchers: Mutex<HashMap<TaskId, Arc<Notify>>>,
    runs: Mutex<HashMap<TaskId, Run>>,
    pushes: Mutex<Pushes>,
    /// Events written, and pushes dropped, since the node started.
    events_written: AtomicU64,
    pushes_dropped: AtomicU64,
    push_ready: Notify,
    runners: TaskTracker,
    /// The node is stopping: handlers stop and write nothing.
    stopping: CancellationToken,
    resumer: OnceLock<Arc<dyn Resumer>>,
    /// Tells the bound control plane and the node's contacts from
    /// strangers (set once the peer table exists): capacity is kept for
    /// the first.
    priority: OnceLock<Priority>,
}

/// The state changes waiting to be pushed to the control plane.
#[derive(Debug, Default)]
struct Pushes {
    queue: VecDeque<TaskChanged>,
    /// Pushes meant for the control plane of binding `epoch` and not
    /// delivered since the last one that was: the next one's `dropped`.
    dropped: u64,
    epoch: u64,
}

impl Pushes {
    /// Counts `n` pushes left out for the control plane of `epoch`; a
    /// count for an earlier binding is not this control plane's.
    fn missed(&mut self, epoch: u64, n: u64) {
        if self.epoch != epoch {
            self.epoch = epoch;
            self.dropped = 0;
        }
        self.dropped = self.dropped.saturating_add(n);
    }
}

/// Whether a submitter is the bound control plane or a contact.
pub(crate) type Priority = Box<dyn Fn(&NodeId) -> bool + Send + Sync>;

impl std::fmt::Debug for TaskService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskService")
            .field("tasks", &lock(&self.published).len())
            .finish_non_exhaustive()
    }
}

fn internal(e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(ErrorCode::Internal, e.to_string())
}

fn not_found() -> ErrorBody {
    // The same words for a task that does not exist and for one the
    // caller may not see: no oracle for ids.
    ErrorBody::new(ErrorCode::NotFound, "no such task")
}

/// The error a task ends with when the authority it ran under ended.
fn ended_authority(why: &capwire_authz::DenyReason) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::Unauthorized,
        format!("the authority the task was submitted under has ended: {why}"),
    )
}

/// What is kept of `basis` with a task.
fn task_authority(basis: &Basis) -> TaskAuthority {
    match basis {
        Basis::Binding { epoch } => TaskAuthority {
            epoch: *epoch,
            grant: false,
        },
        Basis::Grant { epoch, .. } => TaskAuthority {
            epoch: *epoch,
            grant: true,
        },
    }
}

fn gone() -> ErrorBody {
    ErrorBody::new(ErrorCode::Cancelled, "the task has ended")
}

fn null() -> Vec<u8> {
    RawValue::null().as_bytes().to_vec()
}

/// A task's event as the wire has it.
pub(crate) fn wire_event(e: TaskEventRecord) -> TaskEvent {
    TaskEvent {
        seq: e.seq,
        at_ms: e.at_ms,
        state: e.state,
        kind: e.kind,
        body: RawValue::from_slice(&e.body).unwrap_or_else(|_| RawValue::null()),
    }
}

impl TaskService {
    pub(crate) fn new(
        tasks: Vec<TaskRecord>,
        store: Arc<dyn Store>,
        blocking: bool,
        limits: TaskLimits,
        binding: Arc<SharedBinding>,
        authorities: Arc<Authorities>,
        audit: Arc<AuditLog>,
    ) -> Self {
        let (cmds, inbox) = mpsc::channel(QUEUE);
        Self {
            cmds,
            inbox: Mutex::new(Some(inbox)),
            published: Mutex::new(TaskTable::load(tasks)),
            store,
            blocking,
            limits,
            binding,
            authorities,
            audit,
            watchers: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            pushes: Mutex::new(Pushes::default()),
            events_written: AtomicU64::new(0),
            pushes_dropped: AtomicU64::new(0),
            push_ready: Notify::new(),
            runners: TaskTracker::new(),
            stopping: CancellationToken::new(),
            resumer: OnceLock::new(),
            priority: OnceLock::new(),
        }
    }

    /// Gives the service its way to tell the control plane and contacts
    /// from strangers.
    pub(crate) fn set_priority(&self, priority: Priority) {
        let _ = self.priority.set(priority);
    }

    /// Tells the bound control plane (as bound now) and contacts from
    /// strangers.
    fn priority(&self) -> impl Fn(&NodeId) -> bool + '_ {
        let binding = self.binding.snapshot();
        move |who| binding.is_controller(who) || self.priority.get().is_some_and(|p| p(who))
    }

    /// Gives the service its way to find resume handlers (once the
    /// dispatcher exists).
    pub(crate) fn set_resumer(&self, resumer: Arc<dyn Resumer>) {
        let _ = self.resumer.set(resumer);
    }

    /// Runs `f` on the store, off the executor when it is a real disk.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ErrorBody> {
        let store = self.store.clone();
        let out = if self.blocking {
            tokio::task::spawn_blocking(move || f(&*store))
                .await
                .map_err(internal)?
        } else {
            f(&*store)
        };
        out.map_err(|e| {
            tracing::error!(error = %e, "task state not read or written");
            ErrorBody::new(
                ErrorCode::Internal,
                "the node could not read or write its tasks",
            )
        })
    }

    async fn send(&self, cmd: Cmd) -> Result<(), ErrorBody> {
        self.cmds
            .send(cmd)
            .await
            .map_err(|_| ErrorBody::new(ErrorCode::Cancelled, "the node is shutting down"))
    }

    // -----------------------------------------------------------------
    // What handlers and the core capability call

    /// Submits a task: written (with its first event) before this returns;
    /// the same `req_id` from the same sender gets the same task, and
    /// starts nothing new (and on another verb, `duplicate`). A task of a
    /// controller verb runs under `authority`, and fails `unauthorized`
    /// when it ends. Its handler runs in the trace of `trace` (the
    /// submit's context, kept with the task).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn submit(
        &self,
        sender: NodeId,
        req_id: String,
        cap: &str,
        verb: &str,
        args: Vec<u8>,
        start: Start,
        authority: Option<Arc<Authority>>,
        trace: Option<TraceContext>,
    ) -> Result<TaskSubmitted, ErrorBody> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Submit {
            sender,
            req_id,
            cap: cap.to_owned(),
            verb: verb.to_owned(),
            args,
            start,
            authority,
            trace,
            reply,
        })
        .await?;
        rx.await.map_err(|_| internal("the task service stopped"))?
    }

    /// Appends an event, written before this returns; its seq.
    pub(crate) async fn append(
        &self,
        id: TaskId,
        kind: TaskEventKind,
        state: TaskState,
        body: Vec<u8>,
        error: Option<ErrorBody>,
    ) -> Result<u64, ErrorBody> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Append {
            id,
            kind,
            state,
            body,
            error,
            reply: Some(reply),
        })
        .await?;
        let seq = rx
            .await
            .map_err(|_| internal("the task service stopped"))??;
        // An event of the task's span (its handler and runner run in it).
        crate::trace::event_here(kind.as_str(), seq);
        Ok(seq)
    }

    /// Waits for the answer to the question the handler of `id` is about
    /// to ask (registered before the question is written, so no answer is
    /// missed). An answer that `fits` refuses is answered `bad_args`, and
    /// the question still waits.
    pub(crate) fn answer_slot(
        &self,
        id: TaskId,
        fits: AnswerCheck,
    ) -> oneshot::Receiver<(RawValue, u64)> {
        let (tx, rx) = oneshot::channel();
        if let Some(run) = lock(&self.runs).get_mut(&id) {
            run.answer = Some(tx);
            run.fits = Some(fits);
        }
        rx
    }

    /// The record of task `id` as written, if `who` may see it (its
    /// submitter, or the node's bound control plane).
    pub(crate) fn visible(&self, id: &TaskId, who: &NodeId) -> Option<TaskRecord> {
        let record = lock(&self.published).get(id)?.record.clone();
        let may = record.submitter == *who || self.binding.snapshot().is_controller(who);
        may.then_some(record)
    }

    /// Whether `who` may see task `id` now, and what must go on holding
    /// for it to go on seeing it: nothing for the task's submitter; the
    /// binding of the moment for the bound control plane (a subscription
    /// holds it and ends when it changes).
    ///
    /// # Errors
    /// `not_found` when `who` may not see it.
    pub(crate) fn sight(
        &self,
        id: &TaskId,
        who: &NodeId,
    ) -> Result<Option<Arc<Authority>>, ErrorBody> {
        let binding = self.binding.snapshot();
        let submitter = lock(&self.published)
            .get(id)
            .map(|e| e.record.submitter)
            .ok_or_else(not_found)?;
        if submitter == *who {
            return Ok(None);
        }
        if !binding.is_controller(who) {
            return Err(not_found());
        }
        let held = self.authorities.hold(
            *who,
            Basis::Binding {
                epoch: binding.epoch(),
            },
        );
        held.check().map_err(|_| not_found())?;
        Ok(Some(held))
    }

    /// Whether `who` may see every task (the bound control plane).
    pub(crate) fn sees_all(&self, who: &NodeId) -> bool {
        self.binding.snapshot().is_controller(who)
    }

    /// What subscribers of `id` wait on.
    /// Only a task that exists gets an entry (removed when the task is
    /// deleted), so the map is bounded by the tasks kept.
    pub(crate) fn watcher(&self, id: TaskId) -> Arc<Notify> {
        let published = lock(&self.published);
        if published.get(&id).is_none() {
            return Arc::default();
        }
        let w = lock(&self.watchers).entry(id).or_default().clone();
        drop(published);
        w
    }

    /// Events of `id` from `from`, at most `limit`, as written.
    pub(crate) async fn events(
        &self,
        id: TaskId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<TaskEventRecord>, ErrorBody> {
        self.blocking(move |s| s.task_events(&id.0, from, limit))
            .await
    }

    /// The args task `id` was submitted with.
    pub(crate) async fn args(&self, id: TaskId) -> Result<RawValue, ErrorBody> {
        let bytes = self
            .blocking(move |s| s.task_args(&id.0))
            .await?
            .unwrap_or_else(null);
        RawValue::from_slice(&bytes).map_err(internal)
    }

    /// What is known about the tasks `ids` (their records as written, and
    /// the bodies of their last progress, question and result).
    pub(crate) async fn infos(&self, records: Vec<TaskRecord>) -> Result<Vec<TaskInfo>, ErrorBody> {
        self.blocking(move |s| {
            let body = |id: &[u8], seq: Option<u64>| -> Result<RawValue, StoreError> {
                let Some(seq) = seq else {
                    return Ok(RawValue::null());
                };
                let found = s.task_events(id, seq, 1)?;
                Ok(found
                    .into_iter()
                    .find(|e| e.seq == seq)
                    .and_then(|e| RawValue::from_slice(&e.body).ok())
                    .unwrap_or_else(RawValue::null))
            };
            records
                .into_iter()
                .map(|r| {
                    let result_seq = (r.state == TaskState::Completed).then_some(r.seq);
                    Ok(TaskInfo {
                        task: TaskId::from_slice(&r.id)
                            .map(|i| i.to_string())
                            .unwrap_or_default(),
                        progress: body(&r.id, r.progress_seq)?,
                        question: body(&r.id, r.question_seq)?,
                        result: body(&r.id, result_seq)?,
                        question_seq: r.question_seq,
                        cap: r.cap,
                        verb: r.verb,
                        state: r.state,
                        created_ms: r.created_ms,
                        updated_ms: r.updated_ms,
                        seq: r.seq,
                        first_seq: r.first_seq,
                        error: r.error,
                    })
                })
                .collect()
        })
        .await
    }

    /// A page of the tasks `who` may see, newest first.
    pub(crate) fn page(
        &self,
        who: &NodeId,
        before: Option<&TaskId>,
        limit: usize,
        keep: impl Fn(&TaskRecord) -> bool,
    ) -> (Vec<TaskRecord>, Option<TaskId>) {
        let all = self.sees_all(who);
        let table = lock(&self.published);
        let (ids, more) = table.page(who, all, before, limit, keep);
        let next = more.then(|| ids.last().copied()).flatten();
        let records = ids
            .iter()
            .filter_map(|id| table.get(id).map(|e| e.record.clone()))
            .collect();
        (records, next)
    }

    /// Answers the question task `id` waits on.
    pub(crate) async fn respond(
        &self,
        id: TaskId,
        question_seq: Option<u64>,
        answer: Vec<u8>,
    ) -> Result<(), ErrorBody> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Respond {
            id,
            question_seq,
            answer,
            reply,
        })
        .await?;
        rx.await.map_err(|_| internal("the task service stopped"))?
    }

    /// The handler of `id` stops waiting for the answer to the question of
    /// event `question_seq`: `true` when the task went back to `working`,
    /// `false` when the question was answered first (the answer is then
    /// in the handler's slot already).
    pub(crate) async fn unask(&self, id: TaskId, question_seq: u64) -> Result<bool, ErrorBody> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Unask {
            id,
            question_seq,
            reply,
        })
        .await?;
        rx.await.map_err(|_| internal("the task service stopped"))?
    }

    /// Cancels task `id` (nothing happens to an ended one).
    pub(crate) async fn cancel(&self, id: TaskId, by: NodeId) -> Result<(), ErrorBody> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Cancel { id, by, reply }).await?;
        rx.await.map_err(|_| internal("the task service stopped"))?
    }

    /// The node's tasks by state (every state, in order), the events
    /// written and the pushes not delivered since the node started.
    pub(crate) fn figures(&self) -> (Vec<(TaskState, usize)>, u64, u64) {
        let counts = lock(&self.published).counts();
        let by_state = TaskState::ALL
            .iter()
            .map(|s| (*s, counts.get(s).copied().unwrap_or(0)))
            .collect();
        (
            by_state,
            self.events_written.load(Ordering::Relaxed),
            self.pushes_dropped.load(Ordering::Relaxed),
        )
    }

    /// The state changes waiting for the control plane of binding
    /// `epoch`: the oldest, with how many meant for it were left out just
    /// before it.
    pub(crate) fn next_push(&self, epoch: u64) -> Option<TaskChanged> {
        let mut q = lock(&self.pushes);
        let mut change = q.queue.pop_front()?;
        q.missed(epoch, 0);
        change.dropped = std::mem::take(&mut q.dropped);
        Some(change)
    }

    /// `change`, taken from the queue for the control plane of binding
    /// `epoch`, was not delivered (it speaks protocol 1, the session was
    /// lost or had no room in time, or the binding changed before it
    /// went): it and those it said were left out are counted in the next
    /// push's `dropped`, so a control plane learns that it missed some.
    pub(crate) fn undelivered(&self, change: &TaskChanged, epoch: u64) {
        lock(&self.pushes).missed(epoch, change.dropped.saturating_add(1));
        self.pushes_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// A change was not pushed: no control plane was bound to tell.
    pub(crate) fn unsent(&self) {
        self.pushes_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until a state change may be waiting.
    pub(crate) async fn push_ready(&self) {
        self.push_ready.notified().await;
    }

    // -----------------------------------------------------------------
    // The actor

    /// Runs the service until `stop`: restarts the tasks that had not
    /// ended, then decides and writes rounds of commands.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let Some(mut inbox) = lock(&self.inbox).take() else {
            return;
        };
        let mut staged = lock(&self.published).clone();
        self.restart(&mut staged).await;
        // Retention is looked at often enough for short retentions too.
        let every = Duration::from_millis(self.limits.retention_ms / 2)
            .clamp(Duration::from_millis(50), EXPIRE_EVERY);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Grows to the rounds it sees (a quiet node keeps a small one).
        let mut cmds = Vec::new();
        loop {
            let first = tokio::select! {
                () = stop.cancelled() => break,
                c = inbox.recv() => match c {
                    Some(c) => c,
                    None => break,
                },
                _ = tick.tick() => Cmd::Expire,
            };
            cmds.push(first);
            while cmds.len() < ROUND {
                match inbox.try_recv() {
                    Ok(c) => cmds.push(c),
                    Err(_) => break,
                }
            }
            self.round(&mut staged, cmds.drain(..)).await;
        }
        // Commands queued from now on fail (their callers are told the
        // node is stopping), so no handler waits on a write that never
        // comes while the runners are waited for.
        drop(inbox);
        self.stopping.cancel();
        self.runners.close();
        self.runners.wait().await;
    }

    /// Decides `cmds` against `staged`, writes them in one batch, then
    /// publishes them (or, when the write failed, fails them all and goes
    /// back to what is written).
    async fn round(self: &Arc<Self>, staged: &mut TaskTable, cmds: impl Iterator<Item = Cmd>) {
        let mut change = Change::default();
        let mut done = Vec::new();
        let now = unix_ms();
        for cmd in cmds {
            self.decide(staged, cmd, now, &mut change, &mut done);
        }
        self.write(staged, change, done).await;
    }

    /// Writes what a round decided, then carries out `done`.
    async fn write(self: &Arc<Self>, staged: &mut TaskTable, mut change: Change, done: Vec<Done>) {
        let batch = std::mem::take(&mut change.batch);
        let written = if batch.is_empty() {
            Ok(())
        } else {
            let applied = batch.clone();
            self.blocking(move |s| s.commit(&batch)).await.map(|()| {
                lock(&self.published).apply(&applied);
            })
        };
        if let Err(e) = written {
            *staged = lock(&self.published).clone();
            for d in done {
                match d {
                    Done::Reply(tx, _) => {
                        let _ = tx.send(Err(e.clone()));
                    }
                    Done::Seq(tx, _) => {
                        if let Some(tx) = tx {
                            let _ = tx.send(Err(e.clone()));
                        }
                    }
                    Done::Unit(tx, _) => {
                        let _ = tx.send(Err(e.clone()));
                    }
                    Done::Flag(tx, _) => {
                        let _ = tx.send(Err(e.clone()));
                    }
                    Done::Run(..) | Done::Answer(..) | Done::Stop(..) => {}
                }
            }
            return;
        }
        self.publish(&change);
        for d in done {
            match d {
                Done::Reply(tx, r) => {
                    let _ = tx.send(r);
                }
                Done::Seq(tx, r) => {
                    if let Some(tx) = tx {
                        let _ = tx.send(r);
                    }
                }
                Done::Unit(tx, r) => {
                    let _ = tx.send(r);
                }
                Done::Flag(tx, r) => {
                    let _ = tx.send(r);
                }
                Done::Run(id, start, resumed, authority, traced) => {
                    self.spawn(id, start, resumed, authority, traced);
                }
                Done::Answer(id, answer, seq) => {
                    let slot = lock(&self.runs).get_mut(&id).and_then(|r| r.answer.take());
                    if let Some(tx) = slot {
                        let _ = tx.send((answer, seq));
                    }
                }
                Done::Stop(id) => {
                    if let Some(run) = lock(&self.runs).get(&id) {
                        run.cancel.cancel();
                    }
                }
            }
        }
    }

    fn decide(
        &self,
        staged: &mut TaskTable,
        cmd: Cmd,
        now: u64,
        change: &mut Change,
        done: &mut Vec<Done>,
    ) {
        let limits = &self.limits;
        match cmd {
            Cmd::Submit {
                sender,
                req_id,
                cap,
                verb,
                args,
                start,
                authority,
                trace,
                reply,
            } => {
                if let Some(id) = staged.by_origin(&sender, &req_id) {
                    let answer = match staged.get(&id) {
                        // Another verb's task is never the answer.
                        Some(e)
                            if (e.record.cap != cap || e.record.verb != verb)
                                && !crate::seeded_bugs::planted(
                                    crate::seeded_bugs::Bug::TasksKeyedWithoutVerb,
                                ) =>
                        {
                            Err(ErrorBody::new(
                                ErrorCode::Duplicate,
                                "this req_id was used for another verb",
                            ))
                        }
                        e => Ok(TaskSubmitted {
                            task: id.to_string(),
                            state: e.map_or(TaskState::Submitted, |e| e.record.state),
                        }),
                    };
                    done.push(Done::Reply(reply, answer));
                    return;
                }
                if args.len() > limits.max_body {
                    let e = ErrorBody::new(
                        ErrorCode::TooLarge,
                        format!("a task's args are at most {} bytes", limits.max_body),
                    );
                    done.push(Done::Reply(reply, Err(e)));
                    return;
                }
                let id = match TaskId::random() {
                    Ok(id) => id,
                    Err(e) => {
                        done.push(Done::Reply(reply, Err(e)));
                        return;
                    }
                };
                let kept = authority.as_ref().map(|a| task_authority(a.basis()));
                let priority = self.priority();
                let stored = trace.as_ref().map(|t| TaskTrace {
                    traceparent: t.traceparent(),
                    tracestate: t.tracestate().map(str::to_owned),
                });
                match staged.submit(
                    limits, id, sender, &req_id, &cap, &verb, args, kept, stored, &priority, now,
                    change,
                ) {
                    Ok(_) => {
                        done.push(Done::Reply(
                            reply,
                            Ok(TaskSubmitted {
                                task: id.to_string(),
                                state: TaskState::Submitted,
                            }),
                        ));
                        let traced = Traced { cap, verb, trace };
                        done.push(Done::Run(id, start, false, authority, traced));
                    }
                    Err(e) => done.push(Done::Reply(reply, Err(e))),
                }
            }
            Cmd::Append {
                id,
                kind,
                state,
                body,
                error,
                reply,
            } => {
                if body.len() > limits.max_body {
                    let e = ErrorBody::new(
                        ErrorCode::TooLarge,
                        format!("a task event's body is at most {} bytes", limits.max_body),
                    );
                    done.push(Done::Seq(reply, Err(e)));
                    return;
                }
                let r = staged
                    .append(limits, &id, kind, state, body, error, now, change)
                    .map(|r| r.seq)
                    .ok_or_else(gone);
                done.push(Done::Seq(reply, r));
            }
            Cmd::Respond {
                id,
                question_seq,
                answer,
                reply,
            } => {
                let Some(e) = staged.get(&id) else {
                    done.push(Done::Unit(reply, Err(not_found())));
                    return;
                };
                let waits = e.record.question_seq;
                if e.record.state != TaskState::InputRequired || waits.is_none() {
                    let e = ErrorBody::new(ErrorCode::Conflict, "the task waits on no question");
                    done.push(Done::Unit(reply, Err(e)));
                    return;
                }
                if question_seq.is_some() && question_seq != waits {
                    let e = ErrorBody::new(
                        ErrorCode::Conflict,
                        format!(
                            "the task waits on the question of event {}",
                            waits.unwrap_or(0)
                        ),
                    );
                    done.push(Done::Unit(reply, Err(e)));
                    return;
                }
                if answer.len() > limits.max_body {
                    let e = ErrorBody::new(
                        ErrorCode::TooLarge,
                        format!("an answer is at most {} bytes", limits.max_body),
                    );
                    done.push(Done::Unit(reply, Err(e)));
                    return;
                }
                let value = RawValue::from_slice(&answer).unwrap_or_else(|_| RawValue::null());
                // An answer the handler could not take is refused before it
                // is written: the question still waits for one it can.
                let fits = lock(&self.runs).get(&id).and_then(|r| r.fits);
                if let Some(Err(e)) = fits.map(|fits| fits(&value)) {
                    let e = ErrorBody::new(
                        ErrorCode::BadArgs,
                        format!("the answer does not fit the question: {e}"),
                    );
                    done.push(Done::Unit(reply, Err(e)));
                    return;
                }
                let r = staged
                    .append(
                        limits,
                        &id,
                        TaskEventKind::Answer,
                        TaskState::Working,
                        answer,
                        None,
                        now,
                        change,
                    )
                    .map(|record| record.seq)
                    .ok_or_else(gone);
                if let Ok(seq) = r {
                    done.push(Done::Answer(id, value, seq));
                }
                done.push(Done::Unit(reply, r.map(drop)));
            }
            Cmd::Cancel { id, by, reply } => {
                let Some(e) = staged.get(&id) else {
                    done.push(Done::Unit(reply, Err(not_found())));
                    return;
                };
                if e.record.state.is_final() {
                    done.push(Done::Unit(reply, Ok(())));
                    return;
                }
                let who = if by == e.record.submitter {
                    "its submitter"
                } else {
                    "the node's control plane"
                };
                let error = ErrorBody::new(ErrorCode::Cancelled, format!("cancelled by {who}"));
                let body = capwire_envelope::to_vec(&error).unwrap_or_else(|_| null());
                staged.append(
                    limits,
                    &id,
                    TaskEventKind::Error,
                    TaskState::Canceled,
                    body,
                    Some(error),
                    now,
                    change,
                );
                done.push(Done::Stop(id));
                done.push(Done::Unit(reply, Ok(())));
            }
            Cmd::Unask {
                id,
                question_seq,
                reply,
            } => {
                let waits = staged.get(&id).is_some_and(|e| {
                    e.record.state == TaskState::InputRequired
                        && e.record.question_seq == Some(question_seq)
                });
                if !waits {
                    done.push(Done::Flag(reply, Ok(false)));
                    return;
                }
                let body = capwire_envelope::to_vec("no answer in time").unwrap_or_else(|_| null());
                let r = staged
                    .append(
                        limits,
                        &id,
                        TaskEventKind::State,
                        TaskState::Working,
                        body,
                        None,
                        now,
                        change,
                    )
                    .map(|_| true)
                    .ok_or_else(gone);
                done.push(Done::Flag(reply, r));
            }
            Cmd::Expire => {
                staged.expire(limits, now, EXPIRE_ROUND, change);
            }
        }
    }

    /// After a round is written: subscribers wake, the control plane is
    /// told of state changes, deleted tasks are forgotten.
    fn publish(&self, change: &Change) {
        self.events_written
            .fetch_add(change.changed.len() as u64, Ordering::Relaxed);
        let watchers = lock(&self.watchers);
        for (id, _, _, _) in &change.changed {
            if let Some(w) = watchers.get(id) {
                w.notify_waiters();
            }
        }
        drop(watchers);
        let epoch = self.binding.snapshot().epoch();
        let published = lock(&self.published);
        let mut pushes = lock(&self.pushes);
        let mut queued = false;
        for (id, state, seq, kind) in &change.changed {
            let Some(e) = published.get(id) else {
                continue;
            };
            // Progress is not a change of state; every other event is
            // (an answer takes the task back to `working`).
            if *kind == TaskEventKind::Progress {
                continue;
            }
            let task = id.to_string();
            let mut entry = Entry::new(Kind::Task);
            entry.cap = Some(&e.record.cap);
            entry.peer = Some(&e.record.submitter);
            entry.verb = Some(&e.record.verb);
            entry.detail = Some(&task);
            entry.outcome = Some(state.as_str());
            self.audit.record(&entry);
            if pushes.queue.len() >= PUSH_QUEUE {
                pushes.queue.pop_front();
                pushes.missed(epoch, 1);
                self.pushes_dropped.fetch_add(1, Ordering::Relaxed);
            }
            pushes.queue.push_back(TaskChanged {
                task: id.to_string(),
                cap: e.record.cap.clone(),
                verb: e.record.verb.clone(),
                submitter: e.record.submitter,
                state: *state,
                seq: *seq,
                at_ms: e.record.updated_ms,
                dropped: 0,
            });
            queued = true;
        }
        drop(pushes);
        drop(published);
        if queued {
            self.push_ready.notify_one();
        }
        if !change.batch.del_tasks.is_empty() {
            let mut watchers = lock(&self.watchers);
            for id in &change.batch.del_tasks {
                if let Some(id) = TaskId::from_slice(id) {
                    watchers.remove(&id);
                }
            }
        }
    }

    /// Starts the handler of task `id`, which runs while `authority`
    /// (if any) holds.
    fn spawn(
        self: &Arc<Self>,
        id: TaskId,
        start: Start,
        resumed: bool,
        authority: Option<Arc<Authority>>,
        traced: Traced,
    ) {
        let me = self.clone();
        let cancel = self.stopping.child_token();
        lock(&self.runs).insert(
            id,
            Run {
                cancel: cancel.clone(),
                answer: None,
                fits: None,
            },
        );
        let task = task::Task::new(id, me.clone(), cancel.clone(), resumed);
        let future = start(task);
        // The handler runs in the trace of its submit: in a span whose
        // parent is the submit's context, with that context as the one it
        // was called with.
        let span = crate::trace::task_span(
            &traced.cap,
            &traced.verb,
            &id.to_string(),
            traced.trace.as_ref(),
        );
        let future = match traced.trace {
            Some(cx) => Box::pin(crate::trace::scope(cx, future)) as BoxFuture<_>,
            None => future,
        };
        let stopping = self.stopping.clone();
        let in_span = span.clone();
        if resumed {
            // Its `state` event ("resumed") was written before it ran.
            crate::trace::mark(&span, "resumed");
        }
        let runner = async move {
            if !resumed {
                let _ = me
                    .append(id, TaskEventKind::State, TaskState::Working, null(), None)
                    .await;
            }
            let lost = async {
                match &authority {
                    Some(a) => a.lost().await,
                    None => std::future::pending().await,
                }
            };
            let out = tokio::select! {
                biased;
                () = cancel.cancelled() => None,
                // Admitted by a binding or a grant that has ended: the
                // handler stops, and the task fails.
                why = lost, if authority.is_some() => {
                    cancel.cancel();
                    Some(Err(ended_authority(&why)))
                }
                r = std::panic::AssertUnwindSafe(future).catch_unwind() => Some(match r {
                    Ok(r) => r,
                    Err(panic) => {
                        let message = crate::error::panic_message(panic.as_ref());
                        tracing::warn!(task = %id, %message, "a task's handler panicked");
                        Err(ErrorBody::new(ErrorCode::Internal, "the handler panicked"))
                    }
                }),
            };
            lock(&me.runs).remove(&id);
            // Stopped with the node: nothing is written (it is resumed or
            // failed when the node starts again); cancelled: the cancel
            // wrote its event.
            let Some(out) = out else {
                // Cancelled (its event is written by the cancel), or
                // stopped with the node (resumed or failed at the next
                // start).
                let why = if stopping.is_cancelled() {
                    "node_stopped"
                } else {
                    "cancelled"
                };
                crate::trace::record_end(&in_span, why, false);
                return;
            };
            if stopping.is_cancelled() {
                return;
            }
            let (kind, state, body, error) = match out {
                Ok(v) => (
                    TaskEventKind::Result,
                    TaskState::Completed,
                    v.into_bytes().to_vec(),
                    None,
                ),
                // A handler that gives up with `cancelled` cancels its
                // task, with its own words.
                Err(e) if e.code == ErrorCode::Cancelled => (
                    TaskEventKind::Error,
                    TaskState::Canceled,
                    capwire_envelope::to_vec(&e).unwrap_or_else(|_| null()),
                    Some(e),
                ),
                Err(e) => (
                    TaskEventKind::Error,
                    TaskState::Failed,
                    capwire_envelope::to_vec(&e).unwrap_or_else(|_| null()),
                    Some(e),
                ),
            };
            let what = if kind == TaskEventKind::Result {
                "result"
            } else {
                "error"
            };
            match &error {
                None => crate::trace::record_end(&in_span, "ok", true),
                Some(e) => crate::trace::record_end(&in_span, e.code.as_str(), false),
            }
            let ended = match me.append(id, kind, state, body, error).await {
                // A result (or an error's detail) over `max_task_body` is
                // not kept, but the task still ends: failed, `too_large`.
                Err(e) if e.code == ErrorCode::TooLarge => {
                    let e = ErrorBody::new(
                        ErrorCode::TooLarge,
                        format!("the task's {what} is not kept: {}", e.message),
                    );
                    let body = capwire_envelope::to_vec(&e).unwrap_or_else(|_| null());
                    me.append(id, TaskEventKind::Error, TaskState::Failed, body, Some(e))
                        .await
                }
                other => other,
            };
            if let Err(e) = ended
                && e.code != ErrorCode::Cancelled
            {
                tracing::warn!(task = %id, error = %e, "a task's end was not written");
            }
        };
        self.runners.spawn(runner.instrument(span));
    }

    /// After a restart: each task that had not ended is resumed when its
    /// verb has a resume handler, and `failed` (`interrupted`) otherwise.
    async fn restart(self: &Arc<Self>, staged: &mut TaskTable) {
        let unfinished = staged.unfinished();
        if unfinished.is_empty() {
            return;
        }
        let mut change = Change::default();
        let mut done = Vec::new();
        let now = unix_ms();
        for id in unfinished {
            let Some(record) = staged.get(&id).map(|e| e.record.clone()) else {
                continue;
            };
            // A task of a controller verb goes on only under the binding
            // it was submitted under (tokens are not kept over a restart).
            let authority = match &record.authority {
                None => Ok(None),
                Some(TaskAuthority { grant: true, .. }) => Err(ErrorBody::new(
                    ErrorCode::Unauthorized,
                    "the node restarted, and the grant the task ran under is not kept over a restart",
                )),
                Some(TaskAuthority {
                    epoch,
                    grant: false,
                }) => {
                    let held = self
                        .authorities
                        .hold(record.submitter, Basis::Binding { epoch: *epoch });
                    held.check()
                        .map(|()| Some(held))
                        .map_err(|why| ended_authority(&why))
                }
            };
            let authority = match authority {
                Ok(a) => a,
                Err(error) => {
                    let body = capwire_envelope::to_vec(&error).unwrap_or_else(|_| null());
                    staged.append(
                        &self.limits,
                        &id,
                        TaskEventKind::Error,
                        TaskState::Failed,
                        body,
                        Some(error),
                        now,
                        &mut change,
                    );
                    continue;
                }
            };
            // A task whose handler never started starts now, as it would
            // have; one that ran is resumed or failed.
            let fresh = record.state == TaskState::Submitted;
            let start = match (self.resumer.get(), self.args(id).await) {
                (Some(r), Ok(args)) => r.resume(
                    &record.cap,
                    &record.verb,
                    record.submitter,
                    &record.req_id,
                    args,
                    fresh,
                ),
                _ => None,
            };
            let traced = Traced {
                cap: record.cap.clone(),
                verb: record.verb.clone(),
                trace: record.trace.as_ref().and_then(|t| {
                    TraceContext::parse(&t.traceparent, t.tracestate.as_deref()).ok()
                }),
            };
            match start {
                Some(start) if fresh => done.push(Done::Run(id, start, false, authority, traced)),
                Some(start) => {
                    let body = capwire_envelope::to_vec("resumed").unwrap_or_else(|_| null());
                    staged.append(
                        &self.limits,
                        &id,
                        TaskEventKind::State,
                        TaskState::Working,
                        body,
                        None,
                        now,
                        &mut change,
                    );
                    done.push(Done::Run(id, start, true, authority, traced));
                }
                None => {
                    let error = ErrorBody::new(
                        ErrorCode::app("interrupted").unwrap_or(ErrorCode::Internal),
                        "the node restarted while the task ran, and its verb cannot resume it",
                    );
                    let body = capwire_envelope::to_vec(&error).unwrap_or_else(|_| null());
                    staged.append(
                        &self.limits,
                        &id,
                        TaskEventKind::Error,
                        TaskState::Failed,
                        body,
                        Some(error),
                        now,
                        &mut change,
                    );
                }
            }
        }
        self.write(staged, change, done).await;
    }
}
