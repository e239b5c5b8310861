//! The container hosts against a real Docker engine: children as
//! containers (and Swarm services) from the local `capwire:latest` image,
//! on the host's network and loopback ports. Every test removes what it
//! made (containers, services, volumes, by the parent's label), also when
//! it fails. Without a Docker engine the tests skip with one line, unless
//! `CAPWIRE_REQUIRE_DOCKER=1`.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use capwire::envelope::ErrorCode;
use capwire::host::{DockerHost, EngineConfig, SwarmHost};
use capwire::manifest::{
    ChildArgs, ChildStates, ChildStatus, ClusterContact, ClusterCreatePlaced, ClusterList,
    ClusterRemove, ClusterSetMonitoring, ClusterStates, CreatePlacedArgs, Member, NoArgs,
    Placement, RunState, SetMonitoringArgs, verb,
};
use capwire::{ControlEvent, Invite, Node, NodeId, Peer};

verb! {
    /// The `app.agent/echo` every `capwire node` has.
    pub struct AgentEcho: request "app.agent" / "echo", Bootstrap, String => String;
}

/// Args of `app.agent/ask`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AskArgs {
    /// The node to ask (64 hex digits).
    pub peer: String,
    /// What to send its echo.
    pub text: String,
}

verb! {
    /// `app.agent/ask` (controller): the child calls `peer`'s echo.
    pub struct AgentAsk: request "app.agent" / "ask", Controller, AskArgs => String;
}

/// An echo that takes its time: a call to a child that asks it is in
/// flight for as long.
async fn slow_echo(text: String) -> Result<String, capwire::HandlerError> {
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(text)
}

