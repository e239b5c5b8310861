//! An established session driven by two tokio tasks.
//!
//! ```text
//!  RecordSender::send ─► bounded queue ─► writer task: pack records into
//!  (cloneable)                             Noise messages, seal, write;
//!                                          keepalive when idle; write
//!                                          deadline
//!  RecordReceiver::recv ◄─ bounded queue ◄─ reader task: read, open,
//!                                          reassemble; idle deadline
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use capwire_envelope::NodeId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::record::{CloseCode, CloseReason, LENGTH_PREFIX_LEN, RecordDecoder, RecordEncoder};

/// Most commands the writer takes from its queue in one go.
const BATCH: usize = 1024;
/// The writer writes once this much is packed, even if more is queued. Large
/// enough that a stream of 64 KiB records fills whole Noise messages.
const FLUSH_BYTES: usize = 256 * 1024;
/// Light traffic is read through a buffer of this size inside the reader
/// task: while it waits for such traffic, a connection holds no heap read
/// buffer.
const SMALL_READ: usize = 1024;
/// Largest read a busy connection asks for: reached by doubling while reads
/// fill the room they are given, halved again when they do not.
const MAX_READ: usize = 256 * 1024;
/// How long a shutting-down endpoint tries to deliver its close record.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// After a local close, how long the reader keeps reading (and discarding)
/// so that the peer's last writes do not reset the stream before it has
/// read our close record.
pub(crate) const LINGER: Duration = Duration::from_secs(1);
/// After a write error, how long the writer lets the reader explain it (a
/// close record or the end of the stream) before reporting the error.
const WRITE_ERROR_GRACE: Duration = Duration::from_millis(500);

/// How a connection ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectionEnd {
    /// Closed on this side: `close`, every handle dropped, or endpoint
    /// shutdown.
    ClosedLocally,
    /// The peer sent a close record.
    ClosedByPeer(CloseReason),
    /// An error ended it.
    Failed(TransportError),
}

enum End {
    Local,
    Peer(CloseReason),
    Failed(TransportError),
}

struct Shared {
    remote: NodeId,
    handshake_hash: [u8; 32],
    max_record_size: usize,
    write_timeout: Duration,
    /// This connection.
    cancel: CancellationToken,
    /// The endpoint's (parent of `cancel`).
    shutdown: CancellationToken,
    end: OnceLock<End>,
    /// Set once our close record is on its way: whatever the reader meets
    /// afterwards (the peer hanging up, typically) is part of our close.
    closing: AtomicBool,
    /// Set when the connection has ended (a cheap twin of `cancel`).
    ended: AtomicBool,
}

impl Shared {
    /// Records how the connection ended (the first report wins) and stops
    /// both tasks.
    fn finish(&self, end: End) {
        self.ended.store(true, Ordering::Release);
        if self.end.set(end).is_ok() {
            match self.end.get() {
                Some(End::Failed(e)) => {
                    debug!(remote = %self.remote, error = %e, "connection failed")
                }
                Some(End::Peer(r)) => {
                    debug!(remote = %self.remote, code = ?r.code, "closed by peer")
                }
                _ => debug!(remote = %self.remote, "closed locally"),
            }
        }
        self.cancel.cancel();
    }

    fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The error an operation on the ended connection reports.
    fn end_error(&self) -> TransportError {
        match self.end.get() {
            Some(End::Failed(e)) => e.duplicate(),
            Some(End::Peer(r)) if r.code == CloseCode::Denied => TransportError::DeniedByPeer,
            _ => TransportError::Closed,
        }
    }

    fn end_state(&self) -> ConnectionEnd {
        match self.end.get() {
            Some(End::Failed(e)) => ConnectionEnd::Failed(e.duplicate()),
            Some(End::Peer(r)) => ConnectionEnd::ClosedByPeer(r.clone()),
            Some(End::Local) | None => ConnectionEnd::ClosedLocally,
        }
    }
}

enum Command {
    Record(Bytes),
    Close(CloseCode, String),
}

