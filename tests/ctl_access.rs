//! Who may use a control plane's state, with real processes: a state
//! directory others can enter is refused by `capwire ctl` and by
//! `capwire node`; the files and `ctl.sock` are the owner's alone whatever
//! the umask; a process of another user is refused by the socket on its
//! peer credentials; lines on the socket are bounded on both sides; and
//! `peers.json` is replaced atomically and durably.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cli_support::{BIN, NodeProc, Spawned, assert_fails, ctl, ctl_ok, poll, run, tempdir};

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o777
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `capwire ctl --json --state STATE watch`, started by a shell with
/// umask `umask`.
fn watch_with_umask(state: &Path, umask: &str) -> Spawned {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(["ctl", "--json", "--state"])
        .arg(state)
        .arg("watch")
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("CAPWIRE_CTL_STATE")
        .stdin(Stdio::null());
    Spawned::start(cmd, "ctl watch")
}

/// Waits for the owner's socket to appear.
fn wait_for_socket(state: &Path) -> std::path::PathBuf {
    let socket = state.join("ctl.sock");
    poll(Duration::from_secs(15), "ctl.sock", || {
        socket.exists().then_some(())
    });
    socket
}

#[test]
fn a_state_directory_others_can_enter_is_refused_by_ctl_and_node() {
    let tmp = tempdir();
    let open = tmp.path().join("shared");
    fs::DirBuilder::new().mode(0o775).create(&open).unwrap();
    chmod(&open, 0o775);
    let fix = format!("chmod 700 {}", open.display());

    let out = ctl(&open, &["peers"]);
    let line = assert_fails(&out, 1, &fix);
    assert!(line.contains("775"), "the mode is named: {line}");
    let out = run(&["node", "--state", open.to_str().unwrap()]);
    let line = assert_fails(&out, 1, &fix);
    assert!(line.contains("not private"), "{line}");
    assert_eq!(mode(&open), 0o775, "left for the user to fix");
    assert!(
        names_in(&open).is_empty(),
        "nothing written: {:?}",
        names_in(&open)
    );

    // As the message says: then both work.
    chmod(&open, 0o700);
    let peers = ctl_ok(&open, &["--json", "peers"]).record();
    assert_eq!(peers["kind"], "peers");
    let node_dir = tmp.path().join("node");
    fs::DirBuilder::new().mode(0o700).create(&node_dir).unwrap();
    let node = NodeProc::start_in("alpha", &node_dir);
    node.stop(Duration::from_secs(5));
    // A directory opened before is checked again on the next open.
    chmod(&node_dir, 0o750);
    let out = run(&["node", "--state", node_dir.to_str().unwrap()]);
    assert_fails(&out, 1, &format!("chmod 700 {}", node_dir.display()));
}

#[test]
fn the_socket_and_the_files_are_private_whatever_the_umask() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    let mut watch = watch_with_umask(&cp, "000");
    let socket = wait_for_socket(&cp);
    assert_eq!(mode(&socket), 0o600, "ctl.sock under umask 000");
    assert_eq!(mode(&cp), 0o700);
    assert_eq!(mode(&cp.join("identity.key")), 0o600);
    assert_eq!(mode(&cp.join("state.redb")), 0o600);
    assert_eq!(mode(&cp.join("audit")), 0o700, "the audit log's directory");

    // Handed to the owner, which writes the book under its umask 000.
    let bound = ctl_ok(&cp, &["--json", "bind", node.invite()]).record();
    assert_eq!(bound["kind"], "bound");
    assert_eq!(
        mode(&cp.join("peers.json")),
        0o600,
        "peers.json under umask 000"
    );
    watch.wait_record(Duration::from_secs(10), "connected to alpha", |r| {
        r["kind"] == "connected" && r["peer"] == "alpha"
    });
    assert_eq!(
        names_in(&cp),
        [
            "audit",
            "ctl.sock",
            "identity.key",
            "peers.json",
            "state.redb"
        ],
        "no temporary file is left"
    );
    watch.signal("INT");
    assert!(watch.wait_exit(Duration::from_secs(5)).success());
    assert!(!socket.exists(), "the socket goes with its owner");
}

