//! Runtime limits and defaults.

use std::time::Duration;

/// Limits and timings of a node. Every queue and table a peer can fill is
/// bounded by one of these.
///
/// ```
/// use capwire::Limits;
/// let limits = Limits { max_inflight_per_session: 256, ..Limits::default() };
/// assert_eq!(limits.default_deadline.as_secs(), 30);
/// ```
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests and notifications from one session that may run at once;
    /// more requests are answered `overloaded`, more notifications are
    /// dropped (and counted as overloaded). Default 1024.
    pub max_inflight_per_session: usize,
    /// Calls this node may have waiting for answers on one session; more
    /// fail locally with `Overloaded`. Default 65536.
    pub max_pending_calls_per_session: usize,
    /// Deadline of a call that does not set one. Default 30 s.
    pub default_deadline: Duration,
    /// Longest budget a handler is given, whatever the caller asks. Default 300 s.
    pub max_handler_time: Duration,
    /// How long finished requests are remembered for replay. Default 120 s.
    pub replay_window: Duration,
    /// How many finished requests are remembered. Default 100,000.
    pub replay_max_entries: usize,
    /// Bytes of remembered responses kept; beyond it the oldest responses
    /// are dropped (their requests are still recognised). Default 64 MiB.
    pub replay_max_bytes: usize,
    /// Time for the peer's hello after the handshake. Default 10 s.
    pub hello_timeout: Duration,
    /// Sessions (accepted and dialled) at once. Default 1024.
    pub max_sessions: usize,
    /// Graceful shutdown waits this long for running handlers before it
    /// cancels them. Default 5 s.
    pub shutdown_grace: Duration,
    /// First delay before redialling a contact. Default 100 ms.
    pub reconnect_initial: Duration,
    /// Longest delay between redials. Default 30 s.
    pub reconnect_max: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_inflight_per_session: 1024,
            max_pending_calls_per_session: 65536,
            default_deadline: Duration::from_secs(30),
            max_handler_time: Duration::from_secs(300),
            replay_window: Duration::from_secs(120),
            replay_max_entries: 100_000,
            replay_max_bytes: 64 << 20,
            hello_timeout: Duration::from_secs(10),
            max_sessions: 1024,
            shutdown_grace: Duration::from_secs(5),
            reconnect_initial: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(30),
        }
    }
}
