//! Decode + dispatch on the session core, for the `session_records` fuzz
//! target (`fuzz/`) and its property-test twin (run by CI with the unit
//! tests). Not part of the API: compiled for tests and with the `fuzzing`
//! feature only.
//!
//! The input drives one session core as a hostile peer would: its first
//! byte picks a few options, the rest is a sequence of records, each a
//! 2-byte big-endian length and its bytes. The flags byte, bit by bit:
//!
//! | bit | option |
//! |---|---|
//! | 0 | the peer's valid hello comes first (its hellos, when 3 and 4 say protocol 2) |
//! | 1 | the peer is the bound control plane |
//! | 2 | calls of our own wait: our two streams (`open_stream`, windows of 2 items and 16 bytes, and 4 items and 1 KiB; req_ids `10`, `11`) on a version-2 session, then requests `0`, `1`, `2` as the bound on waiting calls allows |
//! | 3 | the peer speaks protocol 2 (`core.protocol` 2.0.0) |
//! | 4 | with 3, the peer has stream verbs: its first hello is the version-1 view, its whole manifest follows |
//! | 5 | our application never takes its streams' items (no credit beyond the window) |
//! | 6-7 | time passing after each record: 0, 1.5, 3 or 4.5 s |
//!
//! The harness plays our application (it takes items as they arrive,
//! unless bit 5) and the handlers of the peer's streams that we serve
//! (`app.t/gen`: as many items as its args say, at most 5, as credit
//! allows, then its end; `cancelled` at the peer's cancel). Whatever the
//! records, it checks that nothing panics, that every record the core
//! sends is a valid frame of the session's version (no `item` or `credit`
//! on a version-1 session), that no handler runs twice for the same
//! req_id, that no controller verb runs for a peer that is not the control
//! plane, that the send queue stays within its bound, that the streams we
//! serve never send more items or bytes than the peer granted them, that
//! our streams are never delivered more than we granted them (the window
//! and our grants), that each of our calls and streams ends exactly once
//! (answered, failed when the session closes, or at its end), and that,
//! while the session is open, every request-shaped frame (a stream's
//! included) gets exactly one answer.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_authz::{BindingState, Gate, SharedBinding};
use capwire_envelope::{
    ErrorBody, ErrorCode, Frame, FrameRef, Hello, Limits as WireLimits, NodeId, PROTOCOL_V2,
    RawValue, ReqId, decode_frame, encode_frame,
};
use capwire_manifest::{
    Capability, DeclaredClass, MonitoringHandlers, MonitoringStatus, NodeInfo, Registry, Version,
    verb,
};
use tokio_util::sync::CancellationToken;

use crate::dispatch::extract::Extensions;
use crate::dispatch::handler::{
    Handler, HandlerError, RouteEntry, RouteHandler, StreamHandler, StreamTyped, Typed,
};
use crate::dispatch::job::{self, Finished, Started};
use crate::dispatch::{Dispatcher, Job};
use crate::proto::ledger::{Ledger, LedgerLimits};
use crate::proto::session::{Event, ItemRefused, Refused, SessionCore, SessionLimits, Ticket};
use crate::proto::streams::Window;

verb! { pub struct Echo: request "app.t" / "echo", Bootstrap, String => String; }
verb! { pub struct Note: notification "app.t" / "note", Bootstrap, String; }
verb! { pub struct Admin: request "app.t" / "admin", Controller, String => String; }
verb! { pub struct Gen: stream "app.t" / "gen", Bootstrap, u32 => u32; }

async fn echo(s: String) -> Result<String, HandlerError> {
    Ok(s)
}

async fn note(_s: String) -> Result<(), HandlerError> {
    Ok(())
}

/// Never run: the harness plays the handler of the streams it serves.
async fn generate(n: u32, mut items: crate::Items<u32>) -> Result<(), HandlerError> {
    for i in 0..n {
        items.send(i).await?;
    }
    Ok(())
}

fn stream_route<V: capwire_manifest::StreamVerb, M: 'static, H: StreamHandler<V, M>>(
    h: H,
) -> RouteHandler {
    Arc::new(RouteEntry::new(StreamTyped::<V, M, H>::new(h)))
}

fn route<V: capwire_manifest::VerbDef, M: 'static, H: Handler<V, M>>(h: H) -> RouteHandler {
    Arc::new(RouteEntry::new(Typed::<V, M, H>::new(h)))
}

