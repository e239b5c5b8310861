//! One task per connection: its driver reads the stream, opens and
//! reassembles records, feeds them to the session core, runs the jobs
//! that finish at once, and writes what is queued.
//!
//! ```text
//!            ┌──────────────────────── driver task ────────────────────────┐
//!  socket ──►│ read ─► open/reassemble ─► core.handle_record ─► admit      │
//!            │                                   │ Run: first poll inline  │──► handler task
//!            │                                   │      (spawned if it     │    (only if it waits;
//!            │                                   ▼       waits)            │     its answer is
//!  socket ◄──│ write ◄─ seal/pack ◄─ core.transmit ◄─ queue ◄─ callers ────│◄── written directly
//!            └───────────────────────────────▲─────────────────────────────┘     or handed over)
//!                                            └── request from a caller's task, writer idle:
//!                                                sealed and written right there (no hand-off)
//! ```
//!
//! A frame produced on the driver (a response from a handler that did not
//! wait) goes out in the same pass with no hand-off; one produced on
//! another task is written from that task when the writer is idle, and
//! otherwise handed to the driver with one wake-up.
//!
//! Timers: the peer's hello, our keepalive, the idle timeout, the write
//! deadline (a peer that does not read), and the close deadline.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use capwire_envelope::{CloseCode, NodeId};
use capwire_transport::{CloseCode as TransportClose, RecordDecoder, TransportError};
use tokio::sync::{Notify, oneshot};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

use crate::dispatch::extract::Channel;
use crate::dispatch::items::Served;
use crate::dispatch::job::{self, Finished, Started};
use crate::dispatch::{Dispatcher, Job};
use crate::net::counters::{HandshakeFailure, NetCounters, OpenSession};
use crate::net::io::{Reader, Writer};
use crate::net::session::{Session, Waiter};
use crate::net::streams::StreamSink;
use crate::proto::session::{End, Event, Ticket};

/// A fresh read buffer, for a quiet session.
const READ_SMALL: usize = 2 * 1024;
/// A read buffer for a busy one: a whole Noise message with its prefix.
const READ_LARGE: usize = 66 * 1024;
/// The driver makes room when less than this is free before a read.
const READ_LOW_WATER: usize = 1024;
/// Records handled before the answers they produced are written.
const CHUNK: usize = 24;
/// Reads in one pass, at most.
const READS_PER_PASS: usize = 16;
/// Passes of the driver loop before it yields to other tasks.
const PASSES: usize = 16;
/// A quiet session returns its buffers after this long.
const RELEASE_AFTER: Duration = Duration::from_secs(2);
/// Read buffers above `READ_SMALL` and output buffers above `WRITE_KEEP`
/// (grown for a hello or a busy moment) go back after this long without
/// traffic in their direction: memory follows what the session carries,
/// without reallocating on every pass of a busy one.
const SHRINK_AFTER: Duration = Duration::from_millis(50);
/// The output buffer a session keeps until it is quiet.
const WRITE_KEEP: usize = 2 * 1024;
/// After its close, how long a side keeps reading (and discarding).
const LINGER: Duration = Duration::from_secs(1);

/// How long after the last write the output buffer is given back, if
/// it holds one that can be (nothing in it, nobody writing it).
fn out_release_after(enc: &capwire_transport::RecordEncoder, busy: bool) -> Option<Duration> {
    if busy || enc.buffered() > 0 || enc.buffer_capacity() == 0 {
        return None;
    }
    Some(if enc.buffer_capacity() > WRITE_KEEP {
        SHRINK_AFTER
    } else {
        RELEASE_AFTER
    })
}

/// Timers of a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) keepalive: Duration,
    pub(crate) idle: Duration,
    /// A peer that takes none of our bytes for this long is dropped.
    pub(crate) write_timeout: Duration,
    /// From the decision to close to the stream being dropped, at most.
    pub(crate) close_timeout: Duration,
    /// The longest a handler serving a stream waits for credit.
    pub(crate) stream_idle: Duration,
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
    /// Sessions open, and connections that never opened.
    pub(crate) stats: Arc<NetCounters>,
    /// The node's stream counters.
    pub(crate) streams: Arc<crate::dispatch::items::StreamCounters>,
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

