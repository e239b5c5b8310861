//! Calls between nodes: request/response over every stream kind,
//! notifications, deadlines, cancellation, lost peers, replay safety and
//! flow control.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use capwire::envelope::{ErrorCode, Frame, ResponseEnvelope};
use capwire::{Addr, CallError, Keypair, Limits, Node, Outcome, TransportConfig};
use common::{
    Counters, Delay, Hold, Note, RawPeer, Relay, Repeat, Say, Shared, client_node, connect_memory,
    connect_tcp, echo_cap, echo_node, echo_node_unlistening, raw, record, tcp_addr, wait_until,
};
use tokio::time::Instant;

const GUARD: Duration = Duration::from_secs(20);

#[tokio::test]
async fn request_response_over_tcp() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    assert_eq!(peer.id(), server.id());
    assert_eq!(peer.request(Say, "hi".into()).await.unwrap(), "echo: hi");
    assert_eq!(
        peer.request(Say, "again".into()).await.unwrap(),
        "echo: again"
    );
    assert_eq!(Counters::get(&counters.say), 2);
    assert_eq!(client.pending_calls(), 0);
    assert_eq!(server.connected_peers(), vec![client.id()]);
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test]
async fn request_response_over_the_in_memory_pair() {
    let (server, counters) = echo_node_unlistening(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_memory(&client, &server).await;
    assert_eq!(peer.request(Say, "mem".into()).await.unwrap(), "echo: mem");
    assert_eq!(Counters::get(&counters.say), 1);
}

#[cfg(unix)]
#[tokio::test]
async fn request_response_over_a_unix_socket() {
    let path = std::env::temp_dir().join(format!("capwire-calls-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let counters = Shared::default();
    let server = Node::builder("unix-server")
        .listen(Addr::Unix(path.clone()))
        .capability(echo_cap())
        .state(counters.clone())
        .start()
        .await
        .unwrap();
    assert!(server.local_addrs().contains(&Addr::Unix(path.clone())));
    let client = client_node().await;
    let peer = client
        .connect(&Addr::Unix(path.clone()), Some(server.id()))
        .await
        .unwrap();
    assert_eq!(
        peer.request(Say, "unix".into()).await.unwrap(),
        "echo: unix"
    );
    assert_eq!(Counters::get(&counters.say), 1);
    client.shutdown().await;
    server.shutdown().await;

    // A node restarted on the same path serves again.
    let server = Node::builder("unix-server")
        .listen(Addr::Unix(path.clone()))
        .capability(echo_cap())
        .state(counters.clone())
        .start()
        .await
        .expect("a restarted node can listen on its old path");
    let client = client_node().await;
    let peer = client
        .connect(&Addr::Unix(path.clone()), Some(server.id()))
        .await
        .unwrap();
    assert_eq!(
        peer.request(Say, "again".into()).await.unwrap(),
        "echo: again"
    );
    client.shutdown().await;
    server.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn calling_a_node_without_a_session_is_unreachable_at_once() {
    let client = client_node().await;
    let stranger = Keypair::generate().unwrap().public();
    let peer = client.peer(stranger);
    let result = peer.request(Say, "hello?".into()).await;
    assert!(
        matches!(result, Err(CallError::Unreachable(id)) if id == stranger),
        "{result:?}"
    );
    let result = peer.notify(Note, "hello?".into()).await;
    assert!(
        matches!(result, Err(CallError::Unreachable(id)) if id == stranger),
        "{result:?}"
    );
    assert!(peer.manifest().is_none());
    let result = peer.require(&"app.echo@^1".parse().unwrap());
    assert!(
        matches!(result, Err(CallError::Unreachable(id)) if id == stranger),
        "{result:?}"
    );
}

#[tokio::test]
async fn envelopes_larger_than_the_receiver_accepts_are_too_large_and_the_session_survives() {
    let mut small = TransportConfig::default();
    small.max_record_size = 64 * 1024;
    let client = Node::builder("client")
        .transport_config(small.clone())
        .start()
        .await
        .unwrap();
    for server_config in [small, TransportConfig::default()] {
        let counters = Shared::default();
        let server = Node::builder("server")
            .listen("127.0.0.1:0".parse().unwrap())
            .capability(echo_cap())
            .state(counters.clone())
            .transport_config(server_config.clone())
            .start()
            .await
            .unwrap();
        let peer = connect_tcp(&client, &server).await;
        let deadline = Duration::from_secs(5);

        // Args too large for the callee or for our own transport: refused
        // before anything is sent.
        let big = "y".repeat(100_000);
        let result = peer.request_within(Say, big.clone(), deadline).await;
        assert!(matches!(result, Err(CallError::TooLarge)), "{result:?}");
        let result = peer.notify(Note, big).await;
        assert!(matches!(result, Err(CallError::TooLarge)), "{result:?}");
        assert_eq!(Counters::get(&counters.say), 0);
        // A result too large for the caller: answered `too_large` instead.
        let result = peer.request_within(Repeat, 100_000, deadline).await;
        assert!(matches!(result, Err(CallError::TooLarge)), "{result:?}");

        // The session is unharmed, in both directions.
        assert_eq!(peer.request(Repeat, 1000).await.unwrap().len(), 1000);
        assert_eq!(
            peer.request(Say, "small".into()).await.unwrap(),
            "echo: small"
        );
        assert_eq!(server.connected_peers(), vec![client.id()]);
        assert_eq!(client.pending_calls(), 0);
        assert_eq!(server.ledger_sizes().running, 0);
    }
}

#[tokio::test]
async fn notify_runs_the_handler_with_the_authenticated_sender() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    peer.notify(Note, "fire".into()).await.unwrap();
    wait_until("the notification ran", || {
        Counters::get(&counters.notes) == 1
    })
    .await;
    assert_eq!(
        counters.last_note.lock().unwrap().clone(),
        Some((client.id(), "fire".to_string()))
    );
    assert_eq!(client.pending_calls(), 0, "a notification awaits nothing");
}

#[tokio::test]
async fn no_response_frame_is_ever_sent_for_a_notification() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    // Allowed, denied, malformed, failing and unauthorized notifications:
    // none of them may be answered.
    raw_peer.control("app.echo", "note", "", &raw("one")).await;
    raw_peer.control("app.echo", "nope", "", &raw("x")).await;
    raw_peer.control("app.nope", "note", "", &raw("x")).await;
    raw_peer.control("app.echo", "note", "", &raw(&17u32)).await;
    raw_peer.control("app.echo", "fail", "", &raw("boom")).await;
    raw_peer
        .control("app.echo", "fail", "", &raw("refuse"))
        .await;
    raw_peer.control("app.echo", "admin", "", &raw("x")).await;
    // A request verb sent without req_id is refused, and not answered.
    raw_peer.control("app.echo", "say", "", &raw("x")).await;
    raw_peer.control("app.echo", "note", "", &raw("two")).await;
    wait_until("both notes ran", || Counters::get(&counters.notes) == 2).await;
    wait_until("the failing notifications ran", || {
        server.metrics().count("app.echo", "fail", Outcome::Failed) == 2
    })
    .await;
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "say", Outcome::WrongKind),
        1
    );
    assert_eq!(Counters::get(&counters.say), 0);
    assert_eq!(
        server.metrics().count("app.echo", "note", Outcome::BadArgs),
        1
    );
    assert_eq!(Counters::get(&counters.admin), 0);

    // A request as a barrier; then listen a while longer.
    raw_peer
        .control("app.echo", "say", "barrier", &raw("b"))
        .await;
    let response = raw_peer.response("barrier").await;
    assert_eq!(
        response.outcome.unwrap().decode::<String>().unwrap(),
        "echo: b"
    );
    raw_peer.drain(Duration::from_millis(300)).await;
    assert!(!raw_peer.ended, "the session stays up");
    let responses = raw_peer.responses();
    assert_eq!(
        responses.len(),
        1,
        "only the request was answered: {responses:?}"
    );
    assert_eq!(responses[0].req_id.as_str(), "barrier");
}

