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
    Version::new(1, 0, 0)
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
    /// returns it (opaque; `null` when unset).
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
