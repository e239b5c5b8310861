//! The crate's error type.

use capwire_envelope::{CapId, IdError, Verb};
use semver::Version;

use crate::requirement::CapRequirement;

/// Everything that can go wrong in this crate.
///
/// The registry variants are API misuse by whoever declares capabilities:
/// [`RegistryBuilder::build`](crate::RegistryBuilder::build) returns the
/// first breach in declaration order. [`VersionUnsatisfied`](Self::VersionUnsatisfied)
/// is a peer that does not offer what a caller requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// A capability id is not well formed.
    #[error("capability id {cap:?} is not well formed: {source}")]
    InvalidCapId {
        /// The id as declared.
        cap: String,
        /// What is wrong with it.
        source: IdError,
    },
    /// A verb name is not well formed.
    #[error("verb {verb:?} of {cap} is not well formed: {source}")]
    InvalidVerb {
        /// The capability.
        cap: CapId,
        /// The verb as declared.
        verb: String,
        /// What is wrong with it.
        source: IdError,
    },
    /// An application capability was declared under the reserved `core.*`
    /// namespace.
    #[error("{cap}: `core.*` is reserved for the framework; applications use `app.*`")]
    ReservedNamespace {
        /// The capability.
        cap: CapId,
    },
    /// A core capability was declared outside `core.*`.
    #[error("{cap}: a core capability must be under `core.*`")]
    NotCoreNamespace {
        /// The capability.
        cap: CapId,
    },
    /// The same capability id was declared twice.
    #[error("capability {cap} is declared twice")]
    DuplicateCapability {
        /// The capability.
        cap: CapId,
    },
    /// The same (cap, verb) pair was declared twice.
    #[error("verb {cap}/{verb} is declared twice")]
    DuplicateVerb {
        /// The capability.
        cap: CapId,
        /// The verb.
        verb: Verb,
    },
    /// A verb has no explicit auth class, so it would be unreachable by
    /// accident rather than by choice.
    #[error("verb {cap}/{verb} has no auth class (bootstrap or controller)")]
    MissingAuthClass {
        /// The capability.
        cap: CapId,
        /// The verb.
        verb: Verb,
    },
    /// A notification declares a result, but notifications are never
    /// answered.
    #[error("notification {cap}/{verb} declares a result")]
    NotificationWithResult {
        /// The capability.
        cap: CapId,
        /// The verb.
        verb: Verb,
    },
    /// A verb has no handler.
    #[error("verb {cap}/{verb} has no handler")]
    MissingHandler {
        /// The capability.
        cap: CapId,
        /// The verb.
        verb: Verb,
    },
    /// A capability declares no verb at all: it would be advertised as
    /// supported with nothing to handle it.
    #[error("capability {cap} is declared with no verb to handle it")]
    CapabilityWithoutHandler {
        /// The capability.
        cap: CapId,
    },
    /// A typed verb was added to a capability other than its own.
    #[error("verb {verb} belongs to {declared}, not to {cap}")]
    VerbInWrongCapability {
        /// The capability it was added to.
        cap: CapId,
        /// The verb.
        verb: Verb,
        /// The capability its definition names.
        declared: &'static str,
    },
    /// A descriptive field is longer than the manifest allows.
    #[error("{field} is {len} bytes long, the limit is {max}")]
    FieldTooLong {
        /// Which field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A version requirement such as `app.echo@^1.2` could not be parsed.
    #[error("bad version requirement {input:?}: {why}")]
    BadRequirement {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// A peer does not offer a capability in the required version range.
    #[error("{wanted} is required, but {}", match found {
        Some(v) => format!("the peer offers {v}"),
        None => "the peer does not offer it".to_owned(),
    })]
    VersionUnsatisfied {
        /// What the caller requires.
        wanted: CapRequirement,
        /// The version the peer offers, if it offers the capability at all.
        found: Option<Version>,
    },
}

impl ManifestError {
    /// The wire error code for errors a caller sees before sending:
    /// `"version_unsatisfied"` for [`VersionUnsatisfied`](Self::VersionUnsatisfied),
    /// `None` for the others (they are local API misuse).
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Self::VersionUnsatisfied { .. } => Some("version_unsatisfied"),
            _ => None,
        }
    }
}
