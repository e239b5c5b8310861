//! A request answered with an error changes nothing, and what is sent to a
//! control plane is sent only while it is bound: a configuration that a
//! bind's answer could not carry is refused before it is written; a bind
//! whose answer would not reach the control plane is refused before it is
//! made (the code still works); a monitoring copy or roster push that
//! waited for the control plane's session is not sent once it was unbound
//! in the meantime.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/core.rs"]
mod core_helpers;

use std::sync::atomic::Ordering;
use std::time::Duration;

use capwire::envelope::{ErrorCode, RawValue};
use capwire::manifest::{
    ClusterCreate, ConfigValue, CreateArgs, GetConfig, MonitoringDisable, MonitoringStatusRead,
    NoArgs, SetConfig, SetConfigArgs,
};
use capwire::{CallError, ControlEvent, Keypair, Node, NodeError, TransportConfig};
use core_helpers::{
    CALL, GatedHost, Ping, bind_new, denied, listening, mon_node, remote, stranger,
};

/// A CBOR value nested `depth` levels deep: arrays around an empty array.
fn nested(depth: usize) -> RawValue {
    let mut bytes = vec![0x81; depth - 1];
    bytes.push(0x80);
    RawValue::from_slice(&bytes).unwrap()
}

async fn set_config(peer: &capwire::Peer, value: RawValue) -> Result<u64, CallError> {
    peer.request_within(
        SetConfig,
        SetConfigArgs {
            value,
            if_version: None,
        },
        CALL,
    )
    .await
    .map(|r| r.version)
}

#[tokio::test]
async fn a_configuration_a_bind_answer_could_not_carry_is_refused_before_it_is_written() {
    let b = bind_new(listening("node")).await;
    // 31 levels are valid args (the args map is the 32nd), but the bind's
    // answer carries the configuration two levels down.
    let body = remote(set_config(&b.peer, nested(31)).await);
    assert_eq!(body.code, ErrorCode::BadArgs, "{body:?}");
    let big = RawValue::encode(&"x".repeat(64 * 1024)).unwrap();
    assert!(matches!(
        set_config(&b.peer, big).await,
        Err(CallError::TooLarge)
    ));
    assert_eq!(b.node.config().version, 0, "nothing was written");

    // The deepest and the largest configurations that are kept: every
    // answer that carries them can be sent.
    assert_eq!(set_config(&b.peer, nested(30)).await.unwrap(), 1);
    let largest = RawValue::encode(&"y".repeat(63 * 1024 - 3)).unwrap();
    assert_eq!(largest.as_bytes().len(), 63 * 1024);
    assert_eq!(set_config(&b.peer, largest.clone()).await.unwrap(), 2);
    let got: ConfigValue = b
        .peer
        .request_within(GetConfig, NoArgs {}, CALL)
        .await
        .unwrap();
    assert_eq!(got.value, largest);
    set_config(&b.peer, nested(30)).await.unwrap();

    // A new control plane binds and gets the configuration in its answer.
    b.peer
        .request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    let cp = Node::builder("cp2").start().await.unwrap();
    let (peer, reply) = cp
        .connect_invite(&b.node.invite(None).unwrap())
        .await
        .unwrap();
    let config: ConfigValue = reply.unwrap().config.decode().unwrap();
    assert_eq!((config.value, config.version), (nested(30), 3));
    assert!(
        peer.request_within(MonitoringStatusRead, NoArgs {}, CALL)
            .await
            .unwrap()
            .you_are_controller
    );
    cp.shutdown().await;
    b.node.shutdown().await;
}

