//! Registry invariants: one failing registry per invariant, and what a
//! well-formed registry offers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use capwire_envelope::NodeId;
use capwire_manifest::{
    AuthClass, CORE_MONITORING, Capability, DeclaredClass, MAX_CAPABILITIES, MAX_DESCRIPTION_LEN,
    MAX_MANIFEST_LEN, MAX_PARAMS_LEN, MAX_SCHEMA_LEN, MAX_VERBS, Manifest, ManifestError,
    MonitoringHandlers, MonitoringStatus, NodeInfo, Registry, RegistryBuilder, VerbDef, VerbKind,
    VerbSpec, Version, verb,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
/// Args of `Say`.
pub struct SayArgs {
    /// What to echo.
    pub text: String,
}

verb! {
    /// Echo.
    pub struct Say: request "app.echo" / "say", Bootstrap, SayArgs => String;
}
verb! {
    /// Reset, controller only.
    pub struct Reset: request "app.echo" / "reset", Controller, () => ();
}
verb! {
    /// A log line, never answered.
    pub struct Log: notification "app.echo" / "log", Bootstrap, String;
}

/// A notification that (wrongly) declares a result, written by hand since
/// `verb!` cannot express it.
struct BadNotification;
impl VerbDef for BadNotification {
    const CAP: &'static str = "app.echo";
    const VERB: &'static str = "bad";
    const KIND: VerbKind = VerbKind::Notification;
    const CLASS: DeclaredClass = DeclaredClass::Bootstrap;
    type Args = ();
    type Output = String;
}

fn builder() -> RegistryBuilder<&'static str> {
    Registry::builder(
        NodeInfo::new(NodeId::from_bytes([1; 32]), "test-app")
            .with_name("tester")
            .with_description("a node under test"),
        MonitoringHandlers {
            bind: "bind",
            disable: "disable",
        },
    )
}

fn echo() -> Capability<&'static str> {
    Capability::new("app.echo", Version::new(1, 2, 3))
}

fn untyped(name: &str) -> VerbSpec<&'static str> {
    VerbSpec::request(name)
        .class(DeclaredClass::Bootstrap)
        .handler("h")
}

fn build_err(b: RegistryBuilder<&'static str>) -> ManifestError {
    b.build().expect_err("registry must be refused")
}

