//! Faults: a peer killed (its stream cut, no close record) in the middle
//! of requests both ways, and a silent network partition between two
//! nodes, healed afterwards.

use std::time::Duration;

use capwire::envelope::Frame;
use capwire::{CallError, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::kit::arena::{Arena, Expect, until};
use crate::kit::cap::{Echo, Hold, get};
use crate::kit::cbor::{control, uint};
use crate::kit::wire::args;

/// A peer with a request running on the node and a call of the node's
/// waiting for its answer, cut without a close record: the node's call
/// fails `PeerLost` at once, the handler running for the peer is
/// cancelled, the session and its ledger entries are gone.
pub async fn peer_cut_mid_request(a: Arena) -> Expect {
    let mut w = a.wire().await;
    w.send(&[&control("app.adv", "hold", "h", uint(1))]).await;
    until("the handler started", || get(&a.tally.hold) == 1).await;
    let peer = a.node.peer(w.id);
    let call = tokio::spawn(async move {
        peer.call_raw("app.gone", "ask", &args(&()), Duration::from_secs(60))
            .await
    });
    loop {
        match w.next(Duration::from_secs(5)).await {
            Some(Frame::Control(_)) => break,
            Some(_) => {}
            None => panic!("the node's call never came"),
        }
    }
    let t = Instant::now();
    drop(w);
    let r = call.await.unwrap();
    assert!(matches!(r, Err(CallError::PeerLost)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    until("the handler was cancelled and ended", || {
        a.tally.token(0).is_cancelled() && get(&a.tally.hold_ended) == 1
    })
    .await;
    until("the session is gone", || {
        a.node.connected_peers().is_empty()
    })
    .await;
    assert_eq!(a.node.ledger_sizes().running, 0);
    Expect::runs(1)
}

/// Copies bytes both ways until `cut`; from then on it still holds both
/// streams open but forwards nothing (a silent partition).
async fn relay(
    mut x: tokio::io::DuplexStream,
    mut y: tokio::io::DuplexStream,
    cut: tokio_util::sync::CancellationToken,
) {
    let (mut bx, mut by) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            () = cut.cancelled() => break,
            n = x.read(&mut bx) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if y.write_all(&bx[..n]).await.is_err() { return },
            },
            n = y.read(&mut by) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if x.write_all(&by[..n]).await.is_err() { return },
            },
        }
    }
    // Partitioned: bytes go nowhere, nobody hears of it.
    loop {
        tokio::select! {
            n = x.read(&mut bx) => if matches!(n, Ok(0) | Err(_)) { return },
            n = y.read(&mut by) => if matches!(n, Ok(0) | Err(_)) { return },
        }
    }
}

/// A client node reaches the target through a link that then goes silent
/// (paused time): the client's call in flight fails `Timeout` at its
/// deadline, the target's handler stops at the caller's budget, both
/// sides drop the session at the idle deadline (60 s), and a new link
/// works at once.
pub async fn network_partition(a: Arena) -> Expect {
    let (c, r1) = tokio::io::duplex(64 * 1024);
    let (r2, s) = tokio::io::duplex(64 * 1024);
    a.node.accept_stream(s);
    let cut = tokio_util::sync::CancellationToken::new();
    let link = tokio::spawn(relay(r1, r2, cut.clone()));
    let client = Node::builder("far")
        .keypair(a.setup.honest.clone())
        .start()
        .await
        .unwrap();
    let peer = client.connect_stream(c, Some(a.id())).await.unwrap();
    assert_eq!(
        peer.request(Echo, "before".into()).await.unwrap(),
        "echo: before"
    );

    let held = peer.clone();
    let call =
        tokio::spawn(async move { held.request_within(Hold, 1, Duration::from_secs(5)).await });
    until("the handler started", || get(&a.tally.hold) == 1).await;
    cut.cancel();
    let t = Instant::now();
    let r = call.await.unwrap();
    assert!(matches!(r, Err(CallError::Timeout)), "{r:?}");
    assert!(t.elapsed() <= Duration::from_secs(6), "{:?}", t.elapsed());
    until("the handler stopped at the caller's budget", || {
        a.tally.token(0).is_cancelled()
    })
    .await;

    let t = Instant::now();
    while !(a.node.connected_peers().is_empty() && client.connected_peers().is_empty()) {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "sessions kept past the idle deadline"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        t.elapsed() >= Duration::from_secs(50),
        "not before the idle deadline"
    );
    let after = peer.request(Echo, "lost".into()).await;
    assert!(after.is_err(), "{after:?}");
    link.abort();

    // Healed: a new link, the same identities.
    let (c, s) = tokio::io::duplex(64 * 1024);
    a.node.accept_stream(s);
    let peer = client.connect_stream(c, Some(a.id())).await.unwrap();
    assert_eq!(
        peer.request(Echo, "after".into()).await.unwrap(),
        "echo: after"
    );
    client.shutdown().await;
    Expect::runs(3)
}
