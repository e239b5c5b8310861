//! Calling a peer: requests, notifications, streams and tasks, each an
//! awaitable; dropping (cancelling) one sends the peer a cancel.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use capwire::envelope::{RawValue, ReqId};
use capwire::manifest::VerbKind;
use capwire::trace::{TraceContext, TraceError};
use capwire::{CallError, ItemStream as RustItems, TaskEvents, TaskHandle as RustTask};
use futures_util::FutureExt;
use pyo3::prelude::*;

use crate::args::{seconds, value_error};
use crate::bridge::Bridge;
use crate::errors::{self, Fail};
use crate::value::{self, Cbor};

fn req_id(text: Option<String>) -> PyResult<Option<ReqId>> {
    text.map(|t| ReqId::try_from(t.as_str()).map_err(value_error))
        .transpose()
}

/// The trace context a call carries. `ambient` says where the Python
/// layer took it from: `false` for one the program gave (`traceparent=`,
/// `tracestate=`), which must be well formed (a `ValueError` otherwise);
/// `true` for the current OpenTelemetry span's or the running handler's,
/// which is passed on without its `tracestate` when only that is refused,
/// and dropped when its `traceparent` is (a context never costs a call).
fn trace(
    traceparent: Option<String>,
    tracestate: Option<String>,
    ambient: bool,
) -> PyResult<Option<TraceContext>> {
    let Some(tp) = traceparent else {
        return match tracestate {
            Some(_) if !ambient => Err(value_error(
                "tracestate= was given without a traceparent=: a tracestate only travels with its traceparent",
            )),
            _ => Ok(None),
        };
    };
    match TraceContext::parse(&tp, tracestate.as_deref()) {
        Ok(cx) => Ok(Some(cx)),
        Err(_) if ambient => Ok(TraceContext::parse(&tp, None).ok()),
        Err(e) => Err(value_error(trace_refused(&tp, tracestate.as_deref(), e))),
    }
}

/// Why an explicit trace context was refused, for the `ValueError`.
fn trace_refused(traceparent: &str, tracestate: Option<&str>, e: TraceError) -> String {
    match (e, tracestate) {
        (TraceError::Tracestate, Some(ts)) => format!(
            "tracestate={ts:?} is not a W3C tracestate ({e}): at most {} bytes and {} \
             comma-separated key=value members",
            capwire::trace::MAX_TRACESTATE_LEN,
            capwire::trace::MAX_TRACESTATE_MEMBERS,
        ),
        _ => format!(
            "traceparent={traceparent:?} is not a W3C traceparent ({e}): it reads \
             00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, in lower case, \
             neither id all zeros"
        ),
    }
}

/// Checks an explicit trace context as a call would (the `ValueError` it
/// would raise), before a stream is opened.
#[pyfunction]
#[pyo3(signature = (traceparent=None, tracestate=None))]
pub(crate) fn check_trace(traceparent: Option<String>, tracestate: Option<String>) -> PyResult<()> {
    trace(traceparent, tracestate, false).map(drop)
}

/// The call that fits a verb of `kind`.
fn call_for(kind: VerbKind) -> &'static str {
    match kind {
        VerbKind::Request => "peer.request()",
        VerbKind::Notification => "peer.notify()",
        VerbKind::Stream => "peer.stream()",
        VerbKind::Task => "peer.submit()",
    }
}

/// Refuses, before anything is sent, a call of another kind than the
/// verb's in the peer's manifest: a request on a stream verb would wait
/// out its deadline, a stream on a request verb would lose its answer, a
/// submit on a request verb would run it, a request on a task verb would
/// start a task. With no session up yet, a contact's session is waited
/// for (within `within`), as the call itself would (while `node` is
/// there to tell which peers are its contacts); a verb the manifest
/// does not list is left for the peer to refuse (`unknown_verb`). What is
/// left of `within`.
async fn check_kind(
    peer: &capwire::Peer,
    node: &Weak<capwire::Node>,
    cap: &str,
    verb: &str,
    want: VerbKind,
    within: Duration,
) -> Result<Duration, Fail> {
    let started = Instant::now();
    let mut manifest = peer.manifest();
    if manifest.is_none()
        && let Some(node) = node.upgrade()
        && node
            .contacts()
            .iter()
            .any(|c| capwire::transport::canonical_node_id(&c.id) == peer.id())
        && node.wait_for_peer(peer.id(), within).await.is_ok()
    {
        manifest = peer.manifest();
    }
    let kind = manifest
        .as_deref()
        .and_then(|m| m.capability(cap))
        .and_then(|c| c.verb(verb))
        .map(|v| v.kind);
    match kind {
        Some(kind) if kind != want => Err(Fail::class(
            "WrongKind",
            format!(
                "{cap}/{verb} is a {kind} verb, not a {want}: call it with {}, not {}",
                call_for(kind),
                call_for(want)
            ),
            None,
        )),
        _ => Ok(within.saturating_sub(started.elapsed())),
    }
}

