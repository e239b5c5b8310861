//! The Noise handshake, with the node in both roles: short, long,
//! repeated and out-of-turn messages, replayed and reflected handshakes,
//! another prologue or protocol name, low-order ephemeral and static keys
//! in every encoding, and static keys the contact policy refuses, equal
//! to the node's own, or in another encoding.

use std::future::Future;
use std::time::Duration;

use capwire::envelope::{CloseCode, NodeId};
use capwire::transport::{CloseCode as TransportClose, Initiator, OsEntropy, Responder};
use capwire::{ContactPolicy, Direction, HandshakeFailure, Keypair, NodeError, Peer};
use tokio::io::AsyncWriteExt;

use crate::kit::arena::{Arena, Expect, Setup, until};
use crate::kit::forge::{self, Forged, Static, low_order_encodings};
use crate::kit::wire::{
    Io, Wire, args, control_record, ends_within, framed, hello_record, read_message,
};
use crate::kit::{PROMPT, closed_with, failures, ok_text};

/// The node dials a stream whose other end `script` plays; the node's
/// result, once the script is done with the stream.
async fn node_dials<F, Fut>(a: &Arena, script: F) -> Result<Peer, NodeError>
where
    F: FnOnce(Io) -> Fut,
    Fut: Future<Output = Io>,
{
    let (x, y) = tokio::io::duplex(64 * 1024);
    let node = a.node.clone();
    let dial = tokio::spawn(async move { node.connect_stream(x, None).await });
    let stream = script(Box::new(y)).await;
    let r = dial.await.unwrap();
    drop(stream);
    r
}

/// Our message 1, and the state to go on with.
fn message_1() -> (Vec<u8>, capwire::transport::InitiatorAwaitingReply) {
    let kp = Keypair::generate().unwrap();
    let mut m1 = Vec::new();
    let waiting = Initiator::new(&kp, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    (framed(&m1), waiting)
}

/// `len` bytes, prefixed.
fn junk(len: usize) -> Vec<u8> {
    framed(&vec![7u8; len])
}

/// Writes `bytes` to a fresh inbound stream; the node must drop it
/// without a message 2 (judging lengths on the prefix).
async fn refused_at_once(a: &Arena, bytes: &[u8], what: &str) {
    let mut s = a.stream().await;
    s.write_all(bytes).await.unwrap();
    let mut got = 0;
    assert!(
        ends_within(&mut s, Duration::from_secs(2), &mut got).await,
        "{what}: dropped"
    );
    assert_eq!(got, 0, "{what}: no message 2");
}

/// Out-of-turn, repeated, short and long handshake messages, with the node
/// as responder and as initiator: each handshake is refused (counted as a
/// protocol failure), no session opens.
pub async fn handshake_messages_out_of_turn_repeated_short_long(a: Arena) -> Expect {
    let inbound = failures(&a.node, Direction::Inbound, HandshakeFailure::Protocol);
    // The node as responder.
    refused_at_once(&a, &junk(31), "message 1 of 31 bytes").await;
    refused_at_once(&a, &[0x00, 0x21], "message 1 announced at 33 bytes").await;
    refused_at_once(&a, &[0x00, 0x00], "message 1 of 0 bytes").await;
    let (m1, _) = message_1();
    refused_at_once(&a, &[m1, junk(64)].concat(), "bytes after message 1").await;
    for (what, m3) in [
        ("message 1 again in place of message 3", None),
        ("message 3 announced at 65 bytes", Some(vec![0x00, 0x41])),
        ("message 3 of 63 bytes", Some(junk(63))),
    ] {
        let (m1, _) = message_1();
        let mut s = a.stream().await;
        s.write_all(&m1).await.unwrap();
        read_message(&mut s, PROMPT).await.expect("message 2");
        s.write_all(&m3.unwrap_or(m1)).await.unwrap();
        let mut got = 0;
        assert!(ends_within(&mut s, PROMPT, &mut got).await, "{what}");
        assert_eq!(got, 0, "{what}: nothing after message 2");
    }
    until("the responder's failures are counted", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::Protocol) == inbound + 7
    })
    .await;

    // A repeated message 3 is the first transport message: it fails.
    let mut w = a.handshake_as(&Keypair::generate().unwrap()).await.unwrap();
    let m3 = w.transcript.m3.clone();
    w.write(&m3).await;
    closed_with(&mut w, CloseCode::ProtocolError, "message 3 twice").await;

    // The node as initiator.
    let outbound = failures(&a.node, Direction::Outbound, HandshakeFailure::Protocol);
    let valid_m2 = |m1: &[u8]| {
        let kp = Keypair::generate().unwrap();
        let mut m2 = Vec::new();
        Responder::new(&kp, &OsEntropy)
            .unwrap()
            .read_message(m1, &mut Vec::new())
            .unwrap()
            .write_message(&[], &mut m2)
            .unwrap();
        framed(&m2)
    };
    type Reply = Box<dyn Fn(&[u8]) -> Vec<u8>>;
    let replies: Vec<(&str, Reply)> = vec![
        ("message 2 of 95 bytes", Box::new(|_| junk(95))),
        (
            "message 2 announced at 97 bytes",
            Box::new(|_| vec![0x00, 0x61]),
        ),
        ("its own message 1 back", Box::new(framed)),
        (
            "bytes after message 2",
            Box::new(move |m1| [valid_m2(m1), junk(20)].concat()),
        ),
    ];
    for (what, reply) in replies {
        let r = node_dials(&a, |mut s| async move {
            let m1 = read_message(&mut s, PROMPT).await.expect("message 1");
            s.write_all(&reply(&m1)).await.unwrap();
            s
        })
        .await;
        assert!(r.is_err(), "{what}: the node's dial must fail");
    }
    until("the initiator's failures are counted", || {
        failures(&a.node, Direction::Outbound, HandshakeFailure::Protocol) == outbound + 4
    })
    .await;
    Expect::nothing()
}

