"""The PyPI `agent-client-protocol` package's client (pinned in
requirements.txt) starts `capwire acp` as its agent and runs prompt turns
against `app.agent/work` of a real `capwire node`: streamed updates, a
question answered through session/request_permission, a cancel in the
middle, and a session loaded again by a new agent process (its prompts
and tasks replayed). A raw client
then sends what no SDK would: unknown and un-negotiated methods, broken
JSON, lines over the bound."""

import asyncio
import json
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    ElicitationCapabilities,
    FileSystemCapabilities,
    RequestPermissionResponse,
)

from conftest import Cluster, child_env, wait_for

#: Bounds every wait on the agent.
WAIT = 30.0


def acp_argv(cluster: Cluster, *extra: str) -> list[str]:
    return ["acp", "--state", str(cluster.state), "--verb", "app.agent/work", *extra]


class Editor:
    """What an editor does: shows updates, answers permission requests."""

    def __init__(self, choose: str = "allow_once") -> None:
        self.updates: list[tuple[str, Any]] = []
        self.asked: list[tuple[Any, list[Any]]] = []
        self.choose = choose
        self.progressed = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        if update.session_update == "tool_call_update" and update.status == "in_progress":
            self.progressed.set()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        chosen = next((o for o in options if o.kind == self.choose), None)
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )

    def kinds(self) -> list[str]:
        return [u.session_update for _, u in self.updates]

    def said(self) -> list[str]:
        return [
            u.content.text for _, u in self.updates if u.session_update == "agent_message_chunk"
        ]

    def asked_texts(self) -> list[str]:
        return [
            u.content.text for _, u in self.updates if u.session_update == "user_message_chunk"
        ]


def spawn(cluster: Cluster, editor: Editor, *extra: str) -> Any:
    return spawn_agent_process(
        editor,
        str(cluster.binary),
        *acp_argv(cluster, *extra),
        env=child_env(),
        transport_kwargs={"stderr": None},
    )


async def test_initialize_with_and_without_client_capabilities(cluster: Cluster) -> None:
    async with spawn(cluster, Editor()) as (conn, _proc):
        bare = await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), WAIT)
        assert bare.protocol_version == 1
        assert bare.agent_capabilities is not None and bare.agent_capabilities.load_session
        assert bare.agent_info is not None and bare.agent_info.name == "capwire"
        # Text prompts only: no image, audio or embedded context.
        prompt_caps = bare.agent_capabilities.prompt_capabilities
        assert prompt_caps is None or not (prompt_caps.image or prompt_caps.audio)
    caps = ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=True, write_text_file=True),
        terminal=True,
        elicitation=ElicitationCapabilities(form={}),
    )
    async with spawn(cluster, Editor()) as (conn, _proc):
        full = await asyncio.wait_for(
            conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=caps), WAIT
        )
        assert full.agent_capabilities is not None and full.agent_capabilities.load_session


async def test_a_prompt_streams_updates_and_asks_through_request_permission(
    cluster: Cluster,
) -> None:
    editor = Editor()
    args = json.dumps({"steps": 3, "step_ms": 20, "ask": True})
    async with spawn(cluster, editor, "--args", args) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        sid = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        done = await asyncio.wait_for(
            conn.prompt(session_id=sid, prompt=[text_block("build")]), WAIT
        )
        assert done.stop_reason == "end_turn"
        kinds = editor.kinds()
        assert kinds[0] == "tool_call", kinds
        assert kinds.count("tool_call_update") >= 4, kinds  # 3 steps, the result
        assert editor.said() == ["alpha: build: done in 3 steps"]
        assert all(s == sid for s, _ in editor.updates)
        # The question, as a yes-or-no permission request.
        ((tool_call, options),) = editor.asked
        assert tool_call.title == 'alpha: go on with "build" (3 steps)?'
        assert [o.kind for o in options] == ["allow_once", "reject_once"]
        completed = [u for _, u in editor.updates if getattr(u, "status", None) == "completed"]
        assert completed and completed[-1].raw_output == "alpha: build: done in 3 steps"


async def test_a_declined_question_ends_the_turn_with_the_task_s_error(cluster: Cluster) -> None:
    editor = Editor(choose="reject_once")
    args = json.dumps({"steps": 2, "step_ms": 20, "ask": True})
    async with spawn(cluster, editor, "--args", args) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        sid = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        done = await asyncio.wait_for(
            conn.prompt(session_id=sid, prompt=[text_block("risky")]), WAIT
        )
        assert done.stop_reason == "end_turn"
        assert any("declined" in s for s in editor.said()), editor.said()
        assert any(getattr(u, "status", None) == "failed" for _, u in editor.updates)


async def test_a_cancel_mid_stream_cancels_the_task(cluster: Cluster) -> None:
    editor = Editor()
    args = json.dumps({"steps": 100, "step_ms": 100})
    async with spawn(cluster, editor, "--args", args) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        sid = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("long")]))
        await asyncio.wait_for(editor.progressed.wait(), WAIT)
        await conn.cancel(session_id=sid)
        done = await asyncio.wait_for(turn, WAIT)
        assert done.stop_reason == "cancelled"
        task = next(u.tool_call_id for _, u in editor.updates if u.session_update == "tool_call")
    (record,) = await cluster.ctl_json("tasks", "alpha", "get", task)
    assert record["value"]["state"] == "canceled", record


