//! Dispatch of inbound control envelopes, in exactly this order:
//!
//! ```text
//! header ─► control_auth_class ─► authorizer gate ─► ledger ─► args decode ─► handler
//!  (codec)     deny: unknown_verb    unauthorized     duplicate   bad_args      result/error
//!                                                     replay                    (runtime encodes)
//! ```
//!
//! The permit that lets a handler run comes only from
//! [`capwire_authz::decide`]; the binding epoch it was granted under is
//! checked again when the handler is about to run.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use capwire_authz::{DenyReason, OwnedPermit, decide};
use capwire_envelope::{
    ControlRef, ErrorBody, ErrorCode, RawValue, ReqId, encode_response_err, encode_response_ok,
};
use futures_util::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::handler::{Context, RouteHandler, panic_message};
use crate::ledger::Admission;
use crate::metrics::Outcome;
use crate::node::{Inner, Node, lock};
use crate::session::SessionHandle;

fn deny_code(reason: &DenyReason) -> (ErrorCode, Outcome) {
    match reason {
        DenyReason::Unauthorized { .. } => (ErrorCode::Unauthorized, Outcome::Unauthorized),
        _ => (ErrorCode::UnknownVerb, Outcome::UnknownVerb),
    }
}

pub(crate) async fn on_control(
    inner: &Arc<Inner>,
    s: &Arc<SessionHandle>,
    record: &Bytes,
    c: ControlRef<'_>,
) {
    let sender = s.remote();
    let fire_and_forget = c.req_id.is_fire_and_forget();
    let registry = inner.registry();
    let binding = inner.binding.snapshot();
    let permit =
        match decide(&registry, &inner.gate, &binding, &sender, c.cap, c.verb).into_result() {
            Ok(p) => p.into_owned(),
            Err(reason) => {
                let (code, outcome) = deny_code(&reason);
                if registry.lookup(c.cap, c.verb).is_some() {
                    inner.metrics.count_known(c.cap, c.verb, outcome);
                } else {
                    inner.metrics.count_unknown();
                }
                tracing::debug!(
                    peer = %sender, cap = c.cap, verb = c.verb, req_id = c.req_id.as_str(),
                    decision = outcome.as_str(), %reason, "envelope denied"
                );
                if !fire_and_forget {
                    s.send_error(&c.req_id, &ErrorBody::new(code, reason.to_string()))
                        .await;
                }
                return;
            }
        };
    drop(registry);
    let cap = c.cap;
    let verb = c.verb;

    if inner.shutting_down.load(Ordering::Relaxed) {
        if !fire_and_forget {
            let body = ErrorBody::new(ErrorCode::Cancelled, "the node is shutting down");
            s.send_error(&c.req_id, &body).await;
        }
        inner.metrics.count_known(cap, verb, Outcome::Cancelled);
        return;
    }

    let args = record.slice_ref(c.args);
    let token = s.handlers.child_token();
    // Requests and notifications of this session share one bound on the
    // work running at once.
    let room = s.running.load(Ordering::Relaxed) < inner.limits.max_inflight_per_session;
    if fire_and_forget {
        // Nobody waits for an answer, so there is nobody to tell
        // `overloaded`: instead the reader waits for a slot, which stops
        // reading this session and pushes back on the sender through the
        // transport's bounded queues and TCP flow control.
        while s.running.load(Ordering::Acquire) >= inner.limits.max_inflight_per_session {
            let freed = s.slot_freed.notified();
            if s.running.load(Ordering::Acquire) < inner.limits.max_inflight_per_session {
                break;
            }
            tokio::select! {
                _ = freed => {}
                _ = s.ended() => return,
            }
        }
        s.running.fetch_add(1, Ordering::Relaxed);
        start_execution(inner, s, permit, args, c.req_id, c.budget_ms, token).await;
        return;
    }

    // The ledger answers repeats and duplicates even when the session is at
    // its limit; only a new request is refused for want of room.
    let admission = lock(&inner.ledger).admit(sender, &c.req_id, &token, room, Instant::now());
    match admission {
        Admission::Run => {
            s.running.fetch_add(1, Ordering::Relaxed);
            start_execution(inner, s, permit, args, c.req_id, c.budget_ms, token).await;
        }
        Admission::NoRoom => {
            inner.metrics.count_known(cap, verb, Outcome::Overloaded);
            let body = ErrorBody::new(ErrorCode::Overloaded, "too many requests in flight");
            s.send_error(&c.req_id, &body).await;
        }
        Admission::Running => {
            inner.metrics.count_known(cap, verb, Outcome::Duplicate);
            let body = ErrorBody::new(
                ErrorCode::Duplicate,
                "a request with this req_id is still running",
            );
            s.send_error(&c.req_id, &body).await;
        }
        Admission::Replay(response) => {
            inner.metrics.count_known(cap, verb, Outcome::Replayed);
            let _ = s.send(response).await;
        }
        Admission::Forgotten => {
            inner.metrics.count_known(cap, verb, Outcome::Duplicate);
            let body = ErrorBody::new(
                ErrorCode::Duplicate,
                "a request with this req_id was already answered",
            );
            s.send_error(&c.req_id, &body).await;
        }
    }
}

