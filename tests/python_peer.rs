//! A second, independent Noise stack against a real `capwire node`:
//! `tests/python/peer.py`, written from WIRE.md alone on Python's
//! `noiseprotocol` and `cbor2`, handshakes, reads the hello, calls,
//! is denied, binds, notifies and closes (WIRE.md, Interoperability).
//! `tests/python/peer_v2.py`, on the same transport, agrees on protocol 2
//! and streams with credit (WIRE.md 4.1, 4.9), and checks that a
//! version-1 session is still served as version 1.
//! `tests/python/peer_tasks.py`, on peer_v2.py's session, submits and
//! follows tasks through `core.tasks` (WIRE.md 4.10) as their submitter, a
//! stranger and the control plane, and in a second test across a kill and
//! restart of the node on the same state directory.
//!
//! The packages go into the tests' virtual environment (`tests/pyenv`).
//! Without Python the test fails, unless `CAPWIRE_SKIP_PYTHON=1` says to
//! skip it.

mod pyenv;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pyenv::{python, repo};

/// Kills the child when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PEER_DEADLINE: Duration = Duration::from_secs(120);

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// What one run of a peer script against a fresh `capwire node` printed.
struct PeerRun {
    stdout: String,
    report: String,
}

/// A running `capwire node` and what its start line said.
struct Node {
    child: Killed,
    log: PathBuf,
    addr: String,
    node_id: String,
    invite: String,
}

/// Starts `capwire node` on a free port with the state directory `state`,
/// its log in `log`.
fn start_node(state: &Path, log: &Path) -> Node {
    let mut child = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["node", "--json", "--listen", "127.0.0.1:0", "--state"])
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("a log file"))
        .spawn()
        .expect("capwire node starts");
    let stdout = child.stdout.take().expect("stdout");
    let child = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the node prints its start line");
    let start: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}\n{}", tail(log)));
    let field = |name: &str| {
        start[name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_owned()
    };
    Node {
        addr: start["addrs"][0].as_str().expect("an address").to_owned(),
        node_id: field("node_id"),
        invite: field("invite"),
        log: log.to_owned(),
        child,
    }
}

/// Runs `script` (in tests/python) with the node's address and id and
/// `args`, and returns what it printed once it exited 0 with the node
/// still up.
fn run_script(python: &Path, script: &str, node: &mut Node, args: &[String]) -> PeerRun {
    let mut peer = Command::new(python)
        .arg(repo().join("tests/python").join(script))
        .args([&node.addr, &node.node_id])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the peer script starts");
    let mut out = peer.stdout.take().expect("stdout");
    let mut err = peer.stderr.take().expect("stderr");
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }),
    );
    let mut peer = Killed(peer);
    let deadline = Instant::now() + PEER_DEADLINE;
    let status = loop {
        if let Some(status) = peer.0.try_wait().expect("the peer's status") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(peer);
    let stdout = readers.0.join().expect("stdout read");
    let stderr = readers.1.join().expect("stderr read");
    let node_alive = node
        .child
        .0
        .try_wait()
        .expect("the node's status")
        .is_none();
    let report = format!(
        "{script} {args:?} stdout:\n{stdout}\n{script} stderr:\n{stderr}\nnode log:\n{}",
        tail(&node.log)
    );
    let status = status.unwrap_or_else(|| panic!("{script} ran over {PEER_DEADLINE:?}\n{report}"));
    assert!(status.success(), "{script}: {status}\n{report}");
    assert!(node_alive, "the node exited during the run\n{report}");
    PeerRun { stdout, report }
}

/// Starts a `capwire node`, runs `script` (in tests/python) with the node's
/// address and id and the `extra` arguments `args` makes from its invite,
/// and returns what it printed once it exited 0 with the node still up.
/// `None` when the test is to be skipped.
fn run_peer(script: &str, args: impl Fn(&str) -> Vec<String>) -> Option<PeerRun> {
    let python = python()?;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut node = start_node(&dir.path().join("state"), &dir.path().join("node.log"));
    let args = args(&node.invite);
    Some(run_script(&python, script, &mut node, &args))
}

/// Every line is a check that passed, each of `expected` is among them,
/// and `last` closes the output.
fn assert_checks(run: &PeerRun, expected: &[&str], last: &str) {
    let PeerRun { stdout, report } = run;
    for expected in expected {
        assert!(
            stdout.lines().any(|l| l.starts_with(expected)),
            "no line {expected:?}\n{report}"
        );
    }
    assert_eq!(stdout.lines().last(), Some(last), "{report}");
    assert!(
        stdout.lines().all(|l| l.starts_with("ok   ") || l == last),
        "{report}"
    );
}

