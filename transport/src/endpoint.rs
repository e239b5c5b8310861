//! The tokio driver: runs handshakes over any byte stream and starts
//! connections.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use capwire_envelope::NodeId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use crate::config::TransportConfig;
use crate::connection::{Connection, linger};
use crate::error::{TransportError, Violation};
use crate::handshake::{Initiator, MESSAGE_1_LEN, MESSAGE_2_LEN, MESSAGE_3_LEN, Responder};
use crate::keys::{EntropySource, Keypair, OsEntropy, canonical_node_id};
use crate::policy::ContactPolicy;
use crate::record::{CloseCode, LENGTH_PREFIX_LEN, RecordEncoder};
use crate::session::TransportSession;

/// Runs capwire handshakes over byte streams and hands out
/// [`Connection`]s. Cheap to clone; clones share the handshake limit and
/// the shutdown switch.
///
/// Streams can be anything that reads and writes bytes in order: a
/// `TcpStream` (set `TCP_NODELAY`: the writer already coalesces records), a
/// `UnixStream`, or a `tokio::io::duplex` pair in tests.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    keypair: Keypair,
    config: TransportConfig,
    policy: ContactPolicy,
    entropy: Arc<dyn EntropySource>,
    handshakes: Arc<Semaphore>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Endpoint {
    /// An endpoint with our identity, limits and contact policy.
    ///
    /// # Panics
    /// When `config` is invalid (see [`TransportConfig::validate`]); use
    /// [`try_new`](Self::try_new) to get an error instead.
    pub fn new(keypair: Keypair, config: TransportConfig, policy: ContactPolicy) -> Self {
        match Self::try_new(keypair, config, policy) {
            Ok(endpoint) => endpoint,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`new`](Self::new), reporting an invalid configuration.
    ///
    /// # Errors
    /// [`TransportError::InvalidConfig`].
    pub fn try_new(
        keypair: Keypair,
        config: TransportConfig,
        policy: ContactPolicy,
    ) -> Result<Self, TransportError> {
        config.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                keypair,
                handshakes: Arc::new(Semaphore::new(config.max_concurrent_handshakes)),
                config,
                policy,
                entropy: Arc::new(OsEntropy),
                shutdown: CancellationToken::new(),
                tracker: TaskTracker::new(),
            }),
        })
    }

    /// Uses `entropy` instead of the operating system for ephemeral keys.
    pub fn with_entropy(mut self, entropy: Arc<dyn EntropySource>) -> Self {
        Arc::make_mut(&mut self.inner).entropy = entropy;
        self
    }

    /// Our identity.
    pub fn local_id(&self) -> NodeId {
        self.inner.keypair.public()
    }

    /// The configuration in force.
    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// Inbound handshakes that may start now.
    pub fn available_handshake_slots(&self) -> usize {
        self.inner.handshakes.available_permits()
    }

    /// Stops every handshake and connection of this endpoint: connections
    /// send a close record (code `shutdown`) if they can within a second,
    /// and their tasks end. Waits until they have. Later `connect` and
    /// `accept` calls fail with [`TransportError::Closed`].
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    /// Runs the initiator's side of the handshake over `stream`. With
    /// `expected_remote`, the peer must prove that key. The contact policy
    /// is applied to the responder's key before our last handshake message
    /// is sent. Outbound handshakes are not counted against
    /// `max_concurrent_handshakes`.
    ///
    /// # Errors
    /// [`TransportError::HandshakeTimeout`], [`TransportError::PeerMisbehaved`],
    /// [`TransportError::Denied`], [`TransportError::UnexpectedPeer`],
    /// [`TransportError::PeerLost`] (the stream ended),
    /// [`TransportError::Rng`], [`TransportError::Io`],
    /// [`TransportError::Closed`] after shutdown.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the handshake and drops the stream.
    pub async fn connect<S>(
        &self,
        mut stream: S,
        expected_remote: Option<NodeId>,
    ) -> Result<Connection, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut buf = BytesMut::with_capacity(4096);
        let session = self
            .bounded(self.initiate(&mut stream, &mut buf, expected_remote))
            .await
            .inspect_err(|e| debug!(error = %e, "outbound handshake failed"))?;
        debug!(remote = %session.remote(), "outbound handshake complete");
        Ok(self.start(stream, session, buf))
    }

    /// Runs the responder's side of the handshake over `stream`, then
    /// applies the contact policy to the initiator's key; a refused peer
    /// gets a close record with code `denied`.
    ///
    /// At most `max_concurrent_handshakes` inbound handshakes run at once:
    /// beyond that, `accept` fails at once with
    /// [`TransportError::TooManyHandshakes`] and drops the stream (it does
    /// not wait), so a flood of half-open connections cannot queue up.
    /// Each slot is released when its handshake ends, at the latest after
    /// `handshake_timeout`. Established connections hold no slot.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), plus
    /// [`TransportError::TooManyHandshakes`].
    ///
    /// # Cancel safety
    /// Dropping the future abandons the handshake and drops the stream.
    pub async fn accept<S>(&self, mut stream: S) -> Result<Connection, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(_permit) = self.inner.handshakes.clone().try_acquire_owned() else {
            debug!("inbound handshake refused: too many in progress");
            return Err(TransportError::TooManyHandshakes);
        };
        let mut buf = BytesMut::with_capacity(4096);
        let session = self
            .bounded(self.respond(&mut stream, &mut buf))
            .await
            .inspect_err(|e| debug!(error = %e, "inbound handshake failed"))?;
        debug!(remote = %session.remote(), "inbound handshake complete");
        Ok(self.start(stream, session, buf))
    }

    fn start<S>(&self, stream: S, session: TransportSession, leftover: BytesMut) -> Connection
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Connection::start(
            stream,
            session,
            leftover,
            &self.inner.config,
            &self.inner.shutdown,
            &self.inner.tracker,
        )
    }

    /// Runs a handshake under the deadline and the shutdown switch.
    async fn bounded<F>(&self, handshake: F) -> Result<TransportSession, TransportError>
    where
        F: Future<Output = Result<TransportSession, TransportError>>,
    {
        if self.inner.shutdown.is_cancelled() {
            return Err(TransportError::Closed);
        }
        tokio::select! {
            biased;
            () = self.inner.shutdown.cancelled() => Err(TransportError::Closed),
            r = tokio::time::timeout(self.inner.config.handshake_timeout, handshake) => {
                r.map_err(|_| TransportError::HandshakeTimeout)?
            }
        }
    }

    /// Refuses our own key and anything the policy refuses.
    fn admit(&self, remote: NodeId) -> Result<(), TransportError> {
        let remote = canonical_node_id(&remote);
        if remote == self.local_id() || !self.inner.policy.allows(&remote) {
            return Err(TransportError::Denied(remote));
        }
        Ok(())
    }

    async fn initiate<S>(
        &self,
        stream: &mut S,
        buf: &mut BytesMut,
        expected: Option<NodeId>,
    ) -> Result<TransportSession, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let inner = &self.inner;
        let initiator = Initiator::new(&inner.keypair, &*inner.entropy)?;
        let mut out = vec![0u8; LENGTH_PREFIX_LEN];
        let waiting = initiator.write_message(&[], &mut out)?;
        write_framed(stream, &mut out).await?;

        let msg2 = read_framed(stream, buf, MESSAGE_2_LEN).await?;
        if !buf.is_empty() {
            return Err(Violation::OutOfTurn.into());
        }
        let mut payload = Vec::new();
        let ready = waiting.read_message(&msg2, &mut payload)?;
        let remote = ready.remote();
        if let Some(expected) = expected {
            let expected = canonical_node_id(&expected);
            if expected != remote {
                return Err(TransportError::UnexpectedPeer {
                    expected,
                    actual: remote,
                });
            }
        }
        self.admit(remote)?;

        out.clear();
        out.resize(LENGTH_PREFIX_LEN, 0);
        let session = ready.write_message(&[], &mut out)?;
        write_framed(stream, &mut out).await?;
        Ok(session)
    }

    async fn respond<S>(
        &self,
        stream: &mut S,
        buf: &mut BytesMut,
    ) -> Result<TransportSession, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let inner = &self.inner;
        let responder = Responder::new(&inner.keypair, &*inner.entropy)?;
        let msg1 = read_framed(stream, buf, MESSAGE_1_LEN).await?;
        if !buf.is_empty() {
            return Err(Violation::OutOfTurn.into());
        }
        let mut payload = Vec::new();
        let ready = responder.read_message(&msg1, &mut payload)?;
        let mut out = vec![0u8; LENGTH_PREFIX_LEN];
        let waiting = ready.write_message(&[], &mut out)?;
        write_framed(stream, &mut out).await?;

        let msg3 = read_framed(stream, buf, MESSAGE_3_LEN).await?;
        let session = waiting.read_message(&msg3, &mut payload)?;
        if let Err(e) = self.admit(session.remote()) {
            // Tell the peer, then hang up; nothing it sent is read.
            let (sealer, _) = session.split();
            let mut encoder = RecordEncoder::new(sealer, 0, None);
            if encoder.close(CloseCode::Denied, "denied").is_ok()
                && stream.write_all(encoder.wire()).await.is_ok()
                && stream.shutdown().await.is_ok()
            {
                buf.clear();
                linger(stream, std::mem::take(buf)).await;
            }
            return Err(e);
        }
        Ok(session)
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local_id", &self.local_id())
            .field("config", &self.inner.config)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// Fills in the length prefix of `out` (prefix placeholder then message)
