//! The node's metrics as operators see them: counters and gauges in
//! `Node::stats`, and the Prometheus endpoint scraped over real TCP,
//! including scrapers that misbehave.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use capwire::prometheus::{MetricsServer, ServerLimits};
use capwire::{
    Addr, CallError, Direction, HandshakeFailure, Keypair, Limits, Node, NodeStats, TransportConfig,
};
use common::{
    Admin, Note, Say, client_node, connect_tcp, echo_cap, echo_node, raw, tcp_addr, wait_until,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const GUARD: Duration = Duration::from_secs(20);

fn send_sync<T: Send + Sync>() {}

#[test]
fn public_metric_types_are_send_and_sync() {
    send_sync::<NodeStats>();
    send_sync::<MetricsServer>();
    send_sync::<ServerLimits>();
    send_sync::<capwire::prometheus::NodeCollector>();
}

/// A connection to `to` from the loopback address `from` (Linux answers
/// for all of 127.0.0.0/8), so that a test can play several sources.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// An HTTP exchange: sends `request`, reads until the server closes.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    exchange_from("127.0.0.1", addr, request).await
}

/// As [`exchange`], from the source address `from`.
async fn exchange_from(from: &str, addr: SocketAddr, request: &[u8]) -> String {
    tokio::time::timeout(GUARD, async {
        let mut stream = connect_from(from, addr).await;
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8(answer).unwrap()
    })
    .await
    .expect("the endpoint answers and closes")
}

/// `GET /metrics`: the body, after checking the status and headers.
async fn scrape(addr: SocketAddr) -> String {
    scrape_from("127.0.0.1", addr).await
}

/// As [`scrape`], from the source address `from`.
async fn scrape_from(from: &str, addr: SocketAddr) -> String {
    let answer = exchange_from(from, addr, b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").await;
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    assert!(head.contains("\r\nConnection: close"), "{head}");
    assert!(
        head.contains(&format!("\r\nContent-Length: {}", body.len())),
        "{head}"
    );
    body.to_owned()
}

/// The value of one series in a scrape, `None` when it is absent.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn failures(stats: &NodeStats, direction: Direction, reason: HandshakeFailure) -> u64 {
    stats.handshake_failures(direction, reason)
}

