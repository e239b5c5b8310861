//! Behaviour of the tokio driver that users rely on: ordering, coalescing,
//! close, keepalive, backpressure, shutdown, and the stream kinds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use capwire_transport::{
    CloseCode, ConnectionEnd, ContactPolicy, Endpoint, Initiator, Keypair, OsEntropy,
    RecordDecoder, RecordEncoder, Responder, TransportConfig, TransportError, TransportSession,
};
use common::{Got, SnowPeer, default_endpoint, duplex, endpoint, pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

#[tokio::test]
async fn records_arrive_in_order_from_cloned_senders() {
    let (client, server) = pair(TransportConfig::default()).await;
    let (sender, _rx) = client.split();
    let (_tx, mut receiver) = server.split();
    let mut tasks = Vec::new();
    for t in 0..4u8 {
        let sender = sender.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..500u32 {
                let mut r = vec![t];
                r.extend_from_slice(&i.to_be_bytes());
                sender.send(r).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut next = [0u32; 4];
    for _ in 0..2000 {
        let r = receiver.recv().await.unwrap().unwrap();
        let t = usize::from(r[0]);
        let i = u32::from_be_bytes(r[1..5].try_into().unwrap());
        assert_eq!(i, next[t], "each sender's records stay in order");
        next[t] += 1;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn queued_records_share_one_noise_message() {
    let client = default_endpoint();
    let (a, b) = duplex();
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move {
        let mut peer = SnowPeer::accept(b, &kp.secret_bytes()).await;
        let mut got = Vec::new();
        for _ in 0..500 {
            got.push(peer.recv_record().await);
        }
        (got, peer.messages)
    });
    let conn = client.connect(a, None).await.unwrap();
    // Queue 500 records before the writer task gets to run.
    for i in 0..500u32 {
        conn.sender().try_send(i.to_be_bytes().to_vec()).unwrap();
    }
    let (got, messages) = peer.await.unwrap();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, r)| r[..] == (i as u32).to_be_bytes())
    );
    assert_eq!(messages, 1, "500 small records, one AEAD operation");
}

#[tokio::test]
async fn a_lone_record_is_sent_without_waiting_for_more() {
    let (client, mut server) = pair(TransportConfig::default()).await;
    client.send(&b"alone"[..]).await.unwrap();
    // With time paused nothing would advance: the record must not depend on
    // a timer to be flushed.
    tokio::time::pause();
    assert_eq!(&server.recv().await.unwrap().unwrap()[..], b"alone");
}

#[tokio::test]
async fn close_delivers_queued_records_then_a_clean_end() {
    let (client, mut server) = pair(TransportConfig::default()).await;
    for i in 0..100u8 {
        client.send(vec![i; 1000]).await.unwrap();
    }
    client.close("finished").await.unwrap();
    client.close("again").await.unwrap(); // idempotent
    for i in 0..100u8 {
        assert_eq!(server.recv().await.unwrap().unwrap(), vec![i; 1000]);
    }
    assert_eq!(server.recv().await.unwrap(), None);
    assert_eq!(server.recv().await.unwrap(), None, "stays closed");
    let (server_tx, server_rx) = server.split();
    let reason = server_rx.close_reason().unwrap();
    assert_eq!(reason.code, CloseCode::Normal);
    assert_eq!(reason.reason, "finished");
    assert!(matches!(
        server_tx.ended().await,
        ConnectionEnd::ClosedByPeer(_)
    ));
    assert!(matches!(
        server_tx.send(&b"x"[..]).await,
        Err(TransportError::Closed)
    ));
    assert!(matches!(
        client.send(&b"x"[..]).await,
        Err(TransportError::Closed)
    ));
}

#[tokio::test]
async fn dropping_every_handle_closes_cleanly() {
    let (client, mut server) = pair(TransportConfig::default()).await;
    client.send(&b"last words"[..]).await.unwrap();
    drop(client);
    assert_eq!(&server.recv().await.unwrap().unwrap()[..], b"last words");
    assert_eq!(server.recv().await.unwrap(), None);
}

#[tokio::test]
async fn the_receiver_alone_keeps_the_connection_open() {
    let (client, server) = pair(TransportConfig::default()).await;
    let (client_tx, mut client_rx) = client.split();
    drop(client_tx);
    server.send(&b"still listening?"[..]).await.unwrap();
    assert_eq!(
        &client_rx.recv().await.unwrap().unwrap()[..],
        b"still listening?"
    );
}

#[tokio::test(start_paused = true)]
async fn keepalives_keep_a_quiet_connection_open() {
    let (client, mut server) = pair(TransportConfig::default()).await;
    // Ten idle timeouts of silence from both applications.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!client.sender().is_closed());
    client.send(&b"still alive"[..]).await.unwrap();
    assert_eq!(&server.recv().await.unwrap().unwrap()[..], b"still alive");
}

#[tokio::test(start_paused = true)]
async fn keepalives_are_empty_messages_sent_when_idle() {
    let client = default_endpoint();
    let (a, b) = duplex();
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move { SnowPeer::accept(b, &kp.secret_bytes()).await });
    let _conn = client.connect(a, None).await.unwrap();
    let mut peer = peer.await.unwrap();
    let start = tokio::time::Instant::now();
    let mut buf = vec![0u8; 64];
    for k in 1..=3u32 {
        let msg = common::read_msg(&mut peer.stream).await.unwrap().unwrap();
        assert_eq!(msg.len(), 16, "a keepalive is an empty plaintext");
        assert_eq!(peer.transport.read_message(&msg, &mut buf).unwrap(), 0);
        assert_eq!(start.elapsed().as_secs(), 15 * u64::from(k));
    }
}

