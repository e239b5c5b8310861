//! One trace across the cluster: W3C trace context on the wire (WIRE.md
//! 2.2) and spans for every call.
//!
//! A control frame on a session of protocol 3 may carry its caller's
//! [`TraceContext`]. A node reads it before anything else happens to the
//! call, drops it (and counts it, [`NodeStats::trace_contexts_dropped`])
//! when it is malformed or came on an older session, and serves the call
//! either way: a context never costs a call.
//!
//! **Spans.** Each call is a `tracing` span at both ends, with the target
//! [`SPAN_TARGET`]: a client span at the caller (`otel.kind = "client"`)
//! and a server span at the callee (`"server"`) that records the
//! chokepoint's decision (`capwire.class`, `capwire.outcome`,
//! `capwire.grant`). A stream is one span with its items as events; a
//! task's handler runs in a span of the submit's trace, also after a
//! restart. With the `otel` feature, the spans take their parents from the
//! contexts on the wire (through `tracing-opentelemetry`), so a subscriber
//! with an OpenTelemetry layer exports one trace across the cluster; the
//! `capwire` command sets one up from the standard `OTEL_*` variables.
//! With no subscriber interested in [`SPAN_TARGET`], a call pays one
//! branch for its spans.
//!
//! **Propagation.** A call carries, in this order: the context given to
//! [`Peer::with_trace`](crate::Peer::with_trace); else its own client
//! span's context (with `otel` and an interested subscriber); else the
//! context the running handler was called with ([`current`]), passed on
//! as it came. Contexts go only to peers whose session agreed protocol 3.
//!
//! [`NodeStats::trace_contexts_dropped`]: crate::NodeStats::trace_contexts_dropped

mod context;
mod counters;
mod spans;

pub use context::{MAX_TRACESTATE_LEN, MAX_TRACESTATE_MEMBERS, TraceContext, TraceError};
pub(crate) use counters::TraceCounters;
pub use spans::SPAN_TARGET;
pub(crate) use spans::{
    client_span, context_of, denied_span, describe_root, event_here, item_event, mark, record_end,
    server_span, task_span,
};

tokio::task_local! {
    /// The context the running handler was called with.
    static INBOUND: TraceContext;
}

/// The trace context of the work running now: the current span's (with
/// the `otel` feature and a subscriber that records it), else the context
/// the running handler or task was called with. `None` outside any traced
/// call.
///
/// ```
/// // Outside a handler there is none.
/// assert!(capwire::trace::current().is_none());
/// ```
#[must_use]
pub fn current() -> Option<TraceContext> {
    context_of(&tracing::Span::current()).or_else(inbound)
}

/// Makes `cx` the parent of `span` (a span of this process that continues
/// a trace that came from elsewhere: an HTTP header, an MCP request's
/// `_meta`). With the `otel` feature and a span recorded by an
/// OpenTelemetry layer; otherwise nothing. Call it before the span is
/// first entered.
pub fn set_parent(span: &tracing::Span, cx: &TraceContext) {
    spans::set_parent(span, cx);
}

/// The context the running handler was called with, as it came.
pub(crate) fn inbound() -> Option<TraceContext> {
    INBOUND.try_with(Clone::clone).ok()
}

/// Runs `f` with `cx` as the inbound context.
pub(crate) fn sync_scope<R>(cx: TraceContext, f: impl FnOnce() -> R) -> R {
    INBOUND.sync_scope(cx, f)
}

/// `future` with `cx` as the inbound context while it runs.
pub(crate) fn scope<F: std::future::Future>(
    cx: TraceContext,
    future: F,
) -> impl std::future::Future<Output = F::Output> {
    INBOUND.scope(cx, future)
}

/// What a call sends: `explicit` if given, else `span`'s context, else the
/// inbound one.
pub(crate) fn outgoing(
    explicit: Option<&TraceContext>,
    span: &tracing::Span,
) -> Option<TraceContext> {
    match explicit {
        // A span of ours, made under the explicit context, names itself
        // as the parent.
        Some(cx) => context_of(span).or_else(|| Some(cx.clone())),
        None => context_of(span).or_else(inbound),
    }
}
