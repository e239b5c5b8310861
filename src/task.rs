//! Tasks (protocol 2): long-running work that outlives the request and the
//! session that started it, durably.
//!
//! A task verb is declared with `verb!` and the kind `task`; submitting it
//! answers at once with a task id, and its handler then runs on the node,
//! with a [`Task`] to report progress, to ask its submitter for input, and
//! to see whether it was cancelled. Its result (or error) ends it. Every
//! event is written before the handler goes on, and `core.tasks` lets the
//! submitter and the node's control plane get, list, subscribe to, answer
//! and cancel it (WIRE.md 4.10):
//!
//! ```
//! use std::time::Duration;
//! use capwire::manifest::verb;
//! use capwire::{Capability, HandlerError, Node, Task};
//! # use capwire::manifest::TaskState;
//!
//! verb! {
//!     /// Counts to the number asked for, asking first whether to.
//!     struct Count: task "app.work" / "count", Bootstrap, u32 => u32;
//! }
//!
//! async fn count(to: u32, task: Task) -> Result<u32, HandlerError> {
//!     let go: bool = task.ask(&format!("count to {to}?"), Duration::from_secs(60)).await?;
//!     if !go {
//!         return Err(HandlerError::app("declined", "not counting").unwrap());
//!     }
//!     for n in 1..=to {
//!         task.progress(&n).await?; // durable before it returns
//!     }
//!     Ok(to)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Node::builder("worker")
//!     .listen("127.0.0.1:0".parse()?)
//!     .capability(Capability::new("app.work", "1.0.0")?.task(Count, count))
//!     .start()
//!     .await?;
//! let client = Node::builder("client").start().await?;
//! let peer = client.connect(&worker.local_addrs()[0], Some(worker.id())).await?;
//!
//! let task = peer.submit(Count, 3).await?; // the task's id, at once
//! let mut events = task.events(1).await?;
//! while let Some(event) = events.next().await {
//!     let event = event?;
//!     if event.state == TaskState::InputRequired {
//!         task.respond(&true).await?;
//!     }
//! }
//! assert_eq!(task.result().await?, 3);
//! # client.shutdown().await;
//! # worker.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! **Why a kind of its own.** A task is answered by an id, not by its
//! result, and its handler takes a [`Task`] and outlives the request: a
//! request verb run as a task would look like a request in the manifest
//! while answering otherwise, and its handler's shape would not say that it
//! can be resumed, asked for input or watched. The `task` kind says all of
//! it, to callers and to tools that read the manifest.

use std::time::Duration;

use capwire_envelope::{ErrorBody, ErrorCode, RawValue};
use capwire_manifest::{
    RespondArgs, SubscribeArgs, TaskEvent, TaskEventKind, TaskInfo, TaskRef, TaskState,
    TasksCancel, TasksGet, TasksRespond, TasksSubscribe,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::dispatch::error::HandlerError;
use crate::error::CallError;
use crate::stream::ItemStream;
use crate::tasks::{TaskId, TaskService, wire_event};

/// Why a task's handler cannot go on: return (with `?`, the error becomes
/// the task's end, if it has not ended already).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The task was cancelled, or has ended, or the node is stopping.
    #[error("the task has ended")]
    Ended,
    /// No answer came within the time the handler gave its question.
    #[error("no answer within the time given")]
    NoAnswer,
    /// The answer does not fit the type the handler asked for.
    #[error("the answer does not fit: {0}")]
    BadAnswer(String),
    /// The event's body is larger than a task event may be
    /// ([`Limits::max_task_body`](crate::Limits)).
    #[error("the event is too large")]
    TooLarge,
    /// The value has no encoding in the strict CBOR profile.
    #[error("the value could not be encoded: {0}")]
    Encode(String),
    /// The node could not write the event.
    #[error("the task could not be written: {0}")]
    Store(String),
}

impl From<TaskError> for HandlerError {
    fn from(e: TaskError) -> Self {
        let code = match e {
            TaskError::Ended => ErrorCode::Cancelled,
            TaskError::NoAnswer => ErrorCode::Timeout,
            TaskError::BadAnswer(_) => ErrorCode::BadArgs,
            TaskError::TooLarge => ErrorCode::TooLarge,
            TaskError::Encode(_) | TaskError::Store(_) => ErrorCode::Internal,
        };
        HandlerError::new(code, e.to_string())
    }
}

