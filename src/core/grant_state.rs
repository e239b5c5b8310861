//! The node's grant state (`core.grants`, WIRE.md 5.5): its own grant
//! key, the control plane's (for the binding epoch it was taken at), the
//! presented tokens and the revocations. The verbs that change it are in
//! `core/grants.rs`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use capwire_authz::{Delegations, GrantKey, GrantPublicKey};
use capwire_manifest::{CORE_GRANTS, GrantsInfo, Manifest};

use crate::clock::Clock;
use crate::store::{RevocationEntry, RevocationsRecord};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The grant key a peer's manifest advertises (its `core.grants` params).
pub(crate) fn advertised_key(manifest: &Manifest) -> Option<GrantPublicKey> {
    manifest
        .capabilities
        .iter()
        .find(|c| c.id.as_str() == CORE_GRANTS)?
        .params
        .as_deref()?
        .parse()
        .ok()
}

/// The node's grant state: its own key, the control plane's (for the
/// binding epoch it was taken at), the presented tokens and the
/// revocations.
pub(crate) struct GrantState {
    key: Arc<GrantKey>,
    /// The control plane's key by binding epoch: the newest bind's and
    /// the one before (a bind that is undone goes back to it).
    controller_key: Mutex<Vec<(u64, GrantPublicKey)>>,
    pub(crate) delegations: Arc<Delegations>,
    pub(crate) revocations: Mutex<Vec<RevocationEntry>>,
    /// The dates tokens expire by.
    pub(crate) clock: Arc<Clock>,
}

impl std::fmt::Debug for GrantState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantState")
            .field("key", &self.key.public())
            .field("delegations", &self.delegations)
            .finish_non_exhaustive()
    }
}

impl GrantState {
    /// From the node's identity secret and what the store holds. Only the
    /// revocations made under the stored binding are kept: a token of any
    /// other binding is refused whatever it says.
    pub(crate) fn new(
        secret: &[u8; 32],
        binding: Option<(u64, Option<&str>)>,
        revocations: Option<RevocationsRecord>,
        clock: Arc<Clock>,
    ) -> Self {
        if let Some(floor) = revocations.as_ref().and_then(|r| r.clock_floor_ms) {
            clock.raise_floor_ms(floor);
        }
        let now_ms = clock.now_ms();
        let epoch = binding.map_or(0, |(e, _)| e);
        let kept: Vec<RevocationEntry> = revocations
            .map(|r| r.ids)
            .unwrap_or_default()
            .into_iter()
            // Made before revocations named their binding: taken as made
            // under the one held, which is the most they can be.
            .map(|e| RevocationEntry {
                epoch: Some(e.epoch.unwrap_or(epoch)),
                ..e
            })
            .filter(|e| e.epoch == Some(epoch) && e.until_ms > now_ms)
            .collect();
        let controller_key = binding
            .and_then(|(epoch, key)| Some((epoch, key?.parse::<GrantPublicKey>().ok()?)))
            .into_iter()
            .collect();
        Self {
            key: Arc::new(GrantKey::from_secret(secret)),
            controller_key: Mutex::new(controller_key),
            delegations: Arc::new(Delegations::with_revoked(kept.iter().map(|e| e.id.clone()))),
            revocations: Mutex::new(kept),
            clock,
        }
    }

    /// The node's own grant key.
    pub(crate) fn key(&self) -> &Arc<GrantKey> {
        &self.key
    }

    /// The params of the node's `core.grants`: its grant public key.
    pub(crate) fn params(&self) -> String {
        self.key.public().to_string()
    }

    /// The control plane's grant key for binding `epoch`, if the bind
    /// took one.
    pub(crate) fn controller_key(&self, epoch: u64) -> Option<GrantPublicKey> {
        lock(&self.controller_key)
            .iter()
            .find(|(e, _)| *e == epoch)
            .map(|(_, k)| *k)
    }

    /// The binding moved to `epoch` (a bind, an unbind, or one undone),
    /// with `key` as the grant key of the control plane bound now. Every
    /// earlier token is void, so is every revocation made under an
    /// earlier binding (it could only refuse tokens of that binding).
    pub(crate) fn moved(&self, epoch: u64, key: Option<GrantPublicKey>) {
        let mut keys = lock(&self.controller_key);
        keys.retain(|(e, _)| *e != epoch);
        if let Some(k) = key {
            keys.push((epoch, k));
        }
        // The newest two: a bind that is undone goes back to the one
        // before it.
        while keys.len() > 2 {
            keys.remove(0);
        }
        drop(keys);
        self.delegations.clear();
        let gone: Vec<Vec<u8>> = {
            let mut kept = lock(&self.revocations);
            let (keep, gone): (Vec<_>, Vec<_>) =
                kept.drain(..).partition(|e| e.epoch == Some(epoch));
            *kept = keep;
            gone.into_iter().map(|e| e.id).collect()
        };
        self.delegations.forget_revocations(&gone);
    }

    pub(crate) fn info(&self, epoch: u64) -> GrantsInfo {
        GrantsInfo {
            epoch,
            control_plane_key: self.controller_key(epoch).map(|k| k.to_string()),
            revocations: u64::try_from(lock(&self.revocations).len()).unwrap_or(u64::MAX),
        }
    }
}
