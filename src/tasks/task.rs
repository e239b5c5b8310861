//! A running task as its handler sees it ([`Task`]): its id, whether it
//! was resumed, and what it may do (report progress, ask its submitter,
//! see a cancel), each written through the task service before it
//! returns. The caller's side is in `client/task.rs`; the public module
//! is [`crate::task`].

use std::time::Duration;

use capwire_envelope::{ErrorBody, ErrorCode, RawValue};
use capwire_manifest::{TaskEvent, TaskEventKind, TaskState};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

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
        let fits: super::AnswerCheck = |v| v.decode::<A>().map(drop).map_err(|e| e.to_string());
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
        let (answer, seq) = answer;
        // The answer is an event of the task's trace.
        crate::trace::event_here("answer", seq);
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
