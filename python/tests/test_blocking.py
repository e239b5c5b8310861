"""A handler that blocks the loop (time.sleep in an async def) stalls the
Python side only: a caller in another process still gets its timeout on
time, the node's Rust-served core verbs still answer meanwhile, and the
Python handlers are served again once the loop is free."""

import asyncio
import json
import subprocess
import threading
import time

import capwire
from conftest import COMMAND_TIMEOUT, Ctl, Nodes, child_env

BLOCK = 3.0


def run_timed(argv: list[str]) -> dict:
    """Runs a command to its end from a thread (the loop may be blocked):
    its exit code, output and when it ended (time.monotonic)."""
    started = time.monotonic()
    r = subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT, env=child_env(), stdin=subprocess.DEVNULL)
    return {"rc": r.returncode, "out": r.stdout.decode(), "err": r.stderr.decode(), "started": started, "ended": time.monotonic()}


async def test_blocked_loop_does_not_block_the_node(nodes: Nodes, ctl: Ctl) -> None:
    marks: dict = {}
    status: dict = {}
    cap = capwire.Capability("app.block", "1.0.0")

    def check_status() -> None:
        status.update(run_timed(ctl.argv("status", "py", "--json", "--timeout", "5s")))

    @cap.request("block")
    async def block(seconds: float) -> str:
        marks["block_start"] = time.monotonic()
        # Asked from another thread while the loop is blocked.
        checker = threading.Thread(target=check_status, daemon=True)
        marks["checker"] = checker
        checker.start()
        time.sleep(seconds)  # blocks the node's loop
        marks["block_end"] = time.monotonic()
        return "unblocked"

    @cap.request("echo")
    async def echo(text: str) -> str:
        return f"echo {text}"

    node = await nodes.start("py-block", cap)
    await ctl.bind(node.invite(), "py")

    call = await asyncio.wait_for(
        asyncio.to_thread(run_timed, ctl.argv("call", "py", "app.block", "block", "--args", json.dumps(BLOCK), "--timeout", "1s")),
        COMMAND_TIMEOUT + 10,
    )
    # The loop ran again (this test goes on): the handler finished its block.
    assert "block_end" in marks, "the blocking handler never ran"
    marks["checker"].join(timeout=COMMAND_TIMEOUT)

    # The call timed out after its 1 s, while the loop was still blocked.
    assert call["rc"] == 5, call
    assert call["ended"] - call["started"] < BLOCK - 0.5, call
    assert call["ended"] < marks["block_end"], "the caller's timeout waited for the blocked loop"

    # A core verb, served in Rust, answered while the loop was blocked.
    assert status.get("rc") == 0, status
    (record,) = [json.loads(line) for line in status["out"].splitlines()]
    assert record["value"]["you_are_controller"] is True
    assert status["ended"] < marks["block_end"], "core.monitoring/status waited for the blocked loop"

    # Python handlers are served again.
    done = await ctl.ok("call", "py", "app.block", "echo", "--args", '"after"')
    assert done.out.strip() == "echo after"
    client = await nodes.start("py-client", listen=False)
    peer = await asyncio.wait_for(client.connect(node.local_addrs()[0], node.id), 10)
    assert await asyncio.wait_for(peer.request("app.block", "echo", "again", result=str), 10) == "echo again"