/// A peer, by its node id; sessions are made as needed.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct Peer {
    peer: capwire::Peer,
    /// The node calling it (for a contact's session, awaited before a
    /// call's kind is checked); weakly held, as a peer may outlive it.
    node: Weak<capwire::Node>,
    bridge: Bridge,
}

impl Peer {
    pub(crate) fn new(peer: capwire::Peer, node: Weak<capwire::Node>, bridge: Bridge) -> Self {
        Self { peer, node, bridge }
    }

    /// The peer handle a call goes through: with its trace context, when
    /// it has one.
    fn traced(&self, trace: Option<TraceContext>) -> capwire::Peer {
        match trace {
            Some(cx) => self.peer.with_trace(cx),
            None => self.peer.clone(),
        }
    }
}

#[pymethods]
impl Peer {
    #[getter]
    fn id(&self) -> String {
        self.peer.id().to_string()
    }

    /// The peer's manifest from its hello, when a session is up.
    fn manifest(&self) -> PyResult<Option<Cbor>> {
        Ok(self
            .peer
            .manifest()
            .map(|m| value::serialized(&*m))
            .transpose()?)
    }

    #[pyo3(signature = (cap, verb, args, timeout=None, req_id=None, traceparent=None, tracestate=None, ambient=false))]
    #[allow(clippy::too_many_arguments)]
    fn request<'py>(
        &self,
        py: Python<'py>,
        cap: String,
        verb: String,
        args: &Bound<'py, PyAny>,
        timeout: Option<f64>,
        req_id: Option<String>,
        traceparent: Option<String>,
        tracestate: Option<String>,
        ambient: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (args, deadline, req_id, trace) = (
            value::encode(args)?,
            seconds(timeout)?,
            self::req_id(req_id)?,
            trace(traceparent, tracestate, ambient)?,
        );
        let (peer, node) = (self.traced(trace), self.node.clone());
        self.bridge.run_here(py, async move {
            let deadline =
                check_kind(&peer, &node, &cap, &verb, VerbKind::Request, deadline).await?;
            let result = match req_id {
                Some(id) => {
                    peer.call_raw_with_id(&cap, &verb, &args, &id, deadline)
                        .await
                }
                None => peer.call_raw(&cap, &verb, &args, deadline).await,
            };
            value::cbor(&result.map_err(errors::call)?)
        })
    }

    #[pyo3(signature = (cap, verb, args, timeout=None, traceparent=None, tracestate=None, ambient=false))]
    #[allow(clippy::too_many_arguments)]
    fn notify<'py>(
        &self,
        py: Python<'py>,
        cap: String,
        verb: String,
        args: &Bound<'py, PyAny>,
        timeout: Option<f64>,
        traceparent: Option<String>,
        tracestate: Option<String>,
        ambient: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (args, deadline, trace) = (
            value::encode(args)?,
            seconds(timeout)?,
            trace(traceparent, tracestate, ambient)?,
        );
        let (peer, node) = (self.traced(trace), self.node.clone());
        self.bridge.run_here(py, async move {
            let deadline =
                check_kind(&peer, &node, &cap, &verb, VerbKind::Notification, deadline).await?;
            peer.notify_raw_within(&cap, &verb, &args, deadline)
                .await
                .map_err(errors::call)
        })
    }

    #[pyo3(signature = (cap, verb, args, timeout=None, traceparent=None, tracestate=None, ambient=false))]
    #[allow(clippy::too_many_arguments)]
    fn stream<'py>(
        &self,
        py: Python<'py>,
        cap: String,
        verb: String,
        args: &Bound<'py, PyAny>,
        timeout: Option<f64>,
        traceparent: Option<String>,
        tracestate: Option<String>,
        ambient: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = value::encode(args)?;
        let deadline = timeout.map(|t| seconds(Some(t))).transpose()?;
        let open_within = deadline.map_or_else(|| seconds(None), Ok)?;
        let trace = trace(traceparent, tracestate, ambient)?;
        let (peer, node) = (self.traced(trace), self.node.clone());
        let bridge = self.bridge.clone();
        self.bridge.run_here(py, async move {
            let left = check_kind(&peer, &node, &cap, &verb, VerbKind::Stream, open_within).await?;
            // A stream's own deadline (when it has one) bounds all of it.
            let deadline = deadline.map(|_| left);
            let items = peer
                .stream_raw(&cap, &verb, &args, deadline)
                .await
                .map_err(errors::call)?;
            Ok(ItemStream::new(items, bridge))
        })
    }

    #[pyo3(signature = (cap, verb, args, timeout=None, req_id=None, traceparent=None, tracestate=None, ambient=false))]
    #[allow(clippy::too_many_arguments)]
    fn submit<'py>(
        &self,
        py: Python<'py>,
        cap: String,
        verb: String,
        args: &Bound<'py, PyAny>,
        timeout: Option<f64>,
        req_id: Option<String>,
        traceparent: Option<String>,
        tracestate: Option<String>,
        ambient: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (args, deadline, req_id, trace) = (
            value::encode(args)?,
            seconds(timeout)?,
            self::req_id(req_id)?,
            trace(traceparent, tracestate, ambient)?,
        );
        let (peer, node) = (self.traced(trace), self.node.clone());
        let bridge = self.bridge.clone();
        self.bridge.run_here(py, async move {
            let deadline = check_kind(&peer, &node, &cap, &verb, VerbKind::Task, deadline).await?;
            let task = peer
                .submit_raw(&cap, &verb, &args, req_id.as_ref(), deadline)
                .await
                .map_err(errors::call)?;
            Ok(TaskHandle { task, bridge })
        })
    }

    /// A handle to task `id` on this peer.
    fn task(&self, id: String) -> TaskHandle {
        TaskHandle {
            task: self.peer.task(id),
            bridge: self.bridge.clone(),
        }
    }

    /// Binds the peer with its invite: this node becomes its control
    /// plane; what it answered.
    fn bind<'py>(&self, py: Python<'py>, invite: &str) -> PyResult<Bound<'py, PyAny>> {
        let invite: capwire::Invite = invite.parse().map_err(value_error)?;
        let peer = self.peer.clone();
        self.bridge.spawn(py, async move {
            let reply = peer.bind(&invite).await.map_err(errors::call)?;
            value::serialized(&reply)
        })
    }
}