#[tokio::test(start_paused = true)]
async fn deadline_expiry_times_out_and_cancels_the_handler() {
    let (server, counters) = echo_node_unlistening(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_memory(&client, &server).await;

    let started = Instant::now();
    let result = peer.request_within(Hold, 7, Duration::from_secs(2)).await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(CallError::Timeout)), "{result:?}");
    assert!(
        elapsed >= Duration::from_secs(2),
        "returned before the deadline: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "returned long after the deadline: {elapsed:?}"
    );
    assert_eq!(Counters::get(&counters.held), 1);
    assert_eq!(client.pending_calls(), 0);

    wait_until("the handler's cancel token fired", || {
        counters.held_token(0).is_cancelled()
    })
    .await;
    wait_until("the handler ended", || {
        Counters::get(&counters.held_ended) == 1
    })
    .await;
    wait_until("nothing runs on the server", || {
        server.ledger_sizes().running == 0
    })
    .await;
}

#[tokio::test]
async fn the_deadline_travels_as_a_budget_and_the_callee_stops_on_its_own() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    // No cancel frame follows: the budget alone must stop the handler.
    raw_peer
        .control_with_budget("app.echo", "hold", "b1", Some(100), &raw(&1u64))
        .await;
    let response = raw_peer.response("b1").await;
    assert_eq!(response.outcome.unwrap_err().code, ErrorCode::Timeout);
    assert_eq!(Counters::get(&counters.held), 1);
    wait_until("the handler's cancel token fired", || {
        counters.held_token(0).is_cancelled()
    })
    .await;
    wait_until("the handler ended", || {
        Counters::get(&counters.held_ended) == 1
    })
    .await;
    assert_eq!(server.ledger_sizes().running, 0);
}

