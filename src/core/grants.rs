//! `core.grants` (protocol 2, WIRE.md 5.5): delegated rights to this
//! node's controller verbs. A holder presents a biscuit token minted by
//! the bound control plane (`present`, bootstrap); the chokepoint then
//! lets the holder's controller calls through as far as the token says
//! (`capwire_authz::decide_with`). The control plane reads the binding
//! epoch its tokens must name (`info`) and revokes (`revoke`, durable).
//!
//! The control plane's grant key is taken, at the bind, from the manifest
//! it advertises on the authenticated session (its `core.grants` params)
//! and kept with the binding, so tokens are verified with nothing but
//! the node's own store.

use std::sync::Arc;

use capwire_authz::{GrantDenied, GrantPublicKey, MAX_REVOCATIONS, verify};
use capwire_envelope::{ErrorBody, ErrorCode, NodeId};
use capwire_manifest::{
    CORE_GRANTS, GrantsInfo, GrantsInfoRead, GrantsPresent, GrantsRevoke, NoArgs, PresentArgs,
    PresentReply, RevokeArgs,
};

use crate::audit::{Entry, Kind};
pub(crate) use crate::core::grant_state::advertised_key;
use crate::core::grant_state::{lock, unix_ms};
use crate::core::state::{Core, CoreState};
use crate::dispatch::extract::Sender;
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};
use crate::store::{Batch, RevocationEntry, RevocationsRecord};

/// The detail of a refused presentation: `{"reason": LABEL}`.
#[derive(serde::Serialize)]
struct Reason {
    reason: &'static str,
}

fn refused(d: &GrantDenied) -> HandlerError {
    let mut body = ErrorBody::new(ErrorCode::Unauthorized, d.to_string());
    if let Ok(detail) = capwire_envelope::RawValue::encode(&Reason { reason: d.as_str() }) {
        body = body.with_detail(detail);
    }
    HandlerError::from(body)
}

async fn present(
    args: PresentArgs,
    Sender(from): Sender,
    Core(core): Core,
) -> Result<PresentReply, HandlerError> {
    let binding = core.control.binding();
    let grants = &core.grants;
    let Some(root) = grants.controller_key(binding.epoch()) else {
        grants
            .delegations
            .count_present(Err(&GrantDenied::NoGrantKey));
        return Err(refused(&GrantDenied::NoGrantKey));
    };
    let now = grants.clock.now();
    let delegations = &grants.delegations;
    let verified = verify(
        &args.token,
        &root,
        &core.id,
        binding.epoch(),
        &from,
        now,
        |id| delegations.is_revoked(id),
    )
    .map_err(|d| {
        delegations.count_present(Err(&d));
        refused(&d)
    })?;
    let holders = verified.holders().to_vec();
    let reply = PresentReply {
        grant: verified.id(),
        revocation_ids: verified
            .revocation_ids()
            .iter()
            .map(|i| base16ct::lower::encode_string(i))
            .collect(),
        expires_ms: unix_ms(verified.expires()),
    };
    // Kept only while the binding it was verified under holds.
    if core.control.binding().epoch() != binding.epoch() {
        return Err(refused(&GrantDenied::BindingChanged));
    }
    delegations
        .present(from, verified, now)
        .map_err(|d| refused(&d))?;
    let mut e = Entry::new(Kind::Grant);
    e.peer = Some(&from);
    e.epoch = Some(binding.epoch());
    e.grant = Some(&reply.grant);
    e.detail = Some("presented");
    e.holders = Some(&holders);
    core.audit.record(&e);
    Ok(reply)
}

async fn info(_args: NoArgs, Core(core): Core) -> Result<GrantsInfo, HandlerError> {
    Ok(core.grants.info(core.control.binding().epoch()))
}