fn from_body(e: &ErrorBody) -> TaskError {
    match e.code {
        ErrorCode::TooLarge => TaskError::TooLarge,
        ErrorCode::Internal => TaskError::Store(e.message.clone()),
        _ => TaskError::Ended,
    }
}

/// A running task, as its handler sees it: its id, whether it was resumed
/// after a restart, and what it may do (report progress, ask for input).
/// Cheap to clone; every clone is the same task.
#[derive(Clone)]
pub struct Task {
    id: TaskId,
    service: std::sync::Arc<TaskService>,
    cancel: CancellationToken,
    resumed: bool,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.id)
            .field("resumed", &self.resumed)
            .finish_non_exhaustive()
    }
}

impl Task {
    pub(crate) fn new(
        id: TaskId,
        service: std::sync::Arc<TaskService>,
        cancel: CancellationToken,
        resumed: bool,
    ) -> Self {
        Self {
            id,
            service,
            cancel,
            resumed,
        }
    }

    /// Fires when the task is cancelled or the node stops.
    pub(crate) fn token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The task's id, as `core.tasks` names it.
    pub fn id(&self) -> String {
        self.id.to_string()
    }

    /// `true` when this run is a resume after the node restarted (its
    /// events so far are in [`Task::events`]).
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// Reports progress: a `progress` event with `value`, written before
    /// this returns.
    ///
    /// # Errors
    /// [`TaskError`]: the task has ended, the value is too large or does
    /// not encode, or it could not be written.
    ///
    /// # Cancel safety
    /// Dropped before it returns, the event may or may not be written.
    pub async fn progress<P: Serialize + ?Sized>(&self, value: &P) -> Result<(), TaskError> {
        let body = capwire_envelope::to_vec(value).map_err(|e| TaskError::Encode(e.to_string()))?;
        self.service
            .append(
                self.id,
                TaskEventKind::Progress,
                TaskState::Working,
                body,
                None,
            )
            .await
            .map(drop)
            .map_err(|e| from_body(&e))
    }

    /// Asks the task's submitter (or the node's control plane) a question
    /// and waits, at most `within`, for the answer given with
    /// `core.tasks/respond`. Meanwhile the task is `input_required`; with
    /// no answer in time it goes back to `working` and this returns
    /// [`TaskError::NoAnswer`].
    ///
    /// # Errors
    /// [`TaskError`]: no answer in time, an answer of another type, the
    /// task ended meanwhile, or the question could not be written.
    pub async fn ask<Q: Serialize + ?Sized, A: DeserializeOwned>(
        &self,
        question: &Q,
        within: Duration,
    ) -> Result<A, TaskError> {
        let body =
            capwire_envelope::to_vec(question).map_err(|e| TaskError::Encode(e.to_string()))?;
        let fits: crate::tasks::AnswerCheck =
            |v| v.decode::<A>().map(drop).map_err(|e| e.to_string());
        let mut answer = self.service.answer_slot(self.id, fits);
        let asked = self
            .service
            .append(
                self.id,
                TaskEventKind::Question,
                TaskState::InputRequired,
                body,
                None,
            )
            .await
            .map_err(|e| from_body(&e))?;
        let answer = tokio::select! {
            a = &mut answer => a.map_err(|_| TaskError::Ended)?,
            () = self.cancel.cancelled() => return Err(TaskError::Ended),
            () = tokio::time::sleep(within) => {
                // Withdrawn only if it still waits: an answer written
                // first is handed over before this is decided, and wins.
                if self.service.unask(self.id, asked).await.map_err(|e| from_body(&e))? {
                    return Err(TaskError::NoAnswer);
                }
                answer.try_recv().map_err(|_| TaskError::Ended)?
            }
        };
        answer
            .decode::<A>()
            .map_err(|e| TaskError::BadAnswer(e.to_string()))
    }

