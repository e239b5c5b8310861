//! The accept loop and its bounds: a handshake permit before each accept,
//! an accept rate, and a bound on handshakes per source address.
//!
//! A flood of silent sockets holds at most `max_concurrent_handshakes`
//! permits, each for at most the transport's first-message deadline, and
//! one source at most `max_handshakes_per_source` of them; honest peers
//! wait in the listen backlog instead of being dropped. A connection over
//! the rate or the per-source bound is refused with the transport's
//! "busy" answer, which the dialler sees as a clear, retryable error.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
#[cfg(unix)]
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::net::Net;

/// Refusals in progress at once; beyond, a refused stream is just dropped.
const MAX_REFUSALS: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bounds on inbound connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcceptLimits {
    pub(crate) max_handshakes: usize,
    pub(crate) per_source: usize,
    pub(crate) rate_per_sec: u32,
    pub(crate) burst: u32,
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The state behind the bounds, shared by every listener of a node.
#[derive(Debug)]
pub(crate) struct AcceptGate {
    limits: AcceptLimits,
    permits: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    sources: Mutex<HashMap<IpAddr, usize>>,
    bucket: Mutex<Bucket>,
}

/// A source's handshake in progress; given back when dropped.
#[derive(Debug)]
pub(crate) struct SourceGuard {
    gate: Arc<AcceptGate>,
    source: Option<IpAddr>,
}

impl Drop for SourceGuard {
    fn drop(&mut self) {
        if let Some(ip) = self.source {
            let mut sources = lock(&self.gate.sources);
            if let Some(n) = sources.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    sources.remove(&ip);
                }
            }
        }
    }
}

impl AcceptGate {
    pub(crate) fn new(limits: AcceptLimits) -> Self {
        Self {
            limits,
            permits: Arc::new(Semaphore::new(limits.max_handshakes)),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS)),
            sources: Mutex::new(HashMap::new()),
            bucket: Mutex::new(Bucket {
                tokens: f64::from(limits.burst),
                last: Instant::now(),
            }),
        }
    }

    /// A handshake permit, if one is free now.
    pub(crate) fn try_permit(&self) -> Result<OwnedSemaphorePermit, tokio::sync::TryAcquireError> {
        self.permits.clone().try_acquire_owned()
    }

    /// Handshake permits free now.
    pub(crate) fn available(&self) -> usize {
        self.permits.available_permits()
    }

    fn allow_rate(&self) -> bool {
        let mut b = lock(&self.bucket);
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.last = now;
        b.tokens = (b.tokens + elapsed * f64::from(self.limits.rate_per_sec))
            .min(f64::from(self.limits.burst));
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn enter(self: &Arc<Self>, source: Option<IpAddr>) -> Option<SourceGuard> {
        if let Some(ip) = source {
            let mut sources = lock(&self.sources);
            let n = sources.entry(ip).or_insert(0);
            if *n >= self.limits.per_source {
                return None;
            }
            *n += 1;
        }
        Some(SourceGuard {
            gate: self.clone(),
            source,
        })
    }
}

/// A listener the accept loop can take streams from.
pub(crate) trait Acceptor: Send + Sync + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next stream and the address it came from (`None` when there is
    /// no network address, as for Unix sockets).
    fn accept_stream(
        &self,
    ) -> impl Future<Output = std::io::Result<(Self::Stream, Option<IpAddr>)>> + Send;
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;
    async fn accept_stream(&self) -> std::io::Result<(TcpStream, Option<IpAddr>)> {
        let (stream, addr) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, Some(addr.ip())))
    }
}

#[cfg(unix)]
impl Acceptor for UnixListener {
    type Stream = UnixStream;
    async fn accept_stream(&self) -> std::io::Result<(UnixStream, Option<IpAddr>)> {
        self.accept().await.map(|(stream, _)| (stream, None))
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
            p = gate.permits.clone().acquire_owned() => match p {
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
        let guard = if gate.allow_rate() {
            gate.enter(source)
        } else {
            None
        };
        let Some(guard) = guard else {
            drop(permit);
            tracing::debug!(
                ?source,
                "connection refused: accept rate or per-source bound"
            );
            net.metrics_refused();
            if let Ok(slot) = gate.refusals.clone().try_acquire_owned() {
                net.tracker.spawn(async move {
                    capwire_transport::Endpoint::refuse_busy(stream).await;
                    drop(slot);
                });
            }
            continue;
        };
        let net2 = net.clone();
        net.tracker.spawn(async move {
            net2.serve_inbound(stream, (permit, guard)).await;
        });
    }
}
