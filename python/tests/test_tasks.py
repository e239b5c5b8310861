"""Task verbs served in Python: progress events, questions answered by
the submitter, results, failures, cancellation, the task log."""

import asyncio

import pytest
from pydantic import BaseModel

import capwire
from conftest import Nodes, wait_until


class Plan(BaseModel):
    name: str
    steps: int


class Report(BaseModel):
    name: str
    done: int
    approved_by: str


def task_cap(seen: dict) -> capwire.Capability:
    cap = capwire.Capability("app.jobs", "1.0.0")

    @cap.task("build")
    async def build(plan: Plan, task: capwire.Task, ctx: capwire.Context) -> Report:
        seen["sender"] = (task.sender, ctx.sender)
        seen["id"] = task.id
        seen["resumed"] = task.resumed
        for step in range(1, plan.steps + 1):
            await task.progress({"step": step, "of": plan.steps})
        who = await task.ask({"question": f"approve {plan.name}?"}, str, within=30)
        return Report(name=plan.name, done=plan.steps, approved_by=who)

    @cap.task("sleepy")
    async def sleepy(seconds: float, task: capwire.Task) -> str:
        await task.progress("asleep")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            seen["sleepy_cancelled"] = True
            raise
        return "awake"

    @cap.task("impatient")
    async def impatient(x: None, task: capwire.Task) -> str:
        try:
            await task.ask("anyone?", bool, within=0.3)
        except capwire.NoAnswer:
            seen["no_answer"] = True
            raise capwire.Unavailable("nobody answered") from None
        return "answered"

    @cap.task("picky")
    async def picky(x: None, task: capwire.Task) -> int:
        return await task.ask("a number?", int, within=10)

    return cap


async def test_task_progress_question_answer_result(nodes: Nodes) -> None:
    seen: dict = {}
    _, client, peer = await nodes.pair(task_cap(seen))
    handle = await asyncio.wait_for(peer.submit("app.jobs", "build", Plan(name="site", steps=3), result=Report), 10)
    assert isinstance(handle.id, str) and handle.id

    events: list[capwire.TaskEvent] = []

    async def follow() -> None:
        async for ev in handle.events():
            events.append(ev)
            if ev.kind == "question":
                assert ev.state == "input_required"
                assert ev.body == {"question": "approve site?"}
                info = await handle.get()
                assert info["state"] == "input_required" and info["question_seq"] == ev.seq
                await handle.respond("alice", question_seq=ev.seq)

    await asyncio.wait_for(follow(), 20)
    report = await asyncio.wait_for(handle.result(), 10)
    assert report == Report(name="site", done=3, approved_by="alice")

    kinds = [e.kind for e in events]
    assert [e.body for e in events if e.kind == "progress"] == [{"step": s, "of": 3} for s in (1, 2, 3)]
    assert kinds.index("progress") < kinds.index("question") < kinds.index("answer") < kinds.index("result")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].final and events[-1].state == "completed"
    assert not any(e.final for e in events[:-1])
    assert seen["sender"] == (client.id, client.id)
    assert seen["id"] == handle.id and seen["resumed"] is False

    info = await asyncio.wait_for(handle.get(), 10)
    assert info["state"] == "completed"
    assert info["result"] == {"name": "site", "done": 3, "approved_by": "alice"}
    assert info["progress"] == {"step": 3, "of": 3}
    # The log can be read again from any seq.
    again = [e async for e in handle.events(start=events[-2].seq)]
    assert [e.seq for e in again] == [events[-2].seq, events[-1].seq]
    # A handle by id on the same peer sees the same task.
    same = peer.task(handle.id, Report)
    assert await asyncio.wait_for(same.result(), 10) == report


async def test_task_cancelled_by_submitter(nodes: Nodes) -> None:
    seen: dict = {}
    _, _, peer = await nodes.pair(task_cap(seen))
    handle = await asyncio.wait_for(peer.submit("app.jobs", "sleepy", 30), 10)

    async def until_progress() -> None:
        async for ev in handle.events():
            if ev.kind == "progress":
                return

    await asyncio.wait_for(until_progress(), 10)
    info = await asyncio.wait_for(handle.cancel(), 10)
    assert info["state"] == "canceled"
    with pytest.raises(capwire.Cancelled):
        await asyncio.wait_for(handle.result(), 10)
    await wait_until(lambda: seen.get("sleepy_cancelled"), what="the task's handler seeing CancelledError")


async def test_task_question_without_answer(nodes: Nodes) -> None:
    seen: dict = {}
    _, _, peer = await nodes.pair(task_cap(seen))
    handle = await asyncio.wait_for(peer.submit("app.jobs", "impatient", None), 10)
    with pytest.raises(capwire.Unavailable) as info:
        await asyncio.wait_for(handle.result(), 10)
    assert info.value.message == "nobody answered"
    assert seen["no_answer"] is True
    assert (await asyncio.wait_for(handle.get(), 10))["state"] == "failed"


