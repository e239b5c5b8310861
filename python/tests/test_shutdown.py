"""Shutdown with calls in flight, on either side, and a serving process
that dies: every caller gets a capwire error within a bound, none hangs;
a process that used nodes exits cleanly."""

import asyncio
import json
import signal
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import capwire
from conftest import PYTHON, Nodes, child_env, run, stop_process, wait_until

#: Graceful shutdown waits 5 s for running handlers, then cancels them and
#: closes sessions within about 1.4 s more (src/node/shutdown.rs).
SHUTDOWN_BOUND = 10.0


class Count:
    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.finished = 0


def slow_cap(c: Count) -> capwire.Capability:
    cap = capwire.Capability("app.slow", "1.0.0")

    @cap.request("wait")
    async def wait(seconds: float) -> str:
        c.started += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            c.cancelled += 1
            raise
        c.finished += 1
        return f"waited {seconds}"

    @cap.stream("ticks")
    async def ticks(period: float) -> AsyncIterator[int]:
        i = 0
        while True:
            yield i
            i += 1
            await asyncio.sleep(period)

    return cap


async def test_serving_node_shuts_down_with_calls_in_flight(nodes: Nodes) -> None:
    c = Count()
    server, _, peer = await nodes.pair(slow_cap(c))
    loop = asyncio.get_running_loop()
    long_calls = [asyncio.create_task(peer.request("app.slow", "wait", 60)) for _ in range(5)]
    short_calls = [asyncio.create_task(peer.request("app.slow", "wait", 0.5, result=str)) for _ in range(3)]
    stream = peer.stream("app.slow", "ticks", 0.01, item=int)
    assert await asyncio.wait_for(stream.__anext__(), 10) == 0
    await wait_until(lambda: c.started == 8, what="8 handlers running")

    started = loop.time()
    await asyncio.wait_for(server.shutdown(), SHUTDOWN_BOUND + 5)
    took = loop.time() - started
    assert took < SHUTDOWN_BOUND, f"shutdown took {took:.1f} s"

    # Handlers that end within the grace answer as usual.
    assert await asyncio.wait_for(asyncio.gather(*short_calls), 5) == ["waited 0.5"] * 3
    # The others are cancelled, and each caller is told.
    outcomes = await asyncio.wait_for(asyncio.gather(*long_calls, return_exceptions=True), 5)
    for outcome in outcomes:
        assert isinstance(outcome, capwire.CapwireError), repr(outcome)
        assert isinstance(outcome, (capwire.Cancelled, capwire.PeerLost, capwire.Shutdown, capwire.Unavailable)), repr(outcome)
    assert c.cancelled == 5 and c.finished == 3
    # The stream ends with an error too, not a hang.
    with pytest.raises(capwire.CapwireError):
        await asyncio.wait_for(_drain(stream), 10)
    # A shut-down node is still safe to shut down again.
    await asyncio.wait_for(server.shutdown(), 5)


async def _drain(stream: capwire.Stream[int]) -> None:
    async for _ in stream:
        pass


async def test_calling_node_shuts_down_with_calls_in_flight(nodes: Nodes) -> None:
    c = Count()
    server, client, peer = await nodes.pair(slow_cap(c))
    loop = asyncio.get_running_loop()
    calls = [asyncio.create_task(peer.request("app.slow", "wait", 60)) for _ in range(5)]
    stream = peer.stream("app.slow", "ticks", 0.01, item=int)
    assert await asyncio.wait_for(stream.__anext__(), 10) == 0
    await wait_until(lambda: c.started == 5, what="5 handlers running")

    started = loop.time()
    await asyncio.wait_for(client.shutdown(), SHUTDOWN_BOUND + 5)
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
    assert loop.time() - started < SHUTDOWN_BOUND
    for outcome in outcomes:
        assert isinstance(outcome, capwire.CapwireError), repr(outcome)
        assert isinstance(outcome, (capwire.Shutdown, capwire.Cancelled, capwire.PeerLost)), repr(outcome)
    with pytest.raises(capwire.CapwireError):
        await asyncio.wait_for(_drain(stream), 10)
    # The serving node lets go of the gone caller's handlers.
    await wait_until(lambda: c.cancelled == 5, what="the handlers of a gone caller being cancelled")

    # A node that shut down makes no new calls.
    with pytest.raises(capwire.CapwireError):
        await asyncio.wait_for(peer.request("app.slow", "wait", 0), 10)
    with pytest.raises(capwire.CapwireError):
        await asyncio.wait_for(client.connect(server.local_addrs()[0], server.id), 10)


