//! One session with one peer: the hello exchange, the reader loop, and the
//! single-session-per-peer rule.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use capwire_envelope::{
    CloseCode, ErrorBody, FrameRef, Hello, Limits as WireLimits, NodeId, PROTOCOL_VERSION,
    RawValue, ReqId, decode_frame, encode_close, encode_frame, encode_response_err,
};
use capwire_manifest::Manifest;
use capwire_transport::{RecordReceiver, RecordSender};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::dispatch;
use crate::error::NodeError;
use crate::node::{Inner, PeerSlot, lock};

/// The answer to one of our calls, as received.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The raw result item, sliced from the received record.
    Ok(Bytes),
    /// The error the peer answered.
    Err(ErrorBody),
}

pub(crate) struct SessionHandle {
    pub(crate) id: u64,
    remote: NodeId,
    /// Who dialled this session: decides which one survives when both
    /// peers dial at once.
    initiator: NodeId,
    sender: RecordSender,
    pub(crate) pending: Mutex<HashMap<ReqId, oneshot::Sender<Reply>>>,
    pub(crate) running: AtomicUsize,
    /// Signalled whenever a running request or notification finishes.
    pub(crate) slot_freed: tokio::sync::Notify,
    manifest: Mutex<Arc<Manifest>>,
    pub(crate) peer_limits: WireLimits,
    /// Cancelled when the session has ended.
    ended: CancellationToken,
    /// Parent of the cancellation tokens of requests running for this peer.
    pub(crate) handlers: CancellationToken,
}

impl SessionHandle {
    pub(crate) fn remote(&self) -> NodeId {
        self.remote
    }

    pub(crate) fn manifest(&self) -> Arc<Manifest> {
        lock(&self.manifest).clone()
    }

    pub(crate) fn pending_len(&self) -> usize {
        lock(&self.pending).len()
    }

    /// The largest frame that can travel on this session: within our
    /// transport's record limit and the one the peer announced.
    pub(crate) fn max_frame(&self) -> usize {
        let peer = usize::try_from(self.peer_limits.max_record).unwrap_or(usize::MAX);
        self.sender.max_record_size().min(peer)
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Resolves when the session has ended.
    pub(crate) async fn ended(&self) {
        self.ended.cancelled().await;
    }

    /// Queues one encoded frame.
    pub(crate) async fn send(&self, frame: Bytes) -> Result<(), capwire_transport::TransportError> {
        self.sender.send(frame).await
    }

    /// Queues one encoded frame without waiting; `false` when it could not.
    pub(crate) fn try_send(&self, frame: Bytes) -> bool {
        self.sender.try_send(frame).is_ok()
    }

    pub(crate) async fn send_error(&self, req_id: &ReqId, body: &ErrorBody) {
        let mut out = Vec::with_capacity(64 + body.message.len());
        if encode_response_err(&mut out, req_id, body).is_ok() {
            let _ = self.send(Bytes::from(out)).await;
        }
    }

    /// Sends our current manifest again (after its epoch changed).
    pub(crate) fn push_hello(&self, inner: &Arc<Inner>) {
        if let Ok(frame) = hello_frame(inner) {
            let _ = self.try_send(frame);
        }
    }

    /// Sends a close frame, closes the channel and ends the session.
    pub(crate) async fn close(&self, code: CloseCode, reason: &str) {
        if self.is_ended() {
            return;
        }
        let mut out = Vec::new();
        encode_close(&mut out, code, reason);
        let _ = self.send(Bytes::from(out)).await;
        let _ = self.sender.close(reason).await;
        self.ended.cancel();
    }
}

fn hello_frame(inner: &Inner) -> Result<Bytes, NodeError> {
    let manifest = RawValue::encode(&inner.manifest())
        .map_err(|e| NodeError::Config(format!("manifest does not encode: {e}")))?;
    let limits = WireLimits {
        max_record: u32::try_from(inner.endpoint.config().max_record_size).unwrap_or(u32::MAX),
        max_inflight: u32::try_from(inner.limits.max_inflight_per_session).unwrap_or(u32::MAX),
        keepalive_ms: u32::try_from(inner.endpoint.config().keepalive_interval.as_millis())
            .unwrap_or(u32::MAX),
    };
    let mut out = Vec::new();
    encode_frame(
        &capwire_envelope::Frame::Hello(Hello::new(manifest, limits)),
        &mut out,
    )
    .map_err(|e| NodeError::Config(format!("hello does not encode: {e}")))?;
    Ok(Bytes::from(out))
}

/// Serves an accepted stream in the background.
pub(crate) fn spawn_accepted<S>(inner: &Arc<Inner>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let inner2 = inner.clone();
    inner.tracker.spawn(async move {
        if let Err(e) = establish(&inner2, stream, None, false).await {
            tracing::debug!(error = %e, "inbound connection failed");
        }
    });
}

/// Runs the handshake and the hello exchange, installs the session and
/// starts its reader. Returns the session that serves the peer (which may
/// be an older one, when the tie-break keeps it).
pub(crate) async fn establish<S>(
    inner: &Arc<Inner>,
    stream: S,
    expected: Option<NodeId>,
    dialled: bool,
) -> Result<Arc<SessionHandle>, NodeError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if inner.stop_accepting.is_cancelled() {
        return Err(NodeError::Shutdown);
    }
    let permit: OwnedSemaphorePermit = inner
        .sessions
        .clone()
        .try_acquire_owned()
        .map_err(|_| NodeError::TooManySessions)?;
    let conn = if dialled {
        inner.endpoint.connect(stream, expected).await?
    } else {
        inner.endpoint.accept(stream).await?
    };
    let remote = conn.remote();
    let (sender, mut receiver) = conn.split();
    sender.send(hello_frame(inner)?).await?;

