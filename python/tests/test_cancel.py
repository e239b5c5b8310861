"""Cancellation both ways: a Python caller that gives up cancels the Python
handler at the peer, and a Rust caller's cancel (its deadline, Ctrl-C on a
stream) cancels the Python handler's coroutine or stream generator."""

import asyncio
import json
import signal
from collections.abc import AsyncIterator

import pytest

import capwire
from conftest import Ctl, Nodes, stop_process


class Watch:
    """What the handlers saw."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.finished = asyncio.Event()
        self.gen_closed = asyncio.Event()
        self.gen_exit: str | None = None
        self.items = 0


def slow_cap(w: Watch) -> capwire.Capability:
    cap = capwire.Capability("app.slow", "1.0.0")

    @cap.request("wait")
    async def wait(seconds: float) -> str:
        w.started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            w.cancelled.set()
            raise
        w.finished.set()
        return "waited"

    @cap.request("quick")
    async def quick(x: None) -> str:
        return "quick"

    @cap.stream("ticks")
    async def ticks(period: float) -> AsyncIterator[int]:
        i = 0
        try:
            while True:
                yield i
                w.items = i = i + 1
                await asyncio.sleep(period)
        except BaseException as e:
            w.gen_exit = type(e).__name__
            raise
        finally:
            w.gen_closed.set()

    return cap


async def expect_cancelled(w: Watch) -> None:
    await asyncio.wait_for(w.cancelled.wait(), 10)
    assert not w.finished.is_set()


async def test_wait_for_timeout_cancels_python_handler(nodes: Nodes) -> None:
    w = Watch()
    _, _, peer = await nodes.pair(slow_cap(w))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(peer.request("app.slow", "wait", 30), 0.5)
    assert w.started.is_set()
    await expect_cancelled(w)
    # The session carries on.
    assert await asyncio.wait_for(peer.request("app.slow", "quick", None), 10) == "quick"


async def test_task_cancel_cancels_python_handler(nodes: Nodes) -> None:
    w = Watch()
    _, _, peer = await nodes.pair(slow_cap(w))
    call = asyncio.create_task(peer.request("app.slow", "wait", 30))
    await asyncio.wait_for(w.started.wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await expect_cancelled(w)


async def test_call_timeout_cancels_python_handler(nodes: Nodes) -> None:
    w = Watch()
    _, _, peer = await nodes.pair(slow_cap(w))
    with pytest.raises(capwire.Timeout):
        await asyncio.wait_for(peer.request("app.slow", "wait", 30, timeout=0.5), 10)
    await expect_cancelled(w)


async def test_ctl_deadline_cancels_python_handler(nodes: Nodes, ctl: Ctl) -> None:
    w = Watch()
    node = await nodes.start("py-slow", slow_cap(w))
    await ctl.bind(node.invite(), "py")
    loop = asyncio.get_running_loop()
    started = loop.time()
    done = await ctl("call", "py", "app.slow", "wait", "--args", "30", "--timeout", "1s")
    assert done.rc == 5, str(done)
    assert loop.time() - started < 10
    assert w.started.is_set()
    await expect_cancelled(w)


async def test_python_consumer_leaving_early_cancels_generator(nodes: Nodes) -> None:
    w = Watch()
    _, _, peer = await nodes.pair(slow_cap(w))
    stream = peer.stream("app.slow", "ticks", 0.01, item=int)
    got = []
    async for i in stream:
        got.append(i)
        if len(got) == 5:
            break
    assert got == [0, 1, 2, 3, 4]
    await stream.aclose()
    await asyncio.wait_for(w.gen_closed.wait(), 10)
    assert w.gen_exit in ("CancelledError", "GeneratorExit"), w.gen_exit
    # A closed stream yields nothing more.
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_stream_context_manager_closes_at_peer(nodes: Nodes) -> None:
    w = Watch()
    _, _, peer = await nodes.pair(slow_cap(w))
    async with peer.stream("app.slow", "ticks", 0.01, item=int) as stream:
        assert await asyncio.wait_for(stream.__anext__(), 10) == 0
    await asyncio.wait_for(w.gen_closed.wait(), 10)


async def test_ctl_stream_interrupted_cancels_generator(nodes: Nodes, ctl: Ctl) -> None:
    w = Watch()
    node = await nodes.start("py-slow", slow_cap(w))
    await ctl.bind(node.invite(), "py")
    proc = await ctl.spawn("call", "py", "app.slow", "ticks", "--args", "0.01", "--stream", "--json")
    try:
        assert proc.stdout is not None
        records = []
        while len(records) < 5:
            line = await asyncio.wait_for(proc.stdout.readline(), 10)
            assert line, "ctl call --stream ended early"
            records.append(json.loads(line))
        assert [r["item"] for r in records] == [0, 1, 2, 3, 4]
        proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 15)
        assert proc.returncode == 0, err
        last = json.loads(rest.splitlines()[-1])
        assert last["kind"] == "cancelled", rest
        await asyncio.wait_for(w.gen_closed.wait(), 10)
        assert w.gen_exit in ("CancelledError", "GeneratorExit"), w.gen_exit
        # Stopped for good: no more items are made.
        made = w.items
        await asyncio.sleep(0.2)
        assert w.items == made
    finally:
        await stop_process(proc)


async def test_ctl_stream_killed_cancels_generator(nodes: Nodes, ctl: Ctl) -> None:
    """The ctl process dies (no goodbye): the session's end cancels it."""
    w = Watch()
    node = await nodes.start("py-slow", slow_cap(w))
    await ctl.bind(node.invite(), "py")
    proc = await ctl.spawn("call", "py", "app.slow", "ticks", "--args", "0.01", "--stream")
    try:
        assert proc.stdout is not None
        for _ in range(3):
            assert await asyncio.wait_for(proc.stdout.readline(), 10)
        proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
        await asyncio.wait_for(w.gen_closed.wait(), 15)
    finally:
        await stop_process(proc)
