//! A snapshot of a node's counters and gauges ([`Node::stats`](crate::Node::stats)):
//! the per-route counters, the connection counters (`net/counters.rs`),
//! streams, tasks, grants, the ledger. Read when a snapshot is taken.

use std::sync::atomic::Ordering;

use crate::dispatch::items::StreamCounters;
use crate::dispatch::metrics::MetricsSnapshot;
use crate::net::counters::Direction;
use crate::net::counters::{HandshakeFailure, NetCounters, REASONS};
use crate::proto::ledger::LedgerSizes;

impl NodeStats {
    /// The connection figures, from the node's connection counters.
    pub(crate) fn read_net(&mut self, c: &NetCounters) {
        for d in Direction::ALL {
            let i = d.slot();
            self.handshakes[i] = c.handshaking[i].load(Ordering::Relaxed);
            self.sessions[i] = c.open[i].load(Ordering::Relaxed);
            self.sessions_opened[i] = c.opened[i].load(Ordering::Relaxed);
            for (out, counter) in self.failures[i].iter_mut().zip(&c.failures[i]) {
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
    /// W3C trace contexts received with calls and believed (counter).
    pub trace_contexts_accepted: u64,
    /// Trace contexts dropped, by reason (counters: `item`, `traceparent`,
    /// `zero_id`, `tracestate`, `version`; only reasons seen). The calls
    /// they came with were served as if they had none.
    pub trace_contexts_dropped: Vec<(&'static str, u64)>,
}

/// The node-wide counters of streams, shared by the sessions' drivers and
/// the handlers' item senders.
impl NodeStats {
    /// The stream figures, from the node's stream counters.
    pub(crate) fn read_streams(&mut self, c: &StreamCounters) {
        self.stream_items_sent = c.items_sent.load(Ordering::Relaxed);
        self.stream_items_received = c.items_received.load(Ordering::Relaxed);
        self.stream_credit_stalls = c.stalls.load(Ordering::Relaxed);
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
    use std::sync::Arc;

    use capwire_envelope::CloseCode;
    use capwire_transport::{TransportError, Violation};

    use super::*;
    use crate::proto::session::End;

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
        s.read_net(&c);
        assert_eq!(
            (
                s.sessions(Direction::Inbound),
                s.sessions(Direction::Outbound)
            ),
            (1, 1)
        );
        drop((a, b));
        s.read_net(&c);
        assert_eq!(s.sessions(Direction::Inbound), 0);
        assert_eq!(s.sessions_opened(Direction::Inbound), 1);
        assert_eq!(
            s.handshake_failures(Direction::Inbound, HandshakeFailure::Timeout),
            1
        );
        assert_eq!(s.handshake_failures_total(), 1);
    }
}
