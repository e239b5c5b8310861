//! The node's operational counters beyond the per-route ones: sessions by
//! direction, failed handshakes by reason, and a snapshot type that
//! gathers them with the node's gauges ([`Node::stats`](crate::Node::stats)).
//!
//! Counting is one relaxed atomic add, at points that are not on the
//! per-envelope path (a session opening or ending, a handshake failing);
//! the gauges are read when a snapshot is taken.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use capwire_envelope::CloseCode;
use capwire_transport::{TransportError, Violation};

use crate::dispatch::metrics::MetricsSnapshot;
use crate::net::session::Direction;
use crate::proto::ledger::LedgerSizes;
use crate::proto::session::End;

impl Direction {
    /// Both directions, in counter order.
    pub const ALL: [Direction; 2] = [Direction::Inbound, Direction::Outbound];

    /// A short stable name, used in metrics: `inbound` or `outbound`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }

    fn slot(self) -> usize {
        match self {
            Direction::Inbound => 0,
            Direction::Outbound => 1,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a connection did not become an open session: refused before its
/// handshake, failed in the handshake, or ended before the hello exchange
/// completed. A small fixed set, so that nothing a peer sends can add a
/// reason. Connections ended by this node's own shutdown are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HandshakeFailure {
    /// Inbound, refused "busy" before the handshake: over the accept rate.
    RateLimited,
    /// Inbound, refused "busy" before the handshake: the source address
    /// had too many handshakes in progress.
    PerSource,
    /// Inbound, refused "busy" before the handshake: every handshake
    /// permit was taken (streams given to `Node::accept_stream`).
    Capacity,
    /// The handshake did not finish in time (the short deadline for the
    /// first message included).
    Timeout,
    /// The peer broke the handshake's framing: a message of the wrong
    /// length, too short, or out of turn.
    Protocol,
    /// A handshake message failed authentication, or a key was of low
    /// order.
    Crypto,
    /// A contact policy refused the key: ours refused the peer's, or the
    /// peer's refused ours.
    Denied,
    /// Outbound: the peer proved a key other than the one expected.
    UnexpectedPeer,
    /// The peer turned the connection away: it answered "busy", or sent
    /// a close frame in place of its hello (e.g. its session budget was
    /// used up).
    RefusedByPeer,
    /// After the handshake, the peer's hello did not come in time, or was
    /// malformed or refused (protocol version, limits, manifest).
    Hello,
    /// After the handshake, this node had no room in its session budget
    /// for the peer and closed the session `overloaded`.
    SessionBudget,
    /// The stream failed or ended during the handshake or before the
    /// hello.
    Io,
    /// Anything else (e.g. the random number generator failed).
    Other,
}

impl HandshakeFailure {
    /// Every reason, in counter order.
    pub const ALL: [HandshakeFailure; 13] = [
        HandshakeFailure::RateLimited,
        HandshakeFailure::PerSource,
        HandshakeFailure::Capacity,
        HandshakeFailure::Timeout,
        HandshakeFailure::Protocol,
        HandshakeFailure::Crypto,
        HandshakeFailure::Denied,
        HandshakeFailure::UnexpectedPeer,
        HandshakeFailure::RefusedByPeer,
        HandshakeFailure::Hello,
        HandshakeFailure::SessionBudget,
        HandshakeFailure::Io,
        HandshakeFailure::Other,
    ];

    /// A short stable name, used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeFailure::RateLimited => "rate_limited",
            HandshakeFailure::PerSource => "per_source",
            HandshakeFailure::Capacity => "capacity",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Crypto => "crypto",
            HandshakeFailure::Denied => "denied",
            HandshakeFailure::UnexpectedPeer => "unexpected_peer",
            HandshakeFailure::RefusedByPeer => "refused_by_peer",
            HandshakeFailure::Hello => "hello",
            HandshakeFailure::SessionBudget => "session_budget",
            HandshakeFailure::Io => "io",
            HandshakeFailure::Other => "other",
        }
    }