/// Handshake messages of one session replayed on another: message 1 of
/// an earlier handshake gets a fresh message 2 (another ephemeral), and
/// that handshake's message 3 then fails; our fresh message 1 with the
/// old message 3 fails too; the node's own message 2 sent back as message
/// 1 is refused. The session they were copied from is unharmed.
pub async fn replayed_and_reflected_handshakes(a: Arena) -> Expect {
    let crypto = failures(&a.node, Direction::Inbound, HandshakeFailure::Crypto);
    let protocol = failures(&a.node, Direction::Inbound, HandshakeFailure::Protocol);
    let mut original = a.wire().await;
    let t = original.transcript.clone();

    let mut s = a.stream().await;
    s.write_all(&t.m1).await.unwrap();
    let m2 = read_message(&mut s, PROMPT).await.expect("a message 2");
    assert_ne!(framed(&m2), t.m2, "a fresh ephemeral, not the old reply");
    s.write_all(&t.m3).await.unwrap();
    let mut got = 0;
    assert!(ends_within(&mut s, PROMPT, &mut got).await);
    assert_eq!(got, 0, "no hello for a replayed handshake");

    let (m1, _) = message_1();
    let mut s = a.stream().await;
    s.write_all(&m1).await.unwrap();
    read_message(&mut s, PROMPT).await.expect("a message 2");
    s.write_all(&t.m3).await.unwrap();
    assert!(ends_within(&mut s, PROMPT, &mut got).await);
    assert_eq!(got, 0);

    refused_at_once(&a, &t.m2, "message 2 reflected as message 1").await;
    until("the failures are counted", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::Crypto) == crypto + 2
            && failures(&a.node, Direction::Inbound, HandshakeFailure::Protocol) == protocol + 1
    })
    .await;

    original
        .send(&[&control_record("app.adv", "echo", "still", &args("here"))])
        .await;
    assert_eq!(ok_text(&original.response("still").await), "echo: here");
    Expect::runs(1)
}

