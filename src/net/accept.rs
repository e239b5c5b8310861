//! The bounds on inbound connections: handshake permits (taken before a
//! connection is accepted), an accept rate, and a bound on handshakes per
//! source address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::stats::HandshakeFailure;

/// Refusals in progress at once (each lasts at most a quarter second);
/// beyond, a refused stream gets its "busy" bytes without the wait.
const MAX_REFUSALS: usize = 1024;

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
    pub(crate) fn try_permit(&self) -> Result<OwnedSemaphorePermit, TryAcquireError> {
        self.permits.clone().try_acquire_owned()
    }

    /// Handshake permits free now.
    pub(crate) fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Waits for a handshake permit.
    ///
    /// # Errors
    /// Never in practice: the semaphore is not closed.
    pub(crate) async fn permit(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        self.permits.clone().acquire_owned().await
    }

    /// A slot to answer a refused connection "busy", if one is free.
    pub(crate) fn refusal_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.refusals.clone().try_acquire_owned().ok()
    }

    /// Whether a connection from `source` passes the rate and the
    /// per-source bound: its place among the source's handshakes if so,
    /// else which bound refused it.
    pub(crate) fn admit(
        self: &Arc<Self>,
        source: Option<IpAddr>,
    ) -> Result<SourceGuard, HandshakeFailure> {
        if !self.allow_rate() {
            return Err(HandshakeFailure::RateLimited);
        }
        self.enter(source).ok_or(HandshakeFailure::PerSource)
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
