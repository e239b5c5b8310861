//! The dispatch chokepoint as a peer sees it through the wire: unknown and
//! look-alike names, controller verbs and the bind ceremony, deny before
//! decode, handler panics, metrics, version requirements and manifest push.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use capwire::authz::BindFailure;
use capwire::envelope::{ErrorBody, ErrorCode, Frame};
use capwire::manifest::{
    BindArgs, BindReply, MonitoringBind, MonitoringDisable, MonitoringStatus, NoArgs,
};
use capwire::{CallError, Limits, Node, Outcome, Peer};
use common::{
    Admin, Boom, Counters, RawPeer, Say, client_node, connect_tcp, echo_node, raw, wait_until,
};

const DEADLINE: Duration = Duration::from_secs(10);

/// The error body of a call the peer's chokepoint denied.
fn denied(result: Result<impl std::fmt::Debug, CallError>) -> ErrorBody {
    match result {
        Err(CallError::Denied(body)) => body,
        other => panic!("expected a denial, got {other:?}"),
    }
}

/// The error body of a call the peer answered with an error.
fn remote(result: Result<impl std::fmt::Debug, CallError>) -> ErrorBody {
    match result {
        Err(CallError::Remote(body)) => body,
        other => panic!("expected a remote error, got {other:?}"),
    }
}

fn bind_failure(result: Result<BindReply, CallError>) -> BindFailure {
    let body = denied(result);
    assert_eq!(body.code, ErrorCode::BindFailed);
    body.detail
        .expect("a bind failure carries its reason")
        .decode()
        .unwrap()
}

async fn bind(peer: &Peer, code: &str) -> Result<BindReply, CallError> {
    peer.request(MonitoringBind, BindArgs { code: code.into() })
        .await
}

/// A code that is well formed but not `code`.
fn wrong_code(code: &str) -> String {
    if code == "2222222222" {
        "3333333333".into()
    } else {
        "2222222222".into()
    }
}

#[tokio::test]
async fn an_unknown_verb_is_denied_and_no_handler_runs() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    for (cap, verb) in [
        ("app.echo", "shout"),
        ("app.nope", "say"),
        ("core.nope", "bind"),
    ] {
        let body = denied(peer.call_raw(cap, verb, &raw("x"), DEADLINE).await);
        assert_eq!(body.code, ErrorCode::UnknownVerb, "{cap}/{verb}");
    }
    assert_eq!(Counters::get(&counters.say), 0);
    assert_eq!(server.metrics().unknown(), 3);
    let sizes = server.ledger_sizes();
    assert_eq!(
        (sizes.running, sizes.remembered, sizes.forgotten),
        (0, 0, 0),
        "denied requests leave no trace in the ledger"
    );
}

#[tokio::test]
async fn look_alike_names_are_denied_as_unknown_through_the_wire() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let names: &[(&str, &str)] = &[
        ("app.echo", "Say"),
        ("app.echo", "SAY"),
        ("app.echo", " say"),
        ("app.echo", "say "),
        ("app.echo", "sa\0y"),
        ("app.echo", "say\0"),
        ("app.echo", ""),
        ("app.echo", "s\u{0430}y"),  // Cyrillic a
        ("app.echo", "\u{ff53}ay"),  // fullwidth s
        ("app.echo", "say\u{200b}"), // zero-width space
        ("app.echo", "../say"),
        ("app.echo", "x/../say"),
        ("app.echo", "say/"),
        ("app.echo/../x", "say"),
        ("app.echo/", "say"),
        ("app.echo/say", ""),
        ("App.echo", "say"),
        ("app.echo ", "say"),
        (" app.echo", "say"),
        ("\u{0430}pp.echo", "say"), // Cyrillic a
        ("app.ech\u{043e}", "say"), // Cyrillic o
        ("", "say"),
        ("", ""),
        ("app", "echo"),
        ("app.echo.say", "say"),
        ("core.monitoring", "Disable"),
        ("core.monitoring", "Bind"),
        ("core.monitoring", "disable "),
        ("core.monitoring", "bind\0"),
        ("Core.monitoring", "bind"),
        ("core.monitoring.", "bind"),
    ];
    for (cap, verb) in names {
        let body = denied(peer.call_raw(cap, verb, &raw("hi"), DEADLINE).await);
        assert_eq!(body.code, ErrorCode::UnknownVerb, "{cap:?}/{verb:?}");
    }
    assert_eq!(Counters::get(&counters.say), 0);
    assert_eq!(Counters::get(&counters.admin), 0);
    assert_eq!(server.controller(), None);
    assert_eq!(server.manifest().monitoring, MonitoringStatus::Off);
    assert_eq!(server.metrics().unknown(), names.len() as u64);
    // Nothing above hurt the session: the exact name still works.
    assert_eq!(
        peer.request(Say, "exact".into()).await.unwrap(),
        "echo: exact"
    );
}

