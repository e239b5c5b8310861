//! Flow under pressure: notifications waiting for a slot do not stop the
//! session's other traffic, the newest manifest always reaches the peer,
//! and a cancel is delivered even when the send queue is full.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capwire::envelope::Frame;
use capwire::manifest::{Manifest, verb};
use capwire::{CallError, Capability, HandlerError, Limits, Node, NodeHandle, Sender, State};
use common::{ManualPeer, Say, connect_memory, echo_node_unlistening, raw, wait_until};

verb! {
    /// Calls the sender back (`app.echo/say`) and records how that went.
    pub struct Poke: notification "app.relay" / "poke", Bootstrap, u32;
}

#[derive(Debug, Default)]
struct Results {
    ok: AtomicUsize,
    failed: AtomicUsize,
}

async fn poke(
    n: u32,
    Sender(from): Sender,
    node: NodeHandle,
    State(results): State<Arc<Results>>,
) -> Result<(), HandlerError> {
    let reply = node
        .peer(from)
        .request_within(Say, format!("poke {n}"), Duration::from_secs(10))
        .await;
    match reply {
        Ok(_) => results.ok.fetch_add(1, Ordering::SeqCst),
        Err(_) => results.failed.fetch_add(1, Ordering::SeqCst),
    };
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_notification_handler_calling_back_is_not_stalled_by_waiting_notifications() {
    let results = Arc::new(Results::default());
    let relay = Node::builder("relay")
        .capability(
            Capability::new("app.relay", "1.0.0")
                .unwrap()
                .handle(Poke, poke),
        )
        .state(results.clone())
        .limits(Limits {
            max_inflight_per_session: 1,
            ..Limits::default()
        })
        .start()
        .await
        .unwrap();
    let (client, counters) = echo_node_unlistening(Limits::default()).await;
    let peer = connect_memory(&client, &relay).await;
    let started = tokio::time::Instant::now();
    for n in 0..3 {
        peer.notify(Poke, n).await.unwrap();
    }
    wait_until("three pokes came back", || {
        results.ok.load(Ordering::SeqCst) + results.failed.load(Ordering::SeqCst) == 3
    })
    .await;
    assert_eq!(
        results.failed.load(Ordering::SeqCst),
        0,
        "no call timed out"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "nothing waited for a deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(common::Counters::get(&counters.say), 3);
}

fn hello_epochs(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Hello(h) => Some(h.manifest.decode::<Manifest>().unwrap().epoch),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_newest_manifest_reaches_a_peer_whose_queue_was_full() {
    let (server, _counters) = echo_node_unlistening(Limits::default()).await;
    let (a, b) = tokio::io::duplex(16 * 1024);
    server.accept_stream(b);
    let mut slow = ManualPeer::dial(a, server.id()).await;
    let first = slow.read_for(Duration::from_millis(50)).await;
    assert_eq!(hello_epochs(&first), vec![server.manifest().epoch]);
    // Ask for much more than the pipe holds, and stop reading.
    for i in 0..30 {
        slow.control("app.echo", "repeat", &format!("r{i}"), &raw(&60_000u32))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        server.queued_bytes() > 1 << 20,
        "the node's queue is backed up"
    );

    // Three manifest changes meanwhile: pending, bound, unbound.
    let invite = server.invite(None).unwrap();
    let (c, d) = tokio::io::duplex(64 * 1024);
    server.accept_stream(d);
    let mut cp = common::RawPeer::over(c, server.id(), capwire::Keypair::generate().unwrap()).await;
    cp.control(
        "core.monitoring",
        "bind",
        "b",
        &raw(&serde_json::json!({"code": invite.code})),
    )
    .await;
    assert!(cp.response("b").await.outcome.is_ok());
    cp.control(
        "core.monitoring",
        "disable",
        "d",
        &raw(&serde_json::json!({})),
    )
    .await;
    assert!(cp.response("d").await.outcome.is_ok());
    let newest = server.manifest().epoch;

    let rest = slow.read_for(Duration::from_secs(2)).await;
    let epochs = hello_epochs(&rest);
    assert_eq!(
        epochs.last(),
        Some(&newest),
        "the newest manifest arrives: {epochs:?}"
    );
    let answers = rest
        .iter()
        .filter(|f| matches!(f, Frame::Response(_)))
        .count();
    assert_eq!(answers, 30, "and every answer");
}

#[tokio::test(start_paused = true)]
async fn a_cancel_is_delivered_even_when_the_send_queue_is_full() {
    let client = Node::builder("client")
        .limits(Limits {
            max_queued_bytes_per_session: 64 * 1024,
            ..Limits::default()
        })
        .start()
        .await
        .unwrap();
    let (a, b) = tokio::io::duplex(16 * 1024);
    let answering = tokio::spawn(async move { ManualPeer::answer(b).await });
    let peer = client.connect_stream(a, None).await.unwrap();
    let mut server = answering.await.unwrap();
    server.read_for(Duration::from_millis(50)).await;

    // A request the server reads and never answers.
    let caller = {
        let peer = peer.clone();
        tokio::spawn(async move {
            peer.request_within(Say, "x".into(), Duration::from_secs(2))
                .await
        })
    };
    let seen = server.read_for(Duration::from_millis(50)).await;
    let req_id = seen
        .iter()
        .find_map(|f| match f {
            Frame::Control(c) => Some(c.req_id.clone()),
            _ => None,
        })
        .expect("the request arrived");

    // The server stops reading; notifications fill the pipe and the queue.
    let filler = {
        let peer = peer.clone();
        tokio::spawn(async move {
            for i in 0..400u32 {
                let big = "n".repeat(1000 + (i as usize % 7));
                if peer
                    .notify_raw("app.echo", "note", &raw(&big))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        })
    };
    let outcome = caller.await.unwrap();
    assert!(matches!(outcome, Err(CallError::Timeout)), "{outcome:?}");

    // When the server reads again, the cancel is there.
    let later = server.read_for(Duration::from_secs(5)).await;
    assert!(
        later
            .iter()
            .any(|f| matches!(f, Frame::Cancel(c) if c.req_id == req_id)),
        "a cancel for {req_id:?} among {} frames",
        later.len()
    );
    filler.abort();
}