    /// Whether this reason can happen to connections in `direction`:
    /// the accept gate's refusals (`rate_limited`, `per_source`,
    /// `capacity`) are inbound only, `unexpected_peer` is outbound only.
    pub fn occurs(self, direction: Direction) -> bool {
        match self {
            Self::RateLimited | Self::PerSource | Self::Capacity => direction == Direction::Inbound,
            Self::UnexpectedPeer => direction == Direction::Outbound,
            _ => true,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }

    /// The reason for a failed handshake; `None` when it was ended on
    /// this side (shutdown), which is no failure.
    pub(crate) fn of_transport(e: &TransportError) -> Option<Self> {
        Some(match e {
            TransportError::HandshakeTimeout => Self::Timeout,
            TransportError::PeerMisbehaved(Violation::Decrypt | Violation::LowOrderKey) => {
                Self::Crypto
            }
            TransportError::PeerMisbehaved(_) => Self::Protocol,
            TransportError::Denied(_) | TransportError::DeniedByPeer => Self::Denied,
            TransportError::UnexpectedPeer { .. } => Self::UnexpectedPeer,
            TransportError::Busy => Self::RefusedByPeer,
            TransportError::TooManyHandshakes => Self::Capacity,
            TransportError::Io(_)
            | TransportError::PeerLost
            | TransportError::WriteTimeout
            | TransportError::IdleTimeout => Self::Io,
            TransportError::Closed => return None,
            _ => Self::Other,
        })
    }

    /// The reason a session that never opened ended; `None` for a
    /// shutdown of this node.
    pub(crate) fn of_end(end: &End) -> Option<Self> {
        Some(match end {
            End::Local(CloseCode::Shutdown, _) => return None,
            End::Local(CloseCode::Overloaded, _) => Self::SessionBudget,
            End::Local(
                CloseCode::ProtocolError | CloseCode::UnsupportedProtocol | CloseCode::TooLarge,
                _,
            ) => Self::Hello,
            End::Local(CloseCode::IdleTimeout, _) => Self::Timeout,
            End::Local(..) => Self::Other,
            End::Peer(..) => Self::RefusedByPeer,
            End::Lost(_) => Self::Io,
        })
    }
}

impl fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const REASONS: usize = HandshakeFailure::ALL.len();

/// The connection counters, shared by the accept loops, the handshakes
/// and the session drivers.
#[derive(Debug, Default)]
pub(crate) struct NetCounters {
    handshaking: [AtomicUsize; 2],
    open: [AtomicUsize; 2],
    opened: [AtomicU64; 2],
    failures: [[AtomicU64; REASONS]; 2],
}

/// An open session's place in the gauge; given back when dropped.
#[derive(Debug)]
pub(crate) struct OpenSession {
    counters: Arc<NetCounters>,
    direction: Direction,
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.counters.open[self.direction.slot()].fetch_sub(1, Ordering::Relaxed);
    }
}

/// A handshake in progress, for the gauge; given back when dropped.
#[derive(Debug)]
pub(crate) struct Handshaking {
    counters: Arc<NetCounters>,
    direction: Direction,
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.counters.handshaking[self.direction.slot()].fetch_sub(1, Ordering::Relaxed);
    }
}

impl NetCounters {
    /// A handshake starts: it counts as in progress until the guard is
    /// dropped.
    pub(crate) fn handshaking(self: &Arc<Self>, direction: Direction) -> Handshaking {
        self.handshaking[direction.slot()].fetch_add(1, Ordering::Relaxed);
        Handshaking {
            counters: self.clone(),
            direction,
        }
    }

    /// A session's hello exchange completed: it counts as open until the
    /// guard is dropped.
    pub(crate) fn opened(self: &Arc<Self>, direction: Direction) -> OpenSession {
        self.open[direction.slot()].fetch_add(1, Ordering::Relaxed);
        self.opened[direction.slot()].fetch_add(1, Ordering::Relaxed);
        OpenSession {
            counters: self.clone(),
            direction,
        }
    }

