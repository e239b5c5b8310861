//! Version requirements such as `app.echo@^1.2`.

use std::fmt;
use std::str::FromStr;

use capwire_envelope::CapId;
use semver::VersionReq;

use crate::error::ManifestError;
use crate::manifest::{CapabilityManifest, Manifest};

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

    /// Finds the capability in `manifest` and checks its version.
    ///
    /// # Errors
    /// [`ManifestError::VersionUnsatisfied`] when the manifest does not offer
    /// the capability (`found: None`) or offers a version outside the range.
    pub fn check<'m>(
        &self,
        manifest: &'m Manifest,
    ) -> Result<&'m CapabilityManifest, ManifestError> {
        match manifest.capability(self.cap.as_str()) {
            Some(cap) if self.req.matches(&cap.version) => Ok(cap),
            found => Err(ManifestError::VersionUnsatisfied {
                wanted: self.clone(),
                found: found.map(|c| c.version.clone()),
            }),
        }
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

impl FromStr for CapRequirement {
    type Err = ManifestError;

    fn from_str(s: &str) -> Result<Self, ManifestError> {
        let bad = |why: String| ManifestError::BadRequirement {
            input: s.to_owned(),
            why,
        };
        let (cap, req) = match s.split_once('@') {
            Some((cap, req)) => (cap, Some(req)),
            None => (s, None),
        };
        let cap = CapId::try_from(cap).map_err(|e| bad(e.to_string()))?;
        let req = match req {
            None => VersionReq::STAR,
            Some(r) if r.trim().is_empty() => return Err(bad("empty version range".to_owned())),
            Some(r) => VersionReq::parse(r).map_err(|e| bad(e.to_string()))?,
        };
        Ok(Self { cap, req })
    }
}

impl TryFrom<&str> for CapRequirement {
    type Error = ManifestError;

    fn try_from(s: &str) -> Result<Self, ManifestError> {
        s.parse()
    }
}
