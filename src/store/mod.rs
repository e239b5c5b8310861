//! Durable node state: identity, contacts, binding, configuration, the
//! cluster roster and the remembered answers of state-changing controller
//! requests.
//!
//! The store is a durable mirror of state the node keeps in memory: the
//! node decides every change in memory (under the lock of the part that
//! changes), writes it as one [`Batch`] (atomically, synced to disk before
//! [`Store::commit`] returns), and only then makes it visible and answers.
//! A batch carries the answer of the request that caused it, so a change
//! and its answer are durable together or not at all.
//!
//! [`Store`] is blocking: the runtime calls it off the async executor.

pub(crate) mod dir;
pub(crate) mod memory;
pub(crate) mod records;
pub(crate) mod redb;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use capwire_envelope::NodeId;

pub(crate) use records::{
    AnswerKey, AnswerRecord, BindingRecord, ConfigRecord, ContactRecord, MemberRecord,
    RevocationEntry, RevocationsRecord, RosterMeta, TaskAuthority, TaskEventRecord, TaskRecord,
    TaskTrace,
};

/// Everything a store holds, read once when the node starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub(crate) binding: Option<BindingRecord>,
    pub(crate) config: Option<ConfigRecord>,
    pub(crate) contacts: Vec<ContactRecord>,
    pub(crate) roster: RosterMeta,
    pub(crate) members: Vec<MemberRecord>,
    pub(crate) answers: Vec<AnswerRecord>,
    /// Tasks, without their events (read on demand: [`Store::task_events`]).
    pub(crate) tasks: Vec<TaskRecord>,
    /// The revocations of grants.
    pub(crate) revocations: Option<RevocationsRecord>,
    /// The latest date (ms since the Unix epoch) the node's clock gave
    /// for what expires by date, as last written: its clock never reads
    /// earlier after a restart.
    pub(crate) clock_floor_ms: Option<u64>,
}

/// One atomic change to the store. Puts replace the record with the same
/// key; deletes of absent keys are no-ops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(crate) binding: Option<BindingRecord>,
    pub(crate) config: Option<ConfigRecord>,
    pub(crate) put_contacts: Vec<ContactRecord>,
    pub(crate) del_contacts: Vec<NodeId>,
    pub(crate) roster: Option<RosterMeta>,
    pub(crate) put_members: Vec<MemberRecord>,
    pub(crate) del_members: Vec<String>,
    pub(crate) put_answers: Vec<AnswerRecord>,
    pub(crate) del_answers: Vec<AnswerKey>,
    pub(crate) put_tasks: Vec<TaskRecord>,
    /// The args of new tasks, by id (kept for a resume).
    pub(crate) put_task_args: Vec<(Vec<u8>, Vec<u8>)>,
    /// Tasks deleted with their args and all their events.
    pub(crate) del_tasks: Vec<Vec<u8>>,
    /// Events, each with its task's id.
    pub(crate) put_task_events: Vec<(Vec<u8>, TaskEventRecord)>,
    /// Events of a task folded away: (id, from, to) deletes those with
    /// `from <= seq < to`. Applied after the batch's puts of events.
    pub(crate) fold_task_events: Vec<(Vec<u8>, u64, u64)>,
    /// The revocations, replaced whole.
    pub(crate) revocations: Option<RevocationsRecord>,
    /// The clock's floor, replaced (its one writer only raises it).
    pub(crate) clock_floor_ms: Option<u64>,
}

impl Batch {
    /// `true` when the batch changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self == &Batch::default()
    }
}

/// A durable store.
pub(crate) trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Reads everything.
    ///
    /// # Errors
    /// The store cannot be read or holds a record that does not decode.
    fn load(&self) -> Result<Loaded, StoreError>;

    /// Applies `batch` atomically; when it returns `Ok`, the batch is on
    /// disk (fsync'd). On `Err` nothing of the batch was applied.
    ///
    /// # Errors
    /// The write failed.
    fn commit(&self, batch: &Batch) -> Result<(), StoreError>;

    /// The events of task `id` from seq `from` on, at most `limit`, in
    /// order.
    ///
    /// # Errors
    /// The store cannot be read or holds a record that does not decode.
    fn task_events(
        &self,
        id: &[u8],
        from: u64,
        limit: usize,
    ) -> Result<Vec<TaskEventRecord>, StoreError>;

    /// The args task `id` was submitted with.
    ///
    /// # Errors
    /// The store cannot be read.
    fn task_args(&self, id: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
}

/// Why a state directory or its store could not be used. Nothing is ever
/// replaced or repaired silently: each of these leaves the files as they
/// were.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The state path exists and is not a directory.
    #[error("state path {0} is not a directory")]
    NotADirectory(PathBuf),
    /// The state directory is not this user's alone: another user owns
    /// it, or its mode lets group or others in. The message names the
    /// fix (`chmod 700 DIR`, or the owner to run as).
    #[error("state directory {path} is not private: {detail}")]
    NotPrivate {
        /// The state directory.
        path: PathBuf,
        /// What is wrong, and the command that fixes it.
        detail: String,
    },
    /// The state directory or a file in it cannot be read or written.
    #[error("state directory {path}: permission denied: {source}")]
    Permission {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Another process (or another node in this one) has the state
    /// directory open.
    #[error("state directory {0} is in use by another node")]
    Locked(PathBuf),
    /// A file in the state directory is damaged.
    #[error("state file {path} is corrupt: {detail}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A file in the state directory is not a capwire store, or one of
    /// another format version.
    #[error("state file {path} is not a capwire store of this version: {detail}")]
    Foreign {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// The identity key does not match the store (or is missing while the
    /// store exists).
    #[error("identity mismatch in {path}: {detail}")]
    Identity {
        /// The state directory.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
    /// Any other I/O error.
    #[error("state i/o on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A write to the store failed.
    #[error("state write failed: {0}")]
    Write(String),
}
