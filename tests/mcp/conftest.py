"""A real cluster for the MCP and A2A clients: `capwire node` child
processes bound by a `capwire ctl` control plane, and `capwire mcp` over
stdio (started by the `mcp` package's own client) or over streamable HTTP.

Every process a test starts is stopped in its fixture's teardown, every
wait is bounded, and a watchdog kills the run (with every thread's
traceback) should a test hang anyway.
"""

import asyncio
import contextlib
import dataclasses
import faulthandler
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "pysupport"))

from children import COMMAND_TIMEOUT, Done, capwire_bin_path, child_env, run, stop_process  # noqa: E402

#: No single test may take longer than this (the watchdog then kills the run).
TEST_DEADLINE = 120.0


@pytest.fixture(autouse=True)
def _watchdog() -> Any:
    faulthandler.dump_traceback_later(TEST_DEADLINE, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@dataclasses.dataclass
class Agent:
    """A `capwire node` child process."""

    proc: asyncio.subprocess.Process
    name: str
    id: str
    addr: str
    invite: str


class Watch:
    """The `call` records of a running `ctl watch`."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def next_call(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 15)
            assert line, "the watch ended"
            record = json.loads(line)
            if record.get("kind") == "call":
                return record  # type: ignore[no-any-return]


class Cluster:
    """A control plane (its state directory) and the nodes it bound."""

    def __init__(self, binary: Path, state: Path) -> None:
        self.binary = binary
        self.state = state
        self.agents: list[Agent] = []

    def ctl_argv(self, *args: str) -> list[str]:
        return [str(self.binary), "ctl", "--state", str(self.state), *args]

    async def ctl(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> Done:
        done = await run(self.ctl_argv(*args), timeout=timeout)
        assert done.rc == 0, str(done)
        return done

    async def ctl_json(self, *args: str) -> list[Any]:
        return (await self.ctl("--json", *args)).json_lines()

    async def start_agent(self, name: str, *, bind: bool = True) -> Agent:
        proc, info = await self._node(name, "127.0.0.1:0")
        agent = Agent(proc, name, info["node_id"], info["addrs"][0], info["invite"])
        self.agents.append(agent)
        if bind:
            (record,) = await self.ctl_json("bind", agent.invite, "--name", name)
            assert record["kind"] == "bound", record
        return agent

    async def restart_agent(self, agent: Agent) -> None:
        """Stops `agent` and starts it again with its state, on its
        address: the same node, still bound."""
        await stop_process(agent.proc)
        agent.proc, info = await self._node(agent.name, agent.addr)
        assert info["node_id"] == agent.id, info

    async def _node(self, name: str, listen: str) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
        """`capwire node` named `name` (its state in this cluster's
        directory), and its startup record."""
        proc = await asyncio.create_subprocess_exec(
            str(self.binary), "node", "--json", "--name", name, "--listen", listen,
            "--state", str(self.state.parent / f"node-{name}"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=child_env(),
        )
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 15)
            assert line, f"capwire node printed nothing (exit {proc.returncode})"
        except BaseException:
            await stop_process(proc)
            raise
        return proc, json.loads(line)

    async def identity(self) -> str:
        (record,) = await self.ctl_json("identity")
        return str(record["node_id"])

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator["Watch"]:
        """A `ctl watch` (handed to the process that owns the state, such as
        `capwire mcp`): it sees every call this control plane makes."""
        proc = await asyncio.create_subprocess_exec(
            *self.ctl_argv("--json", "watch"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=child_env(),
        )
        try:
            await asyncio.sleep(0.5)
            yield Watch(proc)
        finally:
            await stop_process(proc)

    def mcp_argv(self, *extra: str) -> list[str]:
        return ["mcp", "--state", str(self.state), *extra]

    async def close(self) -> None:
        await asyncio.gather(*(stop_process(a.proc) for a in self.agents), return_exceptions=True)


@pytest.fixture
def capwire_bin() -> Path:
    return capwire_bin_path()


@pytest.fixture
async def cluster(capwire_bin: Path, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A control plane that bound one node, `alpha` (`capwire node`:
    app.agent with echo, note, tell, work and the controller verbs ask,
    probe and hand_on)."""
    made = Cluster(capwire_bin, tmp_path / "ctl")
    try:
        await made.start_agent("alpha")
        yield made
    finally:
        await made.close()


@dataclasses.dataclass
class HttpFace:
    proc: asyncio.subprocess.Process
    base: str

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"


async def start_http(cluster: Cluster, *extra: str) -> HttpFace:
    """`capwire mcp --http 0`: on a free loopback port, which it prints."""
    proc = await asyncio.create_subprocess_exec(
        str(cluster.binary), *cluster.mcp_argv("--http", "0", *extra),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 20)
    found = re.search(rb"MCP at (http://[0-9.:]+)/mcp", line)
    assert found, f"capwire mcp --http said {line!r} (exit {proc.returncode})"
    return HttpFace(proc, found.group(1).decode())


@pytest.fixture
async def http_face(cluster: Cluster) -> AsyncIterator[HttpFace]:
    face = await start_http(cluster)
    try:
        yield face
    finally:
        await stop_process(face.proc)


async def wait_for(predicate: Any, timeout: float = 15.0, what: str = "the condition") -> None:
    """Polls the coroutine function `predicate` until it returns true."""

    async def poll() -> None:
        while not await predicate():
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} did not happen within {timeout} s") from None
