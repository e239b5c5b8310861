//! The manifest a node advertises to its peers: its wire format, and the
//! lookups and requirement checks a caller runs on a peer's manifest.
//!
//! Below the registry, which produces manifests; its rules are checked in
//! `validate.rs` and its epoch is kept by `tracker.rs`, both above.

use std::fmt;

use capwire_envelope::{CapId, NodeId, Verb};
use schemars::JsonSchema;
use semver::Version;
use serde::{Deserialize, Serialize};

use crate::class::{DeclaredClass, VerbKind};
use crate::error::ManifestError;
use crate::requirement::CapRequirement;

/// Whether a node is watched by a control plane.
///
/// On the wire: `"off"`, `"pending"` (a bind code is waiting to be used) or
/// `"on"` (bound to a control plane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MonitoringStatus {
    /// Not bound, no bind pending.
    #[default]
    Off,
    /// Not bound; a bind code is pending.
    Pending,
    /// Bound to a control plane.
    On,
}

impl MonitoringStatus {
    /// The wire form: `off`, `pending` or `on`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Pending => "pending",
            Self::On => "on",
        }
    }
}

impl fmt::Display for MonitoringStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a node advertises: who it is and what it offers.
///
/// Carried in the hello frame and its updates; encoded with the strict CBOR
/// profile as a map with exactly these keys (see `WIRE.md` section 3).
/// Capabilities are sorted by id and verbs by name.
///
/// A peer's manifest is read with [`Manifest::decode_checked`], which
/// bounds its length and checks every rule of the manifest
/// ([`Manifest::validate`]); a [`Registry`](crate::Registry) only ever
/// produces manifests that pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The node's identity (its static public key).
    #[schemars(with = "String")]
    pub node_id: NodeId,
    /// The application this node runs.
    pub app_id: String,
    /// A human-readable name.
    pub name: String,
    /// A human-readable description.
    pub description: String,
    /// Bumped on every change of any other field.
    pub epoch: u64,
    /// Whether a control plane watches this node.
    pub monitoring: MonitoringStatus,
    /// The capabilities offered, sorted by id.
    pub capabilities: Vec<CapabilityManifest>,
}

impl Manifest {
    /// The capability with this exact id.
    pub fn capability(&self, id: &str) -> Option<&CapabilityManifest> {
        self.capabilities.iter().find(|c| c.id.as_str() == id)
    }

    /// Checks a requirement such as `app.echo@^1.2` against this manifest.
    ///
    /// # Errors
    /// [`ManifestError::VersionUnsatisfied`] when the capability is missing
    /// or its version is outside the range.
    pub fn require(&self, req: &CapRequirement) -> Result<&CapabilityManifest, ManifestError> {
        req.check(self)
    }

    /// `true` when everything but the epoch is equal.
    pub fn same_content(&self, other: &Manifest) -> bool {
        self.node_id == other.node_id
            && self.app_id == other.app_id
            && self.name == other.name
            && self.description == other.description
            && self.monitoring == other.monitoring
            && self.capabilities == other.capabilities
    }
}

impl CapRequirement {
    /// Finds the capability in `manifest` and checks its version.
    ///
    /// # Errors
    /// [`ManifestError::VersionUnsatisfied`] when the manifest does not offer
    /// the capability (`found: None`) or offers a version outside the range.
    pub fn check<'m>(
        &self,
        manifest: &'m Manifest,
    ) -> Result<&'m CapabilityManifest, ManifestError> {
        match manifest.capability(self.cap().as_str()) {
            Some(cap) if self.req().matches(&cap.version) => Ok(cap),
            found => Err(ManifestError::VersionUnsatisfied {
                wanted: self.clone(),
                found: found.map(|c| c.version.clone()),
            }),
        }
    }
}

/// One capability in a [`Manifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CapabilityManifest {
    /// The capability id.
    #[schemars(with = "String")]
    pub id: CapId,
    /// Its semver version.
    #[schemars(with = "String")]
    pub version: Version,
    /// An opaque description of its configuration, if any.
    #[serde(deserialize_with = "required")]
    pub params: Option<String>,
    /// Its verbs, sorted by name.
    pub verbs: Vec<VerbManifest>,
}

impl CapabilityManifest {
    /// The verb with this exact name.
    pub fn verb(&self, name: &str) -> Option<&VerbManifest> {
        self.verbs.iter().find(|v| v.name.as_str() == name)
    }
}

/// One verb in a [`CapabilityManifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerbManifest {
    /// The verb name.
    #[schemars(with = "String")]
    pub name: Verb,
    /// Request or notification.
    pub kind: VerbKind,
    /// Who may call it.
    pub class: DeclaredClass,
    /// The JSON Schema of its args as JSON text, when the handler is typed.
    #[serde(deserialize_with = "required")]
    pub args_schema: Option<String>,
    /// The JSON Schema of its result as JSON text, when the handler is typed;
    /// always `None` for a notification.
    #[serde(deserialize_with = "required")]
    pub result_schema: Option<String>,
}

/// Deserializes an optional field that must still be present (as `null`
/// when empty): serde would otherwise read a missing key as `None`.
fn required<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d)
}