#[tokio::test(start_paused = true)]
async fn backpressure_and_try_send() {
    let mut config = TransportConfig::default();
    config.send_queue_depth = 4;
    let client = endpoint(config, ContactPolicy::AcceptAny);
    let server = default_endpoint();
    // A small pipe and a server application that never reads: once the
    // pipe, the server's bounded receive queue and our send queue are full,
    // `send` waits and `try_send` reports a full queue.
    let (a, b) = tokio::io::duplex(1024);
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(b).await });
    let conn = client.connect(a, None).await.unwrap();
    let _server_conn = accept.await.unwrap().unwrap();
    let sender = conn.sender();
    let big = Bytes::from(vec![0u8; 64 * 1024]);
    let mut sent = 0;
    loop {
        // Paused time only advances once every task is stuck.
        match tokio::time::timeout(Duration::from_secs(1), sender.send(big.clone())).await {
            Ok(r) => r.unwrap(),
            Err(_) => break,
        }
        sent += 1;
        assert!(sent < 1000, "memory must be bounded");
    }
    assert!(matches!(
        sender.try_send(big.clone()),
        Err(TransportError::QueueFull)
    ));
    assert!(!sender.is_closed());
}

#[tokio::test]
async fn oversize_records_are_refused_locally() {
    let mut config = TransportConfig::default();
    config.max_record_size = 1000;
    let (client, mut server) = pair(config).await;
    assert!(matches!(
        client.send(vec![0u8; 1001]).await,
        Err(TransportError::RecordTooLarge {
            len: 1001,
            max: 1000
        })
    ));
    client.send(vec![1u8; 1000]).await.unwrap();
    assert_eq!(server.recv().await.unwrap().unwrap().len(), 1000);
}

#[tokio::test]
async fn shutdown_closes_every_connection_with_a_reason() {
    let a = default_endpoint();
    let b = default_endpoint();
    let (client, mut server) = common::connected(&a, &b).await;
    a.shutdown().await;
    assert_eq!(server.recv().await.unwrap(), None);
    let (_, rx) = server.split();
    assert_eq!(rx.close_reason().unwrap().code, CloseCode::Shutdown);
    assert!(matches!(
        client.send(&b"x"[..]).await,
        Err(TransportError::Closed)
    ));
    let (x, _y) = duplex();
    assert!(matches!(
        a.connect(x, None).await,
        Err(TransportError::Closed)
    ));
}

#[tokio::test]
async fn connect_checks_the_expected_key() {
    let client = default_endpoint();
    let server = default_endpoint();
    let wrong = Keypair::generate().unwrap().public();
    let (x, y) = duplex();
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(y).await });
    match client.connect(x, Some(wrong)).await {
        Err(TransportError::UnexpectedPeer { expected, actual }) => {
            assert_eq!(expected, wrong);
            assert_eq!(actual, server.local_id());
        }
        other => panic!("{other:?}"),
    }
    assert!(accept.await.unwrap().is_err());
}

