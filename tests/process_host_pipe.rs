//! The process host against children that break the pipe protocol: each
//! child is a real process, a small shell script that plays the part of a
//! misbehaving `capwire node --supervised`. A child that writes a line
//! without end, writes something that is not JSON, reports a malformed
//! controller, never says it is ready, or closes its output and keeps
//! running is killed, reaped, forgotten by the host and reported as exited;
//! the parent's memory stays bounded meanwhile. The other way round, a
//! real supervised node stops when its parent breaks the protocol.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capwire::Node;
use capwire::host::{ChildSpec, Host, HostEvent, ProcessHost};
use capwire::manifest::{ChildStatus, ClusterCreate, ClusterList, CreateArgs, NoArgs};
use tokio::sync::mpsc;

/// A key for the scripts' ready lines (any 32 bytes are a node id).
const KEY: &str = "1111111111111111111111111111111111111111111111111111111111111111";

/// The ready line every script prints first.
fn ready_line() -> String {
    format!(r#"{{"event":"ready","node_id":"{KEY}","addrs":["tcp://127.0.0.1:9"],"caps":[]}}"#)
}

/// Writes `body` as an executable shell script in `dir`.
fn script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("child.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A script that says it is ready, then runs `then`.
fn ready_then(dir: &Path, then: &str) -> PathBuf {
    script(dir, &format!("echo '{}'\n{then}", ready_line()))
}

/// A script that says it is ready, then runs `first` the first time it
/// runs, and behaves every later time: it stays quiet until its input
/// closes.
fn ready_then_once(dir: &Path, first: &str) -> PathBuf {
    let marker = dir.join("ran-once");
    let then = format!(
        "if [ -e '{m}' ]; then while read -r _; do :; done; exit 0; fi\ntouch '{m}'\n{first}",
        m = marker.display()
    );
    ready_then(dir, &then)
}

/// Keeps the script alive without reading its input (a builtin loop, so
/// that killing the shell leaves at most a one-second `sleep` behind).
const LINGER: &str = "while :; do sleep 1; done";

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
        // A zombie has an empty command line: it is gone already.
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn spec(cid: &str) -> ChildSpec {
    ChildSpec {
        cid: cid.into(),
        name: "misbehaving".into(),
        bio: String::new(),
        addrs: Vec::new(),
        ..ChildSpec::default()
    }
}

/// Waits for the `Exited` event of `cid` (other events are returned too,
/// in order, before it).
async fn exited(
    events: &mut mpsc::Receiver<HostEvent>,
    cid: &str,
    within: Duration,
) -> (String, Vec<HostEvent>) {
    let mut before = Vec::new();
    loop {
        let e = tokio::time::timeout(within, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no exit of {cid} within {within:?}; saw {before:?}"))
            .expect("the host's events ended");
        match e {
            HostEvent::Exited { cid: c, detail } if c == cid => return (detail, before),
            other => before.push(other),
        }
    }
}

async fn gone(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids_with(needle).is_empty() {
        assert!(Instant::now() < deadline, "the child {needle} still runs");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_writing_without_end_of_line_is_killed_and_the_parent_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    // 100 MiB without a newline, then silence with the output open.
    let program = ready_then(
        dir.path(),
        &format!("head -c 104857600 /dev/zero\n{LINGER}"),
    );
    let parent = Node::builder("parent")
        .listen("127.0.0.1:0".parse().unwrap())
        .host(ProcessHost::new(&program, &base))
        .start()
        .await
        .unwrap();
    let cp = Node::builder("cp").start().await.unwrap();
    let invite = parent.invite(Some(cp.id())).unwrap();
    let (peer, _) = cp.connect_invite(&invite).await.unwrap();

    let before = rss_kib();
    let started = Instant::now();
    let child = peer
        .request(
            ClusterCreate,
            CreateArgs {
                name: "flood".into(),
                bio: None,
            },
        )
        .await
        .unwrap();
    let needle = base.join(&child.cid).to_string_lossy().into_owned();
    // The roster shows it exited, soon: the host did not wait for the
    // line's end.
    loop {
        let roster = peer.request(ClusterList, NoArgs {}).await.unwrap();
        let m = roster.members.iter().find(|m| m.cid == child.cid).unwrap();
        if m.status == ChildStatus::Exited {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the flooding child is not reported exited (parent grew by {} KiB)",
            rss_kib().saturating_sub(before)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    gone(&needle).await;
    let grown = rss_kib().saturating_sub(before);
    assert!(
        grown < 32 * 1024,
        "the parent grew by {grown} KiB reading one child"
    );
    parent.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_writing_what_is_not_json_is_killed_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let program = ready_then_once(dir.path(), &format!("echo 'not json'\n{LINGER}"));
    let host = ProcessHost::new(&program, &base);
    let mut events = host.events().unwrap();
    host.start(spec("c1")).await.unwrap();
    let (detail, _) = exited(&mut events, "c1", Duration::from_secs(10)).await;
    assert!(detail.contains("pipe protocol"), "{detail}");
    assert!(detail.contains("JSON"), "{detail}");
    let needle = base.join("c1").to_string_lossy().into_owned();
    gone(&needle).await;
    // Forgotten: starting it again starts a new process; stopping works.
    host.start(spec("c1")).await.unwrap();
    assert_eq!(pids_with(&needle).len(), 1, "a new process");
    host.stop("c1").await.unwrap();
    gone(&needle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_reporting_a_malformed_controller_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let bad = [
        r#"{"event":"monitoring","status":"on","controller":"not-a-key"}"#,
        r#"{"event":"monitoring","status":"on","controller":7}"#,
        r#"{"event":"monitoring","status":"on"}"#,
        r#"{"event":"monitoring","status":"sideways","controller":null}"#,
    ];
    for (i, line) in bad.iter().enumerate() {
        let cid = format!("c{i}");
        let sub = dir.path().join(&cid);
        std::fs::create_dir_all(&sub).unwrap();
        let program = ready_then(&sub, &format!("echo '{line}'\n{LINGER}"));
        let host = ProcessHost::new(&program, &base);
        let mut events = host.events().unwrap();
        host.start(spec(&cid)).await.unwrap();
        let (detail, before) = exited(&mut events, &cid, Duration::from_secs(10)).await;
        assert!(detail.contains("pipe protocol"), "{line}: {detail}");
        assert!(
            before.is_empty(),
            "{line}: a malformed report is no monitoring change: {before:?}"
        );
        gone(&base.join(&cid).to_string_lossy()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_closes_its_output_and_keeps_running_is_killed_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let program = ready_then_once(dir.path(), &format!("exec 1>&-\n{LINGER}"));
    let host = ProcessHost::new(&program, &base);
    let mut events = host.events().unwrap();
    let needle = base.join("c1").to_string_lossy().into_owned();
    host.start(spec("c1")).await.unwrap();
    let (detail, _) = exited(&mut events, "c1", Duration::from_secs(15)).await;
    assert!(detail.contains("closed its output"), "{detail}");
    gone(&needle).await;
    // A later start starts a new process (which behaves), a later stop
    // still succeeds.
    host.start(spec("c1")).await.unwrap();
    assert_eq!(pids_with(&needle).len(), 1, "a new process");
    host.stop("c1").await.unwrap();
    gone(&needle).await;
    // Its second life ended by the stop: no exit is reported for it.
    let late = tokio::time::timeout(Duration::from_millis(500), events.recv()).await;
    assert!(
        !matches!(late, Ok(Some(HostEvent::Exited { .. }))),
        "{late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_never_says_ready_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let program = script(dir.path(), LINGER);
    let host = ProcessHost::new(&program, &base).ready_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), host.start(spec("c1")))
        .await
        .expect("the start gave up by itself");
    let e = result.unwrap_err();
    assert!(e.to_string().contains("ready"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    gone(&base.join("c1").to_string_lossy()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_first_line_has_no_end_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("children");
    let program = script(dir.path(), &format!("head -c 1048576 /dev/zero\n{LINGER}"));
    let host = ProcessHost::new(&program, &base);
    let result = tokio::time::timeout(Duration::from_secs(20), host.start(spec("c1")))
        .await
        .expect("the start gave up by itself");
    let e = result.unwrap_err();
    assert!(e.to_string().contains("pipe protocol"), "{e}");
    gone(&base.join("c1").to_string_lossy()).await;
}

/// Starts a real `capwire node --supervised` and reads its ready line;
/// its stdin stays open.
async fn supervised_node(
    dir: &Path,
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_capwire"))
        .arg("node")
        .arg(format!("--state={}", dir.display()))
        .args(["--supervised", "--listen=tcp://127.0.0.1:0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("a line from the node")
            .unwrap()
            .expect("the node's output ended")
    };
    let ready = next().await;
    assert!(ready.contains(r#""event":"ready""#), "{ready}");
    let state = next().await;
    assert!(
        state.contains(r#""controller":null"#) && state.contains(r#""status":"off""#),
        "its monitoring state follows: {state}"
    );
    (child, stdin, lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervised_node_stops_when_its_parent_breaks_the_pipe_protocol() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let breaches: [&[u8]; 3] = [
        // 1 MiB without a newline: the node does not wait for one.
        &[b'x'; 1 << 20],
        b"not a request\n",
        b"\xff\xfe\n",
    ];
    for (i, breach) in breaches.into_iter().enumerate() {
        let (mut child, mut stdin, _lines) = supervised_node(&dir.path().join(i.to_string())).await;
        // The node may stop before it has read everything.
        let _ = stdin.write_all(breach).await;
        let _ = stdin.flush().await;
        // Its input stays open: only the breach can stop it.
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .unwrap_or_else(|_| panic!("breach {i}: the node still runs"))
            .unwrap();
        assert!(status.success(), "breach {i}: {status}");
        drop(stdin);
    }
}
