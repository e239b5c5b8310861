//! The spans of calls, streams and tasks, as `tracing` spans of target
//! [`SPAN_TARGET`]. With the `otel` feature they take their parents from
//! W3C contexts and give theirs to the wire (through
//! `tracing-opentelemetry`); without it they are plain `tracing` spans and
//! contexts pass through as they came.
//!
//! Every function here costs one branch when no subscriber is interested
//! in [`SPAN_TARGET`]: the span macros test the callsite's interest before
//! they evaluate a field.

use tracing::Span;
use tracing::field::Empty;

use crate::trace::TraceContext;

/// The target of every span and span event capwire makes for a call. A
/// subscriber turns them on or off by it (`capwire::otel=info`).
pub const SPAN_TARGET: &str = "capwire::otel";

/// The server span of a call from `sender` to `cap`/`verb`, admitted as
/// `class`; its parent is the caller's context `parent`.
pub(crate) fn server_span(
    cap: &str,
    verb: &str,
    sender: &capwire_envelope::NodeId,
    req_id: &str,
    class: &str,
    grant: Option<&str>,
    parent: Option<&TraceContext>,
) -> Span {
    // A caller that did not sample its trace asks for no span: the
    // context goes on as it came (a parent-based sampler would make the
    // span only to drop it).
    // Asked first, and alone: a disabled span made by the macro would
    // still evaluate its fields where `tracing` speaks to `log`.
    if !tracing::span_enabled!(target: SPAN_TARGET, tracing::Level::INFO)
        || parent.is_some_and(|p| !p.sampled())
    {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "capwire.server",
        otel.name = %format_args!("{cap}/{verb}"),
        otel.kind = "server",
        otel.status_code = Empty,
        rpc.system = "capwire",
        rpc.service = cap,
        rpc.method = verb,
        capwire.peer = %sender,
        capwire.req_id = req_id,
        capwire.class = class,
        capwire.grant = grant,
        capwire.outcome = Empty,
    );
    if !span.is_disabled() {
        link::set_parent(&span, parent);
    }
    span
}

/// A server span for a call the chokepoint answered itself (denied,
/// replayed, refused for bounds): made and ended at once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn denied_span(
    cap: &str,
    verb: &str,
    sender: &capwire_envelope::NodeId,
    req_id: &str,
    class: &str,
    grant: Option<&str>,
    outcome: &str,
    parent: Option<&TraceContext>,
) {
    let span = server_span(cap, verb, sender, req_id, class, grant, parent);
    record_end(&span, outcome, outcome == "replayed");
}

/// The client span of a call from this node to `peer`'s `cap`/`verb`; its
/// parent is `parent` when given, else the current span, else the context
/// the running handler was called with. None in a trace its parent did
/// not sample (the context goes on as it is). Its fields are given as it
/// is made, while they are cheap to take, except for the root of a trace
/// (`true` beside it): whether the tracer samples it is known only once
/// it starts, and [`describe_root`] gives it its fields if it does.
pub(crate) fn client_span(
    cap: &str,
    verb: &str,
    peer: &capwire_envelope::NodeId,
    parent: Option<&TraceContext>,
) -> (Span, bool) {
    if !tracing::span_enabled!(target: SPAN_TARGET, tracing::Level::INFO) {
        return (Span::none(), false);
    }
    let inbound;
    let parent = match parent {
        Some(p) => Some(p),
        None if Span::current().is_none() => {
            inbound = super::inbound();
            inbound.as_ref()
        }
        None => None,
    };
    if parent.is_some_and(|p| !p.sampled()) {
        return (Span::none(), false);
    }
    if parent.is_none() && Span::current().is_none() {
        // The root of a trace, sampled or not as the tracer decides: its
        // fields wait for that decision ([`describe_root`]).
        let span = tracing::info_span!(
            target: SPAN_TARGET,
            "capwire.client",
            otel.kind = "client",
            otel.status_code = Empty,
            capwire.outcome = Empty,
        );
        return (span, true);
    }
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "capwire.client",
        otel.name = %format_args!("{cap}/{verb}"),
        otel.kind = "client",
        otel.status_code = Empty,
        rpc.system = "capwire",
        rpc.service = cap,
        rpc.method = verb,
        capwire.peer = %peer,
        capwire.outcome = Empty,
    );
    if !span.is_disabled() {
        link::set_parent(&span, parent);
    }
    (span, false)
}

/// Names and describes the root client span `span` of a sampled trace
/// (see [`client_span`]); nothing for a span that is not recorded.
pub(crate) fn describe_root(span: &Span, cap: &str, verb: &str, peer: &capwire_envelope::NodeId) {
    if !span.is_disabled() {
        link::describe(span, cap, verb, peer);
    }
}