/// A stream's items as they arrive.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct ItemStream {
    items: Arc<tokio::sync::Mutex<Taken>>,
    bridge: Bridge,
}

/// A stream being taken: what is left of it, and how it ended when it
/// ended after items that were handed over first.
struct Taken {
    stream: Option<RustItems<RawValue>>,
    then: Option<Fail>,
}

impl ItemStream {
    pub(crate) fn new(stream: RustItems<RawValue>, bridge: Bridge) -> Self {
        Self {
            items: Arc::new(tokio::sync::Mutex::new(Taken {
                stream: Some(stream),
                then: None,
            })),
            bridge,
        }
    }
}

/// How a stream that is over ends its iteration.
fn ended(e: Option<capwire::CallError>) -> Fail {
    e.map_or(Fail::Stop, errors::call)
}

#[pymethods]
impl ItemStream {
    /// The items that are there (at least one, at most `max`), waiting
    /// for the first; raises `StopAsyncIteration` after the last, or the
    /// error the stream ended with. Taking items grants the peer credit.
    #[pyo3(signature = (max=256))]
    fn next_batch<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyAny>> {
        let items = Arc::clone(&self.items);
        self.bridge.run_here(py, async move {
            let mut taken = items.lock().await;
            if let Some(fail) = taken.then.take() {
                return Err(fail);
            }
            let Some(stream) = taken.stream.as_mut() else {
                return Err(Fail::Stop);
            };
            let mut out = Vec::new();
            match stream.next().await {
                Some(Ok(item)) => out.push(value::cbor(&item)?),
                other => {
                    taken.stream = None;
                    return Err(ended(other.and_then(Result::err)));
                }
            }
            // What else is already here, without waiting.
            while out.len() < max.max(1) {
                match stream.next().now_or_never() {
                    Some(Some(Ok(item))) => out.push(value::cbor(&item)?),
                    Some(other) => {
                        taken.stream = None;
                        taken.then = Some(ended(other.and_then(Result::err)));
                        break;
                    }
                    None => break,
                }
            }
            Ok(out)
        })
    }

