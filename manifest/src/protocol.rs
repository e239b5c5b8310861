//! `core.protocol`: which wire protocol versions a node speaks. Listing it
//! in the manifest is how a node tells its peers, in a first hello that a
//! version-1 peer reads as any other, that it also speaks a later version
//! (WIRE.md 4.1); `versions` answers the list.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, VerbManifest};
use crate::monitoring::NoArgs;
use crate::verb;

/// The id of the protocol capability.
pub const CORE_PROTOCOL: &str = "core.protocol";

/// The `params` of `core.protocol` in a version-1 view that left stream
/// verbs out ([`Manifest::version_1_view`]): a version-2 peer that sees it
/// knows that a hello with the whole manifest follows (WIRE.md 4.1).
pub const PARTIAL_VIEW: &str = "version-1 view";

/// Result of `core.protocol/versions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VersionsReply {
    /// The protocol versions the node speaks, lowest first.
    pub versions: Vec<u32>,
}

verb! {
    /// `core.protocol/versions` (bootstrap): the protocol versions the node
    /// speaks.
    pub struct ProtocolVersions: request "core.protocol" / "versions", Bootstrap, NoArgs => VersionsReply;
}

/// The id of the audit capability (protocol 3; WIRE.md 5.6).
pub const CORE_AUDIT: &str = "core.audit";

/// The protocol version the capability `id` exists from: 2 for
/// `core.tasks` and `core.grants`, 3 for `core.audit`, 1 for every other.
/// A peer on a session of an older version is not shown it, and its verbs
/// are unknown there (WIRE.md 4.1).
pub fn capability_since(id: &str) -> u32 {
    if id == CORE_AUDIT {
        3
    } else if id == crate::tasks::CORE_TASKS || id == crate::grants::CORE_GRANTS {
        2
    } else {
        1
    }
}

/// Whether the capability `id` exists from protocol 2 or later: a version-1
/// peer is not shown it, and its verbs are unknown on a version-1 session.
pub fn is_protocol_2_capability(id: &str) -> bool {
    capability_since(id) >= 2
}

impl Manifest {
    /// The highest protocol version this manifest's node says it speaks:
    /// the major version of its `core.protocol` capability, and 1 when it
    /// lists none (every node speaks version 1).
    ///
    /// ```
    /// use capwire_manifest::{MonitoringHandlers, MonitoringStatus, NodeInfo, Registry};
    /// let info = NodeInfo::new(capwire_envelope::NodeId::from_bytes([1; 32]), "app");
    /// let registry = Registry::builder(info, MonitoringHandlers { bind: (), disable: () })
    ///     .build()
    ///     .unwrap();
    /// let manifest = registry.manifest(MonitoringStatus::Off, 1);
    /// assert_eq!(manifest.protocol(), 1, "no core.protocol: version 1 only");
    /// ```
    pub fn protocol(&self) -> u32 {
        self.capability(CORE_PROTOCOL).map_or(1, |c| {
            u32::try_from(c.version.major).unwrap_or(u32::MAX).max(1)
        })
    }

    /// Whether anything in it is protocol 2 only: a verb of a kind
    /// protocol 1 does not have (a stream or a task verb), or a capability
    /// that exists for protocol 2 alone (`core.tasks`).
    pub fn has_protocol_2_verbs(&self) -> bool {
        self.capabilities.iter().any(|c| {
            is_protocol_2_capability(c.id.as_str()) || c.verbs.iter().any(|v| v.kind.since() > 1)
        })
    }

    /// The manifest as a version-1 peer is shown it: without its stream
    /// and task verbs, without `core.tasks` (tasks exist in protocol 2
    /// only), and without the capabilities that then have no verb left (a
    /// capability lists at least one). When anything was left out,
    /// `core.protocol`'s `params` says so ([`PARTIAL_VIEW`]). Epoch and
    /// everything else as they are.
    pub fn version_1_view(&self) -> Manifest {
        let mut m = self.clone();
        let before = m.capabilities.len();
        m.capabilities
            .retain(|c| !is_protocol_2_capability(c.id.as_str()));
        let mut hidden = m.capabilities.len() != before;
        for cap in &mut m.capabilities {
            let before = cap.verbs.len();
            cap.verbs.retain(|v: &VerbManifest| v.kind.since() <= 1);
            hidden |= cap.verbs.len() != before;
        }
        m.capabilities.retain(|c| !c.verbs.is_empty());
        if hidden
            && let Some(p) = m
                .capabilities
                .iter_mut()
                .find(|c| c.id.as_str() == CORE_PROTOCOL)
        {
            p.params = Some(PARTIAL_VIEW.to_owned());
        }
        m
    }

    /// Whether anything in it exists from protocol 3 on (`core.audit`).
    pub fn has_protocol_3_capabilities(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| capability_since(c.id.as_str()) >= 3)
    }

    /// The manifest as a version-2 peer is shown it: without what exists
    /// from protocol 3 on (`core.audit`); everything else as it is, epoch
    /// included, and `core.protocol` unchanged (its major version still
    /// says the highest version the node speaks).
    pub fn version_2_view(&self) -> Manifest {
        let mut m = self.clone();
        m.capabilities
            .retain(|c| capability_since(c.id.as_str()) <= 2);
        m
    }

    /// The manifest as a peer on a session of protocol `version` is shown
    /// it: [`version_1_view`](Self::version_1_view) for 1,
    /// [`version_2_view`](Self::version_2_view) for 2, the whole manifest
    /// from 3 on.
    pub fn view_for(&self, version: u32) -> Manifest {
        match version {
            0 | 1 => self.version_1_view(),
            2 => self.version_2_view(),
            _ => self.clone(),
        }
    }

    /// Whether this is a version-1 view that left stream verbs out (its
    /// `core.protocol` says [`PARTIAL_VIEW`]).
    pub fn is_partial_view(&self) -> bool {
        self.capability(CORE_PROTOCOL)
            .is_some_and(|c| c.params.as_deref() == Some(PARTIAL_VIEW))
    }
}
