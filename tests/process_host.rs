//! The process host: children are real `capwire node --supervised`
//! processes; their exits show in the roster, monitoring hand-over works
//! over the pipe, removal ends the process and deletes its state, and a
//! parent's shutdown ends its children. Through both hosts: children with
//! names that look like flags start with their names as given, and
//! monitoring events say whom the child is bound to.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use capwire::host::{ChildSpec, Host, HostEvent, InProcessHost, ProcessHost};
use capwire::manifest::{
    ChildArgs, ChildStatus, ClusterContact, ClusterCreate, ClusterList, ClusterRemove,
    ClusterSetMonitoring, CreateArgs, Member, MonitoringStatus, NoArgs, SetMonitoringArgs, verb,
};
use capwire::{ControlEvent, Invite, Node, NodeId, Peer};

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
    assert_eq!(
        reply.expect("bound").manifest.description,
        "does work",
        "the bio is the child's description"
    );
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

type Watched = (MonitoringStatus, Option<NodeId>);

/// Takes `cid`'s monitoring events until one reports `want`; returns the
/// states reported before it.
async fn until_state(
    events: &mut tokio::sync::mpsc::Receiver<HostEvent>,
    cid: &str,
    want: Watched,
) -> Vec<Watched> {
    let mut seen = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(20), events.recv())
            .await
            .unwrap_or_else(|_| panic!("no {want:?} for {cid}; saw {seen:?}"))
            .expect("the host's events ended");
        match e {
            HostEvent::Monitoring {
                cid: c,
                status,
                controller,
            } if c == cid => {
                if (status, controller) == want {
                    return seen;
                }
                seen.push((status, controller));
            }
            HostEvent::Exited { cid: c, detail } if c == cid => panic!("{cid} exited: {detail}"),
            _ => {}
        }
    }
}

/// One child of `host`, bound by a first control plane, then by a second
/// one with no `off` between, restarted with its binding, and let go: each
/// monitoring event says whom the child is bound to.
async fn monitoring_events_name_the_controller(host: impl Host) {
    let mut events = host.events().unwrap();
    let spec = ChildSpec {
        cid: "c1".into(),
        name: "watched".into(),
        bio: String::new(),
        addrs: Vec::new(),
        ..ChildSpec::default()
    };
    host.start(spec.clone()).await.unwrap();
    let cp1 = Node::builder("cp1").start().await.unwrap();
    let cp2 = Node::builder("cp2").start().await.unwrap();

    let invite = host.open_bind("c1", cp1.id()).await.unwrap();
    let (_p1, reply) = cp1.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some(), "cp1 bound the child");
    let seen = until_state(&mut events, "c1", (MonitoringStatus::On, Some(cp1.id()))).await;
    assert!(
        seen.iter().all(|s| *s == (MonitoringStatus::Pending, None)),
        "{seen:?}"
    );

    // Another control plane binds it in place of the first: the status
    // stays `on`, the controller changes.
    let invite = host.open_bind("c1", cp2.id()).await.unwrap();
    let (_p2, reply) = cp2.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some(), "cp2 bound the child");
    let seen = until_state(&mut events, "c1", (MonitoringStatus::On, Some(cp2.id()))).await;
    assert!(
        seen.iter().all(|s| s.0 == MonitoringStatus::On),
        "no off in between: {seen:?}"
    );

    // Started again with the binding it kept: the host says so.
    host.shutdown().await.unwrap();
    host.start(spec).await.unwrap();
    until_state(&mut events, "c1", (MonitoringStatus::On, Some(cp2.id()))).await;

    host.close_bind("c1").await.unwrap();
    until_state(&mut events, "c1", (MonitoringStatus::Off, None)).await;
    host.stop("c1").await.unwrap();
    cp1.shutdown().await;
    cp2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_host_monitoring_events_name_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    monitoring_events_name_the_controller(ProcessHost::new(env!("CARGO_BIN_EXE_capwire"), &base))
        .await;
    eventually("the child is gone", async || {
        pids_with(&base.to_string_lossy()).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_host_monitoring_events_name_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    monitoring_events_name_the_controller(InProcessHost::new().state_dir(dir.path())).await;
}