#[tokio::test]
async fn both_sides_agree_on_identity_and_handshake_hash() {
    let a = default_endpoint();
    let b = default_endpoint();
    let (c, s) = common::connected(&a, &b).await;
    assert_eq!(c.remote(), b.local_id());
    assert_eq!(s.remote(), a.local_id());
    assert_eq!(c.handshake_hash(), s.handshake_hash());
}

#[tokio::test]
async fn works_over_tcp_and_unix_sockets() {
    let a = default_endpoint();
    let b = default_endpoint();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = b.clone();
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut conn = srv.accept(stream).await.unwrap();
        while let Some(r) = conn.recv().await.unwrap() {
            conn.send(r).await.unwrap();
        }
    });
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut conn = a.connect(stream, Some(b.local_id())).await.unwrap();
    let record = vec![5u8; 300_000];
    conn.send(record.clone()).await.unwrap();
    assert_eq!(conn.recv().await.unwrap().unwrap(), record);
    conn.close("").await.unwrap();
    server.await.unwrap();

    let (x, y) = tokio::net::UnixStream::pair().unwrap();
    let srv = b.clone();
    let server = tokio::spawn(async move { srv.accept(y).await.unwrap() });
    let mut conn = a.connect(x, None).await.unwrap();
    let server_conn = server.await.unwrap();
    server_conn.send(&b"over unix"[..]).await.unwrap();
    assert_eq!(&conn.recv().await.unwrap().unwrap()[..], b"over unix");
}

#[tokio::test]
async fn empty_and_large_records_round_trip() {
    let (client, mut server) = pair(TransportConfig::default()).await;
    let sizes = [
        0usize,
        1,
        65_513,
        65_514,
        65_515,
        65_516,
        65_519,
        65_520,
        200_000,
        3 << 20,
    ];
    for &n in &sizes {
        client.send(vec![(n % 255) as u8; n]).await.unwrap();
    }
    for &n in &sizes {
        let r = server.recv().await.unwrap().unwrap();
        assert_eq!(r.len(), n);
        assert!(r.iter().all(|&b| b == (n % 255) as u8));
    }
}

#[tokio::test]
async fn a_snow_peer_sees_our_close_record() {
    let client = default_endpoint();
    let (a, b) = duplex();
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move {
        let mut peer = SnowPeer::accept(b, &kp.secret_bytes()).await;
        let first = peer.recv().await;
        let second = peer.recv().await;
        (first, second)
    });
    let conn = client.connect(a, None).await.unwrap();
    conn.close("see you").await.unwrap();
    let (first, second) = peer.await.unwrap();
    assert_eq!(first, Some(Got::Close(0, "see you".into())));
    assert_eq!(second, None, "the stream ends after the close record");
}

#[test]
fn an_invalid_configuration_is_reported() {
    let mut config = TransportConfig::default();
    config.max_concurrent_handshakes = 0;
    assert!(matches!(
        Endpoint::try_new(
            Keypair::generate().unwrap(),
            config,
            ContactPolicy::AcceptAny
        ),
        Err(TransportError::InvalidConfig(_))
    ));
}

// ---------------------------------------------------------------------------
// Handshake-only entry points: the caller owns the stream and the record
// layer.

