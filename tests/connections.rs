//! Sessions between nodes: one per peer pair when both dial at once,
//! reconnecting to contacts, and graceful shutdown with work in flight.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use capwire::envelope::{CloseCode, Frame};
use capwire::{Addr, CallError, Contact, Keypair, Limits, Node};
use common::{
    Counters, Hold, RawPeer, Say, Shared, client_node, connect_tcp, echo_cap, echo_node, tcp_addr,
    wait_until,
};

const GUARD: Duration = Duration::from_secs(20);

fn quick_reconnect() -> Limits {
    Limits {
        reconnect_initial: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(400),
        ..Limits::default()
    }
}

async fn listening_node(name: &str, keypair: Keypair, addr: &str) -> (Node, Shared) {
    let counters = Shared::default();
    let node = Node::builder(name)
        .keypair(keypair)
        .listen(addr.parse().unwrap())
        .capability(echo_cap())
        .state(counters.clone())
        .limits(quick_reconnect())
        .start()
        .await
        .unwrap();
    (node, counters)
}

fn contact_of(node: &Node) -> Contact {
    Contact {
        name: "peer".into(),
        id: node.id(),
        addr: Addr::Tcp(tcp_addr(node)),
    }
}

/// Established TCP connections on loopback with one end on one of `ports`,
/// counted once per socket (a connection inside this process counts twice).
#[cfg(target_os = "linux")]
fn established_sockets(ports: &[u16]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 3
                && cols[3] == "01"
                && (ports.contains(&port(cols[1])) || ports.contains(&port(cols[2])))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_dialling_each_other_at_once_keep_one_session() {
    for round in 0..3 {
        let (a, a_counters) =
            listening_node("a", Keypair::generate().unwrap(), "127.0.0.1:0").await;
        let (b, b_counters) =
            listening_node("b", Keypair::generate().unwrap(), "127.0.0.1:0").await;
        a.add_contact(contact_of(&b)).await.unwrap();
        b.add_contact(contact_of(&a)).await.unwrap();

        wait_until("each node has a session with the other", || {
            a.connected_peers() == vec![b.id()] && b.connected_peers() == vec![a.id()]
        })
        .await;
        #[cfg(target_os = "linux")]
        {
            let ports = [tcp_addr(&a).port(), tcp_addr(&b).port()];
            wait_until("only one TCP connection is left between them", || {
                established_sockets(&ports) == 2
            })
            .await;
        }
        for i in 0..5 {
            let text = format!("{round}-{i}");
            assert_eq!(
                a.peer(b.id()).request(Say, text.clone()).await.unwrap(),
                format!("echo: {text}")
            );
            assert_eq!(
                b.peer(a.id()).request(Say, text.clone()).await.unwrap(),
                format!("echo: {text}")
            );
        }
        assert_eq!(Counters::get(&a_counters.say), 5);
        assert_eq!(Counters::get(&b_counters.say), 5);
        // Still exactly one session each, and no redialling in the background.
        assert_eq!(a.connected_peers(), vec![b.id()]);
        assert_eq!(b.connected_peers(), vec![a.id()]);
        #[cfg(target_os = "linux")]
        assert_eq!(
            established_sockets(&[tcp_addr(&a).port(), tcp_addr(&b).port()]),
            2
        );
        tokio::time::timeout(GUARD, async {
            a.shutdown().await;
            b.shutdown().await;
        })
        .await
        .expect("shutdown finishes");
    }
}

#[tokio::test]
async fn a_contact_that_restarts_on_the_same_address_is_reconnected() {
    let b_key = Keypair::generate().unwrap();
    let (b, _) = listening_node("b", b_key.clone(), "127.0.0.1:0").await;
    let b_addr = tcp_addr(&b);
    let b_id = b.id();
    let a = Node::builder("a")
        .limits(quick_reconnect())
        .start()
        .await
        .unwrap();
    a.add_contact(contact_of(&b)).await.unwrap();
    assert_eq!(a.contacts(), vec![contact_of(&b)]);
    let peer = a
        .wait_for_peer(b_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        peer.request(Say, "first".into()).await.unwrap(),
        "echo: first"
    );

    tokio::time::timeout(GUARD, b.shutdown()).await.unwrap();
    wait_until("a noticed that b went away", || {
        a.connected_peers().is_empty()
    })
    .await;
    // While b is down, a call waits for the contact within its deadline and
    // then fails with a typed error.
    let down = peer
        .request_within(Say, "down".into(), Duration::from_millis(300))
        .await;
    assert!(
        matches!(down, Err(CallError::Unreachable(id)) if id == b_id),
        "{down:?}"
    );

    let (b2, b2_counters) = listening_node("b", b_key.clone(), &b_addr.to_string()).await;
    assert_eq!(b2.id(), b_id);
    let peer = a
        .wait_for_peer(b_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        peer.request(Say, "again".into()).await.unwrap(),
        "echo: again"
    );
    assert_eq!(Counters::get(&b2_counters.say), 1);
    // A call made while the contact is being redialled waits for it.
    tokio::time::timeout(GUARD, b2.shutdown()).await.unwrap();
    wait_until("a noticed the second restart", || {
        a.connected_peers().is_empty()
    })
    .await;
    let call = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.request_within(Say, "waiting".into(), GUARD).await })
    };
    let (b3, _) = listening_node("b", b_key, &b_addr.to_string()).await;
    let result = tokio::time::timeout(GUARD, call).await.unwrap().unwrap();
    assert_eq!(result.unwrap(), "echo: waiting");
    b3.shutdown().await;
    a.shutdown().await;
}

