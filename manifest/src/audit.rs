//! `core.audit` (protocol 3): the node's tamper-evident record of every
//! decision of its chokepoint and every change of its state (WIRE.md 5.6).
//! The entries are the leaves of an RFC 6962 Merkle tree; the node signs
//! checkpoints of it (C2SP tlog-checkpoint, signed-note) and proves
//! inclusion and consistency. All verbs are controller verbs, so they can
//! be granted. The capability's params are the node's audit verifier key
//! (the signed-note key text), which checks its checkpoints.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::monitoring::NoArgs;
use crate::verb;

/// Most entries one `entries` call streams.
pub const MAX_ENTRIES_PER_CALL: u64 = 65_536;

/// Result of `core.audit/checkpoint`: the latest signed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointReply {
    /// The signed note: the checkpoint's body, a blank line, and the
    /// node's signature line (and a witness's, when one cosigned).
    pub note: String,
    /// The tree size the note is for.
    pub size: u64,
    /// The first entry still kept: entries and proofs below it were
    /// pruned (0 when nothing was).
    pub pruned: u64,
}

/// Args of `core.audit/entries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EntriesArgs {
    /// The first entry's index.
    pub from: u64,
    /// One past the last entry's index: at most the tree's size, and at
    /// most [`MAX_ENTRIES_PER_CALL`] after `from`.
    pub to: u64,
}

/// One item of `core.audit/entries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EntryItem {
    /// The entry's index (its leaf's position in the tree).
    pub index: u64,
    /// The entry's bytes (a CBOR map, WIRE.md 5.6), as lowercase hex: the
    /// leaf hashed is exactly these bytes.
    pub entry: String,
}

/// Args of `core.audit/prove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProveArgs {
    /// The tree size the proof is for (at most the latest checkpoint's).
    pub size: u64,
    /// An inclusion proof of this entry in the tree of `size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// A consistency proof from the tree of this size to the tree of
    /// `size`. Exactly one of `index` and `from` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<u64>,
}

/// Result of `core.audit/prove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProveReply {
    /// The proof's hashes, each as 64 lowercase hex digits, in RFC 6962
    /// order.
    pub proof: Vec<String>,
}

verb! {
    /// `core.audit/checkpoint` (controller): the latest signed checkpoint.
    pub struct AuditCheckpoint: request "core.audit" / "checkpoint", Controller, NoArgs => CheckpointReply;
}

verb! {
    /// `core.audit/entries` (controller): a range of entries, as a stream.
    pub struct AuditEntries: stream "core.audit" / "entries", Controller, EntriesArgs => EntryItem;
}

verb! {
    /// `core.audit/prove` (controller): an inclusion or a consistency proof.
    pub struct AuditProve: request "core.audit" / "prove", Controller, ProveArgs => ProveReply;
}
