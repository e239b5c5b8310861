//! `core.tasks` (protocol 2): long-running work submitted through a task
//! verb, kept durably with its log of events, watched, answered and
//! cancelled by its submitter and the node's control plane.

use std::fmt;

use capwire_envelope::{ErrorBody, NodeId, RawValue};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::verb;

/// The id of the tasks capability.
pub const CORE_TASKS: &str = "core.tasks";

/// Where a task is in its life.
///
/// ```text
///  submitted ─► working ⇄ input_required
///      │           │
///      │           ├─► completed   (the handler's result)
///      │           ├─► failed      (the handler's error, or `interrupted`)
///      └───────────┴─► canceled    (cancelled by the submitter or the control plane)
///  rejected: refused after it was submitted (the node could not run it)
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Accepted and written; its handler has not started yet.
    Submitted,
    /// Its handler runs.
    Working,
    /// Its handler waits for an answer to its question (`respond`).
    InputRequired,
    /// Finished with a result.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled before it finished.
    Canceled,
    /// Refused after it was submitted.
    Rejected,
}

impl TaskState {
    /// Every state.
    pub const ALL: [TaskState; 7] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::Rejected,
    ];

    /// The wire text.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Rejected => "rejected",
        }
    }

    /// A final state: nothing happens to the task any more.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a task event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskEventKind {
    /// The state changed (`body` is `null`, or a word on why: `"resumed"`).
    State,
    /// The handler reported progress (`body` is what it reported).
    Progress,
    /// The handler asked a question (`body`); the state is `input_required`.
    Question,
    /// The question was answered (`body` is the answer).
    Answer,
    /// The task completed (`body` is its result).
    Result,
    /// The task failed, was cancelled or rejected (`body` is the error map
    /// `{code, message, detail?}`).
    Error,
}

impl TaskEventKind {
    /// Its name on the wire: `state`, `progress`, `question`, `answer`,
    /// `result`, `error`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::State => "state",
            Self::Progress => "progress",
            Self::Question => "question",
            Self::Answer => "answer",
            Self::Result => "result",
            Self::Error => "error",
        }
    }
}

/// One event of a task's log. Events are numbered from 1 in the order
/// they happened, and every event says the task's state after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskEvent {
    /// Its number in the task's log, from 1, without gaps.
    pub seq: u64,
    /// When it happened, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The task's state after it.
    pub state: TaskState,
    /// What it records.
    pub kind: TaskEventKind,
    /// Its content (see [`TaskEventKind`]).
    #[schemars(with = "serde_json::Value")]
    pub body: RawValue,
}

/// The answer to submitting a task verb: the task's id, at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskSubmitted {
    /// The task's id: 32 lowercase hex digits, 128 random bits.
    pub task: String,
    /// Its state when the answer was made.
    pub state: TaskState,
}

/// What is known about a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskInfo {
    /// Its id.
    pub task: String,
    /// The capability of the task verb it was submitted to.
    pub cap: String,
    /// The task verb.
    pub verb: String,
    /// Its state now.
    pub state: TaskState,
    /// When it was submitted, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When its last event happened.
    pub updated_ms: u64,
    /// The number of its last event.
    pub seq: u64,
    /// The number of the oldest event still kept (older progress events
    /// are folded away past the task's bounds; 1 when none were).
    pub first_seq: u64,
    /// The last progress it reported, or `null`.
    #[schemars(with = "serde_json::Value")]
    pub progress: RawValue,
    /// The question it waits on while `input_required` (else `null`), and
    /// the `seq` of the event that asked it.
    #[schemars(with = "serde_json::Value")]
    pub question: RawValue,
    /// The seq of the question event it waits on, if any.
    pub question_seq: Option<u64>,
    /// Its result once `completed` (else `null`).
    #[schemars(with = "serde_json::Value")]
    pub result: RawValue,
    /// Its error once `failed`, `canceled` or `rejected`.
    #[schemars(with = "Option<serde_json::Value>")]
    pub error: Option<ErrorBody>,
}

/// Names one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRef {
    /// The task's id.
    pub task: String,
}

/// Args of `core.tasks/list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasksArgs {
    /// Only tasks in this state.
    #[serde(default)]
    pub state: Option<TaskState>,
    /// Only tasks of this capability.
    #[serde(default)]
    pub cap: Option<String>,
    /// Only tasks of this verb.
    #[serde(default)]
    pub verb: Option<String>,
    /// Only tasks submitted before this one (the `next` of the previous
    /// page).
    #[serde(default)]
    pub before: Option<String>,
    /// At most this many (default 50, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Result of `core.tasks/list`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskList {
    /// The page.
    pub tasks: Vec<TaskInfo>,
    /// Where the next page starts (`before`), or `null` at the end.
    pub next: Option<String>,
}

/// Args of `core.tasks/subscribe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscribeArgs {
    /// The task's id.
    pub task: String,
    /// The first event wanted (the last one seen, plus 1); absent: from
    /// the first.
    #[serde(default)]
    pub from: Option<u64>,
}

/// Args of `core.tasks/respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RespondArgs {
    /// The task's id.
    pub task: String,
    /// The answer to its question.
    #[schemars(with = "serde_json::Value")]
    pub answer: RawValue,
    /// The seq of the question answered: an answer to another (older)
    /// question is refused with `conflict`. Absent: the question it waits
    /// on now.
    #[serde(default)]
    pub question_seq: Option<u64>,
}

/// A change of a task's state, pushed to the node's control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskChanged {
    /// The task's id.
    pub task: String,
    /// Its task verb.
    pub cap: String,
    /// Its task verb.
    pub verb: String,
    /// Who submitted it.
    #[schemars(with = "String")]
    pub submitter: NodeId,
    /// Its state now.
    pub state: TaskState,
    /// The event that changed it.
    pub seq: u64,
    /// When.
    pub at_ms: u64,
    /// Changes not pushed since the previous push (the queue was full).
    pub dropped: u64,
}

verb! {
    /// `core.tasks/get`: what is known about a task.
    pub struct TasksGet: request "core.tasks" / "get", Bootstrap, TaskRef => TaskInfo;
}
verb! {
    /// `core.tasks/list`: the tasks the caller may see, newest first.
    pub struct TasksList: request "core.tasks" / "list", Bootstrap, ListTasksArgs => TaskList;
}
verb! {
    /// `core.tasks/subscribe` (stream): a task's events from `from`, then
    /// live, until its final event.
    pub struct TasksSubscribe: stream "core.tasks" / "subscribe", Bootstrap, SubscribeArgs => TaskEvent;
}
verb! {
    /// `core.tasks/cancel`: cancels a task that has not finished.
    pub struct TasksCancel: request "core.tasks" / "cancel", Bootstrap, TaskRef => TaskInfo;
}
verb! {
    /// `core.tasks/respond`: answers the question a task waits on.
    pub struct TasksRespond: request "core.tasks" / "respond", Bootstrap, RespondArgs => TaskInfo;
}
verb! {
    /// `core.tasks/changed`: a task's state changed (pushed to the control
    /// plane).
    pub struct TasksChanged: notification "core.tasks" / "changed", Bootstrap, TaskChanged;
}
