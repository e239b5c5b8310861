//! Grants: minting, narrowing, handing on and verifying biscuit tokens,
//! and the chokepoint's use of them, without any I/O.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, SystemTime};

use biscuit_auth::builder::BlockBuilder;
use biscuit_auth::{KeyPair, UnverifiedBiscuit};
use capwire_authz::{
    Binding, Decision, Delegations, DenyReason, Gate, GrantDenied, GrantError, GrantKey, GrantSpec,
    Narrowing, Right, Unauthorized, decide_with, delegate, mint, narrow, revocation_ids, verify,
};
use capwire_envelope::NodeId;
use capwire_manifest::{MonitoringHandlers, NodeInfo, Registry};

const MIN: Duration = Duration::from_secs(60);

struct World {
    cp: GrantKey,
    node: NodeId,
    a: (NodeId, GrantKey),
    b: (NodeId, GrantKey),
    c: (NodeId, GrantKey),
    now: SystemTime,
}

fn world() -> World {
    World {
        cp: GrantKey::from_secret(&[1; 32]),
        node: NodeId::from_bytes([10; 32]),
        a: (
            NodeId::from_bytes([11; 32]),
            GrantKey::from_secret(&[11; 32]),
        ),
        b: (
            NodeId::from_bytes([12; 32]),
            GrantKey::from_secret(&[12; 32]),
        ),
        c: (
            NodeId::from_bytes([13; 32]),
            GrantKey::from_secret(&[13; 32]),
        ),
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000),
    }
}

impl World {
    fn spec(&self, rights: Vec<Right>, for_: Duration) -> GrantSpec {
        GrantSpec {
            node: self.node,
            epoch: 5,
            holder: self.a.0,
            holder_key: self.a.1.public(),
            rights,
            expires: self.now + for_,
        }
    }

    fn token(&self) -> String {
        mint(
            &self.cp,
            &self.spec(
                vec![
                    Right::verb("core.configuration", "set_config"),
                    Right::cap("app.jobs"),
                ],
                10 * MIN,
            ),
        )
        .unwrap()
    }

    fn verify_as(&self, token: &str, who: &NodeId) -> Result<capwire_authz::Verified, GrantDenied> {
        verify(
            token,
            &self.cp.public(),
            &self.node,
            5,
            who,
            self.now,
            |_| false,
        )
    }
}

#[test]
fn the_holder_gets_exactly_what_is_granted_until_the_expiry() {
    let w = world();
    let t = w.token();
    let v = w.verify_as(&t, &w.a.0).unwrap();
    assert!(v.allows("core.configuration", "set_config", w.now).is_ok());
    assert!(v.allows("app.jobs", "anything", w.now).is_ok());
    assert_eq!(
        v.allows("core.configuration", "get_config", w.now),
        Err(GrantDenied::NotGranted)
    );
    assert_eq!(
        v.allows("core.cluster", "remove", w.now),
        Err(GrantDenied::NotGranted)
    );
    assert_eq!(
        v.allows(
            "core.configuration",
            "set_config",
            w.now + 10 * MIN + Duration::from_secs(1)
        ),
        Err(GrantDenied::Expired)
    );
    assert_eq!(v.next_change(w.now), Some(w.now + 10 * MIN));
    assert_eq!(v.id(), revocation_ids(&t).unwrap()[0]);
}

#[test]
fn anyone_but_the_holder_node_and_binding_is_refused() {
    let w = world();
    let t = w.token();
    assert_eq!(
        w.verify_as(&t, &w.b.0).unwrap_err(),
        GrantDenied::WrongHolder
    );
    let other_node = NodeId::from_bytes([99; 32]);
    assert_eq!(
        verify(&t, &w.cp.public(), &other_node, 5, &w.a.0, w.now, |_| false).unwrap_err(),
        GrantDenied::ForAnotherNode
    );
    assert_eq!(
        verify(&t, &w.cp.public(), &w.node, 6, &w.a.0, w.now, |_| false).unwrap_err(),
        GrantDenied::BindingChanged
    );
    // A former control plane's key, or a forger's.
    let forger = GrantKey::from_secret(&[66; 32]);
    assert_eq!(
        verify(&t, &forger.public(), &w.node, 5, &w.a.0, w.now, |_| false).unwrap_err(),
        GrantDenied::BadSignature
    );
    let forged = mint(&forger, &w.spec(vec![Right::cap("core.cluster")], MIN)).unwrap();
    assert_eq!(
        w.verify_as(&forged, &w.a.0).unwrap_err(),
        GrantDenied::BadSignature
    );
}

