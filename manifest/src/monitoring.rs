//! `core.monitoring`: the capability every node has.

use std::fmt;

use capwire_envelope::RawValue;
use schemars::JsonSchema;
use semver::Version;
use serde::{Deserialize, Serialize};

use crate::manifest::Manifest;
use crate::verb;

/// The id of the monitoring capability.
pub const CORE_MONITORING: &str = "core.monitoring";

/// The version `core.monitoring` advertises.
pub(crate) fn version() -> Version {
    Version::new(1, 1, 0)
}

/// Args of `core.monitoring/bind`: the code of the node's pending bind.
///
/// The code is a secret: `Debug` does not show it.
///
/// ```
/// let args = capwire_manifest::BindArgs { code: "K7M2Q9XW4P".into() };
/// assert_eq!(format!("{args:?}"), "BindArgs { code: <redacted> }");
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BindArgs {
    /// The bind code printed in the node's invite.
    pub code: String,
}

impl fmt::Debug for BindArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BindArgs")
            .field("code", &format_args!("<redacted>"))
            .finish()
    }
}

/// Result of a successful `core.monitoring/bind`: what the control plane
/// needs to start watching the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BindReply {
    /// The node's manifest, as it is after the bind (monitoring `on`).
    pub manifest: Manifest,
    /// The node's cluster roster, as `core.cluster/list` returns its
    /// members (an array).
    #[schemars(with = "serde_json::Value")]
    pub members: RawValue,
    /// The node's configuration, as `core.configuration/get_config`
    /// returns it: `{"value": ..., "version": n}` (`{"value": null,
    /// "version": 0}` when never set).
    #[schemars(with = "serde_json::Value")]
    pub config: RawValue,
    /// The roster version the members belong to.
    pub version: u64,
}

/// An empty args map, for verbs that take no arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

verb! {
    /// `core.monitoring/bind` (bootstrap): the bind ceremony. Any contact may
    /// try; the node's pending bind decides.
    pub struct MonitoringBind: request "core.monitoring" / "bind", Bootstrap, BindArgs => BindReply;
}

verb! {
    /// `core.monitoring/disable` (controller): unbinds the control plane.
    pub struct MonitoringDisable: request "core.monitoring" / "disable", Controller, NoArgs => ();
}

/// Result of `core.monitoring/status`: what the manifest says about
/// monitoring, and whether the caller is the bound control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MonitoringStatusReply {
    /// `off`, `pending` or `on`.
    pub monitoring: crate::MonitoringStatus,
    /// `true` when the caller is the bound control plane.
    pub you_are_controller: bool,
    /// Sequence number of the last monitoring copy made (0: none yet).
    pub copy_seq: u64,
}

verb! {
    /// `core.monitoring/status` (bootstrap): the monitoring status, and
    /// whether the caller is the bound control plane.
    pub struct MonitoringStatusRead: request "core.monitoring" / "status", Bootstrap, NoArgs => MonitoringStatusReply;
}

/// Which way a copied control message went, seen from the copying node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CopyDirection {
    /// Received by the node.
    In,
    /// Sent by the node.
    Out,
}

/// A monitoring copy: one control message the node received or sent,
/// delivered to its bound control plane as `core.monitoring/copy`.
///
/// `seq` counts every message the node copied or had to drop, so a control
/// plane that sees `seq` jump by more than one knows it missed messages;
/// `dropped` says how many were dropped (queue full, or the control plane
/// unreachable) since the previous delivered copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyRecord {
    /// The copy's sequence number, per node, from 1.
    pub seq: u64,
    /// Copies dropped just before this one.
    pub dropped: u64,
    /// `in` or `out`.
    pub dir: CopyDirection,
    /// The other end of the message.
    #[schemars(with = "String")]
    pub peer: capwire_envelope::NodeId,
    /// When the node saw it, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The message's capability.
    pub cap: String,
    /// The message's verb.
    pub verb: String,
    /// The message's request id (empty: a notification).
    pub req_id: String,
    /// The message's args, or `null` when they were larger than the copy
    /// limit (then `truncated` is `true`).
    #[schemars(with = "serde_json::Value")]
    pub body: RawValue,
    /// Length of the args item in bytes.
    pub body_len: u64,
    /// `true` when `body` was left out for its size.
    pub truncated: bool,
    /// The token (its first revocation id, hex) that let this inbound
    /// controller call through for a sender that is not the control plane
    /// (`core.grants`, WIRE.md 5.5); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// *(protocol 3)* The trace id (32 hex digits) of the W3C trace
    /// context the message carried (WIRE.md 2.2), so a control plane can
    /// join its copies to traces; absent when it carried none, and in
    /// copies to a control plane whose session is below protocol 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

verb! {
    /// `core.monitoring/copy` (notification, bootstrap): a monitoring copy
    /// sent by a node to its control plane. Every node accepts it and
    /// hands it to its application with the sender's key; the application
    /// decides which senders it watches.
    pub struct MonitoringCopy: notification "core.monitoring" / "copy", Bootstrap, CopyRecord;
}
