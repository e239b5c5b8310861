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
    CloseCode, ErrorBody, ErrorCode, FrameRef, Limits as WireLimits, NodeId, PROTOCOL_V2,
    PROTOCOL_V3, PROTOCOL_VERSION, RawValue, ReqId, decode_frame,
};
use capwire_manifest::Manifest;

use crate::proto::codec::{self, Hellos};
use crate::proto::ledger::Partition;
use crate::proto::streams::{Arrived, Held, Streams, Window};

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
    /// It serves a stream: items, then one response.
    fn is_stream(&self) -> bool {
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
    /// one more job now; `version` is the session's protocol version.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        part: &Partition,
        sender: &NodeId,
        c: &capwire_envelope::ControlRef<'_>,
        record: &Bytes,
        now: Instant,
        room: bool,
        version: u32,
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
    /// Bytes of window our open streams may hold in all.
    pub(crate) max_stream_window_bytes: u64,
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
    stream: bool,
}

impl Ticket {
    pub(crate) fn is_request(&self) -> bool {
        !self.req_id.is_fire_and_forget()
    }

    /// The job serves a stream.
    pub(crate) fn is_stream(&self) -> bool {
        self.stream
    }

    /// The request id it answers.
    pub(crate) fn req_id(&self) -> &ReqId {
        &self.req_id
    }
}

/// Something the driver must act on.
#[derive(Debug)]
pub(crate) enum Event<W, J, S> {
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
    /// One of our calls was answered (for a stream: it ended).
    Reply(W, Reply),
    /// One of our calls can get no answer any more: the session is
    /// closing, and nothing the peer sends is read. Fail it (peer lost).
    Lost(W),
    /// An item of one of our streams arrived (the raw item, copied out of
    /// the record), within the credit we granted.
    Item(S, Bytes),
    /// The peer granted credit to the stream the job with this ticket id
    /// serves, and its handler waited for it.
    Credit(u64),
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
    /// A stream on a session whose peer speaks protocol 1.
    Unsupported,
}

/// Why an item of a stream we serve could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ItemRefused {
    /// No credit for it: wait for [`Event::Credit`] and try again.
    NoCredit,
    /// The send queue is full for now: wait for room and try again.
    Full,
    /// The item is larger than the caller's window or `max_record`.
    TooLarge,
    /// The stream is no longer served, or the session is closing.
    Closed,
    /// The authority the stream was opened on may have ended: refused
    /// before it reached the core, by the driver's own check.
    Unauthorized,
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
    /// The `protocol` of the hello the manifest came with.
    protocol: u32,
}

/// One session's protocol state. `W` is what the driver wants back when a
/// call is answered (a oneshot sender, say); `J` is the dispatcher's job;
/// `S` is where the items of one of our streams go.
pub(crate) struct SessionCore<W, J, S> {
    remote: NodeId,
    limits: SessionLimits,
    phase: Phase,
    end: Option<End>,
    peer: Option<PeerView>,
    ledger: Arc<Partition>,
    /// The session's protocol version: 1 until the peer's first hello
    /// says it speaks 2 as well (ours always does).
    version: u32,

    /// Our hellos as they are now.
    hellos: Hellos,
    /// Our first hello, until it is sent.
    hello: Option<Bytes>,
    /// A later hello of ours, until it is sent (the newest replaces one
    /// not yet sent).
    update: Option<Bytes>,
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

    streams: Streams<S>,

    events: VecDeque<Event<W, J, S>>,
}

impl<W, J, S> std::fmt::Debug for SessionCore<W, J, S> {
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

impl<W, J: Work, S: Clone> SessionCore<W, J, S> {
    /// A session with `remote` (the key the handshake proved), with our
    /// first hello (`hellos.v1`) queued as its first record.
    pub(crate) fn new(
        remote: NodeId,
        hellos: Hellos,
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
            version: PROTOCOL_VERSION,
            hello: Some(hellos.v1.clone()),
            hellos,
            update: None,
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
            streams: Streams::default(),
            events: VecDeque::new(),
        }
    }

    /// The session's protocol version (1 until the peer's first hello
    /// shows it speaks 2).
    pub(crate) fn version(&self) -> u32 {
        self.version
    }