fn session_pair() -> (TransportSession, TransportSession) {
    let a = Keypair::generate().unwrap();
    let b = Keypair::generate().unwrap();
    let (mut m1, mut m2, mut m3, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let i = Initiator::new(&a, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    let r = Responder::new(&b, &OsEntropy)
        .unwrap()
        .read_message(&m1, &mut p)
        .unwrap()
        .write_message(&[], &mut m2)
        .unwrap();
    let i = i
        .read_message(&m2, &mut p)
        .unwrap()
        .write_message(&[], &mut m3)
        .unwrap();
    (i, r.read_message(&m3, &mut p).unwrap())
}

#[tokio::test]
async fn handshake_responder_hands_over_the_stream_and_the_early_records() {
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let srv = server.clone();
    let task = tokio::spawn(async move { srv.handshake_responder(b).await });

    // A hand-driven initiator that sends message 3 and its first transport
    // message in one write.
    let kp = Keypair::generate().unwrap();
    let mut m1 = Vec::new();
    let waiting = Initiator::new(&kp, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    common::write_msg(&mut a, &m1).await.unwrap();
    let m2 = common::read_msg(&mut a).await.unwrap().unwrap();
    let mut m3 = Vec::new();
    let session = waiting
        .read_message(&m2, &mut Vec::new())
        .unwrap()
        .write_message(&[], &mut m3)
        .unwrap();
    let (sealer, opener) = session.split();
    let mut enc = RecordEncoder::new(sealer, 1 << 20, None);
    let mut dec = RecordDecoder::new(opener, 1 << 20);
    enc.push_record(b"early").unwrap();
    enc.flush().unwrap();
    let mut bytes = u16::try_from(m3.len()).unwrap().to_be_bytes().to_vec();
    bytes.extend_from_slice(&m3);
    bytes.extend_from_slice(enc.wire());
    a.write_all(&bytes).await.unwrap();

    let established = task.await.unwrap().unwrap();
    assert_eq!(established.session.remote(), kp.public());
    assert!(
        !established.leftover.is_empty(),
        "the early record was read along with message 3"
    );
    let (mut s_enc, mut s_dec) = server.record_layer(established.session);
    let mut buf = established.leftover;
    let mut records = Vec::new();
    s_dec.decode(&mut buf, &mut records).unwrap();
    assert_eq!(records, [Bytes::from_static(b"early")]);

    // The caller writes on the stream it got back.
    let mut stream = established.stream;
    s_enc.push_record(b"reply").unwrap();
    s_enc.flush().unwrap();
    stream.write_all(s_enc.wire()).await.unwrap();
    let mut cbuf = BytesMut::new();
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(a.read_buf(&mut cbuf).await.unwrap() > 0);
        dec.decode(&mut cbuf, &mut got).unwrap();
    }
    assert_eq!(got, [Bytes::from_static(b"reply")]);
}

#[tokio::test]
async fn handshake_initiator_and_responder_finish_together() {
    let client = default_endpoint();
    let server = default_endpoint();
    let (a, b) = duplex();
    let srv = server.clone();
    let task = tokio::spawn(async move { srv.handshake_responder(b).await });
    let c = client
        .handshake_initiator(a, Some(server.local_id()))
        .await
        .unwrap();
    let s = task.await.unwrap().unwrap();
    assert!(c.leftover.is_empty());
    assert_eq!(c.session.remote(), server.local_id());
    assert_eq!(s.session.remote(), client.local_id());
    assert_eq!(c.session.handshake_hash(), s.session.handshake_hash());

    // Wrong expected key: refused before message 3.
    let (a, b) = duplex();
    let srv = server.clone();
    let task = tokio::spawn(async move { srv.handshake_responder(b).await });
    let wrong = Keypair::generate().unwrap().public();
    assert!(matches!(
        client.handshake_initiator(a, Some(wrong)).await,
        Err(TransportError::UnexpectedPeer { .. })
    ));
    assert!(matches!(task.await.unwrap(), Err(TransportError::PeerLost)));
}

#[tokio::test]
async fn handshake_responder_sends_denied_to_a_refused_peer() {
    let server = endpoint(
        TransportConfig::default(),
        ContactPolicy::callback(|_| false),
    );
    let client = default_endpoint();
    let (a, b) = duplex();
    let srv = server.clone();
    let task = tokio::spawn(async move { srv.handshake_responder(b).await });
    let established = client.handshake_initiator(a, None).await.unwrap();
    assert!(matches!(
        task.await.unwrap(),
        Err(TransportError::Denied(id)) if id == client.local_id()
    ));
    let (_, mut dec) = client.record_layer(established.session);
    let mut stream = established.stream;
    let mut buf = BytesMut::new();
    let mut records = Vec::new();
    loop {
        let decoded = dec.decode(&mut buf, &mut records).unwrap();
        if let Some(close) = decoded.close {
            assert_eq!(close.code, CloseCode::Denied);
            break;
        }
        assert!(
            stream.read_buf(&mut buf).await.unwrap() > 0,
            "a close record first"
        );
    }
    assert!(records.is_empty());
}

#[tokio::test(start_paused = true)]
async fn handshake_responder_takes_no_handshake_slot() {
    let mut config = TransportConfig::default();
    config.max_concurrent_handshakes = 1;
    let server = endpoint(config, ContactPolicy::AcceptAny);
    let (_silent, b) = duplex();
    let srv = server.clone();
    let pending = tokio::spawn(async move { srv.handshake_responder(b).await.map(|_| ()) });
    tokio::task::yield_now().await;
    assert_eq!(server.available_handshake_slots(), 1);
    // `accept` still has its one slot while the other handshake waits.
    let client = default_endpoint();
    let (c, s) = common::connected(&client, &server).await;
    assert_eq!(s.remote(), client.local_id());
    drop((c, s));
    assert!(matches!(
        pending.await.unwrap(),
        Err(TransportError::HandshakeTimeout)
    ));
}

#[test]
fn record_layer_uses_the_endpoint_configuration() {
    let mut config = TransportConfig::default();
    config.max_record_size = 100;
    config.rekey_after_messages = Some(1);
    config.start_nonce_for_testing = 7;
    let ours = endpoint(config, ContactPolicy::AcceptAny);
    let (i, r) = session_pair();
    let (mut enc, _) = ours.record_layer(i);
    let (_, mut dec) = ours.record_layer(r);
    assert_eq!(enc.nonce(), 7);
    assert_eq!(dec.nonce(), 7);
    assert!(matches!(
        enc.push_record(&[0; 101]),
        Err(TransportError::RecordTooLarge { len: 101, max: 100 })
    ));
    enc.push_record(b"a").unwrap();
    enc.flush().unwrap();
    // RECORD chunk (4) + REKEY chunk (3) + tag (16), after the prefix.
    assert_eq!(enc.wire()[..2], [0, 23]);
    enc.push_record(b"b").unwrap();
    enc.flush().unwrap();
    let mut buf = BytesMut::from(enc.wire());
    let mut out = Vec::new();
    assert_eq!(dec.decode(&mut buf, &mut out).unwrap().messages, 2);
    assert_eq!(out, [Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
}

// ---------------------------------------------------------------------------
// The busy refusal.

#[tokio::test]
async fn a_busy_refusal_gives_the_initiator_a_busy_error() {
    let client = default_endpoint();
    let (a, b) = duplex();
    let refusal = tokio::spawn(Endpoint::refuse_busy(b));
    assert!(matches!(
        client.connect(a, None).await,
        Err(TransportError::Busy)
    ));
    refusal.await.unwrap();

    // Over TCP, where the refusing side must not reset the connection
    // before the initiator has read the refusal.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refusal = tokio::spawn(async move {
        for _ in 0..2 {
            let (stream, _) = listener.accept().await.unwrap();
            Endpoint::refuse_busy(stream).await;
        }
    });
    for _ in 0..2 {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(matches!(
            client.handshake_initiator(stream, None).await,
            Err(TransportError::Busy)
        ));
    }
    refusal.await.unwrap();
}

#[tokio::test]
async fn refuse_busy_writes_two_zero_bytes_then_hangs_up() {
    let (mut a, b) = duplex();
    let refusal = tokio::spawn(Endpoint::refuse_busy(b));
    a.write_all(&[0x00, 0x20]).await.unwrap();
    a.write_all(&[7u8; 32]).await.unwrap();
    let mut got = Vec::new();
    a.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, [0, 0]);
    drop(a);
    refusal.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn refuse_busy_lets_go_within_its_bound() {
    // A peer that neither sends nor hangs up.
    let (_a, b) = duplex();
    let start = Instant::now();
    Endpoint::refuse_busy(b).await;
    assert!(start.elapsed() <= Endpoint::BUSY_LINGER);
    // A peer that never reads, over a pipe with no room at all.
    let (_a, b) = tokio::io::duplex(1);
    let start = Instant::now();
    Endpoint::refuse_busy(b).await;
    assert!(start.elapsed() <= Endpoint::BUSY_LINGER);
}

#[tokio::test]
async fn a_zero_length_message_is_busy_only_in_place_of_message_2() {
    // The responder still treats an empty message 1 as a short message.
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    a.write_all(&[0, 0]).await.unwrap();
    assert!(matches!(
        accept.await.unwrap(),
        Err(TransportError::PeerMisbehaved(
            capwire_transport::Violation::ShortMessage
        ))
    ));
}
