//! What nodes push to their control plane, as the control plane's
//! application sees it.

use capwire_envelope::NodeId;
use capwire_manifest::{CopyRecord, Roster, TaskChanged};

/// A push received from a node: a monitoring copy, a roster update or a
/// task's change of state.
///
/// Every node accepts these pushes (their verbs are bootstrap) and hands
/// them to its application with the sender's authenticated key; the
/// application decides which senders it watches (typically the nodes it
/// bound). See [`Node::control_events`](crate::Node::control_events).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlEvent {
    /// A `core.monitoring/copy` from `from`.
    Copy {
        /// The node that sent it.
        from: NodeId,
        /// The copy.
        record: CopyRecord,
    },
    /// A `core.cluster/roster` from `from`.
    Roster {
        /// The parent that sent it.
        from: NodeId,
        /// Its roster.
        roster: Roster,
    },
    /// A `core.tasks/changed` from `from`: one of its tasks changed state.
    Task {
        /// The node whose task it is.
        from: NodeId,
        /// What changed.
        change: TaskChanged,
    },
}

/// How many pushes wait for a slow application before the oldest are
/// dropped (the receiver is told how many it missed).
pub(crate) const EVENT_BUFFER: usize = 1024;
