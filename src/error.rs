//! Errors of the node runtime, named by who is at fault: the peer
//! (denied, remote error, misbehaved), this side's use of the API
//! (configuration, encoding), time (local timeout), or the connection
//! (lost, refused, shutdown).

use capwire_envelope::{CloseCode, ErrorBody, ErrorCode, NodeId};

/// Why a call to a peer did not produce a result.
///
/// Every call ends in exactly one `Ok` or one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The peer's chokepoint refused the call (`unknown_verb`, `unauthorized`
    /// or `bind_failed`). No handler ran.
    #[error("denied by peer: {}: {}", .0.code, .0.message)]
    Denied(ErrorBody),
    /// The handler ran (or the runtime answered) with an error.
    #[error("peer answered with an error: {}: {}", .0.code, .0.message)]
    Remote(ErrorBody),
    /// The deadline passed before an answer arrived. A cancel was sent.
    #[error("no answer within the deadline")]
    Timeout,
    /// The call was cancelled, locally or by the peer.
    #[error("the call was cancelled")]
    Cancelled,
    /// The session to the peer ended before an answer arrived.
    #[error("the connection to the peer was lost")]
    PeerLost,
    /// No session to the peer could be established.
    #[error("peer {0} is not reachable")]
    Unreachable(NodeId),
    /// The peer's manifest does not offer the required capability version.
    #[error("version unsatisfied: {0}")]
    VersionUnsatisfied(String),
    /// The envelope is larger than the peer accepts.
    #[error("the envelope is too large")]
    TooLarge,
    /// Too many calls are in flight, locally or at the peer.
    #[error("overloaded: too many calls in flight")]
    Overloaded,
    /// The arguments could not be encoded.
    #[error("arguments could not be encoded: {0}")]
    Encode(String),
    /// The peer's result did not match the verb's result type.
    #[error("the result did not match the verb's type: {0}")]
    BadResult(String),
    /// This node is shutting down.
    #[error("the node is shutting down")]
    Shutdown,
    /// A call with this `req_id` is already waiting for its answer on this
    /// session (API misuse with [`Peer::request_with_id`](crate::Peer::request_with_id)).
    #[error("a call with this req_id is already waiting for its answer")]
    ReqIdInUse,
    /// The invite cannot be used for this call (API misuse).
    #[error("invalid invite: {0}")]
    InvalidInvite(String),
    /// The session cannot carry this call: a stream to a peer that speaks
    /// protocol 1 only (it fails here, before anything is sent).
    #[error("not supported by the peer: {0}")]
    Unsupported(String),
    /// A stream was waited on for longer than its idle bound with no item
    /// and no end. A cancel was sent.
    #[error("no item within the stream's idle bound")]
    Idle,
}

impl CallError {
    /// Maps an error answer from the peer to the matching variant.
    pub(crate) fn from_remote(body: ErrorBody) -> Self {
        match body.code {
            ErrorCode::UnknownVerb | ErrorCode::Unauthorized | ErrorCode::BindFailed => {
                CallError::Denied(body)
            }
            ErrorCode::Timeout => CallError::Timeout,
            ErrorCode::Cancelled => CallError::Cancelled,
            ErrorCode::Overloaded => CallError::Overloaded,
            ErrorCode::TooLarge => CallError::TooLarge,
            _ => CallError::Remote(body),
        }
    }

    /// The wire error code this error corresponds to, where there is one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            CallError::Denied(b) | CallError::Remote(b) => Some(&b.code),
            _ => None,
        }
    }
}

/// Why building, starting or connecting a node failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The declared capabilities break a registry invariant.
    #[error(transparent)]
    Registry(#[from] capwire_manifest::ManifestError),
    /// The transport failed (handshake, policy, I/O on the channel).
    #[error(transparent)]
    Transport(#[from] capwire_transport::TransportError),
    /// A socket operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The authorization layer failed (e.g. no randomness for a bind code).
    #[error(transparent)]
    Authz(#[from] capwire_authz::AuthzError),
    /// An address could not be parsed.
    #[error(transparent)]
    Addr(#[from] crate::addr::AddrParseError),
    /// A setting is invalid (API misuse).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The peer broke the session protocol (bad hello, wrong first frame).
    #[error("peer violated the session protocol: {0}")]
    Protocol(String),
    /// The peer refused the session: it sent a close frame instead of (or
    /// right after) its hello, e.g. `overloaded` when it keeps no more
    /// sessions, or `shutdown`.
    #[error("the peer refused the session: {code}: {reason}")]
    Refused {
        /// The peer's close code.
        code: CloseCode,
        /// The peer's reason, for people.
        reason: String,
    },
    /// The connection ended before the session was open.
    #[error("the connection ended before the session was open: {0}")]
    ConnectionLost(String),
    /// Something did not happen in time.
    #[error("timed out")]
    Timeout,
    /// The node is shutting down.
    #[error("the node is shutting down")]
    Shutdown,
    /// This node keeps no more sessions of this kind.
    #[error("too many sessions")]
    TooManySessions,
    /// The state directory or its store cannot be used.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The bind ceremony with the invited node failed.
    #[error("bind failed: {0}")]
    Bind(CallError),
    /// A durable change could not be made (e.g. the state could not be
    /// written).
    #[error("state change failed: {0}")]
    State(String),
}

/// Turns a caught panic payload into a message.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "handler panicked".to_string()
    }
}
