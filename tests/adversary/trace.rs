//! Trace contexts (WIRE.md 2.2) from a hostile or older peer: a
//! malformed `traceparent`, all-zero ids, an oversize `tracestate` or one
//! of too many members, a `trace` item that is no map, and a valid
//! context on a protocol-2 session. Each is dropped and counted by its
//! reason (`NodeStats::trace_contexts_dropped`); the call is answered as
//! if it had none, and the session goes on. The other way, a node sends a
//! `trace` item only on a protocol-3 session: a peer of protocol 1 or 2
//! never sees the key, whatever context the node's call had.

use std::time::Duration;

use capwire::envelope::{FrameRef, NodeId, decode_frame};
use capwire::manifest::Manifest;
use capwire::trace::{MAX_TRACESTATE_LEN, MAX_TRACESTATE_MEMBERS, TraceContext};
use capwire::transport::{Endpoint, RecordReceiver, RecordSender};
use capwire::{ContactPolicy, Keypair, TransportConfig};

use crate::kit::arena::{Arena, Expect};
use crate::kit::cbor::{NULL, response_ok, text, tmap};
use crate::kit::ok_text;
use crate::kit::wire::{Speaks, args, hello_record_of, peer_manifest};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A control frame for `app.adv/echo` ("hi"), with `trace` as its trace
/// item when given.
fn echo(req_id: &str, trace: Option<Vec<u8>>) -> Vec<u8> {
    let mut fields = vec![
        ("type", text("control")),
        ("cap", text("app.adv")),
        ("verb", text("echo")),
        ("req_id", text(req_id)),
        ("budget_ms", crate::kit::cbor::uint(30_000)),
        ("args", text("hi")),
    ];
    if let Some(t) = trace {
        fields.push(("trace", t));
    }
    tmap(&fields)
}

/// A `trace` item of `traceparent` and, when given, `tracestate`.
fn context(traceparent: &str, tracestate: Option<&str>) -> Vec<u8> {
    match tracestate {
        None => tmap(&[("traceparent", text(traceparent))]),
        Some(s) => tmap(&[("traceparent", text(traceparent)), ("tracestate", text(s))]),
    }
}

/// The node's trace counters: (accepted, dropped by reason).
fn counted(a: &Arena) -> (u64, Vec<(&'static str, u64)>) {
    let s = a.node.stats();
    (s.trace_contexts_accepted, s.trace_contexts_dropped)
}

/// On a session of `speaks`, a call carrying `bad`: answered as if it had
/// no context, the context counted as dropped for `reason`. Then, on the
/// same session, a call with a valid context: answered too (the session
/// is up), and the context believed on protocol 3 (dropped for `version`
/// below it).
async fn dropped(a: &Arena, speaks: Speaks, bad: Vec<u8>, reason: &str) -> Expect {
    assert_eq!(counted(a), (0, vec![]), "nothing counted yet");
    let mut w = a.wire_speaking(&Keypair::generate().unwrap(), speaks).await;
    assert_eq!(w.version, speaks.max());
    w.send(&[&echo("bad", Some(bad))]).await;
    let r = w.response("bad").await;
    assert_eq!(ok_text(&r), "echo: hi", "the verb's own answer: {r:?}");
    assert_eq!(
        counted(a),
        (0, vec![(reason, 1)]),
        "dropped, and counted as {reason}"
    );

    w.send(&[&echo("good", Some(context(TRACEPARENT, Some("k=v"))))])
        .await;
    let r = w.response("good").await;
    assert_eq!(ok_text(&r), "echo: hi", "the session goes on: {r:?}");
    let expected = if speaks.max() >= 3 {
        (1, vec![(reason, 1)])
    } else {
        (0, vec![(reason, 2)])
    };
    assert_eq!(counted(a), expected);
    assert!(
        !w.ended && w.transport_close.is_none(),
        "the node kept the session"
    );
    Expect::runs(2)
}

/// A `traceparent` that breaks the W3C grammar (no flags field).
pub async fn a_malformed_traceparent_is_dropped_and_counted(a: Arena) -> Expect {
    let bad = context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None);
    dropped(&a, Speaks::V3, bad, "traceparent").await
}

/// A well-formed `traceparent` whose trace id is all zeros.
pub async fn an_all_zero_trace_id_is_dropped_and_counted(a: Arena) -> Expect {
    let bad = context(
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        None,
    );
    dropped(&a, Speaks::V3, bad, "zero_id").await
}

/// A `tracestate` of well-formed members, fewer than 32, longer than 512
/// bytes in all.
pub async fn an_oversize_tracestate_is_dropped_and_counted(a: Arena) -> Expect {
    let state = (0..30)
        .map(|i| format!("k{i}={}", "v".repeat(16)))
        .collect::<Vec<_>>()
        .join(",");
    assert!(state.len() > MAX_TRACESTATE_LEN);
    // Its members are good: the first 24 of them are believed.
    let fits = state.split(',').take(24).collect::<Vec<_>>().join(",");
    assert!(fits.len() <= MAX_TRACESTATE_LEN);
    assert!(TraceContext::parse(TRACEPARENT, Some(&fits)).is_ok());
    dropped(
        &a,
        Speaks::V3,
        context(TRACEPARENT, Some(&state)),
        "tracestate",
    )
    .await
}

/// A short `tracestate` of 33 well-formed members.
pub async fn a_tracestate_of_33_members_is_dropped_and_counted(a: Arena) -> Expect {
    let state = (0..=MAX_TRACESTATE_MEMBERS)
        .map(|i| format!("k{i}=v"))
        .collect::<Vec<_>>()
        .join(",");
    assert!(state.len() <= MAX_TRACESTATE_LEN);
    dropped(
        &a,
        Speaks::V3,
        context(TRACEPARENT, Some(&state)),
        "tracestate",
    )
    .await
}

