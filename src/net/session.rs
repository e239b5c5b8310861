//! The shared handle of one live session: the session core behind its own
//! lock, the driver's waker, and what callers wait on.
//!
//! Callers (requests, notifications, handlers that finished elsewhere)
//! lock the core for a few hundred nanoseconds, queue what they have, and
//! wake the driver: one hand-off. The driver is the only one that touches
//! the stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use capwire_envelope::{CloseCode, NodeId, ReqId};
use capwire_manifest::Manifest;
use futures_util::task::AtomicWaker;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::dispatch::job::Finished;
use crate::error::CallError;
use crate::proto::session::{Refused, Reply, SessionCore, Ticket};

/// What a call waits on.
pub(crate) type Waiter = oneshot::Sender<Reply>;

/// Which side dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// The peer dialled us.
    Inbound,
    /// We dialled the peer.
    Outbound,
}

/// One session, shared by its driver, the peer table and callers.
pub(crate) struct Session {
    id: u64,
    remote: NodeId,
    direction: Direction,
    core: Mutex<SessionCore<Waiter>>,
    driver: AtomicWaker,
    /// Set when something was queued since the driver last looked.
    dirty: AtomicBool,
    /// Callers waiting for room in the send queue.
    room: Notify,
    /// Cancelled when the session has ended.
    ended: CancellationToken,
    /// Parent of the tokens of the peer's jobs running here.
    handlers: CancellationToken,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("remote", &self.remote)
            .field("direction", &self.direction)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(
        id: u64,
        direction: Direction,
        core: SessionCore<Waiter>,
        handlers: CancellationToken,
    ) -> Self {
        Self {
            id,
            remote: core.remote(),
            direction,
            core: Mutex::new(core),
            driver: AtomicWaker::new(),
            dirty: AtomicBool::new(false),
            room: Notify::new(),
            ended: CancellationToken::new(),
            handlers,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn remote(&self) -> NodeId {
        self.remote
    }

    pub(crate) fn direction(&self) -> Direction {
        self.direction
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SessionCore<Waiter>> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn handlers(&self) -> &CancellationToken {
        &self.handlers
    }

    pub(crate) fn driver_waker(&self) -> &AtomicWaker {
        &self.driver
    }

    /// Tells the driver there is something to do.
    pub(crate) fn wake(&self) {
        self.dirty.store(true, Ordering::Release);
        self.driver.wake();
    }

    /// Whether something was queued since the last call (and clears it).
    pub(crate) fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// Wakes callers waiting for room.
    pub(crate) fn room_freed(&self) {
        self.room.notify_waiters();
    }

    /// Marks the session ended (the driver does this once).
    pub(crate) fn mark_ended(&self) {
        self.handlers.cancel();
        self.ended.cancel();
        self.room.notify_waiters();
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Resolves when the session has ended.
    pub(crate) async fn ended(&self) {
        self.ended.cancelled().await;
    }

    /// The peer's manifest as last received.
    pub(crate) fn manifest(&self) -> Option<Arc<Manifest>> {
        self.lock().peer_manifest().cloned()
    }

    /// Calls waiting for answers.
    pub(crate) fn pending_calls(&self) -> usize {
        self.lock().pending_calls()
    }

    /// Queues a request frame and returns what its answer arrives on,
    /// waiting for room in the send queue until `deadline`.
    ///
    /// # Errors
    /// `Overloaded` (too many calls waiting), `TooLarge`, `PeerLost` (the
    /// session is closing or gone), `Timeout` (no room before `deadline`).
    pub(crate) async fn call(
        &self,
        req_id: ReqId,
        frame: Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<oneshot::Receiver<Reply>, CallError> {
        let (tx, rx) = oneshot::channel();
        let mut waiter = tx;
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut core = self.lock();
                match core.call(req_id.clone(), frame.clone(), waiter) {
                    Ok(()) => {
                        drop(core);
                        self.wake();
                        return Ok(rx);
                    }
                    Err(Refused::Full(w)) => waiter = w,
                    Err(Refused::TooManyCalls) => return Err(CallError::Overloaded),
                    Err(Refused::TooLarge) => return Err(CallError::TooLarge),
                    Err(Refused::Closed) => return Err(CallError::PeerLost),
                }
            }
            // The driver is writing; wait for it to make room.
            self.wake();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(CallError::Timeout);
            }
        }
    }

    /// Queues a notification frame, waiting for room until `deadline`.
    ///
    /// # Errors
    /// As [`call`](Self::call), without `Overloaded`.
    pub(crate) async fn notify(
        &self,
        frame: Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<(), CallError> {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut core = self.lock();
                match core.notify(frame.clone()) {
                    Ok(()) => {
                        drop(core);
                        self.wake();
                        return Ok(());
                    }
                    Err(Refused::Full(())) => {}
                    Err(Refused::TooManyCalls) => return Err(CallError::Overloaded),
                    Err(Refused::TooLarge) => return Err(CallError::TooLarge),
                    Err(Refused::Closed) => return Err(CallError::PeerLost),
                }
            }
            self.wake();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(CallError::Timeout);
            }
        }
    }

    /// Gives up on a call: a cancel goes to the peer.
    pub(crate) fn abandon(&self, req_id: &ReqId) {
        let had = self.lock().abandon(req_id).is_some();
        if had {
            self.wake();
        }
    }

    /// Sends our newest manifest.
    pub(crate) fn announce(&self, hello: Bytes) {
        self.lock().announce(hello);
        self.wake();
    }

    /// Closes the session with `code`, after what is queued.
    pub(crate) fn close(&self, code: CloseCode, reason: &str) {
        self.lock().close(code, reason, false);
        self.wake();
    }

    /// A job that ran on its own task has ended.
    pub(crate) fn finish(&self, ticket: Ticket, finished: Finished) {
        let now = tokio::time::Instant::now().into_std();
        self.lock().finish(ticket, finished, now);
        self.wake();
    }

    /// The time, as the session core sees it.
    pub(crate) fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }
}
