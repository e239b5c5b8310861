//! A peer's manifest is checked on receipt (`WIRE.md` section 3.1): one
//! manifest per rule, built to break it, and every manifest a valid
//! registry produces passes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use capwire_envelope::{CapId, NodeId, Verb, to_vec};
use capwire_manifest::{
    CORE_MONITORING, Capability, CapabilityManifest, DeclaredClass, MAX_APP_ID_LEN,
    MAX_CAPABILITIES, MAX_DESCRIPTION_LEN, MAX_MANIFEST_LEN, MAX_NAME_LEN, MAX_PARAMS_LEN,
    MAX_SCHEMA_LEN, MAX_VERBS, Manifest, ManifestError, MonitoringHandlers, MonitoringStatus,
    NodeInfo, Registry, VerbKind, VerbManifest, VerbSpec, Version, verb,
};
use ciborium::Value;
use proptest::prelude::*;

verb! {
    /// Echo.
    pub struct Say: request "app.echo" / "say", Bootstrap, String => String;
}
verb! {
    /// A log line.
    pub struct Log: notification "app.echo" / "log", Bootstrap, String;
}

/// A valid manifest: `app.echo` (typed `log` and `say`), `app.zeta` with
/// params and an untyped verb, and `core.monitoring`.
fn valid() -> Manifest {
    Registry::builder(
        NodeInfo::new(NodeId::from_bytes([3; 32]), "echo-app").with_description("echoes"),
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    )
    .capability(
        Capability::new("app.echo", Version::new(1, 2, 0))
            .verb::<Say>(())
            .verb::<Log>(()),
    )
    .capability(
        Capability::new("app.zeta", Version::parse("0.1.0-beta.2").unwrap())
            .params("no configuration")
            .verb_spec(
                VerbSpec::request("run")
                    .class(DeclaredClass::Controller)
                    .handler(()),
            ),
    )
    .build()
    .unwrap()
    .manifest(MonitoringStatus::Pending, 9)
}

fn cap_mut<'m>(m: &'m mut Manifest, id: &str) -> &'m mut CapabilityManifest {
    m.capabilities
        .iter_mut()
        .find(|c| c.id.as_str() == id)
        .unwrap()
}

fn cap_id(s: &str) -> CapId {
    CapId::try_from(s).unwrap()
}

fn verb_name(s: &str) -> Verb {
    Verb::try_from(s).unwrap()
}

/// An untyped request verb.
fn plain_verb(name: &str) -> VerbManifest {
    VerbManifest {
        name: verb_name(name),
        kind: VerbKind::Request,
        class: DeclaredClass::Bootstrap,
        args_schema: None,
        result_schema: None,
    }
}

/// A capability with one verb.
fn plain_cap(id: &str) -> CapabilityManifest {
    CapabilityManifest {
        id: cap_id(id),
        version: Version::new(1, 0, 0),
        params: None,
        verbs: vec![plain_verb("run")],
    }
}

/// `validate` refuses the manifest, and so does `decode_checked` on its
/// encoding, with the same error.
fn refused(m: &Manifest) -> ManifestError {
    let err = m.validate().expect_err("the manifest must be refused");
    let bytes = to_vec(m).unwrap();
    assert_eq!(Manifest::decode_checked(&bytes), Err(err.clone()));
    err
}

/// `decode_checked` on `valid()`'s encoding with one value replaced.
fn decode_edited(edit: impl FnOnce(&mut Vec<(Value, Value)>)) -> ManifestError {
    let mut value: Value = capwire_envelope::from_slice(&to_vec(&valid()).unwrap()).unwrap();
    edit(value.as_map_mut().unwrap());
    Manifest::decode_checked(&to_vec(&value).unwrap()).expect_err("must be refused")
}

fn field<'v>(map: &'v mut [(Value, Value)], name: &str) -> &'v mut Value {
    &mut map
        .iter_mut()
        .find(|(k, _)| k.as_text() == Some(name))
        .unwrap()
        .1
}

