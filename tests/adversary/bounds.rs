//! What hostile peers can cost the node: floods of silent sockets and
//! half-open handshakes, floods over the accept rate, idle sessions from
//! throwaway keys, a peer that never reads, and shutdown while peers
//! stall.

use std::net::SocketAddr;
use std::time::Duration;

use capwire::envelope::{CloseCode, Frame};
use capwire::transport::{Initiator, OsEntropy};
use capwire::{Contact, Direction, HandshakeFailure, Keypair, Node};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use crate::kit::arena::{Arena, Expect, until};
use crate::kit::cap::{Echo, get};
use crate::kit::wire::{Io, Transcript, Wire, args, control_record, framed, read_message};
use crate::kit::{PROMPT, failures, ok_text};

/// A TCP connection to `to` from the loopback address `from`.
async fn socket_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// Message 1 of a fresh handshake, prefixed.
fn message_1() -> Vec<u8> {
    let kp = Keypair::generate().unwrap();
    let mut m1 = Vec::new();
    Initiator::new(&kp, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    framed(&m1)
}

/// 40 silent sockets from one address and 24 half-open handshakes
/// (message 1, never message 3) from another, with short deadlines
/// (message 1: 1 s, handshake: 2 s). Each source holds at most its 16
/// handshake slots; the rest are told "busy" (`00 00`). Meanwhile an
/// established session and a new honest peer are served; then every
/// slot comes back at the deadlines.
pub async fn handshake_floods(a: Arena) -> Expect {
    let addr = a.addr();
    let mut established = a.wire().await;
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(socket_from("127.0.0.2", addr).await);
    }
    let mut half_open: Vec<Io> = Vec::new();
    for _ in 0..24 {
        let mut s: Io = Box::new(socket_from("127.0.0.3", addr).await);
        s.write_all(&message_1()).await.unwrap();
        half_open.push(s);
    }
    let (mut busy, mut replied) = (0, 0);
    for s in &mut half_open {
        match read_message(s, PROMPT).await {
            Some(m) if m.is_empty() => busy += 1,
            Some(m) if m.len() == 96 => replied += 1,
            other => panic!("neither message 2 nor busy: {other:?}"),
        }
    }
    assert_eq!(
        (replied, busy),
        (16, 8),
        "half-open: the source's share, then busy"
    );
    until("the silent flood is taken or refused", || {
        a.node.refused_connections() == 32
    })
    .await;
    assert_eq!(
        failures(&a.node, Direction::Inbound, HandshakeFailure::PerSource),
        32
    );
    // The accept loop itself holds one permit while it waits.
    assert_eq!(a.node.available_handshake_slots(), 64 - 32 - 1);

    // While the flood sits there.
    let t = Instant::now();
    assert_eq!(a.honest().await.as_deref(), Ok("echo: honest"));
    assert!(t.elapsed() < crate::kit::arena::HONEST, "{:?}", t.elapsed());
    established
        .send(&[&control_record("app.adv", "echo", "e", &args("up"))])
        .await;
    assert_eq!(ok_text(&established.response("e").await), "echo: up");

    // The deadlines give every slot back.
    let t = Instant::now();
    until("every slot is free again", || {
        a.node.available_handshake_slots() == 64 - 1
            && a.node.stats().handshakes_in_progress(Direction::Inbound) == 0
    })
    .await;
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(
        failures(&a.node, Direction::Inbound, HandshakeFailure::Timeout),
        32
    );
    drop((silent, half_open));
    Expect::runs(2)
}

/// 40 connections at once against an accept rate of 20/s with bursts of
/// 10: the excess is told "busy" (counted `rate_limited`); an honest
/// `connect` retries busy answers and gets in.
pub async fn accept_rate_flood(a: Arena) -> Expect {
    let addr = a.addr();
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(socket_from("127.0.0.4", addr).await);
    }
    until("the excess is refused", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::RateLimited) >= 25
    })
    .await;
    assert_eq!(a.honest().await.as_deref(), Ok("echo: honest"));
    drop(flood);
    Expect::runs(1)
}

/// Throwaway keys fill the inbound budget (3): a fourth stranger gets a
/// close `overloaded` in place of the hello; the bound control plane and
/// a contact still get in (reserved slots), and the node still dials out
/// (its own budget).
pub async fn throwaway_keys_fill_the_session_budget(a: Arena) -> Expect {
    let friend = a.setup.spare[1].clone();
    a.node
        .add_contact(Contact {
            name: "friend".into(),
            id: friend.public(),
            addr: "127.0.0.1:9".parse().unwrap(),
        })
        .await
        .unwrap();
    let mut throwaway = Vec::new();
    for _ in 0..3 {
        throwaway.push(a.wire().await);
    }
    until("three sessions", || a.node.connected_peers().len() == 3).await;

    let budget = failures(&a.node, Direction::Inbound, HandshakeFailure::SessionBudget);
    let mut w = a.handshake_as(&Keypair::generate().unwrap()).await.unwrap();
    assert!(!w.hello().await, "no hello for a session beyond the budget");
    assert_eq!(w.close_code(PROMPT).await, Some(CloseCode::Overloaded));
    assert!(a.honest().await.is_err(), "strangers are refused alike");
    until("the refusals are counted", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::SessionBudget) == budget + 2
    })
    .await;

    let mut cp = a.wire_as(&a.setup.spare[0]).await;
    cp.send(&[&control_record("app.adv", "admin", "a", &args("in"))])
        .await;
    assert_eq!(ok_text(&cp.response("a").await), "admin: in");
    let mut f = a.wire_as(&friend).await;
    f.send(&[&control_record("app.adv", "echo", "f", &args("in"))])
        .await;
    assert_eq!(ok_text(&f.response("f").await), "echo: in");

    let other = Node::builder("other")
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let out = a
        .node
        .connect(&other.local_addrs()[0], Some(other.id()))
        .await
        .expect("outbound sessions have their own budget");
    assert_eq!(out.id(), other.id());
    other.shutdown().await;
    a.node.remove_contact(friend.public()).await.unwrap();
    drop((throwaway, w, cp, f));
    Expect::runs(2)
}

