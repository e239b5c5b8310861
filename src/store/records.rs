//! What the store keeps, as plain values. Each record is stored as one
//! item in the strict CBOR profile (`capwire_envelope::to_vec`), so the
//! bytes on disk follow the same rules as the bytes on the wire.

use capwire_envelope::{ErrorBody, NodeId};
use capwire_manifest::{TaskEventKind, TaskState};
use serde::{Deserialize, Serialize};

/// Format of the records below; bumped on any incompatible change. A
/// store written with another format is refused, never rewritten.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// The node's binding to its control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BindingRecord {
    /// The bound control plane (canonical key), if any.
    pub(crate) controller: Option<NodeId>,
    /// The binding epoch: bumped on every bind and unbind, never reused.
    pub(crate) epoch: u64,
    /// The control plane's grant key (`ed25519/` and hex), as the bind
    /// took it from its manifest; absent when it advertised none (and in
    /// records written before grants existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) grant_key: Option<String>,
}

/// The revocations the node was told of (`core.grants/revoke`), each
/// kept while the binding it was made under lasts, or until the token it
/// refuses has expired when the node knows that token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevocationsRecord {
    /// (revocation id, kept until, in milliseconds since the Unix epoch).
    pub(crate) ids: Vec<RevocationEntry>,
    /// The latest date the node had read when it was written, in
    /// milliseconds since the Unix epoch: the node's clock does not go
    /// back past it after a restart (absent in records written before
    /// it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clock_floor_ms: Option<u64>,
}

/// One revocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevocationEntry {
    /// The revocation id.
    #[serde(with = "serde_bytes_compat")]
    pub(crate) id: Vec<u8>,
    /// Forgotten after this time (`u64::MAX` when no token it refuses
    /// is known).
    pub(crate) until_ms: u64,
    /// The binding epoch it was made under (absent in records written
    /// before revocations named it: the binding held then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) epoch: Option<u64>,
}

/// The node's configuration: an opaque CBOR item and its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigRecord {
    /// Bumped on every successful `set_config`; 0 = never set.
    pub(crate) version: u64,
    /// One CBOR data item in the strict profile.
    #[serde(with = "serde_bytes_compat")]
    pub(crate) value: Vec<u8>,
}

/// A durable contact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ContactRecord {
    /// The contact's key (canonical).
    pub(crate) id: NodeId,
    /// A local name.
    pub(crate) name: String,
    /// Where to dial it, in [`crate::Addr`]'s text form.
    pub(crate) addr: String,
}

/// The roster's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RosterMeta {
    /// Bumped on every roster change.
    pub(crate) version: u64,
    /// The number the next child id is made from (ids are never reused).
    pub(crate) next_cid: u64,
}

/// One child node in the roster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MemberRecord {
    /// The child id, unique for the life of the parent.
    pub(crate) cid: String,
    /// Unique among members (pending creates included).
    pub(crate) name: String,
    pub(crate) bio: String,
    pub(crate) persona: String,
    /// `off`, `pending` or `on`.
    pub(crate) monitoring: String,
    /// `pending` (being created), `running`, `exited`, `removing`.
    pub(crate) status: String,
    /// The child's key, once the host has started it.
    pub(crate) node_id: Option<NodeId>,
    /// Where the child listens ([`crate::Addr`] text forms).
    pub(crate) addrs: Vec<String>,
    /// The child's capabilities, as `id@version`.
    pub(crate) caps: Vec<String>,
    /// The request that created it: (sender, req_id), so that the same
    /// request retried after a crash finds its own pending create.
    pub(crate) origin: Option<(NodeId, String)>,
    /// The control plane the child's bind was last opened for (the one
    /// `monitoring` is about).
    #[serde(default)]
    pub(crate) watcher: Option<NodeId>,
    /// Where and how the host runs it (`core.cluster/create_placed`);
    /// absent for a child made with the host's defaults (and in records
    /// written before placements existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) placement: Option<capwire_manifest::Placement>,
}

