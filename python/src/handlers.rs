//! Python handlers behind capwire's raw verbs.
//!
//! The runtime calls a handler on one of its threads after the chokepoint
//! allowed the envelope; the args are decoded there, without the GIL. The
//! handler's coroutine is then started as a task on the node's asyncio
//! loop, through its [`Bridge`], and the loop hands its outcome back
//! through a [`Completion`]. When the runtime drops the handler's future
//! (a cancel from the caller, the deadline, the session's end, shutdown),
//! the asyncio task is cancelled.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use capwire::envelope::{ErrorCode, RawValue};
use capwire::trace::TraceContext;
use capwire::{HandlerError, Items, Meta, Sender, Task, TaskError};
use futures_util::FutureExt;
use pyo3::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bridge::Bridge;
use crate::errors;
use crate::value::{self, Cbor};

/// How a handler's coroutine ended.
type Outcome = Result<RawValue, HandlerError>;

fn internal(message: impl Into<String>) -> HandlerError {
    HandlerError::new(ErrorCode::Internal, message)
}

/// Hands a handler's outcome from the loop back to the runtime: the
/// Python layer's `invoke` calls one of its methods as the handler ends,
/// in the handler's own task step.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct Completion {
    tx: Mutex<Option<oneshot::Sender<Outcome>>>,
}

#[pymethods]
impl Completion {
    /// The handler's result (plain values).
    fn ok(&self, py: Python<'_>, result: &Bound<'_, PyAny>) {
        self.send(value::encode(result).map_err(|e| {
            log_error(py, &format!("a handler's result could not be sent: {e}"));
            internal("the handler's result could not be encoded")
        }));
    }

    /// The exception the handler raised.
    fn error(&self, exc: &Bound<'_, PyAny>) {
        self.send(Err(raised(exc)));
    }

    /// The handler was cancelled.
    fn cancelled(&self) {
        self.send(Err(HandlerError::new(
            ErrorCode::Cancelled,
            "the handler was cancelled",
        )));
    }
}

impl Completion {
    fn send(&self, outcome: Outcome) {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tx) = tx {
            let _ = tx.send(outcome);
        }
    }
}

/// The error answer for an exception a handler raised: a capwire error
/// keeps its code and message; anything else was logged by the Python
/// layer and is `internal`, with no detail sent.
fn raised(exc: &Bound<'_, PyAny>) -> HandlerError {
    let code = exc
        .getattr("code")
        .ok()
        .and_then(|c| c.extract::<String>().ok())
        .and_then(|c| c.parse::<ErrorCode>().ok());
    match code {
        Some(code) => {
            let message = exc
                .getattr("message")
                .ok()
                .and_then(|m| m.extract::<String>().ok())
                .unwrap_or_default();
            HandlerError::new(code, message)
        }
        None => internal("the handler failed"),
    }
}

/// Logs through Python's `logging` (the node's log is the app's).
pub(crate) fn log_error(py: Python<'_>, message: &str) {
    let _ = py
        .import("logging")
        .and_then(|l| l.call_method1("getLogger", ("capwire",)))
        .and_then(|l| l.call_method1("error", (message,)));
}

/// What a handler is given besides its args.
#[pyclass(frozen, name = "Context", module = "capwire._capwire")]
pub(crate) struct Context {
    sender: String,
    req_id: String,
    deadline: Instant,
    /// The W3C trace context the call came with (`capwire::trace::current`
    /// in the handler's future), if any.
    trace: Option<TraceContext>,
}

#[pymethods]
impl Context {
    /// The caller's node id (proven by the handshake), as hex.
    #[getter]
    fn sender(&self) -> &str {
        &self.sender
    }

    /// The request's id (empty for a notification).
    #[getter]
    fn req_id(&self) -> &str {
        &self.req_id
    }

    /// The caller's W3C `traceparent`, when the call carried a trace
    /// context (on a protocol-3 session).
    #[getter]
    fn traceparent(&self) -> Option<String> {
        self.trace.as_ref().map(TraceContext::traceparent)
    }