#[test]
fn a_flipped_byte_anywhere_breaks_the_signature_or_the_format() {
    let w = world();
    let t = w.token();
    let mut bytes = t.clone().into_bytes();
    for i in (0..bytes.len()).step_by(7) {
        let orig = bytes[i];
        bytes[i] = if orig == b'A' { b'B' } else { b'A' };
        let s = String::from_utf8(bytes.clone()).unwrap();
        let e = w.verify_as(&s, &w.a.0).unwrap_err();
        assert!(
            matches!(e, GrantDenied::BadSignature | GrantDenied::BadToken(_)),
            "byte {i}: {e:?}"
        );
        bytes[i] = orig;
    }
}

#[test]
fn garbage_and_huge_tokens_are_refused_typed() {
    let w = world();
    for junk in ["", "!!!!", "AAAA", "not a token at all", &"A".repeat(9000)] {
        let e = w.verify_as(junk, &w.a.0).unwrap_err();
        assert!(matches!(e, GrantDenied::BadToken(_)), "{junk:.20}: {e:?}");
    }
}

#[test]
fn narrowing_only_takes_away() {
    let w = world();
    let t = w.token();
    let only = narrow(
        &t,
        &Narrowing {
            verbs: Some(vec![
                ("core.configuration".into(), "set_config".into()),
                // Not in the parent: narrowing cannot add it.
                ("core.cluster".into(), "remove".into()),
            ]),
            expires: Some(w.now + MIN),
        },
    )
    .unwrap();
    let v = w.verify_as(&only, &w.a.0).unwrap();
    assert!(v.allows("core.configuration", "set_config", w.now).is_ok());
    assert_eq!(
        v.allows("core.cluster", "remove", w.now),
        Err(GrantDenied::NotGranted)
    );
    assert_eq!(
        v.allows("app.jobs", "run", w.now),
        Err(GrantDenied::NotGranted)
    );
    assert_eq!(
        v.allows(
            "core.configuration",
            "set_config",
            w.now + MIN + Duration::from_secs(1)
        ),
        Err(GrantDenied::Expired)
    );
    // A later expiry than the parent's does not extend it.
    let longer = narrow(
        &t,
        &Narrowing {
            verbs: None,
            expires: Some(w.now + 60 * MIN),
        },
    )
    .unwrap();
    let v = w.verify_as(&longer, &w.a.0).unwrap();
    assert_eq!(
        v.allows("app.jobs", "run", w.now + 11 * MIN),
        Err(GrantDenied::Expired)
    );
}

#[test]
fn a_holder_hands_on_a_narrower_right_and_only_the_new_holder_uses_it() {
    let w = world();
    let t = w.token();
    let to_b = delegate(
        &t,
        &w.a.1,
        &w.b.0,
        &w.b.1.public(),
        &Narrowing {
            verbs: Some(vec![("app.jobs".into(), "run".into())]),
            expires: Some(w.now + 2 * MIN),
        },
    )
    .unwrap();
    let v = w.verify_as(&to_b, &w.b.0).unwrap();
    assert!(v.allows("app.jobs", "run", w.now).is_ok());
    assert_eq!(
        v.allows("app.jobs", "stop", w.now),
        Err(GrantDenied::NotGranted)
    );
    assert_eq!(
        v.allows("app.jobs", "run", w.now + 3 * MIN),
        Err(GrantDenied::Expired)
    );
    // The former holder cannot use the handed-on copy.
    assert_eq!(
        w.verify_as(&to_b, &w.a.0).unwrap_err(),
        GrantDenied::WrongHolder
    );

    // B hands on to C, narrower still.
    let to_c = delegate(
        &to_b,
        &w.b.1,
        &w.c.0,
        &w.c.1.public(),
        &Narrowing::default(),
    )
    .unwrap();
    let v = w.verify_as(&to_c, &w.c.0).unwrap();
    assert!(v.allows("app.jobs", "run", w.now).is_ok());
    assert_eq!(
        v.allows("core.configuration", "set_config", w.now),
        Err(GrantDenied::NotGranted)
    );
    assert_eq!(
        w.verify_as(&to_c, &w.b.0).unwrap_err(),
        GrantDenied::WrongHolder
    );
}