/// Drives one connection until it ends. `guard` (a session-budget slot)
/// is held until then.
pub(crate) async fn drive<G: Send + 'static>(
    env: Arc<ConnEnv>,
    session: Arc<Session>,
    reader: Box<dyn Reader>,
    decoder: RecordDecoder,
    leftover: BytesMut,
    opened: Option<OpenedTx>,
    guard: G,
) {
    let now = Session::now();
    let close_signal = Box::pin(env.close_all.clone().cancelled_owned());
    let mut d = Driver {
        close_signal,
        close_requested: false,
        env,
        session,
        reader,
        dec: decoder,
        rbuf: leftover,
        read_full: false,
        rbuf_alloc: usize::MAX,
        records: Vec::new(),
        events: Vec::new(),
        finished: Vec::new(),
        out: None,
        jobs: HashMap::new(),
        credits: HashMap::new(),
        timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        timer_at: None,
        last_rx: now,
        stalled_since: None,
        closing_since: None,
        linger_until: None,
        read_done: false,
        shutdown_done: false,
        wants_read: true,
        read_paused: false,
        pending_leftover: true,
        failed: false,
        opened,
        open: None,
    };
    poll_fn(|cx| d.poll_drive(cx)).await;
    d.finish();
    drop(guard);
}

struct Driver {
    close_signal: Pin<Box<WaitForCancellationFutureOwned>>,
    close_requested: bool,
    env: Arc<ConnEnv>,
    session: Arc<Session>,
    reader: Box<dyn Reader>,
    dec: RecordDecoder,
    rbuf: BytesMut,
    /// The last read filled the buffer.
    read_full: bool,
    /// The size the read buffer was allocated with (its `capacity()`
    /// shrinks as records are split off it); the handshake's buffer counts
    /// as large.
    rbuf_alloc: usize,
    records: Vec<Bytes>,
    events: Vec<Event<Waiter, Job, Arc<StreamSink>>>,
    finished: Vec<(Ticket, Option<Finished>)>,
    /// Sealed bytes the driver is writing, and how many are written.
    out: Option<(Vec<u8>, usize)>,
    /// Tokens of request jobs running on their own tasks.
    jobs: HashMap<u64, CancellationToken>,
    /// What wakes each job serving a stream when the peer grants credit.
    credits: HashMap<u64, Arc<Notify>>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<tokio::time::Instant>,
    last_rx: Instant,
    stalled_since: Option<Instant>,
    closing_since: Option<Instant>,
    linger_until: Option<Instant>,
    read_done: bool,
    shutdown_done: bool,
    wants_read: bool,
    /// Reading stopped because the core was over a bound.
    read_paused: bool,
    pending_leftover: bool,
    failed: bool,
    opened: Option<OpenedTx>,
    /// The session's place in the open-sessions gauge, once it opened.
    open: Option<OpenSession>,
}