    /// The caller's W3C `tracestate`, when it sent one with its
    /// `traceparent`.
    #[getter]
    fn tracestate(&self) -> Option<&str> {
        self.trace.as_ref().and_then(TraceContext::tracestate)
    }

    /// Seconds left of the caller's deadline.
    fn time_left(&self) -> f64 {
        self.deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!(
            "Context(sender={:?}, req_id={:?})",
            self.sender, self.req_id
        )
    }
}

/// Where a stream handler's items go: `await items.send(value)` waits for
/// the caller's credit.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct ItemSink {
    items: Arc<tokio::sync::Mutex<Option<Items<RawValue>>>>,
    bridge: Bridge,
}

#[pymethods]
impl ItemSink {
    fn send<'py>(&self, py: Python<'py>, item: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let raw = value::encode(item)?;
        let items = Arc::clone(&self.items);
        self.bridge.run_here(py, async move {
            let mut items = items.lock().await;
            match items.as_mut() {
                Some(items) => items.send(raw).await.map_err(errors::stream_closed),
                None => Err(errors::stream_closed(capwire::StreamClosed::Gone)),
            }
        })
    }
}

/// A task's handle, for its handler: progress, questions, its id.
#[pyclass(frozen, name = "TaskContext", module = "capwire._capwire")]
pub(crate) struct TaskContext {
    task: Arc<Task>,
    sender: String,
    bridge: Bridge,
    /// Fired once the handler's run is over: its asyncio task was told to
    /// cancel, or it ended.
    over: CancellationToken,
}

/// How a task's progress or question that failed ends for the handler.
///
/// When the task was cancelled (or the node stops), the runtime drops the
/// handler, and its asyncio task is cancelled; the failed write's error
/// must not reach the handler first (`TaskError` where it was promised
/// `asyncio.CancelledError`). So it waits until the cancel was delivered:
/// the handler then sees `CancelledError` whatever the order in which the
/// two came to the loop. (Awaited from another asyncio task than the
/// handler's, it ends with the error after that.)
async fn task_failed(task: &Task, over: &CancellationToken, e: TaskError) -> errors::Fail {
    if e == TaskError::Ended && task.cancelled().now_or_never().is_some() {
        over.cancelled().await;
    }
    errors::task(e)
}

#[pymethods]
impl TaskContext {
    /// The task's id.
    #[getter]
    fn id(&self) -> String {
        self.task.id()
    }

    /// Whether this run is a resume after the node restarted.
    #[getter]
    fn resumed(&self) -> bool {
        self.task.resumed()
    }

    /// The submitter's node id, as hex.
    #[getter]
    fn sender(&self) -> &str {
        &self.sender
    }

    /// Reports progress: a `progress` event, written before this returns.
    fn progress<'py>(
        &self,
        py: Python<'py>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let raw = value::encode(value)?;
        let (task, over) = (Arc::clone(&self.task), self.over.clone());
        self.bridge.run_here(py, async move {
            match task.progress(&raw).await {
                Ok(()) => Ok(()),
                Err(e) => Err(task_failed(&task, &over, e).await),
            }
        })
    }

    /// Asks the submitter a question; its answer (raw), within `within`
    /// seconds.
    fn ask<'py>(
        &self,
        py: Python<'py>,
        question: &Bound<'py, PyAny>,
        within: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let raw = value::encode(question)?;
        let within = Duration::try_from_secs_f64(within)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let (task, over) = (Arc::clone(&self.task), self.over.clone());
        self.bridge.run_here(py, async move {
            match task.ask::<_, ciborium::Value>(&raw, within).await {
                Ok(answer) => Ok(Cbor(answer)),
                Err(e) => Err(task_failed(&task, &over, e).await),
            }
        })
    }
}

/// The asyncio task a handler runs as, once the loop started it.
type Slot = Mutex<Option<Py<PyAny>>>;