/// A task (`core.tasks`): what is kept of it besides its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskRecord {
    /// Its id: 16 random bytes (32 hex digits on the wire).
    #[serde(with = "serde_bytes_compat")]
    pub(crate) id: Vec<u8>,
    /// The task verb it was submitted to.
    pub(crate) cap: String,
    pub(crate) verb: String,
    /// Who submitted it, and the submit's req_id: the same request again
    /// finds this task (exactly once per sender and req_id).
    pub(crate) submitter: NodeId,
    pub(crate) req_id: String,
    pub(crate) state: TaskState,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    /// The number of its last event, and of the oldest kept.
    pub(crate) seq: u64,
    pub(crate) first_seq: u64,
    /// Its place in the order of submissions on this node.
    pub(crate) order: u64,
    /// The seq of the question it waits on.
    pub(crate) question_seq: Option<u64>,
    /// The seq of its last progress event.
    pub(crate) progress_seq: Option<u64>,
    /// Its error once it failed, was cancelled or rejected.
    pub(crate) error: Option<ErrorBody>,
    /// For a task of a controller verb: the authority it was admitted
    /// on, which it runs under (absent for a bootstrap verb, and in
    /// records written before tasks kept it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) authority: Option<TaskAuthority>,
    /// The trace context of its submit: its handler runs in that trace,
    /// also when it is resumed after a restart (absent when the submit
    /// came without one, and in records written before tasks kept it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) trace: Option<TaskTrace>,
}

/// The trace context a task belongs to (W3C `traceparent` and
/// `tracestate`, as text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskTrace {
    pub(crate) traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tracestate: Option<String>,
}

/// What let a task of a controller verb through: it runs only while that
/// holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskAuthority {
    /// The binding epoch it was submitted under.
    pub(crate) epoch: u64,
    /// Submitted by the holder of a grant, not by the control plane.
    #[serde(default)]
    pub(crate) grant: bool,
}

/// One event of a task's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskEventRecord {
    pub(crate) seq: u64,
    pub(crate) at_ms: u64,
    pub(crate) state: TaskState,
    pub(crate) kind: TaskEventKind,
    #[serde(with = "serde_bytes_compat")]
    pub(crate) body: Vec<u8>,
}

/// Identifies a remembered answer: (sender, req_id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct AnswerKey {
    pub(crate) sender: NodeId,
    pub(crate) req_id: String,
}

/// The answer to a state-changing controller request, written in the same
/// transaction as the change it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerRecord {
    pub(crate) key: AnswerKey,
    /// The (cap, verb) it answered: the same req_id on another verb is a
    /// `duplicate`, never this answer.
    pub(crate) cap: String,
    pub(crate) verb: String,
    /// `true`: `body` is the result item; `false`: an encoded `ErrorBody`.
    pub(crate) ok: bool,
    #[serde(with = "serde_bytes_compat")]
    pub(crate) body: Vec<u8>,
    /// When it was answered, in milliseconds since the Unix epoch (wall
    /// clock: it must mean something after a restart).
    pub(crate) at_ms: u64,
    /// Order of answers of one sender: the oldest goes first.
    pub(crate) seq: u64,
}

impl AnswerRecord {
    /// What this answer counts against its sender's quota.
    pub(crate) fn cost(&self) -> usize {
        ANSWER_OVERHEAD + self.key.req_id.len() + self.cap.len() + self.verb.len() + self.body.len()
    }
}

/// Bytes counted for an answer besides its variable parts.
pub(crate) const ANSWER_OVERHEAD: usize = 160;

/// Byte strings as CBOR byte strings (serde's default for `Vec<u8>` is an
/// array of integers).
mod serde_bytes_compat {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
        }
        // `deserialize_byte_buf`, not `deserialize_bytes`: ciborium reads
        // the latter only into its scratch buffer (256 bytes here), so a
        // longer value would not read back.
        d.deserialize_byte_buf(V)
    }
}
