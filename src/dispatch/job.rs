//! Running an admitted job: the binding re-check, the args decode, the
//! handler's first poll on the caller's task and, when the handler waits,
//! the future that finishes it elsewhere.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use capwire_envelope::{ErrorBody, ErrorCode, NodeId, RawValue};
use capwire_manifest::VerbKind;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::dispatch::extract::Context;
use crate::dispatch::handler::{BoxFuture, HandlerError};
use crate::dispatch::metrics::Outcome;
use crate::dispatch::{Dispatcher, Job};
use crate::error::panic_message;

/// How a job ended.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) result: Result<RawValue, ErrorBody>,
    pub(crate) outcome: Outcome,
}

impl Finished {
    fn err(code: ErrorCode, message: &str, outcome: Outcome) -> Self {
        Self {
            result: Err(ErrorBody::new(code, message)),
            outcome,
        }
    }

    fn from_handler(r: Result<RawValue, HandlerError>) -> Self {
        match r {
            Ok(value) => Self {
                result: Ok(value),
                outcome: Outcome::Ok,
            },
            Err(e) => Self {
                result: Err(e.into_body()),
                outcome: Outcome::Failed,
            },
        }
    }

    fn panicked(payload: &(dyn std::any::Any + Send)) -> Self {
        tracing::warn!(message = %panic_message(payload), "handler panicked");
        Self::err(ErrorCode::Internal, "the handler panicked", Outcome::Failed)
    }

    fn unauthorized(why: &capwire_authz::DenyReason) -> Self {
        Self {
            result: Err(why.error_body()),
            outcome: Outcome::Unauthorized,
        }
    }

    pub(crate) fn cancelled() -> Self {
        Self::err(
            ErrorCode::Cancelled,
            "cancelled: the request was cancelled",
            Outcome::Cancelled,
        )
    }
}

/// A job after its first poll.
pub(crate) enum Started {
    /// It finished without waiting.
    Done(Finished),
    /// It waits: drive this future to the end (it stops by itself at the
    /// deadline or when `token` is cancelled).
    Waiting {
        future: BoxFuture<Finished>,
        token: CancellationToken,
    },
}