#[tokio::test]
async fn dropping_the_request_future_cancels_the_handler() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;

    let call = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.request(Hold, 1).await })
    };
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;
    assert_eq!(client.pending_calls(), 1);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());

    wait_until("the handler's cancel token fired", || {
        counters.held_token(0).is_cancelled()
    })
    .await;
    wait_until("the handler ended", || {
        Counters::get(&counters.held_ended) == 1
    })
    .await;
    wait_until("the server counted the cancellation", || {
        server
            .metrics()
            .count("app.echo", "hold", Outcome::Cancelled)
            == 1
    })
    .await;
    assert_eq!(client.pending_calls(), 0);
    assert_eq!(server.ledger_sizes().running, 0);
    // The session is still good.
    assert_eq!(
        peer.request(Say, "still".into()).await.unwrap(),
        "echo: still"
    );
}

#[tokio::test]
async fn a_cancel_frame_is_answered_cancelled() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    raw_peer
        .control("app.echo", "hold", "c1", &raw(&1u64))
        .await;
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;
    raw_peer.cancel("c1").await;
    let response = raw_peer.response("c1").await;
    assert_eq!(response.outcome.unwrap_err().code, ErrorCode::Cancelled);
    assert!(counters.held_token(0).is_cancelled());
    // Cancelling something unknown or finished changes nothing.
    raw_peer.cancel("never-sent").await;
    raw_peer.cancel("c1").await;
    raw_peer
        .control("app.echo", "say", "after", &raw("x"))
        .await;
    assert!(raw_peer.response("after").await.outcome.is_ok());
}

