//! The core capabilities over real sessions: `core.configuration`,
//! `core.connect`, `core.cluster` (with the in-process host), the roster
//! pushes and monitoring copies a control plane receives, `core.monitoring`
//! status, and the bind ceremony through the public API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/core.rs"]
mod core_helpers;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use capwire::authz::BindFailure;
use capwire::envelope::{ErrorCode, NodeId, RawValue};
use capwire::manifest::{
    BindArgs, ChildArgs, ChildStatus, ClusterContact, ClusterCreate, ClusterIntroduce, ClusterList,
    ClusterRemove, ClusterSetBio, ClusterSetMonitoring, ClusterSetPersona, ConfigValue,
    ConnectIntroduce, CopyDirection, CopyRecord, CreateArgs, GetConfig, IntroduceArgs,
    IntroducePairArgs, Member, MonitoringDisable, MonitoringStatus, MonitoringStatusRead, NoArgs,
    Roster, SetBioArgs, SetConfig, SetConfigArgs, SetConfigReply, SetMonitoringArgs,
    SetPersonaArgs,
};
use capwire::{CallError, ControlEvent, Invite, Keypair, Limits, Node, NodeError, Peer};
use common::{RawPeer, raw, tcp_addr, wait_until};
use core_helpers::{
    Bound, CALL, GatedHost, KidPeers, Ping, SOON, Tick, bind_new, copies, denied, events_until,
    eventually, kid_host, listening, mon_node, reach_child, remote, rosters, stranger,
};

// ---------------------------------------------------------------------
// Small call wrappers

async fn get_config(peer: &Peer) -> ConfigValue {
    peer.request_within(GetConfig, NoArgs {}, CALL)
        .await
        .unwrap()
}

async fn set_config(
    peer: &Peer,
    value: RawValue,
    if_version: Option<u64>,
) -> Result<SetConfigReply, CallError> {
    peer.request_within(SetConfig, SetConfigArgs { value, if_version }, CALL)
        .await
}

async fn list(peer: &Peer) -> Roster {
    peer.request_within(ClusterList, NoArgs {}, CALL)
        .await
        .unwrap()
}

async fn create(peer: &Peer, name: &str, bio: Option<&str>) -> Result<Member, CallError> {
    peer.request_within(
        ClusterCreate,
        CreateArgs {
            name: name.into(),
            bio: bio.map(Into::into),
        },
        CALL,
    )
    .await
}

async fn set_monitoring(peer: &Peer, cid: &str, enabled: bool) -> Result<Member, CallError> {
    peer.request_within(
        ClusterSetMonitoring,
        SetMonitoringArgs {
            cid: cid.into(),
            enabled,
        },
        CALL,
    )
    .await
}

async fn contact(peer: &Peer, cid: &str) -> Result<Invite, CallError> {
    let reply = peer
        .request_within(ClusterContact, ChildArgs { cid: cid.into() }, CALL)
        .await?;
    Ok(reply.invite.parse().expect("contact gives an invite text"))
}

async fn remove(peer: &Peer, cid: &str) -> Result<(), CallError> {
    peer.request_within(ClusterRemove, ChildArgs { cid: cid.into() }, CALL)
        .await
}

async fn introduce_pair(peer: &Peer, a: &str, b: &str) -> Result<(), CallError> {
    peer.request_within(
        ClusterIntroduce,
        IntroducePairArgs {
            peer_a: a.into(),
            peer_b: b.into(),
        },
        CALL,
    )
    .await
}

async fn status(peer: &Peer) -> capwire::manifest::MonitoringStatusReply {
    peer.request_within(MonitoringStatusRead, NoArgs {}, CALL)
        .await
        .unwrap()
}

fn member<'a>(roster: &'a Roster, cid: &str) -> Option<&'a Member> {
    roster.members.iter().find(|m| m.cid == cid)
}

fn bind_failure(err: NodeError) -> BindFailure {
    match err {
        NodeError::Bind(CallError::Denied(body)) => {
            assert_eq!(body.code, ErrorCode::BindFailed);
            body.detail
                .expect("a bind failure says why")
                .decode()
                .unwrap()
        }
        other => panic!("expected a bind failure, got {other:?}"),
    }
}

// ---------------------------------------------------------------------
// core.configuration

#[tokio::test]
async fn set_config_is_read_back_and_each_change_reaches_watch_config() {
    let b = bind_new(listening("node")).await;
    let mut watch = b.node.watch_config();

    let unset = get_config(&b.peer).await;
    assert_eq!(unset.version, 0);
    assert!(unset.value.is_null(), "an unset configuration is null");
    assert_eq!(watch.current(), unset);
    assert_eq!(b.node.config(), unset);

    let first = raw(&("mode", "fast"));
    let reply = set_config(&b.peer, first.clone(), None).await.unwrap();
    assert_eq!(reply.version, 1);
    let want = ConfigValue {
        value: first,
        version: 1,
    };
    assert_eq!(get_config(&b.peer).await, want);
    // Applied before the answer went out.
    assert_eq!(b.node.config(), want);
    let seen = tokio::time::timeout(SOON, watch.changed()).await.unwrap();
    assert_eq!(seen, Some(want));

    let second = raw(&[1u8, 2, 3]);
    let reply = set_config(&b.peer, second.clone(), Some(1)).await.unwrap();
    assert_eq!(reply.version, 2);
    let want = ConfigValue {
        value: second,
        version: 2,
    };
    let seen = tokio::time::timeout(SOON, watch.changed()).await.unwrap();
    assert_eq!(seen, Some(want.clone()));
    assert_eq!(get_config(&b.peer).await, want);
}

#[tokio::test]
async fn a_stale_if_version_is_a_conflict_naming_the_current_version_and_changes_nothing() {
    let b = bind_new(listening("node")).await;
    // Version 0 is what an unset configuration is at.
    let reply = set_config(&b.peer, raw("v1"), Some(0)).await.unwrap();
    assert_eq!(reply.version, 1);
    for stale in [0, 2, 7] {
        let body = remote(set_config(&b.peer, raw("lost"), Some(stale)).await);
        assert_eq!(body.code, ErrorCode::Conflict, "if_version {stale}");
        let detail: BTreeMap<String, u64> = body
            .detail
            .expect("a conflict names the current version")
            .decode()
            .unwrap();
        assert_eq!(detail, BTreeMap::from([("version".to_owned(), 1)]));
    }
    let want = ConfigValue {
        value: raw("v1"),
        version: 1,
    };
    assert_eq!(get_config(&b.peer).await, want);
    assert_eq!(b.node.config(), want);
    // The current version still applies.
    let reply = set_config(&b.peer, raw("v2"), Some(1)).await.unwrap();
    assert_eq!(reply.version, 2);
    assert_eq!(b.node.config().value, raw("v2"));
}