impl Driver {
    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.session.driver_waker().register(cx.waker());
        if !self.close_requested && self.close_signal.as_mut().poll(cx).is_ready() {
            self.close_requested = true;
            self.session
                .lock()
                .close(CloseCode::Shutdown, "the node is shutting down", false);
        }
        let now = Session::now();
        for _ in 0..PASSES {
            self.session.take_dirty();
            let mut again = self.read(cx, now);
            self.handle_events(cx, now);
            self.timers(now);
            again |= self.write(cx, now);
            if !self.events.is_empty() {
                // Writing freed slots: notifications waiting for one start.
                self.handle_events(cx, now);
                again |= self.write(cx, now);
            }
            if self.done(now) {
                return Poll::Ready(());
            }
            // Reading stopped at a bound that writing has lifted.
            again |= self.wants_read
                && !self.read_done
                && (self.read_paused || !self.records.is_empty());
            // Someone queued something while this pass ran: go again.
            again |= self.session.take_dirty();
            if !again {
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

    /// Reads until the stream has nothing more for now (so its readiness
    /// is armed again), handling each batch of records as it arrives;
    /// `true` when it stopped early and should be called again.
    fn read(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if self.pending_leftover {
            // Bytes that came with the last handshake message.
            self.pending_leftover = false;
            if !self.rbuf.is_empty() {
                self.decode(now);
            }
        }
        for _ in 0..READS_PER_PASS {
            if !self.records.is_empty() {
                self.handle_records(now);
                self.handle_events(cx, now);
                if !self.records.is_empty() {
                    // A chunk is done: its answers go out before the next
                    // one (so the peer can start on them); or a bound was
                    // reached, and the rest wait.
                    return self.wants_read;
                }
            }
            if self.read_done {
                return false;
            }
            if !self.wants_read {
                self.read_paused = true;
                return false;
            }
            self.read_paused = false;
            self.make_room();
            match self.reader.poll_read(cx, &mut self.rbuf) {
                Poll::Pending => return false,
                Poll::Ready(Ok(0)) => {
                    self.read_done = true;
                    let lost = !self.session.lock().is_closing();
                    if lost {
                        self.lose(TransportError::PeerLost.to_string());
                    }
                    return false;
                }
                Poll::Ready(Ok(_)) => {
                    self.read_full = self.rbuf.len() == self.rbuf.capacity();
                    self.decode(now);
                    // The decoder grows the buffer for a message that
                    // does not fit.
                    self.rbuf_alloc = self.rbuf_alloc.max(self.rbuf.capacity());
                }
                Poll::Ready(Err(e)) => {
                    self.read_done = true;
                    self.lose(format!("read failed: {e}"));
                    return false;
                }
            }
        }
        true
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
        // A read that filled a small buffer asks for a large one at once
        // (reclaiming the small one would read a busy stream in small
        // pieces).
        let filled = self.read_full && self.rbuf.capacity() < READ_LARGE;
        if !filled && self.rbuf.capacity() > 0 && self.rbuf.try_reclaim(READ_LOW_WATER) {
            return;
        }
        // A buffer that filled up asks for a large one next.
        let size = if filled || self.rbuf.capacity() >= READ_SMALL {
            READ_LARGE
        } else {
            READ_SMALL
        };
        let size = size.max(self.rbuf.len() + READ_LOW_WATER);
        self.rbuf_alloc = size;
        let mut fresh = BytesMut::with_capacity(size);
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
            // After a chunk with requests in it, their answers go out first.
            if !core.wants_read() || (handled >= CHUNK && core.running_requests() > 0) {
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

    fn handle_events(&mut self, cx: &mut Context<'_>, now: Instant) {
        loop {
            if self.events.is_empty() {
                let mut core = self.session.lock();
                if !core.has_events() {
                    return;
                }
                while let Some(e) = core.poll_event() {
                    self.events.push(e);
                }
            }
            let (closing, channel) = {
                let core = self.session.lock();
                let channel = Channel {
                    reply_room: core.max_frame(),
                    version: core.version(),
                };
                (core.is_closing(), channel)
            };
            let mut events = std::mem::take(&mut self.events);
            for event in events.drain(..) {
                match event {
                    Event::Opened => self.opened(),
                    Event::ManifestChanged => self.env.hooks.manifest_changed(&self.session),
                    Event::Reply(waiter, reply) => waiter.send(reply),
                    // Dropped: the caller sees the peer lost.
                    Event::Lost(waiter) => drop(waiter),
                    Event::Item(sink, item) => {
                        self.env
                            .streams
                            .items_received
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        sink.push(item);
                    }
                    Event::Credit(id) => {
                        if let Some(credit) = self.credits.get(&id) {
                            credit.notify_one();
                        }
                    }
                    Event::Cancel(id) => {
                        if let Some(token) = self.jobs.get(&id) {
                            token.cancel();
                        }
                    }
                    Event::Finished(id) => {
                        self.jobs.remove(&id);
                        self.credits.remove(&id);
                    }
                    Event::Run(ticket, job) => {
                        // A request can no longer be answered; a
                        // notification that arrived before the close (in
                        // the same read, say) still runs: it was sent, and
                        // is never answered anyway.
                        if closing && ticket.is_request() {
                            self.finished.push((ticket, None));
                            continue;
                        }
                        let stream = ticket.is_stream().then(|| {
                            let credit = Arc::new(Notify::new());
                            self.credits.insert(ticket.id, credit.clone());
                            Served {
                                out: self.session.clone(),
                                req_id: ticket.req_id().clone(),
                                credit,
                                idle: self.env.timing.stream_idle,
                                counters: self.env.streams.clone(),
                                authority: None,
                            }
                        });
                        let started = job::start(
                            &self.env.dispatcher,
                            &job,
                            self.session.remote(),
                            self.session.handlers(),
                            now,
                            channel,
                            stream,
                            cx,
                        );
                        match started {
                            Started::Done(f) => {
                                count(&self.env.dispatcher, &job, &f, &self.session.remote());
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
                                    count(&dispatcher, &job, &f, &session.remote());
                                    // The answer leaves only after its entry.
                                    dispatcher.audit().flush();
                                    session.finish(ticket, f);
                                });
                            }
                        }
                    }
                }
            }
            // Keep the vector's allocation.
            events.append(&mut self.events);
            self.events = events;
            if !self.finished.is_empty() {
                let mut core = self.session.lock();
                for (ticket, f) in self.finished.drain(..) {
                    match f {
                        Some(f) => core.finish(ticket, &f.result, now),
                        None => core.discard(ticket),
                    }
                }
                while let Some(e) = core.poll_event() {
                    self.events.push(e);
                }
            }
        }
    }

    fn opened(&mut self) {
        if self.open.is_none() {
            self.open = Some(self.env.stats.opened(self.session.direction()));
        }
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
        if self
            .timer_at
            .is_some_and(|t| tokio::time::Instant::from_std(now) < t)
        {
            // Nothing is due before the armed timer.
            return;
        }
        let mut state = self.session.state();
        if state.core.poll_timeout().is_some_and(|t| now >= t) {
            state.core.handle_timeout(now);
        }
        if !state.core.is_closing() && now.saturating_duration_since(self.last_rx) >= timing.idle {
            state.core.close(
                CloseCode::IdleTimeout,
                "nothing arrived within the idle timeout",
                true,
            );
        }
        if state.core.is_closing() && self.closing_since.is_none() {
            self.closing_since = Some(now);
        }
        if !state.tx.busy
            && !state.tx.transport_closed
            && !state.tx.failed
            && now.saturating_duration_since(state.tx.last_write) >= timing.keepalive
            && state.tx.enc.keepalive().is_err()
        {
            state.tx.failed = true;
        }
        if let Some(after) = out_release_after(&state.tx.enc, state.tx.busy)
            && now.saturating_duration_since(state.tx.last_write) >= after
        {
            state.tx.enc.release_buffer();
        }
        drop(state);
        if self
            .stalled_since
            .is_some_and(|t| now.saturating_duration_since(t) >= timing.write_timeout)
        {
            self.stalled_since = None;
            self.failed = true;
            self.lose("the peer took none of our bytes within the write deadline".into());
        }
        let since_read = now.saturating_duration_since(self.last_rx);
        if let Some(after) = self.read_release_after()
            && since_read >= after
        {
            // A large read buffer goes soon, a small one once quiet.
            self.rbuf = BytesMut::new();
            self.rbuf_alloc = 0;
        }
        if since_read >= RELEASE_AFTER {
            // Quiet: give back what a busy moment grew. (Not a reason to
            // wake: a quiet session wakes for the read buffer or its
            // keepalive, and gives these back then.)
            if self.records.is_empty() && self.records.capacity() > 0 {
                self.records = Vec::new();
            }
            if self.events.is_empty() && self.events.capacity() > 0 {
                self.events = Vec::new();
            }
            if self.finished.is_empty() && self.finished.capacity() > 0 {
                self.finished = Vec::new();
            }
            if self.jobs.is_empty() && self.jobs.capacity() > 0 {
                self.jobs = HashMap::new();
            }
            if self.credits.is_empty() && self.credits.capacity() > 0 {
                self.credits = HashMap::new();
            }
        }
    }

    /// How long after the last read the read buffer is given back, if it
    /// holds one that can be (empty): one grown past `READ_SMALL` soon,
    /// a small one once the session is quiet.
    fn read_release_after(&self) -> Option<Duration> {
        if !self.rbuf.is_empty() || self.rbuf.capacity() == 0 {
            return None;
        }
        Some(if self.rbuf_alloc > READ_SMALL {
            SHRINK_AFTER
        } else {
            RELEASE_AFTER
        })
    }

    fn arm_timer(&mut self, cx: &mut Context<'_>, now: Instant) {
        let timing = self.env.timing;
        let (last_write, core_timeout, transport_closed, closing, out_release) = {
            let state = self.session.state();
            (
                state.tx.last_write,
                state.core.poll_timeout(),
                state.tx.transport_closed,
                state.core.is_closing(),
                out_release_after(&state.tx.enc, state.tx.busy),
            )
        };
        // Once closing, the idle deadline has done its work (it may be what
        // closed the session); kept, it would lie in the past and fire on
        // every pass until the close timeout.
        let mut next = if closing {
            now + timing.close_timeout.max(timing.idle)
        } else {
            self.last_rx + timing.idle
        };
        if !transport_closed && self.out.is_none() {
            next = next.min(last_write + timing.keepalive);
        }
        if let Some(t) = core_timeout {
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
        // Only for buffers `timers` can give back, so that the timer is
        // never armed in the past for one it cannot.
        if let Some(after) = self.read_release_after() {
            next = next.min(self.last_rx + after);
        }
        if let Some(after) = out_release {
            next = next.min(last_write + after);
        }
        let next = tokio::time::Instant::from_std(next.max(now));
        // The timer is only moved earlier; a deadline that moved later is
        // checked again when the timer fires.
        if self
            .timer_at
            .is_none_or(|t| next < t || t <= tokio::time::Instant::from_std(now))
        {
            self.timer.as_mut().reset(next);
            self.timer_at = Some(next);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            cx.waker().wake_by_ref();
        }
    }

    // ---------------------------------------------------------------
    // Writing

    /// Writes what is queued; `true` when there may be more to write now.
    fn write(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let io = self.session.writer().clone();
        loop {
            if self.failed {
                return false;
            }
            if self.out.is_none() {
                let mut state = self.session.state();
                if let Some(handoff) = state.tx.handoff.take() {
                    // A caller's direct write that did not finish.
                    self.out = Some(handoff);
                } else {
                    match state.take_for_writing() {
                        Ok(Some(buf)) => self.out = Some((buf, 0)),
                        Ok(None) => {}
                        Err(_) => self.failed = true,
                    }
                }
                self.wants_read = state.core.wants_read();
                if self.closing_since.is_none() && state.core.is_closing() {
                    self.closing_since = Some(now);
                }
                let room = state.core.has_room();
                let busy_elsewhere = state.tx.busy && self.out.is_none();
                let closed = state.tx.transport_closed;
                if state.core.has_events() {
                    while let Some(e) = state.core.poll_event() {
                        self.events.push(e);
                    }
                }
                drop(state);
                if room {
                    self.session.room_freed();
                }
                if self.failed {
                    self.lose("the record layer refused a record".into());
                    return false;
                }
                if self.out.is_none() {
                    if busy_elsewhere {
                        // A caller is writing; it wakes us when done.
                        return false;
                    }
                    if closed && !self.shutdown_done {
                        return self.shutdown(cx, &io, now);
                    }
                    return !self.events.is_empty();
                }
            }
            let Some((buf, off)) = self.out.as_mut() else {
                return false;
            };
            // What these bytes acknowledge is in the audit log first.
            if *off == 0 {
                self.env.dispatcher.audit().flush();
            }
            match io.poll_write(cx, &buf[*off..]) {
                Poll::Ready(Ok(0)) => {
                    self.failed = true;
                    self.lose("the stream accepts no more bytes".into());
                    return false;
                }
                Poll::Ready(Ok(n)) => {
                    *off += n;
                    self.stalled_since = None;
                    if *off == buf.len()
                        && let Some((buf, _)) = self.out.take()
                    {
                        self.session.state().done_writing(buf, now);
                        // Flush what the stream may buffer (a no-op for sockets).
                        if let Poll::Ready(Err(e)) = io.poll_flush(cx) {
                            self.failed = true;
                            self.lose(format!("flush failed: {e}"));
                            return false;
                        }
                    }
                }
                Poll::Ready(Err(e)) => {
                    self.failed = true;
                    self.lose(format!("write failed: {e}"));
                    return false;
                }
                Poll::Pending => {
                    self.stalled_since.get_or_insert(now);
                    return false;
                }
            }
        }
    }

    fn shutdown(&mut self, cx: &mut Context<'_>, io: &Arc<dyn Writer>, now: Instant) -> bool {
        match io.poll_shutdown(cx) {
            Poll::Ready(_) => {
                self.shutdown_done = true;
                self.linger_until = Some(now + LINGER);
                true
            }
            Poll::Pending => false,
        }
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
        if self.failed || self.session.lock().is_ended() {
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
            if self.open.is_none()
                && let Some(reason) = HandshakeFailure::of_end(&why)
            {
                self.env.stats.failed(self.session.direction(), reason);
            }
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
                Event::Reply(waiter, reply) => waiter.send(reply),
                Event::Item(sink, item) => sink.push(item),
                _ => {}
            }
        }
        self.session.mark_ended();
        self.open = None;
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

fn count(dispatcher: &Dispatcher, job: &Job, f: &Finished, sender: &NodeId) {
    dispatcher.metrics().count(job.route(), f.outcome);
    dispatcher.record_end(sender, job, f.result.as_ref().map(|_| ()));
    if let Err(e) = &f.result
        && !job.is_request()
    {
        tracing::debug!(code = %e.code, message = %e.message, "notification failed");
    }
}
