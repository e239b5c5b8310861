"""One trace across the cluster, from Python: handlers run in
OpenTelemetry server spans whose parent is the caller's span (from the
W3C trace context on the wire), calls carry the current span's context
(or an explicit ``traceparent=``), and without a tracer provider, or
without OpenTelemetry at all, the caller's trace still goes on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once

import capwire
from conftest import Nodes

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"


def _reset_trace_globals() -> None:
    """Back to the API's default (a proxy of no provider): the global
    provider can be set once per process, and each test sets its own."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider exporting every ended span to memory."""
    _reset_trace_globals()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_trace_globals()


@pytest.fixture
def no_provider() -> Iterator[None]:
    """No tracer provider configured: the API's no-op default."""
    _reset_trace_globals()
    yield
    _reset_trace_globals()


def here(ctx: capwire.Context) -> dict[str, Any]:
    """What a handler sees of its trace: its context's and its span's."""
    sc = trace.get_current_span().get_span_context()
    return {
        "traceparent": ctx.traceparent,
        "tracestate": ctx.tracestate,
        "trace_id": sc.trace_id,
        "span_id": sc.span_id,
        "recording": trace.get_current_span().is_recording(),
    }


def traced(seen: dict[str, Any], onward: dict[str, capwire.Peer]) -> capwire.Capability:
    """`app.traced`: a verb of each kind that notes its trace, one that
    calls onward (to `onward["peer"]`), two that fail."""
    cap = capwire.Capability("app.traced", "1.0.0")
    seen["noted"] = asyncio.Queue()

    @cap.request("ask")
    async def ask(text: str, ctx: capwire.Context) -> str:
        seen["ask"] = here(ctx)
        return text

    @cap.notification("note")
    async def note(text: str, ctx: capwire.Context) -> None:
        await seen["noted"].put(here(ctx))

    @cap.stream("count")
    async def count(n: int, ctx: capwire.Context) -> AsyncIterator[int]:
        seen["count"] = here(ctx)
        for i in range(n):
            yield i

    @cap.task("job")
    async def job(n: int, task: capwire.Task, ctx: capwire.Context) -> int:
        seen["job"] = here(ctx)
        return n * 2

    @cap.request("relay")
    async def relay(text: str, ctx: capwire.Context) -> str:
        seen["relay"] = here(ctx)
        peer = onward["peer"]
        out = await peer.request("app.traced", "ask", text, result=str)
        # A task the handler starts is in its trace too.
        await asyncio.create_task(peer.notify("app.traced", "note", text))
        return out

    @cap.request("refuse")
    async def refuse(text: str) -> str:
        raise capwire.NotFound(f"no {text}")

    @cap.request("crash")
    async def crash(text: str) -> str:
        raise RuntimeError(f"boom {text}")

    return cap


