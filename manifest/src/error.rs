//! The crate's error type, and the parsing of the one crate type it
//! carries, [`CapRequirement`], which fails with it.
//!
//! Imports nothing from the crate but the leaf `requirement.rs`.

use std::str::FromStr;

use capwire_envelope::{CapId, DecodeError, EncodeError, IdError, Verb};
use semver::Version;

use crate::requirement::CapRequirement;

/// Everything that can go wrong in this crate.
///
/// Who is at fault depends on where an error comes from:
/// - from [`RegistryBuilder::build`](crate::RegistryBuilder::build): API
///   misuse by whoever declares capabilities (the first breach, in
///   declaration order, then the rules of the manifest the registry would
///   send);
/// - from [`Manifest::decode_checked`](crate::Manifest::decode_checked):
///   the peer that sent the manifest, which the runtime then closes with
///   `protocol_error`; [`Manifest::validate`](crate::Manifest::validate)
///   names the same breaches on a manifest value;
/// - [`VersionUnsatisfied`](Self::VersionUnsatisfied): a peer that does not
///   offer what a caller requires.
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
    /// The same capability id was declared, or is listed, twice.
    #[error("capability {cap} is declared twice")]
    DuplicateCapability {
        /// The capability.
        cap: CapId,
    },
    /// The same (cap, verb) pair was declared, or is listed, twice.
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
    /// A capability declares, or a manifest lists, no verb at all: it would
    /// be advertised as supported with nothing to handle it.
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
    /// `app_id`, `name` or `description` is longer than the manifest
    /// allows ([`MAX_APP_ID_LEN`](crate::MAX_APP_ID_LEN),
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN),
    /// [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN)).
    #[error("{field} is {len} bytes long, the limit is {max}")]
    FieldTooLong {
        /// Which field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A capability's params text is longer than
    /// [`MAX_PARAMS_LEN`](crate::MAX_PARAMS_LEN).
    #[error("params of {cap} is {len} bytes long, the limit is {max}")]
    ParamsTooLong {
        /// The capability.
        cap: CapId,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A verb's args or result schema is longer than
    /// [`MAX_SCHEMA_LEN`](crate::MAX_SCHEMA_LEN).
    #[error("{field} of {cap}/{verb} is {len} bytes long, the limit is {max}")]
    SchemaTooLong {
        /// The capability.
        cap: CapId,
        /// The verb.
        verb: Verb,
        /// `args_schema` or `result_schema`.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More capabilities than [`MAX_CAPABILITIES`](crate::MAX_CAPABILITIES),
    /// `core.monitoring` included.
    #[error("{count} capabilities, the limit is {max}")]
    TooManyCapabilities {
        /// How many there are.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A capability with more verbs than [`MAX_VERBS`](crate::MAX_VERBS).
    #[error("capability {cap} has {count} verbs, the limit is {max}")]
    TooManyVerbs {
        /// The capability.
        cap: CapId,
        /// How many verbs it has.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A manifest lists its capabilities out of order: they must be sorted
    /// by id, bytewise.
    #[error("capabilities must be sorted by id, but {after} follows {before}")]
    CapabilitiesNotSorted {
        /// The earlier id.
        before: CapId,
        /// The id that should have come before it.
        after: CapId,
    },
    /// A manifest lists a capability's verbs out of order: they must be
    /// sorted by name, bytewise.
    #[error("verbs of {cap} must be sorted by name, but {after} follows {before}")]
    VerbsNotSorted {
        /// The capability.
        cap: CapId,
        /// The earlier verb.
        before: Verb,
        /// The verb that should have come before it.
        after: Verb,
    },
    /// A manifest does not list `core.monitoring`, which every node has.
    #[error("the manifest does not list core.monitoring")]
    MissingCoreMonitoring,
    /// A manifest lists `core.monitoring` without `bind` (request,
    /// bootstrap) or `disable` (request, controller), or with one of them
    /// of another kind or class.
    #[error(
        "core.monitoring must have bind (request, bootstrap) and \
         disable (request, controller), not {found}"
    )]
    CoreMonitoringMismatch {
        /// The verbs it has, with their kinds and classes (the first few).
        found: String,
    },
    /// The encoded manifest is longer than
    /// [`MAX_MANIFEST_LEN`](crate::MAX_MANIFEST_LEN).
    #[error("the encoded manifest is {len} bytes long, the limit is {max}")]
    ManifestTooLarge {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The bytes are not a manifest: they break the strict CBOR profile or
    /// the layout of `WIRE.md` section 3.1, such as a missing or unknown
    /// key, a value of the wrong type, a capability id or verb name that
    /// breaks its grammar, or a version that is not semver.
    #[error("not a valid manifest: {0}")]
    Decode(#[source] DecodeError),
    /// The manifest cannot be encoded (to measure its length).
    #[error("the manifest cannot be encoded: {0}")]
    Encode(#[source] EncodeError),
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

impl FromStr for CapRequirement {
    type Err = ManifestError;

    fn from_str(s: &str) -> Result<Self, ManifestError> {
        CapRequirement::from_text(s).map_err(|why| ManifestError::BadRequirement {
            input: s.to_owned(),
            why,
        })
    }
}

impl TryFrom<&str> for CapRequirement {
    type Error = ManifestError;

    fn try_from(s: &str) -> Result<Self, ManifestError> {
        s.parse()
    }
}
