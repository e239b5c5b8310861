//! Stream verbs end to end over real encrypted sessions: items in order and
//! the handler's end, credit that slows a fast producer to its consumer,
//! cancellation when the caller drops its stream, the budget and the idle
//! bounds on both sides, a lost session, items larger than the window,
//! the manifest a version-2 peer sees, and version-1 peers on either side.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use capwire::envelope::{ErrorCode, Frame, ReqId};
use capwire::manifest::{VerbKind, verb};
use capwire::{CallError, Capability, HandlerError, Items, Limits, Node, State};
use common::{RawPeer, raw, wait_until};

verb! {
    /// Sends 1..=n.
    pub struct Count: stream "app.st" / "count", Bootstrap, u32 => u32;
}
verb! {
    /// Sends n items, then fails with the application code `broke`.
    pub struct Fail: stream "app.st" / "fail", Bootstrap, u32 => u32;
}
verb! {
    /// Sends 0, 1, 2, ... as fast as credit allows, until stopped.
    pub struct Forever: stream "app.st" / "forever", Bootstrap, () => u64;
}
verb! {
    /// Sends one item, then waits for ever.
    pub struct Once: stream "app.st" / "once", Bootstrap, () => u32;
}
verb! {
    /// Sends one text of this many bytes.
    pub struct Big: stream "app.st" / "big", Bootstrap, u32 => String;
}
verb! {
    /// A plain request beside the streams.
    pub struct Ping: request "app.st" / "ping", Bootstrap, String => String;
}

/// What the handlers did.
#[derive(Debug, Default)]
struct Probe {
    /// Items the `forever` handler got into the session's queue.
    produced: AtomicU64,
    /// Handlers that started, and whose futures were dropped or returned.
    started: AtomicUsize,
    ended: AtomicUsize,
}

