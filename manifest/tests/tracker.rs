//! Manifest epochs and version requirements.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use capwire_envelope::NodeId;
use capwire_manifest::{
    CapRequirement, Capability, DeclaredClass, ManifestError, ManifestTracker, MonitoringHandlers,
    MonitoringStatus, NodeInfo, Registry, VerbSpec, Version, VersionReq,
};

fn registry(extra: Option<Version>) -> Registry<()> {
    let mut b = Registry::builder(
        NodeInfo::new(NodeId::from_bytes([4; 32]), "app"),
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    );
    if let Some(v) = extra {
        b = b.capability(
            Capability::new("app.echo", v).verb_spec(
                VerbSpec::request("say")
                    .class(DeclaredClass::Bootstrap)
                    .handler(()),
            ),
        );
    }
    b.build().unwrap()
}

#[test]
fn the_epoch_is_bumped_on_every_change_and_only_then() {
    let plain = registry(None);
    let mut tracker = ManifestTracker::new(&plain, MonitoringStatus::Off);
    assert_eq!(tracker.manifest().epoch, 1);

    assert!(!tracker.refresh(&plain, MonitoringStatus::Off));
    assert_eq!(tracker.manifest().epoch, 1);

    assert!(tracker.refresh(&plain, MonitoringStatus::Pending));
    assert_eq!(tracker.manifest().epoch, 2);
    assert_eq!(tracker.manifest().monitoring, MonitoringStatus::Pending);

    let with_echo = registry(Some(Version::new(1, 0, 0)));
    assert!(tracker.refresh(&with_echo, MonitoringStatus::Pending));
    assert_eq!(tracker.manifest().epoch, 3);
    assert!(tracker.manifest().capability("app.echo").is_some());

    let newer = registry(Some(Version::new(1, 1, 0)));
    assert!(tracker.refresh(&newer, MonitoringStatus::Pending));
    assert_eq!(tracker.manifest().epoch, 4);

    let resumed = ManifestTracker::starting_at(&newer, MonitoringStatus::On, 40);
    assert_eq!(resumed.manifest().epoch, 40);
}

#[test]
fn requirements_parse() {
    let req: CapRequirement = "app.echo@^1.2".parse().unwrap();
    assert_eq!(req.cap().as_str(), "app.echo");
    assert_eq!(req.req(), &VersionReq::parse("^1.2").unwrap());
    assert_eq!(req.to_string(), "app.echo@^1.2");

    let any: CapRequirement = "core.monitoring".parse().unwrap();
    assert_eq!(any.req(), &VersionReq::STAR);
    assert_eq!(any.to_string(), "core.monitoring");

    let range: CapRequirement = "app.echo@>=1.0, <3".parse().unwrap();
    assert!(range.req().matches(&Version::new(2, 9, 0)));

    for bad in [
        "",
        "@^1",
        "app.Echo@^1",
        "app.echo@",
        "app.echo@ ",
        "app.echo@not-a-range",
        "app.echo@^1@2",
    ] {
        let err = bad.parse::<CapRequirement>().unwrap_err();
        assert!(
            matches!(&err, ManifestError::BadRequirement { input, .. } if input == bad),
            "{bad:?}"
        );
    }
}

#[test]
fn requirements_are_matched_against_a_manifest() {
    let m = registry(Some(Version::new(1, 4, 0))).manifest(MonitoringStatus::Off, 1);

    let ok: CapRequirement = "app.echo@^1.2".parse().unwrap();
    assert_eq!(m.require(&ok).unwrap().version, Version::new(1, 4, 0));

    let too_new: CapRequirement = "app.echo@^2".parse().unwrap();
    let err = m.require(&too_new).unwrap_err();
    assert_eq!(
        err,
        ManifestError::VersionUnsatisfied {
            wanted: too_new,
            found: Some(Version::new(1, 4, 0)),
        }
    );
    assert_eq!(err.code(), Some("version_unsatisfied"));
    assert_eq!(
        err.to_string(),
        "app.echo@^2 is required, but the peer offers 1.4.0"
    );

    let missing: CapRequirement = "app.other@^1".parse().unwrap();
    let err = m.require(&missing).unwrap_err();
    assert!(matches!(
        err,
        ManifestError::VersionUnsatisfied { found: None, .. }
    ));
    assert!(err.to_string().ends_with("the peer does not offer it"));

    // Prereleases only match ranges that name them (semver rules).
    let pre = registry(Some("1.5.0-beta.1".parse().unwrap())).manifest(MonitoringStatus::Off, 1);
    assert!(pre.require(&ok).is_err());
}
