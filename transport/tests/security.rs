//! One test (or a small group) per item of the "Transport" list in
//! SECURITY.md, each asserting the typed error and that no plaintext
//! reached the application. Test names start with the item's number.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use capwire_envelope::NodeId;
use capwire_transport::{
    ConnectionEnd, ContactPolicy, EntropyError, EntropySource, Initiator, Keypair, OsEntropy,
    RecordDecoder, RecordEncoder, Responder, TransportConfig, TransportError, TransportSession,
    Violation, canonical_node_id,
};
use common::{
    Out, SnowPeer, default_endpoint, duplex, endpoint, read_msg, snow_builder, write_msg,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn violation(r: Result<impl std::fmt::Debug, TransportError>) -> Violation {
    match r {
        Err(TransportError::PeerMisbehaved(v)) => v,
        other => panic!("expected a protocol violation, got {other:?}"),
    }
}

/// Our endpoint accepts; a snow-based peer connects. Returns both.
async fn snow_client(
    server: &capwire_transport::Endpoint,
) -> (
    capwire_transport::Connection,
    SnowPeer<tokio::io::DuplexStream>,
) {
    let (a, b) = duplex();
    let server = server.clone();
    let accept = tokio::spawn(async move { server.accept(b).await });
    let kp = Keypair::generate().unwrap();
    let peer = SnowPeer::connect(a, &kp.secret_bytes()).await;
    (accept.await.unwrap().unwrap(), peer)
}

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

// ---------------------------------------------------------------------------
// 1. Length prefix over the limit or shorter than a tag [reject before
//    allocating; close]. Plaintext larger than one Noise message [split,
//    never truncated].

#[tokio::test(start_paused = true)]
async fn item01_handshake_length_prefix_over_the_limit_is_refused_before_the_body() {
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    // Announce 65535 bytes and send none of them: the refusal cannot have
    // waited for (or allocated) the body, or it would be a timeout.
    a.write_all(&[0xff, 0xff]).await.unwrap();
    assert_eq!(violation(accept.await.unwrap()), Violation::MessageLength);
    // The stream was dropped.
    let mut rest = Vec::new();
    a.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn item01_transport_length_prefix_shorter_than_a_tag_closes() {
    for len in [0u16, 1, 15] {
        let server = default_endpoint();
        let (mut conn, mut peer) = snow_client(&server).await;
        peer.send_records(&[b"fine"]).await;
        let mut raw = len.to_be_bytes().to_vec();
        raw.extend(std::iter::repeat_n(0u8, usize::from(len)));
        peer.stream.write_all(&raw).await.unwrap();
        assert_eq!(&conn.recv().await.unwrap().unwrap()[..], b"fine");
        assert_eq!(violation(conn.recv().await), Violation::ShortMessage);
        assert!(matches!(
            conn.sender().ended().await,
            ConnectionEnd::Failed(TransportError::PeerMisbehaved(Violation::ShortMessage))
        ));
    }
}

#[tokio::test]
async fn item01_record_over_the_size_limit_is_refused_on_announcement() {
    let mut config = TransportConfig::default();
    config.max_record_size = 100_000;
    let server = endpoint(config, ContactPolicy::AcceptAny);
    let (mut conn, mut peer) = snow_client(&server).await;
    // A first part announcing 100001 bytes: refused at once, before the
    // rest arrives and before any buffer is allocated for it.
    let mut plain = vec![common::FIRST, 0, 14];
    plain.extend_from_slice(&100_001u32.to_be_bytes());
    plain.extend_from_slice(b"0123456789");
    peer.send_plaintext(&plain).await;
    assert_eq!(violation(conn.recv().await), Violation::RecordTooLarge);
}

#[tokio::test]
async fn item01_split_record_overrunning_its_announced_length_is_refused() {
    let server = default_endpoint();
    let (mut conn, mut peer) = snow_client(&server).await;
    let mut plain = vec![common::FIRST, 0, 14];
    plain.extend_from_slice(&20u32.to_be_bytes());
    plain.extend_from_slice(b"0123456789");
    peer.send_plaintext(&plain).await;
    let mut plain = vec![common::NEXT, 0, 11];
    plain.extend_from_slice(b"0123456789X");
    peer.send_plaintext(&plain).await;
    assert_eq!(violation(conn.recv().await), Violation::Framing);
}

#[tokio::test]
async fn item01_plaintext_larger_than_one_message_is_split_never_truncated() {
    let client = default_endpoint();
    let (a, b) = duplex();
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move {
        let mut peer = SnowPeer::accept(b, &kp.secret_bytes()).await;
        let record = peer.recv_record().await;
        (record, peer.messages)
    });
    let conn = client.connect(a, None).await.unwrap();
    let record: Vec<u8> = (0..(1 << 20) + 1).map(|i: u32| (i % 253) as u8).collect();
    conn.send(record.clone()).await.unwrap();
    let (got, messages) = peer.await.unwrap();
    assert_eq!(got, record);
    assert!(
        messages >= 17,
        "1 MiB needs at least 17 messages of at most 65535 bytes"
    );
}

// ---------------------------------------------------------------------------
// 2. Truncated frame, slow-loris peer, silent peer [handshake and idle
//    deadlines; close; nothing partial delivered].

#[tokio::test]
async fn item02_truncated_message_then_end_of_stream_is_peer_lost() {
    let server = default_endpoint();
    let (mut conn, mut peer) = snow_client(&server).await;
    peer.send_records(&[b"whole"]).await;
    let mut sealed = vec![0u8; 100];
    let plain = [common::RECORD, 0, 4, b'c', b'u', b't', b'!'];
    let n = peer.transport.write_message(&plain, &mut sealed).unwrap();
    let mut framed = (n as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&sealed[..n]);
    peer.stream
        .write_all(&framed[..framed.len() / 2])
        .await
        .unwrap();
    peer.stream.shutdown().await.unwrap();
    assert_eq!(&conn.recv().await.unwrap().unwrap()[..], b"whole");
    assert!(matches!(conn.recv().await, Err(TransportError::PeerLost)));
}

#[tokio::test]
async fn item02_split_record_cut_short_is_never_delivered() {
    let server = default_endpoint();
    let (mut conn, mut peer) = snow_client(&server).await;
    let mut plain = vec![common::FIRST, 0, 14];
    plain.extend_from_slice(&1000u32.to_be_bytes());
    plain.extend_from_slice(b"first part");
    peer.send_plaintext(&plain).await;
    drop(peer);
    assert!(matches!(conn.recv().await, Err(TransportError::PeerLost)));
}

#[tokio::test(start_paused = true)]
async fn item02_slow_loris_handshake_hits_the_deadline() {
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    let kp = Keypair::generate().unwrap();
    let mut hs = snow_builder(&kp.secret_bytes()).build_initiator().unwrap();
    let mut m1 = vec![0u8; 64];
    let n = hs.write_message(&[], &mut m1).unwrap();
    let mut framed = (n as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&m1[..n]);
    // One byte a second: 34 seconds for message 1, over the 10 s deadline.
    let dribble = tokio::spawn(async move {
        for byte in framed {
            if a.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    assert!(matches!(
        accept.await.unwrap(),
        Err(TransportError::HandshakeTimeout)
    ));
    dribble.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn item02_silent_peer_during_handshake_hits_the_deadline() {
    let ours = default_endpoint();
    let (_a, b) = duplex();
    assert!(matches!(
        ours.accept(b).await,
        Err(TransportError::HandshakeTimeout)
    ));
    let (a, _b) = duplex();
    assert!(matches!(
        ours.connect(a, None).await,
        Err(TransportError::HandshakeTimeout)
    ));
}

#[tokio::test(start_paused = true)]
async fn item02_slow_loris_after_handshake_hits_the_idle_deadline() {
    let server = default_endpoint();
    let (mut conn, mut peer) = snow_client(&server).await;
    let mut sealed = vec![0u8; 100];
    let plain = [common::RECORD, 0, 4, b's', b'l', b'o', b'w'];
    let n = peer.transport.write_message(&plain, &mut sealed).unwrap();
    let mut framed = (n as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&sealed[..n]);
    // A byte every 5 s: bytes keep coming, but no message completes for
    // 125 s, past the 60 s idle deadline.
    let dribble = tokio::spawn(async move {
        for byte in framed {
            if peer.stream.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });
    assert!(matches!(
        conn.recv().await,
        Err(TransportError::IdleTimeout)
    ));
    dribble.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn item02_silent_peer_after_handshake_hits_the_idle_deadline() {
    let server = default_endpoint();
    let (mut conn, _peer) = snow_client(&server).await;
    assert!(matches!(
        conn.recv().await,
        Err(TransportError::IdleTimeout)
    ));
    assert!(matches!(
        conn.send(&b"late"[..]).await,
        Err(TransportError::IdleTimeout)
    ));
}

// ---------------------------------------------------------------------------
// 3. Bit flip in ciphertext or tag [no plaintext released, nonce not
//    advanced; close].

#[test]
fn item03_bit_flip_releases_nothing_and_keeps_the_nonce() {
    let plaintext = b"attack at dawn, bring snacks";
    for position in [
        0,
        10,
        plaintext.len() - 1,
        plaintext.len(),
        plaintext.len() + 15,
    ] {
        let (mut a, b) = session_pair();
        let (_, mut opener) = b.split();
        let mut msg = Vec::new();
        a.seal(plaintext, &mut msg).unwrap();
        let mut flipped = msg.clone();
        flipped[position] ^= 0x01;
        let mut out = Vec::new();
        assert_eq!(
            violation(opener.open(&flipped, &mut out)),
            Violation::Decrypt
        );
        assert!(out.is_empty(), "no plaintext released");
        assert_eq!(opener.nonce(), 0, "nonce not advanced");
        // The session is over: even the genuine message is refused now.
        assert!(opener.open(&msg, &mut out).is_err());
        assert!(out.is_empty());
        assert!(opener.has_failed());
        // In place, the buffer keeps the ciphertext.
        let (mut a, b) = session_pair();
        let (_, mut opener) = b.split();
        let mut msg = Vec::new();
        a.seal(plaintext, &mut msg).unwrap();
        msg[position] ^= 0x01;
        let before = msg.clone();
        assert!(opener.open_in_place(&mut msg).is_err());
        assert_eq!(msg, before);
    }
}

#[tokio::test]
async fn item03_bit_flip_on_the_wire_closes_the_session() {
    // Index 0 and 1 are handshake messages; 3 is the second record.
    for (what, offset_from_end) in [("ciphertext", 20usize), ("tag", 1)] {
        let server = default_endpoint();
        let (c, c_relay) = duplex();
        let (s_relay, s) = duplex();
        common::relay(c_relay, s_relay, move |i, mut m| {
            if i == 3 {
                let at = m.len() - offset_from_end;
                m[at] ^= 0x80;
            }
            vec![Out::ToServer(m)]
        });
        let srv = server.clone();
        let accept = tokio::spawn(async move { srv.accept(s).await });
        let kp = Keypair::generate().unwrap();
        let mut peer = SnowPeer::connect(c, &kp.secret_bytes()).await;
        let mut conn = accept.await.unwrap().unwrap();
        peer.send_records(&[b"first record here", b"second record here"])
            .await;
        assert_eq!(
            &conn.recv().await.unwrap().unwrap()[..],
            b"first record here"
        );
        assert_eq!(violation(conn.recv().await), Violation::Decrypt, "{what}");
    }
}

// ---------------------------------------------------------------------------
// 4. Replayed, reordered, duplicated, dropped or reflected frames [close].

#[test]
fn item04_replay_reorder_duplicate_drop_and_reflection_fail_in_the_core() {
    let seal3 = |s: &mut TransportSession| {
        (0..3u8)
            .map(|i| {
                let mut m = Vec::new();
                s.seal(&[i; 8], &mut m).unwrap();
                m
            })
            .collect::<Vec<_>>()
    };
    type Arrange = fn(&[Vec<u8>]) -> Vec<Vec<u8>>;
    let cases: [(&str, Arrange); 4] = [
        ("replayed", |m| {
            vec![m[0].clone(), m[1].clone(), m[0].clone()]
        }),
        ("reordered", |m| vec![m[1].clone(), m[0].clone()]),
        ("duplicated", |m| vec![m[0].clone(), m[0].clone()]),
        ("dropped", |m| vec![m[0].clone(), m[2].clone()]),
    ];
    for (name, arrange) in cases {
        let (mut a, mut b) = session_pair();
        let msgs = seal3(&mut a);
        let arranged = arrange(&msgs);
        let mut delivered = Vec::new();
        let mut failed = false;
        for m in &arranged {
            let mut out = Vec::new();
            match b.open(m, &mut out) {
                Ok(()) => delivered.push(out),
                Err(e) => {
                    assert!(matches!(
                        e,
                        TransportError::PeerMisbehaved(Violation::Decrypt)
                    ));
                    assert!(out.is_empty());
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "{name}: must fail");
        // Only genuine messages in their place were delivered.
        for (i, d) in delivered.iter().enumerate() {
            assert_eq!(d, &vec![i as u8; 8], "{name}");
        }
    }
    // Reflected: a message sent back to its sender.
    let (mut a, _b) = session_pair();
    let mut m = Vec::new();
    a.seal(b"to b", &mut m).unwrap();
    let mut out = Vec::new();
    assert_eq!(violation(a.open(&m, &mut out)), Violation::Decrypt);
    assert!(out.is_empty());
}

/// Runs a snow client through a tampering relay against our server, sends
/// three one-message records, and returns what the server application got.
async fn tampered(
    tamper: impl FnMut(usize, Vec<u8>) -> Vec<Out> + Send + 'static,
) -> (Vec<Vec<u8>>, TransportError) {
    let server = default_endpoint();
    let (c, c_relay) = duplex();
    let (s_relay, s) = duplex();
    common::relay(c_relay, s_relay, tamper);
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(s).await });
    let kp = Keypair::generate().unwrap();
    let mut peer = SnowPeer::connect(c, &kp.secret_bytes()).await;
    let mut conn = accept.await.unwrap().unwrap();
    peer.send_records(&[b"r0", b"r1", b"r2"]).await;
    let mut got = Vec::new();
    loop {
        match conn.recv().await {
            Ok(Some(r)) => got.push(r.to_vec()),
            Ok(None) => panic!("no close was sent"),
            Err(e) => return (got, e),
        }
    }
}

#[tokio::test]
async fn item04_replayed_frame_closes() {
    let mut first = None;
    let (got, err) = tampered(move |i, m| match i {
        2 => {
            first = Some(m.clone());
            vec![Out::ToServer(m)]
        }
        3 => vec![Out::ToServer(first.take().unwrap())],
        _ => vec![Out::ToServer(m)],
    })
    .await;
    assert_eq!(got, vec![b"r0".to_vec()]);
    assert!(matches!(
        err,
        TransportError::PeerMisbehaved(Violation::Decrypt)
    ));
}

#[tokio::test]
async fn item04_reordered_frames_close() {
    let mut held = None;
    let (got, err) = tampered(move |i, m| match i {
        2 => {
            held = Some(m);
            vec![]
        }
        3 => vec![Out::ToServer(m), Out::ToServer(held.take().unwrap())],
        _ => vec![Out::ToServer(m)],
    })
    .await;
    assert!(got.is_empty());
    assert!(matches!(
        err,
        TransportError::PeerMisbehaved(Violation::Decrypt)
    ));
}

#[tokio::test]
async fn item04_duplicated_frame_closes() {
    let (got, err) = tampered(|i, m| {
        if i == 2 {
            vec![Out::ToServer(m.clone()), Out::ToServer(m)]
        } else {
            vec![Out::ToServer(m)]
        }
    })
    .await;
    assert_eq!(got, vec![b"r0".to_vec()]);
    assert!(matches!(
        err,
        TransportError::PeerMisbehaved(Violation::Decrypt)
    ));
}

#[tokio::test]
async fn item04_dropped_frame_closes() {
    let (got, err) = tampered(|i, m| {
        if i == 3 {
            vec![]
        } else {
            vec![Out::ToServer(m)]
        }
    })
    .await;
    assert_eq!(got, vec![b"r0".to_vec()]);
    assert!(matches!(
        err,
        TransportError::PeerMisbehaved(Violation::Decrypt)
    ));
}

#[tokio::test]
async fn item04_reflected_frame_closes() {
    // Our endpoint is the client; its first record comes back to it.
    let client = default_endpoint();
    let (c, c_relay) = duplex();
    let (s_relay, s) = duplex();
    common::relay(c_relay, s_relay, |i, m| {
        if i == 2 {
            vec![Out::ToClient(m)]
        } else {
            vec![Out::ToServer(m)]
        }
    });
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move { SnowPeer::accept(s, &kp.secret_bytes()).await });
    let mut conn = client.connect(c, None).await.unwrap();
    let _peer = peer.await.unwrap();
    conn.send(&b"echo me"[..]).await.unwrap();
    assert_eq!(violation(conn.recv().await), Violation::Decrypt);
}

// ---------------------------------------------------------------------------
// 5. Nonce counter near 2^64-1 (test hook) [typed exhaustion error; never
//    wraps].

#[test]
fn item05_nonce_exhaustion_is_typed_and_never_wraps() {
    let (a, b) = session_pair();
    let (mut sealer, _) = a.split();
    let (_, mut opener) = b.split();
    sealer.advance_nonce_for_testing(u64::MAX - 1);
    opener.advance_nonce_for_testing(u64::MAX - 1);
    let mut m = Vec::new();
    sealer.seal(b"last", &mut m).unwrap();
    let mut out = Vec::new();
    opener.open(&m, &mut out).unwrap();
    assert_eq!(out, b"last");
    let mut m2 = Vec::new();
    assert!(matches!(
        sealer.seal(b"one too many", &mut m2),
        Err(TransportError::NonceExhausted)
    ));
    assert!(m2.is_empty());
    assert_eq!(
        sealer.nonce(),
        u64::MAX,
        "stays at the end, never wraps to 0"
    );
    assert!(matches!(
        sealer.seal(b"again", &mut m2),
        Err(TransportError::NonceExhausted)
    ));
    // The receiver cannot be walked past the end either.
    assert!(matches!(
        opener.open(&m, &mut out),
        Err(TransportError::NonceExhausted)
    ));

    // The record encoder refuses for good once its sealer is exhausted.
    let (a, _) = session_pair();
    let (mut sealer, _) = a.split();
    sealer.advance_nonce_for_testing(u64::MAX);
    let mut enc = RecordEncoder::new(sealer, 1024, None);
    enc.push_record(b"x").unwrap();
    assert!(matches!(enc.flush(), Err(TransportError::NonceExhausted)));
    assert!(enc.wire().is_empty());
    assert!(matches!(
        enc.push_record(b"y"),
        Err(TransportError::NonceExhausted)
    ));
}

#[tokio::test]
async fn item05_nonce_exhaustion_ends_the_connection() {
    let mut config = TransportConfig::default();
    config.start_nonce_for_testing = u64::MAX - 2;
    let (client, mut server) = common::pair(config).await;
    for r in [&b"a"[..], b"b"] {
        client.send(r).await.unwrap();
        assert_eq!(&server.recv().await.unwrap().unwrap()[..], r);
    }
    client.send(&b"c"[..]).await.unwrap();
    assert!(matches!(
        client.sender().ended().await,
        ConnectionEnd::Failed(TransportError::NonceExhausted)
    ));
    assert!(matches!(
        client.send(&b"d"[..]).await,
        Err(TransportError::NonceExhausted)
    ));
    // "c" was never sealed; the server only sees the stream end.
    assert!(matches!(server.recv().await, Err(TransportError::PeerLost)));
}

// ---------------------------------------------------------------------------
// 6. Peer cuts the stream without a close record [in-flight requests fail
//    with a peer-lost error].

#[tokio::test]
async fn item06_stream_cut_without_close_is_peer_lost() {
    let server = default_endpoint();
    let (conn, mut peer) = snow_client(&server).await;
    let (sender, mut receiver) = conn.split();
    // A request is in flight: sent, its answer awaited, when the peer dies.
    sender.send(&b"request"[..]).await.unwrap();
    assert_eq!(peer.recv_record().await, b"request");
    let waiting = tokio::spawn(async move { receiver.recv().await });
    drop(peer);
    assert!(matches!(
        waiting.await.unwrap(),
        Err(TransportError::PeerLost)
    ));
    assert!(matches!(
        sender.ended().await,
        ConnectionEnd::Failed(TransportError::PeerLost)
    ));
    assert!(matches!(
        sender.send(&b"more"[..]).await,
        Err(TransportError::PeerLost)
    ));
}

// ---------------------------------------------------------------------------
// 7. Prologue or protocol-name mismatch [handshake fails; close].

fn mismatched_builders(secret: &[u8; 32]) -> Vec<snow::Builder<'_>> {
    vec![
        snow::Builder::new(capwire_transport::PROTOCOL_NAME.parse().unwrap())
            .local_private_key(secret)
            .unwrap()
            .prologue(b"capwire/2")
            .unwrap(),
        snow::Builder::new("Noise_XX_25519_ChaChaPoly_BLAKE2b".parse().unwrap())
            .local_private_key(secret)
            .unwrap()
            .prologue(capwire_transport::PROLOGUE)
            .unwrap(),
        snow::Builder::new("Noise_XX_25519_ChaChaPoly_SHA256".parse().unwrap())
            .local_private_key(secret)
            .unwrap()
            .prologue(capwire_transport::PROLOGUE)
            .unwrap(),
    ]
}

#[tokio::test]
async fn item07_mismatch_fails_our_initiator() {
    let kp = Keypair::generate().unwrap();
    let secret = kp.secret_bytes();
    for index in 0..3 {
        let ours = default_endpoint();
        let (a, mut b) = duplex();
        let secret = *secret;
        let peer = tokio::spawn(async move {
            let mut hs = mismatched_builders(&secret)
                .remove(index)
                .build_responder()
                .unwrap();
            let mut buf = vec![0u8; 65535];
            let m1 = read_msg(&mut b).await.unwrap().unwrap();
            hs.read_message(&m1, &mut buf).unwrap();
            let n = hs.write_message(&[], &mut buf).unwrap();
            write_msg(&mut b, &buf[..n]).await.unwrap();
            // Whatever comes next: our side must have hung up.
            read_msg(&mut b).await.unwrap()
        });
        assert_eq!(violation(ours.connect(a, None).await), Violation::Decrypt);
        assert_eq!(peer.await.unwrap(), None, "message 3 never sent");
    }
}

#[tokio::test]
async fn item07_mismatch_fails_our_responder() {
    let kp = Keypair::generate().unwrap();
    let secret = kp.secret_bytes();
    for index in 0..3 {
        let ours = default_endpoint();
        let (mut a, b) = duplex();
        let srv = ours.clone();
        let accept = tokio::spawn(async move { srv.accept(b).await });
        let mut hs = mismatched_builders(&secret)
            .remove(index)
            .build_initiator()
            .unwrap();
        let mut buf = vec![0u8; 65535];
        let n = hs.write_message(&[], &mut buf).unwrap();
        write_msg(&mut a, &buf[..n]).await.unwrap();
        let m2 = read_msg(&mut a).await.unwrap().unwrap();
        // The mismatch shows when the initiator checks message 2.
        assert!(hs.read_message(&m2, &mut buf).is_err());
        drop(a);
        assert!(matches!(
            accept.await.unwrap(),
            Err(TransportError::PeerLost)
        ));
    }
}

// ---------------------------------------------------------------------------
// 8. Out-of-turn, repeated, short or long handshake messages [close].

async fn accept_raw(bytes: Vec<u8>) -> Result<capwire_transport::Connection, TransportError> {
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    a.write_all(&bytes).await.unwrap();
    let result = accept.await.unwrap();
    drop(a);
    result
}

fn framed(len: usize) -> Vec<u8> {
    let mut v = (len as u16).to_be_bytes().to_vec();
    v.extend(std::iter::repeat_n(9u8, len));
    v
}

#[tokio::test]
async fn item08_short_and_long_message_1() {
    assert_eq!(
        violation(accept_raw(framed(31)).await),
        Violation::ShortMessage
    );
    assert_eq!(
        violation(accept_raw(framed(33)).await),
        Violation::MessageLength
    );
    assert_eq!(
        violation(accept_raw(framed(0)).await),
        Violation::ShortMessage
    );
}

#[tokio::test]
async fn item08_bytes_after_message_1_are_out_of_turn() {
    let kp = Keypair::generate().unwrap();
    let mut hs = snow_builder(&kp.secret_bytes()).build_initiator().unwrap();
    let mut buf = vec![0u8; 128];
    let n = hs.write_message(&[], &mut buf).unwrap();
    let mut bytes = (n as u16).to_be_bytes().to_vec();
    bytes.extend_from_slice(&buf[..n]);
    bytes.extend_from_slice(&framed(64)); // a "message 3" before message 2
    assert_eq!(violation(accept_raw(bytes).await), Violation::OutOfTurn);
}

/// Our initiator against a scripted responder that answers message 1 with
/// `reply(m1)`.
async fn connect_to_script(
    reply: impl FnOnce(Vec<u8>) -> Vec<u8> + Send + 'static,
) -> Result<capwire_transport::Connection, TransportError> {
    let ours = default_endpoint();
    let (a, mut b) = duplex();
    let script = tokio::spawn(async move {
        let m1 = read_msg(&mut b).await.unwrap().unwrap();
        b.write_all(&reply(m1)).await.unwrap();
        b
    });
    let result = ours.connect(a, None).await;
    let _b = script.await.unwrap();
    result
}

fn snow_reply(extra: &[u8]) -> impl FnOnce(Vec<u8>) -> Vec<u8> + Send + 'static {
    let extra = extra.to_vec();
    move |m1| {
        let kp = Keypair::generate().unwrap();
        let mut hs = snow_builder(&kp.secret_bytes()).build_responder().unwrap();
        let mut buf = vec![0u8; 256];
        hs.read_message(&m1, &mut buf).unwrap();
        let n = hs.write_message(&[], &mut buf).unwrap();
        let mut out = (n as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&buf[..n]);
        out.extend_from_slice(&extra);
        out
    }
}

#[tokio::test]
async fn item08_short_and_long_message_2() {
    assert_eq!(
        violation(connect_to_script(|_| framed(95)).await),
        Violation::ShortMessage
    );
    assert_eq!(
        violation(connect_to_script(|_| framed(97)).await),
        Violation::MessageLength
    );
    // Two initiators: the "reply" is another message 1.
    assert_eq!(
        violation(
            connect_to_script(|m1| {
                let mut v = (m1.len() as u16).to_be_bytes().to_vec();
                v.extend_from_slice(&m1);
                v
            })
            .await
        ),
        Violation::ShortMessage
    );
}

#[tokio::test]
async fn item08_bytes_after_message_2_are_out_of_turn() {
    // A valid message 2 followed by an early transport message.
    assert_eq!(
        violation(connect_to_script(snow_reply(&framed(20))).await),
        Violation::OutOfTurn
    );
    // Control: the same script without the extra bytes succeeds.
    assert!(connect_to_script(snow_reply(&[])).await.is_ok());
}

#[tokio::test]
async fn item08_repeated_message_1_instead_of_message_3() {
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    let kp = Keypair::generate().unwrap();
    let mut hs = snow_builder(&kp.secret_bytes()).build_initiator().unwrap();
    let mut buf = vec![0u8; 256];
    let n = hs.write_message(&[], &mut buf).unwrap();
    let m1 = buf[..n].to_vec();
    write_msg(&mut a, &m1).await.unwrap();
    let _m2 = read_msg(&mut a).await.unwrap().unwrap();
    write_msg(&mut a, &m1).await.unwrap();
    assert_eq!(violation(accept.await.unwrap()), Violation::ShortMessage);
}

#[tokio::test]
async fn item08_repeated_message_3_is_refused_and_delivers_nothing() {
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    let kp = Keypair::generate().unwrap();
    let mut hs = snow_builder(&kp.secret_bytes()).build_initiator().unwrap();
    let mut buf = vec![0u8; 256];
    let n = hs.write_message(&[], &mut buf).unwrap();
    write_msg(&mut a, &buf[..n]).await.unwrap();
    let m2 = read_msg(&mut a).await.unwrap().unwrap();
    hs.read_message(&m2, &mut buf).unwrap();
    let n = hs.write_message(&[], &mut buf).unwrap();
    let m3 = buf[..n].to_vec();
    write_msg(&mut a, &m3).await.unwrap();
    write_msg(&mut a, &m3).await.unwrap();
    let mut conn = accept.await.unwrap().unwrap();
    assert_eq!(violation(conn.recv().await), Violation::Decrypt);
}

// ---------------------------------------------------------------------------
// 9. Remote ephemeral or static key of low order (all seven points and their
//    non-canonical encodings) [abort: the DH output is not contributory].
//    Static keys, and ephemeral keys towards the initiator, are covered by
//    the transcript-forging unit tests in src/handshake.rs.

fn low_order_encodings() -> Vec<[u8; 32]> {
    fn hex(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
    let base = [
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    ];
    let mut all = Vec::new();
    for b in base {
        let point = hex(b);
        all.push(point);
        let mut high = point;
        high[31] |= 0x80;
        all.push(high);
    }
    all
}

#[tokio::test]
async fn item09_low_order_ephemeral_in_message_1_aborts() {
    for point in low_order_encodings() {
        let mut bytes = 32u16.to_be_bytes().to_vec();
        bytes.extend_from_slice(&point);
        assert_eq!(violation(accept_raw(bytes).await), Violation::LowOrderKey);
    }
}

#[tokio::test]
async fn item09_low_order_ephemeral_in_message_2_aborts() {
    for point in low_order_encodings() {
        let reply = move |_m1: Vec<u8>| {
            let mut m2 = point.to_vec();
            m2.extend(std::iter::repeat_n(1u8, 64));
            let mut out = (m2.len() as u16).to_be_bytes().to_vec();
            out.extend_from_slice(&m2);
            out
        };
        assert_eq!(
            violation(connect_to_script(reply).await),
            Violation::LowOrderKey
        );
    }
}

// ---------------------------------------------------------------------------
// 10. Static key unknown to the contact policy, equal to our own, or a known
//     key with bit 255 flipped [treated as the key it really is; compare
//     canonical forms].

#[tokio::test]
async fn item10_unknown_key_is_denied_before_any_record_is_delivered() {
    let stranger_policy = ContactPolicy::allow_list([Keypair::generate().unwrap().public()]);
    let server = endpoint(TransportConfig::default(), stranger_policy);
    let client = default_endpoint();
    let (a, b) = duplex();
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(b).await });
    // The initiator finishes first, so it may already have sent a record.
    let mut conn = client.connect(a, None).await.unwrap();
    conn.send(&b"for your eyes only"[..]).await.unwrap();
    match accept.await.unwrap() {
        Err(TransportError::Denied(id)) => assert_eq!(id, client.local_id()),
        other => panic!("expected Denied, got {other:?}"),
    }
    // The server produced no connection, so no record reached its
    // application; the client learns why.
    let got = conn.recv().await;
    assert!(matches!(got, Err(TransportError::DeniedByPeer)), "{got:?}");
}

#[tokio::test]
async fn item10_initiator_refuses_an_unknown_responder_before_finishing() {
    let client = endpoint(
        TransportConfig::default(),
        ContactPolicy::callback(|_| false),
    );
    let server = default_endpoint();
    let (a, b) = duplex();
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(b).await });
    match client.connect(a, None).await {
        Err(TransportError::Denied(id)) => assert_eq!(id, server.local_id()),
        other => panic!("expected Denied, got {other:?}"),
    }
    // Message 3 was never sent.
    assert!(matches!(
        accept.await.unwrap(),
        Err(TransportError::PeerLost)
    ));
}

#[tokio::test]
async fn item10_our_own_key_is_refused_in_both_roles() {
    let kp = Keypair::generate().unwrap();
    let a = capwire_transport::Endpoint::new(
        kp.clone(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    let b = capwire_transport::Endpoint::new(
        kp.clone(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    let (x, y) = duplex();
    let accept = tokio::spawn(async move { b.accept(y).await });
    assert!(
        matches!(a.connect(x, None).await, Err(TransportError::Denied(id)) if id == kp.public())
    );
    assert!(accept.await.unwrap().is_err());

    // As responder: a peer that holds our key and does not check.
    let server = capwire_transport::Endpoint::new(
        kp.clone(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    let (x, y) = duplex();
    let accept = tokio::spawn(async move { server.accept(y).await });
    let _peer = SnowPeer::connect(x, &kp.secret_bytes()).await;
    assert!(matches!(accept.await.unwrap(), Err(TransportError::Denied(id)) if id == kp.public()));
}

/// Drives our I/O-free initiator by hand against `server`, sending
/// `keypair`'s static key in whatever encoding it carries.
async fn raw_initiator(
    server: &capwire_transport::Endpoint,
    keypair: &Keypair,
) -> Result<capwire_transport::Connection, TransportError> {
    let (mut a, b) = duplex();
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(b).await });
    let mut out = Vec::new();
    let waiting = Initiator::new(keypair, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut out)
        .unwrap();
    write_msg(&mut a, &out).await.unwrap();
    let m2 = read_msg(&mut a).await.unwrap().unwrap();
    out.clear();
    let session = waiting
        .read_message(&m2, &mut Vec::new())
        .unwrap()
        .write_message(&[], &mut out)
        .unwrap();
    write_msg(&mut a, &out).await.unwrap();
    let result = accept.await.unwrap();
    drop((a, session));
    result
}

#[tokio::test]
async fn item10_bit_255_alias_is_treated_as_the_key_it_really_is() {
    let kp = Keypair::generate().unwrap();
    let mut alias = *kp.public().as_bytes();
    alias[31] |= 0x80;
    assert_eq!(canonical_node_id(&NodeId::from_bytes(alias)), kp.public());
    let aliased = kp.clone().with_public_encoding_for_testing(alias).unwrap();

    // A known key in another encoding is accepted and reported canonically.
    let server = endpoint(
        TransportConfig::default(),
        ContactPolicy::allow_list([kp.public()]),
    );
    let conn = raw_initiator(&server, &aliased).await.unwrap();
    assert_eq!(conn.remote(), kp.public());
    assert_eq!(*conn.remote().as_bytes(), *kp.public().as_bytes());

    // An allow-list holding the alias also means the real key.
    let server = endpoint(
        TransportConfig::default(),
        ContactPolicy::AllowList([NodeId::from_bytes(alias)].into()),
    );
    assert_eq!(
        raw_initiator(&server, &kp).await.unwrap().remote(),
        kp.public()
    );

    // An unknown key is refused under its canonical name whatever the encoding.
    let server = endpoint(
        TransportConfig::default(),
        ContactPolicy::allow_list([Keypair::generate().unwrap().public()]),
    );
    assert!(matches!(
        raw_initiator(&server, &aliased).await,
        Err(TransportError::Denied(id)) if id == kp.public()
    ));

    // Our own key with bit 255 flipped is still our own key.
    let server = capwire_transport::Endpoint::new(
        kp.clone(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    assert!(matches!(
        raw_initiator(&server, &aliased).await,
        Err(TransportError::Denied(id)) if id == kp.public()
    ));

    // And so does `connect(expected_remote)` compare canonical forms.
    let client = default_endpoint();
    let server = capwire_transport::Endpoint::new(
        aliased.clone(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    let (a, b) = duplex();
    let accept = tokio::spawn(async move { server.accept(b).await });
    let conn = client
        .connect(a, Some(NodeId::from_bytes(alias)))
        .await
        .unwrap();
    assert_eq!(conn.remote(), kp.public());
    accept.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------
// 11. Flood of half-open handshakes [bounded concurrency and rate;
//     established sessions unaffected].

#[tokio::test(start_paused = true)]
async fn item11_half_open_flood_is_bounded_and_sessions_carry_on() {
    let mut config = TransportConfig::default();
    config.max_concurrent_handshakes = 4;
    let server = endpoint(config, ContactPolicy::AcceptAny);
    let client = default_endpoint();
    let (established_client, mut established_server) = common::connected(&client, &server).await;
    assert_eq!(
        server.available_handshake_slots(),
        4,
        "sessions hold no slot"
    );

    // Four half-open connections that never speak take every slot.
    let mut silent = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..4 {
        let (a, b) = duplex();
        silent.push(a);
        let srv = server.clone();
        pending.push(tokio::spawn(async move { srv.accept(b).await }));
    }
    tokio::task::yield_now().await;
    assert_eq!(server.available_handshake_slots(), 0);
    // The next one is refused at once, without waiting.
    let (_x, y) = duplex();
    assert!(matches!(
        server.accept(y).await,
        Err(TransportError::TooManyHandshakes)
    ));

    // The established session is unaffected.
    established_client.send(&b"still here"[..]).await.unwrap();
    assert_eq!(
        &established_server.recv().await.unwrap().unwrap()[..],
        b"still here"
    );

    // The half-open ones expire at the first-message deadline, freeing the
    // slots.
    for p in pending {
        assert!(matches!(
            p.await.unwrap(),
            Err(TransportError::HandshakeTimeout)
        ));
    }
    assert_eq!(server.available_handshake_slots(), 4);
    let (c, s) = common::connected(&client, &server).await;
    assert_eq!(c.remote(), server.local_id());
    assert_eq!(s.remote(), client.local_id());
}

// ---------------------------------------------------------------------------
// 11 (continued). Silent TCP sockets that never send message 1 [a short
//     deadline for message 1].

#[tokio::test(start_paused = true)]
async fn item11_a_silent_socket_is_dropped_at_the_first_message_deadline() {
    let server = default_endpoint();
    assert_eq!(
        server.config().first_message_timeout,
        Duration::from_secs(3)
    );
    let (_silent, b) = duplex();
    let start = tokio::time::Instant::now();
    assert!(matches!(
        server.accept(b).await,
        Err(TransportError::HandshakeTimeout)
    ));
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(3),
        "not the 10 s deadline"
    );
    assert_eq!(
        server.available_handshake_slots(),
        server.config().max_concurrent_handshakes
    );

    // The same for the handshake-only entry point, and for a socket that
    // sends part of message 1 and stops.
    let (mut partial, b) = duplex();
    partial.write_all(&[0x00, 0x20, 1, 2, 3]).await.unwrap();
    let start = tokio::time::Instant::now();
    assert!(matches!(
        server.handshake_responder(b).await,
        Err(TransportError::HandshakeTimeout)
    ));
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn item11_the_first_message_deadline_covers_message_1_only() {
    // Message 1 on time, then silence: the whole-handshake deadline applies.
    let server = default_endpoint();
    let (mut a, b) = duplex();
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept(b).await });
    let kp = Keypair::generate().unwrap();
    let mut hs = snow_builder(&kp.secret_bytes()).build_initiator().unwrap();
    let mut buf = vec![0u8; 256];
    let start = tokio::time::Instant::now();
    let n = hs.write_message(&[], &mut buf).unwrap();
    write_msg(&mut a, &buf[..n]).await.unwrap();
    let _m2 = read_msg(&mut a).await.unwrap().unwrap();
    assert!(matches!(
        accept.await.unwrap(),
        Err(TransportError::HandshakeTimeout)
    ));
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

// ---------------------------------------------------------------------------
// 13. A peer that never reads what it asked for [a write deadline closes
//     it]; shutdown while peers stall or never read [ends within its
//     documented bound].

/// Our endpoint connects to a snow peer over a small pipe; after the
/// handshake the peer never reads again.
async fn stalled_peer() -> (
    capwire_transport::Endpoint,
    capwire_transport::Connection,
    SnowPeer<tokio::io::DuplexStream>,
) {
    let ours = default_endpoint();
    let (a, b) = tokio::io::duplex(4096);
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move { SnowPeer::accept(b, &kp.secret_bytes()).await });
    let conn = ours.connect(a, None).await.unwrap();
    (ours, conn, peer.await.unwrap())
}

/// Queues more than the pipe holds and lets the writer get stuck.
async fn fill_the_pipe(conn: &capwire_transport::Connection) {
    for _ in 0..4 {
        conn.sender().try_send(vec![0u8; 100_000]).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!conn.sender().is_closed());
}

#[tokio::test(start_paused = true)]
async fn item13_the_write_deadline_fires_while_the_peer_sends_keepalives() {
    let (_ours, conn, mut peer) = stalled_peer().await;
    // The peer keeps its direction alive, so no idle deadline can fire on
    // our side, but it never reads.
    let keepalives = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let mut out = [0u8; 16];
            let n = peer.transport.write_message(&[], &mut out).unwrap();
            if write_msg(&mut peer.stream, &out[..n]).await.is_err() {
                return;
            }
        }
    });
    let start = tokio::time::Instant::now();
    fill_the_pipe(&conn).await;
    assert!(matches!(
        conn.sender().ended().await,
        ConnectionEnd::Failed(TransportError::WriteTimeout)
    ));
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited <= Duration::from_secs(31),
        "{waited:?}"
    );
    let (sender, mut receiver) = conn.split();
    assert!(matches!(
        receiver.recv().await,
        Err(TransportError::WriteTimeout)
    ));
    assert!(matches!(
        sender.send(&b"more"[..]).await,
        Err(TransportError::WriteTimeout)
    ));
    // Our side dropped the stream: the peer's writes fail.
    keepalives.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn item13_close_returns_within_the_write_timeout_when_the_peer_never_reads() {
    let (_ours, conn, _peer) = stalled_peer().await;
    fill_the_pipe(&conn).await;
    let start = tokio::time::Instant::now();
    assert!(matches!(
        conn.close("bye").await,
        Err(TransportError::WriteTimeout)
    ));
    assert!(start.elapsed() <= Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn item13_close_is_bounded_even_when_the_peer_reads_a_trickle() {
    let (_ours, conn, mut peer) = stalled_peer().await;
    fill_the_pipe(&conn).await;
    // A byte every 20 s: always some progress, never enough.
    let trickle = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        loop {
            tokio::time::sleep(Duration::from_secs(20)).await;
            if !matches!(peer.stream.read(&mut byte).await, Ok(1)) {
                return;
            }
        }
    });
    let start = tokio::time::Instant::now();
    assert!(matches!(
        conn.close("bye").await,
        Err(TransportError::WriteTimeout)
    ));
    assert!(start.elapsed() <= Duration::from_secs(30));
    trickle.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn item13_shutdown_ends_within_its_bound_when_peers_never_read() {
    let (ours, stuck, _peer) = stalled_peer().await;
    fill_the_pipe(&stuck).await;
    // A second connection of the same endpoint whose peer never reads nor
    // hangs up, but whose pipe has room for the close record.
    let (a, b) = tokio::io::duplex(4096);
    let kp = Keypair::generate().unwrap();
    let peer = tokio::spawn(async move { SnowPeer::accept(b, &kp.secret_bytes()).await });
    let idle = ours.connect(a, None).await.unwrap();
    let _idle_peer = peer.await.unwrap();

    let start = tokio::time::Instant::now();
    ours.shutdown().await;
    assert!(start.elapsed() <= capwire_transport::Endpoint::SHUTDOWN_GRACE);
    assert!(stuck.sender().is_closed());
    assert!(idle.sender().is_closed());
}

#[tokio::test(start_paused = true)]
async fn item13_close_and_shutdown_are_bounded_over_tcp_when_the_peer_never_reads() {
    let mut config = TransportConfig::default();
    config.send_queue_depth = 4;
    for step in ["close", "shutdown"] {
        let ours = endpoint(config.clone(), ContactPolicy::AcceptAny);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let kp = Keypair::generate().unwrap();
        let peer = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            SnowPeer::accept(stream, &kp.secret_bytes()).await
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let conn = ours.connect(stream, None).await.unwrap();
        // A raw TCP socket whose reader does nothing from here on.
        let _peer = peer.await.unwrap();
        let big = bytes::Bytes::from(vec![0u8; 1 << 20]);
        let mut queued = 0;
        // Paused time moves only once every task waits: the socket buffers
        // and our queue are full.
        while tokio::time::timeout(Duration::from_secs(1), conn.send(big.clone()))
            .await
            .is_ok()
        {
            queued += 1;
            assert!(queued < 1000, "memory must be bounded");
        }
        let start = tokio::time::Instant::now();
        if step == "close" {
            assert!(matches!(
                conn.close("bye").await,
                Err(TransportError::WriteTimeout)
            ));
            assert!(start.elapsed() <= ours.config().write_timeout);
        } else {
            ours.shutdown().await;
            assert!(start.elapsed() <= capwire_transport::Endpoint::SHUTDOWN_GRACE);
        }
        assert!(conn.sender().is_closed(), "{step}");
    }
}

// ---------------------------------------------------------------------------
// 14. RNG failure [abort; no fallback].

/// Works `ok` times, then fails forever.
struct Failing {
    ok: AtomicUsize,
}

impl EntropySource for Failing {
    fn try_fill(&self, dest: &mut [u8]) -> Result<(), EntropyError> {
        if self
            .ok
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return OsEntropy.try_fill(dest);
        }
        Err(EntropyError)
    }
}

#[tokio::test]
async fn item14_rng_failure_aborts_without_fallback() {
    assert!(matches!(
        Keypair::generate_with(&Failing {
            ok: AtomicUsize::new(0)
        }),
        Err(TransportError::Rng)
    ));
    let broken: Arc<dyn EntropySource> = Arc::new(Failing {
        ok: AtomicUsize::new(0),
    });
    let ours = default_endpoint().with_entropy(broken);

    // Initiator: nothing at all is written.
    let (a, mut b) = duplex();
    assert!(matches!(
        ours.connect(a, None).await,
        Err(TransportError::Rng)
    ));
    let mut seen = Vec::new();
    b.read_to_end(&mut seen).await.unwrap();
    assert!(seen.is_empty(), "no handshake bytes without randomness");

    // Responder: refuses before reading anything.
    let (mut a, b) = duplex();
    assert!(matches!(ours.accept(b).await, Err(TransportError::Rng)));
    let mut seen = Vec::new();
    a.read_to_end(&mut seen).await.unwrap();
    assert!(seen.is_empty());

    // The core reports it the same way.
    let kp = Keypair::generate().unwrap();
    let failing = Failing {
        ok: AtomicUsize::new(0),
    };
    assert!(matches!(
        Initiator::new(&kp, &failing),
        Err(TransportError::Rng)
    ));
    assert!(matches!(
        Responder::new(&kp, &failing),
        Err(TransportError::Rng)
    ));
}

#[test]
fn decoder_survives_garbage_without_panicking() {
    // Companion to the items above: arbitrary bytes after a handshake give
    // a typed error, never a panic or a record.
    let (_, b) = session_pair();
    let (_, opener) = b.split();
    let mut dec = RecordDecoder::new(opener, 1 << 20);
    let mut buf = BytesMut::from(&[0x00, 0x20, 1, 2, 3][..]);
    buf.extend(std::iter::repeat_n(0xaau8, 40));
    let mut out = Vec::new();
    assert!(dec.decode(&mut buf, &mut out).is_err());
    assert!(out.is_empty());
    assert!(dec.decode(&mut buf, &mut out).is_err(), "errors are final");
}