#[tokio::test]
async fn a_caller_restarted_with_the_same_identity_gets_fresh_answers() {
    let (server, counters) = echo_node(Limits::default()).await;
    let key = Keypair::generate().unwrap();
    let client = Node::builder("client")
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    let peer = connect_tcp(&client, &server).await;
    for text in ["one", "two", "three"] {
        assert_eq!(
            peer.request(Say, text.into()).await.unwrap(),
            format!("echo: {text}")
        );
    }
    client.shutdown().await;

    // Same identity, well within the callee's replay window: new requests
    // must run, not be mistaken for repeats of the old ones.
    let client = Node::builder("client").keypair(key).start().await.unwrap();
    let peer = connect_tcp(&client, &server).await;
    for text in ["four", "five", "six"] {
        assert_eq!(
            peer.request(Say, text.into()).await.unwrap(),
            format!("echo: {text}")
        );
    }
    assert_eq!(Counters::get(&counters.say), 6);
    assert_eq!(
        server
            .metrics()
            .count("app.echo", "say", capwire::Outcome::Replayed),
        0
    );
}

#[tokio::test]
async fn graceful_shutdown_answers_every_request_in_flight() {
    let limits = Limits {
        shutdown_grace: Duration::from_secs(2),
        ..Limits::default()
    };
    let (server, counters) = echo_node(limits).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let mut raw_peer = RawPeer::connect(&server).await;

    tokio::time::timeout(GUARD, async {
        let calls: Vec<_> = (0..6)
            .map(|tag| {
                let peer = peer.clone();
                tokio::spawn(async move { peer.request(Hold, tag).await })
            })
            .collect();
        wait_until("all six handlers started", || {
            Counters::get(&counters.held) == 6
        })
        .await;

        let shutdown = {
            let server = server.clone();
            tokio::spawn(async move { server.shutdown().await })
        };
        // New requests during shutdown are answered `cancelled`.
        loop {
            match peer.request(Say, "late".into()).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(CallError::Cancelled) => break,
                Err(other) => panic!("a request during shutdown got {other:?}"),
            }
        }
        // Half of the running handlers finish within the grace period.
        counters.release.add_permits(3);

        let mut finished = 0;
        let mut cancelled = 0;
        for call in calls {
            match call.await.unwrap() {
                Ok(tag) => {
                    assert!(tag < 6);
                    finished += 1;
                }
                Err(CallError::Cancelled) => cancelled += 1,
                Err(other) => panic!("an in-flight request got {other:?}"),
            }
        }
        assert_eq!((finished, cancelled), (3, 3));
        shutdown.await.unwrap();
    })
    .await
    .expect("shutdown and every call end");

    let cancelled_tokens = counters
        .held_tokens
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t.is_cancelled())
        .count();
    assert!(
        cancelled_tokens >= 3,
        "the unfinished handlers were cancelled"
    );
    assert_eq!(Counters::get(&counters.held_ended), 6);
    assert_eq!(server.ledger_sizes().running, 0);
    assert_eq!(client.pending_calls(), 0);

    // The session was closed with a reason.
    let mut close = None;
    while let Some(frame) = raw_peer.next_frame(Duration::from_secs(5)).await {
        if let Frame::Close(c) = frame {
            close = Some(c);
        }
    }
    assert!(raw_peer.ended);
    assert_eq!(close.expect("a close frame").code, CloseCode::Shutdown);

    wait_until("the client saw the session end", || {
        client.connected_peers().is_empty()
    })
    .await;
    let after = peer.request(Say, "after".into()).await;
    assert!(matches!(after, Err(CallError::Unreachable(_))), "{after:?}");
}

