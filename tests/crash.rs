//! Crash tests with real processes: a `capwire node` with a state
//! directory is killed with SIGKILL in the middle of a loop of
//! acknowledged control writes, restarted on the same directory, and
//! checked: every acknowledged write is there, the identity, binding and
//! contacts are unchanged, and retrying a request with the same req_id
//! returns the remembered answer without applying it twice.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire::envelope::{RawValue, ReqId};
use capwire::manifest::{
    ChildStatus, ClusterCreate, ClusterList, ConnectIntroduce, CreateArgs, GetConfig,
    IntroduceArgs, NoArgs, SetConfig, SetConfigArgs,
};
use capwire::{Addr, Invite, Keypair, Node, NodeId, Peer};

/// A `capwire node` process.
struct NodeProc {
    child: Child,
    id: NodeId,
    addr: Addr,
    invite: Option<Invite>,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_node(state: &Path, listen: &str, invite: bool) -> NodeProc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_capwire"));
    cmd.args(["node", "--json", "--name", "crash-node", "--listen", listen])
        .arg("--state")
        .arg(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if !invite {
        cmd.arg("--no-invite");
    }
    let mut child = cmd.spawn().expect("capwire node starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    NodeProc {
        child,
        id: v["node_id"].as_str().unwrap().parse().unwrap(),
        addr: v["addrs"][0].as_str().unwrap().parse().unwrap(),
        invite: v["invite"].as_str().map(|i| i.parse().unwrap()),
    }
}

/// A port that is free now (the node is restarted on the same one).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn raw(v: u64) -> RawValue {
    RawValue::encode(&v).unwrap()
}

fn id(s: String) -> ReqId {
    ReqId::try_from(s.as_str()).unwrap()
}

/// A control plane with a fixed identity, bound to the node.
async fn control_plane(key: &Keypair) -> Node {
    Node::builder("crash-cp")
        .keypair(key.clone())
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap()
}

/// Kills the node once `enough` says so, while `writes` runs; returns what
/// the writes returned when the kill stopped them.
async fn kill_during<T: Send + 'static>(
    node: &mut NodeProc,
    enough: impl Fn() -> bool,
    writes: tokio::task::JoinHandle<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !enough() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writes did not get going"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    node.child.kill().unwrap(); // SIGKILL
    node.child.wait().unwrap();
    tokio::time::timeout(Duration::from_secs(30), writes)
        .await
        .expect("the writes end once the node is gone")
        .unwrap()
}

