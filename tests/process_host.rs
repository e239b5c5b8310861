//! The process host: children are real `capwire node --supervised`
//! processes; their exits show in the roster, monitoring hand-over works
//! over the pipe, removal ends the process and deletes its state, and a
//! parent's shutdown ends its children.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use capwire::host::{InProcessHost, ProcessHost};
use capwire::manifest::{
    ChildArgs, ChildStatus, ClusterContact, ClusterCreate, ClusterList, ClusterRemove,
    ClusterSetMonitoring, CreateArgs, Member, MonitoringStatus, NoArgs, SetMonitoringArgs, verb,
};
use capwire::{ControlEvent, Invite, Node, Peer};

verb! {
    /// The `app.agent/echo` every `capwire node` has.
    pub struct AgentEcho: request "app.agent" / "echo", Bootstrap, String => String;
}

/// The pids of processes whose command line mentions `needle`.
fn pids_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && cmd.contains(" node ") {
            out.push(pid);
        }
    }
    out
}

async fn eventually(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn member(peer: &Peer, cid: &str) -> Option<Member> {
    let r = peer.request(ClusterList, NoArgs {}).await.unwrap();
    r.members.into_iter().find(|m| m.cid == cid)
}

async fn parent_and_cp(base: &Path) -> (Node, Node, Peer) {
    let host = ProcessHost::new(env!("CARGO_BIN_EXE_capwire"), base);
    let parent = Node::builder("parent")
        .listen("127.0.0.1:0".parse().unwrap())
        .host(host)
        .start()
        .await
        .unwrap();
    let cp = Node::builder("cp")
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let invite = parent.invite(Some(cp.id())).unwrap();
    let (peer, _) = cp.connect_invite(&invite).await.unwrap();
    (parent, cp, peer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_supervised_processes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let (parent, cp, peer) = parent_and_cp(&base).await;
    let mut events = cp.control_events();

    let child = peer
        .request(
            ClusterCreate,
            CreateArgs {
                name: "worker".into(),
                bio: Some("does work".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(child.status, ChildStatus::Running);
    assert!(
        child.caps.iter().any(|c| c.starts_with("app.agent@")),
        "{:?}",
        child.caps
    );
    let child_dir = base.join(&child.cid);
    assert!(
        child_dir.join("state.redb").exists(),
        "the child keeps its state"
    );
    let pids = pids_with(&child_dir.to_string_lossy());
    assert_eq!(pids.len(), 1, "one process for the child");

    // The control plane reaches the child with its invite and watches it.
    let m = peer
        .request(
            ClusterSetMonitoring,
            SetMonitoringArgs {
                cid: child.cid.clone(),
                enabled: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(m.monitoring, MonitoringStatus::Pending);
    let contact = peer
        .request(
            ClusterContact,
            ChildArgs {
                cid: child.cid.clone(),
            },
        )
        .await
        .unwrap();
    let invite: Invite = contact.invite.parse().unwrap();
    assert!(invite.code.is_some());
    let (child_peer, reply) = cp.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some());
    assert_eq!(
        child_peer.request(AgentEcho, "hi".into()).await.unwrap(),
        "worker: hi"
    );
    eventually("the roster shows the child watched", async || {
        member(&peer, &child.cid).await.unwrap().monitoring == MonitoringStatus::On
    })
    .await;

    // A child that dies is seen to exit.
    let status = std::process::Command::new("kill")
        .args(["-9", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("the roster shows the exit", async || {
        member(&peer, &child.cid).await.unwrap().status == ChildStatus::Exited
    })
    .await;
    // ... and the control plane was told.
    let mut saw_exit = false;
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
        if let ControlEvent::Roster { from, roster } = e {
            assert_eq!(from, parent.id());
            saw_exit |= roster
                .members
                .iter()
                .any(|m| m.cid == child.cid && m.status == ChildStatus::Exited);
        }
    }
    assert!(saw_exit, "a roster push showed the exit");

    // Removing it deletes its state.
    peer.request(
        ClusterRemove,
        ChildArgs {
            cid: child.cid.clone(),
        },
    )
    .await
    .unwrap();
    assert!(member(&peer, &child.cid).await.is_none());
    assert!(!child_dir.exists());
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_child_and_stopping_the_parent_end_the_processes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let (parent, cp, peer) = parent_and_cp(&base).await;
    let mut cids = Vec::new();
    for name in ["a", "b"] {
        let m = peer
            .request(
                ClusterCreate,
                CreateArgs {
                    name: name.into(),
                    bio: None,
                },
            )
            .await
            .unwrap();
        cids.push(m.cid);
    }
    let needle = base.to_string_lossy().to_string();
    assert_eq!(pids_with(&needle).len(), 2);
    peer.request(
        ClusterRemove,
        ChildArgs {
            cid: cids[0].clone(),
        },
    )
    .await
    .unwrap();
    eventually("the removed child's process is gone", async || {
        pids_with(&needle).len() == 1
    })
    .await;
    parent.shutdown().await;
    eventually("no child outlives the parent", async || {
        pids_with(&needle).is_empty()
    })
    .await;
    // Its state stays for the parent's next run.
    assert!(base.join(&cids[1]).join("state.redb").exists());
    cp.shutdown().await;
}

/// Names that are valid (5.2) but look like flags, assignments or need
/// quoting; the last is 64 bytes, the longest allowed.
fn odd_names() -> Vec<String> {
    vec![
        "-bob".into(),
        "--help".into(),
        "-".into(),
        "--name=evil".into(),
        "a=b".into(),
        "=x".into(),
        "with space".into(),
        "ünïcødé ☃ 名前".into(),
        "é".repeat(32),
    ]
}

/// Creates every odd name as a child of `parent` through `core.cluster`,
/// and checks the roster and the child's own manifest carry it as given.
async fn create_odd_names(parent: Node) {
    let cp = Node::builder("cp").start().await.unwrap();
    let invite = parent.invite(Some(cp.id())).unwrap();
    let (peer, _) = cp.connect_invite(&invite).await.unwrap();
    for name in odd_names() {
        let m = peer
            .request(
                ClusterCreate,
                CreateArgs {
                    name: name.clone(),
                    bio: None,
                },
            )
            .await
            .unwrap_or_else(|e| panic!("creating {name:?}: {e}"));
        assert_eq!(m.name, name);
        assert_eq!(m.status, ChildStatus::Running, "{name:?}");
        let contact = peer
            .request(ClusterContact, ChildArgs { cid: m.cid.clone() })
            .await
            .unwrap();
        let mut invite: Invite = contact.invite.parse().unwrap();
        invite.code = None;
        let (child, _) = cp.connect_invite(&invite).await.unwrap();
        let manifest = child.manifest().expect("the child's manifest");
        assert_eq!(manifest.name, name, "the child's own name");
    }
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_child_names_come_out_as_given_through_the_process_host() {
    let dir = tempfile::tempdir().unwrap();
    // A base directory that needs quoting too.
    let base = dir.path().join("odd dir=1").join("-children");
    let host = ProcessHost::new(env!("CARGO_BIN_EXE_capwire"), &base);
    let parent = Node::builder("parent")
        .listen("127.0.0.1:0".parse().unwrap())
        .host(host)
        .start()
        .await
        .unwrap();
    create_odd_names(parent).await;
    eventually("no child outlives the parent", async || {
        pids_with(&base.to_string_lossy()).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_child_names_come_out_as_given_through_the_in_process_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = InProcessHost::new().state_dir(dir.path().join("odd dir=1").join("-children"));
    let parent = Node::builder("parent")
        .listen("127.0.0.1:0".parse().unwrap())
        .host(host)
        .start()
        .await
        .unwrap();
    create_odd_names(parent).await;
}