/// A started handler: its asyncio task is cancelled if the runtime lets
/// go of the handler before it ended. `over` is fired once that cancel
/// was delivered, or at once when the handler had ended.
struct Running {
    bridge: Bridge,
    slot: Option<Arc<Slot>>,
    over: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        let over = self.over.clone();
        match self.slot.take() {
            // Queued after the start: the task exists by then (or never
            // will).
            Some(slot) => self.bridge.push(Box::new(move |py| {
                let task = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
                if let Some(task) = task {
                    let _ = task.call_method0(py, "cancel");
                }
                over.cancel();
            })),
            None => over.cancel(),
        }
    }
}

/// What a handler of each kind gets besides its args and context.
pub(crate) enum Extra {
    None,
    Items(Arc<tokio::sync::Mutex<Option<Items<RawValue>>>>),
    Task(Arc<Task>),
}

/// A handler to start: `invoke(args, ctx, extra, done)`.
struct Call {
    invoke: Arc<Py<PyAny>>,
    args: ciborium::Value,
    ctx: Context,
    extra: Extra,
    /// See [`Running`].
    over: CancellationToken,
}

/// Starts `call` as a task on the loop (on its thread); it tells `done`
/// how it ended.
fn start(
    py: Python<'_>,
    bridge: &Bridge,
    call: Call,
    done: Py<Completion>,
    slot: &Slot,
) -> PyResult<()> {
    let Call {
        invoke,
        args,
        ctx,
        extra,
        over,
    } = call;
    let args = value::to_py(py, &args, 0)?;
    let sender = ctx.sender.clone();
    let extra: Py<PyAny> = match extra {
        Extra::None => py.None(),
        Extra::Items(items) => Py::new(
            py,
            ItemSink {
                items,
                bridge: bridge.clone(),
            },
        )?
        .into_any(),
        Extra::Task(task) => Py::new(
            py,
            TaskContext {
                task,
                sender,
                bridge: bridge.clone(),
                over,
            },
        )?
        .into_any(),
    };
    let coro = invoke.call1(py, (args, Py::new(py, ctx)?, extra, done))?;
    let task = bridge.spawn_task(py, coro)?;
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(task.unbind());
    Ok(())
}

/// Runs the Python handler `invoke` on the loop and waits for its outcome.
pub(crate) async fn run(
    bridge: Bridge,
    invoke: Arc<Py<PyAny>>,
    args: RawValue,
    extra: Extra,
    Sender(sender): Sender,
    meta: Meta,
) -> Outcome {
    // Read in the handler's own future (the runtime scopes the inbound
    // context to it): the loop runs the handler elsewhere.
    let trace = capwire::trace::current();
    // Decoded here, off the loop: Python sees only args the chokepoint let
    // through and that are well-formed CBOR.
    let args = value::decode(&args).map_err(|e| HandlerError::new(ErrorCode::BadArgs, e))?;
    let (tx, rx) = oneshot::channel();
    let ctx = Context {
        sender: sender.to_string(),
        req_id: meta.req_id.as_str().to_owned(),
        deadline: meta.deadline,
        trace,
    };
    let slot: Arc<Slot> = Arc::new(Mutex::new(None));
    let over = CancellationToken::new();
    let call = Call {
        invoke,
        args,
        ctx,
        extra,
        over: over.clone(),
    };
    let on_loop = (bridge.clone(), Arc::clone(&slot));
    bridge.push(Box::new(move |py| {
        let (bridge, slot) = on_loop;
        let done = match Py::new(
            py,
            Completion {
                tx: Mutex::new(Some(tx)),
            },
        ) {
            Ok(done) => done,
            Err(e) => return log_error(py, &format!("a handler could not be started: {e}")),
        };
        if let Err(e) = start(py, &bridge, call, done.clone_ref(py), &slot) {
            log_error(py, &format!("a handler could not be started: {e}"));
            done.get()
                .send(Err(internal("the handler could not be started")));
        }
    }));
    let mut running = Running {
        bridge,
        slot: Some(slot),
        over,
    };
    let outcome = rx.await;
    running.slot = None;
    outcome.unwrap_or_else(|_| Err(internal("the handler ended without an answer")))
}
