//! `core.monitoring`: the capability every node has.

use schemars::JsonSchema;
use semver::Version;
use serde::{Deserialize, Serialize};

use crate::verb;

/// The id of the monitoring capability.
pub const CORE_MONITORING: &str = "core.monitoring";

/// The version `core.monitoring` advertises.
pub(crate) fn version() -> Version {
    Version::new(1, 0, 0)
}

/// Args of `core.monitoring/bind`: the code of the node's pending bind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BindArgs {
    /// The bind code printed in the node's invite.
    pub code: String,
}

/// An empty args map, for verbs that take no arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

verb! {
    /// `core.monitoring/bind` (bootstrap): the bind ceremony. Any contact may
    /// try; the node's pending bind decides.
    pub struct MonitoringBind: request "core.monitoring" / "bind", Bootstrap, BindArgs => ();
}

verb! {
    /// `core.monitoring/disable` (controller): unbinds the control plane.
    pub struct MonitoringDisable: request "core.monitoring" / "disable", Controller, NoArgs => ();
}
