//! The crate's error type.

use crate::limits::{BIND_CODE_ALPHABET, BIND_CODE_LEN};

/// Everything that can go wrong in this crate, apart from the typed reasons
/// of a decision ([`DenyReason`](crate::DenyReason)) or a failed bind
/// ([`BindFailure`](crate::BindFailure)), which are outcomes, not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthzError {
    /// The random number generator failed; no code was made (no fallback).
    #[error("the random number generator failed")]
    RngFailed,
    /// A bind code given to [`BindCode::parse`](crate::BindCode::parse) is
    /// not in the bind-code format.
    #[error("a bind code is {len} characters of {alphabet}", len = BIND_CODE_LEN, alphabet = BIND_CODE_ALPHABET)]
    MalformedCode,
    /// A pluggable [`Authorizer`](crate::Authorizer) could not decide.
    #[error("the authorizer failed: {0}")]
    Authorizer(String),
}