#[tokio::test]
async fn shutting_down_the_caller_ends_its_calls_with_a_typed_error() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    let calls: Vec<_> = (0..3)
        .map(|tag| {
            let peer = peer.clone();
            tokio::spawn(async move { peer.request(Hold, tag).await })
        })
        .collect();
    wait_until("the handlers started", || {
        Counters::get(&counters.held) == 3
    })
    .await;

    tokio::time::timeout(GUARD, client.shutdown())
        .await
        .expect("the caller shuts down");
    for call in calls {
        let result = tokio::time::timeout(GUARD, call).await.unwrap().unwrap();
        assert!(matches!(result, Err(CallError::Shutdown)), "{result:?}");
    }
    assert_eq!(client.pending_calls(), 0);
    let after = peer.request(Say, "after".into()).await;
    assert!(matches!(after, Err(CallError::Shutdown)), "{after:?}");

    // The callee cancels the handlers of the caller that went away.
    wait_until("the handlers were cancelled", || {
        counters.all_held_cancelled() && Counters::get(&counters.held_ended) == 3
    })
    .await;
    wait_until("the server dropped the session", || {
        server.connected_peers().is_empty()
    })
    .await;
    assert_eq!(server.ledger_sizes().running, 0);
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_is_kept_alive() {
    let (server, _counters) = common::echo_node_unlistening(Limits::default()).await;
    let client = client_node().await;
    let peer = common::connect_memory(&client, &server).await;
    // Far longer than the transport's idle timeout, with no call at all.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(client.connected_peers(), vec![server.id()]);
    assert_eq!(server.connected_peers(), vec![client.id()]);
    assert_eq!(
        peer.request(Say, "still here".into()).await.unwrap(),
        "echo: still here"
    );
}

#[tokio::test]
async fn the_contact_policy_decides_who_may_connect() {
    let friend = client_node().await;
    let stranger = client_node().await;
    let counters = Shared::default();
    let server = Node::builder("picky")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(echo_cap())
        .state(counters.clone())
        .contact_policy(capwire::ContactPolicy::allow_list([friend.id()]))
        .start()
        .await
        .unwrap();
    let addr = Addr::Tcp(tcp_addr(&server));
    assert!(stranger.connect(&addr, Some(server.id())).await.is_err());
    let peer = friend.connect(&addr, Some(server.id())).await.unwrap();
    assert_eq!(
        peer.request(Say, "friend".into()).await.unwrap(),
        "echo: friend"
    );
    // Dialling a node under another identity than expected fails too.
    let wrong = Keypair::generate().unwrap().public();
    assert!(friend.connect(&addr, Some(wrong)).await.is_err());
    assert_eq!(server.connected_peers(), vec![friend.id()]);
    assert_eq!(Counters::get(&counters.say), 1);
}

/// Reads until the session ends; returns the close frame, if one came.
async fn close_of(raw_peer: &mut RawPeer) -> Option<capwire::envelope::Close> {
    let mut close = None;
    while let Some(frame) = raw_peer.next_frame(Duration::from_secs(10)).await {
        if let Frame::Close(c) = frame {
            close = Some(c);
        }
    }
    assert!(raw_peer.ended, "the node ends the session");
    close
}