/// An established, authenticated connection. Use it directly, or
/// [`split`](Self::split) it into a cloneable [`RecordSender`] and a
/// [`RecordReceiver`]. Dropping every handle closes the connection with a
/// close record after the queued records.
#[derive(Debug)]
pub struct Connection {
    sender: RecordSender,
    receiver: RecordReceiver,
}

/// The sending side of a connection. Cheap to clone.
#[derive(Clone)]
pub struct RecordSender {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

/// The receiving side of a connection.
pub struct RecordReceiver {
    rx: mpsc::Receiver<Vec<Bytes>>,
    pending: std::vec::IntoIter<Bytes>,
    shared: Arc<Shared>,
    // Keeps the writer running (for keepalives and the final close record)
    // while only the receiver is left.
    _hold: mpsc::Sender<Command>,
}

/// What a finished handshake hands to [`Connection::start`].
pub(crate) struct Parts {
    pub(crate) remote: NodeId,
    pub(crate) handshake_hash: [u8; 32],
    pub(crate) encoder: RecordEncoder,
    pub(crate) decoder: RecordDecoder,
    pub(crate) leftover: BytesMut,
}

impl Connection {
    pub(crate) fn start<S>(
        stream: S,
        parts: Parts,
        config: &TransportConfig,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
    ) -> Self
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Parts {
            remote,
            handshake_hash,
            encoder,
            decoder,
            leftover,
        } = parts;
        let shared = Arc::new(Shared {
            remote,
            handshake_hash,
            max_record_size: config.max_record_size,
            write_timeout: config.write_timeout,
            cancel: shutdown.child_token(),
            shutdown: shutdown.clone(),
            end: OnceLock::new(),
            closing: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(config.send_queue_depth);
        let (in_tx, in_rx) = mpsc::channel(config.recv_queue_depth);
        let (read_half, write_half) = tokio::io::split(stream);
        tracker.spawn(write_task(
            write_half,
            encoder,
            rx,
            shared.clone(),
            config.keepalive_interval,
        ));
        tracker.spawn(read_task(
            read_half,
            decoder,
            leftover,
            in_tx,
            shared.clone(),
            config.idle_timeout,
        ));
        Self {
            sender: RecordSender {
                tx: tx.clone(),
                shared: shared.clone(),
            },
            receiver: RecordReceiver {
                rx: in_rx,
                pending: Vec::new().into_iter(),
                shared,
                _hold: tx,
            },
        }
    }

    /// The peer's identity: its static key, proven by the handshake, in
    /// canonical form.
    pub fn remote(&self) -> NodeId {
        self.sender.remote()
    }

    /// The Noise handshake hash, identical on both sides (channel binding).
    pub fn handshake_hash(&self) -> [u8; 32] {
        self.sender.shared.handshake_hash
    }

    /// Queues a record; see [`RecordSender::send`].
    ///
    /// # Errors
    /// As [`RecordSender::send`].
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before it completes, the
    /// record was not queued.
    pub async fn send(&self, record: impl Into<Bytes>) -> Result<(), TransportError> {
        self.sender.send(record).await
    }

    /// Receives the next record; see [`RecordReceiver::recv`].
    ///
    /// # Errors
    /// As [`RecordReceiver::recv`].
    ///
    /// # Cancel safety
    /// Cancel safe: no record is lost if the future is dropped.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, TransportError> {
        self.receiver.recv().await
    }

    /// Closes the connection; see [`RecordSender::close`].
    ///
    /// # Errors
    /// As [`RecordSender::close`].
    ///
    /// # Cancel safety
    /// As [`RecordSender::close`].
    pub async fn close(&self, reason: &str) -> Result<(), TransportError> {
        self.sender.close(reason).await
    }

    /// Another handle for sending.
    pub fn sender(&self) -> RecordSender {
        self.sender.clone()
    }

    /// Separates the sending and receiving sides.
    pub fn split(self) -> (RecordSender, RecordReceiver) {
        (self.sender, self.receiver)
    }
}

impl RecordSender {
    /// The peer's identity (canonical static key).
    pub fn remote(&self) -> NodeId {
        self.shared.remote
    }

