//! The chokepoint: classification, the authorizer gate and permits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use capwire_authz::{
    AuthClass, Authorizer, AuthzError, Binding, BindingState, Decision, DenyReason, Gate,
    Unauthorized, Unlisted, control_auth_class, decide,
};
use capwire_envelope::NodeId;
use capwire_manifest::{
    Capability, DeclaredClass, MonitoringHandlers, NodeInfo, Registry, VerbSpec, Version,
};

const CP: NodeId = NodeId::from_bytes([0xc0; 32]);
const OTHER: NodeId = NodeId::from_bytes([0x0e; 32]);

fn registry() -> Registry<&'static str> {
    Registry::builder(
        NodeInfo::new(NodeId::from_bytes([1; 32]), "node"),
        MonitoringHandlers {
            bind: "bind",
            disable: "disable",
        },
    )
    .capability(
        Capability::new("app.echo", Version::new(1, 0, 0))
            .verb_spec(
                VerbSpec::request("say")
                    .class(DeclaredClass::Bootstrap)
                    .handler("say"),
            )
            .verb_spec(
                VerbSpec::request("reset")
                    .class(DeclaredClass::Controller)
                    .handler("reset"),
            ),
    )
    .build()
    .unwrap()
}

fn bound() -> Binding {
    Binding::new(Some(CP), 5)
}

fn denied<H>(d: Decision<'_, H>) -> DenyReason {
    match d {
        Decision::Denied(r) => r,
        Decision::Allowed(p) => panic!("unexpectedly allowed: {p:?}"),
    }
}

/// Every name variant of SECURITY.md's chokepoint list, for a declared pair.
fn variants(cap: &str, verb: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut both = |c: String, v: String| {
        // Some variants leave a name unchanged (no letter to swap): skip those.
        if (c.as_str(), v.as_str()) != (cap, verb) {
            out.push((c, v));
        }
    };
    both(cap.to_owned(), String::new()); // empty verb
    both(String::new(), verb.to_owned());
    both(String::new(), String::new());
    both(cap.to_owned(), verb.to_uppercase());
    both(cap.to_uppercase(), verb.to_owned());
    let mut capitalised = verb.to_owned();
    capitalised[..1].make_ascii_uppercase();
    both(cap.to_owned(), capitalised); // "Disable"
    both(cap.to_owned(), format!(" {verb}"));
    both(cap.to_owned(), format!("{verb} "));
    both(format!(" {cap}"), verb.to_owned());
    both(format!("{cap} "), verb.to_owned());
    both(cap.to_owned(), format!("{verb}\0"));
    both(cap.to_owned(), format!("\0{verb}"));
    both(format!("{cap}\0"), verb.to_owned());
    both(cap.to_owned(), format!("{verb}\n"));
    both(cap.to_owned(), format!("{verb}\u{200b}")); // zero-width space
    both(cap.to_owned(), confusable(verb));
    both(confusable(cap), verb.to_owned());
    both(cap.to_owned(), format!("{verb}\u{301}")); // combining accent
    both(cap.to_owned(), verb.replace('i', "ı")); // dotless i
    both(cap.to_owned(), format!("{verb}/../{verb}"));
    both(format!("{cap}/../{cap}"), verb.to_owned());
    both(format!("x/../{cap}"), verb.to_owned());
    both(format!("{cap}/{verb}"), String::new());
    both(format!("{cap}.{verb}"), verb.to_owned());
    both(cap.to_owned(), verb[..verb.len() - 1].to_owned()); // prefix
    both(cap[..cap.len() - 1].to_owned(), verb.to_owned());
    both(cap.to_owned(), format!("{verb}{verb}"));
    both(cap.to_owned(), format!("{verb}*"));
    both(format!("{cap}*"), verb.to_owned());
    both(verb.to_owned(), cap.to_owned()); // swapped
    assert!(out.len() >= 25);
    out
}

/// Latin letters replaced by their Cyrillic look-alikes.
fn confusable(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a' => 'а',
            'c' => 'с',
            'e' => 'е',
            'i' => 'і',
            'o' => 'о',
            'p' => 'р',
            'x' => 'х',
            'y' => 'у',
            other => other,
        })
        .collect()
}

#[test]
fn classifies_declared_pairs() {
    let r = registry();
    assert_eq!(
        control_auth_class(&r, "core.monitoring", "bind"),
        AuthClass::Bootstrap
    );
    assert_eq!(
        control_auth_class(&r, "core.monitoring", "disable"),
        AuthClass::Controller
    );
    assert_eq!(
        control_auth_class(&r, "app.echo", "say"),
        AuthClass::Bootstrap
    );
    assert_eq!(
        control_auth_class(&r, "app.echo", "reset"),
        AuthClass::Controller
    );
    assert_eq!(control_auth_class(&r, "app.echo", "nope"), AuthClass::Deny);
    assert_eq!(control_auth_class(&r, "app.nope", "say"), AuthClass::Deny);
}

