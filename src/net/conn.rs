//! One task per connection: it owns the stream (both directions), the
//! record layer and, through its [`Session`], the session core.
//!
//! ```text
//!            ┌──────────────────────── driver task ────────────────────────┐
//!  socket ──►│ read ─► open/reassemble ─► core.handle_record ─► admit      │
//!            │                                   │ Run: first poll inline  │──► handler task
//!            │                                   │      (spawned if it     │    (only if it waits;
//!            │                                   ▼       waits)            │     finish() wakes us)
//!  socket ◄──│ write ◄─ seal/pack ◄─ core.transmit ◄─ queue ◄─ callers ────│◄── request / notify
//!            └─────────────────────────────────────────────────────────────┘     (lock, push, wake)
//! ```
//!
//! Each pass reads what the socket has, handles every record, runs the
//! jobs that finish at once, packs everything queued into as few Noise
//! messages as fit and writes them: a frame produced on the driver (a
//! response from a handler that did not wait) reaches the socket with no
//! hand-off, one produced elsewhere with one (a wake).
//!
//! Timers: the peer's hello, our keepalive, the idle timeout, the write
//! deadline (a peer that does not read), and the close deadline.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use capwire_envelope::CloseCode;
use capwire_transport::{
    CloseCode as TransportClose, RecordDecoder, RecordEncoder, TransportError,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

use crate::dispatch::Dispatcher;
use crate::dispatch::job::{self, Finished, Started};
use crate::net::session::{Session, Waiter};
use crate::proto::session::{End, Event};

/// Unwritten wire bytes beyond which the driver packs no more records.
const HIGH_WATER: usize = 256 * 1024;
/// A fresh read buffer, for a quiet session.
const READ_SMALL: usize = 4 * 1024;
/// A read buffer for a busy one: a whole Noise message with its prefix.
const READ_LARGE: usize = 66 * 1024;
/// The driver makes room when less than this is free before a read.
const READ_LOW_WATER: usize = 1024;
/// Passes of the driver loop before it yields to other tasks.
const PASSES: usize = 32;
/// A quiet session returns its buffers after this long.
const RELEASE_AFTER: Duration = Duration::from_secs(2);
/// After its close, how long a side keeps reading (and discarding).
const LINGER: Duration = Duration::from_secs(1);

/// Timers of a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) keepalive: Duration,
    pub(crate) idle: Duration,
    /// A peer that takes none of our bytes for this long is dropped.
    pub(crate) write_timeout: Duration,
    /// From the decision to close to the stream being dropped, at most.
    pub(crate) close_timeout: Duration,
}

/// What the peer table does when a session opens or ends.
pub(crate) trait SessionHooks: Send + Sync + 'static {
    /// The peer's hello arrived: install `session`. Returns the session
    /// that serves the peer from now on (this one, or an older one that
    /// the tie-break keeps, in which case this one is closed `replaced`).
    fn opened(&self, session: &Arc<Session>) -> Arc<Session>;
    /// The peer announced a newer manifest.
    fn manifest_changed(&self, session: &Arc<Session>);
    /// The session has ended.
    fn ended(&self, session: &Arc<Session>);
}

/// What every driver of a node shares.
pub(crate) struct ConnEnv {
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) tracker: TaskTracker,
    pub(crate) hooks: Arc<dyn SessionHooks>,
    pub(crate) timing: Timing,
    /// Cancelled when the node shuts down: every session, open or not
    /// yet, closes with `shutdown`.
    pub(crate) close_all: CancellationToken,
}

/// Why an outbound session did not open.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The handshake failed.
    Handshake(TransportError),
    /// The session ended before the peer's hello was accepted.
    Ended(End),
}

/// How the driver tells the dialler that the session opened (or not).
pub(crate) type OpenedTx = oneshot::Sender<Result<Arc<Session>, Failure>>;

/// The parts of a connection whose handshake has finished.
pub(crate) struct Parts<S> {
    pub(crate) stream: S,
    pub(crate) encoder: RecordEncoder,
    pub(crate) decoder: RecordDecoder,
    pub(crate) leftover: BytesMut,
}