#[tokio::test]
async fn a_peer_killed_mid_request_gives_peer_lost_promptly() {
    let counters = Shared::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let server_counters = counters.clone();
    // The server runs on its own runtime; dropping that runtime drops every
    // task and socket of the node at once, as a killed process would.
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let node = Node::builder("doomed")
                .listen("127.0.0.1:0".parse().unwrap())
                .capability(echo_cap())
                .state(server_counters)
                .start()
                .await
                .unwrap();
            ready_tx.send((node.id(), tcp_addr(&node))).unwrap();
            let _ = kill_rx.await;
        });
        drop(rt);
    });
    let (server_id, server_addr) = ready_rx.await.unwrap();

    let client = client_node().await;
    let peer = client
        .connect(&Addr::Tcp(server_addr), Some(server_id))
        .await
        .unwrap();
    let call = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.request_within(Hold, 1, Duration::from_secs(120)).await })
    };
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;
    kill_tx.send(()).unwrap();
    let result = tokio::time::timeout(GUARD, call)
        .await
        .expect("the call must end well before its deadline")
        .unwrap();
    assert!(matches!(result, Err(CallError::PeerLost)), "{result:?}");
    thread.join().unwrap();
    assert_eq!(client.pending_calls(), 0);
    wait_until("the session is gone", || {
        client.connected_peers().is_empty()
    })
    .await;
    let after = peer.request(Say, "anyone?".into()).await;
    assert!(
        matches!(after, Err(CallError::Unreachable(id)) if id == server_id),
        "{after:?}"
    );
}

#[tokio::test]
async fn a_stream_cut_without_a_close_record_fails_calls_on_both_sides() {
    let (server, counters) = echo_node(Limits::default()).await;
    let relay = Relay::start(tcp_addr(&server)).await;
    let client = client_node().await;
    let peer = client
        .connect(&Addr::Tcp(relay.addr), Some(server.id()))
        .await
        .unwrap();
    assert_eq!(
        peer.request(Say, "via relay".into()).await.unwrap(),
        "echo: via relay"
    );
    let call = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.request_within(Hold, 1, Duration::from_secs(120)).await })
    };
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;
    relay.cut().await;
    let result = tokio::time::timeout(GUARD, call)
        .await
        .expect("the call must end well before its deadline")
        .unwrap();
    assert!(matches!(result, Err(CallError::PeerLost)), "{result:?}");
    // The callee noticed too: its handler for the lost caller is cancelled.
    wait_until("the handler's cancel token fired", || {
        counters.held_token(0).is_cancelled()
    })
    .await;
    wait_until("the handler ended", || {
        Counters::get(&counters.held_ended) == 1
    })
    .await;
    wait_until("the server dropped the session", || {
        server.connected_peers().is_empty()
    })
    .await;
    assert_eq!(client.pending_calls(), 0);
}

#[tokio::test]
async fn a_repeated_req_id_gets_the_remembered_response_without_running_again() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    raw_peer
        .control("app.echo", "say", "r1", &raw("once"))
        .await;
    let first = raw_peer.response("r1").await;
    assert_eq!(
        first.outcome.clone().unwrap().decode::<String>().unwrap(),
        "echo: once"
    );
    assert_eq!(Counters::get(&counters.say), 1);

    for _ in 0..3 {
        raw_peer
            .control("app.echo", "say", "r1", &raw("once"))
            .await;
        let again = raw_peer.response("r1").await;
        assert_eq!(again, first);
    }
    assert_eq!(
        Counters::get(&counters.say),
        1,
        "the handler never ran again"
    );
    assert_eq!(
        server.metrics().count("app.echo", "say", Outcome::Replayed),
        3
    );
    assert_eq!(server.metrics().count("app.echo", "say", Outcome::Ok), 1);
    // Failed requests are remembered too.
    raw_peer.control("app.echo", "say", "r2", &raw(&5u8)).await;
    let failed = raw_peer.response("r2").await;
    assert_eq!(failed.outcome.clone().unwrap_err().code, ErrorCode::BadArgs);
    raw_peer.control("app.echo", "say", "r2", &raw(&5u8)).await;
    assert_eq!(raw_peer.response("r2").await, failed);
    let sizes = server.ledger_sizes();
    assert_eq!((sizes.running, sizes.remembered), (0, 2));
}

