//! The authority running work was admitted under, held for as long as the
//! work runs (SECURITY.md, promise 8).
//!
//! The chokepoint decides once, when an envelope arrives; a stream, a
//! subscription or a task then goes on long after. Work admitted for the
//! bound control plane, or for the holder of a grant, holds an
//! [`Authority`] and asks it again before each thing it sends: the
//! control plane is still bound under the same binding epoch, or one of
//! the holder's kept tokens still grants the verb. A binding change or a
//! revocation bumps [`Authorities`] (every holder looks again at once); a
//! grant's answer also says until when it holds (a token's expiry), and
//! is asked again then.
//!
//! ```text
//!  bind / unbind / revoke ──► Authorities::changed ──► generation + 1, wake
//!                                                          │
//!  Items::send ──► Authority::holds (under the session's lock: nothing
//!                  queued after the change) ──no──► the stream ends `unauthorized`
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use capwire_authz::{
    Delegations, DenyReason, GrantDenied, OwnedPermit, SharedBinding, Unauthorized,
};
use capwire_envelope::NodeId;
use capwire_manifest::DeclaredClass;
use tokio::sync::Notify;

use crate::clock::Clock;

/// Where running work learns that authority may have ended: a counter
/// bumped by every binding change and every revocation, and a wake-up.
pub(crate) struct Authorities {
    generation: AtomicU64,
    changed: Notify,
    binding: Arc<SharedBinding>,
    delegations: Arc<Delegations>,
    clock: Arc<Clock>,
}

impl std::fmt::Debug for Authorities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorities")
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What let running work through the chokepoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Basis {
    /// The bound control plane, under this binding epoch.
    Binding { epoch: u64 },
    /// A token the sender presented, granting (`cap`, `verb`), under this
    /// binding epoch.
    Grant {
        epoch: u64,
        cap: Box<str>,
        verb: Box<str>,
    },
}

impl Authorities {
    pub(crate) fn new(
        binding: Arc<SharedBinding>,
        delegations: Arc<Delegations>,
        clock: Arc<Clock>,
    ) -> Self {
        Self {
            generation: AtomicU64::new(0),
            changed: Notify::new(),
            binding,
            delegations,
            clock,
        }
    }

    /// The date tokens expire by.
    pub(crate) fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Authority may have ended (a bind, an unbind, a revocation): every
    /// holder asks again before it sends anything more, and waiting ones
    /// wake.
    pub(crate) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The authority `holder` holds on `basis`.
    pub(crate) fn hold(self: &Arc<Self>, holder: NodeId, basis: Basis) -> Arc<Authority> {
        Arc::new(Authority {
            authorities: self.clone(),
            holder,
            basis,
            state: Mutex::new(Held {
                seen: None,
                until: None,
                lost: None,
            }),
        })
    }

    /// The authority a controller permit was granted on (`None` for a
    /// bootstrap verb, which depends on no authority).
    pub(crate) fn of_permit<H>(
        self: &Arc<Self>,
        permit: &OwnedPermit<H>,
    ) -> Option<Arc<Authority>> {
        if permit.class() != DeclaredClass::Controller {
            return None;
        }
        let epoch = permit.binding_epoch();
        let basis = match permit.grant() {
            None => Basis::Binding { epoch },
            Some(_) => Basis::Grant {
                epoch,
                cap: permit.info().cap().as_str().into(),
                verb: permit.info().verb().as_str().into(),
            },
        };
        Some(self.hold(*permit.sender(), basis))
    }
}

#[derive(Debug)]
struct Held {
    /// The generation at the last check that passed.
    seen: Option<u64>,
    /// When a grant's answer must be asked again.
    until: Option<SystemTime>,
    /// Why it ended, once it did: it never holds again.
    lost: Option<DenyReason>,
}