def finished(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def assert_child(span: ReadableSpan, trace_id: int, parent_id: int) -> None:
    assert span.context is not None and span.parent is not None, span
    assert span.context.trace_id == trace_id, f"{span.context.trace_id:032x} is not {trace_id:032x}"
    assert span.parent.span_id == parent_id, f"{span.parent.span_id:016x} is not {parent_id:016x}"
    assert span.parent.is_remote
    assert span.kind == SpanKind.SERVER


async def test_handlers_of_every_kind_run_in_a_server_span_child_of_the_callers(
    nodes: Nodes, spans: InMemorySpanExporter
) -> None:
    seen: dict[str, Any] = {}
    _, _, peer = await nodes.pair(traced(seen, {}))
    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        assert await peer.request("app.traced", "ask", "hi", result=str) == "hi"
        await peer.notify("app.traced", "note", "hi")
        noted = await asyncio.wait_for(seen["noted"].get(), 10)
        assert [i async for i in peer.stream("app.traced", "count", 3, item=int)] == [0, 1, 2]
        handle = await peer.submit("app.traced", "job", 21, result=int)
        assert await asyncio.wait_for(handle.result(), 10) == 42
    cs = caller.get_span_context()
    for verb, saw in [("ask", seen["ask"]), ("note", noted), ("count", seen["count"]), ("job", seen["job"])]:
        span = finished(spans, f"app.traced/{verb}")
        assert_child(span, cs.trace_id, cs.span_id)
        assert dict(span.attributes or {}) == {
            "rpc.system": "capwire",
            "rpc.service": "app.traced",
            "rpc.method": verb,
        }
        assert span.status.status_code == StatusCode.UNSET, verb
        assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "capwire"
        # The handler ran inside it, and its context names the caller's span.
        assert saw["recording"], verb
        assert (saw["trace_id"], saw["span_id"]) == (cs.trace_id, span.context.span_id), verb
        assert saw["traceparent"] == f"00-{cs.trace_id:032x}-{cs.span_id:016x}-01", verb


async def test_a_handler_that_raises_ends_its_span_with_an_error(nodes: Nodes, spans: InMemorySpanExporter) -> None:
    seen: dict[str, Any] = {}
    _, _, peer = await nodes.pair(traced(seen, {}))
    with trace.get_tracer("test").start_as_current_span("caller"):
        with pytest.raises(capwire.NotFound):
            await peer.request("app.traced", "refuse", "tea")
        with pytest.raises(capwire.Internal):
            await peer.request("app.traced", "crash", "tea")
    refused = finished(spans, "app.traced/refuse")
    assert refused.status.status_code == StatusCode.ERROR
    assert "no tea" in (refused.status.description or "")
    crashed = finished(spans, "app.traced/crash")
    assert crashed.status.status_code == StatusCode.ERROR
    # The handler's own exception is recorded, with its type and message.
    (event,) = [e for e in crashed.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    assert event.attributes["exception.message"] == "boom tea"


async def test_a_handler_calling_onward_passes_the_trace_on_as_its_spans_child(
    nodes: Nodes, spans: InMemorySpanExporter
) -> None:
    seen_b: dict[str, Any] = {}
    seen_c: dict[str, Any] = {}
    onward: dict[str, capwire.Peer] = {}
    b = await nodes.start("py-b", traced(seen_b, onward))
    c = await nodes.start("py-c", traced(seen_c, {}))
    onward["peer"] = await asyncio.wait_for(b.connect(c.local_addrs()[0], c.id), 10)
    a = await nodes.start("py-a", listen=False)
    to_b = await asyncio.wait_for(a.connect(b.local_addrs()[0], b.id), 10)
    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        assert await to_b.request("app.traced", "relay", "hi", result=str) == "hi"
    noted = await asyncio.wait_for(seen_c["noted"].get(), 10)
    cs = caller.get_span_context()
    relay = finished(spans, "app.traced/relay")
    assert_child(relay, cs.trace_id, cs.span_id)
    assert relay.context is not None
    # C's handlers: the same trace, children of B's handler span.
    for name in ("app.traced/ask", "app.traced/note"):
        assert_child(finished(spans, name), cs.trace_id, relay.context.span_id)
    assert seen_c["ask"]["traceparent"] == f"00-{cs.trace_id:032x}-{relay.context.span_id:016x}-01"
    assert noted["trace_id"] == cs.trace_id


async def test_an_explicit_traceparent_is_carried_and_a_malformed_one_refused(
    nodes: Nodes, spans: InMemorySpanExporter
) -> None:
    seen: dict[str, Any] = {}
    _, _, peer = await nodes.pair(traced(seen, {}))
    given = dict(traceparent=TRACEPARENT, tracestate="vendor=opaque")
    # It wins over the current span.
    with trace.get_tracer("test").start_as_current_span("caller"):
        assert await peer.request("app.traced", "ask", "hi", result=str, **given) == "hi"
        await peer.notify("app.traced", "note", "hi", **given)
        noted = await asyncio.wait_for(seen["noted"].get(), 10)
        assert [i async for i in peer.stream("app.traced", "count", 2, item=int, **given)] == [0, 1]
        handle = await peer.submit("app.traced", "job", 1, result=int, **given)
        assert await asyncio.wait_for(handle.result(), 10) == 2
    for verb, saw in [("ask", seen["ask"]), ("note", noted), ("count", seen["count"]), ("job", seen["job"])]:
        assert (saw["traceparent"], saw["tracestate"]) == (TRACEPARENT, "vendor=opaque"), verb
        assert saw["trace_id"] == TRACE_ID, verb
        span = finished(spans, f"app.traced/{verb}")
        assert_child(span, TRACE_ID, PARENT_ID)
        assert span.context is not None and span.context.trace_state.get("vendor") == "opaque"

    # Malformed: a ValueError that says why, before anything is sent.
    for verb in ("ask", "count", "job"):
        del seen[verb]
    bad = [
        dict(traceparent="00-abc-def-01"),
        dict(traceparent=f"00-{0:032x}-{PARENT_ID:016x}-01"),
        dict(traceparent=TRACEPARENT.upper()),
        dict(traceparent=TRACEPARENT, tracestate="not a list member"),
        dict(tracestate="vendor=opaque"),
    ]
    for kw in bad:
        with pytest.raises(ValueError, match="traceparent|tracestate"):
            await peer.request("app.traced", "ask", "hi", **kw)
        with pytest.raises(ValueError, match="traceparent|tracestate"):
            await peer.notify("app.traced", "note", "hi", **kw)
        with pytest.raises(ValueError, match="traceparent|tracestate"):
            peer.stream("app.traced", "count", 1, **kw)
        with pytest.raises(ValueError, match="traceparent|tracestate"):
            await peer.submit("app.traced", "job", 1, **kw)
    with pytest.raises(ValueError, match="not a W3C traceparent"):
        await peer.request("app.traced", "ask", "hi", traceparent="00-abc-def-01")
    await asyncio.sleep(0.2)
    assert not any(verb in seen for verb in ("ask", "count", "job")) and seen["noted"].empty()


async def test_without_a_tracer_provider_the_callers_trace_goes_on(nodes: Nodes, no_provider: None) -> None:
    seen_b: dict[str, Any] = {}
    seen_c: dict[str, Any] = {}
    onward: dict[str, capwire.Peer] = {}
    b = await nodes.start("py-b", traced(seen_b, onward))
    c = await nodes.start("py-c", traced(seen_c, {}))
    onward["peer"] = await asyncio.wait_for(b.connect(c.local_addrs()[0], c.id), 10)
    a = await nodes.start("py-a", listen=False)
    to_b = await asyncio.wait_for(a.connect(b.local_addrs()[0], b.id), 10)

    # No context current: none is sent.
    assert await to_b.request("app.traced", "ask", "hi", result=str) == "hi"
    assert seen_b["ask"]["traceparent"] is None
    assert seen_b["ask"]["trace_id"] == 0

    # A caller's context, under a span of the no-op tracer (which does not
    # record, and keeps its parent's context).
    parent = TraceContextTextMapPropagator().extract({"traceparent": TRACEPARENT})
    token = context.attach(parent)
    try:
        with trace.get_tracer("test").start_as_current_span("caller") as span:
            assert not span.is_recording()
            assert await to_b.request("app.traced", "relay", "hi", result=str) == "hi"
    finally:
        context.detach(token)
    noted = await asyncio.wait_for(seen_c["noted"].get(), 10)
    for saw in (seen_b["relay"], seen_c["ask"], noted):
        assert saw["traceparent"] == TRACEPARENT
        assert saw["trace_id"] == TRACE_ID
        assert not saw["recording"]


async def test_an_ambient_context_the_wire_refuses_costs_nothing_but_itself(
    nodes: Nodes, no_provider: None
) -> None:
    """A current span whose tracestate is too long for the wire (W3C:
    512 bytes): the call goes with its traceparent alone."""
    seen: dict[str, Any] = {}
    _, _, peer = await nodes.pair(traced(seen, {}))
    state = TraceState([("a", "x" * 200), ("b", "y" * 200), ("c", "z" * 200)])
    span = NonRecordingSpan(SpanContext(TRACE_ID, PARENT_ID, is_remote=False, trace_flags=TraceFlags(1), trace_state=state))
    with trace.use_span(span):
        assert await peer.request("app.traced", "ask", "hi", result=str) == "hi"
    assert (seen["ask"]["traceparent"], seen["ask"]["tracestate"]) == (TRACEPARENT, None)
    # Given explicitly, the same tracestate is an error.
    with pytest.raises(ValueError, match="tracestate"):
        await peer.request("app.traced", "ask", "hi", traceparent=TRACEPARENT, tracestate=state.to_header())


WITHOUT_OTEL = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["opentelemetry"] = None  # not installed: importing it fails
    import capwire

    TP = sys.argv[1]
    cap = capwire.Capability("app.traced", "1.0.0")
    onward = {}

    @cap.request("ask")
    async def ask(x: None, ctx: capwire.Context) -> list:
        return [ctx.traceparent, ctx.tracestate]

    @cap.request("relay")
    async def relay(x: None, ctx: capwire.Context) -> list:
        # The handler's inbound context goes on with its calls.
        return [ctx.traceparent] + await onward["peer"].request("app.traced", "ask", None)

    async def main() -> None:
        b = await capwire.Node.builder("b").listen("127.0.0.1:0").capability(cap).start()
        c = await capwire.Node.builder("c").listen("127.0.0.1:0").capability(cap).start()
        a = await capwire.Node.builder("a").start()
        onward["peer"] = await b.connect(c.local_addrs()[0], c.id)
        to_b = await a.connect(b.local_addrs()[0], b.id)
        print(await to_b.request("app.traced", "relay", None, traceparent=TP, tracestate="k=v"))
        print(await to_b.request("app.traced", "relay", None))
        try:
            await to_b.request("app.traced", "ask", None, traceparent="nonsense")
        except ValueError as e:
            print("ValueError", "traceparent" in str(e))
        print([m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v is not None])
        for n in (a, b, c):
            await n.shutdown()

    asyncio.run(main())
    """
)


def test_without_opentelemetry_handlers_pass_their_inbound_context_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, TRACEPARENT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        str([TRACEPARENT, TRACEPARENT, "k=v"]),
        str([None, None, None]),
        "ValueError True",
        "[]",
    ], done.stdout + done.stderr


def test_importing_capwire_imports_no_opentelemetry() -> None:
    code = "import sys, capwire; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
