"""One trace across the cluster, end to end: an MCP client, then `capwire
mcp`, then a Rust node, then a Python node, then a Rust node with a task
that goes on after that node restarts.

    MCP client (the `mcp` package, a child process)
      └ tools/call node-a__agent__probe, _meta.traceparent
        └ `capwire mcp --allow-controller` (the control plane)
          └ node A (`capwire node`): app.agent/probe of node B's app.chain/start
            └ node B (a Python node, a child process): submits app.agent/work
              └ node C (`capwire node --state`): the task, C stopped and
                started again while it runs

Every process exports its spans over OTLP/HTTP (protobuf) to a receiver in
this test, which decodes them with `opentelemetry-proto`: one trace, the
MCP client's, each span's parent the one it must be, the task's span made
again after the restart under the same parent with the task's later
events. The same chain with no OTEL_* variable anywhere and no trace
context from the client works as well, and nothing is exported.
"""

import asyncio
import contextlib
import dataclasses
import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON
from children import child_env, stop_process
from trace_chain import Receiver, Span

HELPER = Path(__file__).resolve().parent / "trace_chain.py"

#: The task: this many steps of this many milliseconds (long enough to stop
#: its node in the middle, short enough for the test).
STEPS = 12
STEP_MS = 400
#: Node C is stopped once the task reported this step.
STOP_AFTER = 2
TEXT = "chain"
TOOL = "node-a__agent__probe"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def base_env(**extra: str) -> dict[str, str]:
    """The children's environment: no OTEL_* variable but those given."""
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process the chain runs: its JSON lines on stdout, read as
    they are needed, and its stderr, read all along (a full pipe would stop
    it) and kept."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.errs: list[bytes] = []
        self.drain = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.errs.append(chunk)

    @property
    def err(self) -> str:
        return b"".join(self.errs).decode(errors="replace")

    async def line(self, timeout: float, what: str) -> dict[str, Any]:
        """Its next JSON line on stdout."""
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"{self.name}: no {what} within {timeout} s") from None
        if not raw:
            await self.stop()
            raise AssertionError(f"{self.name} ended before {what} (exit {self.proc.returncode}):\n{self.err}")
        return json.loads(raw)  # type: ignore[no-any-return]

    async def stop(self) -> int | None:
        """Stops it (SIGTERM: a graceful stop), and waits for the rest of
        its stderr."""
        await stop_process(self.proc, grace=15)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.drain), 10)
        return self.proc.returncode


async def spawn(name: str, argv: list[str], env: dict[str, str]) -> Proc:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    return Proc(name, proc)


