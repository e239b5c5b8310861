//! `core.configuration`: the node's opaque configuration, read and
//! written by its bound control plane.

use capwire_envelope::RawValue;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::monitoring::NoArgs;
use crate::verb;

/// The id of the configuration capability.
pub const CORE_CONFIGURATION: &str = "core.configuration";

/// The node's configuration: one CBOR item and its version.
///
/// `version` is 0 (and `value` `null`) until the first `set_config`; each
/// successful `set_config` bumps it by one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigValue {
    /// The configuration, opaque to the node.
    #[schemars(with = "serde_json::Value")]
    pub value: RawValue,
    /// Its version.
    pub version: u64,
}

/// Args of `core.configuration/set_config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetConfigArgs {
    /// The new configuration (any CBOR item).
    #[schemars(with = "serde_json::Value")]
    pub value: RawValue,
    /// Compare-and-set: apply only if the current version is this one;
    /// otherwise the answer is `conflict` with the current version in its
    /// detail (`{"version": n}`). `null`: apply whatever the version.
    pub if_version: Option<u64>,
}

/// Result of `core.configuration/set_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetConfigReply {
    /// The version the new value got.
    pub version: u64,
}

verb! {
    /// `core.configuration/get_config` (controller): the configuration and
    /// its version.
    pub struct GetConfig: request "core.configuration" / "get_config", Controller, NoArgs => ConfigValue;
}

verb! {
    /// `core.configuration/set_config` (controller): replaces the
    /// configuration, durably before the answer; with `if_version`, only if
    /// the version matches (`conflict` otherwise).
    pub struct SetConfig: request "core.configuration" / "set_config", Controller, SetConfigArgs => SetConfigReply;
}
