//! `capwire mcp` and `capwire ctl card` against clients nobody here
//! wrote: the `mcp` package's client (PyPI, pinned in
//! `tests/mcp/requirements.txt`) starts `capwire mcp` over stdio and
//! talks to it over streamable HTTP, against real `capwire node`
//! processes bound by a real control plane; the A2A cards are read with
//! the `a2a-sdk` package's types; a hand-written hostile client floods
//! and garbles JSON-RPC (`tests/mcp/*.py`). Without Python the test
//! fails, unless `CAPWIRE_SKIP_PYTHON=1` says to skip it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pyenv;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pyenv::repo;

/// How long the suite may take, whatever it waits on.
const SUITE_DEADLINE: Duration = Duration::from_secs(600);

#[test]
fn mcp_and_a2a_clients_list_call_and_validate_the_cluster() {
    let Some(python) = pyenv::python_with(&[
        "tests/python/requirements.txt",
        "python/requirements-dev.txt",
        "tests/mcp/requirements.txt",
    ]) else {
        return;
    };
    let mut pytest = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(repo().join("tests/mcp"))
        .env("CAPWIRE_BIN", env!("CARGO_BIN_EXE_capwire"))
        .stdin(Stdio::null())
        .spawn()
        .expect("pytest starts");
    let deadline = Instant::now() + SUITE_DEADLINE;
    let status = loop {
        if let Some(status) = pytest.try_wait().expect("pytest is waited on") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = pytest.kill();
            let _ = pytest.wait();
            panic!("the MCP suite ran longer than {SUITE_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "the MCP suite failed: {status}");
}
