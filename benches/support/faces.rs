//! What the benches of the faces (`capwire mcp`, `capwire acp`) share: the
//! `capwire` binary, a `capwire node` process, one-shot `capwire ctl`
//! runs, and the medians they report.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{Value as Json, json};

/// The `capwire` binary, quiet, with no default control plane.
pub(crate) fn capwire() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_capwire"));
    cmd.env("RUST_LOG", "warn").env_remove("CAPWIRE_CTL_STATE");
    cmd
}

/// `capwire node` named `bench` with its state in `state`, and what it
/// printed at start.
pub(crate) fn start_node(state: &Path) -> (Child, Json) {
    let mut child = capwire()
        .args(["node", "--json", "--name", "bench", "--state"])
        .arg(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // The rest of its output is not read: it is let go to a thread.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (child, serde_json::from_str(&line).unwrap())
}

/// `capwire ctl --state STATE ARGS`, which must succeed.
pub(crate) fn ctl(state: &Path, args: &[&str]) -> std::process::Output {
    let out = capwire()
        .arg("ctl")
        .arg("--state")
        .arg(state)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub(crate) fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A face (`capwire mcp`, `capwire acp`) on stdio, spoken JSON-RPC to
/// one line at a time.
pub(crate) struct Face {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Face {
    /// `capwire ARGS`, its stdin and stdout piped.
    pub(crate) fn start(args: &[&std::ffi::OsStr]) -> Face {
        let mut child = capwire()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Face {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    pub(crate) fn send(&mut self, message: &Json) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// A request, its result, and how many other messages came before
    /// it (notifications on the way).
    pub(crate) fn call(&mut self, method: &str, params: Json) -> (Json, usize) {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut before = 0;
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the face ended"
            );
            let message: Json = serde_json::from_str(&line).unwrap();
            if message["id"] == id && message.get("method").is_none() {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return (message["result"].clone(), before);
            }
            before += 1;
        }
    }

    pub(crate) fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}
