//! Python handlers behind capwire's raw verbs.
//!
//! The runtime calls a handler on one of its threads after the chokepoint
//! allowed the envelope; the args are decoded there, without the GIL. The
//! handler's coroutine is then started as a task on the node's asyncio
//! loop (`capwire._runtime.start`), and the loop hands its outcome back
//! through a [`Completion`]. When the runtime drops the handler's future
//! (a cancel from the caller, the deadline, the session's end, shutdown),
//! the asyncio task is cancelled.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire::envelope::{ErrorCode, RawValue};
use capwire::{HandlerError, Items, Meta, Sender, Task};
use pyo3::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::errors;
use crate::value::{self, Cbor};

/// What every handler of a node shares: the loop its coroutines run on
/// and the function that starts them there.
pub(crate) struct Bridge {
    pub(crate) event_loop: Py<PyAny>,
    pub(crate) start: Py<PyAny>,
}

/// How a handler's coroutine ended.
type Outcome = Result<RawValue, HandlerError>;

fn internal(message: impl Into<String>) -> HandlerError {
    HandlerError::new(ErrorCode::Internal, message)
}

/// Hands a handler's outcome from the loop back to the runtime: called by
/// the loop with the finished asyncio task.
#[pyclass(frozen)]
pub(crate) struct Completion {
    tx: Mutex<Option<oneshot::Sender<Outcome>>>,
}

#[pymethods]
impl Completion {
    fn __call__(&self, task: &Bound<'_, PyAny>) {
        let outcome = finished(task);
        let tx = self.tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(tx) = tx {
            let _ = tx.send(outcome);
        }
    }
}

/// The outcome of a finished asyncio task.
fn finished(task: &Bound<'_, PyAny>) -> Outcome {
    let cancelled = task
        .call_method0("cancelled")
        .and_then(|c| c.is_truthy())
        .unwrap_or(false);
    if cancelled {
        return Err(HandlerError::new(ErrorCode::Cancelled, "the handler was cancelled"));
    }
    match task.call_method0("exception") {
        Ok(exc) if exc.is_none() => {}
        Ok(exc) => return Err(raised(&exc)),
        Err(_) => return Err(internal("the handler failed")),
    }
    let result = task
        .call_method0("result")
        .map_err(|_| internal("the handler failed"))?;
    value::encode(&result).map_err(|e| {
        tracing_log(task.py(), &format!("a handler's result could not be sent: {e}"));
        internal("the handler's result could not be encoded")
    })
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
pub(crate) fn tracing_log(py: Python<'_>, message: &str) {
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

    /// Seconds left of the caller's deadline.
    fn time_left(&self) -> f64 {
        self.deadline.saturating_duration_since(Instant::now()).as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!("Context(sender={:?}, req_id={:?})", self.sender, self.req_id)
    }
}

/// Where a stream handler's items go: `await items.send(value)` waits for
/// the caller's credit.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct ItemSink {
    items: Arc<tokio::sync::Mutex<Option<Items<RawValue>>>>,
}

#[pymethods]
impl ItemSink {
    fn send<'py>(&self, py: Python<'py>, item: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let raw = value::encode(item)?;
        let items = Arc::clone(&self.items);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
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
    fn progress<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let raw = value::encode(value)?;
        let task = Arc::clone(&self.task);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            task.progress(&raw).await.map_err(errors::task)
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
        let task = Arc::clone(&self.task);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let answer: ciborium::Value = task.ask(&raw, within).await.map_err(errors::task)?;
            Ok(Cbor(answer))
        })
    }
}

/// A started handler's asyncio task: cancelled if the runtime lets go of
/// the handler before it ended.
struct Running {
    call: Option<Py<PyAny>>,
}

impl Running {
    fn finished(&mut self) {
        self.call = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            Python::attach(|py| {
                // A closed loop has nothing left to cancel.
                let _ = call.call_method0(py, "cancel");
            });
        }
    }
}

/// What a handler of each kind gets besides its args and context.
pub(crate) enum Extra {
    None,
    Items(Arc<tokio::sync::Mutex<Option<Items<RawValue>>>>),
    Task(Arc<Task>),
}

/// Runs the Python handler `invoke` on the loop and waits for its outcome.
pub(crate) async fn run(
    bridge: Arc<Bridge>,
    invoke: Arc<Py<PyAny>>,
    args: RawValue,
    extra: Extra,
    Sender(sender): Sender,
    meta: Meta,
) -> Outcome {
    // Decoded here, off the loop: Python sees only args the chokepoint let
    // through and that are well-formed CBOR.
    let args = value::decode(&args).map_err(|e| HandlerError::new(ErrorCode::BadArgs, e))?;
    let (tx, rx) = oneshot::channel();
    let started = Python::attach(|py| -> PyResult<Py<PyAny>> {
        let args = value::to_py(py, &args, 0)?;
        let sender = sender.to_string();
        let ctx = Py::new(
            py,
            Context {
                sender: sender.clone(),
                req_id: meta.req_id.as_str().to_owned(),
                deadline: meta.deadline,
            },
        )?;
        let extra: Py<PyAny> = match &extra {
            Extra::None => py.None(),
            Extra::Items(items) => Py::new(py, ItemSink { items: Arc::clone(items) })?.into_any(),
            Extra::Task(task) => Py::new(
                py,
                TaskContext {
                    task: Arc::clone(task),
                    sender,
                },
            )?
            .into_any(),
        };
        let done = Py::new(py, Completion { tx: Mutex::new(Some(tx)) })?;
        bridge
            .start
            .call1(py, (bridge.event_loop.clone_ref(py), invoke.clone_ref(py), args, ctx, extra, done))
    });
    let call = match started {
        Ok(call) => call,
        Err(e) => {
            Python::attach(|py| tracing_log(py, &format!("a handler could not be started: {e}")));
            return Err(internal("the handler could not be started"));
        }
    };
    let mut running = Running { call: Some(call) };
    let outcome = rx.await;
    running.finished();
    outcome.unwrap_or_else(|_| Err(internal("the handler's loop is gone")))
}
