//! A contact: a peer a node knows by name, key and address.

use capwire_envelope::NodeId;

use crate::addr::Addr;

/// A contact: a peer this node knows by name, key and address, and keeps a
/// session with (redialling with backoff when it drops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contact {
    /// A local name for the peer.
    pub name: String,
    /// The peer's identity (compared in canonical form).
    pub id: NodeId,
    /// Where to dial it.
    pub addr: Addr,
}
