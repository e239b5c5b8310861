//! Graceful shutdown ends within `shutdown_grace + close_timeout + 350 ms`
//! whatever peers do: never read, stall, or finish a handshake in the
//! middle of it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use capwire::envelope::{CloseCode, Frame};
use capwire::transport::Endpoint;
use capwire::{ContactPolicy, Keypair, Limits, TransportConfig};
use common::{RawPeer, echo_node_unlistening, raw, wait_until};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

fn limits() -> Limits {
    Limits {
        shutdown_grace: Duration::from_secs(2),
        ..Limits::default()
    }
}

fn bound(l: &Limits) -> Duration {
    l.shutdown_grace + l.close_timeout + Duration::from_millis(350)
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_in_time_when_a_peer_never_reads() {
    let (server, counters) = echo_node_unlistening(limits()).await;
    // A small pipe the peer never drains.
    let (a, b) = tokio::io::duplex(16 * 1024);
    server.accept_stream(b);
    let peer = RawPeer::over(a, server.id(), Keypair::generate().unwrap()).await;
    for i in 0..40 {
        peer.control("app.echo", "repeat", &format!("r{i}"), &raw(&60_000u32))
            .await;
    }
    // And one request whose handler waits for ever.
    peer.control("app.echo", "hold", "h", &raw(&1u64)).await;
    wait_until("the hold handler runs", || {
        Counters::get(&counters.held) == 1
    })
    .await;

    let started = Instant::now();
    server.shutdown().await;
    let took = started.elapsed();
    assert!(took <= bound(&limits()), "shutdown took {took:?}");
    assert!(server.connected_peers().is_empty());
    assert!(counters.all_held_cancelled());
    drop(peer);
}

use common::Counters;

/// A stream whose second write waits until released: the initiator's
/// handshake message 3.
struct StallThird<S> {
    inner: S,
    writes: Arc<AtomicUsize>,
    release: Arc<Notify>,
    waiting: Option<Pin<Box<tokio::sync::futures::OwnedNotified>>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for StallThird<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallThird<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.writes.load(Ordering::SeqCst) == 1 {
            let release = self.release.clone();
            let waiting = self
                .waiting
                .get_or_insert_with(|| Box::pin(release.notified_owned()));
            if waiting.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(_)) = r {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

use std::future::Future;

#[tokio::test(start_paused = true)]
async fn a_handshake_finishing_during_shutdown_gets_no_session() {
    let (server, counters) = echo_node_unlistening(limits()).await;
    // A running handler, so that shutdown waits its grace.
    let (a, b) = tokio::io::duplex(256 * 1024);
    server.accept_stream(b);
    let busy = RawPeer::over(a, server.id(), Keypair::generate().unwrap()).await;
    busy.control("app.echo", "hold", "h", &raw(&1u64)).await;
    wait_until("the hold handler runs", || {
        Counters::get(&counters.held) == 1
    })
    .await;

    // A second peer whose handshake stalls before its last message.
    let (c, d) = tokio::io::duplex(256 * 1024);
    server.accept_stream(d);
    let release = Arc::new(Notify::new());
    let stalled = StallThird {
        inner: c,
        writes: Arc::new(AtomicUsize::new(0)),
        release: release.clone(),
        waiting: None,
    };
    let endpoint = Endpoint::new(
        Keypair::generate().unwrap(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    let node_id = server.id();
    let late = tokio::spawn(async move { endpoint.connect(stalled, Some(node_id)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;

    let started = Instant::now();
    let shutting = {
        let server = server.clone();
        tokio::spawn(async move { server.shutdown().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    release.notify_one();
    // Whatever the late peer got, it has no session with the node.
    if let Ok(conn) = late.await.unwrap() {
        let (_tx, mut rx) = conn.split();
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert!(
            !matches!(&first, Ok(Ok(Some(r))) if matches!(
                capwire::envelope::decode_frame(r), Ok(capwire::envelope::FrameRef::Hello(_))
            )),
            "no hello for a session made during shutdown: {first:?}"
        );
    }
    shutting.await.unwrap();
    let took = started.elapsed();
    assert!(took <= bound(&limits()), "shutdown took {took:?}");
    assert!(server.connected_peers().is_empty());
    drop(busy);
}

#[tokio::test(start_paused = true)]
async fn sessions_still_waiting_for_their_hello_are_closed_too() {
    let (server, _counters) = echo_node_unlistening(limits()).await;
    let (a, b) = tokio::io::duplex(64 * 1024);
    server.accept_stream(b);
    let endpoint = Endpoint::new(
        Keypair::generate().unwrap(),
        TransportConfig::default(),
        ContactPolicy::AcceptAny,
    );
    // The handshake completes; we never send our hello.
    let conn = endpoint.connect(a, Some(server.id())).await.unwrap();
    let (_tx, mut rx) = conn.split();
    assert!(rx.recv().await.unwrap().is_some(), "the node's hello");

    let started = Instant::now();
    server.shutdown().await;
    assert!(started.elapsed() <= bound(&limits()));
    let close = rx.recv().await.unwrap().expect("a close frame");
    let frame = capwire::envelope::decode_frame(&close)
        .unwrap()
        .to_frame()
        .unwrap();
    assert!(
        matches!(&frame, Frame::Close(c) if c.code == CloseCode::Shutdown),
        "{frame:?}"
    );
}