/// A python3 that the user nobody can run, and `setpriv`; `None` when
/// this machine has neither.
fn as_nobody() -> Option<Vec<String>> {
    for python in ["/usr/bin/python3", "/usr/local/bin/python3", "python3"] {
        let drop_to_nobody = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
        ];
        let works = Command::new(drop_to_nobody[0])
            .args(&drop_to_nobody[1..])
            .args(["-c", "import os, sys; sys.exit(os.getuid() != 65534)"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if works {
            return Some(drop_to_nobody.iter().map(|s| (*s).to_owned()).collect());
        }
    }
    None
}

/// A client that connects to the socket, sends one `peers` request and
/// prints what comes back until the owner closes (10 s at most).
const CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(b'{"command":"Peers","timeout_ms":2000}\n')
got = b""
while True:
    try:
        chunk = s.recv(65536)
    except socket.timeout:
        break
    if not chunk:
        break
    got += chunk
sys.stdout.write(got.decode())
"#;

fn client(prefix: &[String], socket: &Path) -> String {
    let (program, args) = prefix.split_first().unwrap();
    let out = Command::new(program)
        .args(args)
        .args(["-c", CLIENT])
        .arg(socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the client ran: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_process_of_another_user_is_refused_by_the_socket() {
    if !rustix::process::geteuid().is_root() {
        skip("not root: no process of another user can be started here");
        return;
    }
    let nobody = as_nobody().expect("setpriv and a python3 the user nobody can run");
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let mut watch = watch_with_umask(&cp, "077");
    let socket = wait_for_socket(&cp);
    // Open the way on the file system (after the owner checked its
    // directory), so that only the peer credentials stand in it.
    chmod(tmp.path(), 0o711);
    chmod(&cp, 0o711);
    chmod(&socket, 0o666);

    let answer = client(&nobody, &socket);
    assert!(
        answer.contains("refused a connection from uid 65534"),
        "refused on its credentials: {answer:?}"
    );
    assert!(!answer.contains("record"), "nothing ran: {answer:?}");
    let end: serde_json::Value = serde_json::from_str(answer.trim()).unwrap();
    assert_eq!(end["exit"], 1, "{answer}");

    // The owner's own processes are served on the same socket.
    let owner = [nobody[4].clone()];
    let answer = client(&owner, &socket);
    assert!(answer.contains(r#""kind":"peers""#), "{answer:?}");
    assert!(answer.trim_end().ends_with(r#"{"exit":0}"#), "{answer:?}");

    chmod(&cp, 0o700);
    watch.signal("INT");
    assert!(watch.wait_exit(Duration::from_secs(5)).success());
}

#[test]
fn an_over_long_request_line_is_refused() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let mut watch = watch_with_umask(&cp, "077");
    let socket = wait_for_socket(&cp);

    // 1 MiB without a newline: refused once the line passes 64 KiB.
    let mut stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let sent = stream.write_all(&vec![b'x'; 1 << 20]);
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer).unwrap();
    assert!(
        answer.contains("longer than 65536 bytes"),
        "{answer:?} (writing: {sent:?})"
    );
    let end: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(end["exit"], 2);
    // Closed after it.
    let mut rest = Vec::new();
    let _ = (&stream).read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing more: {}", rest.len());

    // The owner goes on serving.
    let peers = ctl_ok(&cp, &["--json", "peers"]).record();
    assert_eq!(peers["kind"], "peers");
    watch.signal("INT");
    assert!(watch.wait_exit(Duration::from_secs(5)).success());
}

#[test]
fn an_over_long_line_from_the_owner_ends_the_command() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    // A node process holds the state's lock, and a listener of this test
    // stands in for the owner: it answers every request with one record
    // line of 65 MiB, then success.
    let holder = NodeProc::start_in("holder", &cp);
    let listener = UnixListener::bind(cp.join("ctl.sock")).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut request = String::new();
                let mut reader = BufReader::new(&stream);
                if reader.read_line(&mut request).unwrap_or(0) == 0 {
                    return; // a ctl looking whether an owner answers
                }
                let mut writer = &stream;
                let huge = "x".repeat(65 << 20);
                let _ = writeln!(
                    writer,
                    r#"{{"record":{{"kind":"done","message":"{huge}"}}}}"#
                );
                let _ = writeln!(writer, r#"{{"exit":0}}"#);
            });
        }
    });

    let out = ctl(&cp, &["peers"]);
    let line = assert_fails(&out, 1, "a line longer than 67108864 bytes");
    assert!(line.contains("outcome is unknown"), "{line}");
    holder.stop(Duration::from_secs(5));
}

