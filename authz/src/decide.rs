//! The one decision function and the permit it grants.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use capwire_envelope::NodeId;
use capwire_manifest::{AuthClass, DeclaredClass, Registry, Route, VerbInfo};

use crate::binding::Binding;
use crate::delegations::Delegations;
use crate::deny::{DenyReason, Unauthorized, Unlisted};
use crate::gate::Gate;

/// The chokepoint's answer for one envelope.
#[must_use = "a decision must be acted on: run the handler only with its permit"]
pub enum Decision<'r, H> {
    /// The handler may run, with this permit.
    Allowed(Permit<'r, H>),
    /// No handler runs.
    Denied(DenyReason),
}

impl<'r, H> Decision<'r, H> {
    /// `true` when allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allowed(_))
    }

    /// The permit, or the reason.
    ///
    /// # Errors
    /// The [`DenyReason`] when denied.
    pub fn into_result(self) -> Result<Permit<'r, H>, DenyReason> {
        match self {
            Self::Allowed(p) => Ok(p),
            Self::Denied(r) => Err(r),
        }
    }
}

impl<H> fmt::Debug for Decision<'_, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Allowed(p) => f.debug_tuple("Allowed").field(p).finish(),
            Self::Denied(r) => f.debug_tuple("Denied").field(r).finish(),
        }
    }
}

/// Permission to run one route's handler, granted by [`decide`] and by
/// nothing else: it has no public constructor.
///
/// It records the sender and the binding epoch it was granted under;
/// [`recheck`](Permit::recheck) it against the current binding right before
/// the handler runs, so that a bind or unbind takes effect for envelopes
/// already queued.
#[must_use = "a permit is the only way to reach a handler"]
pub struct Permit<'r, H> {
    route: &'r Route<H>,
    sender: NodeId,
    epoch: u64,
    grant: Option<Arc<str>>,
}

impl<'r, H> Permit<'r, H> {
    /// The handler to run.
    pub fn handler(&self) -> &'r H {
        self.route.dangerous_handler()
    }

    /// The verb's metadata (cap, verb, kind, class, schemas).
    pub fn info(&self) -> &'r Arc<VerbInfo> {
        self.route.info()
    }

    /// The authenticated sender the permit was granted to.
    pub fn sender(&self) -> &NodeId {
        &self.sender
    }

    /// The verb's class.
    pub fn class(&self) -> DeclaredClass {
        self.route.class()
    }

    /// The binding epoch the permit was granted under.
    pub fn binding_epoch(&self) -> u64 {
        self.epoch
    }

    /// The token (its first revocation id, hex) that let a controller
    /// verb through for a sender that is not the bound control plane.
    pub fn grant(&self) -> Option<&Arc<str>> {
        self.grant.as_ref()
    }

    /// Checks the permit against the binding at execution time.
    ///
    /// # Errors
    /// [`Unauthorized::BindingChanged`] for a controller verb when the
    /// binding epoch differs from the one the permit was granted under, or
    /// the sender is no longer the bound control plane (a permit a grant
    /// let through holds while the epoch is the same). Bootstrap permits
    /// always hold.
    pub fn recheck(&self, binding: &Binding) -> Result<(), DenyReason> {
        recheck(
            self.class(),
            &self.sender,
            self.epoch,
            self.grant.is_some(),
            binding,
        )
    }

    /// `true` when [`recheck`](Permit::recheck) passes.
    pub fn still_valid(&self, binding: &Binding) -> bool {
        self.recheck(binding).is_ok()
    }

    /// An owned permit that can move into a task, holding a clone of the
    /// handler (e.g. an `Arc`).
    pub fn into_owned(self) -> OwnedPermit<H>
    where
        H: Clone,
    {
        OwnedPermit {
            info: Arc::clone(self.route.info()),
            handler: self.route.dangerous_handler().clone(),
            sender: self.sender,
            epoch: self.epoch,
            grant: self.grant,
        }
    }
}

impl<H> fmt::Debug for Permit<'_, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("cap", self.info().cap())
            .field("verb", self.info().verb())
            .field("class", &self.class())
            .field("sender", &self.sender)
            .field("epoch", &self.epoch)
            .finish()
    }
}

/// A [`Permit`] that owns its handler and metadata; made only by
/// [`Permit::into_owned`].
#[must_use = "a permit is the only way to reach a handler"]
pub struct OwnedPermit<H> {
    info: Arc<VerbInfo>,
    handler: H,
    sender: NodeId,
    epoch: u64,
    grant: Option<Arc<str>>,
}

impl<H> OwnedPermit<H> {
    /// The handler to run.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// The verb's metadata.
    pub fn info(&self) -> &Arc<VerbInfo> {
        &self.info
    }

    /// The authenticated sender the permit was granted to.
    pub fn sender(&self) -> &NodeId {
        &self.sender
    }

    /// The verb's class.
    pub fn class(&self) -> DeclaredClass {
        self.info.class()
    }

