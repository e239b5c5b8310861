//! The rules every manifest keeps (`WIRE.md` section 3.1), checked on a
//! peer's manifest when it arrives and on a node's own when its registry is
//! built.
//!
//! Above the manifest format (it adds [`Manifest::validate`] and
//! [`Manifest::decode_checked`]) and below the registry, which holds its own
//! manifest to these rules. The bounds themselves are in `limits.rs`.

use std::fmt::Write as _;

use capwire_envelope::{CapId, Verb, from_slice, to_vec};

use crate::class::{DeclaredClass, VerbKind};
use crate::error::ManifestError;
use crate::limits::{
    MAX_APP_ID_LEN, MAX_CAPABILITIES, MAX_DESCRIPTION_LEN, MAX_MANIFEST_LEN, MAX_NAME_LEN,
    MAX_PARAMS_LEN, MAX_SCHEMA_LEN, MAX_VERBS,
};
use crate::manifest::{CapabilityManifest, Manifest};
use crate::monitoring::CORE_MONITORING;

/// The verbs `core.monitoring` has, each with its kind and class, by name.
const MONITORING_VERBS: [(&str, VerbKind, DeclaredClass); 2] = [
    ("bind", VerbKind::Request, DeclaredClass::Bootstrap),
    ("disable", VerbKind::Request, DeclaredClass::Controller),
];

/// How many of `core.monitoring`'s verbs an error message lists.
const SHOWN_VERBS: usize = 4;

impl Manifest {
    /// Checks every rule of a manifest (`WIRE.md` section 3.1) that its
    /// value can break, and returns the first breach.
    ///
    /// In order: the lengths of `app_id`, `name` and `description`; at most
    /// [`MAX_CAPABILITIES`] capabilities, sorted by id, bytewise and
    /// strictly increasing (so no id twice); for each capability, params of
    /// at most [`MAX_PARAMS_LEN`] bytes, from 1 to [`MAX_VERBS`] verbs,
    /// sorted by name and strictly increasing, each with schemas of at most
    /// [`MAX_SCHEMA_LEN`] bytes and, for a notification, no result schema;
    /// and `core.monitoring` with exactly its verbs `bind` (request,
    /// bootstrap) and `disable` (request, controller).
    ///
    /// The grammar of capability ids and verb names and the semver version
    /// need no check here: the field types ([`CapId`], [`Verb`](capwire_envelope::Verb),
    /// [`Version`](semver::Version)) cannot hold anything else, and decoding
    /// refuses what does not fit them. The bound on the encoded size,
    /// [`MAX_MANIFEST_LEN`], is a property of the bytes:
    /// [`Manifest::decode_checked`] checks it before decoding, and the
    /// registry checks it on its own manifest when it is built.
    ///
    /// ```
    /// # use capwire_envelope::NodeId;
    /// # use capwire_manifest::*;
    /// let registry = Registry::builder(
    ///     NodeInfo::new(NodeId::from_bytes([1; 32]), "demo"),
    ///     MonitoringHandlers { bind: (), disable: () },
    /// )
    /// .build()?;
    /// let mut manifest = registry.manifest(MonitoringStatus::Off, 1);
    /// manifest.validate()?;
    ///
    /// manifest.capabilities.clear();
    /// assert_eq!(manifest.validate(), Err(ManifestError::MissingCoreMonitoring));
    /// # Ok::<(), ManifestError>(())
    /// ```
    ///
    /// # Errors
    /// [`ManifestError::FieldTooLong`], [`ManifestError::TooManyCapabilities`],
    /// [`ManifestError::CapabilitiesNotSorted`],
    /// [`ManifestError::DuplicateCapability`], [`ManifestError::ParamsTooLong`],
    /// [`ManifestError::CapabilityWithoutHandler`] (no verbs),
    /// [`ManifestError::TooManyVerbs`], [`ManifestError::VerbsNotSorted`],
    /// [`ManifestError::DuplicateVerb`], [`ManifestError::SchemaTooLong`],
    /// [`ManifestError::NotificationWithResult`],
    /// [`ManifestError::MissingCoreMonitoring`] or
    /// [`ManifestError::CoreMonitoringMismatch`].
    pub fn validate(&self) -> Result<(), ManifestError> {
        check_len("app_id", &self.app_id, MAX_APP_ID_LEN)?;
        check_len("name", &self.name, MAX_NAME_LEN)?;
        check_len("description", &self.description, MAX_DESCRIPTION_LEN)?;
        if self.capabilities.len() > MAX_CAPABILITIES {
            return Err(ManifestError::TooManyCapabilities {
                count: self.capabilities.len(),
                max: MAX_CAPABILITIES,
            });
        }
        let mut previous: Option<&CapId> = None;
        for cap in &self.capabilities {
            if let Some(before) = previous {
                if *before == cap.id {
                    return Err(ManifestError::DuplicateCapability {
                        cap: cap.id.clone(),
                    });
                }
                if *before > cap.id {
                    return Err(ManifestError::CapabilitiesNotSorted {
                        before: before.clone(),
                        after: cap.id.clone(),
                    });
                }
            }
            previous = Some(&cap.id);
            check_capability(cap)?;
        }
        check_monitoring(self)
    }

