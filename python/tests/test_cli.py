"""Rust calling Python: `capwire ctl call` (its own process, a Rust control
plane) against a Python node it bound with the node's invite, in every
call shape, with its output and exit codes."""

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel, Field

import capwire
from conftest import Ctl, Nodes, wait_until


class Order(BaseModel):
    item: str
    qty: int = Field(ge=1)


class Receipt(BaseModel):
    item: str
    total: int


class Job(BaseModel):
    text: str
    steps: int = 2


def py_cap(seen: dict) -> capwire.Capability:
    cap = capwire.Capability("app.py", "1.0.0")
    seen.setdefault("calls", [])
    seen["notes"] = asyncio.Queue()

    @cap.request("echo")
    async def echo(text: str, ctx: capwire.Context) -> str:
        seen["calls"].append(("echo", text, ctx.sender))
        return f"py: {text}"

    @cap.request("order")
    async def order(args: Order) -> Receipt:
        seen["calls"].append(("order", args))
        return Receipt(item=args.item, total=args.qty * 3)

    @cap.request("flip")
    async def flip(b: bytes) -> bytes:
        return b[::-1]

    @cap.request("nothing")
    async def nothing() -> None:
        seen["calls"].append(("nothing",))

    @cap.notification("note")
    async def note(text: str, ctx: capwire.Context) -> None:
        await seen["notes"].put((text, ctx.sender))

    @cap.stream("count")
    async def count(n: int) -> AsyncIterator[dict]:
        for i in range(n):
            yield {"i": i, "sq": i * i}

    @cap.task("job")
    async def job(args: Job, task: capwire.Task) -> str:
        seen["task_sender"] = task.sender
        for step in range(1, args.steps + 1):
            await task.progress({"step": step, "of": args.steps})
        go_on = await task.ask(f"go on with {args.text}?", bool, within=30)
        if not go_on:
            raise capwire.Cancelled("told to stop")
        return f"{args.text}: done"

    @cap.task("broken")
    async def broken(text: str, task: capwire.Task) -> str:
        raise capwire.Conflict(f"cannot do {text}")

    return cap


@pytest.fixture
async def bound(nodes: Nodes, ctl: Ctl) -> tuple[capwire.Node, dict, str]:
    """A Python node bound by the ctl control plane as `py`; what its
    handlers saw; the control plane's id."""
    seen: dict = {}
    node = await nodes.start("py-agent", py_cap(seen))
    record = await ctl.bind(node.invite(), "py")
    assert record["node_id"] == node.id
    return node, seen, await ctl.identity()