#[tokio::test]
async fn calls_are_counted_by_cap_verb_and_outcome_and_served_over_http() {
    let (server, _) = echo_node(Limits::default()).await;
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), server.clone())
        .await
        .unwrap();
    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;

    assert_eq!(peer.request(Say, "hi".into()).await.unwrap(), "echo: hi");
    let unknown = peer
        .call_raw("app.echo", "nope", &raw("x"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(unknown, CallError::Denied(_)), "{unknown:?}");
    let elsewhere = peer
        .call_raw("app.made_up", "say", &raw("x"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(elsewhere, CallError::Denied(_)), "{elsewhere:?}");
    let unauthorized = peer.request(Admin, "x".into()).await.unwrap_err();
    assert!(
        matches!(unauthorized, CallError::Denied(_)),
        "{unauthorized:?}"
    );

    let text = scrape(metrics.local_addr()).await;
    let calls = |labels: &str| sample(&text, &format!("capwire_calls_total{{{labels}}}"));
    assert_eq!(
        calls(r#"cap="app.echo",verb="say",outcome="ok""#),
        Some(1),
        "{text}"
    );
    assert_eq!(
        calls(r#"cap="app.echo",verb="admin",outcome="unauthorized""#),
        Some(1)
    );
    // Both unregistered names land in one series: peers cannot add series.
    assert_eq!(
        calls(r#"cap="unknown",verb="unknown",outcome="unknown_verb""#),
        Some(2)
    );
    assert!(
        !text.contains("nope") && !text.contains("made_up"),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("capwire_calls_total"))
            .count(),
        3,
        "{text}"
    );
    assert!(text.contains("# TYPE capwire_calls_total counter\n"));
    assert_eq!(
        sample(&text, r#"capwire_sessions{direction="inbound"}"#),
        Some(1)
    );
    assert_eq!(
        sample(&text, r#"capwire_sessions{direction="outbound"}"#),
        Some(0)
    );
    assert_eq!(
        sample(
            &text,
            r#"capwire_sessions_opened_total{direction="inbound"}"#
        ),
        Some(1)
    );
    assert_eq!(sample(&text, "capwire_pending_calls"), Some(0));
    assert_eq!(sample(&text, "capwire_inflight"), Some(0));
    assert!(sample(&text, "capwire_queued_bytes").is_some());
    assert_eq!(
        sample(&text, r#"capwire_ledger_entries{state="remembered"}"#),
        Some(1),
        "the ok call's answer is remembered"
    );
    assert!(sample(&text, "capwire_ledger_bytes").unwrap() > 0);
    assert_eq!(sample(&text, "capwire_ledger_senders"), Some(1));
    assert_eq!(
        sample(&text, r#"capwire_session_budget_used{pool="inbound"}"#),
        Some(1)
    );
    assert_eq!(
        sample(&text, r#"capwire_session_budget_limit{pool="inbound"}"#),
        Some(1024)
    );
    assert_eq!(sample(&text, "capwire_copies_sent_total"), Some(0));
    assert_eq!(sample(&text, "capwire_copies_dropped_total"), Some(0));

    // The snapshot API says the same.
    let stats = server.stats();
    assert_eq!(stats.calls, server.metrics());
    assert_eq!(stats.sessions(Direction::Inbound), 1);
    assert_eq!(client.stats().sessions(Direction::Outbound), 1);
    assert_eq!(client.stats().sessions(Direction::Inbound), 0);

    // A peer that leaves is no longer counted.
    client.shutdown().await;
    wait_until("the session is gone", || {
        server.stats().sessions(Direction::Inbound) == 0
    })
    .await;
    let text = scrape(metrics.local_addr()).await;
    assert_eq!(
        sample(&text, r#"capwire_sessions{direction="inbound"}"#),
        Some(0)
    );
    assert_eq!(
        sample(
            &text,
            r#"capwire_sessions_opened_total{direction="inbound"}"#
        ),
        Some(1)
    );
    assert_eq!(
        server.stats().handshake_failures_total(),
        0,
        "a session that opened and ended is no failure"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn failed_handshakes_are_counted_by_reason() {
    let mut transport = TransportConfig::default();
    transport.first_message_timeout = Duration::from_millis(200);
    let limits = Limits {
        max_handshakes_per_source: 2,
        hello_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = Node::builder("server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(echo_cap())
        .state(common::Shared::default())
        .limits(limits)
        .transport_config(transport)
        .start()
        .await
        .unwrap();
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), server.clone())
        .await
        .unwrap();
    let addr = tcp_addr(&server);

    // Garbage in place of handshake message 1 (an HTTP request here).
    let mut garbage = TcpStream::connect(addr).await.unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    wait_until("the garbage is counted", || {
        failures(
            &server.stats(),
            Direction::Inbound,
            HandshakeFailure::Protocol,
        ) == 1
    })
    .await;

    // Two silent sockets: they hold the source's two handshake slots; a
    // third connection from the same address is refused at once.
    let silent_a = TcpStream::connect(addr).await.unwrap();
    let silent_b = TcpStream::connect(addr).await.unwrap();
    wait_until("both silent sockets are handshaking", || {
        server.stats().handshakes_in_progress(Direction::Inbound) == 2
    })
    .await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    let mut busy = [0u8; 2];
    tokio::time::timeout(GUARD, third.read_exact(&mut busy))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(busy, [0, 0], "answered busy");
    assert_eq!(
        failures(
            &server.stats(),
            Direction::Inbound,
            HandshakeFailure::PerSource
        ),
        1
    );
    // The silent ones miss the first-message deadline.
    wait_until("the silent sockets time out", || {
        failures(
            &server.stats(),
            Direction::Inbound,
            HandshakeFailure::Timeout,
        ) == 2
    })
    .await;
    assert_eq!(server.stats().handshakes_in_progress(Direction::Inbound), 0);
    drop((silent_a, silent_b, garbage));

    // A peer that finishes the handshake but never sends its hello.
    let endpoint = capwire::transport::Endpoint::new(
        Keypair::generate().unwrap(),
        TransportConfig::default(),
        capwire::ContactPolicy::AcceptAny,
    );
    let stream = TcpStream::connect(addr).await.unwrap();
    let mute = endpoint.connect(stream, Some(server.id())).await.unwrap();
    wait_until("the missing hello is counted", || {
        failures(&server.stats(), Direction::Inbound, HandshakeFailure::Hello) == 1
    })
    .await;
    assert_eq!(server.stats().sessions(Direction::Inbound), 0);
    drop(mute);

    // Outbound: the node at the address is not the one expected.
    let client = client_node().await;
    let wrong = Keypair::generate().unwrap().public();
    let err = client
        .connect(&Addr::Tcp(addr), Some(wrong))
        .await
        .unwrap_err();
    assert!(matches!(err, capwire::NodeError::Transport(_)), "{err:?}");
    assert_eq!(
        failures(
            &client.stats(),
            Direction::Outbound,
            HandshakeFailure::UnexpectedPeer
        ),
        1
    );
    assert_eq!(client.stats().handshake_failures_total(), 1);

    let text = scrape(metrics.local_addr()).await;
    let failed = |d: &str, r: &str| {
        sample(
            &text,
            &format!(r#"capwire_handshake_failures_total{{direction="{d}",reason="{r}"}}"#),
        )
    };
    assert_eq!(failed("inbound", "protocol"), Some(1), "{text}");
    assert_eq!(failed("inbound", "per_source"), Some(1));
    assert_eq!(failed("inbound", "timeout"), Some(2));
    assert_eq!(failed("inbound", "hello"), Some(1));
    assert_eq!(failed("inbound", "crypto"), Some(0));
    // One series per direction and reason, whatever happened.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("capwire_handshake_failures_total{"))
            .count(),
        HandshakeFailure::ALL
            .iter()
            .map(|r| Direction::ALL.iter().filter(|d| r.occurs(**d)).count())
            .sum::<usize>()
    );
    // The server dialled nobody; the outbound failure was the client's.
    assert_eq!(failed("outbound", "unexpected_peer"), Some(0));
    // Reasons that cannot happen in a direction have no series there.
    assert_eq!(failed("outbound", "rate_limited"), None);
    assert_eq!(failed("inbound", "unexpected_peer"), None);
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test]
async fn monitoring_copies_sent_and_dropped_are_counted() {
    let limits = Limits {
        copy_queue_len: 1,
        ..Limits::default()
    };
    let (server, _) = echo_node(limits).await;
    let cp = client_node().await;
    let invite = server.invite(None).unwrap();
    let (_cp_peer, reply) = cp.connect_invite(&invite).await.unwrap();
    assert!(reply.is_some(), "bound");

    let client = client_node().await;
    let peer = connect_tcp(&client, &server).await;
    const NOTES: u64 = 200;
    for i in 0..NOTES {
        peer.notify(Note, format!("note {i}")).await.unwrap();
    }
    // Every note was copied; with one queue slot, most copies of the
    // burst are given up, and every copy is either sent or dropped.
    wait_until("every copy is accounted for", || {
        let s = server.stats();
        s.copies_sent + s.copies_dropped == NOTES && s.copies_queued == 0
    })
    .await;
    let s = server.stats();
    assert!(s.copies_sent >= 1, "{s:?}");
    assert!(s.copies_dropped >= 1, "{s:?}");
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), server.clone())
        .await
        .unwrap();
    let text = scrape(metrics.local_addr()).await;
    assert_eq!(
        sample(&text, "capwire_copies_sent_total"),
        Some(s.copies_sent)
    );
    assert_eq!(
        sample(&text, "capwire_copies_dropped_total"),
        Some(s.copies_dropped)
    );
    client.shutdown().await;
    cp.shutdown().await;
    server.shutdown().await;
}

#[tokio::test]
async fn other_paths_and_methods_are_refused() {
    let node = client_node().await;
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), node.clone())
        .await
        .unwrap();
    let addr = metrics.local_addr();
    let status = |answer: &str| answer.lines().next().unwrap_or_default().to_owned();

    let answer = exchange(addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 404 Not Found");
    assert!(answer.contains("\r\nConnection: close\r\n"));
    let answer = exchange(addr, b"GET /metrics/../secrets HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 404 Not Found");
    let answer = exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 405 Method Not Allowed");
    assert!(answer.contains("\r\nAllow: GET, HEAD\r\n"));
    let answer = exchange(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 405 Method Not Allowed");
    let answer = exchange(
        addr,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), "HTTP/1.1 400 Bad Request");
    let answer = exchange(addr, b"GET /metrics HTTP/2\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 400 Bad Request");
    let answer = exchange(addr, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 400 Bad Request", "{answer}");
    // Two lengths: hyper's own 400.
    let answer = exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), "HTTP/1.1 400 Bad Request");
    // A body announced but never sent is not waited for.
    let answer = exchange(
        addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 100000000000\r\n\r\nabc",
    )
    .await;
    assert_eq!(status(&answer), "HTTP/1.1 405 Method Not Allowed");
    // HEAD: the headers of the answer (its length included), no body.
    let answer = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 200 OK");
    assert!(answer.ends_with("\r\n\r\n"), "{answer}");
    assert!(
        answer.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{answer}"
    );
    let len = answer
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map(|n| n.parse::<usize>().unwrap());
    assert!(len.is_some_and(|n| n > 0), "{answer}");
    // A query string is fine; HTTP/1.0 too (answered in HTTP/1.0, as
    // hyper does for a 1.0 client).
    let answer = exchange(addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.0 200 OK");
    assert!(answer.contains("\r\nConnection: close\r\n"), "{answer}");
    assert!(answer.contains("capwire_inflight 0\n"));
    node.shutdown().await;
}

#[tokio::test]
async fn hostile_scrapers_are_cut_off_and_the_endpoint_keeps_serving() {
    let node = client_node().await;
    let limits = ServerLimits {
        read_timeout: Duration::from_millis(300),
        max_connections: 2,
        ..ServerLimits::default()
    };
    let metrics = MetricsServer::bind_with("127.0.0.1:0".parse().unwrap(), node.clone(), limits)
        .await
        .unwrap();
    let addr = metrics.local_addr();
    // Each hostile client comes from an address of its own, and the
    // scraper from 127.0.0.2: with two slots, the second is kept for a
    // source that has none, so a client that has just been cut off (and
    // is still counted for a moment) does not turn the next one away.

    // 1 MiB of headers: cut off after 8 KiB with 431 (or a reset, when
    // the client is still writing as the server closes).
    let mut flood = connect_from("127.0.0.3", addr).await;
    let (mut rd, mut wr) = flood.split();
    let padding = format!(
        "GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let (_, answer) = tokio::time::timeout(GUARD, async {
        let write = async {
            let _ = wr.write_all(padding.as_bytes()).await;
        };
        let read = async {
            let mut answer = Vec::new();
            let _ = rd.read_to_end(&mut answer).await;
            answer
        };
        tokio::join!(write, read)
    })
    .await
    .expect("the flood is cut off");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431 "),
        "{answer}"
    );
    drop(flood);
    // Just over the bound, with nothing else in the way: 431 for sure.
    let over = format!(
        "GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(9 * 1024)
    );
    let mut big = connect_from("127.0.0.4", addr).await;
    big.write_all(over.as_bytes()).await.unwrap();
    let mut answer = vec![0; 1024];
    let n = tokio::time::timeout(GUARD, big.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    drop(big);
    scrape_from("127.0.0.2", addr).await;

    // A silent client is answered 408 and closed after the read deadline,
    // and while it waits, others are served.
    let started = tokio::time::Instant::now();
    let mut silent = connect_from("127.0.0.5", addr).await;
    scrape_from("127.0.0.2", addr).await;
    let mut answer = String::new();
    tokio::time::timeout(GUARD, silent.read_to_string(&mut answer))
        .await
        .expect("the silent client is cut off")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("\r\nConnection: close\r\n"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    // A client that sends its head a byte at a time, too slowly, is cut
    // off all the same: the deadline is for the whole head.
    let mut slow = connect_from("127.0.0.6", addr).await;
    let started = tokio::time::Instant::now();
    let dribble = async {
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n" {
            if slow.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut answer = String::new();
        let _ = slow.read_to_string(&mut answer).await;
        answer
    };
    let answer = tokio::time::timeout(GUARD, dribble).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    // Cut at the deadline, long before the 33 bytes were all sent.
    assert!(
        started.elapsed() < Duration::from_millis(33 * 50),
        "{:?}",
        started.elapsed()
    );

    // Beyond max_connections, clients wait in the backlog and are served
    // once a slot frees up.
    let hold_a = connect_from("127.0.0.7", addr).await;
    let hold_b = connect_from("127.0.0.8", addr).await;
    let started = tokio::time::Instant::now();
    scrape_from("127.0.0.2", addr).await;
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "served only after a silent client was cut off"
    );
    drop((hold_a, hold_b));
    scrape_from("127.0.0.2", addr).await;
    node.shutdown().await;
}

/// One address opening silent sockets again and again must not keep the
/// scraper out (all 16 slots, each held for the head deadline): a source
/// has at most `max_connections_per_source` of them, one more is refused
/// at once, the last free slot is kept for a new source, and a silent
/// socket is cut at the short head deadline.
#[tokio::test]
async fn one_address_cannot_lock_the_scraper_out() {
    let node = client_node().await;
    let defaults = ServerLimits::default();
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), node.clone())
        .await
        .unwrap();
    let addr = metrics.local_addr();

    let started = tokio::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..defaults.max_connections {
        silent.push(connect_from("127.0.0.1", addr).await);
    }
    // A scraper elsewhere is served at once, not after a silent socket
    // is cut off.
    let scraped = tokio::time::Instant::now();
    scrape_from("127.0.0.2", addr).await;
    assert!(
        scraped.elapsed() < Duration::from_secs(1),
        "the scrape waited {:?}",
        scraped.elapsed()
    );

    // Each silent socket is either refused at once (beyond the source's
    // bound) or cut at the head deadline (2 s by default).
    let ends: Vec<_> = silent
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut answer = String::new();
                tokio::time::timeout(GUARD, s.read_to_string(&mut answer))
                    .await
                    .expect("cut off")
                    .unwrap();
                (answer, started.elapsed())
            })
        })
        .collect();
    let (mut refused, mut kept) = (0, 0);
    for end in ends {
        let (answer, at) = end.await.unwrap();
        if answer.starts_with("HTTP/1.1 503 ") {
            assert!(at < Duration::from_secs(1), "refused only after {at:?}");
            refused += 1;
        } else {
            assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
            assert!(
                at >= defaults.read_timeout && at < defaults.read_timeout + Duration::from_secs(1),
                "cut after {at:?}"
            );
            kept += 1;
        }
    }
    assert_eq!(kept, defaults.max_connections_per_source);
    assert_eq!(
        refused,
        defaults.max_connections - defaults.max_connections_per_source
    );

    // With no bound per source at all, the last slot is still kept for
    // another source.
    let open = ServerLimits {
        max_connections: 4,
        max_connections_per_source: 4,
        ..ServerLimits::default()
    };
    let metrics = MetricsServer::bind_with("127.0.0.1:0".parse().unwrap(), node.clone(), open)
        .await
        .unwrap();
    let addr = metrics.local_addr();
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(connect_from("127.0.0.1", addr).await);
    }
    // (Silent too: a request sent to a closing socket may meet a reset.)
    let mut fourth = connect_from("127.0.0.1", addr).await;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(1), fourth.read_to_string(&mut answer))
        .await
        .expect("refused at once")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    let scraped = tokio::time::Instant::now();
    scrape_from("127.0.0.2", addr).await;
    assert!(scraped.elapsed() < Duration::from_secs(1));
    drop(silent);
    node.shutdown().await;
}