/// The node under test.
pub(crate) const LOCAL: NodeId = NodeId::from_bytes([1; 32]);
/// The peer.
pub(crate) const REMOTE: NodeId = NodeId::from_bytes([2; 32]);

fn registry() -> Arc<Registry<RouteHandler>> {
    static REGISTRY: OnceLock<Arc<Registry<RouteHandler>>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            let built = Registry::builder(
                NodeInfo::new(LOCAL, "test"),
                MonitoringHandlers {
                    bind: route::<Echo, (), _>(echo),
                    disable: route::<Echo, (), _>(echo),
                },
            )
            .capability(
                Capability::new("app.t", Version::new(1, 0, 0))
                    .verb::<Echo>(route::<Echo, (), _>(echo))
                    .verb::<Note>(route::<Note, (), _>(note))
                    .verb::<Admin>(route::<Admin, (), _>(echo))
                    .verb::<Gen>(stream_route::<Gen, (), _>(generate)),
            )
            .build();
            Arc::new(built.expect("the test registry builds"))
        })
        .clone()
}

/// A dispatcher over a small capability (`app.t`: `echo`, `note`,
/// `admin`), unbound.
#[cfg(test)]
pub(crate) fn dispatcher() -> Dispatcher {
    dispatcher_bound(None)
}

fn dispatcher_bound(controller: Option<NodeId>) -> Dispatcher {
    let binding = Arc::new(SharedBinding::new(BindingState::restore(controller)));
    let delegations = Arc::new(capwire_authz::Delegations::default());
    let authorities = Arc::new(crate::authority::Authorities::new(
        binding.clone(),
        delegations.clone(),
        Arc::default(),
    ));
    let made = Dispatcher::new(
        registry(),
        Gate::default(),
        binding,
        Ledger::new(LedgerLimits {
            window: Duration::from_secs(120),
            max_bytes: 1 << 24,
            sender_max_bytes: 1 << 20,
        }),
        Arc::new(Extensions::default()),
        Duration::from_secs(300),
        Arc::new(crate::tap::Tap::new(crate::tap::TapLimits {
            max_len: 16,
            max_bytes: 1 << 16,
            body_max: 1 << 10,
        })),
        delegations,
        authorities,
        Arc::new(crate::audit::AuditLog::off()),
    );
    made.expect("the test dispatcher builds")
}

/// Small bounds, so that inputs reach them.
pub(crate) fn limits() -> SessionLimits {
    SessionLimits {
        max_inflight: 2,
        max_pending_calls: 4,
        max_queued_bytes: 4096,
        max_parked_bytes: 512,
        max_record: 1 << 20,
        hello_timeout: Duration::from_secs(10),
        max_stream_window_bytes: 1 << 16,
    }
}

/// Our hellos, from a manifest of `node` at `epoch` with no stream verbs.
pub(crate) fn our_hellos(node: NodeId, epoch: u64) -> crate::proto::codec::Hellos {
    let hello = peer_hello(node, epoch);
    crate::proto::codec::Hellos {
        v1: hello.clone(),
        v2: hello.clone(),
        v3: hello,
        differ: false,
    }
}

/// A valid hello from `node` at `epoch`.
pub(crate) fn peer_hello(node: NodeId, epoch: u64) -> Bytes {
    hello_of(&peer_manifest(node, epoch, Speaks::V1), 1)
}

/// A valid first hello from a peer of `node` at `epoch` that speaks
/// protocol 2: its manifest lists `core.protocol` 2.0.0 and no stream
/// verb, so the session opens with it, at version 2.
#[cfg(test)]
pub(crate) fn peer_hello_v2(node: NodeId, epoch: u64) -> Bytes {
    hello_of(&peer_manifest(node, epoch, Speaks::V2), 1)
}

/// What a peer of the fuzzed core speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// Protocol 1: no `core.protocol`.
    V1,
    /// Protocol 2, no stream verb of its own.
    V2,
    /// Protocol 2 and a stream verb of its own: its first hello is the
    /// version-1 view, its whole manifest follows in a hello naming
    /// protocol 2.
    V2WithStreams,
}

verb! { pub struct Feed: stream "app.p" / "feed", Bootstrap, u32 => u32; }

