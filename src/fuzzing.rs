//! Decode + dispatch on the session core, for the `session_records` fuzz
//! target (`fuzz/`) and its property-test twin (run by CI with the unit
//! tests). Not part of the API: compiled for tests and with the `fuzzing`
//! feature only.
//!
//! The input drives one session core as a hostile peer would: its first
//! byte picks a few options (send a valid hello first, be the bound control
//! plane, have calls of our own waiting, let time pass), the rest is a
//! sequence of records, each a 2-byte big-endian length and its bytes.
//! Whatever the records, it checks that nothing panics, that every record
//! the core sends is a valid frame, that no handler runs twice for the same
//! req_id, that no controller verb runs for a peer that is not the control
//! plane, that the send queue stays within its bound, and that, while the
//! session is open, every request-shaped frame gets exactly one answer.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_authz::{BindingState, Gate, SharedBinding};
use capwire_envelope::{
    Frame, FrameRef, Hello, Limits as WireLimits, NodeId, RawValue, ReqId, decode_frame,
    encode_frame,
};
use capwire_manifest::{
    Capability, DeclaredClass, MonitoringHandlers, MonitoringStatus, NodeInfo, Registry, Version,
    verb,
};
use tokio_util::sync::CancellationToken;

use crate::dispatch::extract::Extensions;
use crate::dispatch::handler::{Handler, HandlerError, RouteEntry, RouteHandler, Typed};
use crate::dispatch::job::{self, Finished, Started};
use crate::dispatch::{Dispatcher, Job};
use crate::proto::ledger::{Ledger, LedgerLimits};
use crate::proto::session::{Event, SessionCore, SessionLimits, Ticket};

verb! { pub struct Echo: request "app.t" / "echo", Bootstrap, String => String; }
verb! { pub struct Note: notification "app.t" / "note", Bootstrap, String; }
verb! { pub struct Admin: request "app.t" / "admin", Controller, String => String; }

async fn echo(s: String) -> Result<String, HandlerError> {
    Ok(s)
}

async fn note(_s: String) -> Result<(), HandlerError> {
    Ok(())
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
                    .verb::<Admin>(route::<Admin, (), _>(echo)),
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
    let made = Dispatcher::new(
        registry(),
        Gate::default(),
        Arc::new(SharedBinding::new(BindingState::restore(controller))),
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
        v2: hello,
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
    tick: Duration,
}

/// What the core said, for the checks.
#[derive(Default)]
struct Seen {
    runs: HashMap<ReqId, usize>,
    answers: usize,
    requests_while_open: usize,
}

fn run_events(
    core: &mut SessionCore<u64, Job, u64>,
    d: &Dispatcher,
    now: Instant,
    bound: bool,
    seen: &mut Seen,
) {
    let parent = CancellationToken::new();
    let mut task = Context::from_waker(Waker::noop());
    let mut finished: Vec<(Ticket, Finished)> = Vec::new();
    loop {
        let mut any = false;
        while let Some(event) = core.poll_event() {
            any = true;
            if let Event::Run(ticket, job) = event {
                check_job(&job, bound, seen);
                let f = match job::start(
                    d,
                    &job,
                    REMOTE,
                    &parent,
                    now,
                    crate::dispatch::extract::Channel {
                        reply_room: 1 << 20,
                        version: 1,
                    },
                    None,
                    &mut task,
                ) {
                    Started::Done(f) => f,
                    // A handler that waits is cancelled at once.
                    Started::Waiting { .. } => Finished::cancelled(),
                };
                finished.push((ticket, f));
            }
        }
        for (ticket, f) in finished.drain(..) {
            core.finish(ticket, &f.result, now);
        }
        if !any {
            return;
        }
    }
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

fn transmit(core: &mut SessionCore<u64, Job, u64>, seen: &mut Seen) {
    let sent = core.transmit::<()>(usize::MAX, |record| {
        let frame = match decode_frame(record) {
            Ok(f) => f,
            Err(e) => panic!("the core sent a frame that does not decode: {e}"),
        };
        if matches!(frame, FrameRef::Response(_)) {
            seen.answers += 1;
        }
        Ok(())
    });
    assert!(sent.is_ok());
}

/// Runs one input through a session core; panics when a property breaks.
pub fn session_records(data: &[u8]) {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let opts = Options {
        hello_first: flags & 1 != 0,
        bound: flags & 2 != 0,
        calls: flags & 4 != 0,
        tick: Duration::from_millis(u64::from(flags >> 3) * 500),
    };
    let d = dispatcher_bound(opts.bound.then_some(REMOTE));
    let mut now = Instant::now();
    let mut core: SessionCore<u64, Job, u64> = SessionCore::new(
        REMOTE,
        our_hellos(LOCAL, 1),
        limits(),
        d.ledger().partition(REMOTE),
        now,
    );
    let mut seen = Seen::default();
    if opts.hello_first {
        core.handle_record(now, peer_hello(REMOTE, 1), &d);
    }
    if opts.calls && core.is_open() {
        for n in 0..3u64 {
            let req = ReqId::from_u64(n);
            let frame = crate::proto::codec::control("app.x", "y", &req, None, &RawValue::null())
                .expect("a call frame encodes");
            let _ = core.call(req, frame, n);
        }
    }
    transmit(&mut core, &mut seen);
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let record = Bytes::copy_from_slice(&rest[2..2 + len]);
        rest = &rest[2 + len..];
        let open = core.is_open();
        let request_shaped = matches!(
            decode_frame(&record),
            Ok(FrameRef::Control(c)) if !c.req_id.is_fire_and_forget()
        );
        core.handle_record(now, record, &d);
        if open && request_shaped {
            seen.requests_while_open += 1;
        }
        run_events(&mut core, &d, now, opts.bound, &mut seen);
        let bound = limits().max_queued_bytes + 2 * 4096;
        assert!(
            core.queued_bytes() <= bound,
            "the send queue holds {} bytes",
            core.queued_bytes()
        );
        transmit(&mut core, &mut seen);
        run_events(&mut core, &d, now, opts.bound, &mut seen);
        transmit(&mut core, &mut seen);
        now += opts.tick;
        core.handle_timeout(now);
    }
    if core.is_open() {
        assert_eq!(
            seen.answers, seen.requests_while_open,
            "every request-shaped frame gets exactly one answer while the session is open"
        );
    }
    let waiting = core.end(crate::proto::session::End::Lost("done".into()));
    assert!(waiting.len() <= 3);
}

#[cfg(test)]
mod tests {
    use super::*;
    use capwire_envelope::encode_control;
    use proptest::prelude::*;

    /// A record that is mostly a well-formed control frame, with names and
    /// ids from small sets so that repeats, duplicates and kind mismatches
    /// happen often.
    fn control_record() -> impl Strategy<Value = Vec<u8>> {
        let caps = prop_oneof!["app.t", "core.monitoring", "app.nope", "", "App.t"];
        let verbs = prop_oneof!["echo", "note", "admin", "bind", "disable", "Echo", ""];
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

    fn record() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => control_record(),
            1 => proptest::collection::vec(any::<u8>(), 0..64),
            1 => Just(peer_hello(REMOTE, 2).to_vec()),
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