#[tokio::test]
async fn a_controller_verb_from_a_non_controller_is_unauthorized() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let body = denied(peer.request(Admin, "x".into()).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let body = denied(peer.request(MonitoringDisable, NoArgs {}).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(Counters::get(&counters.admin), 0);

    // A node that has a pending bind is not bound yet either.
    let _invite = server.invite(None).unwrap();
    let body = denied(peer.request(Admin, "x".into()).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(Counters::get(&counters.admin), 0);
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "admin", Outcome::Unauthorized),
        2
    );
}

#[tokio::test]
async fn the_bound_control_plane_may_call_controller_verbs_until_it_disables() {
    let (server, counters) = echo_node(Limits::default()).await;
    let control = client_node().await;
    let other = client_node().await;
    let cp = connect_tcp(&control, &server).await;
    let stranger = connect_tcp(&other, &server).await;

    let invite = server.invite(None).unwrap();
    assert_eq!(invite.node_id, server.id());
    let reply = bind(&cp, invite.code.as_deref().unwrap()).await.unwrap();
    assert_eq!(reply.manifest.node_id, server.id());
    assert_eq!(reply.manifest.monitoring, MonitoringStatus::On);
    assert_eq!(server.controller(), Some(control.id()));

    let answer = cp.request(Admin, "status".into()).await.unwrap();
    assert_eq!(answer, format!("status for {}", control.id()));
    assert_eq!(Counters::get(&counters.admin), 1);
    let body = denied(stranger.request(Admin, "status".into()).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    // The code is spent: nobody else can bind with it.
    assert_eq!(
        bind_failure(bind(&stranger, invite.code.as_deref().unwrap()).await),
        BindFailure::NoPending
    );

    cp.request(MonitoringDisable, NoArgs {}).await.unwrap();
    assert_eq!(server.controller(), None);
    let body = denied(cp.request(Admin, "again".into()).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(Counters::get(&counters.admin), 1);
}

#[tokio::test]
async fn a_local_unbind_revokes_the_former_controller() {
    let (server, counters) = echo_node(Limits::default()).await;
    let control = client_node().await;
    let cp = connect_tcp(&control, &server).await;
    let invite = server.invite(Some(control.id())).unwrap();
    // Untyped, as a tool without the Rust types would bind.
    let reply = cp
        .call_raw(
            "core.monitoring",
            "bind",
            &raw(&BindArgs {
                code: invite.code.clone().unwrap(),
            }),
            DEADLINE,
        )
        .await
        .unwrap();
    let reply: BindReply = reply.decode().unwrap();
    assert_eq!(reply.manifest.monitoring, MonitoringStatus::On);
    assert_eq!(
        cp.request(Admin, "a".into()).await.unwrap(),
        format!("a for {}", control.id())
    );

    assert_eq!(server.unbind().await.unwrap(), Some(control.id()));
    let body = denied(cp.request(Admin, "b".into()).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(Counters::get(&counters.admin), 1);
}

#[tokio::test]
async fn bind_failures_reach_the_caller_with_their_reason() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let control = client_node().await;
    let cp = connect_tcp(&control, &server).await;

    assert_eq!(
        bind_failure(bind(&cp, "2222222222").await),
        BindFailure::NoPending
    );

    let invite = server.invite(None).unwrap();
    let wrong = wrong_code(invite.code.as_deref().unwrap());
    assert_eq!(
        bind_failure(bind(&cp, &wrong).await),
        BindFailure::WrongCode { attempts_left: 2 }
    );
    assert_eq!(
        bind_failure(bind(&cp, &wrong).await),
        BindFailure::WrongCode { attempts_left: 1 }
    );
    assert_eq!(
        bind_failure(bind(&cp, &wrong).await),
        BindFailure::TooManyAttempts
    );
    // The pending bind is gone: even the right code fails now.
    assert_eq!(
        bind_failure(bind(&cp, invite.code.as_deref().unwrap()).await),
        BindFailure::NoPending
    );
    assert_eq!(server.controller(), None);

    // A bind reserved for another key: no attempt is used.
    let other = client_node().await;
    let invite = server.invite(Some(other.id())).unwrap();
    for _ in 0..4 {
        assert_eq!(
            bind_failure(bind(&cp, invite.code.as_deref().unwrap()).await),
            BindFailure::WrongSender
        );
    }
    let op = connect_tcp(&other, &server).await;
    bind(&op, invite.code.as_deref().unwrap()).await.unwrap();
    assert_eq!(server.controller(), Some(other.id()));
}

#[tokio::test]
async fn two_control_planes_binding_at_once_exactly_one_wins() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let (a, b) = (client_node().await, client_node().await);
    let (pa, pb) = (
        connect_tcp(&a, &server).await,
        connect_tcp(&b, &server).await,
    );
    let invite = server.invite(None).unwrap();
    let (ra, rb) = tokio::join!(
        bind(&pa, invite.code.as_deref().unwrap()),
        bind(&pb, invite.code.as_deref().unwrap())
    );
    let winner = match (ra, rb) {
        (Ok(_), Err(e)) => {
            assert_eq!(bind_failure(Err(e)), BindFailure::NoPending);
            a.id()
        }
        (Err(e), Ok(_)) => {
            assert_eq!(bind_failure(Err(e)), BindFailure::NoPending);
            b.id()
        }
        other => panic!("exactly one bind must win: {other:?}"),
    };
    assert_eq!(server.controller(), Some(winner));
}

#[tokio::test]
async fn malformed_args_are_denied_before_they_are_decoded() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let garbage = [
        raw(&12345u32),
        raw(&[1u8, 2, 3]),
        raw(&()),
        raw(&(true, "x", -1i64)),
    ];
    for args in &garbage {
        // Unknown verbs: unknown_verb, whatever the args.
        let body = denied(peer.call_raw("app.echo", "nope", args, DEADLINE).await);
        assert_eq!(body.code, ErrorCode::UnknownVerb);
        let body = denied(peer.call_raw("app.echo", "Say", args, DEADLINE).await);
        assert_eq!(body.code, ErrorCode::UnknownVerb);
        // Controller verbs from a non-controller: unauthorized, not bad_args.
        let body = denied(peer.call_raw("app.echo", "admin", args, DEADLINE).await);
        assert_eq!(body.code, ErrorCode::Unauthorized);
        let body = denied(
            peer.call_raw("core.monitoring", "disable", args, DEADLINE)
                .await,
        );
        assert_eq!(body.code, ErrorCode::Unauthorized);
    }
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "admin", Outcome::BadArgs),
        0
    );
    assert_eq!(Counters::get(&counters.admin), 0);
}