#[test]
fn every_name_variant_is_denied_and_runs_nothing() {
    let r = registry();
    let gate = Gate::default();
    for (cap, verb) in [
        ("core.monitoring", "bind"),
        ("core.monitoring", "disable"),
        ("app.echo", "say"),
        ("app.echo", "reset"),
    ] {
        for (c, v) in variants(cap, verb) {
            assert_eq!(
                control_auth_class(&r, &c, &v),
                AuthClass::Deny,
                "{c:?}/{v:?}"
            );
            // Even the bound control plane gets unknown_verb, not a permit.
            let reason = denied(decide(&r, &gate, &bound(), &CP, &c, &v));
            assert_eq!(reason.code_str(), "unknown_verb", "{c:?}/{v:?}");
        }
    }
}

#[test]
fn unknown_names_explain_what_is_missing() {
    let r = registry();
    let gate = Gate::default();
    let reason = denied(decide(&r, &gate, &bound(), &CP, "app.nope", "say"));
    assert_eq!(
        reason,
        DenyReason::UnknownVerb {
            why: Unlisted::UnknownCapability
        }
    );
    assert_eq!(reason.label(), "unknown_capability");
    assert_eq!(
        reason.to_string(),
        "unknown verb: no capability with this exact id"
    );
    let reason = denied(decide(&r, &gate, &bound(), &CP, "app.echo", "Say"));
    assert_eq!(
        reason,
        DenyReason::UnknownVerb {
            why: Unlisted::UnknownVerb
        }
    );
    assert_eq!(reason.code_str(), "unknown_verb");
}

#[test]
fn bootstrap_verbs_are_allowed_to_any_peer() {
    let r = registry();
    for gate in [Gate::default(), Gate::unset()] {
        for binding in [Binding::UNBOUND, bound()] {
            for sender in [CP, OTHER] {
                let permit = decide(&r, &gate, &binding, &sender, "app.echo", "say")
                    .into_result()
                    .unwrap();
                assert_eq!(*permit.handler(), "say");
                assert_eq!(permit.sender(), &sender);
                assert_eq!(permit.class(), DeclaredClass::Bootstrap);
                assert_eq!(permit.binding_epoch(), binding.epoch());
                assert!(permit.still_valid(&Binding::new(Some(OTHER), 99)));
            }
        }
    }
}

#[test]
fn controller_verbs_are_allowed_only_to_the_bound_control_plane() {
    let r = registry();
    let gate = Gate::default();
    let permit = decide(&r, &gate, &bound(), &CP, "app.echo", "reset")
        .into_result()
        .unwrap();
    assert_eq!(*permit.handler(), "reset");
    assert_eq!(permit.info().cap().as_str(), "app.echo");
    assert_eq!(permit.info().verb().as_str(), "reset");
    assert_eq!(permit.binding_epoch(), 5);

    let reason = denied(decide(&r, &gate, &bound(), &OTHER, "app.echo", "reset"));
    assert_eq!(
        reason,
        DenyReason::Unauthorized {
            why: Unauthorized::NotController
        }
    );
    assert_eq!(reason.code_str(), "unauthorized");

    let reason = denied(decide(
        &r,
        &gate,
        &Binding::UNBOUND,
        &CP,
        "app.echo",
        "reset",
    ));
    assert_eq!(
        reason,
        DenyReason::Unauthorized {
            why: Unauthorized::NotBound
        }
    );
    assert_eq!(
        reason.to_string(),
        "unauthorized: no control plane is bound"
    );
}

#[test]
fn a_former_controller_is_refused_after_unbind() {
    let r = registry();
    let gate = Gate::default();
    let mut state = BindingState::restore(Some(CP));
    assert!(
        decide(
            &r,
            &gate,
            &state.binding(),
            &CP,
            "core.monitoring",
            "disable"
        )
        .is_allowed()
    );
    assert_eq!(state.unbind(), Some(CP));
    let reason = denied(decide(
        &r,
        &gate,
        &state.binding(),
        &CP,
        "core.monitoring",
        "disable",
    ));
    assert_eq!(
        reason,
        DenyReason::Unauthorized {
            why: Unauthorized::NotBound
        }
    );
}

#[test]
fn a_queued_permit_is_rechecked_against_the_binding_at_execution() {
    let r = registry();
    let gate = Gate::default();
    let mut state = BindingState::restore(Some(CP));
    let permit = decide(&r, &gate, &state.binding(), &CP, "app.echo", "reset")
        .into_result()
        .unwrap();
    let owned = decide(&r, &gate, &state.binding(), &CP, "app.echo", "reset")
        .into_result()
        .unwrap()
        .into_owned();
    let bootstrap = decide(&r, &gate, &state.binding(), &OTHER, "app.echo", "say")
        .into_result()
        .unwrap();
    assert!(permit.still_valid(&state.binding()));
    assert!(owned.still_valid(&state.binding()));

    // An unbind races the queued envelope: it must not run.
    state.unbind();
    let changed = DenyReason::Unauthorized {
        why: Unauthorized::BindingChanged,
    };
    assert_eq!(permit.recheck(&state.binding()), Err(changed.clone()));
    assert_eq!(owned.recheck(&state.binding()), Err(changed.clone()));
    assert!(bootstrap.still_valid(&state.binding()));

    // Rebinding the same control plane is a new epoch: still not the
    // binding the permit was granted under.
    state.create_pending(
        capwire_authz::BindCode::parse("2345678923").unwrap(),
        None,
        std::time::Instant::now(),
    );
    state
        .try_bind(&CP, "2345678923", std::time::Instant::now())
        .unwrap();
    assert_eq!(permit.recheck(&state.binding()), Err(changed));
    assert_eq!(*owned.handler(), "reset");
    assert_eq!(owned.sender(), &CP);
}