#[test]
fn an_independent_python_peer_speaks_wire_md_with_a_real_node() {
    let started = Instant::now();
    let Some(run) = run_peer("peer.py", |invite| vec![invite.to_owned()]) else {
        return;
    };
    assert_checks(
        &run,
        &[
            "ok   vectors: ",
            "ok   handshake with prologue capwire/2 fails at message 2",
            "ok   a first record that is not a hello -> close frame protocol_error, then CLOSE 0",
            "ok   handshake: Noise_XX_25519_ChaChaPoly_BLAKE2s, prologue capwire/1",
            "ok   hello: protocol 1, ",
            "ok   app.agent/echo -> 'capwire-node: hello from python'",
            "ok   app.agent/echo of 200000 bytes: split records (FIRST/NEXT) both ways",
            "ok   keepalives taken; app.agent/nope -> unknown_verb",
            "ok   core.configuration/get_config before bind -> unauthorized",
            "ok   core.monitoring/bind with a wrong code -> bind_failed",
            "ok   core.monitoring/bind with the invite's code -> bound",
            "ok   later hello: monitoring \"on\"",
            "ok   core.configuration/get_config as the control plane -> {'value': None, 'version': 0}",
            "ok   core.cluster/roster notification: nothing came back",
            "ok   close: sent close frame + CLOSE 0",
        ],
        "pypeer: all checks passed",
    );
    eprintln!("python peer: whole test {:?}", started.elapsed());
}

#[test]
fn the_python_peer_speaks_protocol_2_streams_with_a_real_node() {
    let started = Instant::now();
    let wire_md = repo().join("WIRE.md").display().to_string();
    let Some(run) = run_peer("peer_v2.py", |_| vec![wire_md.clone()]) else {
        return;
    };
    assert_checks(
        &run,
        &[
            "ok   4.9 worked example: control, credit, item, response bytes as printed (57, 40, 31, 36)",
            "ok   hellos: protocol 1 with the version-1 view (no stream verb, core.protocol major >= 2, \
             params 'version-1 view'), then protocol 2 at the same epoch ",
            "ok   core.protocol/versions -> {'versions': [1, 2, 3]}",
            "ok   stream app.agent/tell of ",
            "ok   byte credit: 100 more items but bytes for 3 items and all but one byte of the 4th: 3 items",
            "ok   item credit: bytes to spare, items left 96: 96 items, then nothing",
            "ok   two grants of 2^32-1 items and bytes: the other ",
            "ok   streams refused or ended by the node: bad_args (no item), too_large",
            "ok   app.agent/tell as a notification: dropped, nothing came back",
            "ok   cancel mid-way (3 items taken, credit for 10 more and the cancel in one message): ",
            "ok   a repeated req_id of an open stream -> duplicate",
            "ok   a repeated req_id of an ended stream -> duplicate",
            "ok   credit for an unknown req_id and for an ended stream, an item for no call: ignored",
            "ok   version-1 session: the version-1 view, no protocol-2 hello; app.agent/tell -> unknown_verb",
            "ok   a credit frame on a version-1 session -> close protocol_error, then CLOSE 0",
            "ok   an item frame on a version-1 session -> close protocol_error, then CLOSE 0",
            "ok   a first hello naming protocol 2 -> close unsupported_protocol, then CLOSE 0",
            "ok   close: sent close frame + CLOSE 0",
        ],
        "pypeer v2: all checks passed",
    );
    eprintln!(
        "python peer, protocol 2: whole test {:?}",
        started.elapsed()
    );
}

#[test]
fn the_python_peer_speaks_protocol_2_tasks_with_a_real_node() {
    let started = Instant::now();
    let wire_md = repo().join("WIRE.md").display().to_string();
    let Some(run) = run_peer("peer_tasks.py", |invite| {
        vec![wire_md.clone(), invite.to_owned()]
    }) else {
        return;
    };
    assert_checks(
        &run,
        &[
            "ok   4.10 worked examples: the submit's answer and a progress event, bytes as printed (91, 80)",
            "ok   manifest: core.tasks 1.0.0 with get (request), list (request), subscribe (stream), cancel \
             (request), respond (request), changed (notification), all bootstrap; app.agent/work a bootstrap \
             task; neither in the version-1 view of the first hello",
            "ok   submit app.agent/work (ask, 3 steps) -> {task: ",
            "ok   subscribe from 1 (credit 2 items, 4096 bytes, granted back as taken): events 1 state submitted, \
             2 state working, 3 question ",
            "ok   respond naming another question_seq -> conflict",
            "ok   respond (question_seq 3) -> info state ",
            "ok   get after the end: ",
            "ok   a second submit with the same req_id -> the same task ",
            "ok   subscribe from 5: events 5-8 byte for byte, then ok null; from 9: ok null at once, no item",
            "ok   subscribe with credit for 5 events and the bytes of 3: 3, then nothing",
            "ok   core.tasks/changed sent to the node: as a notification, nothing comes back",
            "ok   a subscription with a budget of 400 ms: ",
            "ok   respond to a working task that waits on no question -> conflict",
            "ok   cancel of a running task (after ",
            "ok   cancel while input_required -> canceled, question null",
            "ok   submits refused: args without text -> bad_args",
            "ok   args of exactly max_task_body (65536 bytes) accepted; the result, longer, is not kept: the task \
             ends failed, too_large",
            "ok   list: 4 tasks newest first, each info as get's, next null; pages of 1 and 2",
            "ok   a stranger (a second key): get, cancel, respond -> not_found 'no such task'",
            "ok   malformed ids (",
            "ok   version-1 session: core.tasks get, list, cancel, respond, subscribe -> unknown_verb; \
             app.agent/work -> unknown_verb",
            "ok   control plane: bound, get and list see every submitter's task; core.tasks/changed for events \
             [1, 2, 5] of 5",
            "ok   control plane: subscribes to another's task and answers its question without question_seq",
            "ok   control plane unbound (disable) while subscribed to another's task: after ",
            "ok   after the unbind: the open sessions' manifests at epoch ",
            "ok   1000 submits of one sender sent at once: all submitted; the next -> overloaded",
            "ok   submitter: close frame + CLOSE 0 sent",
        ],
        "pypeer tasks: all checks passed",
    );
    eprintln!("python peer, tasks: whole test {:?}", started.elapsed());
}

