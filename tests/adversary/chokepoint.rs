//! The chokepoint from the wire: every name variant, controller verbs from
//! strangers, from a former control plane and racing an unbind, args that
//! fail their type, and an authorizer that panics or fails.

use std::sync::Arc;

use capwire::Outcome;
use capwire::authz::{Authorizer, AuthzError, Binding};
use capwire::envelope::{ErrorCode, NodeId, ResponseEnvelope};

use crate::kit::arena::{Arena, Expect, Setup};
use crate::kit::cap::get;
use crate::kit::cbor::{NULL, bytes, control, text, tmap, uint};
use crate::kit::wire::{Wire, records_plaintext};
use crate::kit::{err_code, ok_text};

/// Sends one request on `w` and waits for its answer.
pub async fn ask(w: &mut Wire, cap: &str, verb: &str, id: &str, args: Vec<u8>) -> ResponseEnvelope {
    w.send(&[&control(cap, verb, id, args)]).await;
    w.response(id).await
}

/// `{}`.
fn empty() -> Vec<u8> {
    vec![0xa0]
}

/// Binds `w` to the node through a fresh invite.
pub async fn bind(a: &Arena, w: &mut Wire, id: &str) {
    let code = a.node.invite(None).unwrap().code.unwrap();
    let r = ask(
        w,
        "core.monitoring",
        "bind",
        id,
        tmap(&[("code", text(&code))]),
    )
    .await;
    assert!(r.outcome.is_ok(), "bind: {r:?}");
    assert_eq!(a.node.controller(), Some(w.id));
}

/// Every controller verb of the node, with well-formed args.
fn controller_verbs() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        ("app.adv", "admin", text("x")),
        ("core.monitoring", "disable", empty()),
        (
            "core.configuration",
            "set_config",
            tmap(&[("value", uint(1)), ("if_version", vec![NULL])]),
        ),
        ("core.configuration", "get_config", empty()),
        (
            "core.connect",
            "introduce",
            tmap(&[
                ("name", text("mallory")),
                ("node_id", bytes(&[9; 32])),
                ("addr", text("127.0.0.1:1")),
            ]),
        ),
        ("core.cluster", "list", empty()),
        (
            "core.cluster",
            "create",
            tmap(&[("name", text("evil")), ("bio", vec![NULL])]),
        ),
        ("core.cluster", "remove", tmap(&[("cid", text("c1"))])),
        (
            "core.cluster",
            "set_monitoring",
            tmap(&[("cid", text("c1")), ("enabled", vec![0xf5])]),
        ),
    ]
}

/// Name variants of the node's verbs, controller ones above all: unknown
/// cap or verb, empty, other case, spaces, NUL, look-alike letters, paths
/// and prefixes.
fn name_variants() -> Vec<(&'static str, &'static str)> {
    vec![
        ("app.nope", "echo"),
        ("core.nope", "disable"),
        ("app.adv", "shout"),
        ("app.adv", ""),
        ("core.monitoring", ""),
        ("", "echo"),
        ("", "disable"),
        ("core.monitoring", "Disable"),
        ("core.monitoring", "DISABLE"),
        ("Core.monitoring", "disable"),
        ("app.adv", "Admin"),
        ("App.adv", "echo"),
        ("core.configuration", "Set_config"),
        (" app.adv", "admin"),
        ("app.adv ", "admin"),
        ("app.adv", " admin"),
        ("app.adv", "admin "),
        ("core.monitoring", "disable "),
        ("core.monitoring", "\tdisable"),
        ("core.monitoring", "disable\n"),
        ("app.adv", "admin\0"),
        ("app.adv", "\0admin"),
        ("app.adv", "ad\0min"),
        ("core.monitoring\0", "disable"),
        ("app.adv", "\u{0430}dmin"),
        ("app.adv", "adm\u{0456}n"),
        ("core.monit\u{043e}ring", "disable"),
        ("core.monitoring", "\u{ff44}isable"),
        ("core.monitoring", "dis\u{200b}able"),
        ("core.monitoring", "disab\u{13de}e"),
        ("app.adv", "ech\u{043e}"),
        ("core.configuration", "set\u{2010}config"),
        ("app.adv", "x/../admin"),
        ("app.adv", "../admin"),
        ("app.adv/../core.monitoring", "disable"),
        ("core.monitoring/disable", ""),
        ("app.adv/admin", "admin"),
        ("core.monitoring", "./disable"),
        ("core.monitoring", "disable/"),
        ("app", "adv"),
        ("app.adv.admin", "admin"),
        ("core.monitoring", "disabl"),
        ("core.monitoring", "disablex"),
        ("core.configuration", "set_config_"),
        ("core.monitoring.", "disable"),
        ("core", "monitoring"),
    ]
}