    /// The binding epoch the permit was granted under.
    pub fn binding_epoch(&self) -> u64 {
        self.epoch
    }

    /// See [`Permit::grant`].
    pub fn grant(&self) -> Option<&Arc<str>> {
        self.grant.as_ref()
    }

    /// See [`Permit::recheck`].
    ///
    /// # Errors
    /// As [`Permit::recheck`].
    pub fn recheck(&self, binding: &Binding) -> Result<(), DenyReason> {
        recheck(
            self.class(),
            &self.sender,
            self.epoch,
            self.grant.is_some(),
            binding,
        )
    }

    /// `true` when [`recheck`](OwnedPermit::recheck) passes.
    pub fn still_valid(&self, binding: &Binding) -> bool {
        self.recheck(binding).is_ok()
    }
}

impl<H> fmt::Debug for OwnedPermit<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("cap", self.info.cap())
            .field("verb", self.info.verb())
            .field("class", &self.class())
            .field("sender", &self.sender)
            .field("epoch", &self.epoch)
            .finish()
    }
}

fn recheck(
    class: DeclaredClass,
    sender: &NodeId,
    epoch: u64,
    delegated: bool,
    binding: &Binding,
) -> Result<(), DenyReason> {
    match class {
        DeclaredClass::Bootstrap => Ok(()),
        DeclaredClass::Controller
            if binding.epoch() == epoch && (delegated || binding.is_controller(sender)) =>
        {
            Ok(())
        }
        DeclaredClass::Controller => Err(DenyReason::Unauthorized {
            why: Unauthorized::BindingChanged,
        }),
    }
}

/// Classifies `cap`/`verb` as the registry declares it.
///
/// Total: any strings, including empty ones, NUL bytes, other case,
/// surrounding spaces, confusable letters and path-like names, are matched
/// as exact bytes, and whatever is not declared is [`AuthClass::Deny`].
/// Never panics; does not allocate.
pub fn control_auth_class<H>(registry: &Registry<H>, cap: &str, verb: &str) -> AuthClass {
    registry
        .lookup(cap, verb)
        .map_or(AuthClass::Deny, |route| route.class().into())
}

/// The chokepoint: decides whether `sender` may have `cap`/`verb` run.
///
/// 1. classify ([`control_auth_class`]): `deny` → [`DenyReason::UnknownVerb`];
/// 2. `bootstrap` → allowed;
/// 3. `controller` → the [`Gate`] must confirm that `sender` is the bound
///    control plane of `binding` and that its authorizer agrees; an unset,
///    failing or panicking authorizer denies → [`DenyReason::Unauthorized`].
///
/// Pure: reads its arguments only. `sender` must be the channel's
/// authenticated static key, never a field of the envelope. Never panics;
/// allocates only when an authorizer returns an error.
pub fn decide<'r, H>(
    registry: &'r Registry<H>,
    gate: &Gate,
    binding: &Binding,
    sender: &NodeId,
    cap: &str,
    verb: &str,
) -> Decision<'r, H> {
    decide_with(registry, gate, binding, sender, cap, verb, None)
}

/// [`decide`], and for a controller verb from a sender that is not the
/// bound control plane, the tokens it presented (`delegations`, asked
/// at `now`): one that grants this verb now lets it through, as long as
/// the authorizer would let the control plane itself call it. The
/// permit then names the token ([`Permit::grant`]).
pub fn decide_with<'r, H>(
    registry: &'r Registry<H>,
    gate: &Gate,
    binding: &Binding,
    sender: &NodeId,
    cap: &str,
    verb: &str,
    delegations: Option<(&Delegations, SystemTime)>,
) -> Decision<'r, H> {
    let Some(route) = registry.lookup(cap, verb) else {
        let why = if registry.has_capability(cap) {
            Unlisted::UnknownVerb
        } else {
            Unlisted::UnknownCapability
        };
        return Decision::Denied(DenyReason::UnknownVerb { why });
    };
    let mut grant = None;
    if route.class() == DeclaredClass::Controller
        && let Err(why) = gate.check(sender, cap, verb, binding)
    {
        let delegated = match (&why, delegations, binding.controller()) {
            (Unauthorized::NotController, Some((d, now)), Some(controller)) => d
                .check(sender, cap, verb, binding, now)
                .map(|r| (r, *controller)),
            _ => None,
        };
        match delegated {
            None => return Decision::Denied(DenyReason::Unauthorized { why }),
            Some((Err(g), _)) => {
                return Decision::Denied(DenyReason::Unauthorized {
                    why: Unauthorized::Grant(g),
                });
            }
            // Never more than the control plane has: its authorizer is
            // asked as for the control plane itself.
            Some((Ok(d), controller)) => {
                if let Err(why) = gate.check(&controller, cap, verb, binding) {
                    return Decision::Denied(DenyReason::Unauthorized { why });
                }
                grant = Some(d.grant);
            }
        }
    }
    Decision::Allowed(Permit {
        route,
        sender: *sender,
        epoch: binding.epoch(),
        grant,
    })
}