/// The authority one piece of running work holds.
pub(crate) struct Authority {
    authorities: Arc<Authorities>,
    holder: NodeId,
    basis: Basis,
    state: Mutex<Held>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("holder", &self.holder)
            .field("basis", &self.basis)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Authority {
    /// What it rests on.
    pub(crate) fn basis(&self) -> &Basis {
        &self.basis
    }

    /// Whether it still holds now. Cheap when nothing changed since it
    /// was last asked and its time has not come; otherwise the binding
    /// (and, for a grant, the holder's tokens) are asked again.
    ///
    /// # Errors
    /// Why it ended (for good: it is not asked again).
    pub(crate) fn check(&self) -> Result<(), DenyReason> {
        let mut held = lock(&self.state);
        if let Some(why) = &held.lost {
            return Err(why.clone());
        }
        // Read before the binding is: a change after this is seen next time.
        let generation = self.authorities.generation();
        let now = self.authorities.now();
        if held.seen == Some(generation) && held.until.is_none_or(|u| now < u) {
            return Ok(());
        }
        match self.ask(now) {
            Ok(until) => {
                held.seen = Some(generation);
                held.until = until;
                Ok(())
            }
            Err(why) => {
                held.lost = Some(why.clone());
                Err(why)
            }
        }
    }

    /// `true` when nothing changed since the last check that passed and
    /// its time has not come: what may be asked under another lock (it
    /// reads an atomic and the clock).
    pub(crate) fn unchanged(&self) -> bool {
        let held = lock(&self.state);
        held.lost.is_none()
            && held.seen == Some(self.authorities.generation())
            && held.until.is_none_or(|u| self.authorities.now() < u)
    }

    /// Asks the binding (and the tokens) now; for a grant, until when the
    /// answer holds.
    fn ask(&self, now: SystemTime) -> Result<Option<SystemTime>, DenyReason> {
        let changed = DenyReason::Unauthorized {
            why: Unauthorized::BindingChanged,
        };
        let binding = self.authorities.binding.snapshot();
        match &self.basis {
            Basis::Binding { epoch } => {
                if binding.epoch() == *epoch && binding.is_controller(&self.holder) {
                    Ok(None)
                } else {
                    Err(changed)
                }
            }
            Basis::Grant { epoch, cap, verb } => {
                if binding.epoch() != *epoch {
                    return Err(changed);
                }
                let answer =
                    self.authorities
                        .delegations
                        .check(&self.holder, cap, verb, &binding, now);
                match answer {
                    Some(Ok(d)) => Ok(Some(d.until)),
                    Some(Err(g)) => Err(DenyReason::Unauthorized {
                        why: Unauthorized::Grant(g),
                    }),
                    // Its tokens were dropped: revoked.
                    None => Err(DenyReason::Unauthorized {
                        why: Unauthorized::Grant(GrantDenied::Revoked),
                    }),
                }
            }
        }
    }

    /// Resolves when the authority ends, with why: at once after a change
    /// that ends it, or when a grant's answer runs out and is not given
    /// again.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn lost(&self) -> DenyReason {
        loop {
            let changed = self.authorities.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Err(why) = self.check() {
                return why;
            }
            let until = lock(&self.state).until;
            match until {
                Some(at) => {
                    // Asked again at least every second: a clock moved
                    // forward ends it without waiting out the old date.
                    let left = at
                        .duration_since(self.authorities.now())
                        .unwrap_or_default()
                        .min(std::time::Duration::from_secs(1));
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep(left) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capwire_authz::{Binding, BindingState};

    fn node(n: u8) -> NodeId {
        NodeId::from_bytes([n; 32])
    }

    #[test]
    fn a_binding_change_ends_a_control_planes_authority_for_good() {
        let cp = node(1);
        let binding = Arc::new(SharedBinding::new(BindingState::restore_binding(
            Binding::new(Some(cp), 4),
        )));
        let all = Arc::new(Authorities::new(
            binding.clone(),
            Arc::new(Delegations::default()),
            Arc::default(),
        ));
        let held = all.hold(cp, Basis::Binding { epoch: 4 });
        assert!(held.check().is_ok());
        assert!(held.unchanged(), "asked once, cheap after");
        let other = all.hold(node(2), Basis::Binding { epoch: 4 });
        assert!(other.check().is_err(), "only the bound control plane");

        assert!(binding.unbind().is_some());
        assert!(held.unchanged(), "not seen before the change is told");
        all.changed();
        assert!(!held.unchanged());
        let why = held.check().unwrap_err();
        assert_eq!(why.label(), "binding_changed");
        // Never again, whatever the binding does next.
        let _ = binding.snapshot();
        assert!(held.check().is_err());
    }

    #[tokio::test]
    async fn lost_wakes_at_the_change() {
        let cp = node(1);
        let binding = Arc::new(SharedBinding::new(BindingState::restore_binding(
            Binding::new(Some(cp), 1),
        )));
        let all = Arc::new(Authorities::new(
            binding.clone(),
            Arc::new(Delegations::default()),
            Arc::default(),
        ));
        let held = all.hold(cp, Basis::Binding { epoch: 1 });
        let waiting = tokio::spawn({
            let held = held.clone();
            async move { held.lost().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        binding.unbind();
        all.changed();
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("not panicked");
        assert_eq!(why.code_str(), "unauthorized");
    }
}
