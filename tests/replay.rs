//! Replay safety across senders and verbs: a handler never runs twice for
//! the same (sender, req_id), one sender cannot evict another's entries,
//! and a remembered answer is never returned for another verb.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use capwire::envelope::{ErrorCode, Frame};
use capwire::{Keypair, Limits};
use common::{Counters, RawPeer, echo_node, raw};

#[tokio::test]
async fn a_flood_from_one_sender_does_not_make_another_senders_handler_run_twice() {
    let limits = Limits {
        replay_sender_max_bytes: 64 * 1024,
        ..Limits::default()
    };
    let (server, counters) = echo_node(limits).await;
    let mut victim = RawPeer::connect(&server).await;
    victim.control("app.echo", "say", "v-1", &raw("once")).await;
    let first = victim.response("v-1").await;
    assert_eq!(Counters::get(&counters.say), 1);

    // A cheap request answered at once (`no_pending`), with ids that are
    // not counters, until the flooder is over its quota.
    let mut flooder = RawPeer::connect(&server).await;
    let mut overloaded = 0;
    for batch in 0..20 {
        for i in 0..200 {
            let id = format!("f-{batch}-{i}");
            flooder
                .control(
                    "core.monitoring",
                    "bind",
                    &id,
                    &raw(&serde_json::json!({"code": "x"})),
                )
                .await;
        }
        for i in 0..200 {
            let r = flooder.response(&format!("f-{batch}-{i}")).await;
            if let Err(e) = &r.outcome
                && e.code == ErrorCode::Overloaded
            {
                overloaded += 1;
            }
        }
    }
    assert!(overloaded > 0, "the flooder went over its own quota");

    victim.control("app.echo", "say", "v-1", &raw("once")).await;
    let again = victim.response("v-1").await;
    assert_eq!(
        again, first,
        "the victim's answer is remembered, byte for byte"
    );
    assert_eq!(
        Counters::get(&counters.say),
        1,
        "and its handler did not run again"
    );
}

#[tokio::test]
async fn a_req_id_answered_for_a_controller_verb_is_never_answered_for_another() {
    let (server, counters) = echo_node(Limits::default()).await;
    let invite = server.invite(None).unwrap();
    let mut peer = RawPeer::connect(&server).await;
    peer.control(
        "core.monitoring",
        "bind",
        "b-1",
        &raw(&serde_json::json!({"code": invite.code})),
    )
    .await;
    assert!(peer.response("b-1").await.outcome.is_ok());
    peer.control("app.echo", "admin", "c-1", &raw("secret"))
        .await;
    let admin = peer.response("c-1").await;
    assert!(admin.outcome.is_ok());
    assert_eq!(Counters::get(&counters.admin), 1);

    peer.control(
        "core.monitoring",
        "disable",
        "d-1",
        &raw(&serde_json::json!({})),
    )
    .await;
    assert!(peer.response("d-1").await.outcome.is_ok());

    // The former controller reuses the req_id on a bootstrap verb.
    peer.control("app.echo", "say", "c-1", &raw("hello")).await;
    let reused = peer.response("c-1").await;
    assert_ne!(reused, admin, "never the controller verb's result");
    assert_eq!(reused.outcome.unwrap_err().code, ErrorCode::Duplicate);
    assert_eq!(Counters::get(&counters.say), 0);
    // And on the controller verb itself it is not authorized any more.
    peer.control("app.echo", "admin", "c-1", &raw("secret"))
        .await;
    assert_eq!(
        peer.response("c-1").await.outcome.unwrap_err().code,
        ErrorCode::Unauthorized
    );
    assert_eq!(Counters::get(&counters.admin), 1);
}

#[tokio::test]
async fn the_same_req_id_on_another_verb_is_a_duplicate_for_any_sender() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut peer = RawPeer::connect_as(&server, Keypair::generate().unwrap()).await;
    peer.control("app.echo", "say", "7", &raw("a")).await;
    let said = peer.response("7").await;
    peer.control("app.echo", "repeat", "7", &raw(&3u32)).await;
    let other = peer.response("7").await;
    assert_eq!(other.outcome.unwrap_err().code, ErrorCode::Duplicate);
    assert!(said.outcome.is_ok());
    assert_eq!(Counters::get(&counters.say), 1);
    assert!(
        peer.received
            .iter()
            .all(|f| matches!(f, Frame::Response(_))),
        "the session stays up"
    );
}