#[test]
fn a_valid_manifest_passes() {
    let m = valid();
    m.validate().unwrap();
    assert_eq!(Manifest::decode_checked(&to_vec(&m).unwrap()).unwrap(), m);
}

#[test]
fn app_id_of_65_bytes() {
    let mut m = valid();
    m.app_id = "a".repeat(MAX_APP_ID_LEN);
    m.validate().unwrap();
    m.app_id.push('a');
    assert_eq!(
        refused(&m),
        ManifestError::FieldTooLong {
            field: "app_id",
            len: 65,
            max: 64
        }
    );
}

#[test]
fn name_over_128_bytes() {
    let mut m = valid();
    // Counted in bytes: 43 three-byte characters are 129 bytes.
    m.name = "€".repeat(43);
    assert_eq!(MAX_NAME_LEN, 128);
    assert!(matches!(
        refused(&m),
        ManifestError::FieldTooLong {
            field: "name",
            len: 129,
            max: 128
        }
    ));
}

#[test]
fn description_over_1024_bytes() {
    let mut m = valid();
    m.description = "d".repeat(MAX_DESCRIPTION_LEN);
    m.validate().unwrap();
    m.description.push('d');
    assert!(matches!(
        refused(&m),
        ManifestError::FieldTooLong {
            field: "description",
            ..
        }
    ));
}

#[test]
fn a_description_of_over_1_mib_is_refused_before_decoding() {
    let mut m = valid();
    m.description = "d".repeat(MAX_MANIFEST_LEN);
    assert!(matches!(
        m.validate(),
        Err(ManifestError::FieldTooLong {
            field: "description",
            ..
        })
    ));
    let bytes = to_vec(&m).unwrap();
    assert_eq!(
        Manifest::decode_checked(&bytes),
        Err(ManifestError::ManifestTooLarge {
            len: bytes.len(),
            max: MAX_MANIFEST_LEN
        })
    );
}

#[test]
fn the_length_is_checked_before_anything_is_decoded() {
    // Not even CBOR, but too long: the length is the error.
    let junk = vec![0xff; MAX_MANIFEST_LEN + 1];
    assert_eq!(
        Manifest::decode_checked(&junk),
        Err(ManifestError::ManifestTooLarge {
            len: MAX_MANIFEST_LEN + 1,
            max: MAX_MANIFEST_LEN
        })
    );
    assert!(matches!(
        Manifest::decode_checked(&junk[..16]),
        Err(ManifestError::Decode(_))
    ));
}

#[test]
fn bytes_that_are_not_a_manifest() {
    let good = to_vec(&valid()).unwrap();
    for bad in [
        [&good[..], &[0x00]].concat(), // trailing bytes
        good[..good.len() - 1].to_vec(),
        vec![0xf6],
        vec![],
    ] {
        assert!(matches!(
            Manifest::decode_checked(&bad),
            Err(ManifestError::Decode(_))
        ));
    }
    let err = decode_edited(|map| map.push((Value::Text("extra".into()), Value::Null)));
    assert!(err.to_string().contains("extra"), "{err}");
}

#[test]
fn unsorted_capability_ids() {
    let mut m = valid();
    m.capabilities.swap(0, 1);
    assert_eq!(
        refused(&m),
        ManifestError::CapabilitiesNotSorted {
            before: cap_id("app.zeta"),
            after: cap_id("app.echo")
        }
    );
    // Bytewise: "app.echo.x" sorts after "app.echo" and before "app.echox".
    let mut m = valid();
    m.capabilities.insert(1, plain_cap("app.echox"));
    m.capabilities.insert(1, plain_cap("app.echo.x"));
    m.validate().unwrap();
    m.capabilities.swap(1, 2);
    assert!(matches!(
        refused(&m),
        ManifestError::CapabilitiesNotSorted { .. }
    ));
}

