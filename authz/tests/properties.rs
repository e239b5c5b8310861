//! Property tests: for random registries, senders, bindings and (cap, verb)
//! strings, a permit is granted iff the pair is declared and its class is
//! bootstrap, or controller with the sender bound at the current epoch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use capwire_authz::{
    AuthClass, Authorizer, AuthzError, Binding, Decision, DenyReason, Gate, Unauthorized,
    control_auth_class, decide,
};
use capwire_envelope::NodeId;
use capwire_manifest::{
    Capability, DeclaredClass, MonitoringHandlers, NodeInfo, Registry, VerbSpec, Version,
};
use proptest::prelude::*;

/// cap → verb → is_controller
type Model = BTreeMap<String, BTreeMap<String, bool>>;

fn model() -> impl Strategy<Value = Model> {
    prop::collection::btree_map(
        "app\\.[a-c]{1,3}",
        prop::collection::btree_map("[a-c]{1,3}", any::<bool>(), 1..5),
        0..6,
    )
}

fn build(model: &Model) -> (Registry<String>, Model) {
    let mut builder = Registry::builder(
        NodeInfo::new(NodeId::from_bytes([0; 32]), "prop"),
        MonitoringHandlers {
            bind: "core.monitoring/bind".to_owned(),
            disable: "core.monitoring/disable".to_owned(),
        },
    );
    for (cap, verbs) in model {
        let mut c = Capability::new(cap.clone(), Version::new(1, 0, 0));
        for (verb, controller) in verbs {
            let class = if *controller {
                DeclaredClass::Controller
            } else {
                DeclaredClass::Bootstrap
            };
            c = c.verb_spec(
                VerbSpec::request(verb.clone())
                    .class(class)
                    .handler(format!("{cap}/{verb}")),
            );
        }
        builder = builder.capability(c);
    }
    let mut full = model.clone();
    full.insert(
        "core.monitoring".to_owned(),
        BTreeMap::from([("bind".to_owned(), false), ("disable".to_owned(), true)]),
    );
    (builder.build().unwrap(), full)
}

fn node() -> impl Strategy<Value = NodeId> {
    (0u8..4).prop_map(|i| NodeId::from_bytes([i; 32]))
}

fn binding() -> impl Strategy<Value = Binding> {
    (prop::option::of(node()), any::<u64>()).prop_map(|(c, e)| Binding::new(c, e))
}

/// Declared-looking names, their mutations, and arbitrary text.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "app\\.[a-c]{1,3}",
        4 => "[a-c]{1,3}",
        1 => Just("core.monitoring".to_owned()),
        1 => prop::sample::select(vec!["bind", "disable", "Bind", "Disable", "bind ", " disable", "bind\0"])
            .prop_map(str::to_owned),
        2 => ("app\\.[a-c]{1,3}|[a-c]{1,3}", prop::sample::select(vec![
            " ", "\0", "\u{200b}", "/../x", ".", "A", "\u{301}", "а",
        ]), any::<bool>())
            .prop_map(|(s, extra, front)| if front { format!("{extra}{s}") } else { format!("{s}{extra}") }),
        1 => "[a-cA-C. /\\\\0-9]{0,6}",
        1 => any::<String>(),
        1 => prop::collection::vec(any::<u8>(), 0..12)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

fn expected(
    model: &Model,
    binding: &Binding,
    sender: &NodeId,
    cap: &str,
    verb: &str,
    gate_set: bool,
) -> Option<bool> {
    // None: unknown; Some(allowed)
    let controller = *model.get(cap)?.get(verb)?;
    Some(!controller || (gate_set && binding.controller() == Some(sender)))
}

struct AlwaysYes;
impl Authorizer for AlwaysYes {
    fn authorize(&self, _: &NodeId, _: &str, _: &str, _: &Binding) -> Result<bool, AuthzError> {
        Ok(true)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_permit_is_granted_iff_the_class_allows_it(
        m in model(),
        sender in node(),
        binding in binding(),
        cap in name(),
        verb in name(),
    ) {
        let (registry, full) = build(&m);
        for (gate, gate_set) in [(Gate::default(), true), (Gate::new(AlwaysYes), true), (Gate::unset(), false)] {
            let want = expected(&full, &binding, &sender, &cap, &verb, gate_set);
            let class = control_auth_class(&registry, &cap, &verb);
            match (want, decide(&registry, &gate, &binding, &sender, &cap, &verb)) {
                (None, Decision::Denied(DenyReason::UnknownVerb { .. })) => {
                    prop_assert_eq!(class, AuthClass::Deny);
                }
                (Some(true), Decision::Allowed(permit)) => {
                    prop_assert_ne!(class, AuthClass::Deny);
                    // The permit leads to this pair's own handler and nothing else.
                    prop_assert_eq!(permit.handler(), &format!("{cap}/{verb}"));
                    prop_assert_eq!(permit.info().cap().as_str(), cap.as_str());
                    prop_assert_eq!(permit.info().verb().as_str(), verb.as_str());
                    prop_assert_eq!(AuthClass::from(permit.class()), class);
                    prop_assert_eq!(permit.sender(), &sender);
                    prop_assert_eq!(permit.binding_epoch(), binding.epoch());
                    prop_assert!(permit.still_valid(&binding));
                    // Any bind or unbind after the decision.
                    let next = Binding::new(binding.controller().copied(), binding.epoch().wrapping_add(1));
                    prop_assert_eq!(permit.still_valid(&next), class == AuthClass::Bootstrap);
                }
                (Some(false), Decision::Denied(DenyReason::Unauthorized { why })) => {
                    prop_assert_eq!(class, AuthClass::Controller);
                    if !gate_set {
                        prop_assert_eq!(why, Unauthorized::AuthorizerUnset);
                    } else if binding.controller().is_none() {
                        prop_assert_eq!(why, Unauthorized::NotBound);
                    } else {
                        prop_assert_eq!(why, Unauthorized::NotController);
                    }
                }
                (want, got) => prop_assert!(false, "{cap:?}/{verb:?}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn undeclared_names_are_never_allowed(
        m in model(),
        cap in name(),
        verb in name(),
    ) {
        let (registry, full) = build(&m);
        let declared = full.get(&cap).is_some_and(|v| v.contains_key(&verb));
        prop_assume!(!declared);
        prop_assert_eq!(control_auth_class(&registry, &cap, &verb), AuthClass::Deny);
        // Not even for the bound control plane with a permissive authorizer.
        let cp = NodeId::from_bytes([1; 32]);
        let gate = Gate::new(AlwaysYes);
        let reason = decide(&registry, &gate, &Binding::new(Some(cp), 1), &cp, &cap, &verb)
            .into_result()
            .unwrap_err();
        prop_assert_eq!(reason.code_str(), "unknown_verb");
    }
}