    let first = tokio::time::timeout(inner.limits.hello_timeout, receiver.recv())
        .await
        .map_err(|_| NodeError::Timeout)??;
    let Some(first) = first else {
        return Err(NodeError::Protocol("closed before its hello".into()));
    };
    let (manifest, peer_limits) = match read_hello(&first, &remote) {
        Ok(h) => h,
        Err(e) => {
            let mut out = Vec::new();
            encode_close(&mut out, CloseCode::ProtocolError, &e);
            let _ = sender.send(Bytes::from(out)).await;
            let _ = sender.close(&e).await;
            return Err(NodeError::Protocol(e));
        }
    };

    let handle = Arc::new(SessionHandle {
        id: inner.next_session.fetch_add(1, Ordering::Relaxed),
        remote,
        initiator: if dialled { inner.id } else { remote },
        sender,
        pending: Mutex::new(HashMap::new()),
        running: AtomicUsize::new(0),
        slot_freed: tokio::sync::Notify::new(),
        manifest: Mutex::new(Arc::new(manifest)),
        peer_limits,
        ended: CancellationToken::new(),
        handlers: inner.stop_handlers.child_token(),
    });

    let (winner, loser) = install(inner, &handle);
    let reader_inner = inner.clone();
    let reader_handle = handle.clone();
    inner.tracker.spawn(async move {
        run_reader(reader_inner, reader_handle, receiver, permit).await;
    });
    if let Some(loser) = loser {
        loser
            .close(
                CloseCode::Replaced,
                "another session with this peer replaces this one",
            )
            .await;
    }
    inner.bump_peers();
    Ok(winner)
}

fn read_hello(record: &[u8], remote: &NodeId) -> Result<(Manifest, WireLimits), String> {
    let frame = decode_frame(record).map_err(|e| format!("bad first frame: {e}"))?;
    let FrameRef::Hello(hello) = frame else {
        return Err(format!("expected hello, got {}", frame.kind()));
    };
    if hello.protocol != PROTOCOL_VERSION {
        return Err(format!("unsupported protocol version {}", hello.protocol));
    }
    let manifest: Manifest = hello
        .decode_manifest()
        .map_err(|e| format!("bad manifest: {e}"))?;
    if manifest.node_id != *remote {
        return Err("the manifest names another node than the handshake proved".into());
    }
    Ok((manifest, hello.limits))
}