CHILD_NODE = textwrap.dedent(
    """
    import asyncio, json, sys
    import capwire

    cap = capwire.Capability("app.slow", "1.0.0")

    @cap.request("wait")
    async def wait(seconds: float) -> str:
        print("started", flush=True)
        await asyncio.sleep(seconds)
        return "waited"

    async def main() -> None:
        async with capwire.Node.builder("child").listen("127.0.0.1:0").capability(cap).start() as node:
            print(json.dumps({"id": node.id, "addr": node.local_addrs()[0]}), flush=True)
            await asyncio.sleep(120)

    asyncio.run(main())
    """
)


async def test_serving_process_killed_with_calls_in_flight(nodes: Nodes, tmp_path: Path) -> None:
    script = tmp_path / "child_node.py"
    script.write_text(CHILD_NODE)
    proc = await asyncio.create_subprocess_exec(
        PYTHON, str(script), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env()
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line, "the child node printed nothing"
        info = json.loads(line)
        client = await nodes.start("py-client", listen=False)
        peer = await asyncio.wait_for(client.connect(info["addr"], info["id"]), 10)
        calls = [asyncio.create_task(peer.request("app.slow", "wait", 60)) for _ in range(3)]
        for _ in range(3):
            assert (await asyncio.wait_for(proc.stdout.readline(), 10)).strip() == b"started"
        loop = asyncio.get_running_loop()
        started = loop.time()
        proc.send_signal(signal.SIGKILL)
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 15)
        assert loop.time() - started < 10
        for outcome in outcomes:
            assert isinstance(outcome, capwire.PeerLost), repr(outcome)
    finally:
        await stop_process(proc)


EXITS_CLEANLY = textwrap.dedent(
    """
    import asyncio
    from collections.abc import AsyncIterator
    import capwire

    cap = capwire.Capability("app.t", "1.0.0")

    @cap.request("echo")
    async def echo(x: str) -> str:
        return x

    @cap.stream("ticks")
    async def ticks(x: None) -> AsyncIterator[int]:
        i = 0
        while True:
            yield i
            i += 1
            await asyncio.sleep(0.001)

    async def main() -> None:
        async with capwire.Node.builder("srv").listen("127.0.0.1:0").capability(cap).start() as srv:
            async with capwire.Node.builder("cli").start() as cli:
                peer = await cli.connect(srv.local_addrs()[0], srv.id)
                assert await peer.request("app.t", "echo", "x") == "x"
                stream = peer.stream("app.t", "ticks", None)
                async for i in stream:
                    if i == 5:
                        break
                await stream.aclose()
        # Nothing after the last shutdown: the interpreter exits at once.

    asyncio.run(main())
    """
)


async def test_process_exits_cleanly_right_after_shutdown(tmp_path: Path) -> None:
    """The last thing a program does is await a node's shutdown; it must
    exit 0 (not crash in the interpreter's teardown)."""
    script = tmp_path / "exits.py"
    script.write_text(EXITS_CLEANLY)
    for _ in range(3):
        try:
            outcomes = await asyncio.gather(*(run([PYTHON, str(script)], timeout=30) for _ in range(2)))
        except asyncio.TimeoutError:
            raise AssertionError("a program using two nodes did not finish within 30 s") from None
        for done in outcomes:
            assert done.rc == 0, f"the process did not exit cleanly (signal {-done.rc} if negative): {done}"
