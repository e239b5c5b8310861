"""The README's agent and its caller, run as written: the agent as a
process (on a free port), the caller as a second one with the node id
and address the agent printed, then a control plane that binds the agent
with the invite it printed and calls it, a misspelt argument refused."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from conftest import Ctl, stop_process

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_an_agent_and_its_caller() -> None:
    agent, caller, *_ = python_blocks()
    assert '.listen("127.0.0.1:7100")' in agent and "node.invite()" in agent
    assert "node.controller is None" in agent
    assert "from greeter import Greeting" in caller


async def test_the_readme_agent_and_caller_run_as_written(tmp_path: Path, ctl: Ctl) -> None:
    agent_code, caller_code, *_ = python_blocks()
    # The one change: any free port, not 7100.
    (tmp_path / "greeter.py").write_text(agent_code.replace("127.0.0.1:7100", "127.0.0.1:0"))
    (tmp_path / "caller.py").write_text(caller_code)
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "greeter.py", cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert agent.stdout is not None
        first = (await asyncio.wait_for(agent.stdout.readline(), 30)).decode().split()
        assert len(first) == 2, f"the agent printed {first!r}"
        node_id, addr = first
        invite = (await asyncio.wait_for(agent.stdout.readline(), 30)).decode().strip()
        assert invite.startswith(f"capwire://{node_id}@"), invite

        caller = await asyncio.create_subprocess_exec(
            sys.executable, "caller.py", node_id, addr, cwd=tmp_path,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(caller.communicate(), 60)
        assert caller.returncode == 0, err.decode()
        assert out.decode() == "hello, ada.\n"

        await ctl.bind(invite, "greeter")
        done = await ctl.ok("call", "greeter", "app.greeter", "greet", "--args", '{"name": "ada", "excited": true}')
        assert done.out.strip() == "hello, ada!", str(done)
        # A misspelt optional argument is refused, not silently dropped.
        done = await ctl("call", "greeter", "app.greeter", "greet", "--args", '{"name": "ada", "exited": true}')
        assert done.rc == 4, str(done)
        assert "bad_args" in done.err and "exited" in done.err, str(done)
    finally:
        await stop_process(agent)


async def test_the_readme_tracing_example_runs_as_written(tmp_path: Path) -> None:
    (example,) = [b for b in python_blocks() if "start_as_current_span" in b]
    (tmp_path / "traced.py").write_text(example)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "traced.py", cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    # The console exporter's spans (JSON objects), and the two lines.
    decoder, spans, lines, at = json.JSONDecoder(), {}, [], 0
    while at < len(text):
        if text[at] == "{":
            span, at = decoder.raw_decode(text, at)
            spans[span["name"]] = span
        else:
            end = text.find("\n", at)
            end = len(text) if end < 0 else end
            lines.append(text[at:end])
            at = end
        at += 1
    reserved = [line for line in lines if line.startswith("tea reserved in trace ")]
    checkout = [line for line in lines if line.startswith("checkout in trace ")]
    assert len(reserved) == 1 and len(checkout) == 1, text
    trace_id = checkout[0].rsplit(" ", 1)[1]
    assert reserved[0].rsplit(" ", 1)[1] == trace_id
    server, caller = spans["app.stock/reserve"], spans["checkout"]
    assert server["kind"] == "SpanKind.SERVER"
    assert server["context"]["trace_id"] == caller["context"]["trace_id"] == f"0x{trace_id}"
    assert server["parent_id"] == caller["context"]["span_id"]
    assert server["attributes"] == {"rpc.system": "capwire", "rpc.service": "app.stock", "rpc.method": "reserve"}