fn peer_manifest(node: NodeId, epoch: u64, speaks: Speaks) -> capwire_manifest::Manifest {
    let mut b = Registry::builder(
        NodeInfo::new(node, "peer"),
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    );
    if speaks != Speaks::V1 {
        b = b.core_capability(
            Capability::new(capwire_manifest::CORE_PROTOCOL, Version::new(2, 0, 0))
                .verb::<capwire_manifest::ProtocolVersions>(()),
        );
    }
    if speaks == Speaks::V2WithStreams {
        b = b.capability(Capability::new("app.p", Version::new(1, 0, 0)).verb::<Feed>(()));
    }
    b.build()
        .expect("the test manifest builds")
        .manifest(MonitoringStatus::Off, epoch)
}

/// A hello record naming `protocol`, with `manifest`.
fn hello_of(manifest: &capwire_manifest::Manifest, protocol: u32) -> Bytes {
    let hello = Frame::Hello(Hello {
        protocol,
        manifest: RawValue::encode(manifest).expect("the test manifest encodes"),
        limits: WireLimits {
            max_record: 1 << 20,
            max_inflight: 8,
            keepalive_ms: 15_000,
        },
    });
    let mut out = Vec::new();
    encode_frame(&hello, &mut out).expect("the test hello encodes");
    out.into()
}

/// Options taken from the first byte of an input.
struct Options {
    hello_first: bool,
    bound: bool,
    calls: bool,
    /// The peer's manifest lists `core.protocol` 2.0.0: the session may
    /// speak protocol 2.
    v2: bool,
    /// With `v2`: the peer has stream verbs of its own (its first hello is
    /// the version-1 view, its whole manifest follows).
    peer_streams: bool,
    /// Our application never takes the items of our streams (so no credit
    /// is granted beyond the window).
    slow: bool,
    tick: Duration,
}

impl Options {
    fn of(flags: u8) -> Self {
        Self {
            hello_first: flags & 1 != 0,
            bound: flags & 2 != 0,
            calls: flags & 4 != 0,
            v2: flags & 8 != 0,
            peer_streams: flags & 16 != 0,
            slow: flags & 32 != 0,
            tick: Duration::from_millis(u64::from(flags >> 6) * 1500),
        }
    }
}

/// Our streams' req_ids (and their sinks), and their windows.
const OUR_STREAMS: [(u64, Window); 2] = [
    (
        10,
        Window {
            items: 2,
            bytes: 16,
        },
    ),
    (
        11,
        Window {
            items: 4,
            bytes: 1024,
        },
    ),
];

/// How many items a served `gen` stream sends at most.
const MAX_GEN_ITEMS: u32 = 5;

/// A stream of the peer's that we serve: the harness plays its handler.
struct ServedStream {
    ticket: Ticket,
    /// Items it sends before it ends.
    target: u32,
    sent: u32,
}

/// What the core said, for the checks.
#[derive(Default)]
struct Seen {
    runs: HashMap<ReqId, usize>,
    answers: usize,
    requests_while_open: usize,
    /// Credit the peer granted the streams we serve, while we served them
    /// (capped as the core caps it), and the items and bytes we sent.
    granted: HashMap<ReqId, (u64, u64)>,
    spent: HashMap<ReqId, (u64, u64)>,
    /// Credit we granted our own streams (the window included), and the
    /// items and bytes of them delivered to our application.
    our_credit: HashMap<ReqId, (u64, u64)>,
    delivered: HashMap<ReqId, (u64, u64)>,
    /// Our calls (and streams) not ended yet; each ends once.
    waiting: Vec<u64>,
}

/// One session core, and the harness around it playing our application
/// and the handlers of the streams we serve.
struct Harness {
    core: SessionCore<u64, Job, u64>,
    d: Dispatcher,
    opts: Options,
    seen: Seen,
    served: Vec<ServedStream>,
    now: Instant,
}

fn add_capped(slot: &mut (u64, u64), items: u64, bytes: u64) {
    slot.0 = (slot.0 + items).min(u64::from(u32::MAX));
    slot.1 = (slot.1 + bytes).min(u64::from(u32::MAX));
}

