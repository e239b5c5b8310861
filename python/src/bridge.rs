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
    /// Makes a task of a handler's coroutine on the loop (eagerly started
    /// where asyncio can: Python 3.12 and newer).
    spawn_task: Py<PyAny>,
    /// Not bounded here, and need not be: each job is one handler start
    /// or cancel (at most one of each per call the runtime admitted,
    /// within its in-flight bounds) or one outcome of a future the
    /// program itself is awaiting.
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
    fn py_new(event_loop: Py<PyAny>, spawn_task: Py<PyAny>) -> PyResult<Self> {
        let (wake, woken) = UnixStream::pair()
            .map_err(|e| PyRuntimeError::new_err(format!("no wake-up socket: {e}")))?;
        for s in [&wake, &woken] {
            s.set_nonblocking(true)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        }
        Ok(Self {
            shared: Arc::new(Shared {
                event_loop,
                spawn_task,
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
    /// readable). One batch per call: what the batch queues wakes the loop
    /// again, so its other callbacks get their turn in between.
    fn drain(&self, py: Python<'_>) {
        let s = &self.shared;
        // The wake-ups are read first, then the bridge is disarmed, then
        // the queue is taken: a job queued after the disarm writes a
        // wake-up nobody has read yet, and one queued before it is in this
        // batch. (Disarmed before the read, a wake-up written in between
        // would be read here while the bridge stays armed: no job would
        // wake the loop again.)
        let mut sink = [0u8; 64];
        while matches!((&s.woken).read(&mut sink), Ok(n) if n > 0) {}
        s.armed.store(false, Ordering::SeqCst);
        let batch = std::mem::take(&mut *s.jobs.lock().unwrap_or_else(PoisonError::into_inner));
        for job in batch {
            job(py);
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

    /// A task of `coro` on the loop (on its thread).
    pub(crate) fn spawn_task<'py>(
        &self,
        py: Python<'py>,
        coro: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.shared.spawn_task.bind(py).call1((coro,))
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

impl Bridge {
    /// Runs `fut` on the loop's thread itself, polled there whenever it is
    /// woken (with the GIL released and the runtime entered); an asyncio
    /// future of its outcome. For calls: their answer then needs one hop
    /// to the loop, not two (to a runtime task, then to the loop).
    /// Cancelling the asyncio future drops `fut` (a call in it sends its
    /// cancel). Not for futures that block while polled (a store's I/O):
    /// [`Bridge::spawn`] those.
    pub(crate) fn run_here<'py, F, T>(&self, py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Result<T, Fail>> + Send + 'static,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let future = self.event_loop(py).call_method0("create_future")?;
        let target = future.clone().unbind();
        let fut: LocalFuture = Box::pin(async move {
            let out = fut.await;
            let job: OnLoop = Box::new(move |py| resolve(py, target.bind(py), out));
            job
        });
        let task = Arc::new(LocalTask {
            fut: Mutex::new(Some(fut)),
            bridge: self.clone(),
            queued: AtomicBool::new(true),
        });
        future.call_method1(
            "add_done_callback",
            (LocalCanceller {
                task: Arc::clone(&task),
            },),
        )?;
        task.poll(py);
        Ok(future)
    }
}

type LocalFuture = std::pin::Pin<Box<dyn Future<Output = OnLoop> + Send>>;

/// A future the loop's thread polls (see [`Bridge::run_here`]).
struct LocalTask {
    fut: Mutex<Option<LocalFuture>>,
    bridge: Bridge,
    /// A poll is queued on the loop (or running).
    queued: AtomicBool,
}

impl LocalTask {
    fn poll(self: &Arc<Self>, py: Python<'_>) {
        self.queued.store(false, Ordering::SeqCst);
        let waker = std::task::Waker::from(Arc::clone(self));
        let ready = py.detach(|| {
            let _runtime = pyo3_async_runtimes::tokio::get_runtime().enter();
            let mut slot = self.fut.lock().unwrap_or_else(PoisonError::into_inner);
            let fut = slot.as_mut()?;
            match fut
                .as_mut()
                .poll(&mut std::task::Context::from_waker(&waker))
            {
                std::task::Poll::Ready(done) => {
                    *slot = None;
                    Some(done)
                }
                std::task::Poll::Pending => None,
            }
        });
        if let Some(done) = ready {
            done(py);
        }
    }
}

impl std::task::Wake for LocalTask {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::SeqCst) {
            let task = Arc::clone(self);
            self.bridge.push(Box::new(move |py| task.poll(py)));
        }
    }
}

/// Drops the Rust future of a cancelled asyncio future (on the loop's
/// thread, where it runs).
#[pyclass(frozen, module = "capwire._capwire")]
struct LocalCanceller {
    task: Arc<LocalTask>,
}

#[pymethods]
impl LocalCanceller {
    fn __call__(&self, py: Python<'_>, future: &Bound<'_, PyAny>) {
        if future
            .call_method0("cancelled")
            .and_then(|c| c.is_truthy())
            .unwrap_or(false)
        {
            let fut = self
                .task
                .fut
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            py.detach(|| {
                let _runtime = pyo3_async_runtimes::tokio::get_runtime().enter();
                drop(fut);
            });
        }
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