/// Every name variant, request-shaped and notification-shaped, from the
/// bound control plane and from a stranger: `unknown_verb` (or nothing,
/// for a notification); no handler runs, the binding, the manifest's
/// epoch and the ledger stay as they were.
pub async fn chokepoint_name_variants(a: Arena) -> Expect {
    let names = name_variants();
    let epoch = a.node.manifest().epoch;
    let unknown = a.node.metrics().unknown();
    let mut cp = a.wire_as(&a.setup.spare[0]).await;
    let mut stranger = a.wire().await;
    for w in [&mut cp, &mut stranger] {
        for (i, (cap, verb)) in names.iter().enumerate() {
            let r = ask(w, cap, verb, &format!("v{i}"), text("x")).await;
            assert_eq!(err_code(&r), ErrorCode::UnknownVerb, "{cap:?}/{verb:?}");
            w.send(&[&control(cap, verb, "", text("x"))]).await;
        }
        let r = ask(w, "app.adv", "echo", "alive", text("x")).await;
        assert_eq!(ok_text(&r), "echo: x");
        assert_eq!(w.responses_to(""), 0, "notifications are never answered");
    }
    assert_eq!(a.node.controller(), Some(a.setup.spare[0].public()));
    assert_eq!(a.node.manifest().epoch, epoch, "no manifest change");
    assert_eq!(
        a.node.metrics().unknown() - unknown,
        4 * names.len() as u64,
        "each denial is counted under the one shared row"
    );
    let sizes = a.node.ledger_sizes();
    assert_eq!(
        (sizes.running, sizes.remembered),
        (0, 2),
        "denied requests leave no trace in the ledger"
    );
    Expect::runs(2)
}

/// Every controller verb from a peer that is not the bound control plane,
/// with valid and with garbage args, as requests and as notifications:
/// `unauthorized` (never `bad_args`), nothing runs, nothing changes.
pub async fn controller_verbs_from_a_non_controller(a: Arena) -> Expect {
    let mut w = a.wire().await;
    for (i, (cap, verb, args)) in controller_verbs().into_iter().enumerate() {
        for (j, args) in [args, vec![0x83, 1, 2, 3]].into_iter().enumerate() {
            let r = ask(&mut w, cap, verb, &format!("c{i}-{j}"), args.clone()).await;
            assert_eq!(err_code(&r), ErrorCode::Unauthorized, "{cap}/{verb}");
            w.send(&[&control(cap, verb, "", args)]).await;
        }
    }
    let m = a.node.metrics();
    assert_eq!(m.count("app.adv", "admin", Outcome::Unauthorized), 4);
    assert_eq!(m.count("app.adv", "admin", Outcome::BadArgs), 0);
    assert_eq!(m.count("core.monitoring", "disable", Outcome::Ok), 0);
    Expect::nothing()
}