#[test]
fn a_stolen_token_cannot_be_handed_to_the_thief() {
    let w = world();
    let t = w.token();
    // C stole A's token and signs a hand-over to itself with its own key.
    let stolen = delegate(&t, &w.c.1, &w.c.0, &w.c.1.public(), &Narrowing::default()).unwrap();
    assert_eq!(
        w.verify_as(&stolen, &w.c.0).unwrap_err(),
        GrantDenied::WrongHolder
    );
    // Or appends a plain block naming itself: not trusted.
    let t2 = UnverifiedBiscuit::from_base64(&t).unwrap();
    let b = BlockBuilder::new()
        .code(format!("delegate(\"{}\", hex:{});", w.c.0, "00".repeat(32)))
        .unwrap();
    let plain = t2.append(b).unwrap().to_base64().unwrap();
    assert_eq!(
        w.verify_as(&plain, &w.c.0).unwrap_err(),
        GrantDenied::WrongHolder
    );
}

#[test]
fn a_revoked_block_revokes_the_token_and_its_copies() {
    let w = world();
    let t = w.token();
    let copy = narrow(
        &t,
        &Narrowing {
            verbs: None,
            expires: Some(w.now + MIN),
        },
    )
    .unwrap();
    let ids = revocation_ids(&copy).unwrap();
    assert_eq!(ids.len(), 2);
    let root_id = hex_decode(&ids[0]);
    let revoked = |id: &[u8]| id == root_id.as_slice();
    for tok in [&t, &copy] {
        assert_eq!(
            verify(tok, &w.cp.public(), &w.node, 5, &w.a.0, w.now, revoked).unwrap_err(),
            GrantDenied::Revoked
        );
    }
    // Revoking the copy's own block leaves the parent valid.
    let copy_id = hex_decode(&ids[1]);
    let revoked = |id: &[u8]| id == copy_id.as_slice();
    assert!(verify(&t, &w.cp.public(), &w.node, 5, &w.a.0, w.now, revoked).is_ok());
}

#[test]
fn costly_logic_is_refused_before_it_runs() {
    let w = world();
    let t = w.token();
    let append = |code: String| {
        let t2 = UnverifiedBiscuit::from_base64(&t).unwrap();
        t2.append(BlockBuilder::new().code(code).unwrap())
            .unwrap()
            .to_base64()
            .unwrap()
    };
    // A block whose rule joins 60 facts three ways (216,000 facts in one
    // round of evaluation): a narrowing block holds no rule.
    let mut facts = String::new();
    for i in 0..60 {
        facts.push_str(&format!("n({i});"));
    }
    let heavy = append(format!(
        "{facts} p($x, $y, $z) <- n($x), n($y), n($z); check if p(1, 2, 3);"
    ));
    assert_eq!(
        w.verify_as(&heavy, &w.a.0).unwrap_err(),
        GrantDenied::BadToken("a narrowing block holds a rule")
    );
    // The same join in a check.
    let heavy = append("check if time($a), time($b), time($c);".to_owned());
    assert_eq!(
        w.verify_as(&heavy, &w.a.0).unwrap_err(),
        GrantDenied::BadToken("a check is too complex")
    );
    let many = append(facts);
    assert_eq!(
        w.verify_as(&many, &w.a.0).unwrap_err(),
        GrantDenied::BadToken("a narrowing block holds too much")
    );
    // What capwire writes passes.
    let fine = narrow(
        &t,
        &Narrowing {
            verbs: Some(vec![("app.jobs".into(), "run".into())]),
            expires: Some(w.now + MIN),
        },
    )
    .unwrap();
    assert!(w.verify_as(&fine, &w.a.0).is_ok());
}

#[test]
fn grants_never_carry_unbinding_or_grant_verbs_nor_too_long_lives() {
    let w = world();
    assert!(matches!(
        mint(
            &w.cp,
            &w.spec(vec![Right::verb("core.monitoring", "disable")], MIN)
        ),
        Err(GrantError::NeverGranted(_))
    ));
    assert!(matches!(
        mint(&w.cp, &w.spec(vec![Right::cap("core.grants")], MIN)),
        Err(GrantError::NeverGranted(_))
    ));
    // A right to all of core.monitoring still never covers disable.
    let t = mint(&w.cp, &w.spec(vec![Right::cap("core.monitoring")], MIN)).unwrap();
    let v = w.verify_as(&t, &w.a.0).unwrap();
    assert_eq!(
        v.allows("core.monitoring", "disable", w.now),
        Err(GrantDenied::NotGranted)
    );
    let long = mint(
        &w.cp,
        &w.spec(vec![Right::cap("app.jobs")], 31 * 24 * 60 * MIN),
    )
    .unwrap();
    assert_eq!(
        w.verify_as(&long, &w.a.0).unwrap_err(),
        GrantDenied::TooLong
    );
}