/// and writes it.
async fn write_framed<S: AsyncWrite + Unpin>(
    stream: &mut S,
    out: &mut [u8],
) -> Result<(), TransportError> {
    // Handshake messages are far below 65535 bytes.
    let len = (out.len() - LENGTH_PREFIX_LEN) as u16;
    out[..LENGTH_PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
    stream.write_all(out).await?;
    stream.flush().await?;
    Ok(())
}

/// Reads until `buf` holds at least `n` bytes.
async fn fill<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    n: usize,
) -> Result<(), TransportError> {
    while buf.len() < n {
        buf.reserve(n - buf.len());
        if stream.read_buf(buf).await? == 0 {
            return Err(TransportError::PeerLost);
        }
    }
    Ok(())
}

/// Reads one handshake message of exactly `expected` bytes. The length
/// prefix is checked before anything else is read.
async fn read_framed<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    expected: usize,
) -> Result<BytesMut, TransportError> {
    fill(stream, buf, LENGTH_PREFIX_LEN).await?;
    let len = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
    if len < expected {
        return Err(Violation::ShortMessage.into());
    }
    if len > expected {
        return Err(Violation::MessageLength.into());
    }
    fill(stream, buf, LENGTH_PREFIX_LEN + len).await?;
    let mut msg = buf.split_to(LENGTH_PREFIX_LEN + len);
    msg.advance(LENGTH_PREFIX_LEN);
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        assert_send_sync::<Endpoint>();
        assert_send_sync::<Connection>();
        assert_send_sync::<crate::RecordSender>();
        assert_send_sync::<crate::RecordReceiver>();
        assert_send_sync::<TransportError>();
        assert_send_sync::<Keypair>();
        assert_send_sync::<TransportSession>();
    }
}