/// A control plane that disabled its binding, that the node unbound
/// locally, or that another control plane replaced: its controller verbs
/// are `unauthorized` from then on, on the same session and on a new one.
pub async fn a_former_controller_after_unbind(a: Arena) -> Expect {
    let mut cp = a.wire().await;
    bind(&a, &mut cp, "b1").await;
    assert_eq!(
        ok_text(&ask(&mut cp, "app.adv", "admin", "a1", text("1")).await),
        "admin: 1"
    );
    let r = ask(&mut cp, "core.monitoring", "disable", "d1", empty()).await;
    assert!(r.outcome.is_ok());
    assert_eq!(a.node.controller(), None);
    for (i, (cap, verb, args)) in controller_verbs().into_iter().enumerate() {
        let r = ask(&mut cp, cap, verb, &format!("x{i}"), args).await;
        assert_eq!(
            err_code(&r),
            ErrorCode::Unauthorized,
            "after disable: {cap}/{verb}"
        );
    }

    bind(&a, &mut cp, "b2").await;
    assert_eq!(a.node.unbind().await.unwrap(), Some(cp.id));
    let r = ask(&mut cp, "app.adv", "admin", "a2", text("2")).await;
    assert_eq!(
        err_code(&r),
        ErrorCode::Unauthorized,
        "after a local unbind"
    );

    bind(&a, &mut cp, "b3").await;
    let mut next = a.wire().await;
    bind(&a, &mut next, "n1").await;
    let r = ask(&mut cp, "app.adv", "admin", "a3", text("3")).await;
    assert_eq!(err_code(&r), ErrorCode::Unauthorized, "after another bound");
    let r = ask(&mut next, "core.monitoring", "disable", "n2", empty()).await;
    assert!(r.outcome.is_ok());
    Expect::runs(1)
}

/// Controller requests racing an unbind: queued in the same transport
/// message as the control plane's own `disable`, and sent while the node
/// unbinds locally. A controller request is answered `ok` only if its
/// handler ran while its sender was bound (the handler checks), every
/// other one `unauthorized`, each exactly once.
pub async fn racing_an_unbind(a: Arena) -> Expect {
    let mut cp = a.wire().await;
    bind(&a, &mut cp, "b1").await;
    let mut records = vec![
        control("app.adv", "admin", "r0", text("0")),
        control("app.adv", "admin", "r1", text("1")),
        control("core.monitoring", "disable", "d", empty()),
    ];
    for i in 2..10 {
        records.push(control("app.adv", "admin", &format!("r{i}"), text("x")));
    }
    records.push(control("core.configuration", "get_config", "g", empty()));
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let msg = cp.seal(&records_plaintext(&refs));
    cp.write(&msg).await;
    let mut ok = 0;
    for i in 0..10 {
        let r = cp.response(&format!("r{i}")).await;
        match &r.outcome {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e.code, ErrorCode::Unauthorized, "r{i}"),
        }
        if i < 2 {
            assert!(r.outcome.is_ok(), "r{i} came before the disable");
        }
    }
    assert!(cp.response("d").await.outcome.is_ok());
    cp.response("g").await;
    assert_eq!(a.node.controller(), None);

    // Against a local unbind.
    bind(&a, &mut cp, "b2").await;
    let node = a.node.clone();
    let unbinding = tokio::spawn(async move { node.unbind().await });
    for i in 0..30 {
        cp.send(&[&control("app.adv", "admin", &format!("u{i}"), text("x"))])
            .await;
    }
    unbinding.await.unwrap().unwrap();
    for i in 0..30 {
        let r = cp.response(&format!("u{i}")).await;
        match &r.outcome {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e.code, ErrorCode::Unauthorized, "u{i}"),
        }
    }
    let r = ask(&mut cp, "app.adv", "admin", "late", text("x")).await;
    assert_eq!(err_code(&r), ErrorCode::Unauthorized);
    for i in 0..10 {
        assert_eq!(cp.responses_to(&format!("r{i}")), 1);
    }
    assert_eq!(
        ok,
        get(&a.tally.admin),
        "every ok is a run, every run an ok"
    );
    Expect::runs(ok).bound_to(None)
}

