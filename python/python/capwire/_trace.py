"""W3C trace context for handlers and calls (WIRE.md 2.2), through
OpenTelemetry when its API (``opentelemetry-api``, the ``otel`` extra) is
installed. Not an API: handlers see ``Context.traceparent``, calls take
``traceparent=`` and ``tracestate=``.

Without OpenTelemetry nothing is imported: a handler's inbound context is
kept in a context variable while it runs, and its calls pass it on as it
came. With it, a handler runs in a server span, child of its caller's,
and calls carry the current span's context.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

__all__ = ["outgoing", "record", "serve", "tracing"]

T = TypeVar("T")

#: The trace context (``traceparent``, ``tracestate``) the running handler
#: was called with: what its calls carry when no OpenTelemetry span is
#: current. (Python's calls do not run in the Rust handler's task, whose
#: runtime would pass it on by itself.)
_inbound: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "capwire_inbound_trace", default=None
)


class _Otel:
    """The parts of the OpenTelemetry API used here, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.context = context
        self.trace = trace
        self.propagator = TraceContextTextMapPropagator()
        self.server = trace.SpanKind.SERVER
        self._no_op = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None

    def tracer(self) -> Tracer | None:
        """``get_tracer("capwire")`` of the global tracer provider, made
        again when the provider changes; ``None`` while there is none (the
        API's default), whose tracer's span would be the parent's own,
        not recording."""
        provider = self.trace.get_tracer_provider()
        if provider is not self._provider:
            no_op = type(provider) in self._no_op
            self._provider, self._tracer = provider, None if no_op else self.trace.get_tracer("capwire")
        return self._tracer


_checked = False
_otel: _Otel | None = None


def tracing() -> _Otel | None:
    """OpenTelemetry, when it can be imported (checked once)."""
    global _checked, _otel
    if not _checked:
        try:
            _otel = _Otel()
        except ImportError:
            _otel = None
        except Exception:
            # An installation that does not import cleanly costs no call.
            logging.getLogger("capwire").warning("OpenTelemetry did not load; no tracing", exc_info=True)
            _otel = None
        _checked = True
    return _otel


async def serve(run: Awaitable[T], cap: str, verb: str, traceparent: str | None, tracestate: str | None) -> T:
    """Awaits a handler's ``run`` with its inbound context kept for its
    calls and, with OpenTelemetry, attached as the parent of a server span
    ``cap/verb`` that the handler runs in (its status an error when the
    handler raises)."""
    kept = _inbound.set((traceparent, tracestate)) if traceparent is not None else None
    try:
        otel = tracing()
        if otel is None:
            return await run
        if traceparent is None:
            # A new trace (nothing of the context the handler's task
            # inherited from the loop).
            parent = otel.context.Context()
        else:
            carrier = {"traceparent": traceparent}
            if tracestate is not None:
                carrier["tracestate"] = tracestate
            parent = otel.propagator.extract(carrier)
        attached = otel.context.attach(parent)
        try:
            tracer = otel.tracer()
            if tracer is None:
                # No tracer provider: the caller's context, attached, is
                # what its no-op span would be.
                return await run
            with tracer.start_as_current_span(
                f"{cap}/{verb}",
                kind=otel.server,
                attributes={"rpc.system": "capwire", "rpc.service": cap, "rpc.method": verb},
                # The handler's own exception is recorded where it is
                # raised (`record`); the status is set here.
                record_exception=False,
            ):
                return await run
        finally:
            otel.context.detach(attached)
    finally:
        if kept is not None:
            _inbound.reset(kept)


def record(exc: BaseException) -> None:
    """Records an exception a handler raised on its span (if OpenTelemetry
    was loaded and the span records)."""
    if _otel is not None:
        span = _otel.trace.get_current_span()
        if span.is_recording():
            span.record_exception(exc)


def outgoing(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None, bool]:
    """What a call carries, and whether it is ambient (the Rust side then
    drops what it does not believe, rather than raise): the context given
    (checked, ``ValueError`` when malformed); else the current
    OpenTelemetry span's, when it is valid; else the running handler's
    inbound one; else none."""
    if traceparent is not None or tracestate is not None:
        return traceparent, tracestate, False
    otel = tracing()
    if otel is not None and otel.trace.get_current_span().get_span_context().is_valid:
        carrier: dict[str, str] = {}
        otel.propagator.inject(carrier)
        found = carrier.get("traceparent")
        if found is not None:
            return found, carrier.get("tracestate"), True
    inbound = _inbound.get()
    if inbound is not None:
        return inbound[0], inbound[1], True
    return None, None, True
