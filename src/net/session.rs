//! The shared handle of one live session: the session core and the
//! sending half of the record layer behind one lock, the stream, the
//! driver's waker, and what callers wait on.
//!
//! Callers (requests, notifications, handlers that finished on their own
//! task) lock for a few hundred nanoseconds and queue what they have.
//! Then either the writer is idle and the stream can be written from any
//! task, and a request goes straight to the socket from the caller's task
//! (no hand-off), or they wake the driver (one hand-off).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_envelope::{CloseCode, NodeId, ReqId};
use capwire_manifest::Manifest;
use capwire_transport::{CloseCode as TransportClose, RecordEncoder, TransportError};
use futures_util::task::AtomicWaker;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::dispatch::Job;
use crate::dispatch::items::StreamOut;
use crate::dispatch::job::Finished;
use crate::error::CallError;
use crate::net::io::Writer;
use crate::net::streams::{StreamEnd, StreamSink};
use crate::proto::codec::Hellos;
use crate::proto::session::{End, ItemRefused, Refused, Reply, SessionCore, Ticket};
use crate::proto::streams::Window;

/// What waits for the answer to one of our calls: a request's caller, or
/// the end of one of our streams.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// A request.
    Call(oneshot::Sender<Reply>),
    /// A stream.
    Stream(StreamEnd),
}

impl Waiter {
    /// Hands over the answer (a caller that gave up is not there).
    pub(crate) fn send(self, reply: Reply) {
        match self {
            Waiter::Call(tx) => {
                let _ = tx.send(reply);
            }
            Waiter::Stream(end) => end.answer(reply),
        }
    }
}

/// The session core as the runtime uses it.
pub(crate) type Core = SessionCore<Waiter, Job, Arc<StreamSink>>;

/// Sealed bytes packed in one go, at most.
pub(crate) const PACK_BUDGET: usize = 256 * 1024;
/// A caller writes directly only when the previous direct write is at
/// least this old; closer together, frames are left to the driver, which
/// packs them into one write.
const DIRECT_SPACING: Duration = Duration::from_micros(20);

/// Queued bytes past which a notification lets other tasks (the writer)
/// run before it returns.
const YIELD_BACKLOG: usize = 64 * 1024;

use crate::net::counters::Direction;

/// The sending half of the record layer.
pub(crate) struct Tx {
    pub(crate) enc: RecordEncoder,
    /// Someone holds sealed bytes and is writing them (the driver, or a
    /// caller writing directly): nobody else seals until they are done,
    /// so the stream sees messages in nonce order.
    pub(crate) busy: bool,
    /// Bytes a caller could not finish writing; the driver takes them over.
    pub(crate) handoff: Option<(Vec<u8>, usize)>,
    /// The transport's close record is sealed.
    pub(crate) transport_closed: bool,
    /// The record layer refused to seal (it cannot be used any more).
    pub(crate) failed: bool,
    /// When bytes last reached the stream.
    pub(crate) last_write: Instant,
    last_direct: Option<Instant>,
}

/// What the lock guards.
pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) tx: Tx,
}

fn transport_code(code: CloseCode) -> TransportClose {
    match code {
        CloseCode::Shutdown => TransportClose::Shutdown,
        _ => TransportClose::Normal,
    }
}

impl Shared {
    /// Seals what the core has queued (about `budget` bytes at most), and
    /// the transport close after our close frame.
    ///
    /// # Errors
    /// The record layer's; it is unusable afterwards.
    pub(crate) fn pack(&mut self, budget: usize) -> Result<usize, TransportError> {
        if self.tx.failed {
            return Err(TransportError::Closed);
        }
        let enc = &mut self.tx.enc;
        let result = self
            .core
            .transmit(budget, |r| enc.push_record(r))
            .and_then(|n| {
                if n > 0 {
                    enc.flush()?;
                }
                Ok(n)
            });
        let n = match result {
            Ok(n) => n,
            Err(e) => {
                self.tx.failed = true;
                return Err(e);
            }
        };
        if self.core.close_sent() && !self.tx.transport_closed {
            let (code, reason) = match self.core.end_reason() {
                Some(End::Local(code, reason)) => (transport_code(*code), reason.clone()),
                _ => (TransportClose::Normal, String::new()),
            };
            self.tx.transport_closed = true;
            if let Err(e) = self.tx.enc.close(code, &reason) {
                self.tx.failed = true;
                return Err(e);
            }
        }
        Ok(n)
    }

    /// Packs and takes the sealed bytes, for whoever will write them, if
    /// nobody else is writing.
    pub(crate) fn take_for_writing(&mut self) -> Result<Option<Vec<u8>>, TransportError> {
        if self.tx.busy {
            return Ok(None);
        }
        self.pack(PACK_BUDGET)?;
        let wire = self.tx.enc.take_wire();
        if wire.is_some() {
            self.tx.busy = true;
        }
        Ok(wire)
    }