async def test_ctl_request(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    node, seen, ctl_id = bound
    done = await ctl.ok("call", "py", "app.py", "echo", "--args", '"hello"')
    assert done.out.strip() == "py: hello"
    done = await ctl.ok("call", "py", "app.py", "echo", "--args", '"again"', "--json")
    assert done.json_lines() == [{"kind": "result", "value": "py: again"}]
    assert seen["calls"] == [("echo", "hello", ctl_id), ("echo", "again", ctl_id)]


async def test_ctl_request_with_model_and_bytes(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    _, seen, _ = bound
    done = await ctl.ok("call", "py", "app.py", "order", "--args", '{"item": "tea", "qty": 4}', "--json")
    assert done.json_lines() == [{"kind": "result", "value": {"item": "tea", "total": 12}}]
    assert seen["calls"] == [("order", Order(item="tea", qty=4))]
    done = await ctl.ok("call", "py", "app.py", "flip", "--args", '{"$bytes": "00ff10"}', "--json")
    assert done.json_lines() == [{"kind": "result", "value": {"$bytes": "10ff00"}}]
    # A handler that takes no args gets ctl's default `{}`.
    done = await ctl.ok("call", "py", "app.py", "nothing", "--json")
    assert done.json_lines() == [{"kind": "result", "value": None}]


async def test_ctl_notify(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    _, seen, ctl_id = bound
    done = await ctl.ok("call", "py", "app.py", "note", "--args", '"fire and forget"', "--notify", "--json")
    assert done.json_lines() == [{"kind": "sent", "peer": "py", "cap": "app.py", "verb": "note"}]
    text, sender = await asyncio.wait_for(seen["notes"].get(), 10)
    assert (text, sender) == ("fire and forget", ctl_id)


async def test_ctl_stream(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    done = await ctl.ok("call", "py", "app.py", "count", "--args", "5", "--stream")
    assert [json.loads(line) for line in done.out.splitlines()] == [{"i": i, "sq": i * i} for i in range(5)]
    done = await ctl.ok("call", "py", "app.py", "count", "--args", "300", "--stream", "--json")
    records = done.json_lines()
    assert records[-1] == {"kind": "end", "items": 300}
    assert [r["item"]["i"] for r in records[:-1]] == list(range(300))
    assert [r["seq"] for r in records[:-1]] == list(range(1, 301))
    # A stream verb without --stream is refused before anything is sent.
    refused = await ctl("call", "py", "app.py", "count", "--args", "5")
    assert refused.rc == 2, str(refused)


async def test_ctl_task_wait_answer(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    _, seen, ctl_id = bound
    done = await ctl.ok(
        "call", "py", "app.py", "job", "--args", '{"text": "index", "steps": 3}', "--wait", "--answer", "true", "--json"
    )
    records = done.json_lines()
    assert records[0]["kind"] == "submitted"
    task_id = records[0]["task"]
    events = [r for r in records[1:] if r["kind"] == "event"]
    assert all(e["task"] == task_id for e in events)
    kinds = [e["event"] for e in events]
    assert [e["body"] for e in events if e["event"] == "progress"] == [{"step": s, "of": 3} for s in (1, 2, 3)]
    question = next(e for e in events if e["event"] == "question")
    assert question["body"] == "go on with index?" and question["state"] == "input_required"
    assert kinds.index("question") < kinds.index("answer") < kinds.index("result")
    assert events[-1]["event"] == "result" and events[-1]["state"] == "completed"
    assert events[-1]["body"] == "index: done"
    assert seen["task_sender"] == ctl_id
    # The text form, answered no: the handler raises Cancelled("told to
    # stop"), so the task ends canceled (exit 7), with the handler's message.
    done = await ctl("call", "py", "app.py", "job", "--args", '{"text": "t", "steps": 1}', "--wait", "--answer", "false")
    assert done.rc == 7, str(done)
    assert done.out.startswith("task "), str(done)
    assert "answer   false" in done.out and "canceled" in done.out and "failed" not in done.out, str(done)
    assert "cancelled: told to stop" in done.out, str(done)
    assert "told to stop" in done.err, str(done)


async def test_ctl_task_wait_stops_at_question(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    done = await ctl("call", "py", "app.py", "job", "--args", '{"text": "q", "steps": 1}', "--wait")
    assert done.rc == 8, str(done)
    assert "respond" in done.err, str(done)


async def test_ctl_task_that_fails(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    done = await ctl("call", "py", "app.py", "broken", "--args", '"x"', "--wait", "--json")
    assert done.rc == 4, str(done)
    events = [r for r in done.json_lines() if r["kind"] == "event"]
    assert events[-1]["state"] == "failed", str(done)
    assert events[-1]["event"] == "error", str(done)
    assert events[-1]["body"] == {"code": "conflict", "message": "cannot do x"}, str(done)
    assert "conflict: cannot do x" in done.err, str(done)


async def test_ctl_denied_and_bad_args(bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    _, seen, _ = bound
    unknown = await ctl("call", "py", "app.py", "no_such_verb")
    assert unknown.rc == 3, str(unknown)
    assert "unknown_verb" in unknown.err
    no_cap = await ctl("call", "py", "app.nope", "echo", "--args", '"x"')
    assert no_cap.rc == 3, str(no_cap)
    bad = await ctl("call", "py", "app.py", "order", "--args", '{"item": "tea", "qty": 0}')
    assert bad.rc == 4, str(bad)
    assert "bad_args" in bad.err and "qty" in bad.err
    assert seen["calls"] == []


async def test_ctl_calls_while_python_calls_too(nodes: Nodes, bound: tuple[capwire.Node, dict, str], ctl: Ctl) -> None:
    """The same verb called by ctl processes and a Python peer at once."""
    node, seen, _ = bound
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(node.local_addrs()[0], node.id), 10)
    results = await asyncio.gather(
        *(ctl.ok("call", "py", "app.py", "echo", "--args", json.dumps(f"c{i}")) for i in range(4)),
        *(peer.request("app.py", "echo", f"p{i}", result=str) for i in range(20)),
    )
    assert sorted(r.out.strip() for r in results[:4]) == [f"py: c{i}" for i in range(4)]
    assert results[4:] == [f"py: p{i}" for i in range(20)]
    await wait_until(lambda: len(seen["calls"]) == 24, what="24 echo calls")
