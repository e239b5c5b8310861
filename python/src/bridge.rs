//! The bridge between the Rust runtime's threads and an asyncio loop.
//!
//! The runtime's threads never take the GIL: a handler to start, a
//! handler to cancel and an awaited Rust future's outcome are queued here,
//! and the loop is woken through a socket it watches (`add_reader`) to run
//! them on its own thread, where the GIL is already held. (Taking the GIL
//! from a runtime thread makes and tears down a Python thread state each
//! time: several times the cost of the call itself.) One bridge serves
//! every node on a loop (`capwire._runtime.bridge`).

use std::collections::VecDeque;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::BoundObject;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::Fail;

/// Work for the loop's thread, with the GIL.
pub(crate) type OnLoop = Box<dyn FnOnce(Python<'_>) + Send>;

struct Shared {
    event_loop: Py<PyAny>,
    jobs: Mutex<VecDeque<OnLoop>>,
    /// A wake-up byte is on its way (or the loop is draining).
    armed: AtomicBool,
    wake: UnixStream,
    woken: UnixStream,
}

/// A loop's bridge (one per loop; see the module docs).
#[pyclass(frozen, from_py_object, module = "capwire._capwire")]
#[derive(Clone)]
pub(crate) struct Bridge {
    shared: Arc<Shared>,
}

#[pymethods]
impl Bridge {
    #[new]
    fn py_new(event_loop: Py<PyAny>) -> PyResult<Self> {
        let (wake, woken) = UnixStream::pair()
            .map_err(|e| PyRuntimeError::new_err(format!("no wake-up socket: {e}")))?;
        for s in [&wake, &woken] {
            s.set_nonblocking(true)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        }
        Ok(Self {
            shared: Arc::new(Shared {
                event_loop,
                jobs: Mutex::new(VecDeque::new()),
                armed: AtomicBool::new(false),
                wake,
                woken,
            }),
        })
    }

    /// The socket the loop watches.
    fn fileno(&self) -> i32 {
        self.shared.woken.as_raw_fd()
    }

    /// Runs what was queued (the loop calls this when the socket is
    /// readable).
    fn drain(&self, py: Python<'_>) {
        let s = &self.shared;
        // Disarmed before the queue is taken: a job queued after this
        // point wakes the loop again.
        s.armed.store(false, Ordering::SeqCst);
        let mut sink = [0u8; 64];
        while matches!((&s.woken).read(&mut sink), Ok(n) if n > 0) {}
        loop {
            let batch = std::mem::take(&mut *s.jobs.lock().unwrap_or_else(PoisonError::into_inner));
            if batch.is_empty() {
                return;
            }
            for job in batch {
                job(py);
            }
        }
    }
}

impl Bridge {
    /// Queues `job` for the loop's thread.
    pub(crate) fn push(&self, job: OnLoop) {
        let s = &self.shared;
        s.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(job);
        if !s.armed.swap(true, Ordering::SeqCst) {
            // A full socket already holds a wake-up.
            let _ = (&s.wake).write(&[1]);
        }
    }

    pub(crate) fn event_loop<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.shared.event_loop.bind(py)
    }

    /// Runs `fut` on the runtime; an asyncio future of its outcome.
    /// Cancelling that future drops `fut` (a call in it sends its cancel).
    pub(crate) fn spawn<'py, F, T>(&self, py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Result<T, Fail>> + Send + 'static,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let future = self.event_loop(py).call_method0("create_future")?;
        let target = future.clone().unbind();
        let bridge = self.clone();
        let task = pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
            let out = fut.await;
            bridge.push(Box::new(move |py| resolve(py, target.bind(py), out)));
        });
        future.call_method1(
            "add_done_callback",
            (Canceller {
                abort: task.abort_handle(),
            },),
        )?;
        Ok(future)
    }
}

/// Sets `future`'s outcome, unless it was cancelled meanwhile.
fn resolve<T>(py: Python<'_>, future: &Bound<'_, PyAny>, out: Result<T, Fail>)
where
    T: for<'a> IntoPyObject<'a>,
{
    if future
        .call_method0("done")
        .and_then(|d| d.is_truthy())
        .unwrap_or(true)
    {
        return;
    }
    let set = match out.map_err(|f| f.into_pyerr(py)).and_then(|v| {
        v.into_pyobject(py)
            .map(|b| b.into_any().into_bound())
            .map_err(Into::into)
    }) {
        Ok(value) => future.call_method1("set_result", (value,)),
        Err(e) => future.call_method1("set_exception", (e.into_value(py),)),
    };
    if let Err(e) = set {
        e.write_unraisable(py, Some(future));
    }
}

/// Drops the Rust future of a cancelled asyncio future.
#[pyclass(frozen, module = "capwire._capwire")]
struct Canceller {
    abort: tokio::task::AbortHandle,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, future: &Bound<'_, PyAny>) {
        if future
            .call_method0("cancelled")
            .and_then(|c| c.is_truthy())
            .unwrap_or(false)
        {
            self.abort.abort();
        }
    }
}
