//! Interoperability with `snow`, an independent Noise implementation: at
//! the Noise-message level against the I/O-free core, and through the full
//! wire format (length prefix, record chunks, close, rekey) against the
//! tokio driver, in both roles, over the in-memory pair and loopback TCP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use capwire_transport::{
    ContactPolicy, Endpoint, Initiator, Keypair, OsEntropy, Responder, TransportConfig,
    TransportSession,
};
use common::{Got, SnowPeer, snow_builder};
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

const MAX_NOISE_PLAINTEXT: usize = 65535 - 16;

/// Our initiator against snow's responder; returns both transport states.
fn core_initiator_vs_snow() -> (TransportSession, snow::TransportState, Keypair, Keypair) {
    let ours = Keypair::generate().unwrap();
    let theirs = Keypair::generate().unwrap();
    let mut snow = snow_builder(&theirs.secret_bytes())
        .build_responder()
        .unwrap();
    let mut buf = vec![0u8; 65535];
    let mut wire = Vec::new();
    let mut payload = Vec::new();

    let init = Initiator::new(&ours, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut wire)
        .unwrap();
    snow.read_message(&wire, &mut buf).unwrap();
    let n = snow.write_message(&[], &mut buf).unwrap();
    let init = init.read_message(&buf[..n], &mut payload).unwrap();
    assert_eq!(init.remote(), theirs.public());
    wire.clear();
    let session = init.write_message(&[], &mut wire).unwrap();
    snow.read_message(&wire, &mut buf).unwrap();
    assert_eq!(snow.get_remote_static().unwrap(), ours.public().as_bytes());
    assert_eq!(snow.get_handshake_hash(), session.handshake_hash());
    (session, snow.into_transport_mode().unwrap(), ours, theirs)
}

/// Snow's initiator against our responder.
fn snow_vs_core_responder() -> (TransportSession, snow::TransportState) {
    let ours = Keypair::generate().unwrap();
    let theirs = Keypair::generate().unwrap();
    let mut snow = snow_builder(&theirs.secret_bytes())
        .build_initiator()
        .unwrap();
    let mut buf = vec![0u8; 65535];
    let mut wire = Vec::new();
    let mut payload = Vec::new();

    let n = snow.write_message(&[], &mut buf).unwrap();
    let resp = Responder::new(&ours, &OsEntropy)
        .unwrap()
        .read_message(&buf[..n], &mut payload)
        .unwrap();
    let resp = resp.write_message(&[], &mut wire).unwrap();
    snow.read_message(&wire, &mut buf).unwrap();
    assert_eq!(snow.get_remote_static().unwrap(), ours.public().as_bytes());
    let n = snow.write_message(&[], &mut buf).unwrap();
    let session = resp.read_message(&buf[..n], &mut payload).unwrap();
    assert_eq!(session.remote(), theirs.public());
    assert_eq!(snow.get_handshake_hash(), session.handshake_hash());
    (session, snow.into_transport_mode().unwrap())
}

/// Sends `payload` both ways, cut into Noise messages.
fn exchange(ours: &mut TransportSession, snow: &mut snow::TransportState, payload: &[u8]) {
    let mut buf = vec![0u8; 65535];
    let mut wire = Vec::new();
    let mut got = Vec::new();
    // Ours to snow.
    for part in payload
        .chunks(MAX_NOISE_PLAINTEXT)
        .chain(payload.is_empty().then_some(&[][..]))
    {
        wire.clear();
        ours.seal(part, &mut wire).unwrap();
        assert_eq!(wire.len(), part.len() + 16);
        let n = snow.read_message(&wire, &mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, payload);
    // Snow to ours.
    got.clear();
    for part in payload
        .chunks(MAX_NOISE_PLAINTEXT)
        .chain(payload.is_empty().then_some(&[][..]))
    {
        let n = snow.write_message(part, &mut buf).unwrap();
        ours.open(&buf[..n], &mut got).unwrap();
    }
    assert_eq!(got, payload);
}

fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            (0usize..200 * 1024).prop_map(|n| (0..n).map(|i| (i * 7 + n) as u8).collect()),
        ],
        1..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn core_initiator_interoperates_with_snow(payloads in payloads()) {
        let (mut ours, mut snow, _, _) = core_initiator_vs_snow();
        for p in &payloads {
            exchange(&mut ours, &mut snow, p);
        }
    }

    #[test]
    fn core_responder_interoperates_with_snow(payloads in payloads()) {
        let (mut ours, mut snow) = snow_vs_core_responder();
        for p in &payloads {
            exchange(&mut ours, &mut snow, p);
        }
    }
}

#[test]
fn rekey_matches_snow_in_both_directions() {
    let (ours, mut snow, _, _) = core_initiator_vs_snow();
    let (mut sealer, mut opener) = ours.split();
    let mut buf = vec![0u8; 1024];
    let mut wire = Vec::new();
    for round in 0..3u8 {
        wire.clear();
        sealer.seal(&[round; 10], &mut wire).unwrap();
        let n = snow.read_message(&wire, &mut buf).unwrap();
        assert_eq!(&buf[..n], &[round; 10]);
        sealer.rekey();
        snow.rekey_incoming();

        let n = snow.write_message(&[round; 5], &mut buf).unwrap();
        let mut plain = Vec::new();
        opener.open(&buf[..n], &mut plain).unwrap();
        assert_eq!(plain, [round; 5]);
        snow.rekey_outgoing();
        opener.rekey();
    }
    assert_eq!(sealer.nonce(), 3);
    assert_eq!(opener.nonce(), 3);
}

