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

/// The runtimes the server end and the client end of a bench run on.
pub(crate) struct Placement {
    pub(crate) name: &'static str,
    pub(crate) server: Handle,
    pub(crate) client: Handle,
    hosts: Option<Hosts>,
}

impl Placement {
    /// Both ends on one 2-worker runtime (`current`: on one
    /// current-thread runtime instead).
    pub(crate) fn shared(current: bool) -> Self {
        if current {
            let t = RtThread::start("bench-shared");
            let h = t.handle.clone();
            return Self {
                name: "shared",
                server: h.clone(),
                client: h,
                hosts: Some(Hosts::Threads(vec![t])),
            };
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let h = rt.handle().clone();
        Self {
            name: "shared",
            server: h.clone(),
            client: h,
            hosts: Some(Hosts::Workers(rt)),
        }
    }

    /// Each end on a current-thread runtime of its own OS thread, as two
    /// processes would be.
    pub(crate) fn split() -> Self {
        let server = RtThread::start("bench-server");
        let client = RtThread::start("bench-client");
        Self {
            name: "split",
            server: server.handle.clone(),
            client: client.handle.clone(),
            hosts: Some(Hosts::Threads(vec![client, server])),
        }
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        match self.hosts.take() {
            Some(Hosts::Workers(rt)) => rt.shutdown_timeout(std::time::Duration::from_secs(1)),
            Some(Hosts::Threads(threads)) => drop(threads),
            None => {}
        }
    }
}