#[tokio::test]
async fn malformed_args_to_an_allowed_verb_are_bad_args() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let body = remote(
        peer.call_raw("app.echo", "say", &raw(&12345u32), DEADLINE)
            .await,
    );
    assert_eq!(body.code, ErrorCode::BadArgs);
    let body = remote(
        peer.call_raw("app.echo", "say", &raw(&["a", "b"]), DEADLINE)
            .await,
    );
    assert_eq!(body.code, ErrorCode::BadArgs);
    // The bind ceremony is bootstrap: its args are decoded, strictly.
    let _invite = server.invite(None).unwrap();
    let body = remote(
        peer.call_raw("core.monitoring", "bind", &raw(&("code", 1)), DEADLINE)
            .await,
    );
    assert_eq!(body.code, ErrorCode::BadArgs);
    assert_eq!(Counters::get(&counters.say), 0);
    assert_eq!(
        server.metrics().count("app.echo", "say", Outcome::BadArgs),
        2
    );
    assert_eq!(server.controller(), None);
    assert_eq!(
        peer.request(Say, "fine".into()).await.unwrap(),
        "echo: fine"
    );
}

#[tokio::test]
async fn a_handler_panic_is_answered_internal_and_the_node_keeps_serving() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    for _ in 0..3 {
        let body = remote(peer.request(Boom, "boom".into()).await);
        assert_eq!(body.code, ErrorCode::Internal);
        assert_eq!(peer.request(Boom, "calm".into()).await.unwrap(), "calm");
    }
    // A handler's own error code reaches the caller as it is.
    let body = remote(peer.request(Boom, "refuse".into()).await);
    assert_eq!(body.code.as_str(), "refused");
    assert!(body.code.is_app());
    assert_eq!(body.message, "not today");
    assert_eq!(Counters::get(&counters.boom), 7);
    assert_eq!(
        peer.request(Say, "alive".into()).await.unwrap(),
        "echo: alive"
    );
    // Another peer is served too.
    let other = client_node().await;
    let second = connect_tcp(&other, &server).await;
    assert_eq!(
        second.request(Say, "me too".into()).await.unwrap(),
        "echo: me too"
    );
    assert_eq!(server.ledger_sizes().running, 0);
}

