//! `core.connect`: the control plane introduces peers to the node.

use capwire_envelope::NodeId;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::verb;

/// The id of the connect capability.
pub const CORE_CONNECT: &str = "core.connect";

/// Args of `core.connect/introduce`: a peer the node should keep a
/// session with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntroduceArgs {
    /// A local name for the peer (1 to 64 bytes).
    pub name: String,
    /// The peer's key.
    #[schemars(with = "String")]
    pub node_id: NodeId,
    /// Where to dial it: `tcp://HOST:PORT`, `HOST:PORT` or `unix:PATH`.
    pub addr: String,
}

/// Result of `core.connect/introduce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntroduceReply {
    /// `false` when the node already had this contact with this name and
    /// address (nothing changed).
    pub added: bool,
}

verb! {
    /// `core.connect/introduce` (controller): the peer becomes a durable
    /// contact; the node dials it and keeps a session with it.
    pub struct ConnectIntroduce: request "core.connect" / "introduce", Controller, IntroduceArgs => IntroduceReply;
}
