"""The same over streamable HTTP: the `mcp` package's client against
`capwire mcp --http`, and hostile HTTP requests to it."""

import asyncio
import json
import logging
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from conftest import Cluster, HttpFace, start_http, stop_process, wait_for


def names(listing: types.ListToolsResult) -> set[str]:
    return {tool.name for tool in listing.tools}


async def test_tools_calls_streams_and_refusals_over_http(http_face: HttpFace) -> None:
    async with Client(http_face.mcp_url) as client:
        assert names(await client.list_tools()) == {
            "alpha__agent__echo",
            "alpha__agent__note",
            "alpha__agent__tell",
            "alpha__agent__work",
        }
        echo = await client.call_tool("alpha__agent__echo", {"value": "over http"})
        assert echo.structured_content == {"result": "alpha: over http"}

        seen: list[str | None] = []

        async def progress(p: float, total: float | None, message: str | None) -> None:
            seen.append(message)

        told = await client.call_tool("alpha__agent__tell", {"value": "a b"}, progress_callback=progress)
        assert told.structured_content == {"items": ["alpha:", "a", "b"], "count": 3, "truncated": False}
        assert [json.loads(m or "null") for m in seen] == ["alpha:", "a", "b"]

        with pytest.raises(MCPError) as refused:
            await client.call_tool("alpha__agent__ask", {"peer": "00" * 32, "text": "x"})
        assert "--allow-controller" in str(refused.value)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_list_changes_over_http(cluster: Cluster, http_face: HttpFace, mode: str) -> None:
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with Client(http_face.mcp_url, mode=mode, message_handler=on_message) as client:  # type: ignore[arg-type]
        before = names(await client.list_tools())
        assert not any(n.startswith("beta__") for n in before)
        if client.protocol_version == "2026-07-28":
            async with client.listen(tools_list_changed=True) as events:
                await cluster.start_agent("beta")
                await asyncio.wait_for(events.__anext__(), 20)
        else:
            # A legacy session gets the change on its standalone stream.
            await cluster.start_agent("beta")
            await asyncio.wait_for(changed.wait(), 20)

        async def listed() -> bool:
            return "beta__agent__echo" in names(await client.list_tools(cache_mode="refresh"))

        await wait_for(listed, what="beta's tools")
        answer = await client.call_tool("beta__agent__echo", {"value": "hi"})
        assert answer.structured_content == {"result": "beta: hi"}


async def test_hostile_http_requests_get_errors_and_the_server_stays(http_face: HttpFace) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        # Not JSON at all.
        r = await http.post(http_face.mcp_url, content=b"{not json", headers=headers)
        assert 400 <= r.status_code < 500, r.text
        # Too large (over 4 MiB).
        huge = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"' + b"a" * (5 << 20) + b'"}}'
        # (On a connection of its own: the server closes it, the body unread.)
        r = await http.post(http_face.mcp_url, content=huge, headers={**headers, "Connection": "close"})
        assert r.status_code == 413, r.status_code
        # Another Host: refused (DNS rebinding).
        r = await http.post(http_face.mcp_url, content=b"{}", headers={**headers, "Host": "evil.example"})
        assert r.status_code == 403, r.status_code
        # Paths that are not served.
        r = await http.get(f"{http_face.base}/nothing")
        assert r.status_code == 404
        r = await http.post(f"{http_face.base}/.well-known/agent-card.json", content=b"")
        assert r.status_code == 405
    # Still serving.
    async with Client(http_face.mcp_url) as client:
        assert "alpha__agent__echo" in names(await client.list_tools())


async def test_a_non_loopback_address_is_refused(cluster: Cluster) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(cluster.binary), *cluster.mcp_argv("--http", "0.0.0.0:0"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 15)
        assert proc.returncode == 2, err
        assert b"loopback" in err
    finally:
        await stop_process(proc)


async def test_two_faces_share_one_control_plane(cluster: Cluster, http_face: HttpFace) -> None:
    # The second finds the state directory owned by the first and hands
    # its calls to it.
    second = await start_http(cluster)
    try:
        async with Client(second.mcp_url) as client:
            echo = await client.call_tool("alpha__agent__echo", {"value": "via the owner"})
            assert echo.structured_content == {"result": "alpha: via the owner"}
    finally:
        await stop_process(second.proc)


async def test_a_controller_verb_and_a_denial_over_http(cluster: Cluster) -> None:
    me = await cluster.identity()
    face = await start_http(cluster, "--allow-controller")
    try:
        async with Client(face.mcp_url) as client:
            probe = {"peer": me, "cap": "core.monitoring", "verb": "status"}
            ok = await client.call_tool("alpha__agent__probe", probe)
            assert ok.structured_content == {"result": "ok"}, ok
            await cluster.ctl("disable", "alpha")
            denied = await client.call_tool("alpha__agent__probe", probe)
            assert denied.is_error and denied.structured_content is not None
            assert denied.structured_content["code"] == "unauthorized"
    finally:
        await stop_process(face.proc)


INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}},
}


async def test_mcp_sessions_are_bounded(http_face: HttpFace) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        opened = []
        for _ in range(64):
            r = await http.post(http_face.mcp_url, json=INIT, headers=headers)
            assert r.status_code == 200, r.text
            opened.append(r.headers["mcp-session-id"])
        r = await http.post(http_face.mcp_url, json=INIT, headers=headers)
        assert r.status_code == 503, r.status_code
        # One closed makes room for one more.
        r = await http.delete(http_face.mcp_url, headers={**headers, "mcp-session-id": opened[0]})
        assert r.status_code == 200, r.status_code

        async def room() -> bool:
            r = await http.post(http_face.mcp_url, json=INIT, headers=headers)
            return r.status_code == 200

        await wait_for(room, what="a session slot freed")


async def test_a_session_closed_is_answered_200_and_the_client_warns_of_nothing(
    http_face: HttpFace, caplog: pytest.LogCaptureFixture
) -> None:
    # A session (the initialize handshake) that the client ends with a
    # DELETE when it closes. The `mcp` client takes 200 or 204 and warns
    # of anything else ("Session termination failed: 202").
    caplog.set_level(logging.INFO)
    async with Client(http_face.mcp_url, mode="legacy") as client:
        assert "alpha__agent__echo" in names(await client.list_tools())
    deletes = [r.getMessage() for r in caplog.records if "DELETE" in r.getMessage()]
    assert len(deletes) == 1 and '"HTTP/1.1 200 OK"' in deletes[0], deletes
    warned = [r.getMessage() for r in caplog.records
              if r.name.startswith("mcp") and r.levelno >= logging.WARNING]
    assert warned == [], warned

    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(http_face.mcp_url, json=INIT, headers=headers)
        session = {**headers, "mcp-session-id": r.headers["mcp-session-id"]}
        r = await http.delete(http_face.mcp_url, headers=session)
        assert r.status_code == 200 and r.content == b"", (r.status_code, r.content)
        # It is gone: a request in it, or closing it again, is answered 404.
        r = await http.post(http_face.mcp_url, headers=session,
                            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert r.status_code == 404, r.status_code
        r = await http.delete(http_face.mcp_url, headers=session)
        assert r.status_code == 404, r.status_code


async def test_a_slow_request_head_is_cut_off(http_face: HttpFace) -> None:
    host, port = http_face.base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    started = asyncio.get_running_loop().time()
    writer.write(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    await writer.drain()
    # The head never ends: the server answers (408) or closes within its
    # 5 s bound.
    await asyncio.wait_for(reader.read(), 15)
    assert asyncio.get_running_loop().time() - started < 10
    writer.close()