#[tokio::test]
async fn the_endpoint_stops_when_the_node_shuts_down() {
    let node = client_node().await;
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), node.clone())
        .await
        .unwrap();
    let addr = metrics.local_addr();
    // A silent connection in progress does not hold the shutdown up.
    let _silent = TcpStream::connect(addr).await.unwrap();
    scrape(addr).await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served_addr = listener.local_addr().unwrap();
    let served = tokio::spawn(capwire::prometheus::serve(node.clone(), listener));
    scrape(served_addr).await;

    tokio::time::timeout(GUARD, node.shutdown()).await.unwrap();
    tokio::time::timeout(GUARD, metrics.stopped())
        .await
        .expect("the server stops with the node");
    tokio::time::timeout(GUARD, served)
        .await
        .expect("serve returns when the node shuts down")
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the port is closed"
    );
    assert!(TcpStream::connect(served_addr).await.is_err());
}

#[tokio::test]
async fn stop_ends_the_endpoint_and_leaves_the_node_running() {
    let (node, _) = echo_node(Limits::default()).await;
    let metrics = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), node.clone())
        .await
        .unwrap();
    let addr = metrics.local_addr();
    scrape(addr).await;
    metrics.stop();
    tokio::time::timeout(GUARD, metrics.stopped())
        .await
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
    let client = client_node().await;
    let peer = connect_tcp(&client, &node).await;
    assert_eq!(
        peer.request(Say, "still".into()).await.unwrap(),
        "echo: still"
    );
    client.shutdown().await;
    node.shutdown().await;
}