/// Args that do not fit the verb: from a stranger to a controller verb
/// `unauthorized`, to an unknown verb `unknown_verb` (the chokepoint comes
/// first); to a bootstrap verb, or from the control plane to a controller
/// verb, `bad_args`; as a notification, dropped. Nothing runs; a
/// `disable` with bad args leaves the binding.
pub async fn args_failing_their_type(a: Arena) -> Expect {
    let garbage = || vec![0x83, 0xf5, 0x61, b'x', 0x20];
    let mut s = a.wire().await;
    let r = ask(&mut s, "app.adv", "admin", "s1", garbage()).await;
    assert_eq!(err_code(&r), ErrorCode::Unauthorized);
    let r = ask(&mut s, "core.monitoring", "disable", "s2", garbage()).await;
    assert_eq!(err_code(&r), ErrorCode::Unauthorized);
    let r = ask(&mut s, "app.adv", "nope", "s3", garbage()).await;
    assert_eq!(err_code(&r), ErrorCode::UnknownVerb);
    let r = ask(&mut s, "app.adv", "echo", "s4", garbage()).await;
    assert_eq!(err_code(&r), ErrorCode::BadArgs);
    let r = ask(
        &mut s,
        "core.monitoring",
        "bind",
        "s5",
        tmap(&[("code", uint(1))]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::BadArgs);
    s.send(&[&control("app.adv", "note", "", garbage())]).await;

    let mut cp = a.wire_as(&a.setup.spare[0]).await;
    let r = ask(&mut cp, "app.adv", "admin", "c1", garbage()).await;
    assert_eq!(err_code(&r), ErrorCode::BadArgs);
    let r = ask(
        &mut cp,
        "core.monitoring",
        "disable",
        "c2",
        tmap(&[("x", uint(1))]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::BadArgs);
    let r = ask(
        &mut cp,
        "core.configuration",
        "set_config",
        "c3",
        tmap(&[("if_version", uint(0))]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::BadArgs);
    assert_eq!(a.node.controller(), Some(cp.id));
    let m = a.node.metrics();
    assert_eq!(m.count("app.adv", "admin", Outcome::BadArgs), 1);
    assert_eq!(m.count("app.adv", "admin", Outcome::Unauthorized), 1);
    Expect::nothing()
}

/// An authorizer that panics (for `app.adv/admin`), fails (for
/// `core.configuration`) or refuses (for everything else).
struct Hostile;

impl Authorizer for Hostile {
    fn authorize(
        &self,
        _sender: &NodeId,
        cap: &str,
        verb: &str,
        _binding: &Binding,
    ) -> Result<bool, AuthzError> {
        match (cap, verb) {
            ("app.adv", "admin") => panic!("the authorizer blew up"),
            ("core.configuration", _) => Err(AuthzError::Authorizer("down".into())),
            _ => Ok(false),
        }
    }
}

/// A node bound to `spare[0]` whose authorizer is [`Hostile`].
pub fn hostile_authorizer_setup() -> Setup {
    let mut s = Setup::tcp().bound();
    s.authorizer = Some(Arc::new(Hostile));
    s
}

/// The bound control plane under an authorizer that panics, fails or
/// refuses: every controller verb is `unauthorized`, nothing runs, the
/// binding stays; bootstrap verbs (not the authorizer's business) work.
pub async fn authorizer_panics_or_fails(a: Arena) -> Expect {
    let mut cp = a.wire_as(&a.setup.spare[0]).await;
    for round in 0..2 {
        for (i, (cap, verb, args)) in controller_verbs().into_iter().enumerate() {
            let r = ask(&mut cp, cap, verb, &format!("{round}-{i}"), args).await;
            assert_eq!(err_code(&r), ErrorCode::Unauthorized, "{cap}/{verb}");
        }
    }
    assert_eq!(a.node.controller(), Some(cp.id));
    let r = ask(&mut cp, "app.adv", "echo", "e", text("fine")).await;
    assert_eq!(ok_text(&r), "echo: fine");
    Expect::runs(1)
}