struct Fixed(Result<bool, AuthzError>);
impl Authorizer for Fixed {
    fn authorize(&self, _: &NodeId, _: &str, _: &str, _: &Binding) -> Result<bool, AuthzError> {
        self.0.clone()
    }
}

struct Panics;
impl Authorizer for Panics {
    fn authorize(&self, _: &NodeId, _: &str, _: &str, _: &Binding) -> Result<bool, AuthzError> {
        panic!("authorizer bug");
    }
}

/// Allows only `core.*` controller verbs.
struct CoreOnly;
impl Authorizer for CoreOnly {
    fn authorize(&self, _: &NodeId, cap: &str, _: &str, _: &Binding) -> Result<bool, AuthzError> {
        Ok(cap.starts_with("core."))
    }
}

#[test]
fn an_unset_failing_or_panicking_authorizer_denies() {
    let r = registry();
    let cases = [
        (Gate::unset(), Unauthorized::AuthorizerUnset),
        (Gate::new(Fixed(Ok(false))), Unauthorized::AuthorizerRefused),
        (
            Gate::new(Fixed(Err(AuthzError::Authorizer("store offline".into())))),
            Unauthorized::AuthorizerFailed("the authorizer failed: store offline".into()),
        ),
        (Gate::new(Panics), Unauthorized::AuthorizerPanicked),
    ];
    for (gate, why) in cases {
        let reason = denied(decide(&r, &gate, &bound(), &CP, "app.echo", "reset"));
        assert_eq!(
            reason,
            DenyReason::Unauthorized { why: why.clone() },
            "{gate:?}"
        );
        // Bootstrap verbs do not consult the authorizer.
        assert!(decide(&r, &gate, &bound(), &CP, "app.echo", "say").is_allowed());
    }
    assert!(!Gate::unset().is_set());
}

#[test]
fn an_authorizer_narrows_but_never_widens() {
    let r = registry();
    let permissive = Gate::new(Fixed(Ok(true)));
    let reason = denied(decide(
        &r,
        &permissive,
        &bound(),
        &OTHER,
        "app.echo",
        "reset",
    ));
    assert_eq!(
        reason,
        DenyReason::Unauthorized {
            why: Unauthorized::NotController
        }
    );
    let reason = denied(decide(
        &r,
        &permissive,
        &Binding::UNBOUND,
        &OTHER,
        "app.echo",
        "reset",
    ));
    assert_eq!(
        reason,
        DenyReason::Unauthorized {
            why: Unauthorized::NotBound
        }
    );

    let narrow = Gate::new(CoreOnly);
    assert!(decide(&r, &narrow, &bound(), &CP, "core.monitoring", "disable").is_allowed());
    let reason = denied(decide(&r, &narrow, &bound(), &CP, "app.echo", "reset"));
    assert_eq!(reason.label(), "authorizer_refused");
}

#[test]
fn deny_reasons_map_to_wire_error_codes() {
    use capwire_envelope::ErrorCode;
    let r = registry();
    let gate = Gate::default();
    let unknown = denied(decide(&r, &gate, &bound(), &CP, "app.echo", "nope"));
    assert_eq!(unknown.code(), ErrorCode::UnknownVerb);
    assert_eq!(unknown.code().as_str(), unknown.code_str());
    let body = unknown.error_body();
    assert_eq!(body.code, ErrorCode::UnknownVerb);
    assert_eq!(
        body.message,
        "the capability has no verb with this exact name"
    );
    assert!(body.detail.is_none());

    let unauthorized = denied(decide(&r, &gate, &bound(), &OTHER, "app.echo", "reset"));
    assert_eq!(unauthorized.code(), ErrorCode::Unauthorized);
    assert_eq!(unauthorized.code().as_str(), "unauthorized");
    assert_eq!(unauthorized.label(), "not_controller");
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Gate>();
    check::<Binding>();
    check::<capwire_authz::SharedBinding>();
    check::<DenyReason>();
    check::<capwire_authz::Permit<'static, std::sync::Arc<dyn Fn() + Send + Sync>>>();
    check::<capwire_authz::OwnedPermit<std::sync::Arc<dyn Fn() + Send + Sync>>>();
    check::<Registry<std::sync::Arc<dyn Fn() + Send + Sync>>>();
}
