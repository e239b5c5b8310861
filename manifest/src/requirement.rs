//! Version requirements such as `app.echo@^1.2`.
//!
//! A leaf: the value and its grammar only. Checking one against a manifest
//! is [`CapRequirement::check`], in `manifest.rs`; its `FromStr` is in
//! `error.rs`, since the error it fails with carries a requirement.

use std::fmt;

use capwire_envelope::CapId;
use semver::VersionReq;

/// A capability a caller requires, with a semver range.
///
/// Text form: `<cap id>` or `<cap id>@<semver requirement>`, e.g.
/// `app.echo@^1.2` or `app.echo@>=1.0, <3`. Without `@` any version will do.
///
/// ```
/// use capwire_manifest::CapRequirement;
/// let req: CapRequirement = "app.echo@^1.2".parse().unwrap();
/// assert_eq!(req.cap().as_str(), "app.echo");
/// assert!(req.req().matches(&"1.4.0".parse().unwrap()));
/// assert!(!req.req().matches(&"2.0.0".parse().unwrap()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapRequirement {
    cap: CapId,
    req: VersionReq,
}

impl CapRequirement {
    /// A requirement from its parts.
    pub fn new(cap: CapId, req: VersionReq) -> Self {
        Self { cap, req }
    }

    /// The capability required.
    pub fn cap(&self) -> &CapId {
        &self.cap
    }

    /// The accepted versions.
    pub fn req(&self) -> &VersionReq {
        &self.req
    }

    /// Parses the text form; on failure, says what is wrong with it.
    ///
    /// The `FromStr` and `TryFrom<&str>` impls (in `error.rs`, next to the
    /// error they fail with) wrap this into
    /// [`ManifestError::BadRequirement`](crate::ManifestError::BadRequirement).
    pub(crate) fn from_text(s: &str) -> Result<Self, String> {
        let (cap, req) = match s.split_once('@') {
            Some((cap, req)) => (cap, Some(req)),
            None => (s, None),
        };
        let cap = CapId::try_from(cap).map_err(|e| e.to_string())?;
        let req = match req {
            None => VersionReq::STAR,
            Some(r) if r.trim().is_empty() => return Err("empty version range".to_owned()),
            Some(r) => VersionReq::parse(r).map_err(|e| e.to_string())?,
        };
        Ok(Self { cap, req })
    }
}

impl fmt::Display for CapRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.req == VersionReq::STAR {
            write!(f, "{}", self.cap)
        } else {
            write!(f, "{}@{}", self.cap, self.req)
        }
    }
}