fn registry() -> Registry<&'static str> {
    use capwire_manifest::{Capability, DeclaredClass, VerbSpec, Version};
    Registry::builder(
        NodeInfo::new(NodeId::from_bytes([10; 32]), "node"),
        MonitoringHandlers {
            bind: "bind",
            disable: "disable",
        },
    )
    .capability(
        Capability::new("app.jobs", Version::new(1, 0, 0))
            .verb_spec(
                VerbSpec::request("run")
                    .class(DeclaredClass::Controller)
                    .handler("run"),
            )
            .verb_spec(
                VerbSpec::request("stop")
                    .class(DeclaredClass::Controller)
                    .handler("stop"),
            ),
    )
    .build()
    .unwrap()
}

#[test]
fn the_chokepoint_lets_a_presented_grant_through_and_names_it() {
    let w = world();
    let reg = registry();
    let cp_id = NodeId::from_bytes([1; 32]);
    let binding = Binding::new(Some(cp_id), 5);
    let gate = Gate::default();
    let d = Delegations::default();
    let only_run = narrow(
        &w.token(),
        &Narrowing {
            verbs: Some(vec![("app.jobs".into(), "run".into())]),
            expires: None,
        },
    )
    .unwrap();

    // Before presenting: not the control plane.
    let r = decide_with(
        &reg,
        &gate,
        &binding,
        &w.a.0,
        "app.jobs",
        "run",
        Some((&d, w.now)),
    );
    assert!(matches!(
        r,
        Decision::Denied(DenyReason::Unauthorized {
            why: Unauthorized::NotController
        })
    ));

    let v = w.verify_as(&only_run, &w.a.0).unwrap();
    let id = v.id();
    d.present(w.a.0, v, w.now).unwrap();
    let Decision::Allowed(p) = decide_with(
        &reg,
        &gate,
        &binding,
        &w.a.0,
        "app.jobs",
        "run",
        Some((&d, w.now)),
    ) else {
        panic!("granted");
    };
    assert_eq!(p.grant().map(|g| g.to_string()), Some(id.clone()));
    assert!(p.still_valid(&binding));
    // A binding change voids the permit and the token.
    assert!(!p.still_valid(&Binding::new(Some(cp_id), 6)));
    let r = decide_with(
        &reg,
        &gate,
        &Binding::new(Some(cp_id), 6),
        &w.a.0,
        "app.jobs",
        "run",
        Some((&d, w.now)),
    );
    assert!(matches!(
        r,
        Decision::Denied(DenyReason::Unauthorized {
            why: Unauthorized::Grant(GrantDenied::BindingChanged)
        })
    ));

    let r = decide_with(
        &reg,
        &gate,
        &binding,
        &w.a.0,
        "app.jobs",
        "stop",
        Some((&d, w.now)),
    );
    let reason = r.into_result().unwrap_err();
    assert_eq!(reason.label(), "grant_not_granted");
    assert_eq!(reason.code_str(), "unauthorized");

    // Expiry is seen although the answer was cached.
    let later = w.now + 11 * MIN;
    let r = decide_with(
        &reg,
        &gate,
        &binding,
        &w.a.0,
        "app.jobs",
        "run",
        Some((&d, later)),
    );
    assert_eq!(r.into_result().unwrap_err().label(), "grant_expired");

    // Revocation is seen at once.
    d.revoke(hex_decode(&id)).unwrap();
    let r = decide_with(
        &reg,
        &gate,
        &binding,
        &w.a.0,
        "app.jobs",
        "run",
        Some((&d, w.now)),
    );
    assert!(!r.is_allowed());
    // And a token revoked before it is presented is refused.
    let v = w.verify_as(&only_run, &w.a.0).unwrap();
    assert_eq!(d.present(w.a.0, v, w.now), Err(GrantDenied::Revoked));
}

