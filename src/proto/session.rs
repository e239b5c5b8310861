//! The session core: one value that owns a session's protocol state, in
//! the manner of quinn-proto. No I/O and no runtime inside: it takes
//! received records and the current time, and gives back what to send
//! ([`SessionCore::transmit`]), what to run and which calls completed
//! ([`SessionCore::poll_event`]), and when it next needs the time
//! ([`SessionCore::poll_timeout`]).
//!
//! ```text
//!          our hello queued
//!  AwaitingHello ──peer hello ok──► Open ──close()/close frame/error──► Closing ──► Ended
//!       │  no hello in time,                  requests, responses,         close frame sent
//!       └─ bad first frame ──► Closing        cancels, notifications
//! ```
//!
//! What it owns: the peer's manifest and limits; our calls waiting for an
//! answer; the peer's requests and notifications in flight (running, or
//! answered and waiting for the wire, which still counts); notifications
//! waiting for a slot; the send queue, bounded in bytes; the newest hello
//! not yet sent (manifest updates coalesce); cancels to send. The sender's
//! replay-ledger partition is shared with the node, since a peer's entries
//! outlive its sessions.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_envelope::{
    CloseCode, ErrorBody, ErrorCode, FrameRef, Limits as WireLimits, NodeId, PROTOCOL_VERSION,
    RawValue, ReqId, decode_frame,
};
use capwire_manifest::Manifest;

use crate::proto::codec;
use crate::proto::ledger::Partition;

/// What to do with an inbound control envelope, as the dispatcher decides.
#[derive(Debug)]
pub(crate) enum Admit<J> {
    /// Answer the request with this error; nothing runs.
    Answer(ErrorBody),
    /// Send this remembered response frame again; nothing runs.
    Replay(Bytes),
    /// A notification that does not run; it is never answered.
    Drop,
    /// Run it (a notification may have to wait for a slot first).
    Run(J),
}

/// A job the dispatcher handed out, as the session core sees it.
pub(crate) trait Work {
    /// The request's id (empty for a notification).
    fn req_id(&self) -> &ReqId;
    /// The route it runs, for the ledger.
    fn route(&self) -> u32;
    /// The binding epoch a controller verb's answer belongs to.
    fn answer_epoch(&self) -> Option<u64>;
    /// Bytes it holds while it waits for a slot.
    fn weight(&self) -> usize;
    /// Its handler keeps durable answers of its own: a `timeout` or
    /// `cancelled` answer is not kept in the replay ledger (a retry then
    /// reaches the handler, which answers what really happened).
    fn durable(&self) -> bool {
        false
    }
}

/// The decision the session core asks for each control envelope: the
/// chokepoint, the ledger and the bounds (the dispatcher implements it).
pub(crate) trait Admission {
    /// What a job handed out looks like.
    type Job: Work;
    /// Decides what becomes of control envelope `c` from `sender` (the
    /// channel's authenticated key), decoded from `record`. `part` is the
    /// sender's ledger partition; `room` says whether the session may start
    /// one more job now.
    fn admit(
        &self,
        part: &Partition,
        sender: &NodeId,
        c: &capwire_envelope::ControlRef<'_>,
        record: &Bytes,
        now: Instant,
        room: bool,
    ) -> Admit<Self::Job>;
}

/// The smallest `max_record` a peer may announce: 64 KiB, room for every
/// error response and for any record that fits one Noise message.
pub(crate) const MIN_PEER_MAX_RECORD: u32 = 64 * 1024;

/// The bounds of one session, from the node's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLimits {
    /// The peer's requests and notifications in flight at once.
    pub(crate) max_inflight: usize,
    /// Our calls waiting for an answer (and cancels waiting to be sent).
    pub(crate) max_pending_calls: usize,
    /// Bytes of frames waiting to be sent; beyond it callers wait and the
    /// session stops reading from the peer.
    pub(crate) max_queued_bytes: usize,
    /// Bytes of notifications waiting for a slot; beyond it the session
    /// stops reading from the peer.
    pub(crate) max_parked_bytes: usize,
    /// The largest record our transport sends or accepts.
    pub(crate) max_record: usize,
    /// Time allowed for the peer's hello.
    pub(crate) hello_timeout: Duration,
}

/// The answer to one of our calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The raw result item, sliced from the received record.
    Ok(Bytes),
    /// The error the peer answered.
    Err(ErrorBody),
}

/// Identifies a job handed out by [`Event::Run`] when it finishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) id: u64,
    req_id: ReqId,
    route: u32,
    epoch: Option<u64>,
    durable: bool,
}

impl Ticket {
    pub(crate) fn is_request(&self) -> bool {
        !self.req_id.is_fire_and_forget()
    }
}

/// Something the driver must act on.
#[derive(Debug)]
pub(crate) enum Event<W, J> {
    /// The peer's hello arrived and was valid: the session is open.
    Opened,
    /// The peer announced a newer manifest.
    ManifestChanged,
    /// Run this job; report its end with [`SessionCore::finish`].
    Run(Ticket, J),
    /// Cancel the running job with this ticket id.
    Cancel(u64),
    /// The request job with this ticket id has ended (forget its token).
    Finished(u64),
    /// One of our calls was answered.
    Reply(W, Reply),
}