impl Harness {
    fn run_events(&mut self) {
        let parent = CancellationToken::new();
        let mut task = Context::from_waker(Waker::noop());
        let mut finished: Vec<(Ticket, Result<RawValue, ErrorBody>)> = Vec::new();
        loop {
            let mut any = false;
            while let Some(event) = self.core.poll_event() {
                any = true;
                match event {
                    Event::Run(ticket, job) => {
                        check_job(&job, self.opts.bound, &mut self.seen);
                        if ticket.is_stream() {
                            assert!(
                                self.core.version() >= PROTOCOL_V2,
                                "a stream served on a version-1 session"
                            );
                            // The harness is the handler: it sends a few
                            // items as credit allows, then ends.
                            match job.args.decode::<u32>() {
                                Ok(n) => self.served.push(ServedStream {
                                    ticket,
                                    target: n.min(MAX_GEN_ITEMS),
                                    sent: 0,
                                }),
                                Err(e) => finished.push((
                                    ticket,
                                    Err(ErrorBody::new(ErrorCode::BadArgs, e.to_string())),
                                )),
                            }
                            continue;
                        }
                        let f = match job::start(
                            &self.d,
                            &job,
                            REMOTE,
                            &parent,
                            self.now,
                            crate::dispatch::extract::Channel {
                                reply_room: 1 << 20,
                                version: self.core.version(),
                            },
                            None,
                            &mut task,
                        ) {
                            Started::Done(f) => f,
                            // A handler that waits is cancelled at once.
                            Started::Waiting { .. } => Finished::cancelled(),
                        };
                        finished.push((ticket, f.result));
                    }
                    Event::Cancel(id) => {
                        if let Some(i) = self.served.iter().position(|s| s.ticket.id == id) {
                            let s = self.served.swap_remove(i);
                            finished.push((s.ticket, Err(cancelled())));
                        }
                    }
                    Event::Reply(w, _) | Event::Lost(w) => self.ended(w),
                    Event::Item(sink, item) => {
                        let req = ReqId::from_u64(sink);
                        let d = self.seen.delivered.entry(req.clone()).or_default();
                        d.0 += 1;
                        d.1 += item.len() as u64;
                        let granted = self.seen.our_credit.get(&req).copied().unwrap_or_default();
                        assert!(
                            d.0 <= granted.0 && d.1 <= granted.1,
                            "our stream {}: {d:?} delivered with {granted:?} granted",
                            req.as_str()
                        );
                        if !self.opts.slow {
                            self.core.taken(&req, 1, item.len() as u64);
                        }
                    }
                    Event::Opened
                    | Event::ManifestChanged
                    | Event::Finished(_)
                    | Event::Credit(_) => {}
                }
            }
            for (ticket, result) in finished.drain(..) {
                self.core.finish(ticket, &result, self.now);
            }
            if !any {
                return;
            }
        }
    }

    /// One of our calls ended: exactly once.
    fn ended(&mut self, w: u64) {
        let Some(i) = self.seen.waiting.iter().position(|x| *x == w) else {
            panic!("our call {w} ended twice, or was never made");
        };
        self.seen.waiting.swap_remove(i);
    }

    /// Each served stream tries to send its next item; one that sent all
    /// of its items, or cannot go on, ends.
    fn produce(&mut self) {
        let mut i = 0;
        while i < self.served.len() {
            let s = &mut self.served[i];
            let end = if s.sent >= s.target {
                Some(Ok(RawValue::null()))
            } else {
                let (frame, len) =
                    crate::proto::codec::item_of(s.ticket.req_id(), &s.sent).expect("an item");
                match self.core.send_item(s.ticket.req_id(), frame, len) {
                    Ok(()) => {
                        s.sent += 1;
                        None
                    }
                    Err(ItemRefused::NoCredit | ItemRefused::Full) => None,
                    Err(ItemRefused::TooLarge) => Some(Err(ErrorBody::new(
                        ErrorCode::TooLarge,
                        "larger than the window",
                    ))),
                    Err(ItemRefused::Closed | ItemRefused::Unauthorized) => Some(Err(cancelled())),
                }
            };
            match end {
                Some(result) => {
                    let s = self.served.swap_remove(i);
                    self.core.finish(s.ticket, &result, self.now);
                }
                None => i += 1,
            }
        }
    }

