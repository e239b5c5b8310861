"""A hostile MCP client on stdio, written by hand: malformed and huge
JSON-RPC, unknown methods, arguments of the wrong shape. Each gets an
MCP error (or is dropped), and the server goes on serving."""

import asyncio
import json
from typing import Any

import pytest

from conftest import Cluster, child_env, stop_process


class Raw:
    """`capwire mcp` on stdio, spoken to line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.early: dict[Any, dict[str, Any]] = {}

    async def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        await self.proc.stdin.drain()

    async def request(self, id: int, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(json.dumps(message).encode())

    async def answer(self, id: int) -> dict[str, Any]:
        """The response to request `id` (notifications skipped, responses
        to other requests kept for later)."""
        assert self.proc.stdout is not None
        while id not in self.early:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 20)
            assert line, f"capwire mcp closed its output (exit {self.proc.returncode})"
            message = json.loads(line)
            if "id" in message and "method" not in message:
                self.early[message["id"]] = message
        return self.early.pop(id)


@pytest.fixture
async def raw(cluster: Cluster) -> Any:
    proc = await asyncio.create_subprocess_exec(
        str(cluster.binary), *cluster.mcp_argv(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=child_env(),
        limit=1 << 20,
    )
    client = Raw(proc)
    try:
        await client.request(1, "initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        })
        assert "result" in await client.answer(1)
        await client.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        yield client
    finally:
        await stop_process(proc)


async def test_malformed_unknown_and_wrongly_shaped_requests(raw: Raw) -> None:
    await raw.send(b"{this is not json")
    await raw.send(b'{"jsonrpc":"2.0","id":2,"method":')
    await raw.send(b"[1, 2, 3]")
    await raw.request(3, "no/such/method", {})
    unknown = await raw.answer(3)
    assert unknown["error"]["code"] == -32601, unknown

    await raw.request(4, "tools/call", {"name": "alpha__agent__echo", "arguments": 5})
    shaped = await raw.answer(4)
    # rmcp cannot read it as a tools/call at all.
    assert shaped["error"]["code"] in (-32602, -32601, -32600), shaped

    await raw.request(5, "tools/call", {"name": "nobody__agent__echo", "arguments": {}})
    missing = await raw.answer(5)
    assert missing["error"]["code"] == -32602, missing

    await raw.request(6, "tools/call", {"name": "alpha__agent__probe", "arguments": {}})
    hidden = await raw.answer(6)
    assert hidden["error"]["code"] == -32602 and "--allow-controller" in hidden["error"]["message"]

    await raw.request(7, "tools/call", {"name": "alpha__agent__echo", "arguments": {"value": "still here"}})
    ok = await raw.answer(7)
    assert ok["result"]["structuredContent"] == {"result": "alpha: still here"}, ok


async def test_a_huge_line_is_dropped_and_the_next_one_served(raw: Raw) -> None:
    # Over the 16 MiB line bound.
    await raw.send(b'{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"x":"' + b"a" * (17 << 20) + b'"}}')
    await raw.request(9, "tools/list", {})
    listing = await raw.answer(9)
    assert any(t["name"] == "alpha__agent__echo" for t in listing["result"]["tools"])


async def test_a_flood_of_calls_is_bounded(raw: Raw) -> None:
    # 300 calls at once: at most 64 run, the others are refused
    # `overloaded` or wait their turn; every one is answered.
    for i in range(300):
        await raw.request(100 + i, "tools/call", {
            "name": "alpha__agent__work", "arguments": {"text": "x", "steps": 1, "step_ms": 200},
        })
    codes: dict[str, int] = {}
    for i in range(300):
        answer = await raw.answer(100 + i)
        result = answer["result"]
        code = result["structuredContent"].get("code", "ok") if result.get("isError") else "ok"
        codes[code] = codes.get(code, 0) + 1
    assert set(codes) <= {"ok", "overloaded"}, codes
    assert codes.get("ok", 0) >= 64, codes
    assert codes.get("overloaded", 0) >= 1, codes
