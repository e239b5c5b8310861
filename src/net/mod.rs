//! The tokio side: listeners, dialling, one driver task per connection,
//! and the peer table.
//!
//! ```text
//!  listener ─permit, rate, per-source─► handshake (responder) ─┐
//!  dialler / connect ─────────────────► handshake (initiator) ─┤
//!                                                              ▼
//!                       budget slot ─► SessionCore + Session ─► drive() (one task)
//!                                                              │ hello ok
//!                                                              ▼
//!                                                   Peers: one session per peer
//! ```

pub(crate) mod accept;
pub(crate) mod backoff;
pub(crate) mod conn;
pub(crate) mod counters;
pub(crate) mod dialer;
pub(crate) mod io;
pub(crate) mod listener;
pub(crate) mod peers;
pub(crate) mod session;
pub(crate) mod streams;

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::{CloseCode, NodeId};
use capwire_transport::{Endpoint, Established, TransportError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dispatch::Dispatcher;
use crate::error::NodeError;
use crate::net::counters::HandshakeFailure;
use crate::proto::session::{End, SessionCore, SessionLimits};
use accept::AcceptGate;
use conn::{ConnEnv, Failure};
use counters::Direction;
use peers::Peers;
use session::Session;

/// Everything a node needs to run connections.
pub(crate) struct Net {
    pub(crate) endpoint: Endpoint,
    pub(crate) peers: Arc<Peers>,
    pub(crate) env: Arc<ConnEnv>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) session_limits: SessionLimits,
    pub(crate) accept: Arc<AcceptGate>,
    pub(crate) tracker: TaskTracker,
    /// Parent of every session's handler token.
    pub(crate) stop_handlers: CancellationToken,
    pub(crate) connect_timeout: Duration,
    pub(crate) refused: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").finish_non_exhaustive()
    }
}

/// How an outbound session that did not open ended, as an error.
fn open_error(end: End) -> NodeError {
    match end {
        End::Peer(code, reason) => NodeError::Refused { code, reason },
        End::Local(CloseCode::ProtocolError | CloseCode::UnsupportedProtocol, reason) => {
            NodeError::Protocol(reason)
        }
        End::Local(CloseCode::Overloaded, reason) => NodeError::Refused {
            code: CloseCode::Overloaded,
            reason,
        },
        End::Local(_, reason) | End::Lost(reason) => NodeError::ConnectionLost(reason),
    }
}

impl Net {
    /// Counts an inbound connection refused before its handshake.
    pub(crate) fn metrics_refused(&self, reason: HandshakeFailure) {
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.env.stats.failed(Direction::Inbound, reason);
    }

    /// Serves one accepted stream: handshake, then the session. `hold`
    /// (the handshake permit and the source's slot) is released once the
    /// handshake is over.
    pub(crate) async fn serve_inbound<S, H>(self: Arc<Self>, stream: S, hold: H)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        H: Send,
    {
        let stop = self.peers.stopping().clone();
        let counting = self.env.stats.handshaking(Direction::Inbound);
        // Boxed, so that the handshake's state is freed once it is done
        // instead of sitting in the session task for the session's life.
        let handshake = tokio::select! {
            () = stop.cancelled() => return,
            r = Box::pin(self.endpoint.handshake_responder(stream)) => r,
        };
        drop((hold, counting));
        match handshake {
            Ok(est) => self.run_session(est, Direction::Inbound, None).await,
            Err(e) => {
                if !stop.is_cancelled() {
                    self.env.stats.handshake_failed(Direction::Inbound, &e);
                }
                tracing::debug!(error = %e, "inbound handshake failed");
            }
        }
    }

    /// Runs a session over a finished handshake until it ends. A session
    /// the budgets have no room for is refused: instead of its hello, the
    /// peer gets a close frame `overloaded`.
    pub(crate) async fn run_session<S>(
        self: &Arc<Self>,
        est: Established<S>,
        direction: Direction,
        opened: Option<conn::OpenedTx>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let remote = est.session.remote();
        let slot = if self.peers.stopping().is_cancelled() {
            None
        } else {
            self.peers.take_slot(direction, &remote)
        };
        let now = Session::now();
        let ledger = self.dispatcher.ledger().partition(remote);
        let mut core =
            SessionCore::new(remote, self.peers.hello(), self.session_limits, ledger, now);
        if slot.is_none() {
            let (code, reason) = if self.peers.stopping().is_cancelled() {
                (CloseCode::Shutdown, "the node is shutting down")
            } else {
                (CloseCode::Overloaded, "the node keeps no more sessions")
            };
            tracing::debug!(peer = %remote, ?direction, reason, "session refused");
            core.close(code, reason, true);
        }
        let (encoder, decoder) = self.endpoint.record_layer(est.session);
        let (reader, writer) = io::split(est.stream);
        let refused = slot.is_none();
        let session = Arc::new(Session::new(
            self.peers.next_session_id(),
            direction,
            core,
            encoder,
            writer,
            self.stop_handlers.child_token(),
        ));
        if !refused {
            self.peers.opening(&session);
        }
        conn::drive(
            self.env.clone(),
            session,
            reader,
            decoder,
            est.leftover,
            opened,
            slot,
        )
        .await;
    }

    /// Connects over an already-open stream as the dialling side and waits
    /// until the session is open (or failed).
    pub(crate) async fn connect_stream<S>(
        self: &Arc<Self>,
        stream: S,
        expected: Option<NodeId>,
    ) -> Result<Arc<Session>, NodeError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let stop = self.peers.stopping().clone();
        if stop.is_cancelled() {
            return Err(NodeError::Shutdown);
        }
        let (tx, rx) = oneshot::channel();
        let net = self.clone();
        self.tracker.spawn(async move {
            let counting = net.env.stats.handshaking(Direction::Outbound);
            let handshake = tokio::select! {
                () = stop.cancelled() => Err(TransportError::Closed),
                r = Box::pin(net.endpoint.handshake_initiator(stream, expected)) => r,
            };
            drop(counting);
            match handshake {
                Ok(est) => net.run_session(est, Direction::Outbound, Some(tx)).await,
                Err(e) => {
                    if !stop.is_cancelled() {
                        net.env.stats.handshake_failed(Direction::Outbound, &e);
                    }
                    let _ = tx.send(Err(Failure::Handshake(e)));
                }
            }
        });
        match rx.await {
            Ok(Ok(session)) => Ok(session),
            Ok(Err(Failure::Handshake(TransportError::Closed)))
                if self.peers.stopping().is_cancelled() =>
            {
                Err(NodeError::Shutdown)
            }
            Ok(Err(Failure::Handshake(e))) => Err(NodeError::Transport(e)),
            Ok(Err(Failure::Ended(end))) => Err(open_error(end)),
            Err(_) => Err(NodeError::Shutdown),
        }
    }
}