#[tokio::test]
async fn metrics_count_each_outcome_per_cap_and_verb() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;

    peer.request(Say, "1".into()).await.unwrap();
    peer.request(Say, "2".into()).await.unwrap();
    denied(
        peer.call_raw("app.echo", "shout", &raw("x"), DEADLINE)
            .await,
    );
    denied(peer.call_raw("app.other", "say", &raw("x"), DEADLINE).await);
    denied(peer.request(Admin, "x".into()).await);
    remote(peer.call_raw("app.echo", "say", &raw(&1u8), DEADLINE).await);
    remote(peer.request(Boom, "boom".into()).await);

    let mut raw_peer = RawPeer::connect(&server).await;
    raw_peer.control("app.echo", "say", "m1", &raw("3")).await;
    let first = raw_peer.response("m1").await;
    raw_peer.control("app.echo", "say", "m1", &raw("3")).await;
    assert_eq!(raw_peer.response("m1").await, first);

    let m = server.metrics();
    assert_eq!(m.count("app.echo", "say", Outcome::Ok), 3);
    assert_eq!(m.count("app.echo", "say", Outcome::BadArgs), 1);
    assert_eq!(m.count("app.echo", "say", Outcome::Replayed), 1);
    assert_eq!(m.count("app.echo", "admin", Outcome::Unauthorized), 1);
    assert_eq!(m.count("app.echo", "admin", Outcome::Ok), 0);
    assert_eq!(m.count("app.echo", "boom", Outcome::Failed), 1);
    assert_eq!(m.unknown(), 2);
    let total: u64 = m.rows.iter().map(|r| r.count).sum();
    assert_eq!(total, 9, "nothing else was counted: {:?}", m.rows);
    // Invented names share one counter and cannot grow the table.
    assert!(m.rows.iter().all(|r| r.cap.as_deref() != Some("app.other")));
}

#[tokio::test]
async fn a_version_requirement_is_checked_before_anything_is_sent() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;

    for unsatisfied in [
        "app.echo@^2",
        "app.echo@<1.4",
        "app.echo@=1.4.1",
        "app.missing",
    ] {
        let result = peer.require(&unsatisfied.parse().unwrap());
        assert!(
            matches!(result, Err(CallError::VersionUnsatisfied(_))),
            "{unsatisfied}: {result:?}"
        );
    }
    for satisfied in [
        "app.echo@^1",
        "app.echo@~1.4",
        "app.echo@>=1.2, <2",
        "app.echo",
    ] {
        let cap = peer.require(&satisfied.parse().unwrap()).unwrap();
        assert_eq!(cap.version.to_string(), "1.4.2", "{satisfied}");
    }
    assert!(peer.require(&"core.monitoring@^1".parse().unwrap()).is_ok());
    assert!(server.metrics().rows.is_empty(), "nothing was dispatched");
    assert_eq!(Counters::get(&counters.say), 0);
}

#[tokio::test]
async fn manifest_changes_are_pushed_to_connected_peers() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let mut raw_peer = RawPeer::connect(&server).await;

    let before = peer.manifest().unwrap();
    assert_eq!(before.monitoring, MonitoringStatus::Off);
    assert_eq!(*before, server.manifest());

    let invite = server.invite(None).unwrap();
    wait_until("the client sees the pending bind", || {
        let m = peer.manifest().unwrap();
        m.epoch > before.epoch && m.monitoring == MonitoringStatus::Pending
    })
    .await;
    let pending_epoch = peer.manifest().unwrap().epoch;

    bind(&peer, invite.code.as_deref().unwrap()).await.unwrap();
    wait_until("the client sees the binding", || {
        let m = peer.manifest().unwrap();
        m.epoch > pending_epoch && m.monitoring == MonitoringStatus::On
    })
    .await;
    assert_eq!(*peer.manifest().unwrap(), server.manifest());

    server.unbind().await.unwrap();
    wait_until("the client sees the unbinding", || {
        peer.manifest().unwrap().monitoring == MonitoringStatus::Off
    })
    .await;

    // On the wire: each change arrived as a hello frame with the new
    // manifest, in epoch order.
    let mut epochs = Vec::new();
    while let Some(frame) = raw_peer.next_frame(Duration::from_millis(500)).await {
        if let Frame::Hello(h) = frame {
            let m: capwire::manifest::Manifest = h.manifest.decode().unwrap();
            epochs.push((m.epoch, m.monitoring));
            if m.monitoring == MonitoringStatus::Off {
                break;
            }
        }
    }
    assert_eq!(epochs.len(), 3, "{epochs:?}");
    assert!(epochs.windows(2).all(|w| w[0].0 < w[1].0), "{epochs:?}");
    assert_eq!(
        epochs.iter().map(|e| e.1).collect::<Vec<_>>(),
        [
            MonitoringStatus::Pending,
            MonitoringStatus::On,
            MonitoringStatus::Off
        ]
    );
}