    /// The largest record this connection sends.
    pub fn max_record_size(&self) -> usize {
        self.shared.max_record_size
    }

    fn check(&self, record: &Bytes) -> Result<(), TransportError> {
        if record.len() > self.shared.max_record_size {
            return Err(TransportError::RecordTooLarge {
                len: record.len(),
                max: self.shared.max_record_size,
            });
        }
        if self.shared.is_ended() {
            return Err(self.shared.end_error());
        }
        Ok(())
    }

    /// Queues a record for sending, waiting while the send queue is full
    /// (backpressure). Queued records are sent in order; several queued
    /// records travel in one Noise message.
    ///
    /// # Errors
    /// [`TransportError::RecordTooLarge`] over the maximum record size; the
    /// error that ended the connection ([`TransportError::Closed`] after a
    /// local close or a close by the peer).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before it completes, the
    /// record was not queued.
    pub async fn send(&self, record: impl Into<Bytes>) -> Result<(), TransportError> {
        let record = record.into();
        self.check(&record)?;
        self.tx
            .send(Command::Record(record))
            .await
            .map_err(|_| self.shared.end_error())
    }

    /// Queues a record if there is room now.
    ///
    /// # Errors
    /// [`TransportError::QueueFull`] when the queue is full; otherwise as
    /// [`send`](Self::send).
    pub fn try_send(&self, record: impl Into<Bytes>) -> Result<(), TransportError> {
        let record = record.into();
        self.check(&record)?;
        self.tx
            .try_send(Command::Record(record))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => TransportError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => self.shared.end_error(),
            })
    }

    /// Sends a close record after every record already queued, then ends
    /// the connection. The reason (at most 255 bytes are sent) is for
    /// people. Returns once the close record has been written, and in any
    /// case within the configured `write_timeout` of the call: if the
    /// queued records and the close record could not all be written by
    /// then (a peer that reads too slowly, or not at all), the connection
    /// is ended without them and this reports
    /// [`TransportError::WriteTimeout`]. Closing an ended connection does
    /// nothing.
    ///
    /// # Errors
    /// The error that ended the connection before the close record could be
    /// written; [`TransportError::WriteTimeout`] as above.
    ///
    /// # Cancel safety
    /// Dropping the future after the close was queued does not stop the
    /// close, but then nothing enforces the bound above beyond the write
    /// deadline itself.
    pub async fn close(&self, reason: &str) -> Result<(), TransportError> {
        let deadline = Instant::now() + self.shared.write_timeout;
        if !self.shared.is_ended() {
            tokio::select! {
                biased;
                () = self.shared.cancel.cancelled() => {}
                _ = self.tx.send(Command::Close(CloseCode::Normal, reason.to_owned())) => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
        tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => {}
            () = tokio::time::sleep_until(deadline) => {
                self.shared.finish(End::Failed(TransportError::WriteTimeout));
            }
        }
        match self.shared.end.get() {
            Some(End::Failed(e)) => Err(e.duplicate()),
            _ => Ok(()),
        }
    }

    /// Waits until the connection has ended, and says how.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn ended(&self) -> ConnectionEnd {
        self.shared.cancel.cancelled().await;
        self.shared.end_state()
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.shared.is_ended()
    }
}

impl std::fmt::Debug for RecordSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSender")
            .field("remote", &self.shared.remote)
            .finish_non_exhaustive()
    }
}

impl RecordReceiver {
    /// The peer's identity (canonical static key).
    pub fn remote(&self) -> NodeId {
        self.shared.remote
    }

