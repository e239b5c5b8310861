"""Calls of the wrong kind: a request on a stream or task verb, a stream or
a submit on a request verb, ... are refused with `WrongKind` before
anything is sent (the peer's manifest gives each verb's kind), as `capwire
ctl` and the typed Rust API refuse them; no handler runs, no task is
written."""

import asyncio
from collections.abc import AsyncIterator, Awaitable

import pytest

import capwire
from conftest import Nodes, wait_until

#: A refusal is immediate; a call that was sent would wait its whole
#: deadline (30 s by default) on some of these.
PROMPT = 10


def kinds_cap(ran: list) -> capwire.Capability:
    cap = capwire.Capability("app.kinds", "1.0.0")

    @cap.request("ask")
    async def ask(text: str) -> str:
        ran.append(("ask", text))
        return f"answer to {text}"

    @cap.notification("note")
    async def note(text: str) -> None:
        ran.append(("note", text))

    @cap.stream("count")
    async def count(n: int) -> AsyncIterator[int]:
        ran.append(("count", n))
        for i in range(n):
            yield i

    @cap.task("job")
    async def job(text: str, task: capwire.Task) -> str:
        ran.append(("job", text))
        return f"did {text}"

    return cap


def tasks_kept(node: capwire.Node) -> list[str]:
    return [line for line in node.metrics_text().splitlines() if line.startswith("capwire_tasks{")]


async def refused(call: Awaitable[object], fits: str) -> capwire.WrongKind:
    with pytest.raises(capwire.WrongKind) as info:
        await asyncio.wait_for(call, PROMPT)
    e = info.value
    assert isinstance(e, capwire.CapwireError) and e.code is None
    assert fits in e.message, e.message
    return e


async def drain(stream: capwire.Stream[object]) -> list[object]:
    return [item async for item in stream]


async def test_request_on_a_stream_verb_is_refused_at_once(nodes: Nodes) -> None:
    ran: list = []
    _, _, peer = await nodes.pair(kinds_cap(ran))
    e = await refused(peer.request("app.kinds", "count", 3), "peer.stream()")
    assert "app.kinds/count is a stream verb" in e.message
    # The session and the verb are fine for the call that fits.
    assert await asyncio.wait_for(drain(peer.stream("app.kinds", "count", 3)), PROMPT) == [0, 1, 2]
    assert ran == [("count", 3)]


async def test_stream_on_a_request_verb_is_refused_and_nothing_runs(nodes: Nodes) -> None:
    ran: list = []
    _, _, peer = await nodes.pair(kinds_cap(ran))
    await refused(drain(peer.stream("app.kinds", "ask", "x")), "peer.request()")
    # As an async context manager too (the stream opens on entry).
    with pytest.raises(capwire.WrongKind):
        async with peer.stream("app.kinds", "ask", "y"):
            pass
    assert await asyncio.wait_for(peer.request("app.kinds", "ask", "z", result=str), PROMPT) == "answer to z"
    assert ran == [("ask", "z")]


async def test_submit_on_a_request_verb_is_refused_and_nothing_runs(nodes: Nodes) -> None:
    ran: list = []
    _, _, peer = await nodes.pair(kinds_cap(ran))
    await refused(peer.submit("app.kinds", "ask", "x"), "peer.request()")
    assert await asyncio.wait_for(peer.request("app.kinds", "ask", "z", result=str), PROMPT) == "answer to z"
    assert ran == [("ask", "z")]


async def test_request_on_a_task_verb_submits_no_task(nodes: Nodes) -> None:
    ran: list = []
    server, _, peer = await nodes.pair(kinds_cap(ran))
    await refused(peer.request("app.kinds", "job", "x"), "peer.submit()")
    kept = tasks_kept(server)
    assert kept and all(line.endswith(" 0") for line in kept), kept
    handle = await asyncio.wait_for(peer.submit("app.kinds", "job", "y", result=str), PROMPT)
    assert await asyncio.wait_for(handle.result(), PROMPT) == "did y"
    assert ran == [("job", "y")]


async def test_notifications_and_requests_do_not_mix(nodes: Nodes) -> None:
    ran: list = []
    _, _, peer = await nodes.pair(kinds_cap(ran))
    # A notification on a request verb would be dropped by the peer, unseen.
    await refused(peer.notify("app.kinds", "ask", "x"), "peer.request()")
    await refused(peer.notify("app.kinds", "count", 1), "peer.stream()")
    await refused(peer.notify("app.kinds", "job", "x"), "peer.submit()")
    await refused(peer.request("app.kinds", "note", "x"), "peer.notify()")
    await refused(drain(peer.stream("app.kinds", "note", "x")), "peer.notify()")
    await refused(peer.submit("app.kinds", "count", 1), "peer.stream()")
    await refused(drain(peer.stream("app.kinds", "job", "x")), "peer.submit()")
    # Each call of the right kind still goes through.
    await asyncio.wait_for(peer.notify("app.kinds", "note", "n"), PROMPT)
    assert await asyncio.wait_for(peer.request("app.kinds", "ask", "a", result=str), PROMPT) == "answer to a"
    await wait_until(lambda: ("note", "n") in ran, what="the notification handled")
    assert sorted(ran) == [("ask", "a"), ("note", "n")]


async def test_a_verb_the_manifest_lacks_is_left_to_the_peer(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(kinds_cap([]))
    with pytest.raises(capwire.UnknownVerb):
        await asyncio.wait_for(peer.request("app.kinds", "nope", None), PROMPT)
    with pytest.raises(capwire.UnknownVerb):
        await asyncio.wait_for(peer.submit("app.nope", "job", None), PROMPT)


async def test_core_verbs_are_checked_too(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(kinds_cap([]))
    # core.tasks/subscribe is a stream verb.
    await refused(peer.request("core.tasks", "subscribe", {"task": "00" * 16}), "peer.stream()")


async def test_wrong_kinds_on_a_rust_node(nodes: Nodes, rust_bench: capwire.Node) -> None:
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(rust_bench.local_addrs()[0], rust_bench.id), 10)
    await refused(peer.request("app.bench", "flood", [3, 1]), "peer.stream()")
    await refused(drain(peer.stream("app.bench", "echo", "x")), "peer.request()")
    await refused(peer.submit("app.bench", "echo", "x"), "peer.request()")
    await refused(peer.request("app.bench", "sink", "x"), "peer.notify()")
    assert await asyncio.wait_for(peer.request("app.bench", "echo", "x"), PROMPT) == "x"


async def test_a_contact_not_yet_connected_is_checked_once_its_session_is_up(nodes: Nodes) -> None:
    ran: list = []
    server = await nodes.start("py-server", kinds_cap(ran))
    builder = capwire.Node.builder("py-client").contact("server", server.id, server.local_addrs()[0])
    client = nodes.adopt(await asyncio.wait_for(builder.start(), 15))
    peer = client.peer(server.id)
    # The call waits for the contact's session, then reads its manifest.
    await refused(peer.request("app.kinds", "count", 2), "peer.stream()")
    assert await asyncio.wait_for(peer.request("app.kinds", "ask", "c", result=str), PROMPT) == "answer to c"
    assert ran == [("ask", "c")]
