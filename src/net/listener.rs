//! The accept loop and its bounds: a handshake permit before each accept,
//! an accept rate, and a bound on handshakes per source address.
//!
//! A flood of silent sockets holds at most `max_concurrent_handshakes`
//! permits, each for at most the transport's first-message deadline, and
//! one source at most `max_handshakes_per_source` of them; honest peers
//! wait in the listen backlog instead of being dropped. A connection over
//! the rate or the per-source bound is refused with the transport's
//! "busy" answer, which the dialler sees as a clear, retryable error.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
#[cfg(unix)]
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::OwnedSemaphorePermit;

use crate::net::Net;

/// A listener the accept loop can take streams from.
pub(crate) trait Acceptor: Send + Sync + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next stream and the address it came from (`None` when there is
    /// no network address, as for Unix sockets).
    fn accept_stream(
        &self,
    ) -> impl Future<Output = std::io::Result<(Self::Stream, Option<IpAddr>)>> + Send;

    /// Answers "busy" without waiting and drops the stream (when too many
    /// refusals are in progress to give this one its usual linger).
    fn refuse_now(stream: Self::Stream);
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;
    async fn accept_stream(&self) -> std::io::Result<(TcpStream, Option<IpAddr>)> {
        let (stream, addr) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, Some(addr.ip())))
    }

    fn refuse_now(stream: TcpStream) {
        let _ = stream.try_write(&[0, 0]);
    }
}

#[cfg(unix)]
impl Acceptor for UnixListener {
    type Stream = UnixStream;
    async fn accept_stream(&self) -> std::io::Result<(UnixStream, Option<IpAddr>)> {
        self.accept().await.map(|(stream, _)| (stream, None))
    }

    fn refuse_now(stream: UnixStream) {
        let _ = stream.try_write(&[0, 0]);
    }
}

/// Accepts connections until the node stops accepting; each is served in
/// a task of its own. Accept errors (e.g. out of file descriptors) are
/// logged and retried after a short pause.
pub(crate) async fn accept_loop<A: Acceptor>(net: Arc<Net>, listener: A) {
    let gate = net.accept.clone();
    let stop = net.peers.stopping().clone();
    loop {
        // A permit before accept: with every permit taken, new
        // connections wait in the listen backlog.
        let permit: OwnedSemaphorePermit = tokio::select! {
            () = stop.cancelled() => break,
            p = gate.permit() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept_stream() => a,
        };
        let (stream, source) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                drop(permit);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let guard = match gate.admit(source) {
            Ok(guard) => guard,
            Err(reason) => {
                drop(permit);
                tracing::debug!(
                    ?source,
                    %reason,
                    "connection refused: accept rate or per-source bound"
                );
                net.metrics_refused(reason);
                match gate.refusal_slot() {
                    Some(slot) => {
                        net.tracker.spawn(async move {
                            capwire_transport::Endpoint::refuse_busy(stream).await;
                            drop(slot);
                        });
                    }
                    None => A::refuse_now(stream),
                }
                continue;
            }
        };
        let net2 = net.clone();
        net.tracker.spawn(async move {
            net2.serve_inbound(stream, (permit, guard)).await;
        });
    }
}