#[tokio::test]
async fn a_duplicate_req_id_in_flight_is_answered_duplicate() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    raw_peer
        .control("app.echo", "hold", "d1", &raw(&1u64))
        .await;
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;
    raw_peer
        .control("app.echo", "hold", "d1", &raw(&2u64))
        .await;
    let dup = raw_peer.response("d1").await;
    assert_eq!(dup.outcome.unwrap_err().code, ErrorCode::Duplicate);
    assert_eq!(
        Counters::get(&counters.held),
        1,
        "the duplicate did not run"
    );
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "hold", Outcome::Duplicate),
        1
    );

    // The original still completes, exactly once, with its own tag.
    counters.release.add_permits(1);
    let done = raw_peer.response("d1").await;
    assert_eq!(done.outcome.unwrap().decode::<u64>().unwrap(), 1);
    raw_peer.drain(Duration::from_millis(100)).await;
    let answers = raw_peer
        .responses()
        .iter()
        .filter(|r| r.req_id.as_str() == "d1")
        .count();
    assert_eq!(answers, 2, "one duplicate answer and one real answer");
}

#[tokio::test]
async fn a_retry_after_reconnecting_gets_the_remembered_response() {
    let (server, counters) = echo_node(Limits::default()).await;
    let key = Keypair::generate().unwrap();
    let mut first = RawPeer::connect_as(&server, key.clone()).await;
    first.control("app.echo", "say", "r1", &raw("once")).await;
    let answer = first.response("r1").await;
    drop(first);

    let mut second = RawPeer::connect_as(&server, key).await;
    second.control("app.echo", "say", "r1", &raw("once")).await;
    assert_eq!(second.response("r1").await, answer);
    assert_eq!(Counters::get(&counters.say), 1);
}

#[tokio::test]
async fn repeats_and_duplicates_are_recognised_even_at_the_in_flight_limit() {
    let limits = Limits {
        max_inflight_per_session: 1,
        ..Limits::default()
    };
    let (server, counters) = echo_node(limits).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    raw_peer.control("app.echo", "say", "s1", &raw("one")).await;
    let first = raw_peer.response("s1").await;
    raw_peer
        .control("app.echo", "hold", "h1", &raw(&1u64))
        .await;
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;

    // The limit is reached; the ledger still answers first (WIRE.md 4.3).
    raw_peer
        .control("app.echo", "hold", "h1", &raw(&1u64))
        .await;
    let dup = raw_peer.response("h1").await;
    assert_eq!(dup.outcome.unwrap_err().code, ErrorCode::Duplicate);
    raw_peer.control("app.echo", "say", "s1", &raw("one")).await;
    assert_eq!(raw_peer.response("s1").await, first);
    // Something new is refused.
    raw_peer.control("app.echo", "say", "s2", &raw("two")).await;
    let refused = raw_peer.response("s2").await;
    assert_eq!(refused.outcome.unwrap_err().code, ErrorCode::Overloaded);
    assert_eq!(Counters::get(&counters.say), 1);

    counters.release.add_permits(1);
    let done = raw_peer.response("h1").await;
    assert_eq!(done.outcome.unwrap().decode::<u64>().unwrap(), 1);
    // Once the limit has room, the refused request may be sent again and runs.
    raw_peer.control("app.echo", "say", "s2", &raw("two")).await;
    let ok = raw_peer.response("s2").await;
    assert_eq!(ok.outcome.unwrap().decode::<String>().unwrap(), "echo: two");
}

#[tokio::test]
async fn notifications_beyond_the_in_flight_limit_wait_and_are_never_lost() {
    let limits = Limits {
        max_inflight_per_session: 4,
        ..Limits::default()
    };
    let (server, counters) = echo_node(limits).await;
    let mut raw_peer = RawPeer::connect(&server).await;
    for i in 0..20u64 {
        raw_peer.control("app.echo", "wait", "", &raw(&i)).await;
    }
    wait_until("four notifications run", || {
        Counters::get(&counters.held) == 4
    })
    .await;
    // The reader waits for a slot instead of starting more work.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(Counters::get(&counters.held), 4, "only four ran at once");

    counters.release.add_permits(20);
    wait_until("all twenty ran", || {
        Counters::get(&counters.held_ended) == 20
    })
    .await;
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "wait", Outcome::Overloaded),
        0,
        "no notification was shed"
    );
    raw_peer
        .control("app.echo", "say", "after", &raw("x"))
        .await;
    assert!(raw_peer.response("after").await.outcome.is_ok());
    raw_peer.drain(Duration::from_millis(100)).await;
    assert_eq!(
        raw_peer.responses().len(),
        1,
        "notifications are never answered"
    );
}