async def test_a_session_is_loaded_again_by_a_new_agent(cluster: Cluster) -> None:
    first = Editor()
    args = json.dumps({"steps": 2, "step_ms": 20})
    async with spawn(cluster, first, "--args", args) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        sid = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        for text in ("one", "two"):
            done = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block(text)]), WAIT
            )
            assert done.stop_reason == "end_turn"
    again = Editor()
    async with spawn(cluster, again) as (conn, _proc):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        assert init.agent_capabilities is not None and init.agent_capabilities.load_session
        await asyncio.wait_for(conn.load_session(cwd="/tmp", session_id=sid, mcp_servers=[]), WAIT)
        await asyncio.sleep(0.2)
        assert again.said() == ["alpha: one: done in 2 steps", "alpha: two: done in 2 steps"]
        # What the user asked comes back, each prompt just before its task.
        assert again.asked_texts() == ["one", "two"]
        kinds = again.kinds()
        for at, kind in enumerate(kinds):
            if kind == "user_message_chunk":
                assert kinds[at + 1] == "tool_call", kinds
        # Then the same updates, in the same order: each task as a tool
        # call with the args it was given, then its events.
        assert [k for k in kinds if k != "user_message_chunk"] == first.kinds()
        calls = [u for _, u in again.updates if u.session_update == "tool_call"]
        assert [c.raw_input for c in calls] == [
            {"steps": 2, "step_ms": 20, "text": "one"},
            {"steps": 2, "step_ms": 20, "text": "two"},
        ]
        with pytest.raises(RequestError) as missing:
            await conn.load_session(cwd="/tmp", session_id="capwire-nope", mcp_servers=[])
        assert missing.value.code == -32002


async def test_a_load_follows_on_a_task_still_running(cluster: Cluster) -> None:
    first = Editor()
    args = json.dumps({"steps": 40, "step_ms": 100})
    async with spawn(cluster, first, "--args", args) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        sid = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("long")]))
        await asyncio.wait_for(first.progressed.wait(), WAIT)
        # The editor goes away mid-turn; the task goes on at the node.
        turn.cancel()
    again = Editor()
    async with spawn(cluster, again) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        await asyncio.wait_for(conn.load_session(cwd="/tmp", session_id=sid, mcp_servers=[]), WAIT)
        # Answered once replayed up to where the task is: it has not ended.
        assert again.said() == [], again.said()
        assert again.kinds()[:2] == ["user_message_chunk", "tool_call"]
        assert again.asked_texts() == ["long"]

        async def ended() -> bool:
            return again.said() == ["alpha: long: done in 40 steps"]

        await wait_for(ended, WAIT, "the rest of the task's updates after the load")
        steps = [
            u for _, u in again.updates
            if u.session_update == "tool_call_update" and u.status == "in_progress"
        ]
        assert len(steps) == 40, len(steps)


class Raw:
    """`capwire acp` spoken to line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        await self.proc.stdin.drain()

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.send(json.dumps(message).encode())
        return await self.answer()

    async def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT)
        assert line, "the agent ended"
        return json.loads(line)  # type: ignore[no-any-return]


async def test_hostile_lines_get_json_rpc_errors_and_the_agent_serves_on(cluster: Cluster) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(cluster.binary), *acp_argv(cluster),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
        limit=4 * 1024 * 1024,
    )
    raw = Raw(proc)
    try:
        # Gated and not negotiated (nothing is before initialize): -32601
        # before the params are read, so it wins over -32602.
        gated = await raw.call(
            {"jsonrpc": "2.0", "id": 1, "method": "session/load", "params": {"bad": 1}}
        )
        assert gated["id"] == 1 and gated["error"]["code"] == -32601, gated
        unknown = await raw.call({"jsonrpc": "2.0", "id": 2, "method": "no/such", "params": {}})
        assert unknown["error"]["code"] == -32601, unknown
        early = await raw.call(
            {"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}
        )
        assert early["error"]["code"] == -32600, early
        await raw.send(b"{this is not json")
        assert (await raw.answer())["error"]["code"] == -32700
        await raw.send(b"[1, 2, 3]")
        assert (await raw.answer())["error"]["code"] == -32600
        await raw.send(b'{"jsonrpc": "2.0", "id": 4, "method": 5}')
        assert (await raw.answer())["error"]["code"] == -32600
        await raw.send(b'{"jsonrpc": "2.0", "id": 5, "method": "' + b"x" * (2 * 1024 * 1024) + b'"}')
        too_long = await raw.answer()
        assert too_long["error"]["code"] == -32600 and "at most" in too_long["error"]["message"]
        # An unknown notification is dropped: nothing is answered.
        await raw.send(b'{"jsonrpc": "2.0", "method": "no/such/notification"}')
        init = await raw.call(
            {"jsonrpc": "2.0", "id": 6, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        assert init["id"] == 6 and init["result"]["agentCapabilities"]["loadSession"] is True
        bad = await raw.call(
            {"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": {"sessionId": 5}}
        )
        assert bad["error"]["code"] == -32602, bad
        nobody = await raw.call(
            {
                "jsonrpc": "2.0", "id": 8, "method": "session/prompt",
                "params": {"sessionId": "capwire-nope", "prompt": [{"type": "text", "text": "x"}]},
            }
        )
        assert nobody["error"]["code"] == -32002, nobody
        new = await raw.call(
            {"jsonrpc": "2.0", "id": 9, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}
        )
        sid = new["result"]["sessionId"]
        huge = await raw.call(
            {
                "jsonrpc": "2.0", "id": 10, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "y" * 70_000}]},
            }
        )
        assert huge["error"]["code"] == -32602 and "65536" in huge["error"]["message"], huge
        image = await raw.call(
            {
                "jsonrpc": "2.0", "id": 11, "method": "session/prompt",
                "params": {
                    "sessionId": sid,
                    "prompt": [{"type": "image", "mimeType": "image/png", "data": "AA=="}],
                },
            }
        )
        assert image["error"]["code"] == -32602, image
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), WAIT)
    assert proc.stderr is not None
    logs = await proc.stderr.read()
    assert b"\x1b[" not in logs, "no colour codes on stderr"