/// The span a task's handler runs in, a child of the submit's context
/// `parent` (kept with the task, so a resumed task stays in its trace).
pub(crate) fn task_span(
    cap: &str,
    verb: &str,
    task_id: &str,
    parent: Option<&TraceContext>,
) -> Span {
    if !tracing::span_enabled!(target: SPAN_TARGET, tracing::Level::INFO)
        || parent.is_some_and(|p| !p.sampled())
    {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "capwire.task",
        otel.name = %format_args!("task {cap}/{verb}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        rpc.system = "capwire",
        rpc.service = cap,
        rpc.method = verb,
        capwire.task = task_id,
        capwire.outcome = Empty,
    );
    if !span.is_disabled() {
        link::set_parent(&span, parent);
    }
    span
}

/// Records how the work of `span` ended: `outcome` (`ok` or an error
/// code), an error status unless `ok`.
pub(crate) fn record_end(span: &Span, outcome: &str, ok: bool) {
    if span.is_disabled() {
        return;
    }
    span.record("capwire.outcome", outcome);
    if !ok {
        span.record("otel.status_code", "ERROR");
    }
}

/// One event of a stream or a task on `span`: `what` (`item`, `progress`,
/// `question`, ...) with its sequence number.
pub(crate) fn item_event(span: &Span, what: &'static str, seq: u64) {
    if span.is_disabled() {
        return;
    }
    // An integer attribute (OpenTelemetry has no unsigned one).
    let seq = i64::try_from(seq).unwrap_or(i64::MAX);
    tracing::info!(target: SPAN_TARGET, parent: span, seq, "{what}");
}

/// A named moment of `span`'s work, with no sequence number (a task
/// resumed after a restart).
pub(crate) fn mark(span: &Span, what: &'static str) {
    if span.is_disabled() {
        return;
    }
    tracing::info!(target: SPAN_TARGET, parent: span, "{what}");
}

/// One event of the work running now (a stream's item, a task's event),
/// on the current span.
pub(crate) fn event_here(what: &'static str, seq: u64) {
    if !tracing::event_enabled!(target: SPAN_TARGET, tracing::Level::INFO) {
        return;
    }
    let seq = i64::try_from(seq).unwrap_or(i64::MAX);
    tracing::info!(target: SPAN_TARGET, seq, "{what}");
}

/// Makes `cx` the parent of `span`, when it is recorded.
pub(crate) fn set_parent(span: &Span, cx: &TraceContext) {
    if !span.is_disabled() {
        link::set_parent(span, Some(cx));
    }
}

/// The W3C context of `span`, if it is recorded by an OpenTelemetry
/// layer (with the `otel` feature).
pub(crate) fn context_of(span: &Span) -> Option<TraceContext> {
    if span.is_disabled() {
        return None;
    }
    link::context_of(span)
}

#[cfg(feature = "otel")]
mod link {
    //! The bridge to OpenTelemetry's span contexts.

    use opentelemetry::KeyValue;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use crate::trace::TraceContext;

    pub(super) fn set_parent(span: &Span, parent: Option<&TraceContext>) {
        let Some(p) = parent else {
            return;
        };
        let state = p
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let flags = if p.sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let remote = SpanContext::new(
            TraceId::from_bytes(p.trace_id()),
            SpanId::from_bytes(p.span_id()),
            flags,
            true,
            state,
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(remote);
        // Refused only for a span already entered: ours are not.
        let _ = span.set_parent(cx);
    }

    pub(super) fn describe(span: &Span, cap: &str, verb: &str, peer: &capwire_envelope::NodeId) {
        let cx = span.context();
        let otel = cx.span();
        otel.update_name(format!("{cap}/{verb}"));
        otel.set_attributes([
            KeyValue::new("rpc.system", "capwire"),
            KeyValue::new("rpc.service", cap.to_owned()),
            KeyValue::new("rpc.method", verb.to_owned()),
            KeyValue::new("capwire.peer", peer.to_string()),
        ]);
    }

    pub(super) fn context_of(span: &Span) -> Option<TraceContext> {
        let cx = span.context();
        let otel = cx.span();
        let sc = otel.span_context();
        if !sc.is_valid() {
            return None;
        }
        let state = sc.trace_state().header();
        TraceContext::from_parts(
            sc.trace_id().to_bytes(),
            sc.span_id().to_bytes(),
            sc.is_sampled(),
            (!state.is_empty()).then_some(state.as_str()),
        )
        .ok()
    }
}

#[cfg(not(feature = "otel"))]
mod link {
    //! Without OpenTelemetry, spans have no W3C context of their own.

    use tracing::Span;

    use crate::trace::TraceContext;

    pub(super) fn set_parent(_: &Span, _: Option<&TraceContext>) {}

    pub(super) fn describe(_: &Span, _: &str, _: &str, _: &capwire_envelope::NodeId) {}

    pub(super) fn context_of(_: &Span) -> Option<TraceContext> {
        None
    }
}