#[test]
fn duplicate_capability_ids() {
    let mut m = valid();
    let copy = m.capabilities[1].clone();
    m.capabilities.insert(1, copy);
    assert_eq!(
        refused(&m),
        ManifestError::DuplicateCapability {
            cap: cap_id("app.zeta")
        }
    );
}

#[test]
fn malformed_capability_ids() {
    for bad in [
        "App.Echo",
        "app",
        "other.echo",
        "app.x/../y",
        "app.echo ",
        "",
    ] {
        let err = decode_edited(|map| {
            let caps = field(map, "capabilities").as_array_mut().unwrap();
            *field(caps[0].as_map_mut().unwrap(), "id") = Value::Text(bad.into());
        });
        assert!(
            matches!(&err, ManifestError::Decode(_)) && err.to_string().contains("capability id"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn versions_that_are_not_semver() {
    for bad in ["1.2", "v1.2.0", "01.2.0", "1.2.0 ", ""] {
        let err = decode_edited(|map| {
            let caps = field(map, "capabilities").as_array_mut().unwrap();
            *field(caps[0].as_map_mut().unwrap(), "version") = Value::Text(bad.into());
        });
        assert!(matches!(err, ManifestError::Decode(_)), "{bad:?}: {err}");
    }
}

#[test]
fn params_over_4096_bytes() {
    let mut m = valid();
    cap_mut(&mut m, "app.zeta").params = Some("p".repeat(MAX_PARAMS_LEN));
    m.validate().unwrap();
    cap_mut(&mut m, "app.zeta").params = Some("p".repeat(MAX_PARAMS_LEN + 1));
    assert_eq!(
        refused(&m),
        ManifestError::ParamsTooLong {
            cap: cap_id("app.zeta"),
            len: 4097,
            max: 4096
        }
    );
}

#[test]
fn a_capability_with_no_verbs() {
    let mut m = valid();
    cap_mut(&mut m, "app.zeta").verbs.clear();
    assert_eq!(
        refused(&m),
        ManifestError::CapabilityWithoutHandler {
            cap: cap_id("app.zeta")
        }
    );
}

#[test]
fn unsorted_verbs() {
    let mut m = valid();
    cap_mut(&mut m, "app.echo").verbs.reverse();
    assert_eq!(
        refused(&m),
        ManifestError::VerbsNotSorted {
            cap: cap_id("app.echo"),
            before: verb_name("say"),
            after: verb_name("log")
        }
    );
}

#[test]
fn duplicate_verbs() {
    let mut m = valid();
    let verbs = &mut cap_mut(&mut m, "app.echo").verbs;
    verbs.push(verbs[1].clone());
    assert_eq!(
        refused(&m),
        ManifestError::DuplicateVerb {
            cap: cap_id("app.echo"),
            verb: verb_name("say")
        }
    );
}

#[test]
fn malformed_verb_names() {
    for bad in ["Say", "", "say ", "s\0y", "9lives"] {
        let err = decode_edited(|map| {
            let caps = field(map, "capabilities").as_array_mut().unwrap();
            let verbs = field(caps[0].as_map_mut().unwrap(), "verbs")
                .as_array_mut()
                .unwrap();
            *field(verbs[0].as_map_mut().unwrap(), "name") = Value::Text(bad.into());
        });
        assert!(
            matches!(&err, ManifestError::Decode(_)) && err.to_string().contains("verb"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn a_schema_over_16_kib() {
    for (field, result) in [("args_schema", false), ("result_schema", true)] {
        let mut m = valid();
        let say = &mut cap_mut(&mut m, "app.echo").verbs[1];
        let slot = if result {
            &mut say.result_schema
        } else {
            &mut say.args_schema
        };
        *slot = Some("s".repeat(MAX_SCHEMA_LEN));
        m.validate().unwrap();
        let say = &mut cap_mut(&mut m, "app.echo").verbs[1];
        let slot = if result {
            &mut say.result_schema
        } else {
            &mut say.args_schema
        };
        *slot = Some("s".repeat(MAX_SCHEMA_LEN + 1));
        assert_eq!(
            refused(&m),
            ManifestError::SchemaTooLong {
                cap: cap_id("app.echo"),
                verb: verb_name("say"),
                field,
                len: 16 * 1024 + 1,
                max: 16 * 1024
            }
        );
    }
}

#[test]
fn a_result_schema_on_a_notification() {
    let mut m = valid();
    let log = &mut cap_mut(&mut m, "app.echo").verbs[0];
    assert_eq!(log.kind, VerbKind::Notification);
    log.result_schema = Some("{}".into());
    assert_eq!(
        refused(&m),
        ManifestError::NotificationWithResult {
            cap: cap_id("app.echo"),
            verb: verb_name("log")
        }
    );
}

#[test]
fn a_missing_core_monitoring() {
    let mut m = valid();
    m.capabilities.retain(|c| c.id.as_str() != CORE_MONITORING);
    assert_eq!(refused(&m), ManifestError::MissingCoreMonitoring);
}

#[test]
fn core_monitoring_with_other_verbs() {
    type Edit = fn(&mut Vec<VerbManifest>);
    let edits: [(&str, Edit); 5] = [
        ("disable as bootstrap", |v| {
            v[1].class = DeclaredClass::Bootstrap
        }),
        ("bind as controller", |v| {
            v[0].class = DeclaredClass::Controller
        }),
        ("bind as a notification", |v| {
            v[0].kind = VerbKind::Notification;
            v[0].result_schema = None;
        }),
        ("no disable", |v| v.truncate(1)),
        ("another verb instead of disable", |v| {
            v[1] = plain_verb("enable");
            v[1].class = DeclaredClass::Controller;
        }),
    ];
    for (what, edit) in edits {
        let mut m = valid();
        edit(&mut cap_mut(&mut m, CORE_MONITORING).verbs);
        let err = refused(&m);
        assert!(
            matches!(err, ManifestError::CoreMonitoringMismatch { .. }),
            "{what}: {err}"
        );
    }
    // More monitoring verbs (sorted) are allowed: bind and disable are what is required.
    let mut m = valid();
    cap_mut(&mut m, CORE_MONITORING)
        .verbs
        .push(plain_verb("status"));
    m.validate().unwrap();
    let mut m = valid();
    cap_mut(&mut m, CORE_MONITORING).verbs[1].class = DeclaredClass::Bootstrap;
    assert_eq!(
        m.validate().unwrap_err().to_string(),
        "core.monitoring must have bind (request, bootstrap) and disable \
         (request, controller), not bind (request, bootstrap), disable (request, bootstrap)"
    );
}

#[test]
fn more_than_128_capabilities() {
    let mut m = valid();
    // 125 more: 128 in all.
    for i in 0..MAX_CAPABILITIES - 3 {
        m.capabilities.push(plain_cap(&format!("core.x{i:03}")));
    }
    m.capabilities.sort_by(|a, b| a.id.cmp(&b.id));
    m.validate().unwrap();
    m.capabilities.push(plain_cap("core.y"));
    assert_eq!(
        refused(&m),
        ManifestError::TooManyCapabilities {
            count: 129,
            max: 128
        }
    );
}

#[test]
fn more_than_128_verbs() {
    let mut m = valid();
    let zeta = cap_mut(&mut m, "app.zeta");
    zeta.verbs = (0..MAX_VERBS)
        .map(|i| plain_verb(&format!("v{i:03}")))
        .collect();
    m.validate().unwrap();
    cap_mut(&mut m, "app.zeta").verbs.push(plain_verb("w"));
    assert_eq!(
        refused(&m),
        ManifestError::TooManyVerbs {
            cap: cap_id("app.zeta"),
            count: 129,
            max: 128
        }
    );
}

fn version() -> impl Strategy<Value = Version> {
    (
        0..4u64,
        0..30u64,
        0..30u64,
        proptest::option::of("(alpha|beta|rc)(\\.[1-9][0-9]?)?"),
    )
        .prop_map(|(major, minor, patch, pre)| {
            let text = match pre {
                Some(pre) => format!("{major}.{minor}.{patch}-{pre}"),
                None => format!("{major}.{minor}.{patch}"),
            };
            Version::parse(&text).unwrap()
        })
}

/// A verb declaration: kind, class, args schema, result schema.
type VerbDecl = (bool, bool, Option<String>, Option<String>);

fn verb_decl() -> impl Strategy<Value = VerbDecl> {
    (
        any::<bool>(),
        any::<bool>(),
        proptest::option::of("\\PC{0,40}"),
        proptest::option::of("\\PC{0,40}"),
    )
}

/// Capabilities by id: version, params and verbs by name.
type CapDecls = BTreeMap<String, (Version, Option<String>, BTreeMap<String, VerbDecl>)>;

fn caps() -> impl Strategy<Value = CapDecls> {
    proptest::collection::btree_map(
        "(app|core)\\.[a-z][a-z0-9_]{0,10}(\\.[a-z][a-z0-9_]{0,6})?",
        (
            version(),
            proptest::option::of("\\PC{0,60}"),
            proptest::collection::btree_map("[a-z][a-z0-9_]{0,12}", verb_decl(), 1..6),
        ),
        0..8,
    )
}

fn spec(name: &str, decl: &VerbDecl) -> VerbSpec<()> {
    let (request, bootstrap, args, result) = decl;
    let mut spec = if *request {
        VerbSpec::request(name)
    } else {
        VerbSpec::notification(name)
    };
    spec = spec
        .class(if *bootstrap {
            DeclaredClass::Bootstrap
        } else {
            DeclaredClass::Controller
        })
        .handler(());
    if let Some(text) = args {
        spec = spec.args_schema(&serde_json::json!({ "description": text }));
    }
    if let (true, Some(text)) = (request, result) {
        spec = spec.result_schema(&serde_json::json!({ "description": text }));
    }
    spec
}

fn status() -> impl Strategy<Value = MonitoringStatus> {
    prop_oneof![
        Just(MonitoringStatus::Off),
        Just(MonitoringStatus::Pending),
        Just(MonitoringStatus::On),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_manifest_a_registry_produces_is_valid(
        key in any::<[u8; 32]>(),
        app_id in "[a-z][a-z0-9-]{0,63}",
        name in prop_oneof!["[ -~]{0,128}", "\\PC{0,32}"],
        description in "\\PC{0,255}",
        caps in caps(),
        typed in any::<bool>(),
        status in status(),
        epoch in any::<u64>(),
    ) {
        let mut builder = Registry::builder(
            NodeInfo::new(NodeId::from_bytes(key), app_id)
                .with_name(name)
                .with_description(description),
            MonitoringHandlers { bind: (), disable: () },
        );
        if typed {
            builder = builder.capability(
                Capability::new("app.echo", Version::new(1, 0, 0)).verb::<Say>(()).verb::<Log>(()),
            );
        }
        for (id, (version, params, verbs)) in &caps {
            if id == CORE_MONITORING || (typed && id == "app.echo") {
                continue;
            }
            let mut cap = Capability::new(id.clone(), version.clone());
            if let Some(params) = params {
                cap = cap.params(params.clone());
            }
            for (name, decl) in verbs {
                cap = cap.verb_spec(spec(name, decl));
            }
            builder = if id.starts_with("core.") {
                builder.core_capability(cap)
            } else {
                builder.capability(cap)
            };
        }
        let registry = builder.build().unwrap();
        let m = registry.manifest(status, epoch);
        prop_assert_eq!(m.validate(), Ok(()));
        let bytes = to_vec(&m).unwrap();
        prop_assert!(bytes.len() <= MAX_MANIFEST_LEN);
        prop_assert_eq!(Manifest::decode_checked(&bytes).unwrap(), m);
    }
}