/// Why the session is ending or ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// We closed it with this code.
    Local(CloseCode, String),
    /// The peer sent a close frame.
    Peer(CloseCode, String),
    /// The stream ended or failed.
    Lost(String),
}

#[derive(Debug)]
enum Phase {
    AwaitingHello {
        deadline: Instant,
    },
    Open,
    /// A close frame is queued (or sent): nothing more is dispatched.
    Closing,
    Ended,
}

/// Why a call or notification could not be queued.
#[derive(Debug)]
pub(crate) enum Refused<W> {
    /// The send queue is full for now: wait for room and retry.
    Full(W),
    /// Too many calls are waiting for answers.
    TooManyCalls,
    /// The frame is larger than the peer (or our transport) accepts.
    TooLarge,
    /// The session is closing or has ended.
    Closed,
    /// A call with this req_id is already waiting for its answer.
    InUse,
}

#[derive(Debug)]
struct Queued {
    frame: Bytes,
    /// A response: its in-flight slot is freed once it is on its way.
    response: bool,
    /// For one of our requests, its place in the order of calls.
    call: Option<u64>,
}

#[derive(Debug)]
struct PeerView {
    manifest: Arc<Manifest>,
    limits: WireLimits,
}

/// One session's protocol state. `W` is what the driver wants back when a
/// call is answered (a oneshot sender, say); `J` is the dispatcher's job.
pub(crate) struct SessionCore<W, J> {
    remote: NodeId,
    limits: SessionLimits,
    phase: Phase,
    end: Option<End>,
    peer: Option<PeerView>,
    ledger: Arc<Partition>,

    hello: Option<Bytes>,
    cancels: VecDeque<ReqId>,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    close: Option<Bytes>,
    close_sent: bool,

    /// Our calls waiting for answers, with their place in the call order.
    calls: HashMap<ReqId, (W, u64), foldhash::fast::RandomState>,
    /// Calls numbered so far, and how many of them have been sent (the
    /// queue is in order, so every call numbered up to it has gone).
    calls_queued: u64,
    calls_sent: u64,
    /// Calls given up on before they were sent: their frames are dropped
    /// instead of sent (and no cancel is needed).
    withdrawn: Vec<u64>,

    /// The peer's requests running, by req_id: their job ids.
    /// (At most `max_inflight` entries, so a fast hasher is safe here.)
    running: HashMap<ReqId, u64, foldhash::fast::RandomState>,
    running_notifications: usize,
    /// Responses queued and not yet sent: they hold in-flight slots.
    answered: usize,
    parked: VecDeque<(Ticket, J)>,
    parked_bytes: usize,
    next_job: u64,

    events: VecDeque<Event<W, J>>,
}

impl<W, J> std::fmt::Debug for SessionCore<W, J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCore")
            .field("remote", &self.remote)
            .field("phase", &self.phase)
            .field("calls", &self.calls.len())
            .field("running", &self.running.len())
            .field("queued_bytes", &self.queued_bytes)
            .finish_non_exhaustive()
    }
}