/// `docker ARGS`, its standard output (trimmed) when it succeeded.
fn docker(args: &[&str]) -> Option<String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether a Docker engine answers; panics when one is required and none
/// does.
fn have_docker() -> bool {
    static ANSWERS: OnceLock<bool> = OnceLock::new();
    let answers =
        *ANSWERS.get_or_init(|| docker(&["info", "--format", "{{.ServerVersion}}"]).is_some());
    if !answers {
        assert!(
            std::env::var("CAPWIRE_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "CAPWIRE_REQUIRE_DOCKER=1 and no Docker engine answers"
        );
        eprintln!("skipped: no Docker engine answers (CAPWIRE_REQUIRE_DOCKER=1 requires one)");
    }
    answers
}

/// Builds the children's image once per run (kept when the binary is the
/// same as last time).
fn image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Command::new(env!("CARGO_BIN_EXE_capwire"))
            .args(["image", "build", "--tag", "capwire:latest"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "capwire image build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Removes every container, service and volume labelled for `parent`.
fn clean(parent: &str) {
    let filter = format!("label=capwire.parent={parent}");
    for _ in 0..50 {
        let services = docker(&["service", "ls", "-q", "--filter", &filter]).unwrap_or_default();
        for s in services.split_whitespace() {
            let _ = docker(&["service", "rm", s]);
        }
        let containers = docker(&["ps", "-aq", "--filter", &filter]).unwrap_or_default();
        for c in containers.split_whitespace() {
            let _ = docker(&["rm", "-f", c]);
        }
        let volumes = docker(&["volume", "ls", "-q", "--filter", &filter]).unwrap_or_default();
        for v in volumes.split_whitespace() {
            let _ = docker(&["volume", "rm", "-f", v]);
        }
        if left(parent) == (0, 0, 0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// (containers, services, volumes) labelled for `parent`.
fn left(parent: &str) -> (usize, usize, usize) {
    let filter = format!("label=capwire.parent={parent}");
    let count = |args: &[&str]| docker(args).unwrap_or_default().split_whitespace().count();
    (
        count(&["ps", "-aq", "--filter", &filter]),
        count(&["service", "ls", "-q", "--filter", &filter]),
        count(&["volume", "ls", "-q", "--filter", &filter]),
    )
}

/// Removes what was made for a parent when dropped, whatever the test did.
struct Cleanup(String);

impl Cleanup {
    fn new(parent: NodeId) -> Self {
        let c = Self(parent.to_string());
        clean(&c.0);
        c
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        clean(&self.0);
    }
}

async fn eventually(what: &str, secs: u64, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn member(peer: &Peer, cid: &str) -> Option<Member> {
    let r = peer.request(ClusterList, NoArgs {}).await.unwrap();
    r.members.into_iter().find(|m| m.cid == cid)
}

async fn state(peer: &Peer, cid: &str) -> capwire::manifest::ChildState {
    let s: ChildStates = peer.request(ClusterStates, NoArgs {}).await.unwrap();
    s.children.into_iter().find(|c| c.cid == cid).unwrap()
}

/// A parent with `host`, a control plane bound to it, and its cleanup.
async fn parent_and_cp(host: impl capwire::host::Host) -> (Node, Node, Peer, Cleanup) {
    parent_and(host, Node::builder("cp")).await
}

/// As [`parent_and_cp`], the control plane built from `cp`.
async fn parent_and(
    host: impl capwire::host::Host,
    cp: capwire::NodeBuilder,
) -> (Node, Node, Peer, Cleanup) {
    let parent = Node::builder("parent")
        .listen("127.0.0.1:0".parse().unwrap())
        .host(host)
        .start()
        .await
        .unwrap();
    let cleanup = Cleanup::new(parent.id());
    let cp = cp
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let invite = parent.invite(Some(cp.id())).unwrap();
    let (peer, _) = cp.connect_invite(&invite).await.unwrap();
    (parent, cp, peer, cleanup)
}

fn placed(name: &str, placement: Placement) -> CreatePlacedArgs {
    CreatePlacedArgs {
        name: name.into(),
        bio: Some(format!("{name}, in a container")),
        placement,
    }
}

/// The control plane watches the child and binds it: a peer of the child.
async fn bind_child(cp: &Node, peer: &Peer, cid: &str) -> Peer {
    peer.request(
        ClusterSetMonitoring,
        SetMonitoringArgs {
            cid: cid.into(),
            enabled: true,
        },
    )
    .await
    .unwrap();
    let contact = peer
        .request(ClusterContact, ChildArgs { cid: cid.into() })
        .await
        .unwrap();
    let invite: Invite = contact.invite.parse().unwrap();
    let (child, reply) = cp.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some(), "bound");
    child
}

fn inspect(container: &str, format: &str) -> String {
    docker(&["inspect", "--format", format, container]).unwrap_or_default()
}

/// SIGKILL to the container's process from outside the engine, as a
/// crash would (an engine's own kill counts as stopping it by hand, which
/// no restart policy undoes).
fn crash(container: &str) {
    let pid = inspect(container, "{{.State.Pid}}");
    let status = Command::new("kill").args(["-9", &pid]).status().unwrap();
    assert!(status.success(), "kill -9 {pid}");
}

fn container_of(parent: &Node, cid: &str) -> String {
    let filter_p = format!("label=capwire.parent={}", parent.id());
    let filter_c = format!("label=capwire.cid={cid}");
    docker(&["ps", "-aq", "--filter", &filter_p, "--filter", &filter_c]).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_limited_containers_end_to_end() {
    if !have_docker() {
        return;
    }
    image();
    let (parent, cp, peer, cleanup) = parent_and_cp(DockerHost::new(EngineConfig::default())).await;
    let placement = Placement {
        memory: Some(64 << 20),
        cpus_milli: Some(500),
        pids: Some(64),
        restarts: Some(2),
        labels: vec!["team=research".into()],
        ..Placement::default()
    };
    let child = peer
        .request(ClusterCreatePlaced, placed("worker", placement))
        .await
        .unwrap();
    assert_eq!(child.status, ChildStatus::Running);
    assert!(child.caps.iter().any(|c| c.starts_with("app.agent@")));
    assert!(
        child.addrs[0].starts_with("tcp://127.0.0.1:"),
        "{:?}",
        child.addrs
    );

    // What the engine was told: labels, limits, the sandbox.
    let id = container_of(&parent, &child.cid);
    assert!(!id.is_empty(), "one container");
    assert_eq!(
        inspect(&id, "{{.HostConfig.Memory}}"),
        (64u64 << 20).to_string()
    );
    assert_eq!(inspect(&id, "{{.HostConfig.NanoCpus}}"), "500000000");
    assert_eq!(inspect(&id, "{{.HostConfig.PidsLimit}}"), "64");
    assert_eq!(inspect(&id, "{{.HostConfig.ReadonlyRootfs}}"), "true");
    assert_eq!(inspect(&id, "{{.HostConfig.CapDrop}}"), "[ALL]");
    assert_eq!(
        inspect(&id, "{{.HostConfig.SecurityOpt}}"),
        "[no-new-privileges]"
    );
    assert_eq!(inspect(&id, "{{.HostConfig.NetworkMode}}"), "host");
    assert_eq!(
        inspect(
            &id,
            "{{.HostConfig.RestartPolicy.Name}}:{{.HostConfig.RestartPolicy.MaximumRetryCount}}"
        ),
        "on-failure:2"
    );
    assert_eq!(inspect(&id, "{{.Config.User}}"), "10001:10001");
    assert_eq!(
        inspect(&id, "{{index .Config.Labels \"capwire.name\"}}"),
        "worker"
    );
    assert_eq!(
        inspect(&id, "{{index .Config.Labels \"team\"}}"),
        "research"
    );
    assert_eq!(
        inspect(&id, "{{index .Config.Labels \"capwire.parent\"}}"),
        parent.id().to_string()
    );

    // The control plane binds it and calls it, as any child.
    let child_peer = bind_child(&cp, &peer, &child.cid).await;
    assert_eq!(
        child_peer.request(AgentEcho, "hi".into()).await.unwrap(),
        "worker: hi"
    );
    let s = state(&peer, &child.cid).await;
    assert_eq!(s.state, RunState::Running);

    // Removed: its container and its volume are gone.
    peer.request(
        ClusterRemove,
        ChildArgs {
            cid: child.cid.clone(),
        },
    )
    .await
    .unwrap();
    assert!(member(&peer, &child.cid).await.is_none());
    assert_eq!(left(&cleanup.0), (0, 0, 0), "nothing left");
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_mid_call_fails_the_call_and_comes_back_as_itself() {
    if !have_docker() {
        return;
    }
    image();
    let slow = capwire::Capability::new("app.agent", "1.0.0")
        .unwrap()
        .handle(AgentEcho, slow_echo);
    let cp = Node::builder("cp").capability(slow);
    let (parent, cp, peer, _cleanup) =
        parent_and(DockerHost::new(EngineConfig::default()), cp).await;
    let mut events = cp.control_events();
    let child = peer
        .request(
            ClusterCreatePlaced,
            placed(
                "sturdy",
                Placement {
                    restarts: Some(2),
                    ..Placement::default()
                },
            ),
        )
        .await
        .unwrap();
    let child_peer = bind_child(&cp, &peer, &child.cid).await;
    // The child asks the control plane's slow echo: the call is in flight.
    let asking = child_peer.clone();
    let ask = AskArgs {
        peer: cp.id().to_string(),
        text: "still there?".into(),
    };
    let call = tokio::spawn(async move { asking.request(AgentAsk, ask).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    if call.is_finished() {
        panic!("the call is not under way: {:?}", call.await);
    }

    let id = container_of(&parent, &child.cid);
    crash(&id);
    let killed = Instant::now();
    // The caller hears of it at once: a typed error, no hang.
    let failed = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("an answer within 5 s of the kill")
        .unwrap()
        .unwrap_err();
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "{:?}",
        killed.elapsed()
    );
    assert!(matches!(failed, capwire::CallError::PeerLost), "{failed:?}");
    eprintln!("the call failed with: {failed}");

    // The restart policy brings it back, as itself; the roster showed the exit.
    eventually("the child runs again", 60, async || {
        let s = state(&peer, &child.cid).await;
        s.state == RunState::Running && s.restarts >= 1
    })
    .await;
    let s = state(&peer, &child.cid).await;
    assert_eq!(s.restarts, 1);
    let m = member(&peer, &child.cid).await.unwrap();
    assert_eq!(m.status, ChildStatus::Running);
    assert_eq!(m.node_id, child.node_id, "the same node id (its volume)");
    let mut saw_exit = false;
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
        if let ControlEvent::Roster { roster, .. } = e {
            saw_exit |= roster
                .members
                .iter()
                .any(|m| m.cid == child.cid && m.status == ChildStatus::Exited);
        }
    }
    assert!(saw_exit, "a roster push showed the child exited");

    // Calls work again (it kept its binding: the control plane dials it).
    let invite: Invite = peer
        .request(
            ClusterContact,
            ChildArgs {
                cid: child.cid.clone(),
            },
        )
        .await
        .unwrap()
        .invite
        .parse()
        .unwrap();
    let again = cp.connect(&invite.addrs[0], child.node_id).await.unwrap();
    assert_eq!(
        again.request(AgentEcho, "back".into()).await.unwrap(),
        "sturdy: back"
    );
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_over_its_memory_limit_is_reported_oom_killed() {
    if !have_docker() {
        return;
    }
    image();
    let mut cfg = EngineConfig::default();
    cfg.args = vec!["--dangerous-hog-memory-for-testing=512m".into()];
    let (parent, cp, peer, _cleanup) = parent_and_cp(DockerHost::new(cfg)).await;
    let child = peer
        .request(
            ClusterCreatePlaced,
            placed(
                "greedy",
                Placement {
                    memory: Some(48 << 20),
                    restarts: Some(0),
                    ..Placement::default()
                },
            ),
        )
        .await
        .unwrap();
    eventually("the child is reported killed for memory", 60, async || {
        let s = state(&peer, &child.cid).await;
        s.state == RunState::Exited && s.oom_killed
    })
    .await;
    let s = state(&peer, &child.cid).await;
    assert_eq!(s.exit_code, Some(137));
    assert!(s.detail.contains("memory"), "{}", s.detail);
    let m = member(&peer, &child.cid).await.unwrap();
    assert_eq!(
        m.status,
        ChildStatus::Exited,
        "stopped and reported, not restarted"
    );
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsense_limits_are_refused_before_anything_is_made() {
    if !have_docker() {
        return;
    }
    let (parent, cp, peer, cleanup) = parent_and_cp(DockerHost::new(EngineConfig::default())).await;
    let bad = [
        Placement {
            memory: Some(0),
            ..Placement::default()
        },
        Placement {
            cpus_milli: Some(0),
            ..Placement::default()
        },
        Placement {
            pids: Some(0),
            ..Placement::default()
        },
        Placement {
            image: Some("Not An Image!".into()),
            ..Placement::default()
        },
        Placement {
            labels: vec!["capwire.parent=someone-else".into()],
            ..Placement::default()
        },
    ];
    for (i, p) in bad.into_iter().enumerate() {
        let e = peer
            .request(ClusterCreatePlaced, placed(&format!("bad{i}"), p.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(&ErrorCode::BadArgs), "{p:?}: {e}");
    }
    // Negative CPUs do not even decode (the wire's count is unsigned).
    let args = capwire::envelope::RawValue::encode(&serde_json::json!({
        "name": "negative", "bio": null, "placement": {"cpus_milli": -500}
    }))
    .unwrap();
    let e = peer
        .call_raw(
            "core.cluster",
            "create_placed",
            &args,
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&ErrorCode::BadArgs), "{e}");
    assert!(
        peer.request(ClusterList, NoArgs {})
            .await
            .unwrap()
            .members
            .is_empty()
    );
    assert_eq!(left(&cleanup.0), (0, 0, 0), "nothing made");
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_engine_or_no_image_fails_clearly_and_makes_nothing() {
    if !have_docker() {
        return;
    }
    // An engine that does not answer.
    let mut cfg = EngineConfig::default();
    cfg.socket = Some("/nonexistent/docker.sock".into());
    let (parent, cp, peer, cleanup) = parent_and_cp(DockerHost::new(cfg)).await;
    let e = peer
        .request(ClusterCreatePlaced, placed("nowhere", Placement::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&ErrorCode::Unavailable), "{e}");
    assert!(e.to_string().contains("no Docker engine answers"), "{e}");
    assert!(
        peer.request(ClusterList, NoArgs {})
            .await
            .unwrap()
            .members
            .is_empty()
    );
    assert_eq!(left(&cleanup.0), (0, 0, 0));
    parent.shutdown().await;
    cp.shutdown().await;

    // An image that does not exist.
    let (parent, cp, peer, cleanup) = parent_and_cp(DockerHost::new(EngineConfig::default())).await;
    let e = peer
        .request(
            ClusterCreatePlaced,
            placed(
                "imageless",
                Placement {
                    image: Some("capwire-absent:never".into()),
                    ..Placement::default()
                },
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&ErrorCode::Unavailable), "{e}");
    assert!(e.to_string().contains("capwire image build"), "{e}");
    assert!(
        peer.request(ClusterList, NoArgs {})
            .await
            .unwrap()
            .members
            .is_empty()
    );
    assert_eq!(left(&cleanup.0), (0, 0, 0), "no container, no volume");
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_child_whose_container_is_gone_succeeds() {
    if !have_docker() {
        return;
    }
    image();
    let (parent, cp, peer, cleanup) = parent_and_cp(DockerHost::new(EngineConfig::default())).await;
    let child = peer
        .request(
            ClusterCreatePlaced,
            placed("fleeting", Placement::default()),
        )
        .await
        .unwrap();
    let id = container_of(&parent, &child.cid);
    assert!(docker(&["rm", "-f", &id]).is_some());
    peer.request(
        ClusterRemove,
        ChildArgs {
            cid: child.cid.clone(),
        },
    )
    .await
    .unwrap();
    assert!(
        member(&peer, &child.cid).await.is_none(),
        "the roster is clean"
    );
    assert_eq!(left(&cleanup.0), (0, 0, 0), "its volume went too");
    parent.shutdown().await;
    cp.shutdown().await;
}

/// A process killed when dropped, whatever the test did.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `capwire node --host docker` process with its state in `dir`; its
/// node id, first address and invite.
fn spawn_parent(dir: &std::path::Path) -> (Proc, String, String, Option<String>) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args([
            "node",
            "--host",
            "docker",
            "--json",
            "--listen",
            "tcp://127.0.0.1:0",
        ])
        .arg(format!("--state={}", dir.join("state").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    (
        Proc(child),
        v["node_id"].as_str().unwrap().to_owned(),
        v["addrs"][0].as_str().unwrap().to_owned(),
        v["invite"].as_str().map(str::to_owned),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_killed_and_restarted_adopts_its_containers() {
    if !have_docker() {
        return;
    }
    image();
    let dir = tempfile::tempdir().unwrap();
    let (proc, id, _, invite) = spawn_parent(dir.path());
    let parent_id = NodeId::try_from(id.as_str()).unwrap();
    let cleanup = Cleanup::new(parent_id);
    let cp = Node::builder("cp")
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let invite: Invite = invite.unwrap().parse().unwrap();
    let (peer, _) = cp.connect_invite(&invite).await.unwrap();
    let mut made = Vec::new();
    for name in ["a", "b"] {
        made.push(
            peer.request(ClusterCreatePlaced, placed(name, Placement::default()))
                .await
                .unwrap(),
        );
    }
    let filter = format!("label=capwire.parent={parent_id}");
    let before = docker(&["ps", "-q", "--no-trunc", "--filter", &filter]).unwrap();
    assert_eq!(before.split_whitespace().count(), 2);
    // A container the roster does not have (as a crash mid-create leaves).
    let orphan = format!("capwire-{}-c99", &id[..16]);
    docker(&[
        "create",
        "--name",
        &orphan,
        "--label",
        &format!("capwire.parent={parent_id}"),
        "--label",
        "capwire.cid=c99",
        "capwire:latest",
    ])
    .unwrap();

    // kill -9: the containers run on.
    drop(proc);
    let (proc, again, addr, _) = spawn_parent(dir.path());
    assert_eq!(again, id);
    let peer = cp
        .connect(&addr.parse().unwrap(), Some(parent_id))
        .await
        .expect("the restarted parent is reached");
    // The same containers, adopted: none made twice, the orphan gone.
    eventually("the orphan is removed", 30, async || {
        docker(&[
            "ps",
            "-aq",
            "--filter",
            "label=capwire.cid=c99",
            "--filter",
            &filter,
        ])
        .unwrap_or_default()
        .is_empty()
    })
    .await;
    let after = docker(&["ps", "-q", "--no-trunc", "--filter", &filter]).unwrap();
    let mut b: Vec<&str> = before.split_whitespace().collect();
    let mut a: Vec<&str> = after.split_whitespace().collect();
    b.sort_unstable();
    a.sort_unstable();
    assert_eq!(a, b, "the same containers, none made again");
    for m in &made {
        let now = member(&peer, &m.cid).await.unwrap();
        assert_eq!(now.status, ChildStatus::Running);
        assert_eq!(now.node_id, m.node_id);
    }
    // It speaks to them again: a bind opened through the new session.
    let child = bind_child(&cp, &peer, &made[0].cid).await;
    assert_eq!(
        child.request(AgentEcho, "hi".into()).await.unwrap(),
        "a: hi"
    );
    drop(proc);
    cp.shutdown().await;
    drop(cleanup);
}

/// Leaves the swarm it joined, when dropped.
struct Swarm {
    joined: bool,
}

impl Swarm {
    fn ensure() -> Option<Self> {
        let state = docker(&["info", "--format", "{{.Swarm.LocalNodeState}}"])?;
        if state == "active" {
            return Some(Self { joined: false });
        }
        docker(&["swarm", "init", "--advertise-addr", "127.0.0.1"])?;
        Some(Self { joined: true })
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        if self.joined {
            let _ = docker(&["swarm", "leave", "--force"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swarm_service_killed_comes_back_as_itself() {
    if !have_docker() {
        return;
    }
    image();
    let Some(_swarm) = Swarm::ensure() else {
        panic!("no one-node swarm could be made");
    };
    let (parent, cp, peer, cleanup) = parent_and_cp(SwarmHost::new(EngineConfig::default())).await;
    let child = peer
        .request(
            ClusterCreatePlaced,
            placed(
                "serviced",
                Placement {
                    memory: Some(64 << 20),
                    cpus_milli: Some(500),
                    restarts: Some(2),
                    ..Placement::default()
                },
            ),
        )
        .await
        .unwrap();
    assert_eq!(child.status, ChildStatus::Running);
    let filter = format!("label=capwire.parent={}", parent.id());
    let service = docker(&["service", "ls", "-q", "--filter", &filter]).unwrap();
    assert_eq!(service.split_whitespace().count(), 1, "one service");
    assert_eq!(
        docker(&["service", "inspect", "--format", "{{.Spec.TaskTemplate.Resources.Limits.MemoryBytes}} {{.Spec.TaskTemplate.RestartPolicy.Condition}} {{.Spec.Mode.Replicated.Replicas}}", &service]).unwrap(),
        format!("{} on-failure 1", 64u64 << 20)
    );
    let child_peer = bind_child(&cp, &peer, &child.cid).await;
    assert_eq!(
        child_peer.request(AgentEcho, "hi".into()).await.unwrap(),
        "serviced: hi"
    );

    // Its container killed: Swarm starts another, the child is itself.
    let id = container_of(&parent, &child.cid);
    crash(&id);
    eventually("the service's child runs again", 90, async || {
        let s = state(&peer, &child.cid).await;
        s.state == RunState::Running && s.restarts >= 1
    })
    .await;
    let m = member(&peer, &child.cid).await.unwrap();
    assert_eq!(m.status, ChildStatus::Running);
    assert_eq!(m.node_id, child.node_id, "the same node id (its volume)");

    peer.request(
        ClusterRemove,
        ChildArgs {
            cid: child.cid.clone(),
        },
    )
    .await
    .unwrap();
    assert_eq!(left(&cleanup.0), (0, 0, 0), "service and volume gone");
    parent.shutdown().await;
    cp.shutdown().await;
}
