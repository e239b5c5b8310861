//! The authorizer gate for controller verbs.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use capwire_envelope::NodeId;

use crate::binding::Binding;
use crate::deny::Unauthorized;
use crate::error::AuthzError;

/// Decides whether a controller verb may run.
///
/// The gate only asks an authorizer once the sender is known to be the
/// bound control plane, so an authorizer can narrow what the control plane
/// may do but never widen it to anyone else. An error or a panic counts as
/// a refusal. It runs on the connection's task, before any handler: it
/// should decide quickly, without I/O or waiting.
///
/// A capwire node takes one with `NodeBuilder::authorizer` (the
/// repository's `examples/authorizer.rs` runs one); here it is with the
/// chokepoint alone:
///
/// ```
/// use capwire_authz::{Authorizer, AuthzError, Binding, Gate, decide};
/// use capwire_envelope::NodeId;
/// use capwire_manifest::{MonitoringHandlers, NodeInfo, Registry};
///
/// /// The control plane may call every controller verb but `disable`.
/// struct NoUnbind;
///
/// impl Authorizer for NoUnbind {
///     fn authorize(
///         &self,
///         _sender: &NodeId,
///         cap: &str,
///         verb: &str,
///         _binding: &Binding,
///     ) -> Result<bool, AuthzError> {
///         Ok((cap, verb) != ("core.monitoring", "disable"))
///     }
/// }
///
/// let registry = Registry::builder(
///     NodeInfo::new(NodeId::from_bytes([1; 32]), "demo"),
///     MonitoringHandlers { bind: "bind", disable: "disable" },
/// )
/// .build()?;
/// let control_plane = NodeId::from_bytes([2; 32]);
/// let binding = Binding::new(Some(control_plane), 1);
///
/// let gate = Gate::new(NoUnbind);
/// let decision = decide(&registry, &gate, &binding, &control_plane, "core.monitoring", "disable");
/// let reason = decision.into_result().unwrap_err();
/// assert_eq!(reason.code_str(), "unauthorized");
/// assert_eq!(reason.label(), "authorizer_refused");
/// // Bootstrap verbs never reach the authorizer.
/// assert!(decide(&registry, &gate, &binding, &control_plane, "core.monitoring", "bind").is_allowed());
/// # Ok::<(), capwire_manifest::ManifestError>(())
/// ```
pub trait Authorizer: Send + Sync {
    /// `Ok(true)` to allow `sender` to call `cap`/`verb` under `binding`.
    ///
    /// # Errors
    /// Any error denies the call.
    fn authorize(
        &self,
        sender: &NodeId,
        cap: &str,
        verb: &str,
        binding: &Binding,
    ) -> Result<bool, AuthzError>;
}

/// The default authorizer: allows exactly the bound control plane.
#[derive(Debug, Clone, Copy, Default)]
pub struct BoundController;

impl Authorizer for BoundController {
    fn authorize(
        &self,
        sender: &NodeId,
        _cap: &str,
        _verb: &str,
        binding: &Binding,
    ) -> Result<bool, AuthzError> {
        Ok(binding.is_controller(sender))
    }
}

/// The authorizer gate: holds the pluggable [`Authorizer`], or none.
///
/// Fail closed: with no authorizer ([`Gate::unset`]) every controller verb
/// is denied. [`Gate::default`] uses [`BoundController`].
#[derive(Clone)]
pub struct Gate {
    authorizer: Option<Arc<dyn Authorizer>>,
}

impl Gate {
    /// A gate with this authorizer.
    pub fn new(authorizer: impl Authorizer + 'static) -> Self {
        Self {
            authorizer: Some(Arc::new(authorizer)),
        }
    }

    /// A gate with a shared authorizer.
    pub fn from_arc(authorizer: Arc<dyn Authorizer>) -> Self {
        Self {
            authorizer: Some(authorizer),
        }
    }

    /// A gate with no authorizer: every controller verb is denied.
    pub fn unset() -> Self {
        Self { authorizer: None }
    }

    /// `true` when an authorizer is installed.
    pub fn is_set(&self) -> bool {
        self.authorizer.is_some()
    }

    /// Checks a controller verb. Never panics, even if the authorizer does.
    pub(crate) fn check(
        &self,
        sender: &NodeId,
        cap: &str,
        verb: &str,
        binding: &Binding,
    ) -> Result<(), Unauthorized> {
        let Some(authorizer) = &self.authorizer else {
            return Err(Unauthorized::AuthorizerUnset);
        };
        match binding.controller() {
            None => return Err(Unauthorized::NotBound),
            Some(controller) if controller != sender => return Err(Unauthorized::NotController),
            Some(_) => {}
        }
        match catch_unwind(AssertUnwindSafe(|| {
            authorizer.authorize(sender, cap, verb, binding)
        })) {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Unauthorized::AuthorizerRefused),
            Ok(Err(e)) => Err(Unauthorized::AuthorizerFailed(e.to_string().into())),
            Err(_) => Err(Unauthorized::AuthorizerPanicked),
        }
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new(BoundController)
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("authorizer", &if self.is_set() { "set" } else { "unset" })
            .finish()
    }
}
