//! `capwire ctl top` in a real terminal: tmux runs it on a private server,
//! the test reads the screen with `capture-pane`, drives the cluster from
//! other `ctl` processes (which hand their commands to `top`) and quits
//! with `q` Enter. Skipped, with a message, where tmux is not installed.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cli_support::{BIN, NodeProc, ctl_ok, poll, tempdir};

/// A tmux server of its own, killed (and its socket file removed) when
/// this drops.
struct Tmux {
    socket: String,
    socket_path: Option<PathBuf>,
}

impl Tmux {
    fn new() -> Tmux {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Tmux {
            socket: format!("capwire-top-{}-{nanos}", std::process::id()),
            socket_path: None,
        }
    }

    /// Starts the server with one 160x50 session, `name`, running
    /// `command`.
    fn start(&mut self, name: &str, command: &str) {
        let out = self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "160",
            "-y",
            "50",
            command,
        ]);
        assert!(out.status.success(), "tmux new-session: {out:?}");
        let out = self.run(&["display-message", "-p", "#{socket_path}"]);
        let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        self.socket_path = (!path.is_empty()).then(|| PathBuf::from(path));
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("tmux runs")
    }

    /// The visible screen of the session.
    fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "top"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls the screen until `pred` accepts it.
    fn wait_screen(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll(Duration::from_secs(10), what, || {
                last = self.screen();
                pred(&last).then(|| last.clone())
            })
        }));
        found.unwrap_or_else(|_| panic!("the screen never showed {what}; last screen:\n{last}"))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn tmux_installed() -> bool {
    Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `text` quoted for `sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn quoted(path: &Path) -> String {
    quote(path.to_str().unwrap())
}

/// The line of `screen` that starts (after indentation) with `first`.
fn row<'a>(screen: &'a str, first: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
}

#[test]
fn top_shows_members_and_calls_made_through_it() {
    if !tmux_installed() {
        println!("skipping top_shows_members_and_calls_made_through_it: tmux is not on PATH");
        return;
    }
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);
    ctl_ok(&cp, &["cluster", "create", "bob"]);

    // top in a 160x50 terminal; its exit code lands in a file.
    let rc: PathBuf = tmp.path().join("top.rc");
    let script = format!(
        "env -u RUST_LOG -u RUST_BACKTRACE CAPWIRE_CTL_STATE={} {} ctl top; echo $? > {}",
        quoted(&cp),
        quote(BIN),
        quoted(&rc),
    );
    let mut tmux = Tmux::new();
    tmux.start("top", &script);

    // The node counts as connected once the watch inside top has its
    // session.
    let screen = tmux.wait_screen("the first view, connected", |s| {
        s.contains("capwire top")
            && s.contains("MEMBERS of alpha")
            && s.contains("nodes 1 (1 connected)")
    });
    let bob = row(&screen, "c1").unwrap_or_else(|| panic!("no bob row:\n{screen}"));
    assert!(bob.contains("bob") && bob.contains("running"), "{screen}");
    assert!(screen.contains("CALLS FROM THIS CONTROL PLANE"), "{screen}");

    // Commands from another ctl go through top ...
    let out = ctl_ok(
        &cp,
        &["cluster", "create", "dave", "--bio", "from elsewhere"],
    );
    assert!(out.stdout.contains("dave"), "{out:#?}");
    let out = ctl_ok(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "\"hi\""],
    );
    assert_eq!(out.stdout, "alpha: hi\n");
    let out = ctl_ok(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "\"again\""],
    );
    assert_eq!(out.stdout, "alpha: again\n");

    // ... and show on its screen: the new member, the calls.
    let screen = tmux.wait_screen("dave and the echo calls", |s| {
        row(s, "c2").is_some_and(|r| r.contains("dave"))
            && s.lines().any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() >= 6
                    && cols[..5] == ["alpha", "app.agent/echo", "2", "0", "0"]
                    && cols[5] == "ok"
            })
    });
    assert!(
        screen.contains("core.cluster/create"),
        "the create shows too:\n{screen}"
    );
    assert!(screen.contains("(roster v"), "{screen}");

    // q Enter quits; the terminal gets its screen back.
    let out = tmux.run(&["send-keys", "-t", "top", "q", "Enter"]);
    assert!(out.status.success(), "tmux send-keys: {out:?}");
    let code = poll(Duration::from_secs(5), "top to exit", || {
        std::fs::read_to_string(&rc)
            .ok()
            .filter(|t| t.ends_with('\n'))
    });
    assert_eq!(code.trim(), "0", "top's exit code");

    // The state is free again: a local command runs.
    assert!(!cp.join("ctl.sock").exists(), "the socket is gone");
    ctl_ok(&cp, &["cluster", "list"]);
}