const DEADLINE: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_config_writes_survive_sigkill_and_retries_are_not_applied_twice() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let listen = format!("tcp://127.0.0.1:{}", free_port());
    let mut node = spawn_node(&state, &listen, true);
    let key = Keypair::generate().unwrap();
    let cp = control_plane(&key).await;
    let (peer, reply) = cp
        .connect_invite(node.invite.as_ref().unwrap())
        .await
        .unwrap();
    assert!(reply.is_some(), "bound");
    // The control plane becomes one of the node's durable contacts.
    let added = peer
        .request(
            ConnectIntroduce,
            IntroduceArgs {
                name: "cp".into(),
                node_id: cp.id(),
                addr: cp.local_addrs()[0].to_string(),
            },
        )
        .await
        .unwrap();
    assert!(added.added);

    // Acknowledged writes, one after another, until the node is killed.
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let writes = {
        let (peer, acked) = (peer.clone(), acked.clone());
        tokio::spawn(async move {
            for i in 0u64.. {
                let args = SetConfigArgs {
                    value: raw(i),
                    if_version: None,
                };
                match peer
                    .request_with_id(SetConfig, args, &id(format!("cfg-{i}")), DEADLINE)
                    .await
                {
                    Ok(r) => acked.lock().unwrap().push((i, r.version)),
                    Err(_) => return i,
                }
            }
            unreachable!()
        })
    };
    let count = acked.clone();
    let in_flight = kill_during(&mut node, move || count.lock().unwrap().len() >= 50, writes).await;
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 5,
        "only {} writes before the kill",
        acked.len()
    );
    let (last_i, last_version) = *acked.last().unwrap();
    assert_eq!(in_flight, last_i + 1);
    for (n, (i, v)) in acked.iter().enumerate() {
        assert_eq!(
            (*i, *v),
            (n as u64, n as u64 + 1),
            "each write applied once, in order"
        );
    }

    // Restarted on the same directory and port: the same node.
    let node = spawn_node(&state, &listen, false);
    assert_eq!(node.id, peer.id(), "the identity survives");
    // It dials its durable contact (the control plane) by itself.
    let peer = cp
        .wait_for_peer(node.id, Duration::from_secs(15))
        .await
        .expect("the restarted node dials its contacts");
    // Still bound: controller verbs are answered.
    let config = peer.request(GetConfig, NoArgs {}).await.unwrap();
    let found: u64 = config.value.decode().unwrap();
    eprintln!(
        "config writes acknowledged: {}, last acknowledged value {last_i} (version {last_version}); \
         after restart: value {found}, version {}",
        acked.len(),
        config.version
    );
    assert!(
        found == last_i || found == in_flight,
        "found {found}, acknowledged up to {last_i}"
    );
    assert_eq!(config.version, found + 1);

    // The write that was in flight, retried with its req_id: applied once.
    let retried = peer
        .request_with_id(
            SetConfig,
            SetConfigArgs {
                value: raw(in_flight),
                if_version: None,
            },
            &id(format!("cfg-{in_flight}")),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(retried.version, in_flight + 1);
    // The last acknowledged one, retried: its remembered answer.
    let again = peer
        .request_with_id(
            SetConfig,
            SetConfigArgs {
                value: raw(last_i),
                if_version: None,
            },
            &id(format!("cfg-{last_i}")),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(again.version, last_version);
    let config = peer.request(GetConfig, NoArgs {}).await.unwrap();
    assert_eq!(config.version, in_flight + 1, "no write applied twice");
    assert_eq!(config.value.decode::<u64>().unwrap(), in_flight);
    cp.shutdown().await;
}

async fn list(peer: &Peer) -> capwire::manifest::Roster {
    peer.request(ClusterList, NoArgs {}).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roster_survives_sigkill_during_creates_and_a_retried_create_makes_no_second_child() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let listen = format!("tcp://127.0.0.1:{}", free_port());
    let mut node = spawn_node(&state, &listen, true);
    let key = Keypair::generate().unwrap();
    let cp = control_plane(&key).await;
    let (peer, _) = cp
        .connect_invite(node.invite.as_ref().unwrap())
        .await
        .unwrap();

    let acked: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let creates = {
        let (peer, acked) = (peer.clone(), acked.clone());
        tokio::spawn(async move {
            for i in 0u64.. {
                let args = CreateArgs {
                    name: format!("agent-{i}"),
                    bio: None,
                };
                match peer
                    .request_with_id(ClusterCreate, args, &id(format!("create-{i}")), DEADLINE)
                    .await
                {
                    Ok(m) => acked.lock().unwrap().push((i, m.cid)),
                    Err(_) => return i,
                }
            }
            unreachable!()
        })
    };
    let count = acked.clone();
    let in_flight = kill_during(&mut node, move || count.lock().unwrap().len() >= 8, creates).await;
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 2,
        "only {} creates before the kill",
        acked.len()
    );

    let node = spawn_node(&state, &listen, false);
    assert_eq!(node.id, peer.id());
    let peer = cp.connect(&node.addr, Some(node.id)).await.unwrap();
    // The children come back (the node restarts them), each once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let roster = loop {
        let r = list(&peer).await;
        let running = r.members.iter().all(|m| m.status == ChildStatus::Running);
        if running && r.members.len() >= acked.len() {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "children did not come back: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (i, cid) in &acked {
        let m = roster
            .members
            .iter()
            .find(|m| &m.cid == cid)
            .expect("acknowledged child kept");
        assert_eq!(m.name, format!("agent-{i}"));
        assert!(m.node_id.is_some());
    }
    eprintln!(
        "creates acknowledged: {}; children after restart: {} (in flight at the kill: agent-{in_flight})",
        acked.len(),
        roster.members.len()
    );
    assert!(roster.members.len() <= acked.len() + 1);

    // The create in flight, retried with its req_id: one child of that name.
    let retried = peer
        .request_with_id(
            ClusterCreate,
            CreateArgs {
                name: format!("agent-{in_flight}"),
                bio: None,
            },
            &id(format!("create-{in_flight}")),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(retried.name, format!("agent-{in_flight}"));
    // An acknowledged one, retried: its remembered answer, same child.
    let (i0, cid0) = &acked[0];
    let again = peer
        .request_with_id(
            ClusterCreate,
            CreateArgs {
                name: format!("agent-{i0}"),
                bio: None,
            },
            &id(format!("create-{i0}")),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(&again.cid, cid0);
    let roster = list(&peer).await;
    assert_eq!(roster.members.len(), acked.len() + 1, "{roster:?}");
    let mut names: Vec<&str> = roster.members.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), roster.members.len(), "no name twice");
    cp.shutdown().await;
}
