"""The example agent (examples/python/agent.py) as a user runs it: started
as a process, bound by `capwire ctl bind` with the invite it prints, then
called in each shape and configured from the command line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "python" / "agent.py"


def capwire_bin() -> str:
    path = os.environ.get("CAPWIRE_BIN", str(REPO / "target" / "debug" / "capwire"))
    assert Path(path).exists(), f"the capwire binary is missing at {path} (set CAPWIRE_BIN)"
    return path


async def ctl(state: Path, *args: str, timeout: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        capwire_bin(), "ctl", "--state", str(state), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_example_agent_is_bound_called_and_configured_by_ctl(tmp_path: Path) -> None:
    agent = await asyncio.create_subprocess_exec(
        sys.executable, str(AGENT), "--listen", "127.0.0.1:0", "--state", str(tmp_path / "agent"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        lines: dict[str, str] = {}
        assert agent.stdout is not None
        while "invite" not in lines:
            line = (await asyncio.wait_for(agent.stdout.readline(), 30)).decode()
            assert line, "the agent exited before printing its invite"
            key, _, value = line.strip().partition(" ")
            lines[key] = value.strip()
        cp = tmp_path / "cp"
        code, out, err = await ctl(cp, "bind", lines["invite"], "--name", "py")
        assert code == 0, err
        assert lines["node"] in out

        code, out, err = await ctl(cp, "call", "py", "app.summarize", "summarize",
                                   "--args", '{"text": "b a b c b a", "top": 2}')
        assert code == 0, err
        assert json.loads(out) == {"words": 6, "top": [["b", 3], ["a", 2]]}

        code, out, err = await ctl(cp, "call", "py", "app.summarize", "words", "--args", '"one two three"', "--stream")
        assert code == 0, err
        assert [json.loads(x) for x in out.split()] == ["one", "two", "three"]

        code, out, err = await ctl(cp, "call", "py", "app.summarize", "index",
                                   "--args", '{"docs": ["x y", "z"]}', "--wait", "--answer", "true")
        assert code == 0, err + out
        assert "completed" in out and "progress" in out

        # The controller verb: the control plane may, a stranger may not.
        code, out, err = await ctl(cp, "call", "py", "app.summarize", "reset")
        assert code == 0, err
        # The distinct words summarized (a, b, c) and indexed (x, y, z).
        assert int(out) == 6
        code, _, err = await ctl(cp, "call", "py", "app.summarize", "summarize", "--args", '{"text": 5}')
        assert code == 4 and "bad_args" in err

        code, out, err = await ctl(cp, "config", "set", '{"top": 5}', "--peer", "py")
        assert code == 0, err
        assert agent.stderr is not None
        seen = b""
        while b"configuration 1" not in seen:
            seen += await asyncio.wait_for(agent.stderr.readline(), 30)

        code, out, err = await ctl(cp, "status", "py")
        assert code == 0 and "monitoring on" in out, err
    finally:
        if agent.returncode is None:
            agent.terminate()
            await asyncio.wait_for(agent.wait(), 30)
    # SIGTERM ends the agent cleanly (its node shut down).
    assert agent.returncode == 0


async def test_the_example_agent_refuses_its_controller_verb_to_a_stranger(tmp_path: Path) -> None:
    import capwire

    agent = await asyncio.create_subprocess_exec(
        sys.executable, str(AGENT), "--listen", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert agent.stdout is not None
        lines: dict[str, str] = {}
        while "invite" not in lines:
            key, _, value = (await asyncio.wait_for(agent.stdout.readline(), 30)).decode().strip().partition(" ")
            lines[key] = value.strip()
        async with capwire.Node.builder("stranger").start() as stranger:
            peer = await stranger.connect(lines["listen"], lines["node"])
            with pytest.raises(capwire.Unauthorized):
                await peer.request("app.summarize", "reset")
            summary = await peer.request("app.summarize", "summarize", {"text": "q q r"})
            assert summary["top"][0] == ["q", 2]
    finally:
        agent.terminate()
        await asyncio.wait_for(agent.wait(), 30)
