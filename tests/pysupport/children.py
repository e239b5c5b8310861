"""Child processes for the Python suites (python/tests and tests/mcp):
their environment, running one to its end, and stopping one. Each suite's
conftest puts this folder on sys.path."""

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

#: How long any one child command may run.
COMMAND_TIMEOUT = 30.0


def capwire_bin_path() -> Path:
    """The `capwire` binary: $CAPWIRE_BIN, else target/debug/capwire of the
    repository. A missing binary is a failure, never a skip."""
    path = Path(os.environ.get("CAPWIRE_BIN") or REPO / "target/debug/capwire")
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"the capwire binary is missing: {path} is not an executable file. "
            "Build it (`cargo build --features cli --bin capwire` at the repository root) or point "
            "CAPWIRE_BIN at one.",
            pytrace=False,
        )
    return path



def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RUST_LOG", "CAPWIRE_CTL_STATE")}
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


@dataclasses.dataclass
class Done:
    """A finished child command."""

    args: Sequence[str]
    rc: int
    out: str
    err: str

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.args))}\n  exit {self.rc}\n  stdout: {self.out!r}\n  stderr: {self.err!r}"


async def stop_process(proc: asyncio.subprocess.Process, *, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL when it does not go within `grace`."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), grace)


async def run(args: Sequence[str | os.PathLike[str]], *, timeout: float = COMMAND_TIMEOUT, env: dict[str, str] | None = None) -> Done:
    """Runs a child command to its end (killed after `timeout`)."""
    argv = [str(a) for a in args]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else child_env(),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    assert proc.returncode is not None
    return Done(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