/// Drives one connection until it ends. `guard` (a session-budget slot)
/// is held until then.
pub(crate) async fn drive<S, G>(
    env: Arc<ConnEnv>,
    session: Arc<Session>,
    parts: Parts<S>,
    opened: Option<OpenedTx>,
    guard: G,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    G: Send + 'static,
{
    let now = Instant::now();
    let close_signal = Box::pin(env.close_all.clone().cancelled_owned());
    let mut d = Driver {
        close_signal,
        close_requested: false,
        env,
        session,
        stream: parts.stream,
        enc: parts.encoder,
        dec: parts.decoder,
        rbuf: parts.leftover,
        records: Vec::new(),
        events: Vec::new(),
        finished: Vec::new(),
        written: 0,
        jobs: HashMap::new(),
        timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        timer_at: None,
        last_rx: now,
        last_tx: now,
        stalled_since: None,
        closing_since: None,
        linger_until: None,
        read_done: false,
        transport_closed: false,
        shutdown_done: false,
        wants_read: true,
        need_flush: false,
        pending_leftover: true,
        failed: false,
        opened,
    };
    poll_fn(|cx| d.poll_drive(cx)).await;
    d.finish();
    drop(guard);
}

struct Driver<S> {
    close_signal: Pin<Box<WaitForCancellationFutureOwned>>,
    close_requested: bool,
    env: Arc<ConnEnv>,
    session: Arc<Session>,
    stream: S,
    enc: RecordEncoder,
    dec: RecordDecoder,
    rbuf: BytesMut,
    records: Vec<Bytes>,
    events: Vec<Event<Waiter>>,
    finished: Vec<(crate::proto::session::Ticket, Option<Finished>)>,
    /// Bytes of `enc.wire()` already written.
    written: usize,
    /// Tokens of request jobs running on their own tasks.
    jobs: HashMap<u64, CancellationToken>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<tokio::time::Instant>,
    last_rx: Instant,
    last_tx: Instant,
    stalled_since: Option<Instant>,
    closing_since: Option<Instant>,
    linger_until: Option<Instant>,
    read_done: bool,
    transport_closed: bool,
    shutdown_done: bool,
    wants_read: bool,
    need_flush: bool,
    pending_leftover: bool,
    failed: bool,
    opened: Option<OpenedTx>,
}

fn transport_code(code: CloseCode) -> TransportClose {
    match code {
        CloseCode::Shutdown => TransportClose::Shutdown,
        _ => TransportClose::Normal,
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Driver<S> {
    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.session.driver_waker().register(cx.waker());
        if !self.close_requested && self.close_signal.as_mut().poll(cx).is_ready() {
            self.close_requested = true;
            self.session
                .lock()
                .close(CloseCode::Shutdown, "the node is shutting down", false);
        }
        for _ in 0..PASSES {
            let now = tokio::time::Instant::now().into_std();
            let mut progress = self.session.take_dirty();
            progress |= self.read(cx, now);
            progress |= self.handle_records(now);
            progress |= self.handle_events(cx, now);
            self.timers(now);
            progress |= self.write(cx, now);
            if self.done(now) {
                return Poll::Ready(());
            }
            if !progress {
                self.arm_timer(cx, now);
                return Poll::Pending;
            }
        }
        // Enough for one turn: let other tasks run, then carry on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    // ---------------------------------------------------------------
    // Reading

    fn read(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if self.pending_leftover {
            // Bytes that came with the last handshake message.
            self.pending_leftover = false;
            if !self.rbuf.is_empty() {
                self.decode(now);
                return true;
            }
        }
        // Records still waiting are handled before anything more is read.
        if self.read_done || !self.wants_read || !self.records.is_empty() {
            return false;
        }
        self.make_room();
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.rbuf) {
            Poll::Pending => false,
            Poll::Ready(Ok(0)) => {
                self.read_done = true;
                let lost = !self.session.lock().is_closing();
                if lost {
                    self.lose(TransportError::PeerLost.to_string());
                }
                true
            }
            Poll::Ready(Ok(_)) => {
                self.decode(now);
                true
            }
            Poll::Ready(Err(e)) => {
                self.read_done = true;
                self.lose(format!("read failed: {e}"));
                true
            }
        }
    }

    fn decode(&mut self, now: Instant) {
        match self.dec.decode(&mut self.rbuf, &mut self.records) {
            Ok(d) => {
                if d.messages > 0 {
                    self.last_rx = now;
                }
                if let Some(close) = d.close {
                    // The peer's transport close: after its records.
                    self.read_done = true;
                    let records = std::mem::take(&mut self.records);
                    self.handle_batch(records, now);
                    let mut core = self.session.lock();
                    if !core.is_ended() {
                        let code = match close.code {
                            TransportClose::Shutdown => CloseCode::Shutdown,
                            _ => CloseCode::Normal,
                        };
                        let waiters = core.end(End::Peer(code, close.reason));
                        drop(core);
                        drop(waiters);
                    }
                }
            }
            Err(e) => {
                self.read_done = true;
                let records = std::mem::take(&mut self.records);
                self.handle_batch(records, now);
                let code = match e {
                    TransportError::PeerMisbehaved(
                        capwire_transport::Violation::RecordTooLarge,
                    ) => CloseCode::TooLarge,
                    _ => CloseCode::ProtocolError,
                };
                self.session.lock().close(code, &e.to_string(), true);
            }
        }
    }

    fn make_room(&mut self) {
        let spare = self.rbuf.capacity() - self.rbuf.len();
        if spare >= READ_LOW_WATER {
            return;
        }
        if self.rbuf.capacity() > 0 && self.rbuf.try_reclaim(READ_LOW_WATER) {
            return;
        }
        // A buffer that filled up asks for a large one next.
        let size = if self.rbuf.capacity() >= READ_SMALL {
            READ_LARGE
        } else {
            READ_SMALL
        };
        let mut fresh = BytesMut::with_capacity(size.max(self.rbuf.len() + READ_LOW_WATER));
        fresh.extend_from_slice(&self.rbuf);
        self.rbuf = fresh;
    }

    fn handle_records(&mut self, now: Instant) -> bool {
        if self.records.is_empty() {
            return false;
        }
        let records = std::mem::take(&mut self.records);
        self.handle_batch(records, now) > 0
    }

    /// Handles records in order while the core wants more; the rest wait
    /// (in order) until it does again, so a peer that does not read what
    /// it asked for gets no more answers queued than the bounds allow.
    fn handle_batch(&mut self, mut records: Vec<Bytes>, now: Instant) -> usize {
        if records.is_empty() {
            self.records = records;
            return 0;
        }
        let dispatcher = &*self.env.dispatcher;
        let mut core = self.session.lock();
        let mut handled = 0;
        for record in &records {
            if !core.wants_read() {
                break;
            }
            core.handle_record(now, record.clone(), dispatcher);
            handled += 1;
        }
        while let Some(e) = core.poll_event() {
            self.events.push(e);
        }
        self.wants_read = core.wants_read();
        drop(core);
        records.drain(..handled);
        // What is left goes first next time; the vector's allocation is kept.
        records.append(&mut self.records);
        self.records = records;
        handled
    }

    // ---------------------------------------------------------------
    // Events: jobs, answers, cancels

    fn handle_events(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let mut any = false;
        loop {
            if self.events.is_empty() {
                break;
            }
            any = true;
            let closing = self.session.lock().is_closing();
            for event in std::mem::take(&mut self.events) {
                match event {
                    Event::Opened => self.opened(),
                    Event::ManifestChanged => self.env.hooks.manifest_changed(&self.session),
                    Event::Reply(waiter, reply) => {
                        let _ = waiter.send(reply);
                    }
                    Event::Cancel(id) => {
                        if let Some(token) = self.jobs.get(&id) {
                            token.cancel();
                        }
                    }
                    Event::Finished(id) => {
                        self.jobs.remove(&id);
                    }
                    Event::Run(ticket, job) => {
                        if closing {
                            self.finished.push((ticket, None));
                            continue;
                        }
                        let started = job::start(
                            &self.env.dispatcher,
                            &job,
                            self.session.remote(),
                            self.session.handlers(),
                            now,
                            cx,
                        );
                        match started {
                            Started::Done(f) => {
                                self.count(&job, &f);
                                self.finished.push((ticket, Some(f)));
                            }
                            Started::Waiting { future, token } => {
                                if ticket.is_request() {
                                    self.jobs.insert(ticket.id, token);
                                }
                                let session = self.session.clone();
                                let dispatcher = self.env.dispatcher.clone();
                                self.env.tracker.spawn(async move {
                                    let f = future.await;
                                    dispatcher.metrics().count(job.route(), f.outcome);
                                    if let Err(e) = &f.result
                                        && !job.is_request()
                                    {
                                        tracing::debug!(code = %e.code, message = %e.message,
                                            "notification failed");
                                    }
                                    session.finish(ticket, f);
                                });
                            }
                        }
                    }
                }
            }
            if !self.finished.is_empty() {
                let mut core = self.session.lock();
                for (ticket, f) in self.finished.drain(..) {
                    match f {
                        Some(f) => core.finish(ticket, f, now),
                        None => core.discard(ticket),
                    }
                }
                while let Some(e) = core.poll_event() {
                    self.events.push(e);
                }
            }
        }
        any
    }

    fn count(&self, job: &crate::dispatch::Job, f: &Finished) {
        self.env.dispatcher.metrics().count(job.route(), f.outcome);
        if let Err(e) = &f.result
            && !job.is_request()
        {
            tracing::debug!(code = %e.code, message = %e.message, "notification failed");
        }
    }

    fn opened(&mut self) {
        let winner = self.env.hooks.opened(&self.session);
        if !Arc::ptr_eq(&winner, &self.session) {
            self.session.lock().close(
                CloseCode::Replaced,
                "another session with this peer replaces this one",
                false,
            );
        }
        if let Some(tx) = self.opened.take() {
            let _ = tx.send(Ok(winner));
        }
    }

    // ---------------------------------------------------------------
    // Timers

    fn timers(&mut self, now: Instant) {
        let timing = self.env.timing;
        let mut core = self.session.lock();
        if core.poll_timeout().is_some_and(|t| now >= t) {
            core.handle_timeout(now);
        }
        if !core.is_closing() && now.saturating_duration_since(self.last_rx) >= timing.idle {
            core.close(
                CloseCode::IdleTimeout,
                "nothing arrived within the idle timeout",
                true,
            );
        }
        if core.is_closing() && self.closing_since.is_none() {
            self.closing_since = Some(now);
        }
        drop(core);
        if self.enc.wire().len() == self.written
            && !self.transport_closed
            && now.saturating_duration_since(self.last_tx) >= timing.keepalive
            && self.enc.keepalive().is_ok()
        {
            // Queued for the write below.
        }
        if self
            .stalled_since
            .is_some_and(|t| now.saturating_duration_since(t) >= timing.write_timeout)
        {
            self.stalled_since = None;
            self.failed = true;
            self.lose("the peer took none of our bytes within the write deadline".into());
        }
        if self.rbuf.is_empty()
            && self.rbuf.capacity() > 0
            && now.saturating_duration_since(self.last_rx) >= RELEASE_AFTER
        {
            self.rbuf = BytesMut::new();
        }
    }

    fn arm_timer(&mut self, cx: &mut Context<'_>, now: Instant) {
        let timing = self.env.timing;
        let mut next = self.last_rx + timing.idle;
        if !self.transport_closed {
            next = next.min(self.last_tx + timing.keepalive);
        }
        if let Some(t) = self.session.lock().poll_timeout() {
            next = next.min(t);
        }
        if let Some(t) = self.stalled_since {
            next = next.min(t + timing.write_timeout);
        }
        if let Some(t) = self.closing_since {
            next = next.min(t + timing.close_timeout);
        }
        if let Some(t) = self.linger_until {
            next = next.min(t);
        }
        if self.rbuf.capacity() > 0 && self.rbuf.is_empty() {
            next = next.min(self.last_rx + RELEASE_AFTER);
        }
        let next = tokio::time::Instant::from_std(next.max(now));
        if self.timer_at != Some(next) {
            self.timer.as_mut().reset(next);
            self.timer_at = Some(next);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            // Already due: come back at once.
            self.timer_at = None;
            cx.waker().wake_by_ref();
        }
    }

    // ---------------------------------------------------------------
    // Writing

    fn write(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let mut progress = false;
        if !self.transport_closed && !self.failed {
            let unwritten = self.enc.wire().len() - self.written;
            if unwritten < HIGH_WATER {
                let enc = &mut self.enc;
                let mut core = self.session.lock();
                let sent = core.transmit(HIGH_WATER - unwritten, |r| enc.push_record(r));
                let close = core.close_sent().then(|| match core.end_reason() {
                    Some(End::Local(code, reason)) => (transport_code(*code), reason.clone()),
                    _ => (TransportClose::Normal, String::new()),
                });
                self.wants_read = core.wants_read();
                let room = core.has_room();
                while let Some(e) = core.poll_event() {
                    self.events.push(e);
                }
                drop(core);
                match sent {
                    Ok(n) if n > 0 => {
                        progress = true;
                        if room {
                            self.session.room_freed();
                        }
                        if self.enc.flush().is_err() {
                            self.failed = true;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => self.failed = true,
                }
                if let Some((code, reason)) = close
                    && !self.failed
                {
                    let _ = self.enc.close(code, &reason);
                    self.transport_closed = true;
                    progress = true;
                }
                if self.failed {
                    self.lose("the record layer refused a record".into());
                }
            }
        }
        while self.written < self.enc.wire().len() && !self.failed {
            let wire = &self.enc.wire()[self.written..];
            match Pin::new(&mut self.stream).poll_write(cx, wire) {
                Poll::Ready(Ok(0)) => {
                    self.failed = true;
                    self.lose("the stream accepts no more bytes".into());
                }
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    self.last_tx = now;
                    self.stalled_since = None;
                    progress = true;
                }
                Poll::Ready(Err(e)) => {
                    self.failed = true;
                    self.lose(format!("write failed: {e}"));
                }
                Poll::Pending => {
                    self.stalled_since.get_or_insert(now);
                    break;
                }
            }
        }
        if self.written > 0 && self.written == self.enc.wire().len() {
            self.enc.consume_wire();
            self.written = 0;
            self.need_flush = true;
        }
        if self.need_flush && !self.failed {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.need_flush = false,
                Poll::Ready(Err(e)) => {
                    self.failed = true;
                    self.lose(format!("flush failed: {e}"));
                }
                Poll::Pending => {}
            }
        }
        if self.transport_closed
            && !self.shutdown_done
            && !self.failed
            && self.enc.wire().is_empty()
            && !self.need_flush
        {
            match Pin::new(&mut self.stream).poll_shutdown(cx) {
                Poll::Ready(_) => {
                    self.shutdown_done = true;
                    self.linger_until = Some(now + LINGER);
                    progress = true;
                }
                Poll::Pending => {}
            }
        }
        progress
    }

    // ---------------------------------------------------------------
    // Ending

    /// The stream is gone: the session ends with `why`.
    fn lose(&mut self, why: String) {
        let mut core = self.session.lock();
        if !core.is_ended() {
            let waiters = core.end(End::Lost(why));
            drop(core);
            drop(waiters);
        }
    }

    fn done(&mut self, now: Instant) -> bool {
        let core = self.session.lock();
        if core.is_ended() {
            return true;
        }
        drop(core);
        if self.failed {
            return true;
        }
        if let Some(t) = self.closing_since
            && now.saturating_duration_since(t) >= self.env.timing.close_timeout
        {
            return true;
        }
        if self.shutdown_done {
            // Our side is closed; the peer's end of the stream, or the
            // linger deadline, ends the session.
            return self.read_done || self.linger_until.is_some_and(|t| now >= t);
        }
        false
    }

    fn finish(&mut self) {
        let waiters = {
            let mut core = self.session.lock();
            let why = match core.end_reason() {
                Some(e) => e.clone(),
                None => End::Lost("the connection ended".into()),
            };
            let waiters: Vec<Waiter> = core.end(why);
            while let Some(e) = core.poll_event() {
                self.events.push(e);
            }
            waiters
        };
        // Callers waiting for answers see the end (peer lost).
        drop(waiters);
        for event in std::mem::take(&mut self.events) {
            match event {
                Event::Run(ticket, _) => self.session.lock().discard(ticket),
                Event::Reply(waiter, reply) => {
                    let _ = waiter.send(reply);
                }
                _ => {}
            }
        }
        self.session.mark_ended();
        self.env.hooks.ended(&self.session);
        if let Some(tx) = self.opened.take() {
            let why = self
                .session
                .lock()
                .end_reason()
                .cloned()
                .unwrap_or(End::Lost("the connection ended".into()));
            let _ = tx.send(Err(Failure::Ended(why)));
        }
    }
}
