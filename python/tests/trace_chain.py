"""What test_trace_chain.py runs besides its own code.

- ``Receiver``: an OTLP/HTTP receiver (protobuf, ``POST /v1/traces``) on
  127.0.0.1 in a thread of the test's process, which keeps every span it
  is sent, decoded with ``opentelemetry-proto``.
- ``python trace_chain.py node-b ...``: the chain's Python node, a child
  process: ``app.chain/start`` submits ``app.agent/work`` to a Rust node
  and answers the task's id (a JSON line on stdout says it too).
- ``python trace_chain.py mcp-client ...``: the chain's MCP client, a child
  process: the ``mcp`` package's client starts ``capwire mcp`` over stdio
  and calls one tool inside a root span of its own.

Both child processes export their spans (OpenTelemetry SDK, OTLP/HTTP
protobuf) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, and make none
otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import http.server
import json
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import capwire
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

#: OTLP's span kinds, by number.
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
#: OTLP's status codes, by number.
STATUSES = {0: "unset", 1: "ok", 2: "error"}


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


@dataclasses.dataclass
class Event:
    name: str
    attributes: dict[str, Any]


@dataclasses.dataclass
class Span:
    """One span as the receiver got it (ids in hex; ``parent`` empty for a
    root)."""

    service: str
    scope: str
    trace_id: str
    span_id: str
    parent: str
    name: str
    kind: str
    status: str
    attributes: dict[str, Any]
    events: list[Event]
    start_ns: int
    end_ns: int

    def event_names(self) -> list[str]:
        return [e.name for e in self.events]

    def __str__(self) -> str:
        attrs = {k: v for k, v in self.attributes.items() if k.startswith(("capwire.", "rpc.", "mcp."))}
        events = ",".join(self.event_names())
        return (
            f"{self.service:<14} {self.kind:<8} {self.name!r:<34} trace={self.trace_id} span={self.span_id} "
            f"parent={self.parent or '-':<16} status={self.status} {attrs} events=[{events}]"
        )


def decode(body: bytes) -> list[Span]:
    """The spans of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        service = str(resource.get("service.name", "?"))
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    Span(
                        service=service,
                        scope=ss.scope.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent=s.parent_span_id.hex(),
                        name=s.name,
                        kind=KINDS.get(s.kind, str(s.kind)),
                        status=STATUSES.get(s.status.code, str(s.status.code)),
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        events=[Event(e.name, {kv.key: _value(kv.value) for kv in e.attributes}) for e in s.events],
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                    )
                )
    return spans


class Receiver:
    """An OTLP/HTTP (protobuf) trace receiver on 127.0.0.1: every request
    it is sent, and the spans in them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Span] = []
        #: (path, content-encoding, span count) of each request taken.
        self.requests: list[tuple[str, str, int]] = []
        #: What went wrong with a request (a bad path or body).
        self.errors: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (the http.server name)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
                try:
                    if self.path != "/v1/traces":
                        raise ValueError(f"POST to {self.path}, not /v1/traces")
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    elif encoding not in ("", "identity"):
                        raise ValueError(f"content-encoding {encoding!r}")
                    spans = decode(body)
                except Exception as e:  # noqa: BLE001 (said in the test's failure)
                    with receiver.lock:
                        receiver.errors.append(f"{self.path}: {e!r}")
                    self._answer(400, b"")
                    return
                with receiver.lock:
                    receiver.spans.extend(spans)
                    receiver.requests.append((self.path, encoding, len(spans)))
                self._answer(200, ExportTraceServiceResponse().SerializeToString())

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT`` (exporters add /v1/traces)."""
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    async def wait_for(self, done: Callable[[list[Span]], bool], timeout: float) -> list[Span]:
        """The spans once ``done(spans)`` holds (polled), else after
        ``timeout`` seconds whatever came (the caller's asserts then say
        what is missing)."""
        until = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if done(spans) or time.monotonic() > until:
                return spans
            await asyncio.sleep(0.05)