#[test]
fn an_authorizer_that_refuses_the_control_plane_refuses_its_grants() {
    struct NoStop;
    impl capwire_authz::Authorizer for NoStop {
        fn authorize(
            &self,
            _: &NodeId,
            _: &str,
            verb: &str,
            _: &Binding,
        ) -> Result<bool, capwire_authz::AuthzError> {
            Ok(verb != "stop")
        }
    }
    let w = world();
    let reg = registry();
    let binding = Binding::new(Some(NodeId::from_bytes([1; 32])), 5);
    let d = Delegations::default();
    d.present(w.a.0, w.verify_as(&w.token(), &w.a.0).unwrap(), w.now)
        .unwrap();
    let gate = Gate::new(NoStop);
    assert!(
        decide_with(
            &reg,
            &gate,
            &binding,
            &w.a.0,
            "app.jobs",
            "run",
            Some((&d, w.now))
        )
        .is_allowed()
    );
    let r = decide_with(
        &reg,
        &gate,
        &binding,
        &w.a.0,
        "app.jobs",
        "stop",
        Some((&d, w.now)),
    );
    assert_eq!(r.into_result().unwrap_err().label(), "authorizer_refused");
}

#[test]
fn a_random_key_pair_is_not_a_grant_key() {
    // Keys made elsewhere verify nothing minted by the control plane.
    let w = world();
    let other = KeyPair::new();
    let pk =
        capwire_authz::GrantPublicKey::from_bytes(other.public().to_bytes().try_into().unwrap());
    assert_eq!(
        verify(&w.token(), &pk, &w.node, 5, &w.a.0, w.now, |_| false).unwrap_err(),
        GrantDenied::BadSignature
    );
    let text = w.cp.public().to_string();
    assert!(text.starts_with("ed25519/") && text.len() == 8 + 64);
    assert_eq!(
        text.parse::<capwire_authz::GrantPublicKey>().unwrap(),
        w.cp.public()
    );
    assert!(
        "ed25519/zz"
            .parse::<capwire_authz::GrantPublicKey>()
            .is_err()
    );
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A call in a token's last second must not be remembered as allowed past
/// it: the answer holds until that second ends, not for a minute.
#[test]
fn an_answer_given_in_the_last_second_ends_with_that_second() {
    let w = world();
    let reg = registry();
    let binding = Binding::new(Some(NodeId::from_bytes([1; 32])), 5);
    let gate = Gate::default();
    let d = Delegations::default();
    let t = w.token();
    d.present(w.a.0, w.verify_as(&t, &w.a.0).unwrap(), w.now)
        .unwrap();
    let expiry = w.now + 10 * MIN;
    let ask = |at: SystemTime| {
        decide_with(
            &reg,
            &gate,
            &binding,
            &w.a.0,
            "app.jobs",
            "run",
            Some((&d, at)),
        )
    };
    // Valid through the second its expiry names, asked (and cached) there.
    let last = expiry + Duration::from_millis(400);
    assert!(ask(last).is_allowed());
    let cached = d
        .check(&w.a.0, "app.jobs", "run", &binding, last)
        .unwrap()
        .unwrap();
    assert_eq!(cached.until, expiry + Duration::from_secs(1));
    for after in [1_000, 1_001, 2_000, 5_900, 59_000] {
        let at = expiry + Duration::from_millis(after);
        assert_eq!(
            ask(at).into_result().unwrap_err().label(),
            "grant_expired",
            "{after} ms past the expiry"
        );
    }
    // The same for a copy narrowed to an earlier expiry.
    let soon = w.now + MIN;
    let narrowed = narrow(
        &t,
        &Narrowing {
            verbs: None,
            expires: Some(soon),
        },
    )
    .unwrap();
    let d = Delegations::default();
    d.present(w.a.0, w.verify_as(&narrowed, &w.a.0).unwrap(), w.now)
        .unwrap();
    let at = soon + Duration::from_millis(999);
    assert!(
        decide_with(
            &reg,
            &gate,
            &binding,
            &w.a.0,
            "app.jobs",
            "run",
            Some((&d, at))
        )
        .is_allowed()
    );
    let at = soon + Duration::from_millis(1_500);
    assert!(
        !decide_with(
            &reg,
            &gate,
            &binding,
            &w.a.0,
            "app.jobs",
            "run",
            Some((&d, at))
        )
        .is_allowed()
    );
}

#[test]
fn next_change_is_the_first_second_an_answer_can_turn() {
    let w = world();
    let v = w.verify_as(&w.token(), &w.a.0).unwrap();
    let expiry = w.now + 10 * MIN;
    assert_eq!(v.next_change(w.now), Some(expiry));
    assert_eq!(v.next_change(expiry), Some(expiry + Duration::from_secs(1)));
    assert_eq!(
        v.next_change(expiry + Duration::from_millis(999)),
        Some(expiry + Duration::from_secs(1))
    );
    assert_eq!(v.next_change(expiry + Duration::from_secs(1)), None);
}

/// A token whose narrowed expiry has passed is refused `expired` when it
/// is presented (it could let nothing through), and `expires` is the
/// earliest expiry of its blocks.
#[test]
fn a_token_narrowed_to_a_past_expiry_is_refused_expired() {
    let w = world();
    let t = w.token();
    let soon = w.now + MIN;
    let narrowed = narrow(
        &t,
        &Narrowing {
            verbs: None,
            expires: Some(soon),
        },
    )
    .unwrap();
    let v = w.verify_as(&narrowed, &w.a.0).unwrap();
    assert_eq!(v.expires(), soon);
    assert_eq!(v.lifetime_end(), w.now + 10 * MIN);
    let later = soon + Duration::from_secs(2);
    assert_eq!(
        verify(&narrowed, &w.cp.public(), &w.node, 5, &w.a.0, later, |_| {
            false
        })
        .unwrap_err(),
        GrantDenied::Expired
    );
    // The token itself is still good then.
    assert!(verify(&t, &w.cp.public(), &w.node, 5, &w.a.0, later, |_| false).is_ok());
}

/// Mints an authority block from datalog source, as a control plane that
/// does not use capwire's `mint` might.
fn mint_source(w: &World, source: &str) -> String {
    let key = biscuit_auth::PrivateKey::from_bytes(
        &w.cp_seed(),
        biscuit_auth::builder::Algorithm::Ed25519,
    )
    .unwrap();
    let root = KeyPair::from(&key);
    biscuit_auth::Biscuit::builder()
        .code(source)
        .unwrap()
        .build(&root)
        .unwrap()
        .to_base64()
        .unwrap()
}

impl World {
    /// The control plane's grant key seed, as `GrantKey::from_secret`
    /// derives it (WIRE.md 5.5).
    fn cp_seed(&self) -> Vec<u8> {
        use blake2::Blake2sMac256;
        use blake2::digest::{KeyInit, Mac};
        let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(&[1; 32]).unwrap();
        mac.update(b"capwire grant key v1");
        mac.finalize().into_bytes().to_vec()
    }
}

#[test]
fn the_authority_block_holds_exactly_what_wire_md_lists() {
    let w = world();
    let head = format!(
        "capwire_grant(1); node(\"{}\"); binding(5); holder(\"{}\", hex:{});",
        w.node,
        w.a.0,
        hex(w.a.1.public().as_bytes())
    );
    let expiry = "check if time($t), $t <= 2030-03-17T18:00:00Z;";
    let good = mint_source(
        &w,
        &format!("{head} right(\"app.jobs\", \"run\"); {expiry}"),
    );
    assert!(
        w.verify_as(&good, &w.a.0).is_ok(),
        "the shape WIRE.md gives"
    );
    for (what, source) in [
        ("no right", format!("{head} {expiry}")),
        (
            "an extra fact",
            format!("{head} right(\"app.jobs\", \"run\"); admin(true); {expiry}"),
        ),
        (
            "a rule",
            format!(
                "{head} right(\"app.jobs\", \"run\"); right($c, \"stop\") <- right($c, \"run\"); {expiry}"
            ),
        ),
        (
            "a second check",
            format!("{head} right(\"app.jobs\", \"run\"); {expiry} check if operation($c, $v);"),
        ),
        (
            "no expiry",
            format!("{head} right(\"app.jobs\", \"run\"); check if time($t);"),
        ),
        (
            "a right of the wrong arity",
            format!("{head} right(\"app.jobs\"); {expiry}"),
        ),
    ] {
        let token = mint_source(&w, &source);
        let refused = w.verify_as(&token, &w.a.0).unwrap_err();
        assert!(
            matches!(refused, GrantDenied::BadToken(_)),
            "{what}: {refused:?}"
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