// ---------------------------------------------------------------------------
// Through the wire format, against the tokio driver.

fn endpoint() -> Endpoint {
    Endpoint::new(
        Keypair::generate().unwrap(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    )
}

/// Our endpoint connects; the snow peer accepts, echoes, and the two
/// exchange a close.
async fn driver_connects_to_snow<S>(ours: S, theirs: S, records: Vec<Vec<u8>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let endpoint = endpoint();
    let peer_kp = Keypair::generate().unwrap();
    let peer_id = peer_kp.public();
    let n = records.len();
    let peer = tokio::spawn(async move {
        let mut peer = SnowPeer::accept(theirs, &peer_kp.secret_bytes()).await;
        let mut got = Vec::new();
        for _ in 0..n {
            got.push(peer.recv_record().await);
        }
        let refs: Vec<&[u8]> = got.iter().map(Vec::as_slice).collect();
        peer.send_records(&refs).await;
        let close = peer.recv().await;
        (peer.remote_static(), got, close)
    });
    let mut conn = endpoint.connect(ours, Some(peer_id)).await.unwrap();
    for r in &records {
        conn.send(r.clone()).await.unwrap();
    }
    for r in &records {
        assert_eq!(conn.recv().await.unwrap().unwrap(), r[..]);
    }
    conn.close("bye").await.unwrap();
    let (remote, got, close) = peer.await.unwrap();
    assert_eq!(remote, *endpoint.local_id().as_bytes());
    assert_eq!(got, records);
    assert_eq!(close, Some(Got::Close(0, "bye".into())));
}

/// The snow peer connects; our endpoint accepts and echoes until the peer
/// closes.
async fn snow_connects_to_driver<S>(ours: S, theirs: S, records: Vec<Vec<u8>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let endpoint = endpoint();
    let our_id = endpoint.local_id();
    let server = tokio::spawn(async move {
        let mut conn = endpoint.accept(ours).await.unwrap();
        let remote = conn.remote();
        while let Some(r) = conn.recv().await.unwrap() {
            conn.send(r).await.unwrap();
        }
        (remote, conn.split().1.close_reason())
    });
    let peer_kp = Keypair::generate().unwrap();
    let mut peer = SnowPeer::connect(theirs, &peer_kp.secret_bytes()).await;
    assert_eq!(peer.remote_static(), *our_id.as_bytes());
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    peer.send_records(&refs).await;
    for r in &records {
        assert_eq!(&peer.recv_record().await, r);
    }
    peer.send_close(0, "done").await;
    let (remote, reason) = server.await.unwrap();
    assert_eq!(remote, peer_kp.public());
    let reason = reason.unwrap();
    assert_eq!(reason.reason, "done");
}

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let a = a.unwrap();
    let b = b.unwrap().0;
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    (a, b)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn driver_initiator_with_snow_over_memory(records in payloads()) {
        rt().block_on(async {
            let (a, b) = tokio::io::duplex(64 * 1024);
            driver_connects_to_snow(a, b, records).await;
        });
    }

    #[test]
    fn driver_responder_with_snow_over_memory(records in payloads()) {
        rt().block_on(async {
            let (a, b) = tokio::io::duplex(64 * 1024);
            snow_connects_to_driver(a, b, records).await;
        });
    }

    #[test]
    fn driver_initiator_with_snow_over_tcp(records in payloads()) {
        rt().block_on(async {
            let (a, b) = tcp_pair().await;
            driver_connects_to_snow(a, b, records).await;
        });
    }

    #[test]
    fn driver_responder_with_snow_over_tcp(records in payloads()) {
        rt().block_on(async {
            let (a, b) = tcp_pair().await;
            snow_connects_to_driver(a, b, records).await;
        });
    }
}

#[tokio::test]
async fn in_band_rekey_is_understood_by_snow() {
    let mut config = TransportConfig::default();
    config.rekey_after_messages = Some(2);
    let endpoint = Endpoint::new(
        Keypair::generate().unwrap(),
        config,
        ContactPolicy::AcceptAny,
    );
    let peer_kp = Keypair::generate().unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let peer = tokio::spawn(async move {
        let mut peer = SnowPeer::accept(b, &peer_kp.secret_bytes()).await;
        let mut got = Vec::new();
        for _ in 0..20 {
            got.push(peer.recv_record().await);
        }
        (got, peer.transport.receiving_nonce(), peer.rekeys)
    });
    let conn = endpoint.connect(a, None).await.unwrap();
    let (sender, mut receiver) = conn.split();
    for i in 0..20u8 {
        // A large record forces several messages, hence several rekeys.
        let record = vec![i; if i % 5 == 0 { 150_000 } else { 10 }];
        sender.send(record).await.unwrap();
    }
    let (got, nonce, rekeys) = peer.await.unwrap();
    for (i, r) in got.iter().enumerate() {
        assert!(r.iter().all(|&b| b == i as u8));
    }
    assert!(nonce >= 4, "several messages");
    assert_eq!(rekeys as u64, nonce / 2, "a rekey every second message");
    drop(sender);
    // The snow peer hung up without a close record.
    assert!(receiver.recv().await.is_err());
}