#[tokio::test]
async fn configuration_verbs_are_refused_to_anyone_but_the_control_plane() {
    let b = bind_new(listening("node")).await;
    set_config(&b.peer, raw("mine"), None).await.unwrap();
    let (_other, sp) = stranger(&b.node).await;
    let body = denied(sp.request_within(GetConfig, NoArgs {}, CALL).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let body = denied(set_config(&sp, raw("theirs"), None).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let want = ConfigValue {
        value: raw("mine"),
        version: 1,
    };
    assert_eq!(get_config(&b.peer).await, want);
    assert_eq!(b.node.config(), want);
}

#[tokio::test]
async fn a_repeated_req_id_gets_the_remembered_answer_and_is_applied_once() {
    let node = listening("node").start().await.unwrap();
    let mut cp = RawPeer::connect(&node).await;
    let invite = node.invite(Some(cp.id)).unwrap();
    cp.control(
        "core.monitoring",
        "bind",
        "b1",
        &raw(&BindArgs {
            code: invite.code.clone().unwrap(),
        }),
    )
    .await;
    assert!(cp.response("b1").await.outcome.is_ok());

    let once = raw(&SetConfigArgs {
        value: raw("once"),
        if_version: None,
    });
    cp.control("core.configuration", "set_config", "s1", &once)
        .await;
    let first = cp.response("s1").await.outcome.unwrap();
    assert_eq!(first.decode::<SetConfigReply>().unwrap().version, 1);
    cp.control("core.configuration", "set_config", "s1", &once)
        .await;
    let again = cp.response("s1").await.outcome.unwrap();
    assert_eq!(again, first, "the remembered answer");
    assert_eq!(node.config().version, 1, "applied once");

    // A retried compare-and-set gets its success, not a conflict.
    let cas = raw(&SetConfigArgs {
        value: raw("cas"),
        if_version: Some(1),
    });
    cp.control("core.configuration", "set_config", "s2", &cas)
        .await;
    let first = cp.response("s2").await.outcome.unwrap();
    assert_eq!(first.decode::<SetConfigReply>().unwrap().version, 2);
    cp.control("core.configuration", "set_config", "s2", &cas)
        .await;
    assert_eq!(cp.response("s2").await.outcome.unwrap(), first);
    assert_eq!(node.config().version, 2);

    // The same req_id on another verb runs nothing.
    cp.control("core.configuration", "get_config", "s1", &raw(&NoArgs {}))
        .await;
    let dup = cp.response("s1").await.outcome.unwrap_err();
    assert_eq!(dup.code, ErrorCode::Duplicate);
    assert_eq!(
        node.config(),
        ConfigValue {
            value: raw("cas"),
            version: 2
        }
    );

    // A conflict is remembered too. After a binding change the runtime's
    // ledger has forgotten it, and the node's own remembered answer is
    // given, although the version has moved to the one it asked for.
    let stale = raw(&SetConfigArgs {
        value: raw("late"),
        if_version: Some(3),
    });
    cp.control("core.configuration", "set_config", "s3", &stale)
        .await;
    let conflict = cp.response("s3").await.outcome.unwrap_err();
    assert_eq!(conflict.code, ErrorCode::Conflict);
    cp.control("core.monitoring", "disable", "d1", &raw(&NoArgs {}))
        .await;
    assert!(cp.response("d1").await.outcome.is_ok());
    raw_bind(&mut cp, &node, "b2").await;
    assert_eq!(raw_set(&mut cp, "s4", "moved").await, 3);
    cp.control("core.configuration", "set_config", "s3", &stale)
        .await;
    let again = cp.response("s3").await.outcome.unwrap_err();
    assert_eq!(again.code, ErrorCode::Conflict);
    let detail: BTreeMap<String, u64> = again.detail.unwrap().decode().unwrap();
    assert_eq!(detail, BTreeMap::from([("version".to_owned(), 2)]));
    assert_eq!(node.config().version, 3, "the stale request did not apply");
}

#[tokio::test]
async fn a_set_config_retried_after_a_restart_is_answered_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let key = Keypair::generate().unwrap();
    let node = listening("node").state_dir(&state).start().await.unwrap();
    let mut cp = RawPeer::connect_as(&node, key.clone()).await;
    let invite = node.invite(Some(cp.id)).unwrap();
    cp.control(
        "core.monitoring",
        "bind",
        "b1",
        &raw(&BindArgs {
            code: invite.code.clone().unwrap(),
        }),
    )
    .await;
    assert!(cp.response("b1").await.outcome.is_ok());
    let args = raw(&SetConfigArgs {
        value: raw("durable"),
        if_version: None,
    });
    cp.control("core.configuration", "set_config", "s1", &args)
        .await;
    let first = cp.response("s1").await.outcome.unwrap();
    assert_eq!(first.decode::<SetConfigReply>().unwrap().version, 1);
    drop(cp);
    let mut watch = node.watch_config();
    node.shutdown().await;
    drop(node);
    let gone = tokio::time::timeout(SOON, watch.changed()).await;
    assert_eq!(gone.unwrap(), None, "the watch ends with the node");

    // The restarted node's runtime remembers nothing; its store does.
    let node = listening("node").state_dir(&state).start().await.unwrap();
    let mut cp = RawPeer::connect_as(&node, key).await;
    cp.control("core.configuration", "set_config", "s1", &args)
        .await;
    assert_eq!(cp.response("s1").await.outcome.unwrap(), first);
    assert_eq!(node.config().version, 1, "not applied again");
    cp.control("core.configuration", "set_config", "s2", &args)
        .await;
    let next = cp.response("s2").await.outcome.unwrap();
    assert_eq!(next.decode::<SetConfigReply>().unwrap().version, 2);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_compare_and_sets_on_one_version_exactly_one_applies() {
    let b = bind_new(listening("node")).await;
    let (x, y) = tokio::join!(
        set_config(&b.peer, raw("x"), Some(0)),
        set_config(&b.peer, raw("y"), Some(0))
    );
    let (won, lost, value) = match (x, y) {
        (Ok(w), Err(l)) => (w, l, raw("x")),
        (Err(l), Ok(w)) => (w, l, raw("y")),
        other => panic!("exactly one compare-and-set must apply: {other:?}"),
    };
    assert_eq!(won.version, 1);
    assert_eq!(remote::<()>(Err(lost)).code, ErrorCode::Conflict);
    assert_eq!(b.node.config(), ConfigValue { value, version: 1 });
}

async fn raw_bind(cp: &mut RawPeer, node: &Node, req_id: &str) {
    let invite = node.invite(Some(cp.id)).unwrap();
    cp.control(
        "core.monitoring",
        "bind",
        req_id,
        &raw(&BindArgs {
            code: invite.code.clone().unwrap(),
        }),
    )
    .await;
    assert!(cp.response(req_id).await.outcome.is_ok());
}

async fn raw_set(cp: &mut RawPeer, req_id: &str, value: &str) -> u64 {
    let args = raw(&SetConfigArgs {
        value: raw(value),
        if_version: None,
    });
    cp.control("core.configuration", "set_config", req_id, &args)
        .await;
    let reply = cp.response(req_id).await.outcome.unwrap();
    reply.decode::<SetConfigReply>().unwrap().version
}

#[tokio::test]
async fn a_sender_over_its_answer_quota_forgets_only_its_own_oldest_answers() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let builder = || {
        listening("node").state_dir(&state).limits(Limits {
            replay_sender_max_bytes: 4096,
            ..Limits::default()
        })
    };
    let (ka, kb) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let node = builder().start().await.unwrap();
    let mut a = RawPeer::connect_as(&node, ka.clone()).await;
    raw_bind(&mut a, &node, "b1").await;
    assert_eq!(raw_set(&mut a, "7", "from a").await, 1);
    a.control("core.monitoring", "disable", "d1", &raw(&NoArgs {}))
        .await;
    assert!(a.response("d1").await.outcome.is_ok());

    // Another control plane writes far more answers than its quota holds.
    let mut b = RawPeer::connect_as(&node, kb.clone()).await;
    raw_bind(&mut b, &node, "b1").await;
    for i in 1001..=1040 {
        assert_eq!(raw_set(&mut b, &i.to_string(), "from b").await, i - 999);
    }
    drop((a, b));
    node.shutdown().await;
    drop(node);

    // After a restart only the durable answers are left to replay.
    let node = builder().start().await.unwrap();
    let mut b = RawPeer::connect_as(&node, kb).await;
    assert_eq!(raw_set(&mut b, "1040", "from b").await, 41, "remembered");
    assert_eq!(node.config().version, 41);
    assert_eq!(
        raw_set(&mut b, "1001", "from b").await,
        42,
        "forgotten: runs again"
    );
    assert_eq!(node.config().version, 42);

    // The other sender's answer was not pushed out by b's.
    node.unbind().await.unwrap();
    let mut a = RawPeer::connect_as(&node, ka).await;
    raw_bind(&mut a, &node, "b2").await;
    assert_eq!(raw_set(&mut a, "7", "from a").await, 1, "remembered");
    assert_eq!(node.config().version, 42);
    node.shutdown().await;
}

// ---------------------------------------------------------------------
// core.connect

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introduce_makes_a_contact_the_node_keeps_a_session_with() {
    let b = bind_new(listening("node")).await;
    let third = listening("third").start().await.unwrap();
    let args = IntroduceArgs {
        name: "third".into(),
        node_id: third.id(),
        addr: third.local_addrs()[0].to_string(),
    };
    let reply = b
        .peer
        .request_within(ConnectIntroduce, args.clone(), CALL)
        .await
        .unwrap();
    assert!(reply.added);
    wait_until("the node has a session with the introduced peer", || {
        b.node.connected_peers().contains(&third.id())
    })
    .await;
    wait_until("the introduced peer has a session with the node", || {
        third.connected_peers().contains(&b.node.id())
    })
    .await;
    assert!(
        b.node
            .contacts()
            .iter()
            .any(|c| c.id == third.id() && c.name == "third"),
        "{:?}",
        b.node.contacts()
    );

    // The same introduction again changes nothing, whatever the address's
    // spelling.
    let again = b
        .peer
        .request_within(ConnectIntroduce, args.clone(), CALL)
        .await
        .unwrap();
    assert!(!again.added);
    let bare = IntroduceArgs {
        addr: tcp_addr(&third).to_string(),
        ..args
    };
    let again = b
        .peer
        .request_within(ConnectIntroduce, bare.clone(), CALL)
        .await
        .unwrap();
    assert!(!again.added);
    assert_eq!(b.node.contacts().len(), 1);

    // A new name for the same key replaces the contact.
    let renamed = IntroduceArgs {
        name: "third, renamed".into(),
        ..bare
    };
    let again = b
        .peer
        .request_within(ConnectIntroduce, renamed, CALL)
        .await
        .unwrap();
    assert!(again.added);
    let contacts = b.node.contacts();
    assert_eq!(contacts.len(), 1, "{contacts:?}");
    assert_eq!(contacts[0].name, "third, renamed");
}

#[tokio::test]
async fn introduce_refuses_bad_args_and_non_controllers() {
    let b = bind_new(listening("node")).await;
    let third = Node::builder("third").start().await.unwrap();
    let good = IntroduceArgs {
        name: "third".into(),
        node_id: third.id(),
        addr: "127.0.0.1:9".into(),
    };
    let mut own_other_encoding = *b.node.id().as_bytes();
    own_other_encoding[31] |= 0x80;
    let cases = [
        (
            "an address that does not parse",
            IntroduceArgs {
                addr: "nowhere".into(),
                ..good.clone()
            },
        ),
        (
            "another scheme",
            IntroduceArgs {
                addr: "ftp://127.0.0.1:9".into(),
                ..good.clone()
            },
        ),
        (
            "an empty unix path",
            IntroduceArgs {
                addr: "unix:".into(),
                ..good.clone()
            },
        ),
        (
            "the node's own id",
            IntroduceArgs {
                node_id: b.node.id(),
                ..good.clone()
            },
        ),
        (
            "the node's own id, encoded otherwise",
            IntroduceArgs {
                node_id: NodeId::from_bytes(own_other_encoding),
                ..good.clone()
            },
        ),
        (
            "an empty name",
            IntroduceArgs {
                name: String::new(),
                ..good.clone()
            },
        ),
        (
            "a name with a leading space",
            IntroduceArgs {
                name: " third".into(),
                ..good.clone()
            },
        ),
        (
            "a name with a control character",
            IntroduceArgs {
                name: "th\nird".into(),
                ..good.clone()
            },
        ),
        (
            "a name over 64 bytes",
            IntroduceArgs {
                name: "x".repeat(65),
                ..good.clone()
            },
        ),
    ];
    for (what, args) in cases {
        let body = remote(b.peer.request_within(ConnectIntroduce, args, CALL).await);
        assert_eq!(body.code, ErrorCode::BadArgs, "{what}");
    }
    let (_other, sp) = stranger(&b.node).await;
    let body = denied(sp.request_within(ConnectIntroduce, good, CALL).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert!(b.node.contacts().is_empty(), "{:?}", b.node.contacts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_introduced_contact_is_dialled_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let b = bind_new(listening("node").state_dir(&state)).await;
    let third = listening("third").start().await.unwrap();
    let args = IntroduceArgs {
        name: "third".into(),
        node_id: third.id(),
        addr: third.local_addrs()[0].to_string(),
    };
    let reply = b
        .peer
        .request_within(ConnectIntroduce, args, CALL)
        .await
        .unwrap();
    assert!(reply.added);
    b.node.shutdown().await;
    drop(b);
    wait_until("the old session is gone", || {
        third.connected_peers().is_empty()
    })
    .await;

    let node = listening("node").state_dir(&state).start().await.unwrap();
    wait_until("the restarted node dials its contact again", || {
        node.connected_peers().contains(&third.id())
    })
    .await;
    node.shutdown().await;
}

// ---------------------------------------------------------------------
// core.cluster

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_lists_a_running_child_and_refuses_taken_or_bad_names() {
    let b = bind_new(listening("parent")).await;
    let members: Vec<Member> = b.reply.members.decode().unwrap();
    assert!(members.is_empty());
    let empty = list(&b.peer).await;
    assert!(empty.members.is_empty());
    assert_eq!(empty.version, b.reply.version);

    let m = create(&b.peer, "alice", Some("likes tea")).await.unwrap();
    assert_eq!(
        (m.name.as_str(), m.bio.as_str(), m.persona.as_str()),
        ("alice", "likes tea", "")
    );
    assert_eq!(m.status, ChildStatus::Running);
    assert_eq!(m.monitoring, MonitoringStatus::Off);
    let kid_id = m.node_id.expect("a running child has a key");
    assert!(!m.addrs.is_empty());
    assert!(
        m.caps.iter().any(|c| c.starts_with("core.monitoring@")),
        "{:?}",
        m.caps
    );
    let roster = list(&b.peer).await;
    assert_eq!(roster.members, vec![m.clone()]);
    assert!(roster.version > empty.version);
    assert_eq!(b.node.roster(), roster);

    // The child runs where the roster says, as the key it says.
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    assert_eq!(invite.node_id, kid_id);
    assert_eq!(invite.code, None, "no bind is open on the child");
    let kid = reach_child(&b.cp, &invite.to_string()).await;
    assert_eq!(kid.id(), kid_id);
    let st = status(&kid).await;
    assert_eq!(st.monitoring, MonitoringStatus::Off);
    assert!(!st.you_are_controller);

    let body = remote(create(&b.peer, "alice", None).await);
    assert_eq!(body.code, ErrorCode::Duplicate);
    let long = "x".repeat(65);
    for bad in ["", " bob", "bob ", "b\tob", long.as_str()] {
        let body = remote(create(&b.peer, bad, None).await);
        assert_eq!(body.code, ErrorCode::BadArgs, "{bad:?}");
    }
    let body = remote(create(&b.peer, "bob", Some(&"x".repeat(4097))).await);
    assert_eq!(body.code, ErrorCode::BadArgs);
    assert_eq!(
        list(&b.peer).await,
        roster,
        "refused creates change nothing"
    );

    // The cluster's verbs are the control plane's only.
    let (_other, sp) = stranger(&b.node).await;
    let body = denied(sp.request_within(ClusterList, NoArgs {}, CALL).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let body = denied(create(&sp, "mallory", None).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let body = denied(remove(&sp, &m.cid).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let body = denied(contact(&sp, &m.cid).await);
    assert_eq!(body.code, ErrorCode::Unauthorized);
    assert_eq!(list(&b.peer).await, roster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_bio_and_set_persona_change_the_member_and_refuse_unknown_or_too_long() {
    let b = bind_new(listening("parent")).await;
    let m = create(&b.peer, "carol", None).await.unwrap();
    let set_bio = |cid: &str, bio: String| {
        let peer = b.peer.clone();
        let cid = cid.to_owned();
        async move {
            peer.request_within(ClusterSetBio, SetBioArgs { cid, bio }, CALL)
                .await
        }
    };
    let set_persona = |cid: &str, persona: String| {
        let peer = b.peer.clone();
        let cid = cid.to_owned();
        async move {
            peer.request_within(ClusterSetPersona, SetPersonaArgs { cid, persona }, CALL)
                .await
        }
    };

    let after = set_bio(&m.cid, "gardener".into()).await.unwrap();
    assert_eq!(after.bio, "gardener");
    let after = set_persona(&m.cid, "pirate".into()).await.unwrap();
    assert_eq!(
        (after.bio.as_str(), after.persona.as_str()),
        ("gardener", "pirate")
    );
    assert_eq!(member(&list(&b.peer).await, &m.cid), Some(&after));

    let body = remote(set_bio("c404", "x".into()).await);
    assert_eq!(body.code, ErrorCode::NotFound);
    let body = remote(set_persona("c404", "x".into()).await);
    assert_eq!(body.code, ErrorCode::NotFound);
    let body = remote(set_bio(&m.cid, "x".repeat(4097)).await);
    assert_eq!(body.code, ErrorCode::BadArgs);
    let body = remote(set_persona(&m.cid, "x".repeat(4097)).await);
    assert_eq!(body.code, ErrorCode::BadArgs);
    assert_eq!(member(&list(&b.peer).await, &m.cid), Some(&after));

    let longest = set_bio(&m.cid, "y".repeat(4096)).await.unwrap();
    assert_eq!(longest.bio.len(), 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_monitoring_opens_a_bind_for_the_control_plane_that_contact_hands_over() {
    let b = bind_new(listening("parent")).await;
    let m = create(&b.peer, "dora", None).await.unwrap();
    let kid_id = m.node_id.unwrap();

    let pending = set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    assert_eq!(pending.monitoring, MonitoringStatus::Pending);
    assert_eq!(
        member(&list(&b.peer).await, &m.cid).unwrap().monitoring,
        MonitoringStatus::Pending
    );
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    assert_eq!(invite.node_id, kid_id);
    assert!(
        invite.code.is_some(),
        "a pending child's invite has its code"
    );

    // The bind is reserved for the parent's control plane.
    let other = Node::builder("other").start().await.unwrap();
    let err = other.connect_invite(&invite).await.unwrap_err();
    assert_eq!(bind_failure(err), BindFailure::WrongSender);

    let (kid, reply) = b.cp.connect_invite(&invite).await.unwrap();
    let reply = reply.expect("the invite had a code");
    assert_eq!(reply.manifest.node_id, kid_id);
    assert_eq!(reply.manifest.monitoring, MonitoringStatus::On);
    wait_until("the roster shows the child watched", || {
        member(&b.node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::On
    })
    .await;
    assert_eq!(
        member(&list(&b.peer).await, &m.cid).unwrap().monitoring,
        MonitoringStatus::On
    );
    let st = status(&kid).await;
    assert_eq!(st.monitoring, MonitoringStatus::On);
    assert!(st.you_are_controller);
    assert_eq!(contact(&b.peer, &m.cid).await.unwrap().code, None);

    // Unbound on the child itself: the host reports it, the roster follows.
    kid.request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    wait_until("the roster shows the child unwatched", || {
        member(&b.node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::Off
    })
    .await;
    set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    let (kid, _) = b.cp.connect_invite(&invite).await.unwrap();
    wait_until("the roster shows the child watched again", || {
        member(&b.node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::On
    })
    .await;

    let off = set_monitoring(&b.peer, &m.cid, false).await.unwrap();
    assert_eq!(off.monitoring, MonitoringStatus::Off);
    let st = status(&kid).await;
    assert_eq!(st.monitoring, MonitoringStatus::Off);
    assert!(!st.you_are_controller);
    assert_eq!(
        member(&list(&b.peer).await, &m.cid).unwrap().monitoring,
        MonitoringStatus::Off
    );

    let body = remote(set_monitoring(&b.peer, "c404", true).await);
    assert_eq!(body.code, ErrorCode::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_monitoring_that_runs_after_the_parent_was_unbound_is_not_bound() {
    // The chokepoint lets a controller verb through only while the sender
    // is the bound control plane, so `not_bound` can only be seen by a
    // set_monitoring that passed it and then waited (here behind a create
    // the host holds) while the parent was unbound.
    let host = GatedHost::new("slow");
    let (release, entered) = (host.release.clone(), host.entered.clone());
    let node = listening("parent").host(host).start().await.unwrap();
    let mut cp = RawPeer::connect(&node).await;
    let invite = node.invite(Some(cp.id)).unwrap();
    cp.control(
        "core.monitoring",
        "bind",
        "b1",
        &raw(&BindArgs {
            code: invite.code.clone().unwrap(),
        }),
    )
    .await;
    assert!(cp.response("b1").await.outcome.is_ok());
    let create = |name: &str| {
        raw(&CreateArgs {
            name: name.into(),
            bio: None,
        })
    };
    cp.control("core.cluster", "create", "c1", &create("kid"))
        .await;
    let kid: Member = cp.response("c1").await.outcome.unwrap().decode().unwrap();

    cp.control("core.cluster", "create", "c2", &create("slow"))
        .await;
    wait_until("the host holds the slow child", || {
        entered.load(Ordering::SeqCst) == 1
    })
    .await;
    cp.control(
        "core.cluster",
        "set_monitoring",
        "m1",
        &raw(&SetMonitoringArgs {
            cid: kid.cid.clone(),
            enabled: true,
        }),
    )
    .await;
    // A fence: the node starts the requests of a session in order, so once
    // this one is answered, set_monitoring has passed the chokepoint.
    cp.control("core.monitoring", "status", "st1", &raw(&NoArgs {}))
        .await;
    assert!(cp.response("st1").await.outcome.is_ok());

    assert_eq!(node.unbind().await.unwrap(), Some(cp.id));
    release.add_permits(1);
    assert!(cp.response("c2").await.outcome.is_ok());
    let late = cp.response("m1").await.outcome.unwrap_err();
    assert_eq!(late.code, ErrorCode::NotBound);
    assert_eq!(
        member(&node.roster(), &kid.cid).unwrap().monitoring,
        MonitoringStatus::Off
    );

    // The refusal is remembered: bound again, the same request gets it again.
    raw_bind(&mut cp, &node, "b2").await;
    cp.control(
        "core.cluster",
        "set_monitoring",
        "m1",
        &raw(&SetMonitoringArgs {
            cid: kid.cid.clone(),
            enabled: true,
        }),
    )
    .await;
    let again = cp.response("m1").await.outcome.unwrap_err();
    assert_eq!(again.code, ErrorCode::NotBound);
    assert_eq!(
        member(&node.roster(), &kid.cid).unwrap().monitoring,
        MonitoringStatus::Off
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introduced_children_become_each_others_contacts() {
    let b = bind_new(listening("parent").host(kid_host())).await;
    let ann = create(&b.peer, "ann", None).await.unwrap();
    let ben = create(&b.peer, "ben", None).await.unwrap();
    assert!(
        ann.caps.iter().any(|c| c == "app.kid@1.0.0"),
        "{:?}",
        ann.caps
    );
    let before = list(&b.peer).await;
    introduce_pair(&b.peer, &ann.cid, &ben.cid).await.unwrap();
    assert_eq!(list(&b.peer).await, before, "the roster does not change");

    let reach = |m: &Member| {
        let (cp, peer) = (b.cp.clone(), b.peer.clone());
        let cid = m.cid.clone();
        async move {
            let invite = contact(&peer, &cid).await.unwrap();
            reach_child(&cp, &invite.to_string()).await
        }
    };
    for (from, to) in [(&ann, &ben), (&ben, &ann)] {
        let kid = reach(from).await;
        let want = to.node_id.unwrap().to_string();
        eventually(
            &format!("{} has a session with {}", from.name, to.name),
            || {
                let kid = kid.clone();
                let want = want.clone();
                async move {
                    kid.request_within(KidPeers, NoArgs {}, CALL)
                        .await
                        .unwrap()
                        .contains(&want)
                }
            },
        )
        .await;
    }

    let body = remote(introduce_pair(&b.peer, &ann.cid, &ann.cid).await);
    assert_eq!(body.code, ErrorCode::BadArgs);
    let body = remote(introduce_pair(&b.peer, &ann.cid, "c404").await);
    assert_eq!(body.code, ErrorCode::NotFound);
    let body = remote(introduce_pair(&b.peer, "c404", &ben.cid).await);
    assert_eq!(body.code, ErrorCode::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_stops_and_forgets_a_child_and_an_absent_child_is_already_removed() {
    let b = bind_new(listening("parent")).await;
    let m = create(&b.peer, "eve", None).await.unwrap();
    let kid_id = m.node_id.unwrap();
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    let _kid = reach_child(&b.cp, &invite.to_string()).await;
    assert!(b.cp.connected_peers().contains(&kid_id));

    remove(&b.peer, &m.cid).await.unwrap();
    let roster = list(&b.peer).await;
    assert!(member(&roster, &m.cid).is_none(), "{roster:?}");
    assert_eq!(b.node.roster(), roster);
    wait_until("the removed child's session ends", || {
        !b.cp.connected_peers().contains(&kid_id)
    })
    .await;

    remove(&b.peer, &m.cid).await.unwrap();
    assert_eq!(
        list(&b.peer).await,
        roster,
        "removing an absent child changes nothing"
    );
    let body = remote(contact(&b.peer, &m.cid).await);
    assert_eq!(body.code, ErrorCode::NotFound);
    let body = remote(set_monitoring(&b.peer, &m.cid, true).await);
    assert_eq!(body.code, ErrorCode::NotFound);

    // The name is free again; the cid is not reused.
    let again = create(&b.peer, "eve", None).await.unwrap();
    assert_ne!(again.cid, m.cid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_the_host_does_not_finish_in_time_is_a_timeout_and_is_undone() {
    let host = GatedHost::new("slow");
    let release = host.release.clone();
    let b = bind_new(listening("parent").host(host).limits(Limits {
        host_timeout: Duration::from_millis(300),
        ..Limits::default()
    }))
    .await;
    let before = list(&b.peer).await;
    match create(&b.peer, "slow", None).await {
        Err(CallError::Timeout) => {}
        other => panic!("expected the host timeout, got {other:?}"),
    }
    let after = list(&b.peer).await;
    assert!(after.members.is_empty(), "{after:?}");
    assert!(after.version > before.version);
    // The name is free again.
    release.add_permits(1);
    let m = create(&b.peer, "slow", None).await.unwrap();
    assert_eq!(m.status, ChildStatus::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_beyond_max_children_is_overloaded() {
    let b = bind_new(listening("parent").limits(Limits {
        max_children: 1,
        ..Limits::default()
    }))
    .await;
    create(&b.peer, "only", None).await.unwrap();
    match create(&b.peer, "another", None).await {
        Err(CallError::Overloaded) => {}
        other => panic!("expected overloaded, got {other:?}"),
    }
    assert_eq!(list(&b.peer).await.members.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_come_back_as_themselves_when_the_parent_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("parent");
    let b = bind_new(listening("parent").state_dir(&state)).await;
    let m = create(&b.peer, "hal", Some("stays")).await.unwrap();
    let kid_id = m.node_id.unwrap();
    let cp = b.cp.clone();
    b.node.shutdown().await;
    drop(b);

    let node = listening("parent").state_dir(&state).start().await.unwrap();
    assert_eq!(node.controller(), Some(cp.id()));
    let peer = cp
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    eventually("the child runs again and can be reached", || {
        let (cp, peer, cid) = (cp.clone(), peer.clone(), m.cid.clone());
        async move {
            let Ok(invite) = contact(&peer, &cid).await else {
                return false;
            };
            invite.node_id == kid_id && cp.connect_invite(&invite).await.is_ok()
        }
    })
    .await;
    let roster = list(&peer).await;
    let back = member(&roster, &m.cid).unwrap();
    assert_eq!(
        (back.name.as_str(), back.bio.as_str(), back.node_id),
        ("hal", "stays", Some(kid_id))
    );
    assert_eq!(back.status, ChildStatus::Running);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_again_to_watch_a_watched_child_keeps_it_watched() {
    let b = bind_new(listening("parent")).await;
    let m = create(&b.peer, "ida", None).await.unwrap();
    set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    let (kid, _) = b.cp.connect_invite(&invite).await.unwrap();
    wait_until("the roster shows the child watched", || {
        member(&b.node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::On
    })
    .await;

    let again = set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    assert_eq!(again.monitoring, MonitoringStatus::On);
    assert_eq!(
        member(&list(&b.peer).await, &m.cid).unwrap().monitoring,
        MonitoringStatus::On
    );
    let st = status(&kid).await;
    assert_eq!(st.monitoring, MonitoringStatus::On);
    assert!(
        st.you_are_controller,
        "the child stays bound to its control plane"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_control_plane_of_the_parent_takes_over_watching_a_child() {
    let b = bind_new(listening("parent")).await;
    let m = create(&b.peer, "lea", None).await.unwrap();
    set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    b.cp.connect_invite(&invite).await.unwrap();
    wait_until("the first control plane watches the child", || {
        member(&b.node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::On
    })
    .await;

    // The parent is handed to another control plane.
    b.node.unbind().await.unwrap();
    let cp2 = Node::builder("cp2").start().await.unwrap();
    let (parent2, _) = cp2
        .connect_invite(&b.node.invite(Some(cp2.id())).unwrap())
        .await
        .unwrap();
    let m2 = set_monitoring(&parent2, &m.cid, true).await.unwrap();
    assert_eq!(
        m2.monitoring,
        MonitoringStatus::Pending,
        "a bind for the new one"
    );
    let invite = contact(&parent2, &m.cid).await.unwrap();
    assert!(invite.code.is_some());
    let (kid, _) = cp2.connect_invite(&invite).await.unwrap();
    assert!(status(&kid).await.you_are_controller);
    wait_until("the roster shows the child watched again", || {
        member(&b.node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::On
    })
    .await;
    cp2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_open_on_a_child_is_opened_again_when_the_parent_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("parent");
    let b = bind_new(listening("parent").state_dir(&state)).await;
    let m = create(&b.peer, "jo", None).await.unwrap();
    set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    let cp = b.cp.clone();
    b.node.shutdown().await;
    drop(b);

    let node = listening("parent").state_dir(&state).start().await.unwrap();
    let peer = cp
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + SOON;
    let invite = loop {
        match contact(&peer, &m.cid).await {
            Ok(i) if i.code.is_some() => break i,
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child's bind was not opened again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (kid, reply) = cp.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some());
    assert!(status(&kid).await.you_are_controller);
    wait_until("the roster shows the child watched", || {
        member(&node.roster(), &m.cid).unwrap().monitoring == MonitoringStatus::On
    })
    .await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_creates_with_one_name_exactly_one_succeeds() {
    let b = bind_new(listening("parent")).await;
    let (x, y) = tokio::join!(create(&b.peer, "twin", None), create(&b.peer, "twin", None));
    let lost = match (x, y) {
        (Ok(_), Err(l)) | (Err(l), Ok(_)) => l,
        other => panic!("exactly one create must win: {other:?}"),
    };
    assert_eq!(remote::<()>(Err(lost)).code, ErrorCode::Duplicate);
    assert_eq!(list(&b.peer).await.members.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_create_req_id_makes_one_child() {
    let node = listening("parent").start().await.unwrap();
    let mut cp = RawPeer::connect(&node).await;
    let invite = node.invite(Some(cp.id)).unwrap();
    cp.control(
        "core.monitoring",
        "bind",
        "b1",
        &raw(&BindArgs {
            code: invite.code.clone().unwrap(),
        }),
    )
    .await;
    assert!(cp.response("b1").await.outcome.is_ok());
    let args = raw(&CreateArgs {
        name: "kim".into(),
        bio: None,
    });
    cp.control("core.cluster", "create", "c1", &args).await;
    let first = cp.response("c1").await.outcome.unwrap();
    cp.control("core.cluster", "create", "c1", &args).await;
    assert_eq!(cp.response("c1").await.outcome.unwrap(), first);
    let roster = node.roster();
    assert_eq!(roster.members.len(), 1);
    assert_eq!(roster.members[0], first.decode::<Member>().unwrap());
}

// ---------------------------------------------------------------------
// Roster pushes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_receives_each_roster_change_from_the_parent() {
    let b = bind_new(listening("parent")).await;
    let mut rx = b.cp.control_events();
    let mut pushed = Vec::new();

    let m = create(&b.peer, "fay", None).await.unwrap();
    let v = b.node.roster().version;
    pushed.extend(rosters(
        &events_until(
            &mut rx,
            "the roster after create",
            |e| matches!(e, ControlEvent::Roster { roster, .. } if roster.version >= v),
        )
        .await,
    ));
    let last = &pushed.last().unwrap().1;
    assert_eq!(last.members, vec![m.clone()]);

    set_monitoring(&b.peer, &m.cid, true).await.unwrap();
    let v = b.node.roster().version;
    pushed.extend(rosters(
        &events_until(
            &mut rx,
            "the roster after set_monitoring",
            |e| matches!(e, ControlEvent::Roster { roster, .. } if roster.version >= v),
        )
        .await,
    ));
    let last = &pushed.last().unwrap().1;
    assert_eq!(
        member(last, &m.cid).unwrap().monitoring,
        MonitoringStatus::Pending
    );

    // A change the host reports is pushed as well.
    let invite = contact(&b.peer, &m.cid).await.unwrap();
    b.cp.connect_invite(&invite).await.unwrap();
    pushed.extend(rosters(
        &events_until(&mut rx, "the roster showing the child watched", |e| {
            matches!(e, ControlEvent::Roster { roster, .. }
                if member(roster, &m.cid).is_some_and(|c| c.monitoring == MonitoringStatus::On))
        })
        .await,
    ));

    remove(&b.peer, &m.cid).await.unwrap();
    let v = b.node.roster().version;
    pushed.extend(rosters(
        &events_until(
            &mut rx,
            "the roster after remove",
            |e| matches!(e, ControlEvent::Roster { roster, .. } if roster.version >= v),
        )
        .await,
    ));
    let last = &pushed.last().unwrap().1;
    assert!(last.members.is_empty(), "{last:?}");
    assert_eq!(*last, list(&b.peer).await);

    assert!(pushed.iter().all(|(from, _)| *from == b.node.id()));
    let versions: Vec<u64> = pushed.iter().map(|(_, r)| r.version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "versions increase: {versions:?}"
    );
}

#[tokio::test]
async fn pushes_from_any_peer_reach_the_application_with_the_senders_key() {
    // Roster pushes are bootstrap: the application sees who sent them (the
    // authenticated key) and decides whose it follows.
    let cp = listening("control-plane").start().await.unwrap();
    let mut rx = cp.control_events();
    let (other, to_cp) = stranger(&cp).await;
    let forged = Roster {
        members: Vec::new(),
        version: 99,
    };
    to_cp
        .notify(capwire::manifest::ClusterRoster, forged.clone())
        .await
        .unwrap();
    let events = events_until(&mut rx, "the pushed roster", |e| {
        matches!(e, ControlEvent::Roster { .. })
    })
    .await;
    assert_eq!(rosters(&events), vec![(other.id(), forged)]);
}

// ---------------------------------------------------------------------
// Monitoring copies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_receives_a_copy_of_each_message_in_and_out() {
    let (builder, node_log) = mon_node("node");
    let b = bind_new(builder.limits(Limits {
        copy_body_max: 64,
        ..Limits::default()
    }))
    .await;
    let mut rx = b.cp.control_events();
    let (third_builder, third_log) = mon_node("third");
    let third = third_builder.start().await.unwrap();
    let to_node = third
        .connect(&b.node.local_addrs()[0], Some(b.node.id()))
        .await
        .unwrap();

    assert_eq!(
        to_node
            .request_within(Ping, "inbound".into(), CALL)
            .await
            .unwrap(),
        "pong: inbound"
    );
    let to_third = b.node.peer(third.id());
    assert_eq!(
        to_third
            .request_within(Ping, "outbound".into(), CALL)
            .await
            .unwrap(),
        "pong: outbound"
    );
    let (_, in_req, _) = node_log.pings().pop().unwrap();
    let (from, out_req, _) = third_log.pings().pop().unwrap();
    assert_eq!(from, b.node.id());

    let long = "y".repeat(100);
    to_node
        .request_within(Ping, long.clone(), CALL)
        .await
        .unwrap();
    let (_, long_req, _) = node_log.pings().pop().unwrap();

    let events = events_until(&mut rx, "three copies", {
        let mut n = 0;
        move |e| {
            n += usize::from(matches!(e, ControlEvent::Copy { .. }));
            n == 3
        }
    })
    .await;
    let got = copies(&events);
    assert!(got.iter().all(|(from, _)| *from == b.node.id()));
    let check = |c: &CopyRecord, dir, req_id: &str, text: &str| {
        assert_eq!(c.dir, dir);
        assert_eq!(c.peer, third.id());
        assert_eq!((c.cap.as_str(), c.verb.as_str()), ("app.mon", "ping"));
        assert_eq!(c.req_id, req_id);
        assert_eq!(c.body, raw(text));
        assert_eq!(c.body_len, raw(text).as_bytes().len() as u64);
        assert!(!c.truncated);
    };
    check(&got[0].1, CopyDirection::In, &in_req, "inbound");
    check(&got[1].1, CopyDirection::Out, &out_req, "outbound");
    assert_eq!((got[0].1.seq, got[0].1.dropped), (1, 0));
    assert_eq!((got[1].1.seq, got[1].1.dropped), (2, 0));
    // Args over copy_body_max are left out, and said to be.
    let big = &got[2].1;
    assert_eq!(
        (big.dir, big.req_id.as_str(), big.seq),
        (CopyDirection::In, long_req.as_str(), 3)
    );
    assert!(big.truncated);
    assert!(big.body.is_null());
    assert_eq!(big.body_len, raw(&long).as_bytes().len() as u64);

    // The control plane's own traffic is not copied to it.
    let st = status(&b.peer).await;
    assert!(st.you_are_controller);
    assert_eq!(st.copy_seq, 3);
}

#[tokio::test]
async fn frames_the_chokepoint_or_the_ledger_answered_are_copied_too() {
    let (builder, _node_log) = mon_node("node");
    let b = bind_new(builder).await;
    let mut rx = b.cp.control_events();
    let mut other = RawPeer::connect(&b.node).await;
    let sent = [
        ("app.nope", "x", "u1"),
        ("core.configuration", "get_config", "g1"),
        ("app.mon", "ping", "p1"),
        ("app.mon", "ping", "p1"),
    ];
    for (cap, verb, req_id) in sent {
        let args = if cap == "app.mon" {
            raw("hi")
        } else {
            raw(&NoArgs {})
        };
        other.control(cap, verb, req_id, &args).await;
        let _ = other.response(req_id).await;
    }
    let events = events_until(&mut rx, "four copies", {
        let mut n = 0;
        move |e| {
            n += usize::from(matches!(e, ControlEvent::Copy { .. }));
            n == 4
        }
    })
    .await;
    let got: Vec<(String, String, String, u64)> = copies(&events)
        .into_iter()
        .map(|(_, c)| {
            assert_eq!((c.dir, c.peer), (CopyDirection::In, other.id));
            (c.cap, c.verb, c.req_id, c.seq)
        })
        .collect();
    let want: Vec<(String, String, String, u64)> = sent
        .iter()
        .zip(1..)
        .map(|((c, v, r), seq)| ((*c).to_owned(), (*v).to_owned(), (*r).to_owned(), seq))
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn copy_counting_starts_again_for_a_new_control_plane() {
    let (builder, _node_log) = mon_node("node");
    let b = bind_new(builder).await;
    let (third_builder, _) = mon_node("third");
    let third = third_builder.start().await.unwrap();
    let to_node = third
        .connect(&b.node.local_addrs()[0], Some(b.node.id()))
        .await
        .unwrap();
    let mut rx1 = b.cp.control_events();
    to_node
        .request_within(Ping, "one".into(), CALL)
        .await
        .unwrap();
    let first = copies(
        &events_until(&mut rx1, "a copy", |e| {
            matches!(e, ControlEvent::Copy { .. })
        })
        .await,
    );
    assert_eq!((first[0].1.seq, first[0].1.dropped), (1, 0));

    // Unbound: nothing is copied, and no number is used.
    b.peer
        .request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    to_node
        .request_within(Ping, "unwatched".into(), CALL)
        .await
        .unwrap();
    let cp2 = Node::builder("control-plane-2").start().await.unwrap();
    let mut rx2 = cp2.control_events();
    let (peer2, _) = cp2
        .connect_invite(&b.node.invite(Some(cp2.id())).unwrap())
        .await
        .unwrap();
    assert_eq!(status(&peer2).await.copy_seq, 1);
    to_node
        .request_within(Ping, "two".into(), CALL)
        .await
        .unwrap();
    let second = copies(
        &events_until(&mut rx2, "a copy for the new control plane", |e| {
            matches!(e, ControlEvent::Copy { .. })
        })
        .await,
    );
    assert_eq!(second[0].1.body, raw("two"));
    assert_eq!((second[0].1.seq, second[0].1.dropped), (2, 0));
}

#[tokio::test]
async fn a_copy_made_while_the_control_plane_is_away_is_sent_when_it_dials_again() {
    // The control plane dials the node (it is not one of the node's
    // contacts). A copy made while it has no session waits for it to
    // come back, within the copy deadline, instead of being dropped.
    let (builder, _node_log) = mon_node("node");
    let node = builder.start().await.unwrap();
    let key = Keypair::generate().unwrap();
    let cp = Node::builder("control-plane")
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    let cp_id = cp.id();
    cp.connect_invite(&node.invite(Some(cp_id)).unwrap())
        .await
        .unwrap();
    let (third_builder, _) = mon_node("third");
    let third = third_builder.start().await.unwrap();
    let to_node = third
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();

    // The control plane goes away ...
    cp.shutdown().await;
    wait_until("the node sees the control plane go", || {
        !node.connected_peers().contains(&cp_id)
    })
    .await;
    to_node
        .request_within(Ping, "while away".into(), CALL)
        .await
        .unwrap();
    // ... and comes back, with the same key, a moment later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cp = Node::builder("control-plane")
        .keypair(key)
        .start()
        .await
        .unwrap();
    let mut rx = cp.control_events();
    cp.connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    let got = copies(
        &events_until(&mut rx, "the copy made while it was away", |e| {
            matches!(e, ControlEvent::Copy { .. })
        })
        .await,
    );
    assert_eq!(got[0].1.body, raw("while away"));
    assert_eq!((got[0].1.seq, got[0].1.dropped), (1, 0));
    assert_eq!(node.stats().copies_dropped, 0);
}

#[tokio::test]
async fn copies_dropped_for_a_full_queue_are_accounted_for_in_the_next_copy() {
    const FLOOD: u64 = 500;
    let (builder, node_log) = mon_node("node");
    let b = bind_new(builder.limits(Limits {
        copy_queue_len: 1,
        ..Limits::default()
    }))
    .await;
    let mut rx = b.cp.control_events();
    let (third_builder, _third_log) = mon_node("third");
    let third = third_builder.start().await.unwrap();
    let to_node = third
        .connect(&b.node.local_addrs()[0], Some(b.node.id()))
        .await
        .unwrap();
    for n in 0..FLOOD {
        to_node.notify(Tick, n).await.unwrap();
    }
    wait_until("the node handled every tick", || {
        node_log.ticks() == FLOOD as usize
    })
    .await;

    // Pings until one is copied: the copy queue may be full when one comes.
    let mut seen: Vec<CopyRecord> = Vec::new();
    let deadline = tokio::time::Instant::now() + SOON;
    'outer: loop {
        assert!(tokio::time::Instant::now() < deadline, "no ping was copied");
        to_node
            .request_within(Ping, "end".into(), CALL)
            .await
            .unwrap();
        while let Ok(Ok(event)) =
            tokio::time::timeout(std::time::Duration::from_millis(200), rx.recv()).await
        {
            if let ControlEvent::Copy { from, record } = event {
                assert_eq!(from, b.node.id());
                let last = record.verb == "ping";
                seen.push(record);
                if last {
                    break 'outer;
                }
            }
        }
    }
    assert!(
        seen.iter().any(|c| c.dropped > 0),
        "a queue of one copy must have dropped some of {FLOOD}"
    );
    let mut previous = 0;
    for c in &seen {
        assert_eq!(
            c.seq,
            previous + c.dropped + 1,
            "each copy says how many were dropped since the previous one"
        );
        previous = c.seq;
    }
    assert!(seen.iter().all(|c| c.dir == CopyDirection::In));
    let pings = seen.iter().filter(|c| c.verb == "ping").count() as u64;
    assert_eq!(pings, 1);
    assert!(previous > FLOOD, "every tick used a sequence number");
}

// ---------------------------------------------------------------------
// core.monitoring/status

#[tokio::test]
async fn status_says_the_monitoring_state_and_who_is_the_controller() {
    let node = listening("node").start().await.unwrap();
    let cp = Node::builder("control-plane").start().await.unwrap();
    let (_other, sp) = stranger(&node).await;

    let st = status(&sp).await;
    assert_eq!(st.monitoring, MonitoringStatus::Off);
    assert!(!st.you_are_controller);
    let invite = node.invite(Some(cp.id())).unwrap();
    assert_eq!(status(&sp).await.monitoring, MonitoringStatus::Pending);

    let (peer, _reply) = cp.connect_invite(&invite).await.unwrap();
    let st = status(&peer).await;
    assert_eq!(st.monitoring, MonitoringStatus::On);
    assert!(st.you_are_controller);
    let st = status(&sp).await;
    assert_eq!(st.monitoring, MonitoringStatus::On);
    assert!(
        !st.you_are_controller,
        "only the control plane is told it is"
    );

    peer.request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    let st = status(&peer).await;
    assert_eq!(st.monitoring, MonitoringStatus::Off);
    assert!(!st.you_are_controller);
}

// ---------------------------------------------------------------------
// The bind ceremony through the public API

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_invite_binds_with_the_right_code_and_reports_a_wrong_one() {
    let Bound { node, cp, peer, .. } = bind_new(listening("node")).await;
    // Something to find in the next bind's reply.
    set_config(&peer, raw(&("region", 7)), None).await.unwrap();
    create(&peer, "gus", None).await.unwrap();
    peer.request_within(MonitoringDisable, NoArgs {}, CALL)
        .await
        .unwrap();
    assert_eq!(node.controller(), None);

    let invite = node.invite(None).unwrap();
    let code = invite.code.clone().unwrap();
    let wrong = Invite {
        code: Some(
            if code == "2222222222" {
                "3333333333"
            } else {
                "2222222222"
            }
            .into(),
        ),
        ..invite.clone()
    };
    let err = cp.connect_invite(&wrong).await.unwrap_err();
    assert_eq!(
        bind_failure(err),
        BindFailure::WrongCode { attempts_left: 2 }
    );
    assert_eq!(node.controller(), None);

    let (peer, reply) = cp.connect_invite(&invite).await.unwrap();
    let reply = reply.expect("the invite had a code");
    assert_eq!(node.controller(), Some(cp.id()));
    assert_eq!(reply.manifest, node.manifest());
    assert_eq!(reply.manifest.monitoring, MonitoringStatus::On);
    let roster = list(&peer).await;
    let members: Vec<Member> = reply.members.decode().unwrap();
    assert_eq!(members, roster.members);
    assert_eq!(members.len(), 1);
    assert_eq!(reply.version, roster.version);
    let config: ConfigValue = reply.config.decode().unwrap();
    assert_eq!(config, get_config(&peer).await);
    assert_eq!(config.version, 1);

    // The code is spent.
    let err = cp.connect_invite(&invite).await.unwrap_err();
    assert_eq!(bind_failure(err), BindFailure::NoPending);
}

#[tokio::test]
async fn peer_bind_refuses_an_invite_for_another_node_or_without_a_code() {
    let node = listening("node").start().await.unwrap();
    let elsewhere = listening("elsewhere").start().await.unwrap();
    let cp = Node::builder("control-plane").start().await.unwrap();
    let peer = cp
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    let _pending = node.invite(None).unwrap();
    let theirs = elsewhere.invite(None).unwrap();
    match peer.bind(&theirs).await {
        Err(CallError::InvalidInvite(_)) => {}
        other => panic!("expected InvalidInvite, got {other:?}"),
    }
    let mut codeless = node.invite(None).unwrap();
    codeless.code = None;
    match peer.bind(&codeless).await {
        Err(CallError::InvalidInvite(_)) => {}
        other => panic!("expected InvalidInvite, got {other:?}"),
    }
    // Nothing was sent: neither node is bound.
    assert_eq!(node.controller(), None);
    assert_eq!(elsewhere.controller(), None);
    assert_eq!(node.manifest().monitoring, MonitoringStatus::Pending);
    // A code-less invite connects without binding.
    let (_peer, reply) = cp.connect_invite(&codeless).await.unwrap();
    assert!(reply.is_none());
    assert_eq!(node.controller(), None);
}