    /// The next record. `Ok(None)` means the peer closed the session with a
    /// close record (after every record it sent before); the reason is in
    /// [`close_reason`](Self::close_reason).
    ///
    /// # Errors
    /// [`TransportError::PeerLost`] when the stream ended without a close
    /// record; [`TransportError::DeniedByPeer`] when the peer's contact
    /// policy refused us; [`TransportError::Closed`] after a local close;
    /// otherwise the error that ended the session. Records received intact
    /// before the error are delivered first; nothing from a bad message is.
    ///
    /// # Cancel safety
    /// Cancel safe: no record is lost if the future is dropped.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, TransportError> {
        loop {
            if let Some(record) = self.pending.next() {
                return Ok(Some(record));
            }
            match self.rx.recv().await {
                Some(batch) => self.pending = batch.into_iter(),
                None => {
                    return match self.shared.end.get() {
                        Some(End::Peer(r)) if r.code != CloseCode::Denied => Ok(None),
                        _ => Err(self.shared.end_error()),
                    };
                }
            }
        }
    }

    /// The peer's close record, once it has arrived.
    pub fn close_reason(&self) -> Option<CloseReason> {
        match self.shared.end.get() {
            Some(End::Peer(r)) => Some(r.clone()),
            _ => None,
        }
    }
}

impl std::fmt::Debug for RecordReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReceiver")
            .field("remote", &self.shared.remote)
            .finish_non_exhaustive()
    }
}

/// Writes what the encoder has sealed, then flushes.
async fn write_wire<W: AsyncWrite + Unpin>(
    w: &mut W,
    enc: &mut RecordEncoder,
    shared: &Shared,
) -> Result<(), TransportError> {
    if enc.wire().is_empty() {
        return Ok(());
    }
    write_timed(w, enc.wire(), shared).await?;
    enc.consume_wire();
    flush_timed(w, shared).await
}