    /// Whoever was writing is done with `buf`.
    pub(crate) fn done_writing(&mut self, buf: Vec<u8>, now: Instant) {
        self.tx.busy = false;
        self.tx.last_write = now;
        self.tx.enc.reuse_buffer(buf);
    }
}

/// One session, shared by its driver, the peer table and callers.
pub(crate) struct Session {
    id: u64,
    remote: NodeId,
    direction: Direction,
    state: Mutex<Shared>,
    writer: Arc<dyn Writer>,
    direct: bool,
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
        core: Core,
        enc: RecordEncoder,
        writer: Arc<dyn Writer>,
        handlers: CancellationToken,
    ) -> Self {
        let direct = writer.try_write(&[]).is_some();
        Self {
            id,
            remote: core.remote(),
            direction,
            state: Mutex::new(Shared {
                core,
                tx: Tx {
                    enc,
                    busy: false,
                    handoff: None,
                    transport_closed: false,
                    failed: false,
                    last_write: Self::now(),
                    last_direct: None,
                },
            }),
            writer,
            direct,
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

    pub(crate) fn writer(&self) -> &Arc<dyn Writer> {
        &self.writer
    }

    /// The session's state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, Shared> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session core, locked (with the rest of the state).
    pub(crate) fn lock(&self) -> CoreGuard<'_> {
        CoreGuard(self.state())
    }

    pub(crate) fn handlers(&self) -> &CancellationToken {
        &self.handlers
    }

    pub(crate) fn driver_waker(&self) -> &AtomicWaker {
        &self.driver
    }

    /// Tells the driver there is something to do (once until it looks:
    /// a burst of frames costs one wake-up).
    pub(crate) fn wake(&self) {
        if !self.dirty.swap(true, Ordering::AcqRel) {
            self.driver.wake();
        }
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

    /// After queueing: write straight to the stream if the writer is idle
    /// and `direct` allows, else hand over to the driver.
    fn send_now(&self, mut state: MutexGuard<'_, Shared>, direct: bool) {
        let now = Self::now();
        // Only a lone frame goes straight out: with other calls waiting
        // for answers (pipelining) the driver packs frames into one write.
        let may = direct
            && self.direct
            && !state.tx.busy
            && state.tx.handoff.is_none()
            && state.core.queue_len() == 1
            && state.core.pending_calls() <= 1
            && state
                .tx
                .last_direct
                .is_none_or(|t| now.saturating_duration_since(t) >= DIRECT_SPACING);
        if !may {
            drop(state);
            self.wake();
            return;
        }
        let buf = match state.take_for_writing() {
            Ok(Some(buf)) => buf,
            Ok(None) | Err(_) => {
                drop(state);
                self.wake();
                return;
            }
        };
        state.tx.last_direct = Some(now);
        let more = state.core.has_events();
        drop(state);
        let written = match self.writer.try_write(&buf) {
            Some(Ok(n)) => n,
            _ => 0,
        };
        let mut state = self.state();
        if written == buf.len() {
            state.done_writing(buf, now);
            let more = more || state.core.has_transmit() || state.core.has_events();
            drop(state);
            if more {
                self.wake();
            }
        } else {
            // The driver finishes it (and meets any error itself).
            state.tx.handoff = Some((buf, written));
            drop(state);
            self.wake();
        }
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
        let mut parts = (req_id, frame, Waiter::Call(tx));
        loop {
            let refused = {
                let mut state = self.state();
                match state.core.call(parts.0, parts.1, parts.2) {
                    Ok(()) => {
                        self.send_now(state, true);
                        return Ok(rx);
                    }
                    Err(r) => r,
                }
            };
            match refused {
                Refused::Full(back) => parts = back,
                other => return Err(refused_error(other)),
            }
            self.wait_for_room(parts.1.len(), deadline).await?;
        }
    }

    /// Opens one of our streams: queues its control frame and its first
    /// grant (`window`), waiting for room in the send queue until
    /// `deadline`; its items and its end come on the returned sink.
    ///
    /// # Errors
    /// As [`call`](Self::call); `Unsupported` when the peer speaks
    /// protocol 1 only.
    pub(crate) async fn open_stream(
        &self,
        req_id: ReqId,
        frame: Bytes,
        window: Window,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<StreamSink>, CallError> {
        let sink = Arc::new(StreamSink::default());
        let end = Waiter::Stream(StreamEnd::new(sink.clone()));
        let mut parts = (req_id, frame, end, sink.clone());
        loop {
            let refused = {
                let mut state = self.state();
                match state
                    .core
                    .open_stream(parts.0, parts.1, parts.2, parts.3, window)
                {
                    Ok(()) => {
                        drop(state);
                        self.wake();
                        return Ok(sink);
                    }
                    Err(r) => r,
                }
            };
            match refused {
                Refused::Full(back) => parts = back,
                // Not opened: its end, dropped with the refusal, is never
                // told to anyone.
                other => return Err(refused_error(other)),
            }
            self.wait_for_room(parts.1.len(), deadline).await?;
        }
    }

    /// Our application took `items` items of `bytes` bytes of our stream
    /// `req_id`; a grant, if one is due, goes to the driver.
    pub(crate) fn taken(&self, req_id: &ReqId, items: u64, bytes: u64) {
        let due = self.state().core.taken(req_id, items, bytes);
        if due {
            self.wake();
        }
    }

    /// Gives up on one of our streams: it is forgotten, and the peer is
    /// told (a cancel).
    pub(crate) fn abandon_stream(&self, req_id: &ReqId) {
        self.abandon(req_id);
    }

    /// Waits until the send queue may have room for `len` bytes (or the
    /// session ends).
    async fn wait_for_room(
        &self,
        len: usize,
        deadline: tokio::time::Instant,
    ) -> Result<(), CallError> {
        let notified = self.room.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let state = self.state();
            if state.core.room_for(len) {
                return Ok(());
            }
        }
        // The driver is writing; it makes room.
        self.wake();
        tokio::time::timeout_at(deadline, notified)
            .await
            .map_err(|_| CallError::Timeout)
    }

    /// Queues a notification frame, waiting for room until `deadline`.
    /// Notifications are always left to the driver, which packs many into
    /// one write.
    ///
    /// # Errors
    /// As [`call`](Self::call), without `Overloaded`.
    pub(crate) async fn notify(
        &self,
        frame: Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<(), CallError> {
        self.notify_if(frame, deadline, || true).await.map(drop)
    }

    /// As [`notify`](Self::notify), but the frame is queued only if
    /// `still()` holds at the moment it goes into the queue (checked under
    /// the session's lock, after any wait for room): `Ok(false)` when it
    /// did not, and nothing was queued.
    ///
    /// # Errors
    /// As [`notify`](Self::notify).
    pub(crate) async fn notify_if(
        &self,
        mut frame: Bytes,
        deadline: tokio::time::Instant,
        still: impl Fn() -> bool,
    ) -> Result<bool, CallError> {
        loop {
            let queued = {
                let mut state = self.state();
                if !still() {
                    return Ok(false);
                }
                state
                    .core
                    .notify(frame)
                    .map(|()| state.core.queued_bytes() >= YIELD_BACKLOG)
            };
            let refused = match queued {
                Ok(backlog) => {
                    self.wake();
                    if backlog {
                        // A caller sending notifications in a loop never
                        // waits; with a backlog, it lets the writer run.
                        tokio::task::yield_now().await;
                    }
                    return Ok(true);
                }
                Err(r) => r,
            };
            match refused {
                Refused::Full(back) => frame = back,
                Refused::TooManyCalls | Refused::InUse => return Err(CallError::Overloaded),
                other => return Err(refused_error(other)),
            }
            self.wait_for_room(frame.len(), deadline).await?;
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
    pub(crate) fn announce(&self, hello: Hellos) {
        self.lock().announce(hello);
        self.wake();
    }

    /// Closes the session with `code`, after what is queued.
    pub(crate) fn close(&self, code: CloseCode, reason: &str) {
        self.lock().close(code, reason, false);
        self.wake();
    }

    /// A job that ran on its own task has ended: its answer goes straight
    /// to the stream when the writer is idle.
    pub(crate) fn finish(&self, ticket: Ticket, finished: Finished) {
        let now = Self::now();
        let mut state = self.state();
        let request = ticket.is_request();
        state.core.finish(ticket, &finished.result, now);
        if request {
            self.send_now(state, true);
        } else {
            drop(state);
            self.wake();
        }
    }

    /// The time, as the session core sees it.
    pub(crate) fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// The session core, locked.
pub(crate) struct CoreGuard<'a>(MutexGuard<'a, Shared>);

impl std::ops::Deref for CoreGuard<'_> {
    type Target = Core;
    fn deref(&self) -> &Self::Target {
        &self.0.core
    }
}

impl std::ops::DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0.core
    }
}

/// The error a refused call is reported as.
fn refused_error<T>(refused: Refused<T>) -> CallError {
    match refused {
        Refused::Full(_) | Refused::Closed => CallError::PeerLost,
        Refused::TooManyCalls => CallError::Overloaded,
        Refused::TooLarge => CallError::TooLarge,
        Refused::InUse => CallError::ReqIdInUse,
        Refused::Unsupported => {
            CallError::Unsupported("the peer speaks protocol 1, which has no streams".to_owned())
        }
    }
}

/// The items of the streams the peer opened go out on its session.
impl StreamOut for Session {
    fn send_item(
        &self,
        req_id: &ReqId,
        frame: &Bytes,
        len: usize,
        holds: &dyn Fn() -> bool,
    ) -> Result<bool, ItemRefused> {
        let mut state = self.state();
        if !holds() {
            return Err(ItemRefused::Unauthorized);
        }
        state.core.send_item(req_id, frame.clone(), len)?;
        let backlog = state.core.queued_bytes() >= YIELD_BACKLOG;
        drop(state);
        self.wake();
        Ok(backlog)
    }

    fn room(
        &self,
        len: usize,
        deadline: tokio::time::Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(async move { self.wait_for_room(len, deadline).await.is_ok() })
    }
}
