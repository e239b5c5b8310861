//! `capwire mcp` and `capwire ctl card` against clients nobody here
//! wrote: the `mcp` package's client (PyPI, pinned in
//! `tests/mcp/requirements.txt`) starts `capwire mcp` over stdio and
//! talks to it over streamable HTTP, against real `capwire node`
//! processes bound by a real control plane; the A2A cards are read with
//! the `a2a-sdk` package's types; the TypeScript MCP SDK's client (npm,
//! pinned in `tests/mcp/ts/package-lock.json`) makes the same calls; a
//! hand-written hostile client floods and garbles JSON-RPC
//! (`tests/mcp/*.py`). The `agent-client-protocol` package's client (PyPI,
//! pinned there too) starts `capwire acp` as its agent and runs prompt
//! turns, a cancel and a load against the same cluster
//! (`tests/mcp/test_acp.py`). Without Python the test
//! fails, unless `CAPWIRE_SKIP_PYTHON=1` says to skip it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pyenv;

use std::time::Duration;

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
    pyenv::pytest(&python, "tests/mcp", SUITE_DEADLINE);
}