impl<W, J: Work> SessionCore<W, J> {
    /// A session with `remote` (the key the handshake proved), with our
    /// `hello` queued as its first record.
    pub(crate) fn new(
        remote: NodeId,
        hello: Bytes,
        limits: SessionLimits,
        ledger: Arc<Partition>,
        now: Instant,
    ) -> Self {
        Self {
            remote,
            limits,
            phase: Phase::AwaitingHello {
                deadline: now
                    .checked_add(limits.hello_timeout)
                    .unwrap_or(now + Duration::from_secs(3600)),
            },
            end: None,
            peer: None,
            ledger,
            hello: Some(hello),
            cancels: VecDeque::new(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            close: None,
            close_sent: false,
            calls: HashMap::default(),
            calls_queued: 0,
            calls_sent: 0,
            withdrawn: Vec::new(),
            running: HashMap::default(),
            running_notifications: 0,
            answered: 0,
            parked: VecDeque::new(),
            parked_bytes: 0,
            next_job: 0,
            events: VecDeque::new(),
        }
    }

    /// The peer's identity.
    pub(crate) fn remote(&self) -> NodeId {
        self.remote
    }

    /// The peer's manifest, once its hello has arrived.
    pub(crate) fn peer_manifest(&self) -> Option<&Arc<Manifest>> {
        self.peer.as_ref().map(|p| &p.manifest)
    }

    pub(crate) fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    /// Closing or ended: no new calls.
    pub(crate) fn is_closing(&self) -> bool {
        matches!(self.phase, Phase::Closing | Phase::Ended)
    }

    pub(crate) fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended)
    }

    /// Why the session ends, once that is decided.
    pub(crate) fn end_reason(&self) -> Option<&End> {
        self.end.as_ref()
    }

    /// Our calls waiting for an answer.
    pub(crate) fn pending_calls(&self) -> usize {
        self.calls.len()
    }

    /// The peer's jobs in flight (running, or answered and not yet sent).
    pub(crate) fn inflight(&self) -> usize {
        self.running.len() + self.running_notifications + self.answered
    }

    /// The peer's requests running now.
    pub(crate) fn running_requests(&self) -> usize {
        self.running.len()
    }

    /// The peer's jobs running now (answers waiting for the wire excluded).
    pub(crate) fn running_jobs(&self) -> usize {
        self.running.len() + self.running_notifications
    }

    /// Bytes waiting in the send queue.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// The largest frame that can travel to the peer.
    pub(crate) fn max_frame(&self) -> usize {
        let peer = self
            .peer
            .as_ref()
            .map_or(usize::MAX, |p| p.limits.max_record as usize);
        self.limits.max_record.min(peer)
    }

    /// Whether the driver should read more from the peer: not while the
    /// send queue or the waiting notifications are over their bounds (a
    /// peer that does not read what it asked for stops being read).
    pub(crate) fn wants_read(&self) -> bool {
        match self.phase {
            Phase::AwaitingHello { .. } | Phase::Open => {
                self.queued_bytes < self.limits.max_queued_bytes
                    && self.parked_bytes < self.limits.max_parked_bytes
            }
            // Read and discard, to see the peer's end of the stream.
            Phase::Closing => true,
            Phase::Ended => false,
        }
    }

    /// Whether a frame of `len` bytes fits in the send queue now (a frame
    /// always fits an empty queue), or queueing would fail for another
    /// reason: a caller waiting for room may retry.
    pub(crate) fn room_for(&self, len: usize) -> bool {
        self.queued_bytes == 0
            || self.queued_bytes + len <= self.limits.max_queued_bytes
            || !self.is_open()
    }

    /// Whether a caller waiting for room in the send queue may retry.
    pub(crate) fn has_room(&self) -> bool {
        self.queued_bytes < self.limits.max_queued_bytes || self.is_closing()
    }

    /// Whether anything waits to be sent.
    pub(crate) fn has_transmit(&self) -> bool {
        if self.close_sent || self.is_ended() {
            return false;
        }
        self.hello.is_some()
            || !self.cancels.is_empty()
            || !self.queue.is_empty()
            || self.close.is_some()
    }

    /// Frames waiting in the send queue.
    pub(crate) fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Whether events wait for the driver.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Whether our close frame has been handed to the transport: the
    /// driver then closes the stream.
    pub(crate) fn close_sent(&self) -> bool {
        self.close_sent
    }

    /// The next event for the driver.
    pub(crate) fn poll_event(&mut self) -> Option<Event<W, J>> {
        self.events.pop_front()
    }

    /// When the core next needs [`handle_timeout`](Self::handle_timeout).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::AwaitingHello { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// Lets time pass.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Phase::AwaitingHello { deadline } = self.phase
            && now >= deadline
        {
            self.close(
                CloseCode::ProtocolError,
                "no hello within the hello timeout",
                true,
            );
        }
    }

    /// Announces a new manifest: the newest hello replaces one not yet sent.
    /// A hello larger than the peer accepts ends the session (`too_large`):
    /// the peer could no longer know our manifest.
    pub(crate) fn announce(&mut self, hello: Bytes) {
        if self.is_closing() {
            return;
        }
        if hello.len() > self.max_frame() {
            self.close(
                CloseCode::TooLarge,
                "our manifest is larger than the peer's max_record",
                true,
            );
            return;
        }
        self.hello = Some(hello);
    }

    /// Closes the session with `code`: the close frame goes after what is
    /// queued, or at once (dropping the queue) when `abort`.
    pub(crate) fn close(&mut self, code: CloseCode, reason: &str, abort: bool) {
        if self.is_closing() {
            return;
        }
        if abort {
            self.hello = None;
            self.drop_queue();
        }
        self.close = Some(codec::close(code, reason));
        self.end = Some(End::Local(code, reason.to_owned()));
        self.phase = Phase::Closing;
        self.stop_work();
    }

    /// The stream is gone (or the driver is done with it): every call
    /// waiting for an answer is returned to be failed.
    pub(crate) fn end(&mut self, why: End) -> Vec<W> {
        if self.end.is_none() {
            self.end = Some(why);
        }
        self.phase = Phase::Ended;
        self.hello = None;
        self.cancels.clear();
        self.close = None;
        self.drop_queue();
        self.stop_work();
        self.withdrawn.clear();
        self.calls.drain().map(|(_, (w, _))| w).collect()
    }

    fn drop_queue(&mut self) {
        for q in self.queue.drain(..) {
            if q.response {
                self.answered = self.answered.saturating_sub(1);
            }
        }
        self.queued_bytes = 0;
    }

    /// No more work starts: parked notifications are dropped. (Running
    /// jobs are cancelled by the driver; they still report their end.)
    fn stop_work(&mut self) {
        self.parked.clear();
        self.parked_bytes = 0;
    }

    // ---------------------------------------------------------------
    // Our calls

    /// Queues one of our requests (already encoded as `frame`) with the
    /// value to hand back when its answer arrives. When the queue is full
    /// for now, everything is handed back to try again.
    #[allow(clippy::type_complexity)]
    pub(crate) fn call(
        &mut self,
        req_id: ReqId,
        frame: Bytes,
        waiter: W,
    ) -> Result<(), Refused<(ReqId, Bytes, W)>> {
        if !self.is_open() {
            return Err(Refused::Closed);
        }
        if self.calls.len() + self.cancels.len() >= self.limits.max_pending_calls {
            return Err(Refused::TooManyCalls);
        }
        if frame.len() > self.max_frame() {
            return Err(Refused::TooLarge);
        }
        if self.calls.contains_key(&req_id) {
            return Err(Refused::InUse);
        }
        if self.queued_bytes + frame.len() > self.limits.max_queued_bytes && self.queued_bytes > 0 {
            return Err(Refused::Full((req_id, frame, waiter)));
        }
        self.calls_queued += 1;
        self.calls.insert(req_id, (waiter, self.calls_queued));
        self.queued_bytes += frame.len();
        self.queue.push_back(Queued {
            frame,
            response: false,
            call: Some(self.calls_queued),
        });
        Ok(())
    }

    /// Queues one of our notifications (already encoded); a full queue
    /// hands the frame back.
    pub(crate) fn notify(&mut self, frame: Bytes) -> Result<(), Refused<Bytes>> {
        if !self.is_open() {
            return Err(Refused::Closed);
        }
        if frame.len() > self.max_frame() {
            return Err(Refused::TooLarge);
        }
        if self.queued_bytes + frame.len() > self.limits.max_queued_bytes && self.queued_bytes > 0 {
            return Err(Refused::Full(frame));
        }
        self.push(frame, false);
        Ok(())
    }

    /// Gives up on one of our calls (its deadline passed, or its future
    /// was dropped): it is forgotten, and the peer is told. A request not
    /// sent yet is withdrawn (never sent); for one already sent, a cancel
    /// is queued ahead of everything else, whatever the send queue holds,
    /// and counts against the pending-call bound until it is sent.
    pub(crate) fn abandon(&mut self, req_id: &ReqId) -> Option<W> {
        let (waiter, seq) = self.calls.remove(req_id)?;
        if seq > self.calls_sent {
            self.withdrawn.push(seq);
        } else if self.is_open() {
            self.cancels.push_back(req_id.clone());
        }
        Some(waiter)
    }

    fn push(&mut self, frame: Bytes, response: bool) {
        self.queued_bytes += frame.len();
        self.queue.push_back(Queued {
            frame,
            response,
            call: None,
        });
    }

    // ---------------------------------------------------------------
    // Sending

    /// Hands queued records, in order, to `sink` until about `budget`
    /// bytes have gone: first a pending hello, then cancels, then the
    /// queue, and the close frame once the queue is empty. Returns the
    /// bytes handed over. A failing sink stops the transfer; the record it
    /// refused is lost with the session.
    ///
    /// # Errors
    /// The sink's error.
    pub(crate) fn transmit<E>(
        &mut self,
        budget: usize,
        mut sink: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        if self.close_sent || self.is_ended() {
            return Ok(0);
        }
        let mut sent = 0;
        if let Some(hello) = self.hello.take() {
            sent += hello.len();
            sink(&hello)?;
        }
        while let Some(req_id) = self.cancels.pop_front() {
            let frame = codec::cancel(&req_id);
            sent += frame.len();
            sink(&frame)?;
        }
        let mut freed = 0;
        while sent < budget {
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            self.queued_bytes -= q.frame.len();
            if q.response {
                freed += 1;
            }
            if let Some(seq) = q.call {
                self.calls_sent = seq;
                if let Some(i) = self.withdrawn.iter().position(|w| *w == seq) {
                    self.withdrawn.swap_remove(i);
                    continue;
                }
            }
            sent += q.frame.len();
            if let Err(e) = sink(&q.frame) {
                self.answered = self.answered.saturating_sub(freed);
                return Err(e);
            }
        }
        self.answered = self.answered.saturating_sub(freed);
        if self.queue.is_empty()
            && let Some(close) = self.close.take()
        {
            sent += close.len();
            self.close_sent = true;
            sink(&close)?;
        }
        if freed > 0 {
            self.start_parked();
        }
        Ok(sent)
    }

    // ---------------------------------------------------------------
    // Receiving

    /// Handles one record received from the peer.
    pub(crate) fn handle_record(
        &mut self,
        now: Instant,
        record: Bytes,
        dispatcher: &impl Admission<Job = J>,
    ) {
        match self.phase {
            Phase::Closing | Phase::Ended => return,
            Phase::AwaitingHello { .. } | Phase::Open => {}
        }
        let frame = match decode_frame(&record) {
            Ok(f) => f,
            Err(e) => {
                let reason = format!("malformed frame: {e}");
                self.close(CloseCode::ProtocolError, &reason, true);
                return;
            }
        };
        if let Phase::AwaitingHello { .. } = self.phase {
            let FrameRef::Hello(hello) = frame else {
                if let FrameRef::Close(c) = frame {
                    self.peer_closed(c.code, c.reason);
                    return;
                }
                let reason = format!("expected hello, got {}", frame.kind());
                self.close(CloseCode::ProtocolError, &reason, true);
                return;
            };
            if let Err((code, reason)) = self.accept_hello(&hello) {
                self.close(code, &reason, true);
                return;
            }
            self.phase = Phase::Open;
            self.events.push_back(Event::Opened);
            return;
        }
        match frame {
            FrameRef::Control(c) => {
                let room = self.inflight() < self.limits.max_inflight;
                match dispatcher.admit(&self.ledger, &self.remote, &c, &record, now, room) {
                    Admit::Answer(body) => {
                        let frame = codec::error_body(&c.req_id, &body);
                        self.push(frame, false);
                    }
                    Admit::Replay(frame) => self.push(frame, false),
                    Admit::Drop => {}
                    Admit::Run(job) => self.run(job),
                }
            }
            FrameRef::Response(r) => {
                // A late answer to a call we gave up on is ignored.
                if let Some((waiter, _)) = self.calls.remove(&r.req_id) {
                    let reply = match r.outcome {
                        Ok(raw) => Reply::Ok(record.slice_ref(raw)),
                        Err(body) => Reply::Err(body),
                    };
                    self.events.push_back(Event::Reply(waiter, reply));
                }
            }
            FrameRef::Cancel(c) => {
                // A cancel for an unknown or finished request is ignored.
                if let Some(id) = self.running.get(&c.req_id) {
                    self.events.push_back(Event::Cancel(*id));
                }
            }
            FrameRef::Hello(hello) => match self.accept_hello(&hello) {
                Ok(true) => self.events.push_back(Event::ManifestChanged),
                Ok(false) => {}
                Err((code, reason)) => self.close(code, &reason, true),
            },
            FrameRef::Close(c) => self.peer_closed(c.code, c.reason),
            FrameRef::Keepalive => {}
        }
    }

    fn peer_closed(&mut self, code: CloseCode, reason: &str) {
        self.end = Some(End::Peer(code, reason.to_owned()));
        self.phase = Phase::Ended;
        self.hello = None;
        self.close = None;
        self.drop_queue();
        self.stop_work();
    }

    /// Checks a hello; `Ok(true)` when it was taken (the first one, or a
    /// newer manifest), `Ok(false)` when it was ignored (an epoch not newer
    /// than the one held).
    fn accept_hello(
        &mut self,
        hello: &capwire_envelope::HelloRef<'_>,
    ) -> Result<bool, (CloseCode, String)> {
        if hello.protocol != PROTOCOL_VERSION {
            return Err((
                CloseCode::UnsupportedProtocol,
                format!(
                    "this node speaks protocol {PROTOCOL_VERSION}, the hello names {}",
                    hello.protocol
                ),
            ));
        }
        let limits = hello.limits;
        if limits.max_record < MIN_PEER_MAX_RECORD || limits.max_inflight == 0 {
            return Err((
                CloseCode::ProtocolError,
                format!(
                    "hello limits out of range: max_record must be at least {MIN_PEER_MAX_RECORD}, max_inflight at least 1"
                ),
            ));
        }
        let manifest = Manifest::decode_checked(hello.manifest)
            .map_err(|e| (CloseCode::ProtocolError, format!("bad manifest: {e}")))?;
        if manifest.node_id != self.remote {
            return Err((
                CloseCode::ProtocolError,
                "the manifest's node_id is not the key the handshake proved (in canonical form)"
                    .to_owned(),
            ));
        }
        if let Some(peer) = &self.peer
            && manifest.epoch <= peer.manifest.epoch
        {
            return Ok(false);
        }
        self.peer = Some(PeerView {
            manifest: Arc::new(manifest),
            limits,
        });
        Ok(true)
    }

    fn run(&mut self, job: J) {
        self.next_job += 1;
        let ticket = Ticket {
            id: self.next_job,
            req_id: job.req_id().clone(),
            route: job.route(),
            epoch: job.answer_epoch(),
            durable: job.durable(),
        };
        if ticket.is_request() {
            self.running.insert(ticket.req_id.clone(), ticket.id);
            self.events.push_back(Event::Run(ticket, job));
        } else if self.inflight() < self.limits.max_inflight && self.parked.is_empty() {
            self.running_notifications += 1;
            self.events.push_back(Event::Run(ticket, job));
        } else {
            // Reading goes on (responses to our own calls keep arriving);
            // it stops only when the parked notifications pass their bound.
            self.parked_bytes += job.weight();
            self.parked.push_back((ticket, job));
        }
    }

    fn start_parked(&mut self) {
        while self.inflight() < self.limits.max_inflight {
            let Some((ticket, job)) = self.parked.pop_front() else {
                break;
            };
            self.parked_bytes = self.parked_bytes.saturating_sub(job.weight());
            self.running_notifications += 1;
            self.events.push_back(Event::Run(ticket, job));
        }
    }

    /// A job handed out by [`Event::Run`] has ended. For a request, its
    /// response is recorded in the ledger (even when the session has
    /// ended, so a retry on a new session gets it) and queued.
    pub(crate) fn finish(
        &mut self,
        ticket: Ticket,
        result: &Result<RawValue, ErrorBody>,
        now: Instant,
    ) {
        if ticket.is_request() {
            let frame = codec::response(&ticket.req_id, result, self.max_frame());
            let unfinished = matches!(
                result,
                Err(ErrorBody {
                    code: ErrorCode::Timeout | ErrorCode::Cancelled,
                    ..
                })
            );
            let mut ledger = self
                .ledger
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if ticket.durable && unfinished {
                ledger.abandon(&ticket.req_id);
            } else {
                ledger.complete(
                    &ticket.req_id,
                    ticket.route,
                    ticket.epoch,
                    frame.clone(),
                    now,
                );
            }
            drop(ledger);
            if self.running.get(&ticket.req_id) == Some(&ticket.id) {
                self.running.remove(&ticket.req_id);
            }
            self.events.push_back(Event::Finished(ticket.id));
            if matches!(self.phase, Phase::Open | Phase::Closing) && !self.close_sent {
                self.answered += 1;
                self.push(frame, true);
            }
        } else {
            self.running_notifications = self.running_notifications.saturating_sub(1);
            self.start_parked();
        }
    }

    /// A job handed out by [`Event::Run`] will not run (the session is
    /// closing): it leaves no trace, so the same request may come again.
    pub(crate) fn discard(&mut self, ticket: Ticket) {
        if ticket.is_request() {
            self.ledger
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .abandon(&ticket.req_id);
            if self.running.get(&ticket.req_id) == Some(&ticket.id) {
                self.running.remove(&ticket.req_id);
            }
        } else {
            self.running_notifications = self.running_notifications.saturating_sub(1);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use capwire_envelope::{
        ErrorCode, Frame, RawValue, ResponseEnvelope, encode_cancel, encode_control,
        encode_keepalive, encode_response_ok,
    };

    pub(crate) use crate::fuzzing::{REMOTE, dispatcher, limits, peer_hello};

    use crate::dispatch::{Dispatcher, Job};

    pub(crate) fn core(d: &Dispatcher, now: Instant) -> SessionCore<u32, Job> {
        SessionCore::new(
            REMOTE,
            Bytes::from_static(b"our hello"),
            limits(),
            d.ledger().partition(REMOTE),
            now,
        )
    }

    fn control(cap: &str, verb: &str, req: &str, args: &impl serde::Serialize) -> Bytes {
        let req = if req.is_empty() {
            ReqId::EMPTY
        } else {
            ReqId::try_from(req).unwrap()
        };
        let mut out = Vec::new();
        encode_control(
            &mut out,
            cap,
            verb,
            &req,
            None,
            RawValue::encode(args).unwrap().as_bytes(),
        )
        .unwrap();
        out.into()
    }

    fn sent(c: &mut SessionCore<u32, Job>) -> Vec<Frame> {
        let mut frames = Vec::new();
        c.transmit::<()>(usize::MAX, |r| {
            frames.push(decode_frame(r).unwrap().to_frame().unwrap());
            Ok(())
        })
        .unwrap();
        frames
    }

    fn open(d: &Dispatcher, now: Instant) -> SessionCore<u32, Job> {
        let mut c = core(d, now);
        let mut first = Vec::new();
        c.transmit::<()>(usize::MAX, |r| {
            first.push(r.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(first, vec![b"our hello".to_vec()], "our hello goes first");
        c.handle_record(now, peer_hello(REMOTE, 1), d);
        assert!(matches!(c.poll_event(), Some(Event::Opened)));
        assert!(c.is_open());
        c
    }

    fn runs(c: &mut SessionCore<u32, Job>) -> Vec<(Ticket, Job)> {
        let mut jobs = Vec::new();
        while let Some(e) = c.poll_event() {
            if let Event::Run(t, j) = e {
                jobs.push((t, j));
            }
        }
        jobs
    }

    fn ok(s: &str) -> Result<RawValue, ErrorBody> {
        Ok(RawValue::encode(s).unwrap())
    }

    fn response(f: &Frame) -> &ResponseEnvelope {
        match f {
            Frame::Response(r) => r,
            other => panic!("a response, got {other:?}"),
        }
    }

    #[test]
    fn the_first_record_must_be_a_valid_hello() {
        let d = dispatcher();
        let now = Instant::now();
        for (record, code) in [
            (
                control("app.t", "echo", "1", &"x"),
                CloseCode::ProtocolError,
            ),
            (Bytes::from_static(b"\xff"), CloseCode::ProtocolError),
            (
                peer_hello(NodeId::from_bytes([3; 32]), 1),
                CloseCode::ProtocolError,
            ),
        ] {
            let mut c = core(&d, now);
            c.handle_record(now, record, &d);
            assert!(c.is_closing());
            let frames = sent(&mut c);
            assert!(
                matches!(frames.last(), Some(Frame::Close(close)) if close.code == code),
                "{frames:?}"
            );
            assert!(c.close_sent());
        }
        // Another protocol version.
        let mut c = core(&d, now);
        let mut hello = peer_hello(REMOTE, 1).to_vec();
        let pos = hello.windows(9).position(|w| w == b"\x68protocol").unwrap() + 9;
        hello[pos] = 0x02;
        c.handle_record(now, hello.into(), &d);
        let frames = sent(&mut c);
        assert!(
            matches!(frames.last(), Some(Frame::Close(close)) if close.code == CloseCode::UnsupportedProtocol)
        );
    }

    #[test]
    fn no_hello_in_time_closes() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = core(&d, now);
        assert_eq!(c.poll_timeout(), Some(now + Duration::from_secs(10)));
        c.handle_timeout(now + Duration::from_secs(9));
        assert!(!c.is_closing());
        c.handle_timeout(now + Duration::from_secs(10));
        assert!(c.is_closing());
    }

    #[test]
    fn a_request_is_answered_once_and_its_slot_held_until_sent() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        c.handle_record(now, control("app.t", "echo", "r1", &"hi"), &d);
        let mut jobs = runs(&mut c);
        assert_eq!(jobs.len(), 1);
        assert_eq!(c.inflight(), 1);
        let (t, _) = jobs.pop().unwrap();
        c.finish(t, &ok("hi"), now);
        assert_eq!(
            c.inflight(),
            1,
            "an answer waiting for the wire holds its slot"
        );
        let frames = sent(&mut c);
        assert_eq!(frames.len(), 1);
        assert_eq!(response(&frames[0]).req_id.as_str(), "r1");
        assert_eq!(c.inflight(), 0);
        // A repeat is answered from the ledger, byte for byte, without a job.
        c.handle_record(now, control("app.t", "echo", "r1", &"hi"), &d);
        assert!(runs(&mut c).is_empty());
        assert_eq!(sent(&mut c), frames);
        // The same req_id on another verb is a duplicate.
        c.handle_record(now, control("app.t", "note", "r1", &"hi"), &d);
        c.handle_record(now, control("core.monitoring", "bind", "r1", &"x"), &d);
        for f in sent(&mut c) {
            let code = response(&f).outcome.clone().unwrap_err().code;
            assert!(
                code == ErrorCode::Duplicate || code == ErrorCode::UnknownVerb,
                "{code}"
            );
        }
    }

    #[test]
    fn requests_over_the_bound_are_overloaded_and_notifications_wait() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        for r in ["a", "b", "c"] {
            c.handle_record(now, control("app.t", "echo", r, &"x"), &d);
        }
        let jobs = runs(&mut c);
        assert_eq!(jobs.len(), 2);
        let frames = sent(&mut c);
        assert_eq!(response(&frames[0]).req_id.as_str(), "c");
        assert_eq!(
            response(&frames[0]).outcome.clone().unwrap_err().code,
            ErrorCode::Overloaded
        );
        // Notifications beyond the bound wait; reading goes on.
        c.handle_record(now, control("app.t", "note", "", &"n1"), &d);
        assert!(runs(&mut c).is_empty());
        assert!(c.wants_read(), "reading goes on while notifications wait");
        // A response to our own call still gets through.
        c.call(ReqId::from_u64(7), control("app.t", "echo", "7", &"q"), 77)
            .unwrap();
        sent(&mut c);
        let mut resp = Vec::new();
        encode_response_ok(&mut resp, &ReqId::from_u64(7), &[0xf6]).unwrap();
        c.handle_record(now, resp.into(), &d);
        assert!(matches!(
            c.poll_event(),
            Some(Event::Reply(77, Reply::Ok(_)))
        ));
        // Finishing one request and sending its answer starts the note.
        let mut jobs = jobs.into_iter();
        let (t, _) = jobs.next().unwrap();
        c.finish(t, &ok("x"), now);
        assert!(runs(&mut c).iter().all(|(t, _)| !t.is_request()));
        sent(&mut c);
        let started = runs(&mut c);
        assert_eq!(started.len(), 1);
        assert!(!started[0].0.is_request());
    }

    #[test]
    fn parked_notifications_stop_reading_past_their_bound() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        for i in 0..2 {
            c.handle_record(now, control("app.t", "note", "", &format!("{i}")), &d);
        }
        assert_eq!(runs(&mut c).len(), 2);
        let big = "y".repeat(600);
        c.handle_record(now, control("app.t", "note", "", &big), &d);
        assert!(!c.wants_read());
    }

    #[test]
    fn a_peer_that_does_not_read_stops_being_read() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        // Denied requests are answered; nothing is sent while the peer
        // takes nothing, so the queue fills and reading stops.
        let mut n = 0;
        while c.wants_read() {
            c.handle_record(now, control("app.t", "nope", &format!("q{n}"), &"x"), &d);
            n += 1;
            assert!(n < 1000);
        }
        assert!(c.queued_bytes() >= limits().max_queued_bytes);
        assert!(matches!(
            c.call(ReqId::from_u64(1), control("app.t", "echo", "1", &"x"), 1),
            Err(Refused::Full((_, _, 1)))
        ));
        sent(&mut c);
        assert!(c.wants_read());
        assert!(c.has_room());
    }

    #[test]
    fn cancels_abandons_and_unsolicited_responses() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        c.handle_record(now, control("app.t", "echo", "r9", &"x"), &d);
        let jobs = runs(&mut c);
        let mut cancel = Vec::new();
        encode_cancel(&mut cancel, &ReqId::try_from("r9").unwrap()).unwrap();
        c.handle_record(now, cancel.clone().into(), &d);
        assert!(matches!(c.poll_event(), Some(Event::Cancel(id)) if id == jobs[0].0.id));
        // A cancel of something unknown is ignored.
        let mut other = Vec::new();
        encode_cancel(&mut other, &ReqId::try_from("zz").unwrap()).unwrap();
        c.handle_record(now, other.into(), &d);
        assert!(c.poll_event().is_none());
        // An answer nobody waits for is ignored.
        let mut resp = Vec::new();
        encode_response_ok(&mut resp, &ReqId::from_u64(42), &[0xf6]).unwrap();
        c.handle_record(now, resp.into(), &d);
        assert!(c.poll_event().is_none());
        assert!(c.is_open());
        // Our call, abandoned: its cancel goes out before anything else.
        c.call(ReqId::from_u64(5), control("app.t", "echo", "5", &"x"), 5)
            .unwrap();
        sent(&mut c);
        assert_eq!(c.abandon(&ReqId::from_u64(5)), Some(5));
        assert_eq!(c.pending_calls(), 0);
        let frames = sent(&mut c);
        assert!(matches!(&frames[0], Frame::Cancel(x) if x.req_id.as_str() == "5"));
        let mut ka = Vec::new();
        encode_keepalive(&mut ka);
        c.handle_record(now, ka.into(), &d);
        assert!(c.is_open());
    }

    #[test]
    fn a_call_given_up_before_it_was_sent_is_never_sent() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        c.call(ReqId::from_u64(1), control("app.t", "echo", "1", &"a"), 1)
            .unwrap();
        c.call(ReqId::from_u64(2), control("app.t", "echo", "2", &"b"), 2)
            .unwrap();
        assert_eq!(c.abandon(&ReqId::from_u64(1)), Some(1));
        let frames = sent(&mut c);
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert!(matches!(&frames[0], Frame::Control(x) if x.req_id.as_str() == "2"));
        assert_eq!(c.queued_bytes(), 0);
    }

    #[test]
    fn kinds_must_match() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        c.handle_record(now, control("app.t", "echo", "", &"x"), &d);
        c.handle_record(now, control("app.t", "note", "n", &"x"), &d);
        assert!(
            runs(&mut c).is_empty(),
            "no handler runs on a kind mismatch"
        );
        let frames = sent(&mut c);
        assert_eq!(frames.len(), 1, "only the request-shaped frame is answered");
        assert_eq!(response(&frames[0]).req_id.as_str(), "n");
    }

    #[test]
    fn close_goes_after_the_queue_and_ends_everything() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        c.call(ReqId::from_u64(1), control("app.t", "echo", "1", &"x"), 1)
            .unwrap();
        c.close(CloseCode::Shutdown, "bye", false);
        let frames = sent(&mut c);
        assert!(matches!(frames[0], Frame::Control(_)));
        assert!(matches!(&frames[1], Frame::Close(x) if x.code == CloseCode::Shutdown));
        assert!(c.close_sent());
        assert!(matches!(
            c.call(ReqId::from_u64(2), control("app.t", "echo", "2", &"x"), 2),
            Err(Refused::Closed)
        ));
        assert_eq!(c.end(End::Lost("gone".into())), vec![1]);
        assert!(c.is_ended());
    }

    #[test]
    fn a_newer_hello_replaces_the_manifest_and_an_older_one_is_ignored() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = open(&d, now);
        c.handle_record(now, peer_hello(REMOTE, 5), &d);
        assert!(matches!(c.poll_event(), Some(Event::ManifestChanged)));
        c.handle_record(now, peer_hello(REMOTE, 3), &d);
        assert!(c.poll_event().is_none());
        assert_eq!(c.peer_manifest().unwrap().epoch, 5);
        c.handle_record(now, peer_hello(NodeId::from_bytes([9; 32]), 9), &d);
        assert!(c.is_closing());
    }
}
