"""Shared fixtures: Python nodes started on the test's loop, `capwire node`
and `capwire ctl` child processes, the pure-Rust bench node.

Every node and child process a test starts is stopped in its fixture's
teardown; every wait is bounded (asyncio.wait_for), and a watchdog kills
the run (with every thread's traceback) should a test hang anyway.
"""

import asyncio
import dataclasses
import faulthandler
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import capwire
from capwire._capwire import bench
from capwire._runtime import bridge

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "pysupport"))

from children import COMMAND_TIMEOUT, Done, capwire_bin_path, child_env, run, stop_process  # noqa: E402

#: No single test may take longer than this (the watchdog then kills the run).
TEST_DEADLINE = 90.0


@pytest.fixture(scope="session")
def capwire_bin() -> Path:
    return capwire_bin_path()


@pytest.fixture(autouse=True)
def _watchdog() -> Any:
    """Kills the whole run, dumping every thread's stack, if one test hangs."""
    faulthandler.dump_traceback_later(TEST_DEADLINE, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Ctl:
    """`capwire ctl` with its own state directory (one control plane)."""

    def __init__(self, binary: Path, state: Path) -> None:
        self.binary = binary
        self.state = state

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), "ctl", "--state", str(self.state), *args]

    async def __call__(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> Done:
        return await run(self.argv(*args), timeout=timeout)

    async def ok(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> Done:
        """Runs it and insists on exit code 0."""
        done = await self(*args, timeout=timeout)
        assert done.rc == 0, str(done)
        return done

    async def spawn(self, *args: str) -> asyncio.subprocess.Process:
        """Starts it without waiting (the caller stops it)."""
        return await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
        )

    async def identity(self) -> str:
        done = await self.ok("--json", "identity")
        (record,) = done.json_lines()
        return str(record["node_id"])

    async def bind(self, invite: str, name: str) -> dict[str, Any]:
        done = await self.ok("--json", "bind", invite, "--name", name)
        (record,) = done.json_lines()
        assert record["kind"] == "bound", str(done)
        return record  # type: ignore[no-any-return]


@pytest.fixture
def ctl(capwire_bin: Path, tmp_path: Path) -> Ctl:
    """A fresh control plane (`capwire ctl --state tmp/ctl`)."""
    return Ctl(capwire_bin, tmp_path / "ctl")


class Nodes:
    """Starts Python nodes on the test's loop and shuts them all down at
    the end of the test."""

    def __init__(self) -> None:
        self.started: list[capwire.Node] = []

    async def start(self, app_id: str, *caps: capwire.Capability, listen: bool = True, **opts: Any) -> capwire.Node:
        builder = capwire.Node.builder(app_id)
        if listen:
            builder = builder.listen("127.0.0.1:0")
        for cap in caps:
            builder = builder.capability(cap)
        for name, value in opts.items():
            builder = getattr(builder, name)(value)
        node = await asyncio.wait_for(builder.start(), 15)
        self.started.append(node)
        return node

    def adopt(self, node: capwire.Node) -> capwire.Node:
        self.started.append(node)
        return node

    async def pair(self, *caps: capwire.Capability) -> tuple[capwire.Node, capwire.Node, capwire.Peer]:
        """A serving node with `caps`, a client node and the client's peer
        for the server."""
        server = await self.start("py-server", *caps)
        client = await self.start("py-client", listen=False)
        peer = await asyncio.wait_for(client.connect(server.local_addrs()[0], server.id), 10)
        return server, client, peer

    async def close(self) -> None:
        # A node with handlers still running waits up to its shutdown
        # grace (5 s) before it cancels them: shut them down together.
        # (Graceful shutdown is bounded by about 6.4 s: src/node/shutdown.rs.)
        await asyncio.wait_for(
            asyncio.gather(*(n.shutdown() for n in self.started), return_exceptions=True), 15
        )


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    made = Nodes()
    try:
        yield made
    finally:
        await made.close()


@dataclasses.dataclass
class RustAgent:
    """A `capwire node` child process."""

    proc: asyncio.subprocess.Process
    id: str
    addr: str
    invite: str
    name: str

    async def stop(self) -> str:
        """Stops it; what it logged on stderr."""
        await stop_process(self.proc)
        assert self.proc.stderr is not None
        return (await asyncio.wait_for(self.proc.stderr.read(), 10)).decode(errors="replace")


@pytest.fixture
async def rust_agent(capwire_bin: Path) -> AsyncIterator[RustAgent]:
    """`capwire node --json`: app.agent (echo, tell, work, note) in Rust."""
    name = "rust-agent"
    proc = await asyncio.create_subprocess_exec(
        str(capwire_bin), "node", "--json", "--name", name, "--listen", "127.0.0.1:0",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(RUST_LOG="info"),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 15)
        assert line, f"capwire node printed nothing (exit {proc.returncode})"
        info = json.loads(line)
        yield RustAgent(proc, info["node_id"], info["addrs"][0], info["invite"], name)
    finally:
        await stop_process(proc)


async def start_rust_bench_node() -> capwire.Node:
    """The pure-Rust bench node (app.bench/echo, sink and flood), on the
    running loop."""
    native = await asyncio.wait_for(bench.rust_echo_node(bridge(), "127.0.0.1:0"), 15)
    return capwire.Node(native)


@pytest.fixture
async def rust_bench(nodes: Nodes) -> capwire.Node:
    """The pure-Rust bench node, shut down after the test."""
    return nodes.adopt(await start_rust_bench_node())


async def wait_until(predicate: Any, timeout: float = 10.0, what: str = "the condition") -> None:
    """Polls `predicate()` until it is true."""
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} did not happen within {timeout} s") from None


PYTHON = sys.executable