    fn transmit(&mut self) {
        let version = self.core.version();
        let seen = &mut self.seen;
        let sent = self.core.transmit::<()>(usize::MAX, |record| {
            let frame = match decode_frame(record) {
                Ok(f) => f,
                Err(e) => panic!("the core sent a frame that does not decode: {e}"),
            };
            assert!(
                frame.kind().since() <= version,
                "a {} frame on a version-{version} session",
                frame.kind()
            );
            match frame {
                FrameRef::Response(_) => seen.answers += 1,
                FrameRef::Item(i) => {
                    let spent = seen.spent.entry(i.req_id.clone()).or_default();
                    spent.0 += 1;
                    spent.1 += i.item.len() as u64;
                    let granted = seen.granted.get(&i.req_id).copied().unwrap_or_default();
                    assert!(
                        spent.0 <= granted.0 && spent.1 <= granted.1,
                        "served stream {}: sent {spent:?} with {granted:?} granted",
                        i.req_id.as_str()
                    );
                }
                FrameRef::Credit(c) => {
                    let ours = seen.our_credit.entry(c.req_id.clone()).or_default();
                    add_capped(ours, u64::from(c.items), u64::from(c.bytes));
                }
                _ => {}
            }
            Ok(())
        });
        assert!(sent.is_ok());
    }

    /// Handles one record of the peer's, then lets everything it caused
    /// happen.
    fn record(&mut self, record: Bytes) {
        let open = self.core.is_open();
        let decoded = decode_frame(&record);
        let request_shaped = matches!(
            decoded,
            Ok(FrameRef::Control(ref c)) if !c.req_id.is_fire_and_forget()
        );
        // A grant counts for a stream we serve at this moment.
        if let Ok(FrameRef::Credit(c)) = &decoded
            && self.core.is_open()
            && self.served.iter().any(|s| s.ticket.req_id() == &c.req_id)
        {
            let g = self.seen.granted.entry(c.req_id.clone()).or_default();
            add_capped(g, u64::from(c.items), u64::from(c.bytes));
        }
        self.core.handle_record(self.now, record, &self.d);
        if open && request_shaped {
            self.seen.requests_while_open += 1;
        }
        self.settle();
        let bound = limits().max_queued_bytes + 2 * 4096;
        assert!(
            self.core.queued_bytes() <= bound,
            "the send queue holds {} bytes",
            self.core.queued_bytes()
        );
        let (served, opened) = self.core.streams();
        assert!(served <= limits().max_inflight && opened <= OUR_STREAMS.len());
    }

    fn settle(&mut self) {
        for _ in 0..4 {
            self.run_events();
            self.produce();
            self.transmit();
        }
        self.run_events();
        self.transmit();
    }
}

fn cancelled() -> ErrorBody {
    ErrorBody::new(ErrorCode::Cancelled, "cancelled: the request was cancelled")
}

fn check_job(job: &Job, bound: bool, seen: &mut Seen) {
    assert!(
        bound || job.permit.class() != DeclaredClass::Controller,
        "a controller verb ran for a peer that is not the control plane"
    );
    if job.is_request() {
        let n = seen.runs.entry(job.req_id.clone()).or_insert(0);
        *n += 1;
        assert_eq!(*n, 1, "a handler ran twice for {:?}", job.req_id);
    }
}

/// Runs one input through a session core; panics when a property breaks.
pub fn session_records(data: &[u8]) {
    run(data);
}

/// What an input made the core do, for the tests that check that inputs
/// reach the stream paths.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Reached {
    version: u32,
    /// Items of the streams we serve that went out.
    items_sent: u64,
    /// Items of our streams delivered to our application.
    items_delivered: u64,
    /// Why the session ended.
    end: Option<crate::proto::session::End>,
}