/// Another prologue (`capwire/2`) or protocol name (BLAKE2b) on the other
/// side: the node fails the handshake at message 2 when it dials, and
/// never gets a valid message 3 when it answers.
pub async fn prologue_or_protocol_name_mismatch(a: Arena) -> Expect {
    let crypto = failures(&a.node, Direction::Outbound, HandshakeFailure::Crypto);
    // The node dials a responder with another prologue.
    let r = node_dials(&a, |mut s| async move {
        let m1 = read_message(&mut s, PROMPT).await.unwrap();
        let kp = Keypair::generate().unwrap();
        let mut m2 = Vec::new();
        Responder::with_prologue(&kp, b"capwire/2", &OsEntropy)
            .unwrap()
            .read_message(&m1, &mut Vec::new())
            .unwrap()
            .write_message(&[], &mut m2)
            .unwrap();
        s.write_all(&framed(&m2)).await.unwrap();
        s
    })
    .await;
    assert!(r.is_err(), "another prologue: {r:?}");
    // ... and a responder with another protocol name (snow).
    let r = node_dials(&a, |mut s| async move {
        let kp = Keypair::generate().unwrap();
        let secret = kp.secret_bytes();
        let mut hs = snow::Builder::new("Noise_XX_25519_ChaChaPoly_BLAKE2b".parse().unwrap())
            .local_private_key(&secret[..])
            .unwrap()
            .prologue(capwire::transport::PROLOGUE)
            .unwrap()
            .build_responder()
            .unwrap();
        let m1 = read_message(&mut s, PROMPT).await.unwrap();
        let mut buf = vec![0u8; 256];
        hs.read_message(&m1, &mut buf).unwrap();
        let n = hs.write_message(&[], &mut buf).unwrap();
        s.write_all(&framed(&buf[..n])).await.unwrap();
        s
    })
    .await;
    assert!(r.is_err(), "another protocol name: {r:?}");
    until("both are counted as crypto failures", || {
        failures(&a.node, Direction::Outbound, HandshakeFailure::Crypto) == crypto + 2
    })
    .await;

    // The node answers an initiator with another prologue: that side
    // cannot open message 2, so no message 3 comes.
    let kp = Keypair::generate().unwrap();
    let mut m1 = Vec::new();
    let waiting = Initiator::with_prologue(&kp, b"capwire/2", &OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    let mut s = a.stream().await;
    s.write_all(&framed(&m1)).await.unwrap();
    let m2 = read_message(&mut s, PROMPT).await.unwrap();
    assert!(waiting.read_message(&m2, &mut Vec::new()).is_err());
    Expect::nothing()
}

/// Every low-order point, in every encoding, as the remote ephemeral key:
/// in message 1 (the node answers) and in message 2 (the node dials). The
/// node aborts before anything else: `ee` is not contributory.
pub async fn low_order_ephemeral_keys(a: Arena) -> Expect {
    let points = low_order_encodings();
    let n = points.len() as u64;
    let inbound = failures(&a.node, Direction::Inbound, HandshakeFailure::Crypto);
    let outbound = failures(&a.node, Direction::Outbound, HandshakeFailure::Crypto);
    for p in &points {
        refused_at_once(&a, &framed(p), "a low-order ephemeral in message 1").await;
    }
    for p in points {
        let r = node_dials(&a, |mut s| async move {
            read_message(&mut s, PROMPT).await.unwrap();
            let mut m2 = p.to_vec();
            m2.extend([1u8; 64]);
            s.write_all(&framed(&m2)).await.unwrap();
            s
        })
        .await;
        assert!(r.is_err(), "a low-order ephemeral in message 2: {p:02x?}");
    }
    until("every abort is counted as a crypto failure", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::Crypto) == inbound + n
            && failures(&a.node, Direction::Outbound, HandshakeFailure::Crypto) == outbound + n
    })
    .await;
    Expect::nothing()
}

/// Every low-order point, in every encoding, as the remote static key, in
/// an otherwise correct handshake forged by hand: in message 3 (the node
/// answers) and in message 2 (the node dials). The node aborts (`se` or
/// `es` is not contributory) and opens no session. The same forger with
/// a genuine key gets the node's hello, in both roles.
pub async fn low_order_static_keys(a: Arena) -> Expect {
    let points = low_order_encodings();
    let n = points.len() as u64;
    let genuine = || Static::Genuine(*Keypair::generate().unwrap().secret_bytes());

    let accepted = forge::initiate(a.stream().await, &genuine()).await;
    assert!(
        matches!(
            &accepted,
            Forged::Accepted(capwire::envelope::Frame::Hello(_))
        ),
        "control: the forger is a correct initiator: {accepted:?}"
    );
    let (x, y) = tokio::io::duplex(64 * 1024);
    let node = a.node.clone();
    let dial = tokio::spawn(async move { node.connect_stream(x, None).await });
    let accepted = forge::respond(Box::new(y), &genuine()).await;
    assert!(
        matches!(
            &accepted,
            Forged::Accepted(capwire::envelope::Frame::Hello(_))
        ),
        "control: the forger is a correct responder: {accepted:?}"
    );
    // We sent no hello and hung up: that dial fails.
    assert!(dial.await.unwrap().is_err());

    let inbound = failures(&a.node, Direction::Inbound, HandshakeFailure::Crypto);
    let outbound = failures(&a.node, Direction::Outbound, HandshakeFailure::Crypto);
    for p in &points {
        let r = forge::initiate(a.stream().await, &Static::LowOrder(*p)).await;
        assert_eq!(
            r,
            Forged::Aborted,
            "a low-order static key in message 3: {p:02x?}"
        );
    }
    for p in points {
        let (x, y) = tokio::io::duplex(64 * 1024);
        let node = a.node.clone();
        let dial = tokio::spawn(async move { node.connect_stream(x, None).await });
        let r = forge::respond(Box::new(y), &Static::LowOrder(p)).await;
        assert_eq!(
            r,
            Forged::Aborted,
            "a low-order static key in message 2: {p:02x?}"
        );
        assert!(dial.await.unwrap().is_err());
    }
    until("every abort is counted as a crypto failure", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::Crypto) == inbound + n
            && failures(&a.node, Direction::Outbound, HandshakeFailure::Crypto) == outbound + n
    })
    .await;
    Expect::nothing()
}

/// The same key with bit 255 set: another encoding of it.
fn alias(id: NodeId) -> [u8; 32] {
    let mut b = *id.as_bytes();
    b[31] |= 0x80;
    b
}