/// A peer that asks for 60 MB of answers and reads none: the node keeps
/// at most its queue bound (256 KiB) plus the answers in flight (16 jobs)
/// for it, stops reading it, serves others meanwhile, and drops it at the
/// write deadline (2 s).
pub async fn a_peer_that_never_reads(a: Arena) -> Expect {
    let hog = a.wire().await;
    let hog_id = hog.id;
    let writer = tokio::spawn(async move {
        let mut hog = hog;
        for i in 0..1000 {
            let r = control_record("app.adv", "blob", &format!("b{i}"), &args(&60_000u32));
            if !hog.send(&[&r]).await {
                break;
            }
        }
        hog
    });
    let (client, peer) = a.client(&a.setup.honest).await.unwrap();
    let (mut peak_queued, mut peak_inflight, mut served) = (0, 0, 0);
    let t = Instant::now();
    while a.node.connected_peers().contains(&hog_id) || t.elapsed() < Duration::from_millis(200) {
        peak_queued = peak_queued.max(a.node.queued_bytes());
        peak_inflight = peak_inflight.max(a.node.inflight());
        let r = peer.request(Echo, "during".into()).await.unwrap();
        assert_eq!(r, "echo: during");
        served += 1;
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the peer that never reads is dropped after the write deadline"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(peak_inflight <= 16 + 1, "in flight: {peak_inflight}");
    assert!(
        peak_queued <= 256 * 1024 + 17 * 60_100,
        "queued: {peak_queued} bytes"
    );
    let blobs = get(&a.tally.blob);
    assert!(blobs < 1000, "it was no longer read: {blobs} answers made");
    client.shutdown().await;
    writer.abort();
    Expect::runs(blobs + served)
}

/// Shutdown while one peer never reads (a 16 KiB pipe full of answers),
/// one has a handler that never returns, one stalls in the middle of a
/// message and one finishes its handshake after shutdown began: it ends
/// within `shutdown_grace + close_timeout + 350 ms`, the handler is
/// cancelled, and the late handshake gets no session (no hello).
pub async fn shutdown_while_peers_stall(a: Arena) -> Expect {
    let (x, y) = tokio::io::duplex(16 * 1024);
    a.node.accept_stream(y);
    let mut hog = Wire::initiate(Box::new(x), &Keypair::generate().unwrap(), 0)
        .await
        .unwrap();
    assert!(hog.hello().await);
    for i in 0..40 {
        let r = control_record("app.adv", "blob", &format!("b{i}"), &args(&60_000u32));
        hog.send(&[&r]).await;
    }
    let mut holder = a.wire().await;
    holder
        .send(&[&control_record("app.adv", "hold", "h", &args(&1u64))])
        .await;
    until("the handler runs", || get(&a.tally.hold) == 1).await;
    let mut staller = a.wire().await;
    let msg = staller.seal_records(&[&control_record("app.adv", "echo", "s", &args("x"))]);
    staller.write(&msg[..10]).await;

    let kp = Keypair::generate().unwrap();
    let mut late = a.stream().await;
    let mut m1 = Vec::new();
    let waiting = Initiator::new(&kp, &OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    late.write_all(&framed(&m1)).await.unwrap();
    let m2 = read_message(&mut late, PROMPT).await.unwrap();
    let mut m3 = Vec::new();
    let session = waiting
        .read_message(&m2, &mut Vec::new())
        .unwrap()
        .write_message(&[], &mut m3)
        .unwrap();

    let node = a.node.clone();
    let t = Instant::now();
    let stopping = tokio::spawn(async move { node.shutdown().await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    // The node may have dropped the handshake already.
    let _ = late.write_all(&framed(&m3)).await;
    let mut late = Wire::established(late, session, kp.public(), Transcript::default(), 0);
    stopping.await.unwrap();
    let took = t.elapsed();
    let l = &a.setup.limits;
    let bound = l.shutdown_grace + l.close_timeout + Duration::from_millis(350);
    assert!(took <= bound, "shutdown took {took:?}");
    assert!(
        a.tally.token(0).is_cancelled(),
        "the held handler was cancelled"
    );
    late.until_end(PROMPT).await;
    assert!(
        late.seen
            .iter()
            .all(|f| matches!(f, Frame::Close(c) if c.code == CloseCode::Shutdown)),
        "a handshake finished during shutdown gets no session: {:?}",
        late.seen
    );
    assert!(a.node.connected_peers().is_empty());
    drop((hog, holder, staller));
    Expect {
        runs: get(&a.tally.blob) + 1,
        shut_down: true,
        ..Expect::default()
    }
}
