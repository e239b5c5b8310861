//! `core.grants` (protocol 2): delegated rights to a node's controller
//! verbs. A holder presents a token (`present`, bootstrap); the bound
//! control plane reads what it mints against (`info`) and revokes
//! (`revoke`). The capability's params are the node's own grant public
//! key (`ed25519/` and 64 hex digits), which signs what it hands on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::monitoring::NoArgs;
use crate::verb;

/// The id of the grants capability.
pub const CORE_GRANTS: &str = "core.grants";

/// Args of `core.grants/present`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresentArgs {
    /// The token, as biscuit's base64url text (at most 8192 characters).
    pub token: String,
}

/// Result of `core.grants/present`: the token is kept for the sender.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresentReply {
    /// The token's first revocation id (64 bytes, lowercase hex): its
    /// name in monitoring copies and for `revoke`.
    pub grant: String,
    /// Its revocation ids, one per block, in order.
    pub revocation_ids: Vec<String>,
    /// The authority block's expiry, in milliseconds since the Unix epoch.
    pub expires_ms: u64,
}

/// Result of `core.grants/info`: what the control plane mints against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantsInfo {
    /// The binding epoch a token must name (`binding(epoch)`).
    pub epoch: u64,
    /// The control plane's grant key the node verifies tokens with, as
    /// the bind took it from the control plane's manifest (`null`: none,
    /// the control plane advertised no `core.grants`).
    pub control_plane_key: Option<String>,
    /// Revocations kept.
    pub revocations: u64,
}

/// Args of `core.grants/revoke`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeArgs {
    /// A revocation id (lowercase hex, at most 128 digits).
    pub id: String,
}

verb! {
    /// `core.grants/present` (bootstrap): presents a token for the
    /// sender's later controller calls.
    pub struct GrantsPresent: request "core.grants" / "present", Bootstrap, PresentArgs => PresentReply;
}

verb! {
    /// `core.grants/info` (controller): the binding epoch and keys.
    pub struct GrantsInfoRead: request "core.grants" / "info", Controller, NoArgs => GrantsInfo;
}

verb! {
    /// `core.grants/revoke` (controller): revokes a token block, durably.
    pub struct GrantsRevoke: request "core.grants" / "revoke", Controller, RevokeArgs => GrantsInfo;
}