#[tokio::test]
async fn a_hello_that_names_another_node_is_refused() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let key = Keypair::generate().unwrap();
    let impostor = common::bare_manifest(Keypair::generate().unwrap().public());
    let stream = tokio::net::TcpStream::connect(tcp_addr(&server))
        .await
        .unwrap();
    let mut raw_peer = RawPeer::over_with_manifest(stream, server.id(), key, &impostor).await;
    let close = close_of(&mut raw_peer).await.expect("a close frame");
    assert_eq!(close.code, CloseCode::ProtocolError);
    assert!(server.connected_peers().is_empty());
}

#[tokio::test]
async fn protocol_errors_end_the_session_and_fail_its_calls() {
    let (server, counters) = echo_node(Limits::default()).await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not cbor", vec![0xff, 0x00]),
        ("trailing bytes", {
            let mut r = common::record(&Frame::Keepalive);
            r.push(0);
            r
        }),
        ("unknown field", {
            // {"type": "keepalive", "x": 1}
            let mut r = vec![0xa2];
            r.extend_from_slice(b"\x64type\x69keepalive\x61x\x01");
            r
        }),
        ("a later hello naming another node", {
            let other = common::bare_manifest(Keypair::generate().unwrap().public());
            common::record(&common::hello_frame(&other))
        }),
    ];
    for (what, bad) in cases {
        let mut raw_peer = RawPeer::connect(&server).await;
        raw_peer
            .control("app.echo", "hold", "h", &common::raw(&1u64))
            .await;
        wait_until("the handler started", || {
            counters
                .held_tokens
                .lock()
                .unwrap()
                .iter()
                .any(|t| !t.is_cancelled())
        })
        .await;
        raw_peer.send_record(bad).await;
        let close = close_of(&mut raw_peer).await.expect("a close frame");
        assert_eq!(close.code, CloseCode::ProtocolError, "{what}");
        wait_until("the handler of the closed session was cancelled", || {
            counters.all_held_cancelled()
        })
        .await;
        wait_until("the session is gone", || {
            server.connected_peers().is_empty()
        })
        .await;
    }
    // Harmless frames do not end a session.
    let mut raw_peer = RawPeer::connect(&server).await;
    let stray = capwire::envelope::ResponseEnvelope::ok(
        capwire::envelope::ReqId::try_from("never-asked").unwrap(),
        common::raw("?"),
    );
    raw_peer
        .send_record(common::record(&Frame::Response(stray)))
        .await;
    raw_peer
        .send_record(common::record(&Frame::Keepalive))
        .await;
    let update = common::bare_manifest(raw_peer.id);
    raw_peer
        .send_record(common::record(&common::hello_frame(&update)))
        .await;
    raw_peer
        .control("app.echo", "say", "ok", &common::raw("fine"))
        .await;
    assert!(raw_peer.response("ok").await.outcome.is_ok());
    assert!(!raw_peer.ended);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_never_sends_its_hello_is_dropped() {
    let (server, _counters) = common::echo_node_unlistening(Limits::default()).await;
    let (a, b) = tokio::io::duplex(64 * 1024);
    server.accept_stream(b);
    let endpoint = capwire::transport::Endpoint::new(
        Keypair::generate().unwrap(),
        capwire::TransportConfig::default(),
        capwire::ContactPolicy::AcceptAny,
    );
    let mut conn = endpoint.connect(a, Some(server.id())).await.unwrap();
    let first = conn.recv().await.unwrap().expect("the node's hello");
    assert!(matches!(
        capwire::envelope::decode_frame(&first).unwrap(),
        capwire::envelope::FrameRef::Hello(_)
    ));
    // We never answer with our hello; the node gives up on us, saying so.
    let started = tokio::time::Instant::now();
    let close = tokio::time::timeout(Duration::from_secs(60), conn.recv())
        .await
        .expect("the node ends the session")
        .unwrap()
        .expect("a close frame before the end");
    let capwire::envelope::FrameRef::Close(close) =
        capwire::envelope::decode_frame(&close).unwrap()
    else {
        panic!("a close frame, got {close:?}");
    };
    assert_eq!(close.code, capwire::envelope::CloseCode::ProtocolError);
    let end = tokio::time::timeout(Duration::from_secs(60), conn.recv())
        .await
        .expect("the node ends the session");
    assert!(!matches!(end, Ok(Some(_))), "nothing but the end: {end:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "not before the hello timeout"
    );
    assert!(server.connected_peers().is_empty());
}