async def command(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{' '.join(argv)} ran longer than {timeout} s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


@dataclasses.dataclass
class Outcome:
    """What a run of the chain did."""

    #: The MCP client's record: the tool's result, its root span's ids.
    called: dict[str, Any]
    #: Node B's record of the call it served: the task's id, the
    #: traceparent it was called with.
    submitted: dict[str, Any]
    #: The task's events, as `ctl tasks watch` printed them.
    events: list[dict[str, Any]]
    #: Each child's stderr, by name.
    stderr: dict[str, str]
    #: The node ids of the control plane and of node B.
    ctl_id: str
    b_id: str


class Chain:
    """The processes of one run of the chain."""

    def __init__(self, binary: Path, tmp: Path, otel: dict[str, str]) -> None:
        self.binary = binary
        self.tmp = tmp
        self.otel = otel
        self.ctl_state = tmp / "ctl"
        self.procs: list[Proc] = []
        self.stderr: dict[str, str] = {}

    async def ctl(self, *args: str, timeout: float = 30) -> list[dict[str, Any]]:
        """`capwire ctl --json ...` (with no export of its own), which must
        succeed: its records."""
        argv = [str(self.binary), "ctl", "--state", str(self.ctl_state), "--json", *args]
        rc, out, err = await command(argv, base_env(), timeout)
        assert rc == 0, f"{' '.join(argv)}: exit {rc}\n{out}{err}"
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    async def rust_node(self, name: str, listen: str) -> tuple[Proc, dict[str, Any]]:
        """`capwire node` named `name`, with its state in its own folder,
        exporting as the service `name` (when this run exports)."""
        env = base_env(**self.otel)
        if self.otel:
            env["OTEL_SERVICE_NAME"] = name
        argv = [
            str(self.binary), "node", "--json", "--name", name, "--listen", listen,
            "--state", str(self.tmp / name),
        ]
        node = await spawn(name, argv, env)
        self.procs.append(node)
        return node, await node.line(20, "its startup line")

    async def stop(self, proc: Proc) -> None:
        rc = await proc.stop()
        self.stderr[proc.name] = self.stderr.get(proc.name, "") + proc.err
        self.procs.remove(proc)
        assert rc == 0, f"{proc.name} did not stop cleanly at SIGTERM (exit {rc}):\n{proc.err}"

    async def close(self) -> None:
        """Stops what still runs (a failed run's leftovers)."""
        await asyncio.gather(*(p.stop() for p in self.procs), return_exceptions=True)
        for p in self.procs:
            self.stderr[p.name] = self.stderr.get(p.name, "") + p.err
        self.procs.clear()

    async def task_info(self, task: str) -> dict[str, Any]:
        (record,) = await self.ctl("tasks", "node-c", "get", task)
        return record["value"]  # type: ignore[no-any-return]

    async def wait_task(self, task: str, done: Any, timeout: float, what: str) -> dict[str, Any]:
        """Polls the task at node C (through the control plane, which
        controls C) until `done(info)`."""
        until = asyncio.get_running_loop().time() + timeout
        info: dict[str, Any] = {}
        while asyncio.get_running_loop().time() < until:
            info = await self.task_info(task)
            if done(info):
                return info
            await asyncio.sleep(0.1)
        raise AssertionError(f"{what} did not happen within {timeout} s; the task: {info}")

    async def run(self) -> Outcome:
        (me,) = await self.ctl("identity")
        node_a, a = await self.rust_node("node-a", "127.0.0.1:0")
        (bound,) = await self.ctl("bind", a["invite"], "--name", "node-a")
        assert bound["kind"] == "bound", bound
        # C restarts on the same address, which the control plane's book has.
        c_listen = f"127.0.0.1:{free_port()}"
        node_c, c = await self.rust_node("node-c", c_listen)
        (bound,) = await self.ctl("bind", c["invite"], "--name", "node-c")
        assert bound["kind"] == "bound", bound

        node_b = await spawn(
            "node-b",
            [
                PYTHON, str(HELPER), "node-b",
                "--a-addr", a["addrs"][0], "--a-id", a["node_id"],
                "--c-addr", c["addrs"][0], "--c-id", c["node_id"],
                "--text", TEXT, "--steps", str(STEPS), "--step-ms", str(STEP_MS),
            ],
            base_env(**self.otel),
        )
        self.procs.append(node_b)
        ready = await node_b.line(30, "its ready line")
        assert ready["kind"] == "ready" and ready["otel"] == bool(self.otel), ready

        # The MCP client: A probes B's app.chain/start (a controller verb of
        # A's, a tool with --allow-controller).
        probe = {"peer": ready["node_id"], "cap": "app.chain", "verb": "start"}
        client_argv = [
            PYTHON, str(HELPER), "mcp-client", "--binary", str(self.binary),
            "--state", str(self.ctl_state), "--tool", TOOL, "--arguments", json.dumps(probe),
        ]
        rc, out, err = await command(client_argv, base_env(**self.otel), 60)
        self.stderr["mcp-client"] = err
        assert rc == 0, f"the MCP client failed (exit {rc}):\n{out}\n{err}"
        records = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert len(records) == 1 and records[0]["kind"] == "called", f"the MCP client said {out!r}\n{err}"
        called = records[0]
        assert not called["is_error"] and called["structured"] == {"result": "ok"}, (
            f"the tool call failed: {called}\n{err}"
        )

        submitted = await node_b.line(10, "the record of the call it served")
        assert submitted["kind"] == "submitted", submitted
        task = submitted["task"]

        # C stops (gracefully) in the middle of the task and starts again
        # with its state, on its address: the task resumes there.
        info = await self.wait_task(
            task,
            lambda i: (i.get("progress") or {}).get("step", 0) >= STOP_AFTER,
            20,
            f"step {STOP_AFTER} of the task",
        )
        assert info["state"] == "working", info
        await self.stop(node_c)
        node_c, again = await self.rust_node("node-c", c_listen)
        assert again["node_id"] == c["node_id"], again
        info = await self.wait_task(
            task, lambda i: i["state"] in ("completed", "failed", "canceled"), 30, "the task's end"
        )
        assert info["state"] == "completed", info
        assert info["result"] == f"node-c: {TEXT}: done in {STEPS} steps", info
        events = await self.ctl("tasks", "node-c", "watch", task)
        events = [e for e in events if e["kind"] == "event"]

        # Every process stops gracefully (and so sends its last spans).
        await asyncio.gather(self.stop(node_b), self.stop(node_a), self.stop(node_c))
        return Outcome(called, submitted, events, self.stderr, me["node_id"], ready["node_id"])


async def run_chain(binary: Path, tmp: Path, otel: dict[str, str]) -> Outcome:
    chain = Chain(binary, tmp, otel)
    try:
        return await chain.run()
    except BaseException:
        await chain.close()
        for name, err in chain.stderr.items():
            print(f"--- {name} stderr ---\n{err}", file=sys.stderr)
        raise


def check_task_events(outcome: Outcome) -> None:
    """The task resumed after the restart, from the last step it reported,
    and reported every step once."""
    events = outcome.events
    kinds = [(e["event"], e["body"]) for e in events]
    assert ("state", "resumed") in kinds, f"the task did not resume: {kinds}"
    resumed = kinds.index(("state", "resumed"))
    steps = [e["body"]["step"] for e in events if e["event"] == "progress"]
    assert steps == list(range(1, STEPS + 1)), f"each step once: {kinds}"
    before = [b["step"] for k, b in kinds[:resumed] if k == "progress"]
    assert len(before) >= STOP_AFTER and len(before) < STEPS, f"the restart was not mid-task: {kinds}"
    assert events[-1]["event"] == "result", kinds


def export_complaints(stderr: dict[str, str]) -> list[str]:
    """Lines of the children's stderr that speak of exporting spans."""
    words = re.compile(r"otel|otlp|export|trace", re.IGNORECASE)
    return [f"{name}: {line}" for name, err in stderr.items() for line in err.splitlines() if words.search(line)]


def dump(spans: list[Span]) -> str:
    return "\n".join(str(s) for s in sorted(spans, key=lambda s: (s.trace_id, s.start_ns)))


class Trace:
    """The spans of one trace, for the asserts (each failure shows them
    all)."""

    def __init__(self, trace_id: str, spans: list[Span], stderr: dict[str, str]) -> None:
        self.id = trace_id
        self.spans = [s for s in spans if s.trace_id == trace_id]
        self.everything = spans
        self.stderr = stderr

    def fail(self, message: str) -> None:
        logs = "".join(f"\n--- {name} stderr (its end) ---\n{err[-3000:]}" for name, err in self.stderr.items())
        pytest.fail(
            f"{message}\n\nthe trace {self.id}:\n{dump(self.spans)}\n\nevery span received:\n"
            f"{dump(self.everything)}\n{logs}",
            pytrace=False,
        )

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.fail(message)

    def all(self, service: str, kind: str, name: str) -> list[Span]:
        return [s for s in self.spans if (s.service, s.kind, s.name) == (service, kind, name)]

    def one(self, service: str, kind: str, name: str) -> Span:
        found = self.all(service, kind, name)
        self.check(len(found) == 1, f"expected one {kind} span {name!r} of {service} in the trace, found {len(found)}")
        return found[0]

    def child(self, span: Span, parent: Span) -> None:
        self.check(
            span.parent == parent.span_id,
            f"the parent of {span.service}'s {span.kind} span {span.name!r} is {span.parent or 'none'}, "
            f"not {parent.service}'s {parent.kind} span {parent.name!r} ({parent.span_id})",
        )

    def outcome_ok(self, span: Span) -> None:
        self.check(
            span.attributes.get("capwire.outcome") == "ok" and span.status != "error",
            f"{span.service}'s {span.kind} span {span.name!r} did not end ok: {span.attributes}, status {span.status}",
        )


def complete(trace_id: str) -> Any:
    """Whether the spans of the whole chain have come: both task spans
    (the one after the restart with its result) and each service's."""

    def done(spans: list[Span]) -> bool:
        ours = [s for s in spans if s.trace_id == trace_id]
        tasks = [s for s in ours if s.name == "task app.agent/work"]
        services = {s.service for s in ours}
        return (
            len(tasks) >= 2
            and any("result" in s.event_names() for s in tasks)
            and {"mcp-client", "capwire-mcp", "node-a", "python-node-b", "node-c"} <= services
        )

    return done


async def test_one_trace_from_an_mcp_client_to_a_resumed_task(capwire_bin: Path, tmp_path: Path) -> None:
    receiver = Receiver().start()
    try:
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        outcome = await run_chain(capwire_bin, tmp_path, otel)
        check_task_events(outcome)
        root_ids = outcome.called["root"]
        assert root_ids is not None, outcome.called
        trace_id = root_ids["trace_id"]
        # Every process has exited and flushed its spans; they may still
        # be on their way in.
        spans = await receiver.wait_for(complete(trace_id), 15)
        assert not receiver.errors, f"the receiver refused requests: {receiver.errors}"
    finally:
        receiver.stop()

    t = Trace(trace_id, spans, outcome.stderr)
    task_id = outcome.submitted["task"]

    # The MCP client: its root span, and the `mcp` package's span of the
    # call, whose context went in the call's _meta.
    root = t.one("mcp-client", "client", "mcp client chain")
    t.check(root.parent == "" and root.span_id == root_ids["span_id"], f"the root is not the MCP client's: {root}")
    send = t.one("mcp-client", "client", f"MCP send tools/call {TOOL}")
    t.child(send, root)

    # `capwire mcp`: the call's root span there, and its client span.
    ctl = t.one("capwire-mcp", "internal", "ctl call app.agent/probe")
    t.child(ctl, send)
    to_a = t.one("capwire-mcp", "client", "app.agent/probe")
    t.child(to_a, ctl)
    t.outcome_ok(to_a)

    # Node A serves the probe and calls node B.
    probe = t.one("node-a", "server", "app.agent/probe")
    t.child(probe, to_a)
    t.outcome_ok(probe)
    t.check(probe.attributes.get("capwire.class") == "controller", f"the probe's class: {probe.attributes}")
    t.check(probe.attributes.get("capwire.peer") == outcome.ctl_id, f"the probe's caller: {probe.attributes}")
    t.check(
        (probe.attributes.get("rpc.service"), probe.attributes.get("rpc.method")) == ("app.agent", "probe"),
        f"the probe's rpc attributes: {probe.attributes}",
    )
    to_b = t.one("node-a", "client", "app.chain/start")
    t.child(to_b, probe)
    t.check(to_b.attributes.get("capwire.peer") == outcome.b_id, f"A's call went to: {to_b.attributes}")
    t.outcome_ok(to_b)

    # Node B (Python) runs its handler in a server span, child of A's call,
    # and was called with that call's context.
    served_b = t.one("python-node-b", "server", "app.chain/start")
    t.child(served_b, to_b)
    t.check(served_b.status != "error", f"node B's span is an error: {served_b}")
    t.check(
        outcome.submitted["traceparent"] is not None
        and TRACEPARENT.match(outcome.submitted["traceparent"]) is not None
        and outcome.submitted["traceparent"][3:52] == f"{trace_id}-{to_b.span_id}",
        f"node B's handler saw the traceparent {outcome.submitted['traceparent']!r}, not A's call's",
    )

    # Node C serves the submit: its parent is B's server span, or a client
    # span of B's under it.
    submit = t.one("node-c", "server", "app.agent/work")
    from_b = [s for s in t.spans if s.span_id == submit.parent]
    t.check(len(from_b) == 1 and from_b[0].service == "python-node-b", "C's submit span's parent is not a span of node B")
    if from_b[0] is not served_b:
        t.check(from_b[0].kind == "client", f"C's submit span's parent is {from_b[0]}")
        t.child(from_b[0], served_b)
    t.outcome_ok(submit)
    t.check(submit.attributes.get("capwire.class") == "bootstrap", f"the submit's class: {submit.attributes}")
    t.check(submit.attributes.get("capwire.peer") == outcome.b_id, f"the submit's caller: {submit.attributes}")

    # The task: one span before the restart, one after, both children of
    # the submit's server span; its events in them.
    runs = sorted(t.all("node-c", "internal", "task app.agent/work"), key=lambda s: s.start_ns)
    t.check(len(runs) == 2, f"expected the task's span before and after the restart, found {len(runs)}")
    first, resumed = runs
    for run in runs:
        t.child(run, submit)
        t.check(run.attributes.get("capwire.task") == task_id, f"the task span's task: {run.attributes}")
    t.check(first.end_ns <= resumed.start_ns, "the resumed task's span began before the first one ended")
    # The span events are the task's events (kind and seq, as core.tasks
    # keeps them). After the restart: every one but the state event that
    # says it resumed, written before the handler runs (the span may mark
    # it with an event of that name). Before it: those of the first run,
    # from its "working" on, perhaps but the last (a write the stop came
    # after, before the handler went on to trace it).
    log = [(e["event"], e["seq"]) for e in outcome.events]
    t.check(outcome.events[0]["state"] == "submitted", f"the task's first event: {outcome.events[0]}")
    restart = [e["body"] for e in outcome.events].index("resumed")
    first_run = log[1:restart]
    after_restart = log[restart + 1 :]

    def traced(span: Span) -> list[tuple[str, int | None]]:
        # (A u64 attribute may come as a string.)
        return [(e.name, int(e.attributes["seq"]) if "seq" in e.attributes else None) for e in span.events]

    resumed_events = traced(resumed)
    if resumed_events[:1] == [("resumed", None)]:
        resumed_events = resumed_events[1:]
    t.check(
        resumed_events == after_restart,
        f"the resumed run's span events {traced(resumed)} are not the task's events after the restart {after_restart}",
    )
    first_events = traced(first)
    t.check(
        len(first_run) - 1 <= len(first_events) <= len(first_run) and first_events == first_run[: len(first_events)],
        f"the first run's span events {first_events} are not the task's events before the restart {first_run}",
    )
    t.outcome_ok(resumed)

    # Nothing else: every span of the trace has its parent in it, but the
    # root; every server span ended ok.
    ids = {s.span_id for s in t.spans}
    orphans = [s for s in t.spans if s is not root and s.parent not in ids]
    t.check(not orphans, f"spans whose parent is not in the trace: {[str(s) for s in orphans]}")
    roots = [s for s in t.spans if s.parent == ""]
    t.check(roots == [root], f"more than one root: {[str(s) for s in roots]}")
    for s in t.spans:
        if s.kind == "server" and s.service != "python-node-b":
            t.outcome_ok(s)
    failed = re.compile(r"fail|could not|cannot|error|refused|unable", re.IGNORECASE)
    complaints = [line for line in export_complaints(outcome.stderr) if failed.search(line)]
    assert not complaints, complaints


async def test_the_chain_without_trace_context_or_exporter(capwire_bin: Path, tmp_path: Path) -> None:
    receiver = Receiver().start()
    try:
        outcome = await run_chain(capwire_bin, tmp_path, {})
        check_task_events(outcome)
        assert outcome.called["root"] is None, outcome.called
        # (Every child has exited: what any of them sent has come.)
        assert receiver.requests == [] and receiver.spans == [] and receiver.errors == []
    finally:
        receiver.stop()
    # `capwire mcp` started a trace of its own for the call (no exporter
    # needed): it reached node B through A.
    seen = outcome.submitted["traceparent"]
    assert seen is not None and TRACEPARENT.match(seen), f"node B was called with {seen!r}"
    assert not export_complaints(outcome.stderr), export_complaints(outcome.stderr)
    assert not any(k.startswith("OTEL_") for k in base_env()), "an OTEL_* variable reached the children"