    /// Stops the stream: the peer is told to stop (if it had not ended).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let items = Arc::clone(&self.items);
        self.bridge.run_here(py, async move {
            drop(items.lock().await.stream.take());
            Ok(())
        })
    }
}

/// A task on a peer.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct TaskHandle {
    task: RustTask<RawValue>,
    bridge: Bridge,
}

#[pymethods]
impl TaskHandle {
    #[getter]
    fn id(&self) -> &str {
        self.task.id()
    }

    fn get<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let task = self.task.clone();
        self.bridge.run_here(py, async move {
            value::serialized(&task.get().await.map_err(errors::call)?)
        })
    }

    /// The task's result, or the error it ended with: its own code and
    /// message (a `cancelled` task's message too, which the Rust error
    /// for it does not carry).
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let task = self.task.clone();
        self.bridge.run_here(py, async move {
            match task.result().await {
                Ok(result) => value::cbor(&result),
                Err(e) => Err(ended_with(&task, e).await),
            }
        })
    }

    #[pyo3(signature = (answer, question_seq=None))]
    fn respond<'py>(
        &self,
        py: Python<'py>,
        answer: &Bound<'py, PyAny>,
        question_seq: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let answer = value::encode(answer)?;
        let task = self.task.clone();
        self.bridge.run_here(py, async move {
            let info = task
                .respond_to(question_seq, &answer)
                .await
                .map_err(errors::call)?;
            value::serialized(&info)
        })
    }

    fn cancel<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let task = self.task.clone();
        self.bridge.run_here(py, async move {
            value::serialized(&task.cancel().await.map_err(errors::call)?)
        })
    }

    #[pyo3(signature = (start=1))]
    fn events<'py>(&self, py: Python<'py>, start: u64) -> PyResult<Bound<'py, PyAny>> {
        let task = self.task.clone();
        let bridge = self.bridge.clone();
        self.bridge.run_here(py, async move {
            let events = task.events(start).await.map_err(errors::call)?;
            Ok(EventStream {
                events: Arc::new(tokio::sync::Mutex::new(events)),
                bridge,
            })
        })
    }
}

/// The error of a task's end, as the task's record has it when `e` is an
/// error that carries no message of its own (`cancelled`, `timeout`,
/// `overloaded`, `too_large`); otherwise `e`.
async fn ended_with(task: &RustTask<RawValue>, e: CallError) -> Fail {
    let code = match e {
        CallError::Cancelled => "cancelled",
        CallError::Timeout => "timeout",
        CallError::Overloaded => "overloaded",
        CallError::TooLarge => "too_large",
        _ => return errors::call(e),
    };
    match task.get().await {
        Ok(info) if info.state.is_final() => match info.error {
            Some(body) if body.code.as_str() == code => errors::remote(&body),
            _ => errors::call(e),
        },
        _ => errors::call(e),
    }
}

/// A task's events as they happen.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct EventStream {
    events: Arc<tokio::sync::Mutex<TaskEvents>>,
    bridge: Bridge,
}

#[pymethods]
impl EventStream {
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let events = Arc::clone(&self.events);
        self.bridge.run_here(py, async move {
            match events.lock().await.next().await {
                Some(Ok(event)) => value::serialized(&event),
                Some(Err(e)) => Err(errors::call(e)),
                None => Err(Fail::Stop),
            }
        })
    }
}