/// Writes all of `bytes`. Fails with [`TransportError::WriteTimeout`] when
/// the stream takes nothing for `write_timeout`, and with
/// [`TransportError::Closed`] when the connection is cancelled.
async fn write_timed<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut bytes: &[u8],
    shared: &Shared,
) -> Result<(), TransportError> {
    while !bytes.is_empty() {
        // The timer is created per attempt (that is, from the last
        // progress) but only registered if the write has to wait.
        let n = tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return Err(TransportError::Closed),
            r = w.write(bytes) => r?,
            () = tokio::time::sleep(shared.write_timeout) => {
                return Err(TransportError::WriteTimeout);
            }
        };
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

/// Flushes under the same deadline and cancellation as [`write_timed`].
async fn flush_timed<W: AsyncWrite + Unpin>(
    w: &mut W,
    shared: &Shared,
) -> Result<(), TransportError> {
    tokio::select! {
        biased;
        () = shared.cancel.cancelled() => Err(TransportError::Closed),
        r = w.flush() => Ok(r?),
        () = tokio::time::sleep(shared.write_timeout) => Err(TransportError::WriteTimeout),
    }
}

async fn write_task<W: AsyncWrite + Unpin>(
    mut w: W,
    mut enc: RecordEncoder,
    mut rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    keepalive: Duration,
) {
    let clean = match write_loop(&mut w, &mut enc, &mut rx, &shared, keepalive).await {
        Ok(()) => true,
        // Cancelled in the middle of a write: the stream is unusable.
        Err(TransportError::Closed) if shared.cancel.is_cancelled() => false,
        Err(e @ TransportError::Io(_)) => {
            // The peer may have closed properly and hung up while we were
            // writing: prefer what the reader finds.
            let _ = tokio::time::timeout(WRITE_ERROR_GRACE, shared.cancel.cancelled()).await;
            shared.finish(End::Failed(e));
            false
        }
        Err(e) => {
            shared.finish(End::Failed(e));
            false
        }
    };
    // Endpoint shutdown: tell the peer, briefly, if nothing else ended us.
    let shutting_down = shared.shutdown.is_cancelled()
        && !matches!(shared.end.get(), Some(End::Peer(_) | End::Failed(_)));
    shared.finish(End::Local);
    if shutting_down && clean {
        debug!(remote = %shared.remote, "closing for shutdown");
        shared.closing.store(true, Ordering::Release);
        if enc.close(CloseCode::Shutdown, "shutting down").is_ok() {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
                w.write_all(enc.wire()).await?;
                w.shutdown().await
            })
            .await;
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    w: &mut W,
    enc: &mut RecordEncoder,
    rx: &mut mpsc::Receiver<Command>,
    shared: &Shared,
    keepalive: Duration,
) -> Result<(), TransportError> {
    // Commands taken from the queue and not yet packed.
    let mut cmds: Vec<Command> = Vec::with_capacity(BATCH);
    // The timer is re-armed only when it fires, from the time of the last
    // write, which keeps timer updates off the path of every message.
    let mut last_write = Instant::now();
    let idle = tokio::time::sleep(keepalive);
    tokio::pin!(idle);
    loop {
        let mut close = None;
        if cmds.is_empty() {
            tokio::select! {
                biased;
                () = shared.cancel.cancelled() => return Ok(()),
                n = rx.recv_many(&mut cmds, BATCH) => {
                    if n == 0 {
                        // Every handle is gone.
                        close = Some((CloseCode::Normal, String::new()));
                    }
                }
                () = &mut idle => {
                    if last_write.elapsed() >= keepalive {
                        enc.keepalive()?;
                        write_wire(w, enc, shared).await?;
                        // Idle: keep no output buffer until the next record.
                        enc.release_buffer();
                        last_write = Instant::now();
                    }
                    idle.as_mut().reset(last_write + keepalive);
                    continue;
                }
            }
        }
        // Pack what is queued right now, without waiting for more, until
        // there is enough to write.
        while close.is_none() && enc.buffered() < FLUSH_BYTES {
            if cmds.is_empty() && !take_queued(rx, &mut cmds) {
                break;
            }
            let mut used = 0;
            for cmd in &cmds {
                if enc.buffered() >= FLUSH_BYTES {
                    break;
                }
                used += 1;
                match cmd {
                    Command::Record(r) => enc.push_record(r)?,
                    Command::Close(code, reason) => {
                        close = Some((*code, reason.clone()));
                        break;
                    }
                }
            }
            cmds.drain(..used);
        }
        match close {
            Some((code, reason)) => {
                shared.closing.store(true, Ordering::Release);
                enc.close(code, &reason)?;
                write_wire(w, enc, shared).await?;
                let _ = tokio::time::timeout(shared.write_timeout, w.shutdown()).await;
                shared.finish(End::Local);
                return Ok(());
            }
            None => {
                enc.flush()?;
                write_wire(w, enc, shared).await?;
                last_write = Instant::now();
            }
        }
    }
}

/// Moves whatever is queued now into `cmds`, without waiting. Returns
/// whether anything was taken.
fn take_queued(rx: &mut mpsc::Receiver<Command>, cmds: &mut Vec<Command>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    matches!(
        rx.poll_recv_many(&mut cx, cmds, BATCH),
        std::task::Poll::Ready(n) if n > 0
    )
}

async fn read_task<R: AsyncRead + Unpin>(
    mut r: R,
    mut dec: RecordDecoder,
    mut buf: BytesMut,
    tx: mpsc::Sender<Vec<Bytes>>,
    shared: Arc<Shared>,
    idle: Duration,
) {
    match read_loop(&mut r, &mut dec, &mut buf, &tx, &shared, idle).await {
        Ok(Some(close)) => shared.finish(End::Peer(close)),
        Ok(None) => shared.finish(End::Local),
        Err(_) if shared.closing.load(Ordering::Acquire) => shared.finish(End::Local),
        Err(e) => shared.finish(End::Failed(e)),
    }
    drop(tx); // `recv` now sees the end, which is recorded.
    drop(buf);
    if matches!(shared.end.get(), Some(End::Local)) {
        linger(&mut r).await;
    }
}

/// How much the reader asks for: doubles (up to [`MAX_READ`]) while reads
/// fill the room they are given, halves (down to [`SMALL_READ`]) when a
/// read brings a quarter or less.
struct ReadSize(usize);

impl ReadSize {
    fn update(&mut self, n: usize, room: usize) {
        if n >= room {
            self.0 = (self.0 * 2).min(MAX_READ);
        } else if n <= self.0 / 4 {
            self.0 = (self.0 / 2).max(SMALL_READ);
        }
    }

    fn is_small(&self) -> bool {
        self.0 <= SMALL_READ
    }
}

/// Bytes still missing from the message at the front of `buf`, if its
/// prefix is there and its body is not complete.
fn missing(buf: &BytesMut) -> Option<usize> {
    let len = u16::from_be_bytes([*buf.first()?, *buf.get(1)?]);
    (LENGTH_PREFIX_LEN + usize::from(len)).checked_sub(buf.len())
}

/// Makes sure `buf` has room for a read of about `want` bytes. Records
/// handed out share the buffer's memory; once they are all dropped the
/// buffer is reused in place, otherwise a fresh one is started and the
/// unread bytes move into it.
fn make_room(buf: &mut BytesMut, want: usize) {
    let free = buf.capacity() - buf.len();
    if free >= want / 2 || missing(buf).is_some_and(|m| m > 0 && free >= m) {
        return;
    }
    if buf.try_reclaim(want) {
        return;
    }
    let mut fresh = BytesMut::with_capacity(buf.len() + want);
    fresh.extend_from_slice(buf);
    *buf = fresh;
}

/// Reads once: into the heap buffer, or (`light`) into `small` and then
/// into a heap buffer of exactly the size read.
async fn read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    small: &mut [u8; SMALL_READ],
    light: bool,
) -> std::io::Result<usize> {
    if light {
        let n = r.read(small).await?;
        buf.extend_from_slice(&small[..n]);
        Ok(n)
    } else {
        r.read_buf(buf).await
    }
}