async fn revoke(args: RevokeArgs, Core(core): Core) -> Result<GrantsInfo, HandlerError> {
    let Some(id) = base16ct::lower::decode_vec(&args.id)
        .ok()
        .filter(|id| !id.is_empty() && id.len() <= 64)
    else {
        return Err(HandlerError::new(
            ErrorCode::BadArgs,
            "a revocation id is 2 to 128 lowercase hexadecimal digits",
        ));
    };
    let grants = &core.grants;
    // One revocation written at a time.
    let _durable = core.durable.lock().await;
    let now_ms = grants.clock.now_ms();
    let epoch = core.control.binding().epoch();
    // Kept while the binding lasts: every token it could refuse names
    // this binding. When the node holds a token it refuses, no copy of
    // that token outlives its authority block's expiry, nor the
    // revocation.
    let until_ms = grants
        .delegations
        .lifetime_of(&id)
        .map_or(u64::MAX, unix_ms);
    let (mut kept, forgotten): (Vec<RevocationEntry>, Vec<RevocationEntry>) =
        lock(&grants.revocations)
            .iter()
            .cloned()
            .partition(|e| e.epoch == Some(epoch) && e.until_ms > now_ms);
    let forgotten: Vec<Vec<u8>> = forgotten.into_iter().map(|e| e.id).collect();
    match kept.iter_mut().find(|e| e.id == id) {
        Some(e) => e.until_ms = e.until_ms.max(until_ms),
        None => {
            if kept.len() >= MAX_REVOCATIONS {
                return Err(HandlerError::new(
                    ErrorCode::Overloaded,
                    "the node keeps at most 10000 revocations; rebind to void every token",
                ));
            }
            kept.push(RevocationEntry {
                id: id.clone(),
                epoch: Some(epoch),
                until_ms,
            });
        }
    }
    // Written before it is answered; in effect at once after.
    core.commit(Batch {
        revocations: Some(RevocationsRecord {
            ids: kept.clone(),
            clock_floor_ms: Some(now_ms),
        }),
        ..Batch::default()
    })
    .await?;
    *lock(&grants.revocations) = kept;
    grants.delegations.forget_revocations(&forgotten);
    grants
        .delegations
        .revoke(id)
        .map_err(|e| HandlerError::new(ErrorCode::Overloaded, e.to_string()))?;
    // Streams and tasks the token let through stop now.
    core.control.authorities().changed();
    let mut e = Entry::new(Kind::Grant);
    e.epoch = Some(epoch);
    e.grant = Some(&args.id);
    e.detail = Some("revoked");
    core.audit.record(&e);
    Ok(grants.info(core.control.binding().epoch()))
}

macro_rules! route {
    ($verb:ty, ($($e:ty),+), $f:expr) => {
        Arc::new(RouteEntry::new(Typed::<$verb, ($($e,)+), _>::new($f))) as RouteHandler
    };
}

pub(crate) fn capability(params: String) -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(CORE_GRANTS, capwire_manifest::Version::new(1, 0, 0))
        .params(params)
        .verb::<GrantsPresent>(route!(GrantsPresent, (Sender, Core), present))
        .verb::<GrantsInfoRead>(route!(GrantsInfoRead, (Core), info))
        .verb::<GrantsRevoke>(route!(GrantsRevoke, (Core), revoke))
}

impl CoreState {
    /// The grant key the peer `from` advertises on its session now.
    pub(crate) fn advertised_grant_key(&self, from: &NodeId) -> Option<GrantPublicKey> {
        let manifest = self.handle.peer(*from).manifest()?;
        advertised_key(&manifest)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, SystemTime};

    use capwire_manifest::{GetConfig, GrantsInfoRead, MonitoringDisable, NoArgs};

    use super::*;
    use crate::clock::{Clock, Stopped};
    use crate::core::grant_state::GrantState;
    use crate::grants::Right;
    use crate::store::memory::MemoryStore;
    use crate::store::{Loaded, Store, StoreError, TaskEventRecord};
    use crate::{CallError, Node};

    /// A store in memory that refuses every write while told to.
    #[derive(Debug)]
    struct Flaky {
        inner: MemoryStore,
        fail: AtomicBool,
    }

    impl Store for Flaky {
        fn load(&self) -> Result<Loaded, StoreError> {
            self.inner.load()
        }

        fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Write("refused on purpose".into()));
            }
            self.inner.commit(batch)
        }

        fn task_events(
            &self,
            id: &[u8],
            from: u64,
            limit: usize,
        ) -> Result<Vec<TaskEventRecord>, StoreError> {
            self.inner.task_events(id, from, limit)
        }

        fn task_args(&self, id: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.task_args(id)
        }
    }

    /// A binding change that cannot be written is undone: the control
    /// plane bound before it is bound again, under a new epoch, and it
    /// keeps the grant key its own bind took, so it can mint, and tokens
    /// it mints are accepted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_undone_binding_change_keeps_the_restored_control_planes_grant_key() {
        let store = Arc::new(Flaky {
            inner: MemoryStore::new(),
            fail: AtomicBool::new(false),
        });
        let node = Node::builder("agent")
            .listen("127.0.0.1:0".parse().unwrap())
            .start_on_store_for_testing(store.clone())
            .await
            .unwrap();
        let cp = Node::builder("cp").start().await.unwrap();
        let (to_node, _) = cp
            .connect_invite(&node.invite(Some(cp.id())).unwrap())
            .await
            .unwrap();
        let key = Some(cp.grant_key().to_string());
        let info = to_node.request(GrantsInfoRead, NoArgs {}).await.unwrap();
        assert_eq!(info.control_plane_key, key);

        // Another control plane's bind, which cannot be written.
        store.fail.store(true, Ordering::SeqCst);
        let other = Node::builder("other").start().await.unwrap();
        let refused = other
            .connect_invite(&node.invite(Some(other.id())).unwrap())
            .await;
        assert!(refused.is_err(), "the bind could not be written");
        assert_eq!(node.controller(), Some(cp.id()));
        // The control plane's own unbind, which cannot be written either.
        let refused = to_node.request(MonitoringDisable, NoArgs {}).await;
        assert!(matches!(refused, Err(CallError::Remote(_))), "{refused:?}");
        assert_eq!(node.controller(), Some(cp.id()));
        store.fail.store(false, Ordering::SeqCst);

        let after = to_node.request(GrantsInfoRead, NoArgs {}).await.unwrap();
        assert!(after.epoch > info.epoch, "a new epoch");
        assert_eq!(after.control_plane_key, key, "its grant key is kept");
        let worker = Node::builder("worker").start().await.unwrap();
        let from_worker = worker
            .connect(&node.local_addrs()[0], Some(node.id()))
            .await
            .unwrap();
        let token = cp
            .grant(
                &to_node,
                worker.id(),
                worker.grant_key(),
                vec![Right::verb("core.configuration", "get_config")],
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        from_worker.present(&token).await.unwrap();
        from_worker.request(GetConfig, NoArgs {}).await.unwrap();
        for n in [worker, other, cp, node] {
            n.shutdown().await;
        }
    }

    fn entry(id: u8, epoch: Option<u64>, until_ms: u64) -> RevocationEntry {
        RevocationEntry {
            id: vec![id; 64],
            until_ms,
            epoch,
        }
    }

    /// No token outlives its revocation: a revocation of a token the node
    /// never held is kept for as long as the binding it was made under,
    /// however long the token was minted for.
    #[test]
    fn a_revocation_is_kept_while_its_binding_lasts() {
        let made = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let record = RevocationsRecord {
            ids: vec![
                entry(1, Some(4), u64::MAX),
                // Written before revocations named their binding, with the
                // 30-day retention of then.
                entry(2, None, unix_ms(made + Duration::from_secs(30 * 86_400))),
                // Made under an earlier binding: refuses nothing now.
                entry(3, Some(3), u64::MAX),
                // Its token's expiry passed.
                entry(4, Some(4), unix_ms(made + Duration::from_secs(60))),
            ],
            clock_floor_ms: None,
        };
        let sixty_days_later = made + Duration::from_secs(60 * 86_400);
        let clock = Arc::new(Clock::new(Arc::new(Stopped(sixty_days_later))));
        let g = GrantState::new(&[7; 32], Some((4, None)), Some(record), clock);
        assert!(g.delegations.is_revoked(&[1; 64]), "kept past 30 days");
        assert!(!g.delegations.is_revoked(&[2; 64]), "as it was written");
        assert!(!g.delegations.is_revoked(&[3; 64]));
        assert!(!g.delegations.is_revoked(&[4; 64]));
        assert_eq!(g.info(4).revocations, 1);
        // A binding change forgets them: every token they refused is void.
        g.moved(5, None);
        assert!(!g.delegations.is_revoked(&[1; 64]));
        assert_eq!(g.info(5).revocations, 0);
    }

    /// A clock set back past the date a revocation was forgotten at (its
    /// token had expired) does not bring the token back after a restart:
    /// the stored floor holds the clock.
    #[test]
    fn a_clock_set_back_keeps_to_the_stored_floor() {
        let made = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let expired = unix_ms(made + Duration::from_secs(60));
        let record = |floor| RevocationsRecord {
            ids: vec![entry(4, Some(4), expired)],
            clock_floor_ms: floor,
        };
        let set_back = || Arc::new(Clock::new(Arc::new(Stopped(made))));
        let g = GrantState::new(&[7; 32], Some((4, None)), Some(record(None)), set_back());
        assert!(
            g.delegations.is_revoked(&[4; 64]),
            "no floor: as the clock says"
        );
        let g = GrantState::new(
            &[7; 32],
            Some((4, None)),
            Some(record(Some(expired + 1))),
            set_back(),
        );
        assert!(!g.delegations.is_revoked(&[4; 64]), "forgotten: expired");
        assert_eq!(unix_ms(g.clock.now()), expired + 1);
    }
}