/// The `traceparent` text itself as the `trace` item, not in a map.
pub async fn a_trace_item_that_is_no_map_is_dropped_and_counted(a: Arena) -> Expect {
    dropped(&a, Speaks::V3, text(TRACEPARENT), "item").await
}

/// A valid context on a session that agreed protocol 2.
pub async fn a_context_on_a_protocol_2_session_is_dropped_and_counted(a: Arena) -> Expect {
    dropped(&a, Speaks::V2, context(TRACEPARENT, None), "version").await
}

// ---------------------------------------------------------------------
// What the node sends.

/// A session with the node by hand that keeps every record as it came
/// (so the keys of the node's frames can be seen, `trace` among them).
struct Listener {
    id: NodeId,
    sender: RecordSender,
    receiver: RecordReceiver,
    _endpoint: Endpoint,
}

impl Listener {
    /// Dials the node and runs the hellos of WIRE.md 4.1 as a peer that
    /// `speaks` (as `Wire::hello_as` does).
    async fn open(a: &Arena, speaks: Speaks) -> Self {
        let keypair = Keypair::generate().unwrap();
        let id = keypair.public();
        let endpoint = Endpoint::new(
            keypair,
            TransportConfig::default(),
            ContactPolicy::AcceptAny,
        );
        let conn = endpoint
            .connect(a.stream().await, Some(a.id()))
            .await
            .unwrap();
        let (sender, receiver) = conn.split();
        let mut me = Self {
            id,
            sender,
            receiver,
            _endpoint: endpoint,
        };
        let whole = peer_manifest(id, speaks);
        let first = whole.version_1_view();
        me.sender.send(hello_record_of(&first, 1)).await.unwrap();
        let (protocol, m) = me.hello().await;
        assert_eq!(protocol, 1, "a first hello names protocol 1");
        let version = speaks.max().min(m.protocol());
        assert_eq!(version, speaks.max());
        if version >= 2 {
            if first.is_partial_view() {
                me.sender
                    .send(hello_record_of(&whole, version))
                    .await
                    .unwrap();
            }
            if m.is_partial_view() {
                let (protocol, _) = me.hello().await;
                assert_eq!(protocol, version, "the node's whole manifest");
            }
        }
        me
    }

    /// The next record, within 10 s.
    async fn record(&mut self) -> bytes::Bytes {
        tokio::time::timeout(Duration::from_secs(10), self.receiver.recv())
            .await
            .expect("the node sends")
            .unwrap()
            .expect("the session is open")
    }

    /// The next frame, which must be a hello: its protocol and manifest.
    async fn hello(&mut self) -> (u32, Manifest) {
        let r = self.record().await;
        match decode_frame(&r).unwrap() {
            FrameRef::Hello(h) => (h.protocol, h.decode_manifest().unwrap()),
            other => panic!("expected a hello, got {other:?}"),
        }
    }

    /// The node's next control frame: its req_id and its `trace` item.
    async fn control(&mut self) -> (String, Option<Vec<u8>>) {
        loop {
            let r = self.record().await;
            if let FrameRef::Control(c) = decode_frame(&r).unwrap() {
                assert_eq!((c.cap, c.verb), ("app.peer", "ask"));
                return (c.req_id.as_str().to_owned(), c.trace.map(<[u8]>::to_vec));
            }
        }
    }

    /// Answers the node's request `req_id` with `null`.
    async fn answer(&self, req_id: &str) {
        self.sender
            .send(response_ok(req_id, vec![NULL]))
            .await
            .unwrap();
    }
}

/// The node calls (`app.peer/ask`) the listener, its handle carrying `cx`
/// when given; what its control frame's `trace` item was.
async fn call_carries(a: &Arena, l: &mut Listener, cx: Option<&TraceContext>) -> Option<Vec<u8>> {
    let mut peer = a.node.peer(l.id);
    if let Some(cx) = cx {
        peer = peer.with_trace(cx.clone());
    }
    let call = tokio::spawn(async move {
        peer.call_raw("app.peer", "ask", &args(&()), Duration::from_secs(30))
            .await
    });
    let (req_id, trace) = l.control().await;
    l.answer(&req_id).await;
    call.await.unwrap().expect("the call is answered");
    trace
}

/// Peers of protocol 1 and 2: the node's calls, with a context or
/// without, never carry `trace`.
pub async fn no_trace_item_goes_to_a_peer_below_protocol_3(a: Arena) -> Expect {
    for speaks in [Speaks::V1, Speaks::V2] {
        let mut l = Listener::open(&a, speaks).await;
        let cx = TraceContext::parse(TRACEPARENT, Some("k=v")).unwrap();
        assert_eq!(
            call_carries(&a, &mut l, Some(&cx)).await,
            None,
            "{speaks:?}: no trace item, even with a context"
        );
        assert_eq!(call_carries(&a, &mut l, None).await, None, "{speaks:?}");
    }
    Expect::nothing()
}

/// A peer of protocol 3: a call with a context carries it (as it was
/// given: no subscriber makes spans here), one without carries none.
pub async fn a_trace_item_goes_to_a_protocol_3_peer(a: Arena) -> Expect {
    let mut l = Listener::open(&a, Speaks::V3).await;
    let cx = TraceContext::parse(TRACEPARENT, Some("k=v")).unwrap();
    let item = call_carries(&a, &mut l, Some(&cx))
        .await
        .expect("a trace item on protocol 3");
    assert_eq!(TraceContext::from_item(&item), Ok(cx));
    assert_eq!(
        call_carries(&a, &mut l, None).await,
        None,
        "no context, no item"
    );
    Expect::nothing()
}