#[tokio::test]
async fn a_cancel_from_another_peer_does_not_touch_the_request() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut a = RawPeer::connect(&server).await;
    let mut b = RawPeer::connect(&server).await;
    a.control("app.echo", "hold", "x", &raw(&5u64)).await;
    wait_until("the handler started", || Counters::get(&counters.held) == 1).await;
    b.cancel("x").await;
    // Frames of one session are handled in order: once b's next request is
    // answered, its cancel has been handled.
    b.control("app.echo", "say", "barrier", &raw("b")).await;
    assert!(b.response("barrier").await.outcome.is_ok());
    assert!(!counters.held_token(0).is_cancelled());

    counters.release.add_permits(1);
    let done = a.response("x").await;
    assert_eq!(done.outcome.unwrap().decode::<u64>().unwrap(), 5);
}

#[tokio::test]
async fn the_same_req_id_from_two_senders_runs_for_each() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut a = RawPeer::connect(&server).await;
    let mut b = RawPeer::connect(&server).await;
    a.control("app.echo", "say", "same", &raw("from a")).await;
    b.control("app.echo", "say", "same", &raw("from b")).await;
    let ra = a
        .response("same")
        .await
        .outcome
        .unwrap()
        .decode::<String>()
        .unwrap();
    let rb = b
        .response("same")
        .await
        .outcome
        .unwrap()
        .decode::<String>()
        .unwrap();
    assert_eq!((ra.as_str(), rb.as_str()), ("echo: from a", "echo: from b"));
    assert_eq!(Counters::get(&counters.say), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_requests_complete_without_leaks() {
    const N: u64 = 10_000;
    let limits = Limits {
        max_inflight_per_session: 20_000,
        ..Limits::default()
    };
    let (server, counters) = echo_node(limits).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;

    let calls = (0..N).map(|i| {
        let peer = peer.clone();
        async move { (i, peer.request(Delay, 20 + i % 3).await) }
    });
    let results = tokio::time::timeout(
        Duration::from_secs(45),
        futures_util::future::join_all(calls),
    )
    .await
    .expect("every request completes");
    for (i, r) in &results {
        assert_eq!(*r.as_ref().unwrap(), 20 + i % 3, "request {i}");
    }
    assert_eq!(Counters::get(&counters.delay), N as usize);
    assert_eq!(client.pending_calls(), 0);
    let sizes = server.ledger_sizes();
    assert_eq!(sizes.running, 0);
    assert_eq!(sizes.remembered, N as usize);
    assert_eq!(server.metrics().count("app.echo", "delay", Outcome::Ok), N);
}

#[tokio::test]
async fn requests_beyond_the_in_flight_limit_are_overloaded() {
    let limits = Limits {
        max_inflight_per_session: 2,
        ..Limits::default()
    };
    let (server, counters) = echo_node(limits).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let held: Vec<_> = (0..2)
        .map(|i| {
            let peer = peer.clone();
            tokio::spawn(async move { peer.request(Hold, i).await })
        })
        .collect();
    wait_until("both handlers started", || {
        Counters::get(&counters.held) == 2
    })
    .await;

    let third = peer.request(Hold, 3).await;
    assert!(matches!(third, Err(CallError::Overloaded)), "{third:?}");
    assert_eq!(Counters::get(&counters.held), 2, "the third never ran");
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "hold", Outcome::Overloaded),
        1
    );

    counters.release.add_permits(2);
    let mut tags = Vec::new();
    for h in held {
        tags.push(h.await.unwrap().unwrap());
    }
    tags.sort_unstable();
    assert_eq!(tags, vec![0, 1]);
    // Room again.
    assert_eq!(
        peer.request(Say, "room".into()).await.unwrap(),
        "echo: room"
    );
}