    /// Counts a connection that did not become a session.
    pub(crate) fn failed(&self, direction: Direction, reason: HandshakeFailure) {
        self.failures[direction.slot()][reason.slot()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed handshake, unless it was this side's shutdown.
    pub(crate) fn handshake_failed(&self, direction: Direction, e: &TransportError) {
        if let Some(reason) = HandshakeFailure::of_transport(e) {
            self.failed(direction, reason);
        }
    }

    /// Fills the connection part of `stats`.
    pub(crate) fn read_into(&self, stats: &mut NodeStats) {
        for d in Direction::ALL {
            let i = d.slot();
            stats.handshakes[i] = self.handshaking[i].load(Ordering::Relaxed);
            stats.sessions[i] = self.open[i].load(Ordering::Relaxed);
            stats.sessions_opened[i] = self.opened[i].load(Ordering::Relaxed);
            for (out, counter) in stats.failures[i].iter_mut().zip(&self.failures[i]) {
                *out = counter.load(Ordering::Relaxed);
            }
        }
    }
}

/// A copy of a node's counters and gauges at one moment; see
/// [`Node::stats`](crate::Node::stats). Counters (`*_total` in the
/// Prometheus export) only grow during the node's life; gauges go up
/// and down.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use capwire::{Direction, HandshakeFailure, Node};
///
/// let node = Node::builder("stats").start().await?;
/// let stats = node.stats();
/// assert_eq!(stats.sessions(Direction::Inbound), 0);
/// assert_eq!(stats.handshake_failures(Direction::Inbound, HandshakeFailure::Timeout), 0);
/// assert_eq!(stats.copies_sent, 0);
/// node.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct NodeStats {
    /// Inbound control envelopes by (cap, verb, outcome) (counters).
    pub calls: MetricsSnapshot,
    pub(crate) handshakes: [usize; 2],
    pub(crate) sessions: [usize; 2],
    pub(crate) sessions_opened: [u64; 2],
    pub(crate) failures: [[u64; REASONS]; 2],
    /// Sessions counted against the (inbound, outbound, reserved) session
    /// budgets now (gauges); sessions still waiting for their hello count.
    pub budget_used: (usize, usize, usize),
    /// The sizes of those budgets: `max_inbound_sessions`,
    /// `max_outbound_sessions` and `reserved_sessions` of the node's
    /// [`Limits`](crate::Limits).
    pub budget_limits: (usize, usize, usize),
    /// Calls this node has waiting for an answer, over all sessions
    /// (gauge).
    pub pending_calls: usize,
    /// The peers' requests and notifications in flight here, over all
    /// sessions (gauge).
    pub inflight: usize,
    /// Bytes of frames waiting to be sent, over all sessions (gauge).
    pub queued_bytes: usize,
    /// The replay ledger's sizes (gauges).
    pub ledger: LedgerSizes,
    /// Monitoring copies sent to the bound control plane (counter).
    pub copies_sent: u64,
    /// Monitoring copies taken but never sent (counter): the queue was
    /// full, the control plane changed or was unbound while they waited,
    /// or the control plane could not be reached in time.
    pub copies_dropped: u64,
    /// Monitoring copies waiting to be sent (gauge).
    pub copies_queued: usize,
    /// The peers' streams this node serves now, over all sessions (gauge).
    pub streams_served: usize,
    /// This node's own streams open on peers, over all sessions (gauge).
    pub streams_called: usize,
    /// Stream items this node's handlers sent (counter).
    pub stream_items_sent: u64,
    /// Stream items this node received for its own streams (counter).
    pub stream_items_received: u64,
    /// Times a handler serving a stream had to wait for its caller's
    /// credit (counter): the consumer was slower than the producer.
    pub stream_credit_stalls: u64,
    /// The tasks this node keeps, by state (gauges; every state is
    /// listed, with 0 when it has none).
    pub tasks: Vec<(capwire_manifest::TaskState, usize)>,
    /// Task events written (counter): submits, state changes, progress,
    /// questions, answers, ends.
    pub task_events: u64,
    /// Task state changes not pushed to the control plane because its
    /// queue was full (counter).
    pub task_pushes_dropped: u64,
    /// Grant tokens presented and kept (counter, `core.grants`).
    pub grants_presented: u64,
    /// Controller calls a grant let through (counter).
    pub grant_calls: u64,
    /// Grant presentations and calls refused, by reason (counters:
    /// `expired`, `revoked`, `wrong_holder`, ...; only reasons seen).
    pub grants_refused: Vec<(&'static str, u64)>,
    /// Grant holders with tokens kept, and revocations kept (gauges).
    pub grant_holders: usize,
    /// Revocations kept (gauge).
    pub grant_revocations: usize,
}

/// The node-wide counters of streams, shared by the sessions' drivers and
/// the handlers' item senders.
#[derive(Debug, Default)]
pub(crate) struct StreamCounters {
    pub(crate) items_sent: AtomicU64,
    pub(crate) items_received: AtomicU64,
    pub(crate) stalls: AtomicU64,
}

impl StreamCounters {
    pub(crate) fn read_into(&self, stats: &mut NodeStats) {
        stats.stream_items_sent = self.items_sent.load(Ordering::Relaxed);
        stats.stream_items_received = self.items_received.load(Ordering::Relaxed);
        stats.stream_credit_stalls = self.stalls.load(Ordering::Relaxed);
    }
}

impl NodeStats {
    /// Noise handshakes in progress now in `direction`.
    pub fn handshakes_in_progress(&self, direction: Direction) -> usize {
        self.handshakes[direction.slot()]
    }

    /// Sessions open now in `direction`: their hello exchange completed
    /// and they have not ended (a session being replaced counts until it
    /// is gone).
    pub fn sessions(&self, direction: Direction) -> usize {
        self.sessions[direction.slot()]
    }

    /// Sessions that opened in `direction` since the node started.
    pub fn sessions_opened(&self, direction: Direction) -> u64 {
        self.sessions_opened[direction.slot()]
    }

    /// Connections in `direction` that did not become a session for
    /// `reason`, since the node started.
    pub fn handshake_failures(&self, direction: Direction, reason: HandshakeFailure) -> u64 {
        self.failures[direction.slot()][reason.slot()]
    }

    /// Connections that did not become a session, for any reason, in
    /// either direction.
    pub fn handshake_failures_total(&self) -> u64 {
        self.failures.iter().flatten().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_and_directions_have_distinct_stable_names() {
        let mut names: Vec<&str> = HandshakeFailure::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), HandshakeFailure::ALL.len());
        for (i, r) in HandshakeFailure::ALL.iter().enumerate() {
            assert_eq!(r.slot(), i);
        }
        assert_eq!(Direction::Inbound.to_string(), "inbound");
        assert_eq!(Direction::Outbound.to_string(), "outbound");
    }

    #[test]
    fn transport_errors_map_to_reasons() {
        let cases = [
            (
                TransportError::HandshakeTimeout,
                Some(HandshakeFailure::Timeout),
            ),
            (
                TransportError::PeerMisbehaved(Violation::Decrypt),
                Some(HandshakeFailure::Crypto),
            ),
            (
                TransportError::PeerMisbehaved(Violation::MessageLength),
                Some(HandshakeFailure::Protocol),
            ),
            (TransportError::DeniedByPeer, Some(HandshakeFailure::Denied)),
            (TransportError::Busy, Some(HandshakeFailure::RefusedByPeer)),
            (TransportError::PeerLost, Some(HandshakeFailure::Io)),
            (TransportError::Rng, Some(HandshakeFailure::Other)),
            (TransportError::Closed, None),
        ];
        for (e, want) in cases {
            assert_eq!(HandshakeFailure::of_transport(&e), want, "{e}");
        }
    }

    #[test]
    fn sessions_that_never_opened_map_to_reasons() {
        let local = |c| End::Local(c, String::new());
        assert_eq!(HandshakeFailure::of_end(&local(CloseCode::Shutdown)), None);
        assert_eq!(
            HandshakeFailure::of_end(&local(CloseCode::Overloaded)),
            Some(HandshakeFailure::SessionBudget)
        );
        assert_eq!(
            HandshakeFailure::of_end(&local(CloseCode::UnsupportedProtocol)),
            Some(HandshakeFailure::Hello)
        );
        assert_eq!(
            HandshakeFailure::of_end(&End::Peer(CloseCode::Overloaded, String::new())),
            Some(HandshakeFailure::RefusedByPeer)
        );
        assert_eq!(
            HandshakeFailure::of_end(&End::Lost(String::new())),
            Some(HandshakeFailure::Io)
        );
    }

    #[test]
    fn the_open_gauge_follows_its_guards() {
        let c = Arc::new(NetCounters::default());
        let a = c.opened(Direction::Inbound);
        let b = c.opened(Direction::Outbound);
        c.failed(Direction::Inbound, HandshakeFailure::Timeout);
        let mut s = NodeStats::default();
        c.read_into(&mut s);
        assert_eq!(
            (
                s.sessions(Direction::Inbound),
                s.sessions(Direction::Outbound)
            ),
            (1, 1)
        );
        drop((a, b));
        c.read_into(&mut s);
        assert_eq!(s.sessions(Direction::Inbound), 0);
        assert_eq!(s.sessions_opened(Direction::Inbound), 1);
        assert_eq!(
            s.handshake_failures(Direction::Inbound, HandshakeFailure::Timeout),
            1
        );
        assert_eq!(s.handshake_failures_total(), 1);
    }
}