/// A node that admits only its contacts (the honest peer, `spare[0]` its
/// control plane, `spare[1]` a friend).
pub fn contact_policy_setup() -> Setup {
    let mut s = Setup::tcp().bound();
    s.policy = Some(ContactPolicy::allow_list([
        s.honest.public(),
        s.spare[0].public(),
        s.spare[1].public(),
    ]));
    s
}

/// Static keys judged by what they are: a stranger is refused (a denied
/// close, no record of its delivered); the node's own key is refused; the
/// friend and the control plane in their bit-255 encodings are the keys
/// they really are (admitted; the control plane's verbs work); a stranger
/// whose hello claims the control plane's id is refused.
pub async fn static_keys_judged_in_canonical_form(a: Arena) -> Expect {
    let denied = failures(&a.node, Direction::Inbound, HandshakeFailure::Denied);
    for (what, kp) in [
        ("a stranger", Keypair::generate().unwrap()),
        ("the node's own key", a.setup.keypair.clone()),
    ] {
        let mut w = a.handshake_as(&kp).await.expect("our side finishes first");
        w.send(&[&control_record("app.adv", "echo", "leak", &args("x"))])
            .await;
        assert!(w.until_end(PROMPT).await, "{what}");
        assert_eq!(
            w.transport_close.as_ref().map(|c| c.code),
            Some(TransportClose::Denied),
            "{what}"
        );
        assert!(w.seen.is_empty(), "{what}: no hello, nothing: {:?}", w.seen);
    }
    until("both refusals are counted", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::Denied) == denied + 2
    })
    .await;

    let friend = a.setup.spare[1]
        .clone()
        .with_public_encoding_for_testing(alias(a.setup.spare[1].public()))
        .unwrap();
    let mut w = a.wire_as(&friend).await;
    assert_eq!(w.id, a.setup.spare[1].public());
    w.send(&[&control_record("app.adv", "echo", "f", &args("friend"))])
        .await;
    assert_eq!(ok_text(&w.response("f").await), "echo: friend");
    assert!(
        a.node
            .connected_peers()
            .contains(&a.setup.spare[1].public()),
        "known as its canonical key: {:?}",
        a.node.connected_peers()
    );

    let cp = a.setup.spare[0]
        .clone()
        .with_public_encoding_for_testing(alias(a.setup.spare[0].public()))
        .unwrap();
    let mut c = a.wire_as(&cp).await;
    c.send(&[&control_record("app.adv", "admin", "c", &args("go"))])
        .await;
    assert_eq!(ok_text(&c.response("c").await), "admin: go");

    // A friend whose hello claims to be the control plane.
    let claimer = a.setup.spare[1].clone();
    let mut w2: Wire = a.handshake_as(&claimer).await.unwrap();
    let claim = hello_record(a.setup.spare[0].public());
    w2.send(&[&claim]).await;
    closed_with(
        &mut w2,
        CloseCode::ProtocolError,
        "a hello claiming another id",
    )
    .await;
    Expect::runs(2)
}

/// Frames out of turn after the handshake: a request before the hello,
/// and a request right behind a hello the node refuses (in the same
/// message): the session ends with `protocol_error` and neither request
/// runs.
pub async fn requests_before_a_valid_hello(a: Arena) -> Expect {
    use capwire::envelope::{Frame, Hello, Limits as WireLimits, RawValue};
    let echo = control_record("app.adv", "echo", "early", &args("x"));
    let mut w = a.handshake_as(&Keypair::generate().unwrap()).await.unwrap();
    w.send(&[&echo]).await;
    closed_with(
        &mut w,
        CloseCode::ProtocolError,
        "a request before the hello",
    )
    .await;
    assert_eq!(w.responses_to("early"), 0);

    let kp = Keypair::generate().unwrap();
    let manifest = crate::common::bare_manifest(kp.public());
    for (what, limits, protocol) in [
        (
            "max_inflight 0",
            WireLimits {
                max_inflight: 0,
                ..WireLimits::default()
            },
            1,
        ),
        (
            "max_record 65535",
            WireLimits {
                max_record: 65_535,
                ..WireLimits::default()
            },
            1,
        ),
        ("protocol 2", WireLimits::default(), 2),
    ] {
        let mut hello = Hello::new(RawValue::encode(&manifest).unwrap(), limits);
        hello.protocol = protocol;
        let hello = crate::common::record(&Frame::Hello(hello));
        let mut w = a.handshake_as(&kp).await.unwrap();
        w.send(&[&hello, &echo]).await;
        let code = if protocol == 1 {
            CloseCode::ProtocolError
        } else {
            CloseCode::UnsupportedProtocol
        };
        closed_with(&mut w, code, what).await;
        assert_eq!(w.responses_to("early"), 0, "{what}");
    }
    Expect::nothing()
}