/// Starts the handler. It is first polled right here, on the session's
/// reader: a handler that finishes without waiting (most do) then costs no
/// task spawn and no cross-thread wake-up. One that waits moves to a task
/// of its own, so the reader goes on.
async fn start_execution(
    inner: &Arc<Inner>,
    s: &Arc<SessionHandle>,
    permit: OwnedPermit<RouteHandler>,
    args: Bytes,
    req_id: ReqId,
    budget_ms: Option<u64>,
    token: CancellationToken,
) {
    let span = tracing::debug_span!(
        "envelope",
        peer = %s.remote(),
        cap = permit.info().cap().as_str(),
        verb = permit.info().verb().as_str(),
        req_id = req_id.as_str(),
        decision = tracing::field::Empty,
        latency_us = tracing::field::Empty,
    );
    let inner = inner.clone();
    let s = s.clone();
    let tracker = inner.tracker.clone();
    let mut run = Box::pin(
        async move {
            execute(inner, s, permit, args, req_id, budget_ms, token).await;
        }
        .instrument(span),
    );
    let finished =
        std::future::poll_fn(|cx| std::task::Poll::Ready(run.as_mut().poll(cx).is_ready())).await;
    if !finished {
        tracker.spawn(run);
    }
}

async fn execute(
    inner: Arc<Inner>,
    s: Arc<SessionHandle>,
    permit: OwnedPermit<RouteHandler>,
    args: Bytes,
    req_id: ReqId,
    budget_ms: Option<u64>,
    token: CancellationToken,
) {
    let started = Instant::now();
    let budget = budget_ms
        .map(Duration::from_millis)
        .unwrap_or(inner.limits.max_handler_time)
        .min(inner.limits.max_handler_time);
    let deadline = started + budget;
    let (result, outcome) =
        run_handler(&inner, &s, &permit, &args, &req_id, deadline, &token).await;

    let span = tracing::Span::current();
    span.record("decision", outcome.as_str());
    span.record("latency_us", started.elapsed().as_micros() as u64);
    let info = permit.info();
    inner
        .metrics
        .count_known(info.cap().as_str(), info.verb().as_str(), outcome);

    if req_id.is_fire_and_forget() {
        s.running.fetch_sub(1, Ordering::Release);
        s.slot_freed.notify_one();
        if let Err(e) = &result {
            tracing::debug!(code = %e.code, message = %e.message, "notification failed");
        }
        return;
    }
    let mut out = Vec::new();
    let encoded = match &result {
        Ok(value) => encode_response_ok(&mut out, &req_id, value.as_bytes()),
        Err(body) => encode_response_err(&mut out, &req_id, body),
    };
    if encoded.is_err() {
        out.clear();
        let body = ErrorBody::new(ErrorCode::Internal, "the response could not be encoded");
        let _ = encode_response_err(&mut out, &req_id, &body);
    } else if out.len() > s.max_frame() {
        // Sent as it is, the response would be refused by our transport or
        // end the session at the peer's; the caller gets `too_large`.
        out.clear();
        let body = ErrorBody::new(
            ErrorCode::TooLarge,
            "the result is larger than the caller accepts",
        );
        let _ = encode_response_err(&mut out, &req_id, &body);
    }
    let response = Bytes::from(out);
    lock(&inner.ledger).complete(s.remote(), &req_id, response.clone(), Instant::now());
    s.running.fetch_sub(1, Ordering::Release);
    s.slot_freed.notify_one();
    if !s.is_ended() {
        let _ = s.send(response).await;
    }
}

async fn run_handler(
    inner: &Arc<Inner>,
    s: &Arc<SessionHandle>,
    permit: &OwnedPermit<RouteHandler>,
    args: &[u8],
    req_id: &ReqId,
    deadline: Instant,
    token: &CancellationToken,
) -> (Result<RawValue, ErrorBody>, Outcome) {
    // A binding change since the permit was granted takes effect here.
    if let Err(reason) = permit.recheck(&inner.binding.snapshot()) {
        let (code, outcome) = deny_code(&reason);
        return (Err(ErrorBody::new(code, reason.to_string())), outcome);
    }
    let cx = Context {
        node: Node {
            inner: inner.clone(),
        },
        sender: s.remote(),
        req_id: req_id.clone(),
        deadline: Some(deadline),
        cancel: token.clone(),
    };
    let handler = permit.handler();
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| handler.start(args, cx)));
    let future = match started {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            return (
                Err(ErrorBody::new(ErrorCode::BadArgs, e.to_string())),
                Outcome::BadArgs,
            );
        }
        Err(panic) => {
            tracing::warn!(message = %panic_message(panic.as_ref()), "handler panicked");
            return (
                Err(ErrorBody::new(ErrorCode::Internal, "the handler panicked")),
                Outcome::Failed,
            );
        }
    };
    tokio::select! {
        r = AssertUnwindSafe(future).catch_unwind() => match r {
            Ok(Ok(value)) => (Ok(value), Outcome::Ok),
            Ok(Err(e)) => (Err(e.into_body()), Outcome::Failed),
            Err(panic) => {
                tracing::warn!(message = %panic_message(panic.as_ref()), "handler panicked");
                (Err(ErrorBody::new(ErrorCode::Internal, "the handler panicked")), Outcome::Failed)
            }
        },
        _ = token.cancelled() => (
            Err(ErrorBody::new(ErrorCode::Cancelled, "the request was cancelled")),
            Outcome::Cancelled,
        ),
        _ = tokio::time::sleep_until(deadline) => {
            // `Meta::cancel` promises to fire when the deadline passes, so
            // work the handler handed off stops too.
            token.cancel();
            (
                Err(ErrorBody::new(ErrorCode::Timeout, "the handler ran out of its budget")),
                Outcome::Cancelled,
            )
        }
    }
}
