//! Who may finish a handshake with us.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use capwire_envelope::NodeId;

use crate::keys::canonical_node_id;

/// Decides, after the handshake has proven the peer's static key and before
/// any record is delivered, whether that peer may proceed. Keys are always
/// compared in canonical form (see [`canonical_node_id`]); our own key is
/// refused whatever the policy says.
///
/// ```
/// use capwire_transport::{ContactPolicy, Keypair};
/// let friend = Keypair::generate().unwrap().public();
/// let stranger = Keypair::generate().unwrap().public();
/// let policy = ContactPolicy::allow_list([friend]);
/// assert!(policy.allows(&friend));
/// assert!(!policy.allows(&stranger));
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ContactPolicy {
    /// Any key that completes the handshake.
    #[default]
    AcceptAny,
    /// Only these keys (any encoding of them).
    AllowList(HashSet<NodeId>),
    /// Ask a function; it receives the canonical key.
    Callback(Arc<dyn Fn(&NodeId) -> bool + Send + Sync>),
}

impl ContactPolicy {
    /// An allow-list of the given keys.
    pub fn allow_list(keys: impl IntoIterator<Item = NodeId>) -> Self {
        Self::AllowList(keys.into_iter().map(|k| canonical_node_id(&k)).collect())
    }

    /// A policy that asks `f`.
    pub fn callback(f: impl Fn(&NodeId) -> bool + Send + Sync + 'static) -> Self {
        Self::Callback(Arc::new(f))
    }

    /// Whether `remote` may proceed (our own key aside).
    pub fn allows(&self, remote: &NodeId) -> bool {
        let remote = canonical_node_id(remote);
        match self {
            Self::AcceptAny => true,
            Self::AllowList(keys) => {
                keys.contains(&remote) || keys.iter().any(|k| canonical_node_id(k) == remote)
            }
            Self::Callback(f) => f(&remote),
        }
    }
}

impl fmt::Debug for ContactPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AcceptAny => f.write_str("AcceptAny"),
            Self::AllowList(keys) => f.debug_tuple("AllowList").field(keys).finish(),
            Self::Callback(_) => f.write_str("Callback(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_compares_canonical_forms() {
        let key = NodeId::from_bytes([3; 32]);
        let mut alias = [3u8; 32];
        alias[31] |= 0x80;
        let alias = NodeId::from_bytes(alias);
        // Built from a raw set holding the alias: still matches the key.
        let raw = ContactPolicy::AllowList(HashSet::from([alias]));
        assert!(raw.allows(&key));
        assert!(ContactPolicy::allow_list([alias]).allows(&key));
        assert!(ContactPolicy::allow_list([key]).allows(&alias));
        assert!(!ContactPolicy::allow_list([key]).allows(&NodeId::from_bytes([4; 32])));
    }

    #[test]
    fn callback_sees_the_canonical_key() {
        let key = NodeId::from_bytes([3; 32]);
        let policy = ContactPolicy::callback(move |k| *k == key);
        let mut alias = [3u8; 32];
        alias[31] |= 0x80;
        assert!(policy.allows(&NodeId::from_bytes(alias)));
    }
}
