//! A peer the node closed for being idle, that keeps its stream open and
//! says nothing: the node lingers (reading and discarding) for at most
//! `close_timeout`, and should wait quietly meanwhile.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use capwire::Keypair;
use capwire::envelope::CloseCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::kit::arena::{Arena, Expect};
use crate::kit::wire::Wire;

/// A stream that counts how often the node polls it.
struct Counting<S> {
    inner: S,
    polls: Arc<AtomicU64>,
}

impl<S> Counting<S> {
    fn count(&self) {
        self.polls.fetch_add(1, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counting<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.count();
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counting<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.count();
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.count();
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.count();
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// After its `idle_timeout` close (idle 1 s here), the node lingers until
/// the peer hangs up or `close_timeout` passes. A peer that does neither
/// must not make it spin: it polls the stream a handful of times (as it
/// does after a `protocol_error` close), not hundreds of times a second.
/// Under tokio's paused clock such a spin never lets time advance, so
/// the session would never end at all.
pub async fn an_idle_closed_peer_that_keeps_its_stream_open(a: Arena) -> Expect {
    let polls = Arc::new(AtomicU64::new(0));
    let (x, y) = tokio::io::duplex(64 * 1024);
    a.node.accept_stream(Counting {
        inner: y,
        polls: polls.clone(),
    });
    let mut w = Wire::initiate(Box::new(x), &Keypair::generate().unwrap(), 0)
        .await
        .unwrap();
    assert!(w.hello().await);
    assert_eq!(
        w.close_code(Duration::from_secs(10)).await,
        Some(CloseCode::IdleTimeout)
    );
    let before = polls.load(Ordering::Relaxed);
    let t = Instant::now();
    while !a.node.connected_peers().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the session lingers on"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lingered = t.elapsed();
    let n = polls.load(Ordering::Relaxed) - before;
    assert!(
        lingered <= a.setup.limits.close_timeout + Duration::from_millis(500),
        "lingered {lingered:?}"
    );
    assert!(
        n <= 50,
        "the node polled the stream {n} times in the {lingered:?} it lingered after its \
         idle_timeout close: its timer keeps firing at once (the idle deadline it re-arms \
         is already past)"
    );
    drop(w);
    Expect::nothing()
}
