"""The `mcp` package's client starts `capwire mcp` over stdio against a
real cluster: it lists the tools, calls a request verb, a stream verb
(with progress), a task verb, a denied verb and a hidden controller verb,
and sees the list change when a node is created."""

import asyncio
import json
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from conftest import Cluster, child_env, wait_for


def params(cluster: Cluster, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(cluster.binary), args=cluster.mcp_argv(*extra), env=child_env()
    )


def names(listing: types.ListToolsResult) -> set[str]:
    return {tool.name for tool in listing.tools}


def structured(result: types.CallToolResult) -> Any:
    assert result.structured_content is not None, result
    return result.structured_content


class Progress:
    def __init__(self) -> None:
        self.seen: list[tuple[float, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, message))


async def test_tools_are_the_app_verbs_with_their_schemas(cluster: Cluster) -> None:
    async with Client(params(cluster)) as client:
        listing = await client.list_tools()
        assert names(listing) == {
            "alpha__agent__echo",
            "alpha__agent__note",
            "alpha__agent__tell",
            "alpha__agent__work",
        }, "bootstrap app.* verbs only: no core verb, no controller verb"
        tools = {t.name: t for t in listing.tools}
        echo = tools["alpha__agent__echo"]
        assert "app.agent/echo" in (echo.description or "")
        # echo takes a string: the tool takes it as "value".
        assert echo.input_schema["properties"]["value"]["type"] == "string"
        assert echo.output_schema is not None
        work = tools["alpha__agent__work"].input_schema
        assert work["type"] == "object" and "text" in work["properties"]
        assert client.server_capabilities.tools is not None
        assert client.server_capabilities.tools.list_changed is True


async def test_a_request_a_notification_a_stream_and_a_task(cluster: Cluster) -> None:
    async with Client(params(cluster)) as client:
        echo = await client.call_tool("alpha__agent__echo", {"value": "hello"})
        assert not echo.is_error, echo
        assert structured(echo) == {"result": "alpha: hello"}

        note = await client.call_tool("alpha__agent__note", {"value": "a note"})
        assert not note.is_error and structured(note) == {"sent": True}

        progress = Progress()
        told = await client.call_tool(
            "alpha__agent__tell", {"value": "one two three"}, progress_callback=progress
        )
        assert not told.is_error, told
        words = ["alpha:", "one", "two", "three"]
        assert structured(told) == {"items": words, "count": 4, "truncated": False}
        assert [json.loads(m or "null") for _, m in progress.seen] == words
        assert [p for p, _ in progress.seen] == [1, 2, 3, 4], "progress increases"

        progress = Progress()
        worked = await client.call_tool(
            "alpha__agent__work",
            {"text": "build", "steps": 3, "step_ms": 20},
            progress_callback=progress,
        )
        assert not worked.is_error, worked
        out = structured(worked)
        assert out["result"] == "alpha: build: done in 3 steps"
        assert len(out["task"]) == 32
        messages = [m or "" for _, m in progress.seen]
        assert any('{"of":3,"step":3}' in m for m in messages), messages
        assert messages[0].startswith(f"task {out['task']} submitted")


async def test_bad_args_are_a_tool_error_with_the_code(cluster: Cluster) -> None:
    async with Client(params(cluster)) as client:
        # Refused by the node's args check (the schema says a string).
        bad = await client.call_tool("alpha__agent__work", {"text": 5})
        assert bad.is_error
        assert structured(bad)["code"] == "bad_args"
        # Refused by the verb's own args check, before a task exists.
        zero = await client.call_tool("alpha__agent__work", {"text": "x", "steps": 0})
        assert zero.is_error and structured(zero)["code"] == "bad_args"
        # Refused here: the wrapped args are missing.
        missing = await client.call_tool("alpha__agent__echo", {"text": "hi"})
        assert missing.is_error and structured(missing)["code"] == "bad_args"
        assert "value" in structured(missing)["message"]