    /// Decodes a peer's manifest and checks it: the length of the bytes
    /// against [`MAX_MANIFEST_LEN`] before anything is decoded, then the
    /// strict CBOR profile and the layout of `WIRE.md` section 3.1 (which
    /// include the grammar of ids, verb names and versions), then
    /// [`Manifest::validate`].
    ///
    /// The runtime calls this on the manifest of every hello it receives; a
    /// peer whose manifest fails is closed with `protocol_error`.
    ///
    /// ```
    /// # use capwire_envelope::NodeId;
    /// # use capwire_manifest::*;
    /// let registry = Registry::builder(
    ///     NodeInfo::new(NodeId::from_bytes([1; 32]), "demo"),
    ///     MonitoringHandlers { bind: (), disable: () },
    /// )
    /// .build()?;
    /// let manifest = registry.manifest(MonitoringStatus::Off, 1);
    /// let bytes = capwire_envelope::to_vec(&manifest).unwrap();
    /// assert_eq!(Manifest::decode_checked(&bytes)?, manifest);
    ///
    /// let too_big = vec![0; MAX_MANIFEST_LEN + 1];
    /// assert!(matches!(
    ///     Manifest::decode_checked(&too_big),
    ///     Err(ManifestError::ManifestTooLarge { .. })
    /// ));
    /// # Ok::<(), ManifestError>(())
    /// ```
    ///
    /// # Errors
    /// [`ManifestError::ManifestTooLarge`], [`ManifestError::Decode`], or
    /// any error of [`Manifest::validate`].
    pub fn decode_checked(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_LEN {
            return Err(ManifestError::ManifestTooLarge {
                len: bytes.len(),
                max: MAX_MANIFEST_LEN,
            });
        }
        let manifest: Manifest = from_slice(bytes).map_err(ManifestError::Decode)?;
        manifest.validate()?;
        Ok(manifest)
    }
}

fn check_capability(cap: &CapabilityManifest) -> Result<(), ManifestError> {
    if let Some(params) = &cap.params {
        check_params(&cap.id, params)?;
    }
    if cap.verbs.is_empty() {
        return Err(ManifestError::CapabilityWithoutHandler {
            cap: cap.id.clone(),
        });
    }
    if cap.verbs.len() > MAX_VERBS {
        return Err(ManifestError::TooManyVerbs {
            cap: cap.id.clone(),
            count: cap.verbs.len(),
            max: MAX_VERBS,
        });
    }
    let mut previous: Option<&Verb> = None;
    for verb in &cap.verbs {
        if let Some(before) = previous {
            if before == &verb.name {
                return Err(ManifestError::DuplicateVerb {
                    cap: cap.id.clone(),
                    verb: verb.name.clone(),
                });
            }
            if before > &verb.name {
                return Err(ManifestError::VerbsNotSorted {
                    cap: cap.id.clone(),
                    before: before.clone(),
                    after: verb.name.clone(),
                });
            }
        }
        previous = Some(&verb.name);
        for (field, schema) in [
            ("args_schema", &verb.args_schema),
            ("result_schema", &verb.result_schema),
        ] {
            if let Some(schema) = schema {
                check_schema(&cap.id, &verb.name, field, schema)?;
            }
        }
        if verb.kind == VerbKind::Notification && verb.result_schema.is_some() {
            return Err(ManifestError::NotificationWithResult {
                cap: cap.id.clone(),
                verb: verb.name.clone(),
            });
        }
    }
    Ok(())
}

