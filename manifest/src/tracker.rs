//! The node's current manifest over time: a new epoch on every change.
//!
//! Above both the manifest format and the registry it reads from.

use crate::manifest::{Manifest, MonitoringStatus};
use crate::registry::Registry;

/// Keeps a node's current manifest and bumps its epoch on every change.
///
/// ```
/// # use capwire_manifest::*;
/// # use capwire_envelope::NodeId;
/// let info = NodeInfo::new(NodeId::from_bytes([1; 32]), "demo");
/// let registry = Registry::builder(info, MonitoringHandlers { bind: (), disable: () })
///     .build()
///     .unwrap();
/// let mut tracker = ManifestTracker::new(&registry, MonitoringStatus::Off);
/// assert_eq!(tracker.manifest().epoch, 1);
/// assert!(!tracker.refresh(&registry, MonitoringStatus::Off)); // nothing changed
/// assert!(tracker.refresh(&registry, MonitoringStatus::On));
/// assert_eq!(tracker.manifest().epoch, 2);
/// ```
#[derive(Debug, Clone)]
pub struct ManifestTracker {
    current: Manifest,
}

impl ManifestTracker {
    /// Starts at epoch 1.
    pub fn new<H>(registry: &Registry<H>, monitoring: MonitoringStatus) -> Self {
        Self::starting_at(registry, monitoring, 1)
    }

    /// Starts at the given epoch, e.g. one past the last epoch persisted
    /// before a restart.
    pub fn starting_at<H>(
        registry: &Registry<H>,
        monitoring: MonitoringStatus,
        epoch: u64,
    ) -> Self {
        Self {
            current: registry.manifest(monitoring, epoch),
        }
    }

    /// The current manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.current
    }

    /// Recomputes the manifest; if anything changed, bumps the epoch and
    /// returns `true`.
    pub fn refresh<H>(&mut self, registry: &Registry<H>, monitoring: MonitoringStatus) -> bool {
        let next_epoch = self.current.epoch.saturating_add(1);
        let next = registry.manifest(monitoring, next_epoch);
        if next.same_content(&self.current) {
            false
        } else {
            self.current = next;
            true
        }
    }
}
