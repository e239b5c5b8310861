//! The tokio driver: runs handshakes over any byte stream and starts
//! connections.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use capwire_envelope::NodeId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use crate::config::TransportConfig;
use crate::connection::{Connection, Parts, linger};
use crate::error::{TransportError, Violation};
use crate::handshake::{Initiator, MESSAGE_1_LEN, MESSAGE_2_LEN, MESSAGE_3_LEN, Responder};
use crate::keys::{EntropySource, Keypair, OsEntropy, canonical_node_id};
use crate::policy::ContactPolicy;
use crate::record::{CloseCode, LENGTH_PREFIX_LEN, RecordDecoder, RecordEncoder};
use crate::session::TransportSession;

/// What [`Endpoint::refuse_busy`] writes: a zero length prefix.
const BUSY: [u8; LENGTH_PREFIX_LEN] = [0, 0];
/// Initial size of the buffer handshake messages are read into.
const HANDSHAKE_BUFFER: usize = 4096;

/// A finished handshake over `stream`, not yet driven by anything: what
/// [`Endpoint::handshake_initiator`] and [`Endpoint::handshake_responder`]
/// return to a caller that runs the record layer itself.
///
/// ```no_run
/// # async fn f(endpoint: capwire_transport::Endpoint, tcp: tokio::net::TcpStream)
/// # -> Result<(), capwire_transport::TransportError> {
/// let established = endpoint.handshake_responder(tcp).await?;
/// let remote = established.session.remote();
/// let (encoder, mut decoder) = endpoint.record_layer(established.session);
/// let mut buf = established.leftover; // decode these bytes first
/// let mut records = Vec::new();
/// decoder.decode(&mut buf, &mut records)?;
/// // ... then read more from `established.stream` into `buf`.
/// # let _ = (remote, encoder); Ok(()) }
/// ```
#[derive(Debug)]
pub struct Established<S> {
    /// The stream, just past the last byte of the handshake that was read
    /// from it (anything read beyond is in `leftover`).
    pub stream: S,
    /// The finished handshake: the peer's proven identity and the cipher
    /// states; turn it into records with [`Endpoint::record_layer`].
    pub session: TransportSession,
    /// Bytes read from `stream` after the last handshake message: the
    /// peer's first transport messages. They must reach the decoder before
    /// anything read from the stream later.
    pub leftover: BytesMut,
}

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

    /// Stops every handshake and connection of this endpoint, and waits
    /// until their tasks have ended. Connections that are not in the middle
    /// of a write send a close record (code `shutdown`) if the stream takes
    /// it within [`SHUTDOWN_GRACE`](Self::SHUTDOWN_GRACE); each then reads
    /// and discards what the peer still sends for at most the same time.
    /// Whatever the peers do (stall, never read, keep sending), this
    /// returns within about `SHUTDOWN_GRACE`. Later `connect` and `accept`
    /// calls fail with [`TransportError::Closed`].
    ///
    /// Handshakes run with [`handshake_initiator`](Self::handshake_initiator)
    /// or [`handshake_responder`](Self::handshake_responder) fail with
    /// [`TransportError::Closed`] too, but streams handed out in an
    /// [`Established`] belong to the caller and are not waited for.
    ///
    /// # Cancel safety
    /// Cancel safe: the shutdown is under way from the first poll; dropping
    /// the future only stops waiting for the connections to end.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    /// How long [`shutdown`](Self::shutdown) lets each connection deliver
    /// its close record, and how long a closed connection keeps reading
    /// (and discarding) so that the peer sees that record.
    pub const SHUTDOWN_GRACE: Duration = crate::connection::SHUTDOWN_GRACE;

    /// Runs the initiator's side of the handshake over `stream` and starts
    /// a [`Connection`] on it (two tasks: a reader and a writer). With
    /// `expected_remote`, the peer must prove that key. The contact policy
    /// is applied to the responder's key before our last handshake message
    /// is sent. Outbound handshakes are not counted against
    /// `max_concurrent_handshakes`.
    ///
    /// # Errors
    /// As [`handshake_initiator`](Self::handshake_initiator).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the handshake and drops the stream.
    pub async fn connect<S>(
        &self,
        stream: S,
        expected_remote: Option<NodeId>,
    ) -> Result<Connection, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let established = self.handshake_initiator(stream, expected_remote).await?;
        Ok(self.start(established))
    }

    /// Runs the responder's side of the handshake over `stream` and starts
    /// a [`Connection`] on it. The contact policy is applied to the
    /// initiator's key; a refused peer gets a close record with code
    /// `denied`.
    ///
    /// At most `max_concurrent_handshakes` inbound handshakes run at once
    /// through `accept`: beyond that, it fails at once with
    /// [`TransportError::TooManyHandshakes`] and drops the stream (it does
    /// not wait), so a flood of half-open connections cannot queue up.
    /// Each slot is released when its handshake ends, at the latest after
    /// `first_message_timeout` for a peer that never sends message 1 and
    /// after `handshake_timeout` otherwise. Established connections hold
    /// no slot.
    ///
    /// # Errors
    /// As [`handshake_responder`](Self::handshake_responder), plus
    /// [`TransportError::TooManyHandshakes`].
    ///
    /// # Cancel safety
    /// Dropping the future abandons the handshake and drops the stream.
    pub async fn accept<S>(&self, stream: S) -> Result<Connection, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(_permit) = self.inner.handshakes.clone().try_acquire_owned() else {
            debug!("inbound handshake refused: too many in progress");
            return Err(TransportError::TooManyHandshakes);
        };
        let established = self.handshake_responder(stream).await?;
        Ok(self.start(established))
    }

    /// Runs the initiator's side of the handshake over `stream` and hands
    /// the stream back with the finished session, for a caller that drives
    /// the record layer itself (see [`record_layer`](Self::record_layer)).
    /// Deadline, shutdown switch and checks are those of
    /// [`connect`](Self::connect): with `expected`, the peer must prove that
    /// key; the contact policy (and the refusal of our own key) is applied
    /// to the responder's key before our last handshake message is sent.
    /// The [`Established::leftover`] of an initiator is empty: the
    /// responder may not speak between message 2 and message 3.
    ///
    /// # Errors
    /// [`TransportError::Busy`] when the responder is at capacity (retry
    /// later); [`TransportError::HandshakeTimeout`],
    /// [`TransportError::PeerMisbehaved`], [`TransportError::Denied`],
    /// [`TransportError::UnexpectedPeer`], [`TransportError::PeerLost`]
    /// (the stream ended), [`TransportError::Rng`], [`TransportError::Io`],
    /// [`TransportError::Closed`] after shutdown.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the handshake and drops the stream.
    pub async fn handshake_initiator<S>(
        &self,
        mut stream: S,
        expected: Option<NodeId>,
    ) -> Result<Established<S>, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(HANDSHAKE_BUFFER);
        let session = self
            .bounded(self.initiate(&mut stream, &mut buf, expected))
            .await
            .inspect_err(|e| debug!(error = %e, "outbound handshake failed"))?;
        debug!(remote = %session.remote(), "outbound handshake complete");
        Ok(Established {
            stream,
            session,
            leftover: buf,
        })
    }

    /// Runs the responder's side of the handshake over `stream` and hands
    /// the stream back with the finished session, for a caller that drives
    /// the record layer itself (see [`record_layer`](Self::record_layer)).
    /// Deadlines (`first_message_timeout` for message 1,
    /// `handshake_timeout` for the whole), shutdown switch and checks are
    /// those of [`accept`](Self::accept); a peer refused by the contact
    /// policy (or holding our own key) is sent a close record with code
    /// `denied` before the error is returned.
    ///
    /// Unlike `accept`, this takes no slot of `max_concurrent_handshakes`:
    /// the caller bounds the number of inbound handshakes it runs at once
    /// itself (and may answer the excess with
    /// [`refuse_busy`](Self::refuse_busy)).
    ///
    /// [`Established::leftover`] holds what was read after message 3 (the
    /// initiator's first transport messages, if they came early): feed it to
    /// the decoder before anything else read from the stream.
    ///
    /// # Errors
    /// [`TransportError::HandshakeTimeout`],
    /// [`TransportError::PeerMisbehaved`], [`TransportError::Denied`],
    /// [`TransportError::PeerLost`] (the stream ended),
    /// [`TransportError::Rng`], [`TransportError::Io`],
    /// [`TransportError::Closed`] after shutdown.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the handshake and drops the stream.
    pub async fn handshake_responder<S>(
        &self,
        mut stream: S,
    ) -> Result<Established<S>, TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(HANDSHAKE_BUFFER);
        let session = self
            .bounded(self.respond(&mut stream, &mut buf))
            .await
            .inspect_err(|e| debug!(error = %e, "inbound handshake failed"))?;
        debug!(remote = %session.remote(), "inbound handshake complete");
        Ok(Established {
            stream,
            session,
            leftover: buf,
        })
    }

    /// The record encoder and decoder for a finished `session`, set up with
    /// this endpoint's configuration: `max_record_size` in both directions,
    /// `rekey_after_messages` for the encoder, and (with the `test-hooks`
    /// feature) `start_nonce_for_testing`. This is what
    /// [`Connection`]s use.
    pub fn record_layer(&self, session: TransportSession) -> (RecordEncoder, RecordDecoder) {
        let config = &self.inner.config;
        let (sealer, opener) = session.split();
        #[allow(unused_mut)]
        let mut encoder =
            RecordEncoder::new(sealer, config.max_record_size, config.rekey_after_messages);
        #[allow(unused_mut)]
        let mut decoder = RecordDecoder::new(opener, config.max_record_size);
        #[cfg(feature = "test-hooks")]
        {
            encoder.advance_nonce_for_testing(config.start_nonce_for_testing);
            decoder.advance_nonce_for_testing(config.start_nonce_for_testing);
        }
        (encoder, decoder)
    }

    /// Turns an inbound stream away before any handshake, telling the
    /// initiator to retry later: writes the two bytes `00 00` (a zero-length
    /// message in place of handshake message 2), shuts down the write side,
    /// reads and discards whatever arrives until the peer hangs up, and
    /// drops the stream. The whole takes at most [`BUSY_LINGER`](Self::BUSY_LINGER)
    /// (250 ms) whatever the peer does, and allocates nothing. An initiator
    /// running this crate fails with [`TransportError::Busy`].
    ///
    /// The refusal is not authenticated (anyone on the path could forge it),
    /// so it means only "retry later", never anything about who answered.
    ///
    /// # Cancel safety
    /// Dropping the future drops the stream at once, whether or not the
    /// refusal was written.
    pub async fn refuse_busy<S>(mut stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let _ = tokio::time::timeout(Self::BUSY_LINGER, async {
            stream.write_all(&BUSY).await?;
            stream.flush().await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 512];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
    }

    /// The longest [`refuse_busy`](Self::refuse_busy) keeps a stream.
    pub const BUSY_LINGER: Duration = Duration::from_millis(250);

    fn start<S>(&self, established: Established<S>) -> Connection
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Established {
            stream,
            session,
            leftover,
        } = established;
        let remote = session.remote();
        let handshake_hash = session.handshake_hash();
        let (encoder, decoder) = self.record_layer(session);
        Connection::start(
            stream,
            Parts {
                remote,
                handshake_hash,
                encoder,
                decoder,
                leftover,
            },
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

        // A zero-length message in place of message 2: the responder is busy.
        fill(stream, buf, LENGTH_PREFIX_LEN).await?;
        if buf[..LENGTH_PREFIX_LEN] == BUSY {
            return Err(TransportError::Busy);
        }
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
        let msg1 = tokio::time::timeout(
            inner.config.first_message_timeout,
            read_framed(stream, buf, MESSAGE_1_LEN),
        )
        .await
        .map_err(|_| TransportError::HandshakeTimeout)??;
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
                linger(stream).await;
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