    /// Resolves when the task is cancelled (or the node stops): for a
    /// handler that waits on something else and wants to stop cleanly.
    /// (A cancelled handler's future is dropped anyway.)
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// The task's events from `from` on, as written (those still kept).
    ///
    /// # Errors
    /// [`TaskError::Store`] when they cannot be read.
    pub async fn events(&self, from: u64) -> Result<Vec<TaskEvent>, TaskError> {
        let events = self
            .service
            .events(self.id, from, usize::MAX)
            .await
            .map_err(|e| TaskError::Store(e.message))?;
        Ok(events.into_iter().map(wire_event).collect())
    }
}

/// A task's result item, for the runtime.
pub(crate) fn encode_result<T: Serialize>(value: &T) -> Result<RawValue, ErrorBody> {
    RawValue::encode(value).map_err(|e| {
        ErrorBody::new(
            ErrorCode::Internal,
            format!("the result could not be encoded: {e}"),
        )
    })
}

// ---------------------------------------------------------------------
// The caller's side

/// A task submitted to a peer (or found again by its id): what its
/// submitter, or the peer's control plane, can do with it through
/// `core.tasks`. `T` is the task verb's result type. Cheap to clone.
///
/// Nothing here holds the task open: dropping the handle leaves the task
/// running on the peer, and [`Peer::task`](crate::Peer::task) makes a new
/// handle from the id (after a restart of this node, say).
pub struct TaskHandle<T> {
    peer: crate::Peer,
    id: String,
    _result: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for TaskHandle<T> {
    fn clone(&self) -> Self {
        Self {
            peer: self.peer.clone(),
            id: self.id.clone(),
            _result: std::marker::PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle")
            .field("peer", &self.peer.id())
            .field("id", &self.id)
            .finish()
    }
}

/// The value a task's final event or info says it ended with.
fn outcome<T: DeserializeOwned>(
    state: TaskState,
    result: &RawValue,
    error: Option<ErrorBody>,
) -> Result<T, CallError> {
    match state {
        TaskState::Completed => result
            .decode::<T>()
            .map_err(|e| CallError::BadResult(e.to_string())),
        _ => Err(CallError::from_remote(error.unwrap_or_else(|| {
            ErrorBody::new(ErrorCode::Internal, "the task ended without its error")
        }))),
    }
}

impl<T: DeserializeOwned> TaskHandle<T> {
    pub(crate) fn new(peer: crate::Peer, id: String) -> Self {
        Self {
            peer,
            id,
            _result: std::marker::PhantomData,
        }
    }

    /// The task's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The peer the task runs on.
    pub fn peer(&self) -> &crate::Peer {
        &self.peer
    }

    /// What is known about the task now (`core.tasks/get`).
    ///
    /// # Errors
    /// As [`Peer::request`](crate::Peer::request); `not_found` (a
    /// [`CallError::Remote`]) when the task does not exist, its retention
    /// passed, or this node may not see it.
    pub async fn get(&self) -> Result<TaskInfo, CallError> {
        let task = TaskRef {
            task: self.id.clone(),
        };
        self.peer.request(TasksGet, task).await
    }

    /// The task's events from seq `from` on (1: all that are kept), then
    /// each new one as it happens, until its final event
    /// (`core.tasks/subscribe`). The subscription is opened again from
    /// where it was when the peer ends it for time (a task may be quiet
    /// for longer than a stream may idle), so it lasts as long as the
    /// task. Events the peer deleted before they were taken (a log past
    /// its `max_task_events`) are not given: the `seq` then jumps.
    ///
    /// # Errors
    /// As [`Peer::stream`](crate::Peer::stream), when the subscription
    /// cannot be opened; errors after that (`not_found`, a lost session)
    /// come as the stream's last item.
    pub async fn events(&self, from: u64) -> Result<TaskEvents, CallError> {
        let mut events = TaskEvents {
            peer: self.peer.clone(),
            task: self.id.clone(),
            next: from.max(1),
            inner: None,
            done: false,
        };
        events.open().await?;
        Ok(events)
    }

    /// Answers the question the task waits on (`core.tasks/respond`); the
    /// task's info after the answer was written.
    ///
    /// # Errors
    /// As [`Peer::request`](crate::Peer::request); `conflict` when the
    /// task waits on no question; `bad_args` when `answer` is not of the
    /// type the question asked for (the question still waits);
    /// [`CallError::Encode`] when `answer` does not encode.
    pub async fn respond<A: Serialize + ?Sized>(&self, answer: &A) -> Result<TaskInfo, CallError> {
        self.respond_to(None, answer).await
    }

    /// As [`TaskHandle::respond`], but only if the question the task waits
    /// on is the one of event `question_seq` (`conflict` otherwise): for an
    /// answer given to a question seen earlier, which must not answer a
    /// later one.
    ///
    /// # Errors
    /// As [`TaskHandle::respond`].
    pub async fn respond_to<A: Serialize + ?Sized>(
        &self,
        question_seq: Option<u64>,
        answer: &A,
    ) -> Result<TaskInfo, CallError> {
        let answer = RawValue::encode(answer).map_err(|e| CallError::Encode(e.to_string()))?;
        let args = RespondArgs {
            task: self.id.clone(),
            answer,
            question_seq,
        };
        self.peer.request(TasksRespond, args).await
    }

    /// Cancels the task (`core.tasks/cancel`); its info after the cancel.
    /// A task that has already ended is left as it is.
    ///
    /// # Errors
    /// As [`TaskHandle::get`].
    pub async fn cancel(&self) -> Result<TaskInfo, CallError> {
        let task = TaskRef {
            task: self.id.clone(),
        };
        self.peer.request(TasksCancel, task).await
    }

    /// Waits for the task to end: its result, or the error it ended with
    /// (a [`CallError::Remote`] with the handler's error, or
    /// [`CallError::Cancelled`]).
    ///
    /// # Errors
    /// The task's own error as above; otherwise as [`TaskHandle::events`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it changes nothing on the peer.
    pub async fn result(&self) -> Result<T, CallError> {
        let info = self.get().await?;
        if info.state.is_final() {
            return outcome(info.state, &info.result, info.error);
        }
        let mut events = self.events(info.seq + 1).await?;
        while let Some(event) = events.next().await {
            let event = event?;
            if event.state.is_final() {
                let error = match event.kind {
                    TaskEventKind::Error => event.body.decode::<ErrorBody>().ok(),
                    _ => None,
                };
                return outcome(event.state, &event.body, error);
            }
        }
        // The subscription ended without the final event (the task's
        // retention passed meanwhile, say): ask once more.
        let info = self.get().await?;
        if info.state.is_final() {
            return outcome(info.state, &info.result, info.error);
        }
        Err(CallError::PeerLost)
    }
}

/// A task's events as they happen (see [`TaskHandle::events`]). Ends
/// (`None`) after the task's final event.
pub struct TaskEvents {
    peer: crate::Peer,
    task: String,
    /// The seq of the next event wanted.
    next: u64,
    inner: Option<ItemStream<TaskEvent>>,
    done: bool,
}

impl std::fmt::Debug for TaskEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskEvents")
            .field("task", &self.task)
            .field("next", &self.next)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl TaskEvents {
    async fn open(&mut self) -> Result<(), CallError> {
        let args = SubscribeArgs {
            task: self.task.clone(),
            from: Some(self.next),
        };
        self.inner = Some(self.peer.stream(TasksSubscribe, args).await?);
        Ok(())
    }

    /// The seq of the next event this stream will give.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// The next event; `None` after the final one.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is taken only when it is returned (a
    /// subscription being opened again when it is dropped is simply
    /// opened again on the next call).
    pub async fn next(&mut self) -> Option<Result<TaskEvent, CallError>> {
        loop {
            if self.done {
                return None;
            }
            let Some(inner) = self.inner.as_mut() else {
                if let Err(e) = self.open().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            };
            match inner.next().await {
                Some(Ok(event)) => {
                    self.next = event.seq + 1;
                    self.done = event.state.is_final();
                    return Some(Ok(event));
                }
                // The peer ends a subscription well only after the final
                // event, or when the task had ended before `next`.
                None => {
                    self.done = true;
                    return None;
                }
                // A quiet task, or the peer's bound on one handler's
                // time: open it again from where it was.
                Some(Err(CallError::Idle | CallError::Timeout)) => self.inner = None,
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// The events as a [`Stream`](futures_util::Stream).
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = Result<TaskEvent, CallError>> + Send {
        futures_util::stream::unfold(self, |mut events| async move {
            events.next().await.map(|e| (e, events))
        })
    }
}
