//! Delegated rights end to end, between real nodes over encrypted
//! sessions with a real store: a control plane grants a worker one
//! controller verb of a node, the worker hands a narrower copy to a
//! helper, and the node's chokepoint lets exactly that through, names the
//! token in its monitoring copies, and refuses stolen, expired, revoked,
//! voided and forged tokens with their reasons.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/core.rs"]
mod core_helpers;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use capwire::envelope::{ErrorBody, ErrorCode};
use capwire::grants::{GrantCallError, Narrowing, Right, revocation_ids};
use capwire::manifest::{
    ConfigValue, GetConfig, GrantsPresent, MonitoringDisable, NoArgs, PresentArgs, SetConfig,
    SetConfigArgs,
};
use capwire::{CallError, ControlEvent, Node, Peer};
use core_helpers::{Bound, bind_new, copies, denied, events_until, listening};

/// The error body of a refused call (denied by the chokepoint or by the
/// handler: both are `unauthorized` here).
#[track_caller]
fn remote<T: std::fmt::Debug>(result: Result<T, CallError>) -> ErrorBody {
    match result {
        Err(CallError::Denied(body) | CallError::Remote(body)) => body,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The reason a present was refused (its detail's `reason`).
fn reason(body: &ErrorBody) -> String {
    let detail: serde_json::Value = body
        .detail
        .as_ref()
        .map(|d| d.decode::<serde_json::Value>().unwrap())
        .unwrap_or_default();
    detail["reason"].as_str().unwrap_or_default().to_owned()
}

struct Three {
    b: Bound,
    worker: Node,
    from_worker: Peer,
    helper: Node,
    from_helper: Peer,
}

async fn three(builder: capwire::NodeBuilder) -> Three {
    let b = bind_new(builder).await;
    let addr = b.node.local_addrs()[0].clone();
    let worker = Node::builder("worker").start().await.unwrap();
    let from_worker = worker.connect(&addr, Some(b.node.id())).await.unwrap();
    let helper = Node::builder("helper").start().await.unwrap();
    let from_helper = helper.connect(&addr, Some(b.node.id())).await.unwrap();
    Three {
        b,
        worker,
        from_worker,
        helper,
        from_helper,
    }
}

impl Three {
    /// Shuts the bound node down (its store closed, for a restart on it);
    /// the worker, the helper and the control plane stay.
    async fn stop_node(self) -> (Node, Node, Node) {
        let Three {
            b,
            worker,
            from_worker,
            helper,
            from_helper,
        } = self;
        drop((from_worker, from_helper));
        let Bound { node, cp, peer, .. } = b;
        drop(peer);
        node.shutdown().await;
        (worker, helper, cp)
    }
}

async fn grant(t: &Three, rights: Vec<Right>, valid_for: Duration) -> String {
    t.b.cp
        .grant(
            &t.b.peer,
            t.worker.id(),
            t.worker.grant_key(),
            rights,
            valid_for,
        )
        .await
        .unwrap()
}

fn set_config(v: u32) -> SetConfigArgs {
    SetConfigArgs {
        value: capwire::envelope::RawValue::encode(&v).unwrap(),
        if_version: None,
    }
}

#[tokio::test]
async fn a_grant_lets_its_holder_call_exactly_its_verbs() {
    let t = three(listening("agent-1")).await;
    // Not the control plane: refused, with no token.
    let body = denied(t.from_worker.request(GetConfig, NoArgs {}).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);

    let token = grant(
        &t,
        vec![Right::verb("core.configuration", "get_config")],
        Duration::from_secs(600),
    )
    .await;
    let reply = t.from_worker.present(&token).await.unwrap();
    assert_eq!(reply.grant, revocation_ids(&token).unwrap()[0]);
    let got: ConfigValue = t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    assert_eq!(got.version, 0);

    // A verb not granted.
    let body = denied(t.from_worker.request(SetConfig, set_config(1)).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert!(
        body.message.contains("does not grant this verb"),
        "{}",
        body.message
    );
    // Unbinding can never be granted.
    let body = denied(t.from_worker.request(MonitoringDisable, NoArgs {}).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(t.b.node.controller(), Some(t.b.cp.id()));
    // Nobody else gains anything.
    let body = denied(t.from_helper.request(GetConfig, NoArgs {}).await);
    assert!(
        body.message.contains("not the bound control plane"),
        "{}",
        body.message
    );
}

#[tokio::test]
async fn a_stolen_token_is_refused_and_a_narrower_copy_works_for_its_new_holder() {
    let t = three(listening("agent-1")).await;
    let token = grant(
        &t,
        vec![Right::cap("core.configuration")],
        Duration::from_secs(600),
    )
    .await;
    // The helper presents the worker's token: wrong holder.
    let body = remote(t.from_helper.present(&token).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(reason(&body), "wrong_holder");

    // The worker hands on get_config alone, for a minute.
    let copy = t
        .worker
        .hand_on(
            &token,
            t.helper.id(),
            t.helper.grant_key(),
            &Narrowing {
                verbs: Some(vec![("core.configuration".into(), "get_config".into())]),
                expires: Some(SystemTime::now() + Duration::from_secs(60)),
            },
        )
        .unwrap();
    t.from_helper.present(&copy).await.unwrap();
    t.from_helper.request(GetConfig, NoArgs {}).await.unwrap();
    let body = denied(t.from_helper.request(SetConfig, set_config(2)).await);
    assert!(body.message.contains("does not grant"), "{}", body.message);
    // The worker cannot use the copy it handed on.
    let body = remote(t.from_worker.present(&copy).await);
    assert_eq!(reason(&body), "wrong_holder");
    // But keeps its own, wider right.
    t.from_worker.present(&token).await.unwrap();
    t.from_worker
        .request(SetConfig, set_config(3))
        .await
        .unwrap();
}

#[tokio::test]
async fn tokens_expire() {
    let t = three(listening("agent-1")).await;
    let token = grant(
        &t,
        vec![Right::cap("core.configuration")],
        Duration::from_secs(2),
    )
    .await;
    t.from_worker.present(&token).await.unwrap();
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let body = denied(t.from_worker.request(GetConfig, NoArgs {}).await);
    assert!(body.message.contains("expired"), "{}", body.message);
    let body = remote(t.from_worker.present(&token).await);
    assert_eq!(reason(&body), "expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_takes_effect_at_once_for_every_copy_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let keypair = capwire::Keypair::generate().unwrap();
    let builder = || {
        listening("agent-1")
            .state_dir(dir.path().join("node"))
            .keypair(keypair.clone())
    };
    let t = three(builder()).await;
    let token = grant(
        &t,
        vec![Right::cap("core.configuration")],
        Duration::from_secs(600),
    )
    .await;
    let copy = t
        .worker
        .hand_on(
            &token,
            t.helper.id(),
            t.helper.grant_key(),
            &Narrowing::default(),
        )
        .unwrap();
    t.from_worker.present(&token).await.unwrap();
    t.from_helper.present(&copy).await.unwrap();
    t.from_helper.request(GetConfig, NoArgs {}).await.unwrap();

    let info =
        t.b.peer
            .revoke_grant(&revocation_ids(&token).unwrap()[0])
            .await
            .unwrap();
    assert_eq!(info.revocations, 1);
    for p in [&t.from_worker, &t.from_helper] {
        let body = denied(p.request(GetConfig, NoArgs {}).await);
        assert_eq!(body.code, ErrorCode::Unauthorized);
    }
    let body = remote(t.from_helper.present(&copy).await);
    assert_eq!(reason(&body), "revoked");

    // Restarted on the same store: still revoked; the binding and the
    // control plane's key came back with it.
    let (worker, helper, cp) = t.stop_node().await;
    let node = builder().start().await.unwrap();
    assert_eq!(node.controller(), Some(cp.id()));
    let addr = node.local_addrs()[0].clone();
    let from_worker = worker.connect(&addr, Some(node.id())).await.unwrap();
    let body = remote(from_worker.present(&token).await);
    assert_eq!(reason(&body), "revoked");
    // A fresh grant from the same control plane works after the restart.
    let to_node = cp.connect(&addr, Some(node.id())).await.unwrap();
    let fresh = cp
        .grant(
            &to_node,
            worker.id(),
            worker.grant_key(),
            vec![Right::cap("core.configuration")],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    from_worker.present(&fresh).await.unwrap();
    from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    for n in [helper, worker, cp, node] {
        n.shutdown().await;
    }
}

#[tokio::test]
async fn a_new_binding_voids_every_earlier_token() {
    let t = three(listening("agent-1")).await;
    let token = grant(
        &t,
        vec![Right::cap("core.configuration")],
        Duration::from_secs(600),
    )
    .await;
    t.from_worker.present(&token).await.unwrap();
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();

    // The control plane lets go and binds again: a new binding.
    t.b.peer
        .request(MonitoringDisable, NoArgs {})
        .await
        .unwrap();
    let invite = t.b.node.invite(Some(t.b.cp.id())).unwrap();
    t.b.peer.bind(&invite).await.unwrap();
    let body = denied(t.from_worker.request(GetConfig, NoArgs {}).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let body = remote(t.from_worker.present(&token).await);
    assert_eq!(reason(&body), "binding_changed");

    // Another control plane binds: the first one's tokens are forged to it.
    t.b.peer
        .request(MonitoringDisable, NoArgs {})
        .await
        .unwrap();
    let other = Node::builder("other-cp").start().await.unwrap();
    let invite = t.b.node.invite(Some(other.id())).unwrap();
    let (to_node, _) = other.connect_invite(&invite).await.unwrap();
    let old =
        t.b.cp
            .grant(
                &t.b.peer,
                t.worker.id(),
                t.worker.grant_key(),
                vec![Right::cap("core.configuration")],
                Duration::from_secs(600),
            )
            .await
            .unwrap_err();
    assert!(
        matches!(old, GrantCallError::Call(CallError::Denied(_))),
        "{old:?}"
    );
    let body = remote(t.from_worker.present(&token).await);
    assert_eq!(reason(&body), "bad_signature");
    // The new control plane's grants work.
    let fresh = other
        .grant(
            &to_node,
            t.worker.id(),
            t.worker.grant_key(),
            vec![Right::cap("core.configuration")],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    t.from_worker.present(&fresh).await.unwrap();
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
}

#[tokio::test]
async fn monitoring_copies_name_the_token_that_let_a_call_through() {
    let t = three(listening("agent-1")).await;
    let mut events = t.b.cp.control_events();
    let token = grant(
        &t,
        vec![Right::cap("core.configuration")],
        Duration::from_secs(600),
    )
    .await;
    let id = t.from_worker.present(&token).await.unwrap().grant;
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    let seen = events_until(
        &mut events,
        "the copy of the delegated call",
        |e| matches!(e, ControlEvent::Copy { record, .. } if record.verb == "get_config"),
    )
    .await;
    let copy = copies(&seen)
        .into_iter()
        .map(|(_, c)| c)
        .find(|c| c.verb == "get_config")
        .unwrap();
    assert_eq!(copy.peer, t.worker.id());
    assert_eq!(copy.grant.as_deref(), Some(id.as_str()));
    // The present itself is copied without a grant (a bootstrap verb).
    let present = copies(&seen)
        .into_iter()
        .map(|(_, c)| c)
        .find(|c| c.verb == "present")
        .unwrap();
    assert_eq!(present.grant, None);
}

#[tokio::test]
async fn garbage_huge_and_forged_tokens_are_refused_with_reasons() {
    let t = three(listening("agent-1")).await;
    for (junk, why) in [
        ("not a token".to_owned(), "bad_token"),
        ("A".repeat(8193), "bad_token"),
        (String::new(), "bad_token"),
    ] {
        let body = remote(t.from_worker.present(&junk).await);
        assert_eq!(body.code, ErrorCode::Unauthorized);
        assert_eq!(reason(&body), why);
    }
    // Minted by a key that is not the control plane's.
    let forger = capwire::grants::GrantKey::from_secret(&[9; 32]);
    let forged = capwire::authz::mint(
        &forger,
        &capwire::grants::GrantSpec {
            node: t.b.node.id(),
            epoch: 1,
            holder: t.worker.id(),
            holder_key: t.worker.grant_key(),
            rights: vec![Right::cap("core.configuration")],
            expires: SystemTime::now() + Duration::from_secs(60),
        },
    )
    .unwrap();
    let body = remote(t.from_worker.present(&forged).await);
    assert_eq!(reason(&body), "bad_signature");
    // Args that are not the schema's.
    let r = t
        .from_worker
        .request(
            GrantsPresent,
            PresentArgs {
                token: "x".repeat(100),
            },
        )
        .await;
    assert!(r.is_err());
}

#[tokio::test]
async fn presentations_racing_revocations_never_outlive_the_revocation() {
    let t = Arc::new(three(listening("agent-1")).await);
    for round in 0..20 {
        let token = grant(
            &t,
            vec![Right::cap("core.configuration")],
            Duration::from_secs(600),
        )
        .await;
        let id = revocation_ids(&token).unwrap()[0].clone();
        let (a, b) = (t.clone(), t.clone());
        let present = tokio::spawn(async move { a.from_worker.present(&token).await });
        let revoke = tokio::spawn(async move { b.b.peer.revoke_grant(&id).await });
        let _ = present.await.unwrap();
        revoke.await.unwrap().unwrap();
        // Whatever the order, once the revocation is answered the token
        // lets nothing through.
        let r = t.from_worker.request(GetConfig, NoArgs {}).await;
        assert!(
            r.is_err(),
            "round {round}: a revoked token let a call through"
        );
    }
}

#[tokio::test]
async fn a_protocol_1_session_has_no_grants() {
    let b = bind_new(listening("agent-1")).await;
    let mut v1 = common::RawPeer::connect(&b.node).await;
    assert!(
        v1.node_manifest
            .capabilities
            .iter()
            .all(|c| c.id.as_str() != "core.grants")
    );
    v1.control(
        "core.grants",
        "present",
        "r1",
        &common::raw(&PresentArgs { token: "x".into() }),
    )
    .await;
    assert_eq!(
        v1.response("r1").await.outcome.unwrap_err().code,
        ErrorCode::UnknownVerb
    );
}

#[tokio::test]
async fn costly_tokens_and_floods_of_presentations_stay_bounded() {
    use biscuit_auth::UnverifiedBiscuit;
    use biscuit_auth::builder::BlockBuilder;
    let t = three(listening("agent-1")).await;
    let token = grant(
        &t,
        vec![Right::cap("core.configuration")],
        Duration::from_secs(600),
    )
    .await;
    // The holder appends a block whose rules would blow up: refused
    // before anything is evaluated, and the node serves on.
    let mut code = String::new();
    for i in 0..60 {
        code.push_str(&format!("n({i});"));
    }
    code.push_str("p($x, $y, $z) <- n($x), n($y), n($z); check if p(1, 2, 3);");
    let heavy = UnverifiedBiscuit::from_base64(&token)
        .unwrap()
        .append(BlockBuilder::new().code(code).unwrap())
        .unwrap()
        .to_base64()
        .unwrap();
    let body = remote(t.from_worker.present(&heavy).await);
    assert_eq!(reason(&body), "bad_token");
    assert!(body.message.contains("rule"), "{}", body.message);

    // A flood: 300 presentations at once, garbage and valid mixed; each
    // gets its answer, and the node keeps at most 4 tokens per holder.
    let mut calls = Vec::new();
    for i in 0..300 {
        let p = t.from_worker.clone();
        let tok = if i % 3 == 0 {
            token.clone()
        } else {
            format!("garbage-{i}")
        };
        calls.push(tokio::spawn(async move { p.present(&tok).await }));
    }
    let mut kept = 0;
    for c in calls {
        match c.await.unwrap() {
            Ok(_) => kept += 1,
            Err(CallError::Denied(_) | CallError::Remote(_) | CallError::Overloaded) => {}
            Err(e) => panic!("unexpected: {e:?}"),
        }
    }
    assert!(kept > 0);
    let stats = t.b.node.stats();
    assert_eq!(stats.grant_holders, 1);
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    assert!(
        stats
            .grants_refused
            .iter()
            .any(|(r, n)| *r == "bad_token" && *n >= 100),
        "{:?}",
        stats.grants_refused
    );
}

/// A version-1 peer is shown no `core.grants`: a controller verb of it is
/// `unknown_verb` to such a peer, as to anyone, never `unauthorized`
/// (which would tell it the verb exists).
#[tokio::test]
async fn a_version_1_stranger_is_told_core_grants_does_not_exist() {
    let node = listening("agent-1").start().await.unwrap();
    let mut v1 = common::RawPeer::connect(&node).await;
    for (verb, req) in [("info", "g1"), ("revoke", "g2"), ("present", "g3")] {
        v1.control("core.grants", verb, req, &common::raw(&NoArgs {}))
            .await;
        let body = v1.response(req).await.outcome.unwrap_err();
        assert_eq!(body.code, ErrorCode::UnknownVerb, "{verb}: {body:?}");
    }
    node.shutdown().await;
}

/// A token is valid through the second its expiry names, and not a call
/// after: an answer cached in that last second does not let calls through
/// for the rest of a minute.
#[tokio::test]
async fn no_call_goes_through_after_the_second_a_token_expires() {
    let t = three(listening("agent-1")).await;
    let token = grant(
        &t,
        vec![Right::verb("core.configuration", "get_config")],
        Duration::from_secs(2),
    )
    .await;
    let reply = t.from_worker.present(&token).await.unwrap();
    // Valid through the whole second it names, and not after.
    let end = SystemTime::UNIX_EPOCH + Duration::from_millis(reply.expires_ms + 1_000);
    let mut allowed = 0;
    let mut refused_since = None;
    let stop = end + Duration::from_secs(3);
    while SystemTime::now() < stop {
        let started = SystemTime::now();
        match t.from_worker.request(GetConfig, NoArgs {}).await {
            Ok(_) => {
                allowed += 1;
                assert!(
                    started < end,
                    "a call made {:?} after the token's last second went through",
                    started.duration_since(end).unwrap()
                );
                assert!(refused_since.is_none(), "allowed again after a refusal");
            }
            Err(e) => {
                let body = remote(Err::<(), _>(e));
                assert!(body.message.contains("expired"), "{}", body.message);
                refused_since.get_or_insert(started);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(allowed > 0);
    assert!(refused_since.is_some(), "refused once it expired");
    // A node refuses what it would refuse at presentation anyway: a
    // control plane cannot mint a token for longer than 30 days.
    let long =
        t.b.cp
            .grant(
                &t.b.peer,
                t.worker.id(),
                t.worker.grant_key(),
                vec![Right::verb("core.configuration", "get_config")],
                Duration::from_secs(31 * 86_400),
            )
            .await;
    assert!(matches!(long, Err(GrantCallError::TooLong)), "{long:?}");
}

/// A wall clock a test moves: the system's, plus an offset.
#[derive(Debug, Default)]
struct Moved(std::sync::atomic::AtomicI64);

impl capwire::clock::WallClock for Moved {
    fn now(&self) -> SystemTime {
        let by = self.0.load(std::sync::atomic::Ordering::SeqCst);
        let now = SystemTime::now();
        if by >= 0 {
            now + Duration::from_secs(by.unsigned_abs())
        } else {
            now - Duration::from_secs(by.unsigned_abs())
        }
    }
}

/// A token for `get_config`, valid for 60 s, presented and used by the
/// worker; then the node's clock is stepped past its expiry and a call
/// under it is refused `expired`.
async fn expired_token(t: &Three, clock: &Moved) -> String {
    let token = grant(
        t,
        vec![Right::verb("core.configuration", "get_config")],
        Duration::from_secs(60),
    )
    .await;
    t.from_worker.present(&token).await.unwrap();
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    clock.0.store(120, std::sync::atomic::Ordering::SeqCst);
    let body = denied(t.from_worker.request(GetConfig, NoArgs {}).await);
    assert!(body.message.contains("expired"), "{}", body.message);
    token
}

/// Expiry is judged by the node's clock, read through a floor: stepped
/// past a token's expiry, the node refuses it; set back again, it still
/// does (its date never goes back to before one it read), for calls and
/// for a new presentation alike.
#[tokio::test]
async fn a_clock_set_back_does_not_bring_an_expired_token_back() {
    let clock = Arc::new(Moved::default());
    let t = three(listening("agent-1").wall_clock(clock.clone())).await;
    let token = expired_token(&t, &clock).await;

    clock.0.store(0, std::sync::atomic::Ordering::SeqCst);
    let body = denied(t.from_worker.request(GetConfig, NoArgs {}).await);
    assert!(body.message.contains("expired"), "{}", body.message);
    let body = remote(t.from_worker.present(&token).await);
    assert_eq!(reason(&body), "expired");

    // A token minted now is judged by the node's date, which is still
    // ahead: one that ends before it is refused at once.
    let short = grant(
        &t,
        vec![Right::verb("core.configuration", "get_config")],
        Duration::from_secs(30),
    )
    .await;
    let body = remote(t.from_worker.present(&short).await);
    assert_eq!(reason(&body), "expired");
    let long = grant(
        &t,
        vec![Right::verb("core.configuration", "get_config")],
        Duration::from_secs(600),
    )
    .await;
    t.from_worker.present(&long).await.unwrap();
    t.from_worker.request(GetConfig, NoArgs {}).await.unwrap();
}

/// The clock's floor is written while the node runs, not only when it
/// stops: a node that ends without shutting down (its runtime dropped,
/// as a crash ends it, after the second the floor is written in) keeps an
/// expired token refused when it starts again with the clock set back.
#[test]
fn a_node_that_ends_without_stopping_keeps_its_clock_floor() {
    let dir = tempfile::tempdir().unwrap();
    let keypair = capwire::Keypair::generate().unwrap();
    let worker_keypair = capwire::Keypair::generate().unwrap();
    let clock = Arc::new(Moved::default());
    let builder = || {
        listening("agent-1")
            .state_dir(dir.path().join("node"))
            .keypair(keypair.clone())
            .wall_clock(clock.clone())
    };
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let token = first.block_on(async {
        let b = bind_new(builder()).await;
        let addr = b.node.local_addrs()[0].clone();
        let worker = Node::builder("worker")
            .keypair(worker_keypair.clone())
            .start()
            .await
            .unwrap();
        let from_worker = worker.connect(&addr, Some(b.node.id())).await.unwrap();
        let token =
            b.cp.grant(
                &b.peer,
                worker.id(),
                worker.grant_key(),
                vec![Right::verb("core.configuration", "get_config")],
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        from_worker.present(&token).await.unwrap();
        clock.0.store(120, std::sync::atomic::Ordering::SeqCst);
        let body = denied(from_worker.request(GetConfig, NoArgs {}).await);
        assert!(body.message.contains("expired"), "{}", body.message);
        // The floor is written within a second or so; then the node ends
        // with no shutdown (nothing is written when it goes).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        drop((from_worker, worker, b));
        token
    });
    drop(first);

    clock.0.store(0, std::sync::atomic::Ordering::SeqCst);
    let second = runtime();
    second.block_on(async {
        let node = builder().start().await.unwrap();
        let addr = node.local_addrs()[0].clone();
        let worker = Node::builder("worker")
            .keypair(worker_keypair.clone())
            .start()
            .await
            .unwrap();
        let from_worker = worker.connect(&addr, Some(node.id())).await.unwrap();
        let body = remote(from_worker.present(&token).await);
        assert_eq!(reason(&body), "expired");
        for n in [worker, node] {
            n.shutdown().await;
        }
    });
}

/// The clock's floor outlives a restart with no revocation written: a
/// token the node refused as expired stays refused when the node starts
/// again on its store with the clock set back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_clock_set_back_keeps_an_expired_token_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keypair = capwire::Keypair::generate().unwrap();
    let clock = Arc::new(Moved::default());
    let builder = || {
        listening("agent-1")
            .state_dir(dir.path().join("node"))
            .keypair(keypair.clone())
            .wall_clock(clock.clone())
    };
    let t = three(builder()).await;
    let token = expired_token(&t, &clock).await;

    let (worker, helper, cp) = t.stop_node().await;
    // Set back to the system's date, when the token had not expired yet.
    clock.0.store(0, std::sync::atomic::Ordering::SeqCst);
    let node = builder().start().await.unwrap();
    let addr = node.local_addrs()[0].clone();
    let from_worker = worker.connect(&addr, Some(node.id())).await.unwrap();
    let body = remote(from_worker.present(&token).await);
    assert_eq!(reason(&body), "expired");
    for n in [helper, worker, cp, node] {
        n.shutdown().await;
    }
}