async def test_task_answer_of_the_wrong_type(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(task_cap({}))
    handle = await asyncio.wait_for(peer.submit("app.jobs", "picky", None), 10)

    async def answer_badly() -> None:
        async for ev in handle.events():
            if ev.kind == "question":
                await handle.respond("not a number")
                return

    await asyncio.wait_for(answer_badly(), 10)
    with pytest.raises(capwire.BadArgs) as info:
        await asyncio.wait_for(handle.result(), 10)
    assert "answer" in info.value.message


async def test_task_submitted_with_bad_args(nodes: Nodes) -> None:
    seen: dict = {}
    server, _, peer = await nodes.pair(task_cap(seen))
    # Refused like a typed task's: checked before the task is written.
    with pytest.raises(capwire.BadArgs) as info:
        await asyncio.wait_for(peer.submit("app.jobs", "build", {"name": "x"}), 10)
    assert "steps" in info.value.message
    assert "sender" not in seen
    kept = [line for line in server.metrics_text().splitlines() if line.startswith("capwire_tasks{")]
    assert kept and all(line.endswith(" 0") for line in kept), kept


async def test_same_req_id_is_the_same_task(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(task_cap({}))
    first = await asyncio.wait_for(peer.submit("app.jobs", "sleepy", 0.01, req_id="job-1"), 10)
    second = await asyncio.wait_for(peer.submit("app.jobs", "sleepy", 0.01, req_id="job-1"), 10)
    assert first.id == second.id
    assert await asyncio.wait_for(first.result(), 10) == "awake"


def asking_cap(seen: dict[int, str]) -> capwire.Capability:
    cap = capwire.Capability("app.asking", "1.0.0")

    @cap.task("ask")
    async def ask(n: int, task: capwire.Task) -> str:
        try:
            await task.ask(f"question {n}", bool, within=60)
        except asyncio.CancelledError:
            seen[n] = "CancelledError"
            raise
        except BaseException as e:
            seen[n] = repr(e)
            raise
        seen[n] = "answered"
        return "answered"

    @cap.task("decline")
    async def decline(why: str, task: capwire.Task) -> str:
        if not await task.ask("go on?", bool, within=60):
            raise capwire.Cancelled(why)
        return "went on"

    return cap


async def test_cancel_while_the_handler_asks_is_cancelled_error_every_time(nodes: Nodes) -> None:
    """The cancel reaches the handler as asyncio.CancelledError inside
    task.ask, never as the failed question's TaskError, however soon after
    the question it comes (the two race to the loop)."""
    seen: dict[int, str] = {}
    _, _, peer = await nodes.pair(asking_cap(seen))
    count, at_once = 180, 20
    delays = [(n % 41) * 0.005 for n in range(count)]  # 0 to 200 ms after the question

    async def cancel_after_question(n: int) -> None:
        handle = await peer.submit("app.asking", "ask", n)
        async for ev in handle.events():
            if ev.kind == "question":
                break
        if delays[n]:
            await asyncio.sleep(delays[n])
        info = await handle.cancel()
        assert info["state"] == "canceled", info
        with pytest.raises(capwire.Cancelled):
            await handle.result()

    for first in range(0, count, at_once):
        batch = range(first, min(first + at_once, count))
        await asyncio.wait_for(asyncio.gather(*(cancel_after_question(n) for n in batch)), 60)
    await wait_until(lambda: len(seen) == count, 20, what="every handler ending")
    wrong = {n: what for n, what in seen.items() if what != "CancelledError"}
    assert not wrong, f"{len(wrong)} of {count} handlers did not see CancelledError: {sorted(wrong.items())[:5]}"


async def test_handler_raising_cancelled_cancels_its_task_with_its_message(nodes: Nodes) -> None:
    _, _, peer = await nodes.pair(asking_cap({}))
    handle = await asyncio.wait_for(peer.submit("app.asking", "decline", "not today"), 10)

    async def decline() -> None:
        async for ev in handle.events():
            if ev.kind == "question":
                await handle.respond(False)
                return

    await asyncio.wait_for(decline(), 10)
    with pytest.raises(capwire.Cancelled) as info:
        await asyncio.wait_for(handle.result(), 10)
    assert info.value.code == "cancelled" and info.value.message == "not today"
    record = await asyncio.wait_for(handle.get(), 10)
    assert record["state"] == "canceled", record
    assert record["error"] == {"code": "cancelled", "message": "not today"}, record
    last = [ev async for ev in handle.events()][-1]
    assert last.final and last.state == "canceled" and last.body == {"code": "cancelled", "message": "not today"}


async def test_task_cancelled_by_its_submitter_says_so(nodes: Nodes) -> None:
    seen: dict[int, str] = {}
    _, _, peer = await nodes.pair(asking_cap(seen))
    handle = await asyncio.wait_for(peer.submit("app.asking", "ask", 1), 10)
    await asyncio.wait_for(handle.cancel(), 10)
    with pytest.raises(capwire.Cancelled) as info:
        await asyncio.wait_for(handle.result(), 10)
    assert info.value.message == "cancelled by its submitter"
