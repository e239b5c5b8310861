"""Every call shape, Python to Python in one process and Python to Rust
(a `capwire node` child process and the in-process Rust bench node)."""

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, Field

import capwire
from capwire._runtime import bridge
from conftest import Nodes, RustAgent, start_rust_bench_node, wait_until


class Order(BaseModel):
    item: str
    qty: int = Field(ge=1)
    tags: list[str] = []


class Receipt(BaseModel):
    item: str
    total: int
    tags: list[str]


class Blob(BaseModel):
    name: str
    data: bytes


@dataclasses.dataclass
class Point:
    x: int
    y: int
    label: str = ""


def shapes(seen: dict[str, Any]) -> capwire.Capability:
    cap = capwire.Capability("app.shapes", "1.2.3")
    notes: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
    seen["notes"] = notes

    @cap.request("order")
    async def order(args: Order, ctx: capwire.Context) -> Receipt:
        seen.setdefault("order_senders", []).append(ctx.sender)
        return Receipt(item=args.item.upper(), total=args.qty * 10, tags=sorted(args.tags))

    @cap.request("mirror")
    async def mirror(p: Point) -> Point:
        return Point(x=-p.x, y=-p.y, label=p.label[::-1])

    @cap.request("bytes")
    async def echo_bytes(b: bytes) -> bytes:
        return b[::-1]

    @cap.request("blob")
    async def blob(b: Blob) -> Blob:
        return Blob(name=b.name * 2, data=b.data[::-1])

    @cap.notification("note")
    async def note(text: str, ctx: capwire.Context) -> None:
        await notes.put((text, ctx.sender, ctx.req_id))

    @cap.stream("count")
    async def count(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    @cap.stream("points")
    async def points(n: int) -> AsyncIterator[Point]:
        for i in range(n):
            yield Point(x=i, y=i * i, label=f"p{i}")

    return cap


async def test_request_with_pydantic_models(nodes: Nodes) -> None:
    seen: dict[str, Any] = {}
    server, client, peer = await nodes.pair(shapes(seen))
    got = await asyncio.wait_for(
        peer.request("app.shapes", "order", Order(item="tea", qty=3, tags=["b", "a"]), result=Receipt), 10
    )
    assert got == Receipt(item="TEA", total=30, tags=["a", "b"])
    assert seen["order_senders"] == [client.id]
    # Plain data in, plain data out without result=.
    raw = await asyncio.wait_for(peer.request("app.shapes", "order", {"item": "x", "qty": 1}), 10)
    assert raw == {"item": "X", "total": 10, "tags": []}


async def test_request_with_dataclass(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(shapes({}))
    got = await asyncio.wait_for(peer.request("app.shapes", "mirror", Point(3, -4, "abc"), result=Point), 10)
    assert got == Point(-3, 4, "cba")
    assert isinstance(got, Point)


async def test_request_with_bytes(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(shapes({}))
    payload = bytes(range(256))
    got = await asyncio.wait_for(peer.request("app.shapes", "bytes", payload, result=bytes), 10)
    assert got == payload[::-1]


async def test_request_with_bytes_inside_a_model(nodes: Nodes) -> None:
    """Bytes in a model stay bytes both ways, UTF-8 or not."""
    _, _, peer = await nodes.pair(shapes({}))
    data = b"\xff\x00\xfe"
    got = await asyncio.wait_for(peer.request("app.shapes", "blob", Blob(name="ab", data=data), result=Blob), 10)
    assert got == Blob(name="abab", data=data[::-1])
    raw = await asyncio.wait_for(peer.request("app.shapes", "blob", {"name": "x", "data": data}), 10)
    assert raw == {"name": "xx", "data": data[::-1]}


async def test_notification_reaches_handler_with_sender(nodes: Nodes) -> None:
    seen: dict[str, Any] = {}
    _, client, peer = await nodes.pair(shapes(seen))
    await asyncio.wait_for(peer.notify("app.shapes", "note", "first"), 10)
    await asyncio.wait_for(peer.notify("app.shapes", "note", "second"), 10)
    notes: asyncio.Queue[tuple[str, str, str]] = seen["notes"]
    got = [await asyncio.wait_for(notes.get(), 10) for _ in range(2)]
    assert sorted(text for text, _, _ in got) == ["first", "second"]
    assert all(sender == client.id for _, sender, _ in got)
    assert all(req_id == "" for _, _, req_id in got)


async def test_stream_items_in_order(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(shapes({}))

    async def collect() -> list[int]:
        return [i async for i in peer.stream("app.shapes", "count", 500, item=int)]

    assert await asyncio.wait_for(collect(), 20) == list(range(500))

    async def collect_points() -> list[Point]:
        return [p async for p in peer.stream("app.shapes", "points", 5, item=Point)]

    assert await asyncio.wait_for(collect_points(), 10) == [Point(i, i * i, f"p{i}") for i in range(5)]


async def test_empty_stream(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(shapes({}))

    async def collect() -> list[int]:
        return [i async for i in peer.stream("app.shapes", "count", 0)]

    assert await asyncio.wait_for(collect(), 10) == []


async def test_manifest_declares_verbs_and_schemas(nodes: Nodes) -> None:
    server, _, peer = await nodes.pair(shapes({}))
    manifest = peer.manifest()
    assert manifest is not None
    (cap,) = [c for c in manifest["capabilities"] if c["id"] == "app.shapes"]
    assert cap["version"] == "1.2.3"
    kinds = {v["name"]: v["kind"] for v in cap["verbs"]}
    assert kinds == {
        "order": "request",
        "mirror": "request",
        "bytes": "request",
        "blob": "request",
        "note": "notification",
        "count": "stream",
        "points": "stream",
    }
    order = next(v for v in cap["verbs"] if v["name"] == "order")
    assert "qty" in order["args_schema"] and "total" in order["result_schema"]
    assert server.manifest()["node_id"] == bytes.fromhex(server.id)


# Python -> Rust: a `capwire node` child process.


async def test_python_requests_rust_node(nodes: Nodes, rust_agent: RustAgent) -> None:
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_agent.addr, rust_agent.id), 10)
    assert peer.id == rust_agent.id
    got = await asyncio.wait_for(peer.request("app.agent", "echo", "hello from python", result=str), 10)
    assert got == f"{rust_agent.name}: hello from python"


async def test_python_streams_from_rust_node(nodes: Nodes, rust_agent: RustAgent) -> None:
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_agent.addr, rust_agent.id), 10)

    async def collect() -> list[str]:
        return [w async for w in peer.stream("app.agent", "tell", "one two three four", item=str)]

    assert await asyncio.wait_for(collect(), 10) == [f"{rust_agent.name}:", "one", "two", "three", "four"]


async def test_python_submits_task_to_rust_node(nodes: Nodes, rust_agent: RustAgent) -> None:
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_agent.addr, rust_agent.id), 10)
    handle = await asyncio.wait_for(
        peer.submit("app.agent", "work", {"text": "index", "ask": True, "steps": 3, "step_ms": 10}, result=str), 10
    )
    kinds: list[str] = []
    progress: list[dict] = []

    async def follow() -> None:
        async for ev in handle.events():
            kinds.append(ev.kind)
            if ev.kind == "question":
                assert "go on" in ev.body
                await handle.respond(True, question_seq=ev.seq)
            elif ev.kind == "progress":
                progress.append(ev.body)

    await asyncio.wait_for(follow(), 20)
    assert await asyncio.wait_for(handle.result(), 10) == f"{rust_agent.name}: index: done in 3 steps"
    assert progress == [{"step": 1, "of": 3}, {"step": 2, "of": 3}, {"step": 3, "of": 3}]
    assert kinds.index("question") < kinds.index("answer") < kinds.index("progress")
    assert kinds[-1] == "result"
    info = await asyncio.wait_for(handle.get(), 10)
    assert info["state"] == "completed" and info["task"] == handle.id


