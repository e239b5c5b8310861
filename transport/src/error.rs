//! The crate's error type.

use std::fmt;
use std::io;

use capwire_envelope::NodeId;

/// What a peer did wrong. Deliberately coarse: it names the check that
/// failed and nothing an attacker could use (no offsets, no key material).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Violation {
    /// A message was shorter than its fixed parts (a key or a tag), or a
    /// length prefix announced less than a tag.
    ShortMessage,
    /// A handshake message had a length other than the protocol allows, or
    /// a message was longer than 65535 bytes.
    MessageLength,
    /// Bytes arrived when it was not the peer's turn to speak.
    OutOfTurn,
    /// Authentication failed (bad tag, wrong key, replayed, reordered,
    /// dropped or reflected message).
    Decrypt,
    /// A remote ephemeral or static key of low order: the Diffie-Hellman
    /// output was all zero.
    LowOrderKey,
    /// The plaintext of a message did not follow the record framing.
    Framing,
    /// A record grew past the configured maximum record size.
    RecordTooLarge,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ShortMessage => "message too short",
            Self::MessageLength => "message of a forbidden length",
            Self::OutOfTurn => "message out of turn",
            Self::Decrypt => "authentication failed",
            Self::LowOrderKey => "low-order key",
            Self::Framing => "malformed record framing",
            Self::RecordTooLarge => "record over the size limit",
        })
    }
}

/// Every way a transport operation can fail. Any error that ends a session
/// ends it for good: there is no way to resume a session after a failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer broke the protocol; the session is over.
    #[error("peer violated the protocol: {0}")]
    PeerMisbehaved(Violation),
    /// Our contact policy refused the remote key (this includes our own key).
    #[error("contact policy refused {0}")]
    Denied(NodeId),
    /// The peer's contact policy refused our key: it answered the handshake
    /// with a close record whose code is `denied`.
    #[error("the peer refused this node")]
    DeniedByPeer,
    /// `connect` was told which key to expect and the peer proved another.
    #[error("expected peer {expected}, the handshake proved {actual}")]
    UnexpectedPeer {
        /// The key the caller asked for.
        expected: NodeId,
        /// The key the peer proved.
        actual: NodeId,
    },
    /// The handshake did not finish within the configured deadline.
    #[error("handshake deadline passed")]
    HandshakeTimeout,
    /// The responder answered message 1 with a zero-length message: it is at
    /// capacity. The answer is not authenticated: it says nothing about who
    /// the responder is, only that a later attempt may succeed.
    #[error("the responder is at capacity; retry later")]
    Busy,
    /// The stream accepted none of the bytes being written for the
    /// configured write timeout (the peer does not read); the session is
    /// over.
    #[error("the peer accepted no data within the write timeout")]
    WriteTimeout,
    /// Nothing was received for the configured idle timeout.
    #[error("no message from the peer within the idle timeout")]
    IdleTimeout,
    /// A nonce counter reached its last value; the session cannot send or
    /// receive any more messages and must be replaced by a new handshake.
    #[error("nonce counter exhausted")]
    NonceExhausted,
    /// The random number generator failed; nothing is done without it.
    #[error("random number generator failed")]
    Rng,
    /// Reading or writing the underlying stream failed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The session was closed on this side (by `close`, by dropping every
    /// handle, or by shutting the endpoint down).
    #[error("connection closed")]
    Closed,
    /// The stream ended without a close record from the peer.
    #[error("peer lost: the stream ended without a close record")]
    PeerLost,
    /// A record to send is larger than allowed (API misuse on this side).
    #[error("record of {len} bytes exceeds the limit of {max}")]
    RecordTooLarge {
        /// Length of the record.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The send queue is full (`try_send`); retry later or apply backpressure.
    #[error("send queue full")]
    QueueFull,
    /// Too many handshakes are in progress; the stream was dropped.
    #[error("too many handshakes in progress")]
    TooManyHandshakes,
    /// The configuration is unusable.
    #[error("invalid transport configuration: {0}")]
    InvalidConfig(&'static str),
}

impl TransportError {
    /// A copy of this error for a second observer of the same failure.
    /// I/O errors are rebuilt from their kind and message.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Self::PeerMisbehaved(v) => Self::PeerMisbehaved(*v),
            Self::Denied(id) => Self::Denied(*id),
            Self::DeniedByPeer => Self::DeniedByPeer,
            Self::UnexpectedPeer { expected, actual } => Self::UnexpectedPeer {
                expected: *expected,
                actual: *actual,
            },
            Self::HandshakeTimeout => Self::HandshakeTimeout,
            Self::Busy => Self::Busy,
            Self::WriteTimeout => Self::WriteTimeout,
            Self::IdleTimeout => Self::IdleTimeout,
            Self::NonceExhausted => Self::NonceExhausted,
            Self::Rng => Self::Rng,
            Self::Io(e) => Self::Io(io::Error::new(e.kind(), e.to_string())),
            Self::Closed => Self::Closed,
            Self::PeerLost => Self::PeerLost,
            Self::RecordTooLarge { len, max } => Self::RecordTooLarge {
                len: *len,
                max: *max,
            },
            Self::QueueFull => Self::QueueFull,
            Self::TooManyHandshakes => Self::TooManyHandshakes,
            Self::InvalidConfig(s) => Self::InvalidConfig(s),
        }
    }
}

impl From<Violation> for TransportError {
    fn from(v: Violation) -> Self {
        Self::PeerMisbehaved(v)
    }
}