/// Starts `job` for `sender` and polls it once with `task`'s waker, so a
/// handler that does not wait costs no task and no wake-up. `parent` is
/// the session's handler token; `channel` what is known of the session;
/// `stream`, for a job serving a stream, where its items go.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    dispatcher: &Dispatcher,
    job: &Job,
    sender: NodeId,
    parent: &CancellationToken,
    now: Instant,
    channel: crate::dispatch::extract::Channel,
    stream: Option<crate::dispatch::items::Served>,
    task: &mut TaskContext<'_>,
) -> Started {
    // A binding change since the decision takes effect here (bootstrap
    // verbs do not depend on the binding).
    if job.permit.class() == capwire_manifest::DeclaredClass::Controller
        && let Err(reason) = job.permit.recheck(&dispatcher.binding().snapshot())
    {
        return Started::Done(Finished {
            result: Err(reason.error_body()),
            outcome: Outcome::Unauthorized,
        });
    }
    if now >= job.deadline {
        return Started::Done(Finished::err(
            ErrorCode::Timeout,
            "the budget ran out before the handler started",
            Outcome::Cancelled,
        ));
    }
    let deadline = tokio::time::Instant::from_std(job.deadline);
    // Work a controller verb starts holds the authority it was admitted
    // on: a stream asks it before each item and ends when it is gone, a
    // task keeps it while it runs. A request needs none (it ends with its
    // answer).
    let outlives = matches!(job.permit.info().kind(), VerbKind::Stream | VerbKind::Task);
    let authority = outlives
        .then(|| dispatcher.authorities().of_permit(&job.permit))
        .flatten();
    let stream = stream.map(|mut s| {
        s.authority.clone_from(&authority);
        s
    });
    let serves_stream = stream.is_some();
    let mut cx = Context {
        sender,
        req_id: job.req_id.clone(),
        deadline,
        extensions: dispatcher.extensions().clone(),
        parent: parent.clone(),
        cancel: None,
        channel,
        stream,
        authority: authority.clone(),
    };
    let info = job.permit.info();
    let span = crate::trace::server_span(
        info.cap().as_str(),
        info.verb().as_str(),
        &sender,
        job.req_id.as_str(),
        job.permit.class().as_str(),
        job.permit.grant().map(|g| &**g),
        job.trace.as_ref(),
    );
    let first = {
        let _in_span = span.enter();
        match &job.trace {
            Some(t) => crate::trace::sync_scope(t.clone(), || first_poll(job, &mut cx, task)),
            None => first_poll(job, &mut cx, task),
        }
    };
    let future = match first {
        Ok(future) => future,
        Err(done) => {
            end_span(&span, &done);
            return Started::Done(done);
        }
    };
    let future = match &job.trace {
        Some(t) => Box::pin(crate::trace::scope(t.clone(), future)) as BoxFuture<_>,
        None => future,
    };
    let token = cx.cancel.take().unwrap_or_else(|| parent.child_token());
    let watch = token.clone();
    // A stream runs only while the authority that opened it holds
    // (a request that started runs to its answer).
    let held = authority.filter(|_| serves_stream);
    let rest = async move {
        let lost = async {
            match &held {
                Some(a) => a.lost().await,
                None => std::future::pending().await,
            }
        };
        // A cancel wins over what the handler made of it: a stream
        // handler whose session ended sees its items refused in the
        // same wake-up as the cancel, and that is a cancelled call,
        // not a failed one. So does the end of its authority.
        tokio::select! {
            biased;
            () = watch.cancelled() => Finished::cancelled(),
            why = lost, if held.is_some() => {
                watch.cancel();
                Finished::unauthorized(&why)
            }
            r = AssertUnwindSafe(future).catch_unwind() => match r {
                Ok(Err(_)) if watch.is_cancelled() => Finished::cancelled(),
                // Its items were refused because the caller is gone (the
                // session ended before its cancel reached the token).
                Ok(Err(e)) if serves_stream && e.body().code == ErrorCode::Cancelled => {
                    Finished::cancelled()
                }
                Ok(Err(e)) => match held.as_ref().map(|a| a.check()) {
                    // Its items were refused for it.
                    Some(Err(why)) => Finished::unauthorized(&why),
                    _ => Finished::from_handler(Err(e)),
                },
                Ok(r) => Finished::from_handler(r),
                Err(panic) => Finished::panicked(panic.as_ref()),
            },
            () = tokio::time::sleep_until(deadline) => {
                // `Meta::cancel` promises to fire at the deadline,
                // so work the handler handed off stops too.
                watch.cancel();
                Finished::err(
                    ErrorCode::Timeout,
                    "the handler ran out of its budget",
                    Outcome::Cancelled,
                )
            }
        }
    };
    let future = if span.is_disabled() {
        Box::pin(rest) as Pin<Box<dyn Future<Output = Finished> + Send>>
    } else {
        let in_span = span.clone();
        Box::pin(
            async move {
                let done = rest.await;
                end_span(&in_span, &done);
                done
            }
            .instrument(span),
        )
    };
    Started::Waiting { future, token }
}

/// Starts the handler of `job` and polls it once: the future when it
/// waits, how it ended when it did not.
fn first_poll(
    job: &Job,
    cx: &mut Context,
    task: &mut TaskContext<'_>,
) -> Result<BoxFuture<Result<RawValue, HandlerError>>, Finished> {
    let handler = job.permit.handler().handler();
    let mut future = match catch_unwind(AssertUnwindSafe(|| handler.start(&job.args, cx))) {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            return Err(Finished::err(
                ErrorCode::BadArgs,
                &format!("{e}"),
                Outcome::BadArgs,
            ));
        }
        Err(panic) => return Err(Finished::panicked(panic.as_ref())),
    };
    match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(task))) {
        Ok(Poll::Ready(r)) => Err(Finished::from_handler(r)),
        Err(panic) => Err(Finished::panicked(panic.as_ref())),
        Ok(Poll::Pending) => Ok(future),
    }
}

/// Records how the job ended on its server span.
fn end_span(span: &tracing::Span, done: &Finished) {
    match &done.result {
        Ok(_) => crate::trace::record_end(span, "ok", true),
        Err(body) => crate::trace::record_end(span, body.code.as_str(), false),
    }
}
