//! What the benches of the faces (`capwire mcp`, `capwire acp`) share: the
//! `capwire` binary, a `capwire node` process, one-shot `capwire ctl`
//! runs, and the medians they report.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value as Json;

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
