"""Denied and failed calls raise the exception of their error code; a
handler's own exception stays on its node (logged), the caller gets
`internal` with no detail."""

import asyncio
import json
import logging

import pytest
from pydantic import BaseModel, ConfigDict, Field

import capwire
from conftest import Nodes


class Order(BaseModel):
    item: str = Field(min_length=1)
    qty: int = Field(ge=1, le=10)


class Receipt(BaseModel):
    item: str
    total: int


class Strict(BaseModel):
    """Args as the README advises: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")
    name: str
    loud: bool = False


SECRET = "the database password is hunter2"


def cap_under_test(ran: list) -> capwire.Capability:
    cap = capwire.Capability("app.err", "1.0.0")

    @cap.request("order")
    async def order(args: Order) -> Receipt:
        ran.append(("order", args))
        return Receipt(item=args.item, total=args.qty)

    @cap.request("admin", auth="controller")
    async def admin(x: int) -> int:
        ran.append(("admin", x))
        return x

    @cap.request("slow")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    @cap.request("boom")
    async def boom(x: int) -> int:
        ran.append(("boom", x))
        raise ValueError(SECRET)

    @cap.request("refuse")
    async def refuse(what: str) -> str:
        raise capwire.NotFound(f"no {what} here")

    @cap.request("text")
    async def text(x: int) -> str:
        return "not a number"

    @cap.request("unsendable")
    async def unsendable(x: int) -> object:
        return object()

    @cap.request("strict")
    async def strict(args: Strict) -> str:
        ran.append(("strict", args))
        return args.name.upper() if args.loud else args.name

    @cap.task("strict_task")
    async def strict_task(args: Strict, task: capwire.Task) -> str:
        ran.append(("strict_task", args))
        return args.name

    @cap.task("task_boom")
    async def task_boom(x: int, task: capwire.Task) -> int:
        raise KeyError(SECRET)

    return cap


@pytest.fixture
async def peer(nodes: Nodes) -> tuple[capwire.Peer, list]:
    ran: list = []
    _, _, peer = await nodes.pair(cap_under_test(ran))
    return peer, ran


async def test_unknown_verb(peer: tuple[capwire.Peer, list]) -> None:
    p, _ = peer
    with pytest.raises(capwire.UnknownVerb) as info:
        await asyncio.wait_for(p.request("app.err", "no_such_verb", 1), 10)
    assert info.value.code == "unknown_verb"
    assert isinstance(info.value, capwire.Denied)
    assert isinstance(info.value, capwire.CapwireError)
    with pytest.raises(capwire.UnknownVerb):
        await asyncio.wait_for(p.request("app.no_such_cap", "order", 1), 10)
    # A notification or a stream of an unknown verb fails too.
    with pytest.raises(capwire.UnknownVerb):
        async for _ in p.stream("app.err", "no_such_stream", 1):
            pass
    with pytest.raises(capwire.UnknownVerb):
        await asyncio.wait_for(p.submit("app.err", "no_such_task", 1), 10)


async def test_controller_verb_from_unbound_caller(peer: tuple[capwire.Peer, list]) -> None:
    p, ran = peer
    with pytest.raises(capwire.Unauthorized) as info:
        await asyncio.wait_for(p.request("app.err", "admin", 5), 10)
    assert info.value.code == "unauthorized"
    assert isinstance(info.value, capwire.Denied)
    await asyncio.sleep(0.1)
    assert ran == []


async def test_args_failing_the_schema(peer: tuple[capwire.Peer, list]) -> None:
    p, ran = peer
    for bad in ({"item": "tea", "qty": 0}, {"item": "", "qty": 1}, {"qty": 1}, "tea", None, [1, 2]):
        with pytest.raises(capwire.BadArgs) as info:
            await asyncio.wait_for(p.request("app.err", "order", bad), 10)
        assert info.value.code == "bad_args"
        assert not isinstance(info.value, capwire.Denied)
    # The message says which field, without echoing the input.
    with pytest.raises(capwire.BadArgs) as info:
        await asyncio.wait_for(p.request("app.err", "order", {"item": "tea", "qty": 99}), 10)
    assert "qty" in info.value.message
    assert "99" not in info.value.message
    await asyncio.sleep(0.1)
    assert ran == []
    # Good args do reach it.
    assert await asyncio.wait_for(p.request("app.err", "order", Order(item="t", qty=2), result=Receipt), 10) == Receipt(item="t", total=2)
    assert ran == [("order", Order(item="t", qty=2))]


async def test_result_not_matching_result_type(peer: tuple[capwire.Peer, list]) -> None:
    p, _ = peer
    with pytest.raises(capwire.BadResult) as info:
        await asyncio.wait_for(p.request("app.err", "text", 1, result=int), 10)
    assert isinstance(info.value, capwire.CapwireError)
    with pytest.raises(capwire.BadResult):
        await asyncio.wait_for(p.request("app.err", "order", {"item": "a", "qty": 1}, result=list[int]), 10)
    # Without result= the raw value comes through.
    assert await asyncio.wait_for(p.request("app.err", "text", 1), 10) == "not a number"


async def test_timeout(peer: tuple[capwire.Peer, list]) -> None:
    p, _ = peer
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(capwire.Timeout) as info:
        await asyncio.wait_for(p.request("app.err", "slow", 30, timeout=0.5), 10)
    assert loop.time() - started < 5
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, capwire.CapwireError)
    assert info.value.code == "timeout"
    # The session is fine afterwards.
    assert await asyncio.wait_for(p.request("app.err", "slow", 0, timeout=5), 10) == "slept"


async def test_handler_exception_is_internal_and_logged(peer: tuple[capwire.Peer, list], caplog: pytest.LogCaptureFixture) -> None:
    p, ran = peer
    caplog.set_level(logging.ERROR, logger="capwire")
    with pytest.raises(capwire.Internal) as info:
        await asyncio.wait_for(p.request("app.err", "boom", 1), 10)
    err = info.value
    assert err.code == "internal"
    for text in (str(err), repr(err), err.message):
        assert SECRET not in text
        assert "Traceback" not in text and "ValueError" not in text and ".py" not in text
    assert ran == [("boom", 1)]
    records = [r for r in caplog.records if r.name == "capwire" and r.levelno >= logging.ERROR]
    assert records, "the handler's exception was not logged"
    logged = records[-1]
    assert "app.err/boom" in logged.getMessage()
    assert logged.exc_info is not None and logged.exc_info[0] is ValueError
    assert SECRET in caplog.text


async def test_task_handler_exception_is_internal_and_logged(peer: tuple[capwire.Peer, list], caplog: pytest.LogCaptureFixture) -> None:
    p, _ = peer
    caplog.set_level(logging.ERROR, logger="capwire")
    handle = await asyncio.wait_for(p.submit("app.err", "task_boom", 1), 10)
    with pytest.raises(capwire.Internal) as info:
        await asyncio.wait_for(handle.result(), 10)
    assert SECRET not in str(info.value)
    state = await asyncio.wait_for(handle.get(), 10)
    assert state["state"] == "failed"
    assert state["error"]["code"] == "internal" and SECRET not in state["error"]["message"]
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records if r.name == "capwire")


async def test_handler_result_that_cannot_be_sent(peer: tuple[capwire.Peer, list], caplog: pytest.LogCaptureFixture) -> None:
    p, _ = peer
    caplog.set_level(logging.ERROR, logger="capwire")
    with pytest.raises(capwire.Internal):
        await asyncio.wait_for(p.request("app.err", "unsendable", 1), 10)
    assert any("app.err/unsendable" in r.getMessage() for r in caplog.records if r.name == "capwire")


async def test_capwire_error_raised_by_handler_keeps_code_and_message(peer: tuple[capwire.Peer, list], caplog: pytest.LogCaptureFixture) -> None:
    p, _ = peer
    caplog.set_level(logging.ERROR, logger="capwire")
    with pytest.raises(capwire.NotFound) as info:
        await asyncio.wait_for(p.request("app.err", "refuse", "cheese"), 10)
    assert info.value.code == "not_found"
    assert info.value.message == "no cheese here"
    assert str(info.value) == "not_found: no cheese here"
    # An answer the handler meant is not an error of the node.
    assert not [r for r in caplog.records if r.name == "capwire" and "refuse" in r.getMessage()]


async def test_unreachable_and_encode_errors(nodes: Nodes) -> None:
    client = await nodes.start("py-client", listen=False)
    with pytest.raises(capwire.CapwireError):
        # Nothing listens there (port 1 on loopback refuses).
        await asyncio.wait_for(client.connect("127.0.0.1:1"), 10)
    server, _, p = await nodes.pair(cap_under_test([]))
    with pytest.raises(capwire.EncodeError) as info:
        await asyncio.wait_for(p.request("app.err", "order", {"item": object()}), 10)
    assert isinstance(info.value, TypeError)
    with pytest.raises(capwire.EncodeError):
        await asyncio.wait_for(p.notify("app.err", "order", object()), 10)
    with pytest.raises(ValueError):
        client.peer("not a node id")


async def test_misspelt_optional_argument_of_a_forbidding_model_is_bad_args(nodes: Nodes) -> None:
    ran: list = []
    server, _, p = await nodes.pair(cap_under_test(ran))
    assert await asyncio.wait_for(p.request("app.err", "strict", {"name": "ada", "loud": True}), 10) == "ADA"
    with pytest.raises(capwire.BadArgs) as info:
        await asyncio.wait_for(p.request("app.err", "strict", {"name": "ada", "lowd": True}), 10)
    assert "lowd" in info.value.message
    with pytest.raises(capwire.BadArgs) as info:
        await asyncio.wait_for(p.submit("app.err", "strict_task", {"name": "ada", "lowd": True}), 10)
    assert "lowd" in info.value.message
    assert [r[0] for r in ran] == ["strict"]
    # The manifest's schema says so to every caller.
    (cap,) = [c for c in server.manifest()["capabilities"] if c["id"] == "app.err"]
    (verb,) = [v for v in cap["verbs"] if v["name"] == "strict"]
    schema = json.loads(verb["args_schema"])
    assert schema["additionalProperties"] is False, schema