async def test_a_hidden_controller_verb_is_refused_and_never_sent(cluster: Cluster) -> None:
    me = await cluster.identity()
    async with Client(params(cluster)) as client, cluster.watching() as watch:
        with pytest.raises(MCPError) as refused:
            await client.call_tool(
                "alpha__agent__probe",
                {"peer": me, "cap": "core.monitoring", "verb": "status"},
            )
        assert "--allow-controller" in str(refused.value)
        await client.call_tool("alpha__agent__echo", {"value": "after"})
        calls: list[str] = []
        while "echo" not in calls:
            calls.append((await watch.next_call())["verb"])
        assert "probe" not in calls, calls


async def test_controller_verbs_with_the_flag_and_a_denial(cluster: Cluster) -> None:
    me = await cluster.identity()
    async with Client(params(cluster, "--allow-controller")) as client:
        listing = await client.list_tools()
        assert {"alpha__agent__probe", "alpha__agent__ask"} <= names(listing)
        probe_args = {"peer": me, "cap": "core.monitoring", "verb": "status"}
        ok = await client.call_tool("alpha__agent__probe", probe_args)
        assert not ok.is_error and structured(ok) == {"result": "ok"}
        # This control plane gives alpha up (through the mcp server):
        # alpha's chokepoint now refuses its controller verbs.
        await cluster.ctl("disable", "alpha")
        denied = await client.call_tool("alpha__agent__probe", probe_args)
        assert denied.is_error, denied
        assert structured(denied)["code"] == "unauthorized"
        text = denied.content[0]
        assert isinstance(text, types.TextContent) and "unauthorized" in text.text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_list_changes_when_a_node_is_created(cluster: Cluster, mode: str) -> None:
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with Client(params(cluster), mode=mode, message_handler=on_message) as client:  # type: ignore[arg-type]
        assert "child-1__agent__echo" not in names(await client.list_tools())

        async def create() -> None:
            await cluster.ctl("cluster", "--peer", "alpha", "create", "child-1")
            await cluster.ctl("cluster", "--peer", "alpha", "set-monitoring", "child-1", "on")

        if client.protocol_version == "2026-07-28":
            async with client.listen(tools_list_changed=True) as events:
                await create()
                await asyncio.wait_for(events.__anext__(), 20)
        else:
            await create()
            await asyncio.wait_for(changed.wait(), 20)

        async def listed() -> bool:
            return "child-1__agent__echo" in names(await client.list_tools(cache_mode="refresh"))

        await wait_for(listed, what="child-1's tools")
        answer = await client.call_tool("child-1__agent__echo", {"value": "hi"})
        assert structured(answer) == {"result": "child-1: hi"}


async def test_a_question_a_long_stream_and_one_node(cluster: Cluster) -> None:
    await cluster.start_agent("beta")
    async with Client(params(cluster, "--node", "alpha")) as client:
        assert all(n.startswith("alpha__") for n in names(await client.list_tools()))

        # A task that asks: the call ends, saying how to answer.
        asked = await client.call_tool("alpha__agent__work", {"text": "x", "ask": True})
        assert asked.is_error, asked
        out = structured(asked)
        assert out["code"] == "input_required", out
        assert "capwire ctl tasks" in out["message"] and len(out["task"]) == 32

        # More items than are kept: all counted, 1,000 kept.
        text = " ".join(["w"] * 1_200)
        long = await client.call_tool("alpha__agent__tell", {"value": text})
        out = structured(long)
        assert out["count"] == 1_201 and out["truncated"] is True
        assert len(out["items"]) == 1_000 and out["items"][0] == "alpha:"


async def test_a_call_the_client_cancels_is_cancelled_at_the_node(cluster: Cluster) -> None:
    async with Client(params(cluster)) as client, cluster.watching() as watch:
        first = asyncio.Event()

        async def progress(p: float, total: float | None, message: str | None) -> None:
            first.set()
            await asyncio.sleep(0.01)

        # 200,000 words: far more than go by before the cancel.
        call = asyncio.create_task(
            client.call_tool(
                "alpha__agent__tell", {"value": " ".join(["w"] * 200_000)},
                progress_callback=progress,
            )
        )
        await asyncio.wait_for(first.wait(), 15)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        record = await watch.next_call()
        while record.get("verb") != "tell":
            record = await watch.next_call()
        assert record["error"] == "cancelled" and record["items"] < 200_001, record
        # The server goes on.
        echo = await client.call_tool("alpha__agent__echo", {"value": "after"})
        assert structured(echo) == {"result": "alpha: after"}