fn check_monitoring(manifest: &Manifest) -> Result<(), ManifestError> {
    let Some(monitoring) = manifest.capability(CORE_MONITORING) else {
        return Err(ManifestError::MissingCoreMonitoring);
    };
    // `bind` and `disable` are required, as they are; a node may offer
    // more monitoring verbs (capwire's own add `status` and `copy`).
    let matches = MONITORING_VERBS.iter().all(|(name, kind, class)| {
        monitoring
            .verbs
            .iter()
            .any(|v| v.name.as_str() == *name && v.kind == *kind && v.class == *class)
    });
    if matches {
        return Ok(());
    }
    let mut found = String::new();
    for (i, v) in monitoring.verbs.iter().enumerate() {
        if i == SHOWN_VERBS {
            found.push_str(", …");
            break;
        }
        if i > 0 {
            found.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(found, "{} ({}, {})", v.name, v.kind, v.class);
    }
    Err(ManifestError::CoreMonitoringMismatch { found })
}

/// Refuses `value` when it is longer than `max` bytes.
pub(crate) fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), ManifestError> {
    if value.len() > max {
        return Err(ManifestError::FieldTooLong {
            field,
            len: value.len(),
            max,
        });
    }
    Ok(())
}

/// Refuses params longer than [`MAX_PARAMS_LEN`].
pub(crate) fn check_params(cap: &CapId, params: &str) -> Result<(), ManifestError> {
    if params.len() > MAX_PARAMS_LEN {
        return Err(ManifestError::ParamsTooLong {
            cap: cap.clone(),
            len: params.len(),
            max: MAX_PARAMS_LEN,
        });
    }
    Ok(())
}

/// Refuses a schema longer than [`MAX_SCHEMA_LEN`].
pub(crate) fn check_schema(
    cap: &CapId,
    verb: &Verb,
    field: &'static str,
    schema: &str,
) -> Result<(), ManifestError> {
    if schema.len() > MAX_SCHEMA_LEN {
        return Err(ManifestError::SchemaTooLong {
            cap: cap.clone(),
            verb: verb.clone(),
            field,
            len: schema.len(),
            max: MAX_SCHEMA_LEN,
        });
    }
    Ok(())
}

/// The length of `manifest`'s encoding, found one capability at a time so
/// that no more than one capability's encoding is held at once.
///
/// # Errors
/// [`ManifestError::Encode`] if some part does not encode.
pub(crate) fn encoded_len(manifest: &Manifest) -> Result<usize, ManifestError> {
    let shell = Manifest {
        node_id: manifest.node_id,
        app_id: manifest.app_id.clone(),
        name: manifest.name.clone(),
        description: manifest.description.clone(),
        epoch: manifest.epoch,
        monitoring: manifest.monitoring,
        capabilities: Vec::new(),
    };
    // The shell ends with an empty array, one byte: take the array header
    // for the real count instead.
    let mut len = to_vec(&shell).map_err(ManifestError::Encode)?.len() - 1
        + array_head_len(manifest.capabilities.len());
    for cap in &manifest.capabilities {
        len += to_vec(cap).map_err(ManifestError::Encode)?.len();
    }
    Ok(len)
}

/// The length of the shortest CBOR header of an array of `n` items.
fn array_head_len(n: usize) -> usize {
    match n {
        0..=23 => 1,
        24..=0xff => 2,
        0x100..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

#[cfg(test)]
mod tests {
    use capwire_envelope::NodeId;

    use super::*;
    use crate::{Capability, MonitoringHandlers, MonitoringStatus, NodeInfo, Registry, VerbSpec};

    #[test]
    fn the_encoded_length_is_measured_exactly() {
        for caps in [0, 22, 23, 60] {
            let mut builder = Registry::builder(
                NodeInfo::new(NodeId::from_bytes([9; 32]), "measured"),
                MonitoringHandlers {
                    bind: (),
                    disable: (),
                },
            );
            for i in 0..caps {
                builder = builder.capability(
                    Capability::new(format!("app.c{i}"), semver::Version::new(1, 0, i))
                        .params("p".repeat(i as usize * 50))
                        .verb_spec(
                            VerbSpec::request("go")
                                .class(DeclaredClass::Bootstrap)
                                .handler(()),
                        ),
                );
            }
            let m = builder.build().unwrap().manifest(MonitoringStatus::On, 5);
            assert_eq!(
                encoded_len(&m).unwrap(),
                to_vec(&m).unwrap().len(),
                "{caps}"
            );
        }
    }

    #[test]
    fn array_headers_have_their_cbor_lengths() {
        for n in [0, 23, 24, 255, 256, 65_535, 65_536] {
            let encoded = to_vec(&vec![(); n]).unwrap();
            // `()` encodes as one byte, `null`.
            assert_eq!(array_head_len(n), encoded.len() - n, "{n}");
        }
    }
}
