//! Where a benchmark's ends run, shared by the benches: a current-thread
//! runtime on an OS thread of its own, and a way to run work on a runtime
//! from the thread that measures.
#![allow(dead_code)]

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A current-thread runtime driven by an OS thread of its own until dropped.
pub(crate) struct RtThread {
    pub(crate) handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RtThread {
    pub(crate) fn start(name: &str) -> Self {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                handle_tx.send(rt.handle().clone()).unwrap();
                rt.block_on(async {
                    let _ = stopped.await;
                });
            })
            .unwrap();
        Self {
            handle: handle_rx.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for RtThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a placement's handles run on.
pub(crate) enum Hosts {
    Workers(tokio::runtime::Runtime),
    Threads(Vec<RtThread>),
}

/// Runs `f` as a task on `h` and waits for it: the work runs on the
/// runtime's own threads, never on the thread that waits.
pub(crate) fn run_on<F>(h: &Handle, f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    h.block_on(h.spawn(f)).expect("benchmark task failed")
}
