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
import os
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

#: No single test may take longer than this (the watchdog then kills the run).
TEST_DEADLINE = 120.0
#: How long any one child command may run.
COMMAND_TIMEOUT = 30.0


def capwire_bin_path() -> Path:
    """The `capwire` binary: $CAPWIRE_BIN, else target/debug/capwire."""
    path = Path(os.environ.get("CAPWIRE_BIN") or REPO / "target/debug/capwire")
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"the capwire binary is missing: {path}", pytrace=False)
    return path


@pytest.fixture(autouse=True)
def _watchdog() -> Any:
    faulthandler.dump_traceback_later(TEST_DEADLINE, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RUST_LOG", "CAPWIRE_CTL_STATE")}
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


@dataclasses.dataclass
class Done:
    args: Sequence[str]
    rc: int
    out: str
    err: str

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def __str__(self) -> str:
        return f"{' '.join(self.args)}\n  exit {self.rc}\n  stdout: {self.out!r}\n  stderr: {self.err!r}"


async def stop_process(proc: asyncio.subprocess.Process, *, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL when it does not go within `grace`."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), grace)


async def run(args: Sequence[str | os.PathLike[str]], *, timeout: float = COMMAND_TIMEOUT) -> Done:
    argv = [str(a) for a in args]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    assert proc.returncode is not None
    return Done(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


@dataclasses.dataclass
class Agent:
    """A `capwire node` child process."""

    proc: asyncio.subprocess.Process
    name: str
    id: str
    addr: str
    invite: str


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
        proc = await asyncio.create_subprocess_exec(
            str(self.binary), "node", "--json", "--name", name, "--listen", "127.0.0.1:0",
            "--state", str(self.state.parent / f"node-{name}"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=child_env(),
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 15)
        assert line, f"capwire node printed nothing (exit {proc.returncode})"
        info = json.loads(line)
        agent = Agent(proc, name, info["node_id"], info["addrs"][0], info["invite"])
        self.agents.append(agent)
        if bind:
            (record,) = await self.ctl_json("bind", agent.invite, "--name", name)
            assert record["kind"] == "bound", record
        return agent

    async def identity(self) -> str:
        (record,) = await self.ctl_json("identity")
        return str(record["node_id"])

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