async def test_python_notifies_rust_node(nodes: Nodes, rust_agent: RustAgent) -> None:
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_agent.addr, rust_agent.id), 10)
    await asyncio.wait_for(peer.notify("app.agent", "note", "a note from python"), 10)
    # The note is logged once handled; an echo after it on the same
    # session is answered after the note was taken.
    await asyncio.wait_for(peer.request("app.agent", "echo", "sync", result=str), 10)
    log = await rust_agent.stop()
    assert "note: a note from python" in log, log
    assert client.id in log, log


# Python -> Rust: the in-process Rust bench node.


async def test_python_requests_in_process_rust_node(nodes: Nodes, rust_bench: capwire.Node) -> None:
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_bench.local_addrs()[0], rust_bench.id), 10)
    value = {"a": [1, 2.5, None, True, "x", b"\x00\xff"], "n": -(2**63)}
    assert await asyncio.wait_for(peer.request("app.bench", "echo", value), 10) == value
    await asyncio.wait_for(peer.notify("app.bench", "sink", [1, 2, 3]), 10)


async def test_rust_calls_python_node(nodes: Nodes) -> None:
    """The bench node calls a Python handler from Rust (bench.rust_calls)."""
    from capwire._capwire import bench

    calls: list[bytes] = []
    cap = capwire.Capability("app.echo", "1.0.0")

    @cap.request("echo")
    async def echo(b: bytes) -> bytes:
        calls.append(b)
        return b

    server = await nodes.start("py-server", cap)
    rust = nodes.adopt(await start_rust_bench_node())
    await asyncio.wait_for(rust.connect(server.local_addrs()[0], server.id), 10)
    seconds = await asyncio.wait_for(bench.rust_calls(rust._native, server.id, "app.echo", "echo", b"abc", 20), 30)
    assert seconds > 0
    assert calls == [b"abc"] * 20
    await wait_until(lambda: rust.id in server.connected_peers(), what="the Rust node showing as connected")


async def test_many_concurrent_calls_all_complete(nodes: Nodes) -> None:
    """Rounds of 200 concurrent requests between two Python nodes on one
    loop: every answer, handler start and outcome crosses the loop's
    bridge; none may be left waiting while the loop idles."""
    cap = capwire.Capability("app.load", "1.0.0")

    @cap.request("echo")
    async def echo(i: int) -> int:
        return i

    _, _, peer = await nodes.pair(cap)
    for round_ in range(50):
        calls = [asyncio.ensure_future(peer.request("app.load", "echo", i, result=int)) for i in range(200)]
        done, pending = await asyncio.wait(calls, timeout=10)
        if pending:
            # What the loop would have run on its next wake-up.
            bridge().drain()
            _, still = await asyncio.wait(pending, timeout=5)
            for call in still:
                call.cancel()
            raise AssertionError(
                f"round {round_}: {len(pending)} of 200 calls still waiting after 10 s with the loop idle; "
                f"draining the loop's bridge by hand released {len(pending) - len(still)} of them: the bridge "
                "lost a wake-up of the loop (python/src/bridge.rs: Bridge::drain clears `armed` before it "
                "empties the wake-up socket, so a byte written meanwhile is swallowed and `armed` stays set)"
            )
        assert sorted(c.result() for c in done) == list(range(200))