#[tokio::test]
async fn calls_beyond_the_callers_pending_limit_fail_locally() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = Node::builder("client")
        .limits(Limits {
            max_pending_calls_per_session: 2,
            ..Limits::default()
        })
        .start()
        .await
        .unwrap();
    let peer = connect_tcp(&client, &server).await;
    let held: Vec<_> = (0..2)
        .map(|i| {
            let peer = peer.clone();
            tokio::spawn(async move { peer.request(Hold, i).await })
        })
        .collect();
    wait_until("both handlers started", || {
        Counters::get(&counters.held) == 2
    })
    .await;
    let third = peer.request(Say, "one too many".into()).await;
    assert!(matches!(third, Err(CallError::Overloaded)), "{third:?}");
    assert_eq!(Counters::get(&counters.say), 0, "nothing was sent");
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "say", Outcome::Overloaded),
        0
    );
    counters.release.add_permits(2);
    for h in held {
        h.await.unwrap().unwrap();
    }
    assert_eq!(peer.request(Say, "now".into()).await.unwrap(), "echo: now");
}

#[tokio::test]
async fn the_raw_peer_sees_the_node_hello_with_its_manifest() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let raw_peer = RawPeer::connect(&server).await;
    let cap = raw_peer.node_manifest.capability("app.echo").unwrap();
    assert_eq!(cap.version.to_string(), "1.4.2");
    assert!(cap.verb("say").is_some());
    assert!(
        raw_peer
            .node_manifest
            .capability("core.monitoring")
            .is_some()
    );
    // A version-1 peer is shown the version-1 view (no `core.tasks`).
    assert_eq!(raw_peer.node_manifest, server.manifest().version_1_view());
}

#[tokio::test]
async fn the_budget_sent_is_what_is_left_of_the_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let key = Keypair::generate().unwrap();
    let raw_id = key.public();
    let client = client_node().await;
    client
        .add_contact(capwire::Contact {
            name: "raw".into(),
            id: raw_id,
            addr: Addr::Tcp(listener.local_addr().unwrap()),
        })
        .await
        .unwrap();
    let call = {
        let peer = client.peer(raw_id);
        tokio::spawn(async move {
            peer.request_within(Say, "ping".into(), Duration::from_secs(10))
                .await
        })
    };
    // The call waits for its session for at least this long.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (stream, _) = listener.accept().await.unwrap();
    let mut raw_peer = RawPeer::accept(stream, key).await;
    let control = loop {
        match raw_peer.next_frame(Duration::from_secs(10)).await {
            Some(Frame::Control(c)) => break c,
            Some(_) => {}
            None => panic!("no request arrived"),
        }
    };
    assert_eq!(
        (control.cap.as_str(), control.verb.as_str()),
        ("app.echo", "say")
    );
    let budget = control.budget_ms.expect("a request carries its budget");
    assert!(
        budget <= 9_000,
        "the time spent waiting is not in the budget: {budget}"
    );
    assert!(budget > 0);

    // The node takes a response from the raw peer like any other.
    let answer = ResponseEnvelope::ok(control.req_id.clone(), raw("pong"));
    raw_peer.send_record(record(&Frame::Response(answer))).await;
    assert_eq!(call.await.unwrap().unwrap(), "pong");
    assert_eq!(client.pending_calls(), 0);
}

/// A notification that arrives just before its sender's close (in the
/// same transport message, as a client that notifies and exits sends it)
/// still runs: it was sent, and a notification is never answered, so
/// nothing else tells the sender it was lost.
#[tokio::test(flavor = "current_thread")]
async fn a_notification_sent_just_before_a_close_still_runs() {
    let (server, counters) = echo_node(Limits::default()).await;
    for n in 1..=20 {
        let peer = RawPeer::connect(&server).await;
        peer.control("app.echo", "note", "", &raw(&format!("last words {n}")))
            .await;
        let mut close = Vec::new();
        capwire::envelope::encode_close(&mut close, capwire::envelope::CloseCode::Normal, "done");
        peer.send_record(close).await;
        wait_until("the note before the close ran", || {
            Counters::get(&counters.notes) == n
        })
        .await;
    }
    server.shutdown().await;
}
