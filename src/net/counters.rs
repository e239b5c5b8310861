//! The connection counters: sessions by direction, handshakes in
//! progress, and failed handshakes by reason ([`HandshakeFailure`]).
//! Counting is one relaxed atomic add, at points that are not on the
//! per-envelope path (a session opening or ending, a handshake failing);
//! the node reads them into its stats ([`crate::NodeStats`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use capwire_envelope::CloseCode;
use capwire_transport::{TransportError, Violation};

use crate::proto::session::End;

/// Which side dialled a session (or tried to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// The peer dialled us.
    Inbound,
    /// We dialled the peer.
    Outbound,
}

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

    pub(crate) fn slot(self) -> usize {
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

    pub(crate) fn slot(self) -> usize {
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

pub(crate) const REASONS: usize = HandshakeFailure::ALL.len();

/// The connection counters, shared by the accept loops, the handshakes
/// and the session drivers.
#[derive(Debug, Default)]
pub(crate) struct NetCounters {
    pub(crate) handshaking: [AtomicUsize; 2],
    pub(crate) open: [AtomicUsize; 2],
    pub(crate) opened: [AtomicU64; 2],
    pub(crate) failures: [[AtomicU64; REASONS]; 2],
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
}
