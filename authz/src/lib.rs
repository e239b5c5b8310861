//! The capwire authorization chokepoint.
//!
//! Every inbound envelope goes through [`decide`], which is the only way to
//! obtain a [`Permit`], which is the only way to reach a handler:
//!
//! ```text
//!  (cap, verb) ──► control_auth_class ──deny──────────────► unknown_verb
//!                        │
//!                   bootstrap ──────────────────────────────► Permit
//!                        │
//!                   controller ──► Gate: bound control plane? ──yes──► Permit
//!                                  authorizer set, says yes?  ──no───► unauthorized
//! ```
//!
//! ```
//! use capwire_authz::{AuthClass, Binding, Decision, Gate, control_auth_class, decide};
//! use capwire_envelope::NodeId;
//! use capwire_manifest::{MonitoringHandlers, NodeInfo, Registry};
//!
//! let registry = Registry::builder(
//!     NodeInfo::new(NodeId::from_bytes([1; 32]), "demo"),
//!     MonitoringHandlers { bind: "bind handler", disable: "disable handler" },
//! )
//! .build()?;
//!
//! assert_eq!(control_auth_class(&registry, "core.monitoring", "bind"), AuthClass::Bootstrap);
//! assert_eq!(control_auth_class(&registry, "core.monitoring", "Disable"), AuthClass::Deny);
//!
//! let control_plane = NodeId::from_bytes([2; 32]);
//! let stranger = NodeId::from_bytes([3; 32]);
//! let binding = Binding::new(Some(control_plane), 1);
//! let gate = Gate::default();
//!
//! let Decision::Allowed(permit) =
//!     decide(&registry, &gate, &binding, &control_plane, "core.monitoring", "disable")
//! else {
//!     panic!("the bound control plane may disable");
//! };
//! assert_eq!(*permit.handler(), "disable handler");
//!
//! let denied = decide(&registry, &gate, &binding, &stranger, "core.monitoring", "disable");
//! let reason = denied.into_result().unwrap_err();
//! assert_eq!(reason.code_str(), "unauthorized");
//! assert_eq!(reason.to_string(), "unauthorized: the sender is not the bound control plane");
//!
//! // A binding change is seen by permits granted before it.
//! assert!(!permit.still_valid(&Binding::new(None, 2)));
//! # Ok::<(), capwire_manifest::ManifestError>(())
//! ```
//!
//! # Layout
//!
//! One file per concern, in layers; a file imports only from the layers
//! below it: `limits`, `binding`, `grant`, `deny` → `error`, `delegations`
//! → `bind`, `gate` → `decide`.

// Leaves: the bind ceremony's parameters, the binding snapshot, the
// reasons for a denial.
mod binding;
mod deny;
mod limits;

// The crate's error type; it names the bind-code format of `limits`.
mod error;

// The bind ceremony and the authorizer gate, side by side.
mod bind;
mod gate;

// Grants: delegated rights as biscuit tokens, and the tokens presented
// to the node.
mod delegations;
mod grant;

// The chokepoint: the decision function and the permit it grants.
mod decide;

pub use bind::{
    BindCode, BindFailure, BindUndo, BindingState, PendingInfo, Refused, SharedBinding,
};
pub use binding::Binding;
pub use capwire_manifest::{AuthClass, DeclaredClass};
pub use decide::{Decision, OwnedPermit, Permit, control_auth_class, decide, decide_with};
#[cfg(feature = "seeded-bugs")]
#[doc(hidden)]
pub use delegations::SEEDED_CACHE_OUTLIVES_REVOCATION;
pub use delegations::{
    Delegated, Delegations, GrantCounts, MAX_ANSWERS_PER_HOLDER, MAX_HOLDERS, MAX_REVOCATIONS,
    MAX_TOKENS_PER_HOLDER, TooManyRevocations,
};
pub use deny::{DenyReason, Unauthorized, Unlisted};
pub use error::AuthzError;
pub use gate::{Authorizer, BoundController, Gate};
pub use grant::{
    BadGrantKey, GRANT_MAX_BLOCKS, GRANT_MAX_LIFETIME, GRANT_MAX_TOKEN, GrantDenied, GrantError,
    GrantKey, GrantPublicKey, GrantSpec, Narrowing, Right, Verified, delegate, mint, narrow,
    never_granted, revocation_ids, verify,
};
pub use limits::{BIND_CODE_ALPHABET, BIND_CODE_LEN, BIND_MAX_ATTEMPTS, BIND_TTL};
