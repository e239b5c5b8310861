//! The property of grants: no sequence of narrowings, hand-overs (by the
//! holder or by anyone else), revocations and presentations lets any node
//! call a verb the control plane did not grant, outside every expiry
//! along the way, or as anyone but the last rightful holder. The token's
//! answers are compared with a model of what it should allow, both ways.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use capwire_authz::{
    GrantKey, GrantSpec, Narrowing, Right, delegate, mint, narrow, revocation_ids, verify,
};
use capwire_envelope::NodeId;
use proptest::prelude::*;

const VERBS: [(&str, &str); 5] = [
    ("app.a", "x"),
    ("app.a", "y"),
    ("app.b", "x"),
    ("core.cluster", "remove"),
    ("core.monitoring", "disable"),
];

#[derive(Debug, Clone)]
enum Step {
    /// Narrow to these verbs (indexes into VERBS) and/or this expiry (s).
    Narrow(Option<BTreeSet<usize>>, Option<u64>),
    /// Hand on to node `to`, signed by node `by` (the holder or not).
    HandOn { by: usize, to: usize },
    /// Revoke the block at this index (modulo the block count).
    Revoke(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            prop::option::of(prop::collection::btree_set(0..VERBS.len(), 0..4)),
            prop::option::of(0u64..1200)
        )
            .prop_map(|(v, e)| Step::Narrow(v, e)),
        (0usize..3, 0usize..3).prop_map(|(by, to)| Step::HandOn { by, to }),
        (0usize..8).prop_map(Step::Revoke),
    ]
}

fn node(i: usize) -> (NodeId, GrantKey) {
    let b = u8::try_from(20 + i).unwrap();
    (NodeId::from_bytes([b; 32]), GrantKey::from_secret(&[b; 32]))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn nothing_widens_a_grant(
        granted in prop::collection::btree_set(0..VERBS.len() - 1, 1..4),
        whole_cap in any::<bool>(),
        life in 1u64..1200,
        steps in prop::collection::vec(step(), 0..5),
        at in 0u64..1300,
    ) {
        let cp = GrantKey::from_secret(&[1; 32]);
        let target = NodeId::from_bytes([2; 32]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let rights: Vec<Right> = if whole_cap {
            vec![Right::cap("app.a")]
        } else {
            granted.iter().map(|&i| Right::verb(VERBS[i].0, VERBS[i].1)).collect()
        };
        let granted_verbs: BTreeSet<usize> = if whole_cap {
            (0..VERBS.len()).filter(|&i| VERBS[i].0 == "app.a").collect()
        } else {
            granted.clone()
        };
        let (h0, k0) = node(0);
        let mut token = mint(&cp, &GrantSpec {
            node: target, epoch: 1, holder: h0, holder_key: k0.public(),
            rights, expires: t0 + Duration::from_secs(life),
        }).unwrap();

        // The model: who holds it, which verbs and until when it allows,
        // and whether it is still valid at all.
        let mut holder = 0usize;
        let mut verbs = granted_verbs;
        let mut until = life;
        let mut broken = false;
        let mut revoked: Vec<Vec<u8>> = Vec::new();
        for s in &steps {
            match s {
                Step::Narrow(v, e) => {
                    let n = Narrowing {
                        verbs: v.as_ref().filter(|v| !v.is_empty()).map(|v| {
                            v.iter().map(|&i| (VERBS[i].0.to_owned(), VERBS[i].1.to_owned())).collect()
                        }),
                        expires: e.map(|e| t0 + Duration::from_secs(e)),
                    };
                    let Ok(t) = narrow(&token, &n) else { continue };
                    token = t;
                    if let Some(v) = n.verbs.as_ref() {
                        let keep: BTreeSet<usize> = v.iter().filter_map(|(c, vb)| {
                            VERBS.iter().position(|(c2, v2)| c2 == c && v2 == vb)
                        }).collect();
                        verbs = verbs.intersection(&keep).copied().collect();
                    }
                    if let Some(e) = e { until = until.min(*e); }
                }
                Step::HandOn { by, to } => {
                    let (to_id, to_key) = node(*to);
                    let Ok(t) = delegate(&token, &node(*by).1, &to_id, &to_key.public(), &Narrowing::default()) else { continue };
                    token = t;
                    // Only the holder's own key hands on; anyone else's
                    // block (or a second block by a key already used)
                    // breaks the chain.
                    if *by != holder || broken { broken = true; } else { holder = *to; }
                }
                Step::Revoke(i) => {
                    let ids = revocation_ids(&token).unwrap();
                    let id = &ids[i % ids.len()];
                    revoked.push((0..id.len()).step_by(2).map(|j| u8::from_str_radix(&id[j..j + 2], 16).unwrap()).collect());
                }
            }
        }
        // A holder key reused along the chain breaks it too.
        let now = t0 + Duration::from_secs(at);
        for presenter in 0..3 {
            let (pid, _) = node(presenter);
            let result = verify(&token, &cp.public(), &target, 1, &pid, now, |id| revoked.iter().any(|r| r == id));
            for (i, (cap, verb)) in VERBS.iter().enumerate() {
                let allowed = result.as_ref().is_ok_and(|v| v.allows(cap, verb, now).is_ok());
                if allowed {
                    // Soundness: never more than the model says.
                    prop_assert!(!broken, "a broken chain let {cap}/{verb} through");
                    prop_assert_eq!(presenter, holder, "another node than the holder used it");
                    prop_assert!(verbs.contains(&i), "{}/{} was not granted", cap, verb);
                    prop_assert!(at <= until, "used after its expiry");
                    prop_assert!(revoked.is_empty(), "a revoked token let a call through");
                    prop_assert!((*cap, *verb) != ("core.monitoring", "disable"));
                }
            }
        }
        // And completeness for the simple case: an unbroken, unrevoked
        // token allows its holder every verb the model keeps, in time
        // (a reused holder key is the one case the model does not track).
        let keys_reused = {
            let mut seen = BTreeSet::new();
            let mut h = 0usize;
            let mut reused = false;
            for s in &steps {
                if let Step::HandOn { by, to } = s
                    && *by == h
                {
                    if !seen.insert(h) {
                        reused = true;
                    }
                    h = *to;
                }
            }
            reused
        };
        if !broken && revoked.is_empty() && at <= until && !keys_reused {
            let (pid, _) = node(holder);
            let v = verify(&token, &cp.public(), &target, 1, &pid, now, |_| false).unwrap();
            for &i in &verbs {
                prop_assert!(v.allows(VERBS[i].0, VERBS[i].1, now).is_ok(), "{}/{} refused", VERBS[i].0, VERBS[i].1);
            }
        }
    }
}