fn run(data: &[u8]) -> Reached {
    let Some((&flags, mut rest)) = data.split_first() else {
        return Reached::default();
    };
    let opts = Options::of(flags);
    let d = dispatcher_bound(opts.bound.then_some(REMOTE));
    let now = Instant::now();
    let core: SessionCore<u64, Job, u64> = SessionCore::new(
        REMOTE,
        our_hellos(LOCAL, 1),
        limits(),
        d.ledger().partition(REMOTE),
        now,
    );
    let mut h = Harness {
        core,
        d,
        opts,
        seen: Seen::default(),
        served: Vec::new(),
        now,
    };
    if h.opts.hello_first {
        let speaks = match (h.opts.v2, h.opts.peer_streams) {
            (false, _) => Speaks::V1,
            (true, false) => Speaks::V2,
            (true, true) => Speaks::V2WithStreams,
        };
        let whole = peer_manifest(REMOTE, 1, speaks);
        let view = whole.version_1_view();
        h.core.handle_record(now, hello_of(&view, 1), &h.d);
        if view.is_partial_view() {
            assert!(
                !h.core.is_open(),
                "a partial view does not open the session"
            );
            h.core
                .handle_record(now, hello_of(&whole, PROTOCOL_V2), &h.d);
        }
        assert!(h.core.is_open());
        assert_eq!(h.core.version(), if h.opts.v2 { PROTOCOL_V2 } else { 1 });
    }
    if h.opts.calls && h.core.is_open() {
        // Our streams first (on a version-2 session), then our requests,
        // as many as the bound on waiting calls lets through.
        for (n, window) in OUR_STREAMS {
            let req = ReqId::from_u64(n);
            let frame =
                crate::proto::codec::control("app.p", "feed", &req, None, &RawValue::null(), None)
                    .expect("a stream frame encodes");
            match h.core.open_stream(req, frame, n, n, window) {
                Ok(()) => h.seen.waiting.push(n),
                Err(Refused::Unsupported) => assert!(!h.opts.v2, "refused on a version-2 session"),
                Err(other) => panic!("stream {n} refused: {other:?}"),
            }
        }
        for n in 0..3u64 {
            let req = ReqId::from_u64(n);
            let frame =
                crate::proto::codec::control("app.x", "y", &req, None, &RawValue::null(), None)
                    .expect("a call frame encodes");
            if h.core.call(req, frame, n).is_ok() {
                h.seen.waiting.push(n);
            }
        }
    }
    h.transmit();
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let record = Bytes::copy_from_slice(&rest[2..2 + len]);
        rest = &rest[2 + len..];
        h.record(record);
        h.now += h.opts.tick;
        h.core.handle_timeout(h.now);
        h.settle();
    }
    // The streams we serve end now, each with its one response.
    for s in std::mem::take(&mut h.served) {
        h.core.finish(s.ticket, &Ok(RawValue::null()), h.now);
    }
    h.settle();
    if h.core.is_open() {
        assert_eq!(
            h.seen.answers, h.seen.requests_while_open,
            "every request-shaped frame gets exactly one answer while the session is open"
        );
    }
    let version = h.core.version();
    let end = h.core.end_reason().cloned();
    for w in h.core.end(crate::proto::session::End::Lost("done".into())) {
        h.ended(w);
    }
    assert!(
        h.seen.waiting.is_empty(),
        "our calls {:?} never ended",
        h.seen.waiting
    );
    Reached {
        version,
        items_sent: h.seen.spent.values().map(|s| s.0).sum(),
        items_delivered: h.seen.delivered.values().map(|d| d.0).sum(),
        end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capwire_envelope::{CloseCode, encode_control};
    use proptest::prelude::*;

    /// A record that is mostly a well-formed control frame, with names and
    /// ids from small sets so that repeats, duplicates and kind mismatches
    /// happen often.
    fn control_record() -> impl Strategy<Value = Vec<u8>> {
        let caps = prop_oneof!["app.t", "core.monitoring", "app.nope", "", "App.t"];
        let verbs = prop_oneof![
            "echo", "note", "admin", "gen", "bind", "disable", "Echo", ""
        ];
        let ids = prop_oneof![Just(String::new()), "[a-c]", "[0-9]{1,2}"];
        (caps, verbs, ids, any::<Option<u8>>(), "[a-z]{0,8}").prop_map(
            |(cap, verb, id, budget, text)| {
                let req = ReqId::try_from(id.as_str()).unwrap_or(ReqId::EMPTY);
                let mut out = Vec::new();
                let args = RawValue::encode(&text).unwrap_or_default();
                let _ = encode_control(
                    &mut out,
                    &cap,
                    &verb,
                    &req,
                    budget.map(u64::from),
                    args.as_bytes(),
                );
                out
            },
        )
    }

    /// The req_ids of stream frames: the peer's (which may be streams we
    /// serve), our requests' (0..=2), our streams' (10, 11), others.
    fn stream_id() -> impl Strategy<Value = ReqId> {
        prop_oneof![
            "[a-c]",
            "[0-9]{1,2}",
            Just("10".to_owned()),
            Just("11".to_owned())
        ]
        .prop_map(|s| ReqId::try_from(s.as_str()).expect("a valid id"))
    }

    /// Counts that reach the bounds: none, a few, a window's worth, the
    /// most a frame carries.
    fn count() -> impl Strategy<Value = u32> {
        prop_oneof![Just(0), 1..4u32, Just(16), Just(1024), Just(u32::MAX)]
    }

    /// An `item` or `credit` frame (protocol 2), or a cancel.
    fn stream_record() -> impl Strategy<Value = Vec<u8>> {
        let item = (stream_id(), "[a-z]{0,40}").prop_map(|(id, text)| {
            let mut out = Vec::new();
            let raw = RawValue::encode(&text).unwrap_or_default();
            capwire_envelope::encode_item(&mut out, &id, raw.as_bytes()).expect("an item");
            out
        });
        let credit = (stream_id(), count(), count()).prop_map(|(id, items, bytes)| {
            let mut out = Vec::new();
            capwire_envelope::encode_credit(&mut out, &id, items, bytes).expect("a credit");
            out
        });
        let cancel = stream_id().prop_map(|id| {
            let mut out = Vec::new();
            capwire_envelope::encode_cancel(&mut out, &id).expect("a cancel");
            out
        });
        let response = stream_id().prop_map(|id| {
            let mut out = Vec::new();
            capwire_envelope::encode_response_ok(&mut out, &id, &[0xf6]).expect("a response");
            out
        });
        prop_oneof![3 => item, 3 => credit, 1 => cancel, 1 => response]
    }

    /// A stream call of `app.t/gen` with a count as args (so it runs).
    fn gen_record() -> impl Strategy<Value = Vec<u8>> {
        ("[a-c]|[0-9]{1,2}", 0..8u32).prop_map(|(id, n)| {
            let req = ReqId::try_from(id.as_str()).expect("a valid id");
            let mut out = Vec::new();
            let args = RawValue::encode(&n).expect("a count");
            encode_control(&mut out, "app.t", "gen", &req, None, args.as_bytes())
                .expect("a control frame");
            out
        })
    }

    /// Hellos: of protocol 1, of protocol 2 (a first one, a partial view,
    /// the whole manifest), at a few epochs.
    fn hello_record() -> impl Strategy<Value = Vec<u8>> {
        (0..5u8, 1..4u64).prop_map(|(kind, epoch)| {
            let hello = match kind {
                0 => peer_hello(REMOTE, epoch),
                1 => peer_hello_v2(REMOTE, epoch),
                2 => hello_of(
                    &peer_manifest(REMOTE, epoch, Speaks::V2WithStreams).version_1_view(),
                    1,
                ),
                3 => hello_of(
                    &peer_manifest(REMOTE, epoch, Speaks::V2WithStreams),
                    PROTOCOL_V2,
                ),
                // Stream verbs in a hello naming protocol 1: refused.
                _ => hello_of(&peer_manifest(REMOTE, epoch, Speaks::V2WithStreams), 1),
            };
            hello.to_vec()
        })
    }

    fn record() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => control_record(),
            3 => gen_record(),
            5 => stream_record(),
            1 => proptest::collection::vec(any::<u8>(), 0..64),
            1 => hello_record(),
            1 => Just(vec![0xa2, 0x64, b't', b'y', b'p', b'e', 0x66, b'c', b'a', b'n', b'c', b'e', b'l']),
        ]
    }

    fn input() -> impl Strategy<Value = Vec<u8>> {
        (any::<u8>(), proptest::collection::vec(record(), 0..24)).prop_map(|(flags, records)| {
            let mut data = vec![flags];
            for r in records {
                let len = u16::try_from(r.len()).unwrap_or(u16::MAX);
                data.extend_from_slice(&len.to_be_bytes());
                data.extend_from_slice(&r[..usize::from(len)]);
            }
            data
        })
    }

    /// An input as the target reads it: the flags byte, then each record
    /// with its 2-byte length.
    fn input_of(flags: u8, records: &[Vec<u8>]) -> Vec<u8> {
        let mut data = vec![flags];
        for r in records {
            data.extend_from_slice(&u16::try_from(r.len()).unwrap().to_be_bytes());
            data.extend_from_slice(r);
        }
        data
    }

    fn open(id: &str, n: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let args = RawValue::encode(&n).unwrap();
        encode_control(
            &mut out,
            "app.t",
            "gen",
            &ReqId::try_from(id).unwrap(),
            None,
            args.as_bytes(),
        )
        .unwrap();
        out
    }

    fn credit(id: &str, items: u32, bytes: u32) -> Vec<u8> {
        let mut out = Vec::new();
        capwire_envelope::encode_credit(&mut out, &ReqId::try_from(id).unwrap(), items, bytes)
            .unwrap();
        out
    }

    fn item(id: &str, text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let raw = RawValue::encode(text).unwrap();
        capwire_envelope::encode_item(&mut out, &ReqId::try_from(id).unwrap(), raw.as_bytes())
            .unwrap();
        out
    }

    /// Hello first, our calls and streams, a version-2 peer.
    const V2_CALLS: u8 = 1 | 4 | 8;

    /// The seed `fuzz/seeds/session_records/v2_streams`: a stream we
    /// serve, given credit for its 3 items; our two streams fed (stream 10
    /// has a window of 2 items and 16 bytes), then an item larger than
    /// any credit stream 10 can hold (`protocol_error`).
    fn v2_streams_seed() -> Vec<u8> {
        input_of(
            V2_CALLS,
            &[
                open("a", 3),
                credit("a", 2, 64),
                item("10", "x"),
                item("11", "y"),
                credit("a", 1, 64),
                item("10", "z"),
                item("10", "w"),
                item("10", "longer than the window"),
            ],
        )
    }

    #[test]
    fn the_v2_seed_is_the_one_in_the_fuzz_seeds() {
        let seed = include_bytes!("../fuzz/seeds/session_records/v2_streams");
        assert_eq!(&seed[..], &v2_streams_seed()[..]);
    }

    #[test]
    fn inputs_reach_the_stream_paths_both_ways() {
        // Served: 3 items within 3 granted; ours: 4 delivered, stream 10's
        // window granted again as its items are taken, then its long item
        // beyond the bytes.
        let r = run(&v2_streams_seed());
        assert_eq!(r.version, PROTOCOL_V2);
        assert_eq!(r.items_sent, 3, "{r:?}");
        assert_eq!(r.items_delivered, 4, "{r:?}");
        assert!(
            matches!(&r.end, Some(crate::proto::session::End::Local(CloseCode::ProtocolError, why)) if why.contains("beyond the credit")),
            "{r:?}"
        );
        // The same with a slow application: no grant beyond the window,
        // so the third item of stream 10 is already beyond it.
        let mut slow = v2_streams_seed();
        slow[0] |= 32;
        let r = run(&slow);
        assert_eq!(r.items_delivered, 3, "{r:?}");
        assert!(matches!(
            r.end,
            Some(crate::proto::session::End::Local(
                CloseCode::ProtocolError,
                _
            ))
        ));
        // A peer with stream verbs of its own: a partial view, then its
        // whole manifest.
        let mut peer_streams = v2_streams_seed();
        peer_streams[0] |= 16;
        assert_eq!(run(&peer_streams).version, PROTOCOL_V2);
        // Version 1: a credit frame is a protocol error, nothing is served.
        let r = run(&input_of(1 | 4, &[open("a", 3), credit("a", 2, 64)]));
        assert_eq!((r.version, r.items_sent), (1, 0));
        assert!(matches!(
            r.end,
            Some(crate::proto::session::End::Local(
                CloseCode::ProtocolError,
                _
            ))
        ));
        // An item for one of our requests.
        let r = run(&input_of(V2_CALLS, &[item("0", "x")]));
        assert!(
            matches!(&r.end, Some(crate::proto::session::End::Local(CloseCode::ProtocolError, why)) if why.contains("not a stream")),
            "{r:?}"
        );
        // Credit beyond 2^32-1 held, and items for streams that are not
        // there: no error.
        let r = run(&input_of(
            V2_CALLS,
            &[
                open("b", 2),
                credit("b", u32::MAX, u32::MAX),
                credit("b", u32::MAX, u32::MAX),
                item("nope", "x"),
                credit("nope", 1, 1),
            ],
        ));
        assert_eq!((r.items_sent, r.end), (2, None));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The twin of the `session_records` fuzz target, on structured inputs.
        #[test]
        fn session_core_keeps_its_promises_on_structured_input(data in input()) {
            session_records(&data);
        }

        /// The same on raw bytes.
        #[test]
        fn session_core_keeps_its_promises_on_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            session_records(&data);
        }
    }
}