#[test]
fn refuses_malformed_cap_ids() {
    for bad in [
        "app.Echo",
        "other.echo",
        "app.x/../y",
        "app",
        "",
        " app.echo",
        "app.echo\0",
    ] {
        let err = build_err(
            builder()
                .capability(Capability::new(bad, Version::new(1, 0, 0)).verb_spec(untyped("v"))),
        );
        assert!(
            matches!(&err, ManifestError::InvalidCapId { cap, .. } if cap == bad),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn refuses_an_app_under_core() {
    let err =
        build_err(builder().capability(
            Capability::new("core.sneaky", Version::new(1, 0, 0)).verb_spec(untyped("v")),
        ));
    assert!(
        matches!(&err, ManifestError::ReservedNamespace { cap } if cap.as_str() == "core.sneaky")
    );
    assert!(err.to_string().contains("reserved"));
}

#[test]
fn refuses_a_core_capability_outside_core() {
    let err = build_err(builder().core_capability(echo().verb_spec(untyped("v"))));
    assert!(matches!(&err, ManifestError::NotCoreNamespace { cap } if cap.as_str() == "app.echo"));
}

#[test]
fn refuses_duplicate_capabilities() {
    let err = build_err(
        builder()
            .capability(echo().verb::<Say>("say"))
            .capability(echo().verb::<Reset>("reset")),
    );
    assert!(
        matches!(&err, ManifestError::DuplicateCapability { cap } if cap.as_str() == "app.echo")
    );

    // core.monitoring is the builder's own; nobody may declare it again.
    let err = build_err(builder().core_capability(
        Capability::new(CORE_MONITORING, Version::new(9, 0, 0)).verb_spec(untyped("bind")),
    ));
    assert!(
        matches!(&err, ManifestError::DuplicateCapability { cap } if cap.as_str() == CORE_MONITORING)
    );
}

#[test]
fn refuses_duplicate_verbs() {
    let err = build_err(builder().capability(echo().verb::<Say>("a").verb::<Say>("b")));
    assert!(matches!(
        &err,
        ManifestError::DuplicateVerb { cap, verb } if cap.as_str() == "app.echo" && verb.as_str() == "say"
    ));
    let err = build_err(builder().capability(echo().verb::<Say>("a").verb_spec(untyped("say"))));
    assert!(matches!(&err, ManifestError::DuplicateVerb { .. }));
}

#[test]
fn refuses_a_verb_without_auth_class() {
    let err =
        build_err(builder().capability(echo().verb_spec(VerbSpec::request("say").handler("h"))));
    assert!(matches!(
        &err,
        ManifestError::MissingAuthClass { cap, verb } if cap.as_str() == "app.echo" && verb.as_str() == "say"
    ));
}

#[test]
fn refuses_a_notification_with_a_result() {
    let spec = VerbSpec::notification("log")
        .class(DeclaredClass::Bootstrap)
        .result_schema(&serde_json::json!({"type": "string"}))
        .handler("h");
    let err = build_err(builder().capability(echo().verb_spec(spec)));
    assert!(
        matches!(&err, ManifestError::NotificationWithResult { verb, .. } if verb.as_str() == "log")
    );

    let err = build_err(builder().capability(echo().verb::<BadNotification>("h")));
    assert!(
        matches!(&err, ManifestError::NotificationWithResult { verb, .. } if verb.as_str() == "bad")
    );
}

#[test]
fn refuses_a_verb_without_handler() {
    let spec = VerbSpec::request("say").class(DeclaredClass::Controller);
    let err = build_err(builder().capability(echo().verb_spec(spec)));
    assert!(matches!(&err, ManifestError::MissingHandler { verb, .. } if verb.as_str() == "say"));
}

#[test]
fn refuses_a_supported_capability_without_handler() {
    let err = build_err(builder().capability(echo()));
    assert!(
        matches!(&err, ManifestError::CapabilityWithoutHandler { cap } if cap.as_str() == "app.echo")
    );
}

#[test]
fn refuses_malformed_verbs() {
    for bad in ["", "Disable", " say", "say ", "s\0y", "x/../y", "sаy"] {
        let err = build_err(builder().capability(echo().verb_spec(untyped(bad))));
        assert!(
            matches!(&err, ManifestError::InvalidVerb { verb, .. } if verb == bad),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn refuses_a_typed_verb_in_another_capability() {
    let err = build_err(
        builder()
            .capability(Capability::new("app.other", Version::new(1, 0, 0)).verb::<Say>("say")),
    );
    assert!(matches!(
        &err,
        ManifestError::VerbInWrongCapability { cap, declared: "app.echo", .. } if cap.as_str() == "app.other"
    ));
}

#[test]
fn refuses_oversized_fields() {
    let info = NodeInfo::new(NodeId::from_bytes([1; 32]), "a")
        .with_description("x".repeat(MAX_DESCRIPTION_LEN + 1));
    let err = Registry::builder(
        info,
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    )
    .build()
    .unwrap_err();
    assert!(matches!(
        err,
        ManifestError::FieldTooLong {
            field: "description",
            ..
        }
    ));
}

#[test]
fn refuses_oversized_params_and_schemas() {
    let err = build_err(
        builder().capability(
            echo()
                .params("p".repeat(MAX_PARAMS_LEN + 1))
                .verb::<Say>("say"),
        ),
    );
    assert!(
        matches!(&err, ManifestError::ParamsTooLong { cap, len: 4097, .. } if cap.as_str() == "app.echo"),
        "{err}"
    );

    let schema = serde_json::json!({ "description": "s".repeat(MAX_SCHEMA_LEN) });
    let spec = untyped("say").args_schema(&schema);
    let err = build_err(builder().capability(echo().verb_spec(spec)));
    assert!(
        matches!(&err, ManifestError::SchemaTooLong { verb, field: "args_schema", .. } if verb.as_str() == "say"),
        "{err}"
    );
}

#[test]
fn refuses_more_than_128_capabilities() {
    let with_apps = |n: usize| {
        let mut b = builder();
        for i in 0..n {
            b = b.capability(
                Capability::new(format!("app.c{i}"), Version::new(1, 0, 0)).verb_spec(untyped("v")),
            );
        }
        b
    };
    // core.monitoring is one of the 128.
    let registry = with_apps(MAX_CAPABILITIES - 1).build().unwrap();
    assert_eq!(registry.len(), MAX_CAPABILITIES + 1);
    let err = build_err(with_apps(MAX_CAPABILITIES));
    assert_eq!(
        err,
        ManifestError::TooManyCapabilities {
            count: 129,
            max: 128
        }
    );
}

#[test]
fn refuses_more_than_128_verbs_in_a_capability() {
    let with_verbs = |n: usize| {
        let mut cap = echo();
        for i in 0..n {
            cap = cap.verb_spec(untyped(&format!("v{i}")));
        }
        builder().capability(cap)
    };
    with_verbs(MAX_VERBS).build().unwrap();
    let err = build_err(with_verbs(MAX_VERBS + 1));
    assert!(
        matches!(&err, ManifestError::TooManyVerbs { cap, count: 129, max: 128 } if cap.as_str() == "app.echo"),
        "{err}"
    );
}

#[test]
fn refuses_a_manifest_over_1_mib() {
    // Every field within its own bound, but 2 * 16 KiB of schemas per verb.
    let schema = serde_json::json!({ "description": "s".repeat(MAX_SCHEMA_LEN - 20) });
    let with_verbs = |n: usize| {
        let mut cap = echo();
        for i in 0..n {
            cap = cap.verb_spec(
                untyped(&format!("v{i}"))
                    .args_schema(&schema)
                    .result_schema(&schema),
            );
        }
        builder().capability(cap)
    };
    let fits = with_verbs(30).build().unwrap();
    let bytes =
        capwire_envelope::to_vec(&fits.manifest(MonitoringStatus::Pending, u64::MAX)).unwrap();
    assert!(bytes.len() <= MAX_MANIFEST_LEN);
    Manifest::decode_checked(&bytes).unwrap();

    let err = build_err(with_verbs(33));
    assert!(
        matches!(err, ManifestError::ManifestTooLarge { len, max: MAX_MANIFEST_LEN } if len > MAX_MANIFEST_LEN),
        "{err}"
    );
}

#[test]
fn core_monitoring_is_always_present() {
    let registry = builder().build().unwrap();
    let bind = registry.lookup(CORE_MONITORING, "bind").unwrap();
    assert_eq!(bind.info().class(), DeclaredClass::Bootstrap);
    assert_eq!(bind.info().kind(), VerbKind::Request);
    assert_eq!(*bind.dangerous_handler(), "bind");
    let disable = registry.lookup(CORE_MONITORING, "disable").unwrap();
    assert_eq!(disable.info().class(), DeclaredClass::Controller);
    assert_eq!(*disable.dangerous_handler(), "disable");
    assert_eq!(registry.len(), 2);
    assert!(!registry.is_empty());

    let manifest = registry.manifest(MonitoringStatus::Off, 1);
    let monitoring = manifest.capability(CORE_MONITORING).unwrap();
    let names: Vec<_> = monitoring.verbs.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["bind", "disable"]);
    // WIRE.md specifies the core verbs: their schemas stay out of every
    // hello.
    let bind = monitoring.verb("bind").unwrap();
    assert_eq!(
        (bind.args_schema.as_deref(), bind.result_schema.as_deref()),
        (None, None)
    );
}

#[test]
fn lookup_matches_exact_bytes_only() {
    let registry = builder()
        .capability(echo().verb::<Say>("say").verb::<Reset>("reset"))
        .build()
        .unwrap();
    assert_eq!(
        *registry
            .lookup("app.echo", "say")
            .unwrap()
            .dangerous_handler(),
        "say"
    );
    for (cap, verb) in [
        ("app.echo", "Say"),
        ("app.echo", "say "),
        ("app.echo", " say"),
        ("app.echo", "say\0"),
        ("app.echo", ""),
        ("app.echo", "sa"),
        ("app.echo", "sayy"),
        ("App.echo", "say"),
        ("app.echo ", "say"),
        ("app.ech", "say"),
        ("app.echo.", "say"),
        ("app.echo/../app.echo", "say"),
        ("app.еcho", "say"), // Cyrillic е
        ("", ""),
    ] {
        assert!(registry.lookup(cap, verb).is_none(), "{cap:?}/{verb:?}");
    }
    assert!(registry.has_capability("app.echo"));
    assert!(!registry.has_capability("app.Echo"));
}

#[test]
fn the_manifest_reflects_the_declarations() {
    let registry = builder()
        .capability(
            echo()
                .params("{\"type\":\"null\"}")
                .verb::<Say>("say")
                .verb::<Log>("log")
                .verb::<Reset>("reset")
                .verb_spec(untyped("raw")),
        )
        .build()
        .unwrap();
    let m = registry.manifest(MonitoringStatus::Pending, 7);
    assert_eq!(m.node_id, NodeId::from_bytes([1; 32]));
    assert_eq!(m.app_id, "test-app");
    assert_eq!(m.name, "tester");
    assert_eq!(m.description, "a node under test");
    assert_eq!(m.epoch, 7);
    assert_eq!(m.monitoring, MonitoringStatus::Pending);
    let ids: Vec<_> = m.capabilities.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["app.echo", "core.monitoring"]);

    let echo = m.capability("app.echo").unwrap();
    assert_eq!(echo.version, Version::new(1, 2, 3));
    assert_eq!(echo.params.as_deref(), Some("{\"type\":\"null\"}"));
    let names: Vec<_> = echo.verbs.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["log", "raw", "reset", "say"], "sorted by name");

    let say = echo.verb("say").unwrap();
    assert_eq!(say.kind, VerbKind::Request);
    assert_eq!(say.class, DeclaredClass::Bootstrap);
    let args: serde_json::Value =
        serde_json::from_str(say.args_schema.as_deref().unwrap()).unwrap();
    assert_eq!(args["properties"]["text"]["type"], "string");
    let result: serde_json::Value =
        serde_json::from_str(say.result_schema.as_deref().unwrap()).unwrap();
    assert_eq!(result["type"], "string");

    let log = echo.verb("log").unwrap();
    assert_eq!(log.kind, VerbKind::Notification);
    assert!(log.result_schema.is_none());
    assert!(log.args_schema.is_some());

    let raw = echo.verb("raw").unwrap();
    assert!(raw.args_schema.is_none() && raw.result_schema.is_none());

    assert_eq!(echo.verb("reset").unwrap().class, DeclaredClass::Controller);
    assert_eq!(
        AuthClass::from(DeclaredClass::Controller),
        AuthClass::Controller
    );
}

#[test]
fn the_manifest_round_trips_through_serde() {
    let registry = builder()
        .capability(echo().verb::<Say>("say"))
        .build()
        .unwrap();
    let m = registry.manifest(MonitoringStatus::On, 3);
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains("\"monitoring\":\"on\""));
    assert!(json.contains("\"class\":\"bootstrap\""));
    assert!(json.contains("\"version\":\"1.2.3\""));
    let back: capwire_manifest::Manifest = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);

    // Unknown fields are refused.
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["extra"] = serde_json::json!(1);
    assert!(serde_json::from_value::<capwire_manifest::Manifest>(value).is_err());
}