#[test]
fn the_book_is_replaced_whole_and_leftovers_break_nothing() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let alpha = NodeProc::start("alpha", &[]);
    let beta = NodeProc::start("beta", &[]);
    ctl_ok(&cp, &["bind", alpha.invite()]);

    // What saves that crashed could leave: the fixed name older versions
    // used, random ones, a read-only one, and a directory of such a name.
    for name in [".peers.json.new", ".peers.json.K2jd8s.new"] {
        fs::write(cp.join(name), b"{\"peers\": [").unwrap();
    }
    fs::write(cp.join(".peers.json.r3ad0n.new"), b"{").unwrap();
    chmod(&cp.join(".peers.json.r3ad0n.new"), 0o400);
    fs::create_dir(cp.join(".peers.json.adir00.new")).unwrap();
    ctl_ok(&cp, &["bind", beta.invite()]);
    assert_eq!(
        names_in(&cp),
        [
            ".peers.json.adir00.new",
            "audit",
            "identity.key",
            "peers.json",
            "state.redb"
        ]
    );
    assert_eq!(mode(&cp.join("peers.json")), 0o600);
    let book: serde_json::Value =
        serde_json::from_slice(&fs::read(cp.join("peers.json")).unwrap()).unwrap();
    let names: Vec<&str> = book["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);

    // A book made unreadable by hand is refused, not replaced.
    fs::write(cp.join("peers.json"), b"{\"peers\": [").unwrap();
    let out = ctl(&cp, &["peers"]);
    assert_fails(&out, 1, "cannot read");
    assert_eq!(fs::read(cp.join("peers.json")).unwrap(), b"{\"peers\": [");
}

/// Notes that a test cannot run here; with `CAPWIRE_REQUIRE_TOOLS=1` (CI
/// sets it, and installs what these tests need) that is a failure.
fn skip(why: &str) {
    assert!(
        std::env::var_os("CAPWIRE_REQUIRE_TOOLS").is_none_or(|v| v != "1"),
        "{why}, and CAPWIRE_REQUIRE_TOOLS=1"
    );
    eprintln!("{why}; skipped");
}

/// Runs `capwire ARGS` under strace, one log per thread (`PREFIX.TID`)
/// so that no call is split; the logs, or `None` when strace cannot run
/// here.
fn traced(args: &[&str], prefix: &Path) -> Option<Vec<String>> {
    let probe = Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        return None;
    }
    let out = Command::new("strace")
        .args([
            "-ff",
            "-e",
            "trace=openat,rename,renameat,renameat2,fsync,fdatasync",
        ])
        .arg("-o")
        .arg(prefix)
        .arg(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("CAPWIRE_CTL_STATE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "capwire {args:?} under strace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = prefix.parent().unwrap();
    let name = format!("{}.", prefix.file_name().unwrap().to_str().unwrap());
    Some(
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
            .map(|e| fs::read_to_string(e.path()).unwrap())
            .collect(),
    )
}

/// Panics unless a thread renames a file onto `target` and then opens
/// `dir` and fsyncs what it opened.
fn assert_rename_then_dir_sync(logs: &[String], target: &Path, dir: &Path) {
    let target = format!("\"{}\"", target.display());
    let dir = format!("\"{}\"", dir.display());
    let renamed = |l: &&str| l.starts_with("rename") && l.contains(&target) && l.ends_with("= 0");
    let log = logs
        .iter()
        .find(|log| log.lines().any(|l| renamed(&l)))
        .unwrap_or_else(|| panic!("no rename onto {target}:\n{logs:#?}"));
    let lines: Vec<&str> = log.lines().collect();
    let at = lines.iter().position(renamed).unwrap();
    let mut opened = None;
    for line in &lines[at + 1..] {
        if line.starts_with("openat(") && line.contains(&dir) {
            opened = line.rsplit("= ").next().map(str::to_owned);
        } else if let Some(fd) = &opened
            && line.starts_with(&format!("fsync({fd})"))
            && line.ends_with("= 0")
        {
            return;
        }
    }
    panic!("{target} was renamed, but {dir} was not synced after it:\n{log}");
}

#[test]
fn the_book_and_the_key_are_synced_with_their_directory() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    let traces = tmp.path().join("traces");
    fs::create_dir(&traces).unwrap();
    let state = cp.to_str().unwrap();
    let Some(logs) = traced(
        &["ctl", "--state", state, "bind", node.invite()],
        &traces.join("t"),
    ) else {
        skip("strace cannot run here");
        return;
    };
    assert_rename_then_dir_sync(&logs, &cp.join("identity.key"), &cp);
    assert_rename_then_dir_sync(&logs, &cp.join("peers.json"), &cp);
    let peers = ctl_ok(&cp, &["--json", "peers"]).record();
    assert_eq!(peers["peers"][0]["name"], "alpha");
}
