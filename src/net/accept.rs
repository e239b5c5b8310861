//! The bounds on inbound connections: handshake permits (taken before a
//! connection is accepted), an accept rate, and a bound on handshakes per
//! source address.
//!
//! The rate is governor's GCRA limiter (one atomic word, no lock, no
//! allocation per accept) on tokio's clock, so that it follows
//! `tokio::time::pause()` like every other timer of the node. The
//! per-source bound counts handshakes in progress, not a rate, so it is a
//! map of its own.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::net::counters::HandshakeFailure;

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

/// Tokio's clock, as governor reads time: the time since the gate was
/// made.
#[derive(Debug, Clone)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// `rate_per_sec` connections a second on average, `burst` at once.
type Rate = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// The state behind the bounds, shared by every listener of a node.
#[derive(Debug)]
pub(crate) struct AcceptGate {
    limits: AcceptLimits,
    permits: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    sources: Mutex<HashMap<IpAddr, usize>>,
    rate: Rate,
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
    /// The gate for `limits` (a rate or burst of 0, which the node's
    /// limits refuse, counts as 1).
    pub(crate) fn new(limits: AcceptLimits) -> Self {
        let one = NonZeroU32::MIN;
        let quota = Quota::per_second(NonZeroU32::new(limits.rate_per_sec).unwrap_or(one))
            .allow_burst(NonZeroU32::new(limits.burst).unwrap_or(one));
        Self {
            limits,
            permits: Arc::new(Semaphore::new(limits.max_handshakes)),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS)),
            sources: Mutex::new(HashMap::new()),
            rate: RateLimiter::direct_with_clock(quota, TokioClock(Instant::now())),
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
        self.rate.check().is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(rate_per_sec: u32, burst: u32, per_source: usize) -> Arc<AcceptGate> {
        Arc::new(AcceptGate::new(AcceptLimits {
            max_handshakes: 8,
            per_source,
            rate_per_sec,
            burst,
        }))
    }

    /// A burst at once, then one connection per 1/rate of tokio's time
    /// (paused here: a limiter on the wall clock would refuse after each
    /// `advance`), and a long pause refills no more than the burst.
    #[tokio::test(start_paused = true)]
    async fn the_rate_allows_a_burst_then_refills_on_tokios_clock() {
        let gate = gate(10, 5, 100);
        for i in 0..5 {
            assert!(gate.allow_rate(), "{i} of the burst");
        }
        assert!(!gate.allow_rate(), "the burst is spent");
        tokio::time::advance(Duration::from_millis(99)).await;
        assert!(!gate.allow_rate(), "not yet 1/rate later");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(gate.allow_rate(), "one more 1/rate later");
        assert!(!gate.allow_rate());
        tokio::time::advance(Duration::from_secs(60)).await;
        for i in 0..5 {
            assert!(gate.allow_rate(), "{i} of the refilled burst");
        }
        assert!(!gate.allow_rate(), "refilled to the burst, not beyond");
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_over_its_bound_is_refused_until_a_handshake_ends() {
        let gate = gate(1000, 100, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = gate.admit(Some(a)).unwrap();
        let _second = gate.admit(Some(a)).unwrap();
        assert_eq!(
            gate.admit(Some(a)).unwrap_err(),
            HandshakeFailure::PerSource
        );
        let _other = gate.admit(Some(b)).unwrap();
        let _unix = (
            gate.admit(None).unwrap(),
            gate.admit(None).unwrap(),
            gate.admit(None).unwrap(),
        );
        drop(first);
        let _third = gate.admit(Some(a)).unwrap();
        assert_eq!(
            gate.admit(Some(a)).unwrap_err(),
            HandshakeFailure::PerSource
        );
    }
}