/// Puts `new` in the peer table. At most one session per peer: when both
/// peers dial at once, both keep the session dialled by the smaller node
/// id; a newer session from the same dialler replaces the older one.
/// Returns the session that serves the peer and the one to close.
fn install(
    inner: &Inner,
    new: &Arc<SessionHandle>,
) -> (Arc<SessionHandle>, Option<Arc<SessionHandle>>) {
    let mut peers = lock(&inner.peers);
    let remote = new.remote;
    let keep_new = match peers.get(&remote) {
        None => true,
        Some(slot) if slot.session.is_ended() => true,
        Some(slot) => {
            let preferred = inner.id.min(remote);
            slot.session.initiator == new.initiator || new.initiator == preferred
        }
    };
    if keep_new {
        let old = peers.insert(
            remote,
            PeerSlot {
                session: new.clone(),
            },
        );
        (
            new.clone(),
            old.map(|s| s.session).filter(|s| !s.is_ended()),
        )
    } else {
        let current = peers
            .get(&remote)
            .map(|s| s.session.clone())
            .unwrap_or_else(|| new.clone());
        (current, Some(new.clone()))
    }
}

async fn run_reader(
    inner: Arc<Inner>,
    s: Arc<SessionHandle>,
    mut receiver: RecordReceiver,
    _permit: OwnedSemaphorePermit,
) {
    loop {
        let next = tokio::select! {
            biased;
            _ = s.ended.cancelled() => break,
            r = receiver.recv() => r,
        };
        match next {
            Ok(Some(record)) => {
                if let Err(why) = on_record(&inner, &s, &record).await {
                    tracing::debug!(peer = %s.remote, %why, "closing session: protocol error");
                    s.close(CloseCode::ProtocolError, &why).await;
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(peer = %s.remote, error = %e, "session ended");
                break;
            }
        }
    }
    s.ended.cancel();
    s.handlers.cancel();
    // Calls waiting on this session fail with `PeerLost` (or `Shutdown`).
    lock(&s.pending).clear();
    {
        let mut peers = lock(&inner.peers);
        if peers.get(&s.remote).is_some_and(|p| p.session.id == s.id) {
            peers.remove(&s.remote);
        }
    }
    inner.bump_peers();
}

async fn on_record(
    inner: &Arc<Inner>,
    s: &Arc<SessionHandle>,
    record: &Bytes,
) -> Result<(), String> {
    let frame = decode_frame(record).map_err(|e| format!("malformed frame: {e}"))?;
    match frame {
        FrameRef::Control(c) => dispatch::on_control(inner, s, record, c).await,
        FrameRef::Response(r) => {
            let waiter = lock(&s.pending).remove(&r.req_id);
            if let Some(tx) = waiter {
                let reply = match r.outcome {
                    Ok(raw) => Reply::Ok(record.slice_ref(raw)),
                    Err(body) => Reply::Err(body),
                };
                let _ = tx.send(reply);
            }
        }
        FrameRef::Cancel(c) => {
            lock(&inner.ledger).cancel(s.remote, &c.req_id);
        }
        FrameRef::Hello(h) => {
            if h.protocol != PROTOCOL_VERSION {
                return Err(format!("hello changed protocol to {}", h.protocol));
            }
            let manifest: Manifest = h
                .decode_manifest()
                .map_err(|e| format!("bad manifest: {e}"))?;
            if manifest.node_id != s.remote {
                return Err("the manifest names another node".into());
            }
            *lock(&s.manifest) = Arc::new(manifest);
            inner.bump_peers();
        }
        FrameRef::Close(c) => {
            tracing::debug!(peer = %s.remote, code = %c.code, reason = c.reason, "peer closed the session");
            s.ended.cancel();
        }
        FrameRef::Keepalive => {}
    }
    Ok(())
}

/// Waits for a session with `id` until `deadline`. Returns at once with
/// `None` when `id` is neither connected nor a contact being dialled.
pub(crate) async fn wait_session(
    inner: &Arc<Inner>,
    id: &NodeId,
    deadline: Instant,
) -> Option<Arc<SessionHandle>> {
    if let Some(s) = inner.session(id)
        && !s.is_ended()
    {
        return Some(s);
    }
    let mut changes = inner.peers_changed.subscribe();
    loop {
        if let Some(s) = inner.session(id)
            && !s.is_ended()
        {
            return Some(s);
        }
        if !lock(&inner.contacts).contains_key(id) {
            return None;
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return None;
        }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<SessionHandle>();
}
