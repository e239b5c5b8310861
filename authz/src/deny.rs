//! Why the chokepoint denies: the typed reasons of a denied decision and
//! the wire error code each one maps to.
//!
//! A leaf below the gate and the decision function, which both produce
//! these reasons.

use std::fmt;

use capwire_envelope::{ErrorBody, ErrorCode};

/// Why a (cap, verb) pair is not in the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unlisted {
    /// No capability has this exact id.
    UnknownCapability,
    /// The capability exists but has no verb of this exact name.
    UnknownVerb,
}

impl Unlisted {
    /// A stable label for counters and traces.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::UnknownCapability => "unknown_capability",
            Self::UnknownVerb => "unknown_verb",
        }
    }
}

impl fmt::Display for Unlisted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownCapability => "no capability with this exact id",
            Self::UnknownVerb => "the capability has no verb with this exact name",
        })
    }
}

/// Why a controller verb was refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unauthorized {
    /// No authorizer is installed (fail closed).
    AuthorizerUnset,
    /// No control plane is bound.
    NotBound,
    /// The sender is not the bound control plane.
    NotController,
    /// The authorizer said no.
    AuthorizerRefused,
    /// The authorizer returned an error.
    AuthorizerFailed(Box<str>),
    /// The authorizer panicked.
    AuthorizerPanicked,
    /// The binding changed between the decision and the execution.
    BindingChanged,
    /// The sender is not the bound control plane, and no token it
    /// presented lets it call this verb now.
    Grant(crate::GrantDenied),
}

impl Unauthorized {
    /// A stable label for counters and traces.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::AuthorizerUnset => "authorizer_unset",
            Self::NotBound => "not_bound",
            Self::NotController => "not_controller",
            Self::AuthorizerRefused => "authorizer_refused",
            Self::AuthorizerFailed(_) => "authorizer_failed",
            Self::AuthorizerPanicked => "authorizer_panicked",
            Self::BindingChanged => "binding_changed",
            Self::Grant(g) => g.label(),
        }
    }
}

impl fmt::Display for Unauthorized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AuthorizerUnset => f.write_str("no authorizer is installed"),
            Self::NotBound => f.write_str("no control plane is bound"),
            Self::NotController => f.write_str("the sender is not the bound control plane"),
            Self::AuthorizerRefused => f.write_str("the authorizer refused"),
            Self::AuthorizerFailed(e) => write!(f, "the authorizer failed: {e}"),
            Self::AuthorizerPanicked => f.write_str("the authorizer panicked"),
            Self::BindingChanged => f.write_str("the binding changed before the verb ran"),
            Self::Grant(g) => write!(f, "the sender is not the bound control plane and {g}"),
        }
    }
}

/// Why the chokepoint denied an envelope.
///
/// Each reason maps to one wire error code ([`DenyReason::code_str`]); its
/// `Display` explains the decision (for logs, never containing the
/// attacker's strings).
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum DenyReason {
    /// Classified `deny`: not declared under these exact bytes.
    /// Wire code `unknown_verb`.
    #[error("unknown verb: {why}")]
    UnknownVerb {
        /// What is missing.
        why: Unlisted,
    },
    /// A controller verb the sender may not call. Wire code `unauthorized`.
    #[error("unauthorized: {why}")]
    Unauthorized {
        /// Why.
        why: Unauthorized,
    },
}

impl DenyReason {
    /// The wire error code: [`ErrorCode::UnknownVerb`] or
    /// [`ErrorCode::Unauthorized`].
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownVerb { .. } => ErrorCode::UnknownVerb,
            Self::Unauthorized { .. } => ErrorCode::Unauthorized,
        }
    }

    /// The error half of the response that answers a denied request: the
    /// code, and the reason's explanation as the message (without the code
    /// again), no detail.
    pub fn error_body(&self) -> ErrorBody {
        let why = match self {
            Self::UnknownVerb { why } => why.to_string(),
            Self::Unauthorized { why } => why.to_string(),
        };
        ErrorBody::new(self.code(), why)
    }

    /// The wire error code as text: `"unknown_verb"` or `"unauthorized"`.
    pub fn code_str(&self) -> &'static str {
        match self {
            Self::UnknownVerb { .. } => "unknown_verb",
            Self::Unauthorized { .. } => "unauthorized",
        }
    }

    /// A stable, finer label for counters and traces, e.g. `"not_bound"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::UnknownVerb { why } => why.as_str(),
            Self::Unauthorized { why } => why.as_str(),
        }
    }
}