def otel_export(service: str) -> Any:
    """A tracer provider exporting to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (set
    as the global one), or ``None`` when no endpoint is set."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # The endpoint, the batch's delay: from the OTEL_* variables.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


async def node_b(opts: argparse.Namespace) -> None:
    """The Python node of the chain."""
    provider = otel_export("python-node-b")
    cap = capwire.Capability("app.chain", "1.0.0")
    peers: dict[str, capwire.Peer] = {}

    @cap.request("start")
    async def start(args: Any, ctx: capwire.Context) -> str:
        # The context this handler was called with, as the SDK shows it.
        inbound = getattr(ctx, "traceparent", None)
        work = {"text": opts.text, "steps": opts.steps, "step_ms": opts.step_ms}
        task = await peers["c"].submit("app.agent", "work", work, timeout=5)
        emit({"kind": "submitted", "task": task.id, "traceparent": inbound})
        return task.id

    node = await capwire.Node.builder("chain.python").name("node-b").listen("127.0.0.1:0").capability(cap).start()
    # Sessions with both Rust nodes: A calls this node over its own.
    await asyncio.wait_for(node.connect(opts.a_addr, opts.a_id), 10)
    peers["c"] = await asyncio.wait_for(node.connect(opts.c_addr, opts.c_id), 10)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    emit({"kind": "ready", "node_id": node.id, "otel": provider is not None})
    await stop.wait()
    await asyncio.wait_for(node.shutdown(), 15)
    if provider is not None:
        provider.shutdown()
    emit({"kind": "stopped"})


async def mcp_client(opts: argparse.Namespace) -> None:
    """The MCP client of the chain: one tool call, inside a root span when
    spans are exported (the `mcp` package's client then makes its own
    client span under it and puts its context in the call's `_meta`)."""
    provider = otel_export("mcp-client")
    from mcp import Client, StdioServerParameters

    server = StdioServerParameters(
        command=opts.binary,
        args=["mcp", "--state", opts.state, "--allow-controller"],
        env=dict(os.environ),
    )
    root: dict[str, str] | None = None
    async with Client(server) as client:
        listing = await asyncio.wait_for(client.list_tools(), 20)
        tools = sorted(t.name for t in listing.tools)
        if opts.tool not in tools:
            emit({"kind": "error", "message": f"no tool {opts.tool}", "tools": tools})
            return
        arguments = json.loads(opts.arguments)
        if provider is not None:
            from opentelemetry import trace

            tracer = trace.get_tracer("trace-chain-test")
            with tracer.start_as_current_span("mcp client chain", kind=trace.SpanKind.CLIENT) as span:
                sc = span.get_span_context()
                root = {"trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}"}
                result = await asyncio.wait_for(client.call_tool(opts.tool, arguments), 30)
        else:
            result = await asyncio.wait_for(client.call_tool(opts.tool, arguments), 30)
    emit(
        {
            "kind": "called",
            "is_error": bool(result.is_error),
            "structured": result.structured_content,
            "root": root,
        }
    )
    if provider is not None:
        provider.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    b = sub.add_parser("node-b")
    b.add_argument("--a-addr", required=True)
    b.add_argument("--a-id", required=True)
    b.add_argument("--c-addr", required=True)
    b.add_argument("--c-id", required=True)
    b.add_argument("--text", required=True)
    b.add_argument("--steps", type=int, required=True)
    b.add_argument("--step-ms", type=int, required=True)
    m = sub.add_parser("mcp-client")
    m.add_argument("--binary", required=True)
    m.add_argument("--state", required=True)
    m.add_argument("--tool", required=True)
    m.add_argument("--arguments", required=True)
    opts = parser.parse_args()
    if opts.role == "node-b":
        asyncio.run(node_b(opts))
    else:
        asyncio.run(mcp_client(opts))


if __name__ == "__main__":
    main()