#[test]
fn the_python_peer_sees_tasks_kept_through_a_kill_and_restart_of_the_node() {
    let started = Instant::now();
    let Some(python) = python() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let state = dir.path().join("state");
    let saved = dir.path().join("seen.json").display().to_string();
    let mut node = start_node(&state, &dir.path().join("node-1.log"));
    let before = run_script(
        &python,
        "peer_tasks.py",
        &mut node,
        &["--before-restart".to_owned(), saved.clone()],
    );
    assert_checks(
        &before,
        &[
            "ok   before the restart: a completed task, one working (progress step 2 of 1000 seen), one waiting",
        ],
        "pypeer tasks: all checks passed",
    );
    let first_id = node.node_id.clone();
    // A kill, not a shutdown: what the node told the peer must have been
    // on disk already (WIRE.md 4.10, Events).
    drop(node);
    let mut node = start_node(&state, &dir.path().join("node-2.log"));
    assert_eq!(
        node.node_id, first_id,
        "the node keeps its identity in its state directory"
    );
    let after = run_script(
        &python,
        "peer_tasks.py",
        &mut node,
        &["--after-restart".to_owned(), saved],
    );
    assert_checks(
        &after,
        &[
            "ok   after the restart: the completed task as it was, events and info byte for byte; the same \
             req_id -> {task: ",
            "ok   after the restart: the working task's ",
            "ok   after the restart: the waiting task resumed and asked again",
        ],
        "pypeer tasks: all checks passed",
    );
    eprintln!(
        "python peer, tasks through a restart: whole test {:?}",
        started.elapsed()
    );
}

/// Runs `capwire ctl` with the state directory `state`; its stdout.
fn ctl(state: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .arg("ctl")
        .arg("--state")
        .arg(state)
        .args(args)
        .output()
        .expect("capwire ctl runs");
    assert!(
        out.status.success(),
        "capwire ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_python_peer_presents_a_grant_the_cli_minted() {
    let started = Instant::now();
    let Some(python) = python() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut node = start_node(&dir.path().join("state"), &dir.path().join("node.log"));
    let cp = dir.path().join("ctl");
    ctl(&cp, &["bind", &node.invite, "--name", "n"]);
    // The Python peer's identity: a fixed secret, so that its node id and
    // grant key are known here; it derives the grant key itself (WIRE.md
    // 5.5) and checks it against the one named here.
    let secret = [0x5a_u8; 32];
    let id = capwire::Keypair::from_secret_bytes(secret)
        .public()
        .to_string();
    let key = capwire::grants::GrantKey::from_secret(&secret)
        .public()
        .to_string();
    let token = ctl(
        &cp,
        &[
            "grant",
            "n",
            "--to",
            &id,
            "--to-key",
            &key,
            "--verb",
            "core.configuration/get_config",
            "--for",
            "5m",
        ],
    )
    .trim()
    .to_owned();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let run = run_script(&python, "peer_grants.py", &mut node, &[hex, token, key]);
    assert_checks(
        &run,
        &[
            "ok   grant key derived from the X25519 secret: ",
            "ok   manifest: core.grants 1.0.0 (",
            "ok   before presenting: core.configuration/get_config -> unauthorized",
            "ok   present of garbage and of 8193 characters -> unauthorized, detail {reason: bad_token}",
            "ok   present -> grant ",
            "ok   with the grant: get_config -> version 0; set_config (not granted) -> unauthorized",
            "ok   core.grants/revoke and core.monitoring/disable are never granted -> unauthorized",
            "ok   another key presenting the token -> unauthorized, detail {reason: wrong_holder}",
            "ok   version-1 session: core.grants/present -> unknown_verb",
        ],
        "pypeer grants: all checks passed",
    );
    eprintln!("python peer, grants: whole test {:?}", started.elapsed());
}