    /// Streams the peer runs here, and ours open on the peer.
    pub(crate) fn streams(&self) -> (usize, usize) {
        (self.streams.served(), self.streams.opened())
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
            || self.update.is_some()
            || !self.cancels.is_empty()
            || self.streams.has_grants()
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
    pub(crate) fn poll_event(&mut self) -> Option<Event<W, J, S>> {
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

    /// The hellos this session announces now.
    pub(crate) fn hellos(&self) -> &Hellos {
        &self.hellos
    }

    /// Announces a new manifest: the newest hello replaces one not yet sent
    /// (a first hello not yet sent stays the first, in its new form). A
    /// hello larger than the peer accepts ends the session (`too_large`):
    /// the peer could no longer know our manifest.
    pub(crate) fn announce(&mut self, hellos: Hellos) {
        if self.is_closing() {
            return;
        }
        let first = self.hello.is_some().then(|| hellos.v1.clone());
        let update = match (self.version >= PROTOCOL_V2, first.is_some()) {
            (true, false) => Some(hellos.of(self.version).clone()),
            (true, true) => hellos.differ.then(|| hellos.of(self.version).clone()),
            (false, false) => Some(hellos.v1.clone()),
            (false, true) => None,
        };
        self.hellos = hellos;
        let largest = first
            .iter()
            .chain(update.iter())
            .map(Bytes::len)
            .max()
            .unwrap_or(0);
        if largest > self.max_frame() {
            self.close(
                CloseCode::TooLarge,
                "our manifest is larger than the peer's max_record",
                true,
            );
            return;
        }
        if first.is_some() {
            self.hello = first;
        }
        if update.is_some() {
            self.update = update;
        }
    }

    /// Closes the session with `code`: the close frame goes after what is
    /// queued, or at once (dropping the queue) when `abort`.
    pub(crate) fn close(&mut self, code: CloseCode, reason: &str, abort: bool) {
        if self.is_closing() {
            return;
        }
        if abort {
            self.hello = None;
            self.update = None;
            self.drop_queue();
        }
        self.close = Some(codec::close(code, reason));
        self.end = Some(End::Local(code, reason.to_owned()));
        self.phase = Phase::Closing;
        self.stop_work();
        // Nothing the peer sends is read from now on, so no answer can
        // come: our calls and streams fail now, not when the stream is
        // dropped after the close (up to the close timeout later).
        for (req_id, (waiter, _)) in self.calls.drain() {
            self.streams.close(&req_id);
            self.events.push_back(Event::Lost(waiter));
        }
    }

    /// The stream is gone (or the driver is done with it): every call
    /// waiting for an answer is returned to be failed.
    pub(crate) fn end(&mut self, why: End) -> Vec<W> {
        if self.end.is_none() {
            self.end = Some(why);
        }
        self.phase = Phase::Ended;
        self.hello = None;
        self.update = None;
        self.cancels.clear();
        self.close = None;
        self.drop_queue();
        self.stop_work();
        self.withdrawn.clear();
        self.streams.clear();
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

    /// Opens one of our streams: queues its control frame (already
    /// encoded) and, right after it, the grant of `window`; its items go to
    /// `sink`, its end (the response) to `waiter`. When the queue is full
    /// for now, everything is handed back to try again.
    #[allow(clippy::type_complexity)]
    pub(crate) fn open_stream(
        &mut self,
        req_id: ReqId,
        frame: Bytes,
        waiter: W,
        sink: S,
        window: Window,
    ) -> Result<(), Refused<(ReqId, Bytes, W, S)>> {
        if !self.is_open() {
            return Err(Refused::Closed);
        }
        if self.version < PROTOCOL_V2 {
            return Err(Refused::Unsupported);
        }
        if self.calls.len() + self.cancels.len() >= self.limits.max_pending_calls
            || self.streams.window_bytes() + u64::from(window.bytes)
                > self.limits.max_stream_window_bytes
        {
            return Err(Refused::TooManyCalls);
        }
        if frame.len() > self.max_frame() {
            return Err(Refused::TooLarge);
        }
        if self.calls.contains_key(&req_id) {
            return Err(Refused::InUse);
        }
        let grant = codec::credit(&req_id, window.items, window.bytes);
        let len = frame.len() + grant.len();
        if self.queued_bytes + len > self.limits.max_queued_bytes && self.queued_bytes > 0 {
            return Err(Refused::Full((req_id, frame, waiter, sink)));
        }
        self.calls_queued += 1;
        self.calls
            .insert(req_id.clone(), (waiter, self.calls_queued));
        self.streams.open(req_id, sink, window);
        self.queued_bytes += len;
        self.queue.push_back(Queued {
            frame,
            response: false,
            call: Some(self.calls_queued),
        });
        // In the queue, after the control frame: a grant that overtook it
        // would be for a stream the peer does not know yet.
        self.queue.push_back(Queued {
            frame: grant,
            response: false,
            call: None,
        });
        Ok(())
    }

    /// Our application took `items` items of `bytes` bytes of our stream
    /// `req_id`: `true` when a grant is now waiting to be sent.
    pub(crate) fn taken(&mut self, req_id: &ReqId, items: u64, bytes: u64) -> bool {
        self.is_open() && self.streams.taken(req_id, items, bytes)
    }

    /// Queues an item (already encoded as `frame`, its `item` value `len`
    /// bytes) of the peer's stream `req_id` that we serve, within the
    /// credit the peer granted.
    ///
    /// # Errors
    /// Why it cannot go now, or ever.
    pub(crate) fn send_item(
        &mut self,
        req_id: &ReqId,
        frame: Bytes,
        len: usize,
    ) -> Result<(), ItemRefused> {
        if !self.is_open() {
            return Err(ItemRefused::Closed);
        }
        if frame.len() > self.max_frame() {
            return Err(ItemRefused::TooLarge);
        }
        // Room first: credit spent is spent.
        if self.queued_bytes + frame.len() > self.limits.max_queued_bytes && self.queued_bytes > 0 {
            return Err(ItemRefused::Full);
        }
        match self.streams.spend(req_id, len) {
            Ok(()) => {}
            Err(Held::NoCredit) => return Err(ItemRefused::NoCredit),
            Err(Held::LargerThanWindow) => return Err(ItemRefused::TooLarge),
            Err(Held::Gone) => return Err(ItemRefused::Closed),
        }
        self.push(frame, false);
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
        self.streams.close(req_id);
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
        if let Some(hello) = self.update.take() {
            sent += hello.len();
            sink(&hello)?;
        }
        while let Some(req_id) = self.cancels.pop_front() {
            let frame = codec::cancel(&req_id);
            sent += frame.len();
            sink(&frame)?;
        }
        // Grants go ahead of the queue too: a producer waits on them.
        while let Some((req_id, items, bytes)) = self.streams.next_grant() {
            let frame = codec::credit(&req_id, items, bytes);
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
            let first = self.peer.is_none();
            if let Err((code, reason)) = self.accept_hello(&hello) {
                self.close(code, &reason, true);
                return;
            }
            // Both sides speak protocol 2 or 3 (ours lists 3 in every
            // manifest): from now on the session speaks the lower of the
            // two highest versions, and the peer is shown our manifest as
            // that version shows it.
            if first
                && let Some(speaks) = self
                    .peer
                    .as_ref()
                    .map(|p| p.manifest.protocol().min(PROTOCOL_V3))
                && speaks >= PROTOCOL_V2
            {
                self.version = speaks;
                if self.hellos.differ {
                    self.update = Some(self.hellos.of(speaks).clone());
                }
            }
            // A version-2 peer whose first hello left stream verbs out
            // sends its whole manifest next: the session opens with it, so
            // that nobody sees the partial view as the peer's manifest.
            if self.version >= PROTOCOL_V2
                && self
                    .peer
                    .as_ref()
                    .is_some_and(|p| p.manifest.is_partial_view())
            {
                return;
            }
            self.phase = Phase::Open;
            self.events.push_back(Event::Opened);
            return;
        }
        if frame.kind().since() > self.version {
            let reason = format!(
                "{} frames need protocol {}; this session speaks {}",
                frame.kind(),
                frame.kind().since(),
                self.version
            );
            self.close(CloseCode::ProtocolError, &reason, true);
            return;
        }
        match frame {
            FrameRef::Control(c) => {
                let room = self.inflight() < self.limits.max_inflight;
                let version = self.version;
                match dispatcher.admit(&self.ledger, &self.remote, &c, &record, now, room, version)
                {
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
                    self.streams.close(&r.req_id);
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
            FrameRef::Item(i) => match self.streams.arrived(&i.req_id, i.item.len()) {
                Arrived::Deliver(sink) => {
                    // Copied out of the record: an item may wait for its
                    // consumer as long as it likes, and a slice would keep
                    // the whole read buffer it arrived in (up to 256 KiB)
                    // alive with it, so that a window of small items could
                    // hold far more memory than the window.
                    let event = Event::Item(sink.clone(), Bytes::copy_from_slice(i.item));
                    self.events.push_back(event);
                }
                // A stream we gave up on (its items may still be on their
                // way), or none ever: ignored, as a late response is.
                Arrived::Unknown if !self.calls.contains_key(&i.req_id) => {}
                Arrived::Unknown => self.close(
                    CloseCode::ProtocolError,
                    "an item for a request that is not a stream",
                    true,
                ),
                Arrived::Excess => self.close(
                    CloseCode::ProtocolError,
                    "an item beyond the credit granted",
                    true,
                ),
            },
            FrameRef::Credit(c) => {
                // A grant for a stream that ended (or never was) is ignored.
                if let Some(job) = self.streams.grant(&c.req_id, c.items, c.bytes) {
                    self.events.push_back(Event::Credit(job));
                }
            }
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
        // A first hello names protocol 1 whatever its sender speaks; a
        // later one names the session's version, or 1.
        let allowed = if self.peer.is_none() {
            PROTOCOL_VERSION
        } else {
            self.version
        };
        if hello.protocol == 0 || hello.protocol > allowed {
            return Err((
                CloseCode::UnsupportedProtocol,
                format!(
                    "this hello may name protocol {PROTOCOL_VERSION}{}, it names {}",
                    if allowed > PROTOCOL_VERSION {
                        format!(" or {allowed}")
                    } else {
                        String::new()
                    },
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
        if hello.protocol < PROTOCOL_V2 && manifest.has_protocol_2_verbs() {
            return Err((
                CloseCode::ProtocolError,
                "stream verbs in a hello that names protocol 1".to_owned(),
            ));
        }
        if hello.protocol < PROTOCOL_V3 && manifest.has_protocol_3_capabilities() {
            return Err((
                CloseCode::ProtocolError,
                "a capability of protocol 3 in a hello that names protocol 2 or 1".to_owned(),
            ));
        }
        // A newer epoch replaces what is held; so does the first hello
        // naming protocol 2 (the whole manifest of a version-2 peer, at
        // the epoch of the version-1 view it sent first).
        if let Some(peer) = &self.peer {
            let upgrade = hello.protocol > peer.protocol && manifest.epoch == peer.manifest.epoch;
            if manifest.epoch < peer.manifest.epoch
                || (manifest.epoch == peer.manifest.epoch && !upgrade)
            {
                return Ok(false);
            }
        }
        self.peer = Some(PeerView {
            manifest: Arc::new(manifest),
            limits,
            protocol: hello.protocol,
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
            stream: job.is_stream(),
        };
        if ticket.is_request() {
            self.running.insert(ticket.req_id.clone(), ticket.id);
            if ticket.stream {
                self.streams.serve(ticket.req_id.clone(), ticket.id);
            }
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
            if ticket.stream {
                self.streams.unserve(&ticket.req_id);
            }
            // A stream's items are not kept: a repeat of an ended stream
            // is told so, never given its end alone as if it were empty.
            let remembered = if ticket.stream {
                codec::error(
                    &ticket.req_id,
                    ErrorCode::Duplicate,
                    "this stream has ended; its items are not kept",
                )
            } else {
                frame.clone()
            };
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
                ledger.complete(&ticket.req_id, ticket.route, ticket.epoch, remembered, now);
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
        if ticket.stream {
            self.streams.unserve(&ticket.req_id);
        }
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

    pub(crate) fn core(d: &Dispatcher, now: Instant) -> SessionCore<u32, Job, u32> {
        SessionCore::new(
            REMOTE,
            Hellos {
                v1: Bytes::from_static(b"our hello"),
                v2: Bytes::from_static(b"our hello, v2"),
                v3: Bytes::from_static(b"our hello, v3"),
                differ: false,
            },
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

    fn sent(c: &mut SessionCore<u32, Job, u32>) -> Vec<Frame> {
        let mut frames = Vec::new();
        c.transmit::<()>(usize::MAX, |r| {
            frames.push(decode_frame(r).unwrap().to_frame().unwrap());
            Ok(())
        })
        .unwrap();
        frames
    }

    fn open(d: &Dispatcher, now: Instant) -> SessionCore<u32, Job, u32> {
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

    fn runs(c: &mut SessionCore<u32, Job, u32>) -> Vec<(Ticket, Job)> {
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
        // No answer can come any more: the call fails at the close.
        assert!(matches!(c.poll_event(), Some(Event::Lost(1))));
        assert_eq!(c.pending_calls(), 0);
        assert!(c.end(End::Lost("gone".into())).is_empty());
        assert!(c.is_ended());
    }

    #[test]
    fn a_protocol_error_fails_our_calls_and_streams_at_once() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = core(&d, now);
        // Our (made-up) hello goes first.
        c.transmit::<()>(usize::MAX, |_| Ok(())).unwrap();
        c.handle_record(now, crate::fuzzing::peer_hello_v2(REMOTE, 1), &d);
        assert!(matches!(c.poll_event(), Some(Event::Opened)));
        assert_eq!(c.version(), PROTOCOL_V2);
        c.call(ReqId::from_u64(1), control("app.t", "echo", "1", &"x"), 1)
            .unwrap();
        let w = Window {
            items: 2,
            bytes: 64,
        };
        c.open_stream(
            ReqId::from_u64(2),
            control("app.t", "gen", "2", &3),
            2,
            20,
            w,
        )
        .unwrap();
        sent(&mut c);
        // Three items for a window of two: the session closes.
        for _ in 0..3 {
            let mut item = Vec::new();
            capwire_envelope::encode_item(&mut item, &ReqId::from_u64(2), &[0x01]).unwrap();
            c.handle_record(now, item.into(), &d);
        }
        assert!(c.is_closing());
        let mut lost = Vec::new();
        let mut items = 0;
        while let Some(e) = c.poll_event() {
            match e {
                Event::Lost(w) => lost.push(w),
                Event::Item(20, _) => items += 1,
                other => panic!("{other:?}"),
            }
        }
        lost.sort_unstable();
        assert_eq!((lost, items), (vec![1, 2], 2));
        assert_eq!(c.pending_calls(), 0);
        assert_eq!(c.streams(), (0, 0));
        let frames = sent(&mut c);
        assert!(
            matches!(frames.last(), Some(Frame::Close(x)) if x.code == CloseCode::ProtocolError)
        );
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

    /// The first hello of a peer that speaks protocol 2 (its manifest has
    /// `core.protocol` 2.0.0) and serves no stream verb.
    fn peer_hello_v2() -> Bytes {
        use capwire_manifest::{
            CORE_PROTOCOL, MonitoringHandlers, MonitoringStatus, NodeInfo, ProtocolVersions,
            Registry, Version,
        };
        let manifest = Registry::builder(
            NodeInfo::new(REMOTE, "peer"),
            MonitoringHandlers {
                bind: (),
                disable: (),
            },
        )
        .core_capability(
            capwire_manifest::Capability::new(CORE_PROTOCOL, Version::new(2, 0, 0))
                .verb::<ProtocolVersions>(()),
        )
        .build()
        .unwrap()
        .manifest(MonitoringStatus::Off, 1);
        let hello = Frame::Hello(capwire_envelope::Hello::new(
            RawValue::encode(&manifest).unwrap(),
            WireLimits {
                max_record: 1 << 20,
                max_inflight: 8,
                keepalive_ms: 15_000,
            },
        ));
        let mut out = Vec::new();
        capwire_envelope::encode_frame(&hello, &mut out).unwrap();
        out.into()
    }

    #[test]
    fn an_item_is_copied_out_of_its_record() {
        let d = dispatcher();
        let now = Instant::now();
        let mut c = core(&d, now);
        c.transmit::<()>(usize::MAX, |_| Ok(())).unwrap();
        c.handle_record(now, peer_hello_v2(), &d);
        assert!(matches!(c.poll_event(), Some(Event::Opened)));
        assert_eq!(c.version(), PROTOCOL_V2);
        let id = ReqId::from_u64(3);
        c.open_stream(
            id.clone(),
            control("app.t", "gen", "3", &()),
            1,
            9,
            Window {
                items: 4,
                bytes: 1024,
            },
        )
        .unwrap();
        sent(&mut c);
        let mut record = Vec::new();
        capwire_envelope::encode_item(&mut record, &id, b"\x63abc").unwrap();
        let record = Bytes::from(record);
        let within = record.as_ptr() as usize..record.as_ptr() as usize + record.len();
        c.handle_record(now, record.clone(), &d);
        match c.poll_event() {
            Some(Event::Item(9, item)) => {
                assert_eq!(&item[..], b"\x63abc");
                // A buffered item must not keep the buffer the record was
                // read into alive: it holds its own bytes only.
                assert!(!within.contains(&(item.as_ptr() as usize)));
            }
            other => panic!("the item, got {other:?}"),
        }
        assert!(c.is_open());
    }
}