#[tokio::test]
async fn a_bind_whose_answer_would_not_reach_the_control_plane_is_not_made() {
    let b = bind_new(listening("node")).await;
    // The largest configuration kept: with the manifest, the bind's answer
    // is larger than the smallest max_record a peer may announce.
    let value = RawValue::encode(&"z".repeat(63 * 1024 - 3)).unwrap();
    set_config(&b.peer, value).await.unwrap();
    b.peer
        .request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    let invite = b.node.invite(None).unwrap();

    let mut config = TransportConfig::default();
    config.max_record_size = 65536;
    let small = Node::builder("small-cp")
        .transport_config(config)
        .start()
        .await
        .unwrap();
    let err = small.connect_invite(&invite).await.unwrap_err();
    assert!(
        matches!(err, NodeError::Bind(CallError::TooLarge)),
        "expected too_large, got {err:?}"
    );
    // Nothing changed: not bound, and the code is not used up.
    assert_eq!(b.node.controller(), None);
    let peer = small
        .connect(&b.node.local_addrs()[0], Some(b.node.id()))
        .await
        .unwrap();
    let status = peer
        .request_within(MonitoringStatusRead, NoArgs {}, CALL)
        .await
        .unwrap();
    assert!(!status.you_are_controller);
    assert_eq!(
        status.monitoring,
        capwire::manifest::MonitoringStatus::Pending,
        "the bind is still open"
    );
    let body = denied(peer.request_within(GetConfig, NoArgs {}, CALL).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);

    // A control plane that takes the answer binds with the same code.
    let cp = Node::builder("cp").start().await.unwrap();
    let (_, reply) = cp.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some());
    assert_eq!(b.node.controller(), Some(cp.id()));
    small.shutdown().await;
    cp.shutdown().await;
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_waiting_for_the_control_plane_is_not_sent_once_it_was_unbound() {
    let (builder, _log) = mon_node("node");
    let node = builder.start().await.unwrap();
    let key = Keypair::generate().unwrap();
    let cp = Node::builder("cp")
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    cp.connect_invite(&node.invite(Some(cp.id())).unwrap())
        .await
        .unwrap();
    // The control plane goes away; a copy is taken and waits for it.
    cp.shutdown().await;
    drop(cp);
    common::wait_until("the node sees the control plane gone", || {
        node.connected_peers().is_empty()
    })
    .await;
    let (other, peer) = stranger(&node).await;
    peer.request_within(Ping, "while away".into(), CALL)
        .await
        .unwrap();
    // Unbound while the copy waits; the former control plane comes back.
    node.unbind().await.unwrap();
    let back = Node::builder("cp").keypair(key).start().await.unwrap();
    let mut events = back.control_events();
    back.connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    common::wait_until("the copy is given up", || {
        let s = node.stats();
        s.copies_sent + s.copies_dropped >= 1
    })
    .await;
    let stats = node.stats();
    assert_eq!((stats.copies_sent, stats.copies_dropped), (0, 1));
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(event, ControlEvent::Copy { .. }),
            "a former control plane got a copy: {event:?}"
        );
    }
    other.shutdown().await;
    back.shutdown().await;
    node.shutdown().await;
}

/// A roster push waits for the control plane's session whoever dials, as
/// a copy does (WIRE.md 5.3), and under the same rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roster_push_waiting_for_the_control_plane_is_not_sent_once_it_was_unbound() {
    let host = GatedHost::new("late");
    let (release, entered) = (host.release.clone(), host.entered.clone());
    let node = listening("parent").host(host).start().await.unwrap();
    let key = Keypair::generate().unwrap();
    let cp = Node::builder("cp")
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    let (peer, _) = cp
        .connect_invite(&node.invite(Some(cp.id())).unwrap())
        .await
        .unwrap();
    // A create the host holds; the control plane goes away meanwhile.
    let create = tokio::spawn(async move {
        peer.request_within(
            ClusterCreate,
            CreateArgs {
                name: "late".into(),
                bio: None,
            },
            CALL,
        )
        .await
    });
    common::wait_until("the host holds the create", || {
        entered.load(Ordering::SeqCst) == 1
    })
    .await;
    cp.shutdown().await;
    drop(cp);
    let _ = create.await;
    common::wait_until("the node sees the control plane gone", || {
        node.connected_peers().is_empty()
    })
    .await;
    // The child starts: its roster change waits for the control plane.
    let version = node.roster().version;
    release.add_permits(1);
    common::wait_until("the child runs", || node.roster().version > version).await;
    node.unbind().await.unwrap();
    let back = Node::builder("cp").keypair(key).start().await.unwrap();
    let mut events = back.control_events();
    back.connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    // Long enough for a push that waited to arrive (it waits up to 5 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(event, ControlEvent::Roster { .. }),
            "a former control plane got a roster: {event:?}"
        );
    }
    back.shutdown().await;
    node.shutdown().await;
}

#[tokio::test]
async fn a_frame_with_args_nested_as_deep_as_frames_allow_is_copied_truncated() {
    let (builder, _log) = mon_node("node");
    let b = bind_new(builder).await;
    let mut rx = b.cp.control_events();
    let (other, peer) = stranger(&b.node).await;
    // 32 levels: a legal frame (its args fail Ping's type: bad_args), whose
    // body the copy record, one level down, could not embed.
    let deep = nested(32);
    let refused = peer
        .call_raw("app.mon", "ping", &deep, CALL)
        .await
        .unwrap_err();
    assert_eq!(remote(Err::<(), _>(refused)).code, ErrorCode::BadArgs);
    peer.request_within(Ping, "after".into(), CALL)
        .await
        .unwrap();
    let events = core_helpers::events_until(&mut rx, "two copies", {
        let mut n = 0;
        move |e| {
            n += usize::from(matches!(e, ControlEvent::Copy { .. }));
            n == 2
        }
    })
    .await;
    let got = core_helpers::copies(&events);
    let (first, second) = (&got[0].1, &got[1].1);
    assert_eq!((first.seq, first.dropped), (1, 0), "sent, not dropped");
    assert!(first.truncated);
    assert!(first.body.is_null());
    assert_eq!(first.body_len, deep.as_bytes().len() as u64);
    assert_eq!(
        (second.seq, second.dropped, second.truncated),
        (2, 0, false)
    );
    other.shutdown().await;
    b.node.shutdown().await;
}
