"""Streams: credit-based flow both ways, memory flat under a slow
consumer, errors in the middle of a stream, items checked as typed."""

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

import capwire
from conftest import Nodes

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """This process's resident set, in bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


async def test_slow_consumer_of_fast_rust_stream_keeps_memory_flat(nodes: Nodes, rust_bench: capwire.Node) -> None:
    n, size = 20000, 1024
    total = n * size  # 20 MB on the wire
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_bench.local_addrs()[0], rust_bench.id), 10)
    expected = b"\x07" * size

    async def consume() -> tuple[int, int, int]:
        got, peak, base = 0, 0, 0
        async for item in peer.stream("app.bench", "flood", [n, size], item=bytes):
            if got == 0:
                # The session and the stream are set up: measure from here.
                base = peak = rss()
            assert item == expected, f"item {got} is {item[:16]!r}... ({len(item)} bytes)"
            got += 1
            if got % 100 == 0:
                peak = max(peak, rss())
                await asyncio.sleep(0.002)
        return got, base, peak

    got, base, peak = await asyncio.wait_for(consume(), 45)
    assert got == n
    growth = peak - base
    assert growth < 10 * 1024 * 1024, f"RSS grew by {growth / 1e6:.1f} MB while {total / 1e6:.0f} MB streamed"


async def test_producer_waits_for_slow_python_consumer(nodes: Nodes) -> None:
    made = [0]
    closed = asyncio.Event()
    cap = capwire.Capability("app.s", "1.0.0")

    @cap.stream("forever")
    async def forever(x: None) -> AsyncIterator[int]:
        i = 0
        try:
            while True:
                yield i
                i += 1
                made[0] = i
        finally:
            closed.set()

    _, _, peer = await nodes.pair(cap)
    stream = peer.stream("app.s", "forever", None, item=int)
    taken = []
    async for i in stream:
        taken.append(i)
        if len(taken) == 10:
            break
    assert taken == list(range(10))
    # The producer runs ahead by at most its window of credit, then waits.
    await asyncio.sleep(0.5)
    first = made[0]
    await asyncio.sleep(0.5)
    assert made[0] == first, "the producer kept going without credit"
    assert first < 10 + 5000, f"the producer ran {first} items ahead of a consumer that took 10"
    await stream.aclose()
    await asyncio.wait_for(closed.wait(), 10)


async def test_stream_error_midway(nodes: Nodes) -> None:
    cap = capwire.Capability("app.s", "1.0.0")

    @cap.stream("fails")
    async def fails(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
        raise capwire.Unavailable("ran dry")

    @cap.stream("crashes")
    async def crashes(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
        raise RuntimeError("secret internals")

    _, _, peer = await nodes.pair(cap)
    got: list[int] = []
    with pytest.raises(capwire.Unavailable) as info:
        async for i in peer.stream("app.s", "fails", 3, item=int):
            got.append(i)
    assert got == [0, 1, 2]
    assert info.value.message == "ran dry"

    got = []
    with pytest.raises(capwire.Internal) as crash:
        async for i in peer.stream("app.s", "crashes", 2, item=int):
            got.append(i)
    assert got == [0, 1]
    assert "secret" not in str(crash.value)


async def test_stream_items_checked_against_item_type(nodes: Nodes) -> None:
    cap = capwire.Capability("app.s", "1.0.0")

    @cap.stream("words")
    async def words(x: None) -> AsyncIterator[str]:
        yield "one"
        yield "two"

    _, _, peer = await nodes.pair(cap)
    with pytest.raises(capwire.BadResult):
        async for _ in peer.stream("app.s", "words", None, item=int):
            pass
    assert [w async for w in peer.stream("app.s", "words", None, item=str)] == ["one", "two"]


async def test_stream_bad_args_before_first_item(nodes: Nodes) -> None:
    started = []
    cap = capwire.Capability("app.s", "1.0.0")

    @cap.stream("count")
    async def count(n: int) -> AsyncIterator[int]:
        started.append(n)
        for i in range(n):
            yield i

    _, _, peer = await nodes.pair(cap)
    with pytest.raises(capwire.BadArgs):
        async for _ in peer.stream("app.s", "count", "many"):
            pass
    assert started == []


async def test_many_streams_at_once(nodes: Nodes, rust_bench: capwire.Node) -> None:
    cap = capwire.Capability("app.s", "1.0.0")

    @cap.stream("count")
    async def count(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
            if i % 50 == 0:
                await asyncio.sleep(0)

    _, client, peer = await nodes.pair(cap)
    rust = await asyncio.wait_for(client.connect(rust_bench.local_addrs()[0], rust_bench.id), 10)

    async def from_python(n: int) -> list[int]:
        return [i async for i in peer.stream("app.s", "count", n, item=int)]

    async def from_rust(n: int) -> int:
        return sum([1 async for _ in rust.stream("app.bench", "flood", [n, 16])])

    results = await asyncio.wait_for(
        asyncio.gather(*(from_python(200 + k) for k in range(8)), *(from_rust(1000 + k) for k in range(4))), 30
    )
    for k, got in enumerate(results[:8]):
        assert got == list(range(200 + k))
    assert results[8:] == [1000, 1001, 1002, 1003]