#[tokio::test]
async fn an_authorizer_that_fails_denies_controller_verbs() {
    struct Broken;
    impl capwire::authz::Authorizer for Broken {
        fn authorize(
            &self,
            _sender: &capwire::NodeId,
            _cap: &str,
            _verb: &str,
            _binding: &capwire::authz::Binding,
        ) -> Result<bool, capwire::authz::AuthzError> {
            panic!("the authorizer broke")
        }
    }
    let counters = common::Shared::default();
    let server = Node::builder("strict")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(common::echo_cap())
        .state(counters.clone())
        .authorizer(std::sync::Arc::new(Broken))
        .start()
        .await
        .unwrap();
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let invite = server.invite(None).unwrap();
    bind(&peer, invite.code.as_deref().unwrap()).await.unwrap();
    assert_eq!(server.controller(), Some(client.id()));
    // Even the bound control plane is denied when the authorizer fails.
    let body = denied(peer.request(Admin, "x".into()).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(Counters::get(&counters.admin), 0);
    // Bootstrap verbs do not consult it.
    assert_eq!(peer.request(Say, "ok".into()).await.unwrap(), "echo: ok");
}

#[tokio::test]
async fn a_pending_bind_cleared_by_wrong_codes_is_pushed_as_a_new_epoch() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let invite = server.invite(None).unwrap();
    wait_until("the client sees the pending bind", || {
        peer.manifest().unwrap().monitoring == MonitoringStatus::Pending
    })
    .await;
    let pending = server.manifest();
    assert_eq!(pending.monitoring, MonitoringStatus::Pending);

    let wrong = wrong_code(invite.code.as_deref().unwrap());
    for _ in 0..3 {
        bind_failure(bind(&peer, &wrong).await);
    }
    let cleared = server.manifest();
    assert_eq!(cleared.monitoring, MonitoringStatus::Off);
    assert!(
        cleared.epoch > pending.epoch,
        "every change bumps the epoch"
    );
    wait_until("the client sees the pending bind cleared", || {
        *peer.manifest().unwrap() == server.manifest()
    })
    .await;
}

#[tokio::test]
async fn a_controller_request_queued_behind_an_unbind_is_unauthorized() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut cp = RawPeer::connect(&server).await;
    let invite = server.invite(None).unwrap();
    cp.control(
        "core.monitoring",
        "bind",
        "bind",
        &raw(&BindArgs {
            code: invite.code.clone().unwrap(),
        }),
    )
    .await;
    assert!(cp.response("bind").await.outcome.is_ok());
    cp.control("app.echo", "admin", "a0", &raw("before")).await;
    assert!(cp.response("a0").await.outcome.is_ok());

    // Back to back: the unbind first, then a controller request that may
    // already have passed the gate when the unbind takes effect.
    cp.control("core.monitoring", "disable", "d", &raw(&NoArgs {}))
        .await;
    cp.control("app.echo", "admin", "a1", &raw("after")).await;
    assert!(cp.response("d").await.outcome.is_ok());
    let late = cp.response("a1").await;
    assert_eq!(late.outcome.unwrap_err().code, ErrorCode::Unauthorized);
    assert_eq!(Counters::get(&counters.admin), 1);
    assert_eq!(server.controller(), None);
}

#[tokio::test(start_paused = true)]
async fn a_bind_after_the_code_expired_is_refused_expired_then_no_pending() {
    let (server, _counters) = common::echo_node_unlistening(Limits::default()).await;
    let control = client_node().await;
    let cp = common::connect_memory(&control, &server).await;
    let invite = server.invite(None).unwrap();
    let code = invite.code.clone().unwrap();
    // Past the 300 s, in steps the session's keepalives keep up with.
    for _ in 0..31 {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    assert_eq!(server.manifest().monitoring, MonitoringStatus::Off);
    assert_eq!(bind_failure(bind(&cp, &code).await), BindFailure::Expired);
    assert_eq!(bind_failure(bind(&cp, &code).await), BindFailure::NoPending);
    assert_eq!(server.controller(), None);
}