/// Reads and discards until the peer hangs up, for at most [`LINGER`].
pub(crate) async fn linger<R: AsyncRead + Unpin>(r: &mut R) {
    let mut sink = [0u8; SMALL_READ];
    let _ = tokio::time::timeout(LINGER, async {
        loop {
            match r.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    r: &mut R,
    dec: &mut RecordDecoder,
    buf: &mut BytesMut,
    tx: &mpsc::Sender<Vec<Bytes>>,
    shared: &Shared,
    idle: Duration,
) -> Result<Option<CloseReason>, TransportError> {
    // As for keepalives: the deadline is re-armed when it fires.
    let mut last_message = Instant::now();
    let deadline = tokio::time::sleep(idle);
    tokio::pin!(deadline);
    let mut batch = Vec::new();
    let mut size = ReadSize(SMALL_READ);
    let mut small = [0u8; SMALL_READ];
    loop {
        let decoded = dec.decode(buf, &mut batch);
        if !batch.is_empty() {
            // Records authenticated before any error are delivered first.
            let records = std::mem::take(&mut batch);
            if !tx.is_closed() {
                tokio::select! {
                    biased;
                    () = shared.cancel.cancelled() => return Ok(None),
                    _ = tx.send(records) => {}
                }
            }
        }
        let decoded = decoded?;
        if decoded.messages > 0 {
            last_message = Instant::now();
        }
        if let Some(close) = decoded.close {
            return Ok(Some(close));
        }
        // Light traffic: wait without holding a heap buffer.
        let light = buf.is_empty() && size.is_small();
        let room = if light {
            if buf.capacity() > 0 {
                *buf = BytesMut::new();
            }
            SMALL_READ
        } else {
            make_room(buf, size.0);
            buf.capacity() - buf.len()
        };
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return Ok(None),
            n = read_some(r, buf, &mut small, light) => {
                let n = n?;
                if n == 0 {
                    return Err(TransportError::PeerLost);
                }
                size.update(n, room);
            }
            () = &mut deadline => {
                if last_message.elapsed() >= idle {
                    return Err(TransportError::IdleTimeout);
                }
                deadline.as_mut().reset(last_message + idle);
            }
        }
    }
}
