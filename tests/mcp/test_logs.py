"""What `capwire` writes on stderr: plain text when stderr is no terminal
(a pipe, as an MCP host, a supervisor or a log file has it), whatever the
subcommand; colour only for a terminal, and not there either with
NO_COLOR set."""

import asyncio
import contextlib
import json
import os
import pty
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from conftest import Cluster, child_env, stop_process

ESC = b"\x1b"


def plain_env(**extra: str) -> dict[str, str]:
    """The children's environment without NO_COLOR (which the other tests
    set): only where stderr goes decides."""
    env = child_env(**extra)
    env.pop("NO_COLOR", None)
    return env


async def all_of(stream: asyncio.StreamReader | None) -> bytes:
    assert stream is not None
    return await asyncio.wait_for(stream.read(), 30)


async def test_a_node_logs_plain_text_to_a_pipe(cluster: Cluster) -> None:
    # At its own level (info): being bound is logged.
    proc = await asyncio.create_subprocess_exec(
        str(cluster.binary), "node", "--json", "--name", "piped", "--listen", "127.0.0.1:0",
        "--state", str(cluster.state.parent / "node-piped"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=plain_env(),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 15)
        assert line, f"capwire node printed nothing (exit {proc.returncode})"
        invite = json.loads(line)["invite"]
        # Its stderr as it comes, while it runs.
        seen: list[bytes] = []

        async def pump() -> None:
            assert proc.stderr is not None
            while chunk := await proc.stderr.read(4096):
                seen.append(chunk)

        pumping = asyncio.ensure_future(pump())
        await cluster.ctl("bind", invite, "--name", "piped")

        async def bound() -> None:
            while b"bound to a control plane" not in b"".join(seen):
                await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(bound(), 15)
        except TimeoutError:
            raise AssertionError(f"no log of the bind: {b''.join(seen)!r}") from None
        await stop_process(proc)
        await asyncio.wait_for(pumping, 15)
    finally:
        await stop_process(proc)
    logged = b"".join(seen)
    assert b"bound to a control plane" in logged, logged
    assert ESC not in logged, logged


async def test_the_http_face_logs_plain_text_to_a_pipe(cluster: Cluster) -> None:
    # At its own level (warn): a request for another Host is logged.
    proc = await asyncio.create_subprocess_exec(
        str(cluster.binary), *cluster.mcp_argv("--http", "0"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=plain_env(),
    )
    try:
        assert proc.stderr is not None
        first = await asyncio.wait_for(proc.stderr.readline(), 20)
        base = first.decode().split("MCP at ", 1)[1].strip().removesuffix("/mcp")
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{base}/mcp", content=b"{}", headers={"Host": "evil.example"})
            assert r.status_code == 403
            await http.get(f"{base}/.well-known/agent-card.json", headers={"Host": "evil.example"})
        await stop_process(proc)
        logged = first + await all_of(proc.stderr)
    finally:
        await stop_process(proc)
    assert b"evil.example" in logged, logged
    assert ESC not in logged, logged


async def test_mcp_over_stdio_ctl_and_demo_log_plain_text_to_a_pipe(cluster: Cluster, tmp_path: Path) -> None:
    # RUST_LOG makes each of them log.
    env = plain_env(RUST_LOG="debug")
    init = json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}},
    }).encode() + b"\n"
    mcp = await asyncio.create_subprocess_exec(
        str(cluster.binary), *cluster.mcp_argv(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        # It answers, then ends when its input does.
        _, logged = await asyncio.wait_for(mcp.communicate(init), 30)
    finally:
        await stop_process(mcp)
    assert b"DEBUG" in logged, logged
    assert ESC not in logged, logged

    ctl = await asyncio.create_subprocess_exec(
        *cluster.ctl_argv("manifest", "alpha"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        _, logged = await asyncio.wait_for(ctl.communicate(), 30)
    finally:
        await stop_process(ctl)
    assert ctl.returncode == 0 and b"DEBUG" in logged, logged
    assert ESC not in logged, logged

    demo = await asyncio.create_subprocess_exec(
        str(cluster.binary), "demo",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env=plain_env(RUST_LOG="info"),
    )
    try:
        _, logged = await asyncio.wait_for(demo.communicate(), 90)
    finally:
        await stop_process(demo)
    assert demo.returncode == 0 and b"INFO" in logged, logged
    assert ESC not in logged, logged


def on_a_terminal(argv: list[str], env: dict[str, str]) -> bytes:
    """What `argv` writes on its stderr when that is a terminal (a
    pseudo-terminal, read as it is written)."""
    leader, follower = pty.openpty()
    got: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: every writer has gone
                return
            if not chunk:
                return
            got.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=follower, env=env, timeout=30, check=False)
    finally:
        os.close(follower)
        reader.join(10)
        with contextlib.suppress(OSError):
            os.close(leader)
    assert done.returncode == 0, (argv, b"".join(got))
    return b"".join(got)


@pytest.mark.parametrize("no_color", [None, "1"])
async def test_colour_only_on_a_terminal_without_no_color(cluster: Cluster, no_color: str | None) -> None:
    env = plain_env(RUST_LOG="debug")
    if no_color is not None:
        env["NO_COLOR"] = no_color
    logged = await asyncio.to_thread(on_a_terminal, cluster.ctl_argv("manifest", "alpha"), env)
    assert b"DEBUG" in logged, logged
    if no_color is None:
        assert ESC in logged, "a terminal gets colour"
    else:
        assert ESC not in logged, logged