/// Counts a handler's end however it ends (returned, or its future
/// dropped).
struct Ends(Arc<Probe>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

fn watch(probe: &Arc<Probe>) -> Ends {
    probe.started.fetch_add(1, Ordering::SeqCst);
    Ends(probe.clone())
}

async fn count(n: u32, mut items: Items<u32>) -> Result<(), HandlerError> {
    for i in 1..=n {
        items.send(i).await?;
    }
    Ok(())
}

async fn fail(n: u32, mut items: Items<u32>) -> Result<(), HandlerError> {
    for i in 1..=n {
        items.send(i).await?;
    }
    Err(HandlerError::app("broke", "the handler broke").unwrap())
}

async fn forever(
    _: (),
    mut items: Items<u64>,
    State(probe): State<Arc<Probe>>,
) -> Result<(), HandlerError> {
    let _ends = watch(&probe);
    let mut n = 0;
    loop {
        items.send(n).await?;
        n += 1;
        probe.produced.store(n, Ordering::SeqCst);
    }
}

async fn once(
    _: (),
    mut items: Items<u32>,
    State(probe): State<Arc<Probe>>,
) -> Result<(), HandlerError> {
    let _ends = watch(&probe);
    items.send(7).await?;
    std::future::pending::<()>().await;
    Ok(())
}

async fn big(n: u32, mut items: Items<String>) -> Result<(), HandlerError> {
    items.send("x".repeat(n as usize)).await?;
    Ok(())
}

async fn ping(text: String) -> Result<String, HandlerError> {
    Ok(format!("pong: {text}"))
}

fn cap() -> Capability {
    Capability::new("app.st", "1.0.0")
        .unwrap()
        .stream(Count, count)
        .stream(Fail, fail)
        .stream(Forever, forever)
        .stream(Once, once)
        .stream(Big, big)
        .handle(Ping, ping)
}

async fn server(limits: Limits) -> (Node, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let node = Node::builder("streamer")
        .listen("127.0.0.1:0".parse().unwrap())
        .limits(limits)
        .capability(cap())
        .state(probe.clone())
        .start()
        .await
        .unwrap();
    (node, probe)
}

async fn client(limits: Limits) -> Node {
    Node::builder("consumer")
        .limits(limits)
        .start()
        .await
        .unwrap()
}

async fn pair(
    server_limits: Limits,
    client_limits: Limits,
) -> (Node, Arc<Probe>, Node, capwire::Peer) {
    let (s, probe) = server(server_limits).await;
    let c = client(client_limits).await;
    let peer = c.connect(&s.local_addrs()[0], Some(s.id())).await.unwrap();
    (s, probe, c, peer)
}

const GUARD: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_arrive_in_order_and_the_handler_ends_the_stream() {
    let (s, _, c, peer) = pair(Limits::default(), Limits::default()).await;
    let mut numbers = peer.stream(Count, 5000).await.unwrap();
    let mut got = Vec::new();
    while let Some(n) = tokio::time::timeout(GUARD, numbers.next()).await.unwrap() {
        got.push(n.unwrap());
    }
    assert_eq!(got, (1..=5000).collect::<Vec<_>>());
    assert!(numbers.next().await.is_none(), "ended streams stay ended");

    // A handler's error ends the stream after its items.
    let mut failing = peer.stream(Fail, 3).await.unwrap();
    for i in 1..=3 {
        assert_eq!(failing.next().await.unwrap().unwrap(), i);
    }
    match failing.next().await {
        Some(Err(CallError::Remote(body))) => assert_eq!(body.code.as_str(), "broke"),
        other => panic!("the handler's error ends the stream: {other:?}"),
    }
    assert!(failing.next().await.is_none());

    // Requests go on beside streams on the same session.
    assert_eq!(peer.request(Ping, "x".into()).await.unwrap(), "pong: x");
    let stats = c.stats();
    assert_eq!(stats.stream_items_received, 5003);
    assert_eq!(s.stats().stream_items_sent, 5003);
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_slows_the_producer_and_nothing_piles_up() {
    let window = Limits {
        stream_window_items: 8,
        ..Limits::default()
    };
    let (s, probe, c, peer) = pair(Limits::default(), window).await;
    let mut items = peer.stream(Forever, ()).await.unwrap();
    let mut taken = 0u64;
    for _ in 0..30 {
        let n = tokio::time::timeout(GUARD, items.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(n, taken, "in order");
        taken += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The producer is never more than a window ahead of what was
        // taken: 8 items granted, none beyond.
        let produced = probe.produced.load(Ordering::SeqCst);
        assert!(
            produced <= taken + 8,
            "produced {produced} with {taken} taken and a window of 8"
        );
        assert!(items.buffered() <= 8);
    }
    assert!(
        s.stats().stream_credit_stalls > 0,
        "the producer waited for credit"
    );
    assert_eq!(s.stats().streams_served, 1);
    assert_eq!(c.stats().streams_called, 1);
    drop(items);
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_cancels_it_and_the_handler_stops() {
    let (s, probe, c, peer) = pair(Limits::default(), Limits::default()).await;
    let mut items = peer.stream(Forever, ()).await.unwrap();
    for _ in 0..3 {
        items.next().await.unwrap().unwrap();
    }
    assert_eq!(probe.ended.load(Ordering::SeqCst), 0);
    drop(items);
    wait_until("the handler stops", || {
        probe.ended.load(Ordering::SeqCst) == 1
    })
    .await;
    wait_until("nothing is served any more", || {
        s.stats().streams_served == 0
    })
    .await;
    wait_until("nothing is open any more", || c.stats().streams_called == 0).await;
    // The session is fine for more.
    assert_eq!(peer.request(Ping, "y".into()).await.unwrap(), "pong: y");
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_bounds_the_whole_stream() {
    let (s, probe, c, peer) = pair(Limits::default(), Limits::default()).await;
    let started = tokio::time::Instant::now();
    let mut items = peer
        .stream_within(Once, (), Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(items.next().await.unwrap().unwrap(), 7);
    match tokio::time::timeout(GUARD, items.next()).await.unwrap() {
        Some(Err(CallError::Timeout)) => {}
        other => panic!("the budget ends the stream: {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(250));
    wait_until("the handler is stopped at its budget", || {
        probe.ended.load(Ordering::SeqCst) == 1
    })
    .await;
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_waiting_too_long_for_an_item_gives_up_and_cancels() {
    let idle = Limits {
        stream_idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let (s, probe, c, peer) = pair(Limits::default(), idle).await;
    let mut items = peer.stream(Once, ()).await.unwrap();
    assert_eq!(items.next().await.unwrap().unwrap(), 7);
    match tokio::time::timeout(GUARD, items.next()).await.unwrap() {
        Some(Err(CallError::Idle)) => {}
        other => panic!("the idle bound ends the stream: {other:?}"),
    }
    wait_until("the caller's cancel stops the handler", || {
        probe.ended.load(Ordering::SeqCst) == 1
    })
    .await;
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_without_credit_ends_the_stream_with_timeout() {
    let server_idle = Limits {
        stream_idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let small = Limits {
        stream_window_items: 2,
        ..Limits::default()
    };
    let (s, probe, c, peer) = pair(server_idle, small).await;
    // Opened, and not read: two items fill the window, the third waits.
    let mut items = peer.stream(Forever, ()).await.unwrap();
    wait_until("the handler ends for want of credit", || {
        probe.ended.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(probe.produced.load(Ordering::SeqCst), 2);
    assert_eq!(items.next().await.unwrap().unwrap(), 0);
    assert_eq!(items.next().await.unwrap().unwrap(), 1);
    match items.next().await {
        Some(Err(CallError::Timeout)) => {}
        other => panic!("the stream ends with timeout: {other:?}"),
    }
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_ends_the_stream_on_both_sides() {
    let (s, probe, c, peer) = pair(Limits::default(), Limits::default()).await;
    let mut items = peer.stream(Once, ()).await.unwrap();
    assert_eq!(items.next().await.unwrap().unwrap(), 7);
    // The serving side goes: its handler is stopped, the caller told.
    let stopping = tokio::spawn({
        let s = s.clone();
        async move { s.shutdown().await }
    });
    match tokio::time::timeout(GUARD, items.next()).await.unwrap() {
        Some(Err(CallError::PeerLost | CallError::Cancelled)) => {}
        other => panic!("the stream ends with the session: {other:?}"),
    }
    tokio::time::timeout(GUARD, stopping)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(probe.ended.load(Ordering::SeqCst), 1);

    // The calling side goes: the handler is stopped too.
    let (s, probe, c2, peer) = pair(Limits::default(), Limits::default()).await;
    let mut items = peer.stream(Once, ()).await.unwrap();
    assert_eq!(items.next().await.unwrap().unwrap(), 7);
    c2.shutdown().await;
    wait_until("the served handler stops", || {
        probe.ended.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(items.next().await.unwrap().is_err());
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_larger_than_the_window_ends_the_stream_too_large() {
    let small = Limits {
        stream_window_bytes: 1024,
        ..Limits::default()
    };
    let (s, _, c, peer) = pair(Limits::default(), small).await;
    let mut fits = peer.stream(Big, 1000).await.unwrap();
    assert_eq!(fits.next().await.unwrap().unwrap().len(), 1000);
    assert!(fits.next().await.is_none());
    let mut too_big = peer.stream(Big, 2000).await.unwrap();
    match tokio::time::timeout(GUARD, too_big.next()).await.unwrap() {
        Some(Err(CallError::TooLarge)) => {}
        other => panic!("an item over the window: {other:?}"),
    }
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_peer_sees_stream_verbs_with_their_item_schema() {
    let (s, _, c, peer) = pair(Limits::default(), Limits::default()).await;
    let manifest = peer.manifest().unwrap();
    let v = manifest
        .capability("app.st")
        .unwrap()
        .verb("count")
        .unwrap();
    assert_eq!(v.kind, VerbKind::Stream);
    let item_schema: serde_json::Value =
        serde_json::from_str(v.result_schema.as_deref().unwrap()).unwrap();
    assert_eq!(item_schema["type"], "integer");
    assert_eq!(
        manifest.protocol(),
        3,
        "a capwire node speaks protocols 1 to 3"
    );
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_peer_is_served_as_before_and_sees_no_stream() {
    let (s, _) = server(Limits::default()).await;
    let mut v1 = RawPeer::connect(&s).await;
    // Its view: no stream verb, everything else.
    let view = &v1.node_manifest;
    let st = view.capability("app.st").unwrap();
    assert_eq!(
        st.verbs.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["ping"]
    );
    assert!(!view.has_protocol_2_verbs());
    v1.control("app.st", "ping", "p1", &raw("old")).await;
    assert_eq!(
        v1.response("p1")
            .await
            .outcome
            .unwrap()
            .decode::<String>()
            .unwrap(),
        "pong: old"
    );
    // A stream verb's name, sent as a request, is an unknown verb to it.
    v1.control("app.st", "count", "c1", &raw(&3u32)).await;
    let err = v1.response("c1").await.outcome.unwrap_err();
    assert_eq!(err.code, ErrorCode::UnknownVerb);
    assert!(
        !v1.received.iter().any(|f| matches!(f, Frame::Item(_))),
        "no item ever goes to a version-1 peer"
    );
    // And a stream from the node to it fails here, before anything is sent.
    let to_v1 = s.peer(v1.id);
    match to_v1.stream(Count, 3).await {
        Err(CallError::Unsupported(_)) => {}
        other => panic!("a stream to a version-1 peer: {other:?}"),
    }
    assert!(!v1.ended);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_go_both_ways_on_one_session_whoever_dialled() {
    let (a, _) = server(Limits::default()).await;
    let (b, _) = server(Limits::default()).await;
    let a_to_b = a.connect(&b.local_addrs()[0], Some(b.id())).await.unwrap();
    // B knows the session once A's hellos have arrived.
    let b_to_a = b.wait_for_peer(a.id(), GUARD).await.unwrap();
    let mut one = a_to_b.stream(Count, 100).await.unwrap();
    let mut two = b_to_a.stream(Count, 100).await.unwrap();
    let (mut x, mut y) = (0u32, 0u32);
    while let Some(n) = one.next().await {
        x += n.unwrap();
    }
    while let Some(n) = two.next().await {
        y += n.unwrap();
    }
    assert_eq!((x, y), (5050, 5050));
    assert_eq!(a.connected_peers().len(), 1, "one session");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_at_once_on_one_session() {
    let (s, _, c, peer) = pair(Limits::default(), Limits::default()).await;
    let mut all = Vec::new();
    for _ in 0..200 {
        all.push(peer.stream(Count, 50).await.unwrap());
    }
    let sums = futures_util::future::join_all(all.into_iter().map(|mut st| async move {
        let mut sum = 0u32;
        while let Some(n) = st.next().await {
            sum += n.unwrap();
        }
        sum
    }))
    .await;
    assert!(sums.iter().all(|s| *s == 1275), "{sums:?}");
    let _ = ReqId::EMPTY;
    c.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_stream_within_its_bound() {
    let quick = Limits {
        shutdown_grace: Duration::from_millis(300),
        ..Limits::default()
    };
    let (s, probe, c, peer) = pair(quick.clone(), Limits::default()).await;
    let mut open = Vec::new();
    for _ in 0..20 {
        let mut st = peer.stream(Forever, ()).await.unwrap();
        st.next().await.unwrap().unwrap();
        open.push(st);
    }
    assert_eq!(s.stats().streams_served, 20);
    let started = tokio::time::Instant::now();
    tokio::time::timeout(GUARD, s.shutdown()).await.unwrap();
    let bound = quick.shutdown_grace + quick.close_timeout + Duration::from_millis(350);
    assert!(
        started.elapsed() <= bound + Duration::from_millis(500),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert_eq!(
        probe.ended.load(Ordering::SeqCst),
        20,
        "every handler stopped"
    );
    for mut st in open {
        // Items already on their way may come first; then the end.
        let end = loop {
            match tokio::time::timeout(GUARD, st.next()).await.unwrap() {
                Some(Ok(_)) => {}
                other => break other,
            }
        };
        assert!(
            matches!(end, Some(Err(_))),
            "each stream ends with an error: {end:?}"
        );
    }
    c.shutdown().await;
}
