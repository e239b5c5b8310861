"""The TypeScript MCP SDK's client (npm, pinned in ts/package-lock.json)
against `capwire mcp`, over stdio and streamable HTTP. It handles a
notification a step after a response read with it, so it is the client
that shows whether a call's progress all comes before its answer."""

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Cluster, HttpFace, child_env

TS = Path(__file__).resolve().parent / "ts"


@pytest.fixture(scope="module")
def node_bin() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("this suite needs Node.js and npm on PATH", pytrace=False)
    if not (TS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        done = subprocess.run(
            [npm, "ci", "--prefix", str(TS), "--no-audit", "--no-fund", "--silent"],
            capture_output=True, timeout=300, check=False,
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    return node


async def ts_client(node: str, *args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        node, str(TS / "client.mjs"), *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode(errors="replace")
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def check(seen: dict[str, Any]) -> None:
    assert seen["protocol"] == "capwire"
    assert seen["tools"] == [
        "alpha__agent__echo", "alpha__agent__note", "alpha__agent__tell", "alpha__agent__work",
    ]
    assert seen["echo"] == {"result": "alpha: ts"}
    assert seen["tell"] == {"items": ["alpha:", "one", "two", "three"], "count": 4, "truncated": False}
    assert seen["tellProgress"] == ["alpha:", "one", "two", "three"], "every item as progress"
    assert seen["work"]["result"] == "alpha: ts: done in 2 steps"
    assert any('{"of":2,"step":2}' in m for m in seen["workProgress"]), seen["workProgress"]
    assert "--allow-controller" in seen["hidden"]


async def test_the_typescript_client_over_stdio(cluster: Cluster, node_bin: str) -> None:
    check(await ts_client(node_bin, "stdio", str(cluster.binary), str(cluster.state)))


async def test_the_typescript_client_over_http(http_face: HttpFace, node_bin: str) -> None:
    check(await ts_client(node_bin, "http", http_face.mcp_url))
