//! A hostile peer below the node's friendly API: it drives the transport's
//! I/O-free handshake itself (keeping every handshake message), seals each
//! Noise message with its own `Sealer` (so it can flip, replay, reorder or
//! drop them), writes its own chunks (so it can break the record rules),
//! and opens what the node sends with a `RecordDecoder`, keeping every raw
//! message (so it can reflect them).
//!
//! It speaks protocol 2 unless told otherwise (WIRE.md 4.1): its first
//! hello lists `core.protocol` 2.0.0, so a session with a capwire node
//! is a version-2 session, and it waits for the node's whole manifest
//! (the second hello) before it counts the session open. With
//! [`Speaks::V2WithStreams`] its manifest also lists a stream verb of its
//! own (`app.evil/feed`): its first hello is then the version-1 view and
//! a second hello naming protocol 2 follows, as a node's does.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::BytesMut;
use capwire::Keypair;
use capwire::envelope::{
    CloseCode, Frame, Hello, Limits as WireLimits, NodeId, PROTOCOL_V2, RawValue, ReqId,
    ResponseEnvelope, decode_frame, encode_control,
};
use capwire::manifest::{
    CORE_PROTOCOL, Capability, Manifest, MonitoringHandlers, MonitoringStatus, NodeInfo,
    ProtocolVersions, Registry, Version, verb,
};
use capwire::transport::{
    CloseReason, Initiator, OsEntropy, RecordDecoder, Sealer, TransportError, TransportSession,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::common::{bare_manifest, hello_frame, record};

verb! {
    /// The attacker's own stream verb, listed in its manifest with
    /// [`Speaks::V2WithStreams`]: the node is made to call it, and the
    /// attacker answers with frames of its choosing.
    pub struct Feed: stream "app.evil" / "feed", Bootstrap, u32 => String;
}

/// Which protocol the hand-driven peer says it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// Protocol 1 only: no `core.protocol` in its manifest.
    V1,
    /// Protocol 2 (`core.protocol` 2.0.0), no stream verb of its own.
    V2,
    /// Protocol 2, and a stream verb of its own (`app.evil/feed`).
    V2WithStreams,
    /// Protocol 3 (`core.protocol` 3.0.0), no stream verb of its own.
    V3,
}

impl Speaks {
    /// The highest protocol version it speaks.
    pub fn max(self) -> u32 {
        match self {
            Self::V1 => 1,
            Self::V2 | Self::V2WithStreams => 2,
            Self::V3 => 3,
        }
    }
}

/// The peer's whole manifest for `id`.
pub fn peer_manifest(id: NodeId, speaks: Speaks) -> Manifest {
    if speaks == Speaks::V1 {
        return bare_manifest(id);
    }
    let mut b = Registry::builder(
        NodeInfo::new(id, "raw-peer"),
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    )
    .core_capability(
        Capability::new(CORE_PROTOCOL, Version::new(u64::from(speaks.max()), 0, 0))
            .verb::<ProtocolVersions>(()),
    );
    if speaks == Speaks::V2WithStreams {
        b = b.capability(Capability::new("app.evil", Version::new(1, 0, 0)).verb::<Feed>(()));
    }
    b.build().unwrap().manifest(MonitoringStatus::Off, 1)
}

/// A hello record naming `protocol`, with `manifest`.
pub fn hello_record_of(manifest: &Manifest, protocol: u32) -> Vec<u8> {
    let hello = Hello {
        protocol,
        manifest: RawValue::encode(manifest).unwrap(),
        limits: WireLimits::default(),
    };
    record(&Frame::Hello(hello))
}

/// Any byte stream (TCP or one half of an in-memory pair).
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}
/// A boxed byte stream.
pub type Io = Box<dyn Duplex>;

/// Chunk types inside a transport plaintext (WIRE.md 1.5).
pub const RECORD: u8 = 1;
pub const FIRST: u8 = 2;
pub const NEXT: u8 = 3;

/// Largest plaintext of one Noise message.
pub const MAX_PLAINTEXT: usize = 65535 - 16;

/// `len:u16be message`.
pub fn framed(msg: &[u8]) -> Vec<u8> {
    let mut v = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(msg);
    v
}

/// One chunk: `type:u8 body_len:u16be body`.
pub fn chunk(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![ty];
    v.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// A FIRST chunk announcing `total` bytes, with the record's first `part`.
pub fn first_chunk(total: u32, part: &[u8]) -> Vec<u8> {
    let mut body = total.to_be_bytes().to_vec();
    body.extend_from_slice(part);
    chunk(FIRST, &body)
}

/// The plaintext carrying `records`, one RECORD chunk each.
pub fn records_plaintext(records: &[&[u8]]) -> Vec<u8> {
    records.iter().flat_map(|r| chunk(RECORD, r)).collect()
}

/// Our hello record, with a valid manifest for `id`.
pub fn hello_record(id: NodeId) -> Vec<u8> {
    record(&hello_frame(&bare_manifest(id)))
}

/// A valid control record (budget 30 s).
pub fn control_record(cap: &str, verb: &str, req_id: &str, args: &RawValue) -> Vec<u8> {
    let req_id = if req_id.is_empty() {
        ReqId::EMPTY
    } else {
        ReqId::try_from(req_id).unwrap()
    };
    let mut out = Vec::new();
    encode_control(&mut out, cap, verb, &req_id, Some(30_000), args.as_bytes()).unwrap();
    out
}

/// Raw CBOR args.
pub fn args<T: serde::Serialize + ?Sized>(value: &T) -> RawValue {
    RawValue::encode(value).unwrap()
}

/// Reads one length-prefixed message; `None` when the stream ends, fails
/// or stays silent for `within`. A zero prefix gives an empty message.
pub async fn read_message(stream: &mut Io, within: Duration) -> Option<Vec<u8>> {
    let read = async {
        let mut prefix = [0u8; 2];
        stream.read_exact(&mut prefix).await.ok()?;
        let mut body = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
        stream.read_exact(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(within, read).await.ok().flatten()
}

/// Reads and discards until the stream ends; `true` when it ended (EOF
/// or error) within `within`. `got` is set to the bytes that came.
pub async fn ends_within(stream: &mut Io, within: Duration, got: &mut usize) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(n)) => *got += n,
        }
    }
}

/// The three handshake messages, as they went on the wire (prefixed).
#[derive(Debug, Clone, Default)]
pub struct Transcript {
    pub m1: Vec<u8>,
    pub m2: Vec<u8>,
    pub m3: Vec<u8>,
}

/// A session with the node, driven by hand.
pub struct Wire {
    /// Our identity (canonical).
    pub id: NodeId,
    /// The node's identity as its handshake proved it.
    pub node: NodeId,
    /// The manifest of the node's hello, once it came (its whole
    /// manifest on a version-2 session).
    pub node_manifest: Option<Manifest>,
    /// The session's protocol version, once the hellos are exchanged.
    pub version: u32,
    /// The handshake, message by message.
    pub transcript: Transcript,
    stream: Io,
    sealer: Sealer,
    decoder: RecordDecoder,
    rbuf: BytesMut,
    inbox: VecDeque<Frame>,
    /// Every frame received, in order.
    pub seen: Vec<Frame>,
    /// Every transport message received, prefixed, as it was on the wire.
    pub raw_in: Vec<Vec<u8>>,
    /// The node's transport close record, once it came.
    pub transport_close: Option<CloseReason>,
    /// Our decoder refused what the node sent (never expected).
    pub broken: Option<TransportError>,
    /// The stream ended (or failed).
    pub ended: bool,
}

impl Wire {
    /// Runs the handshake as initiator over `stream`, by hand, with both
    /// nonce counters starting at `start_nonce`.
    ///
    /// # Errors
    /// The node's message 2 failed, or the stream ended.
    pub async fn initiate(
        mut stream: Io,
        keypair: &Keypair,
        start_nonce: u64,
    ) -> Result<Self, TransportError> {
        let mut m1 = Vec::new();
        let waiting = Initiator::new(keypair, &OsEntropy)?.write_message(&[], &mut m1)?;
        let m1 = framed(&m1);
        stream
            .write_all(&m1)
            .await
            .map_err(|_| TransportError::PeerLost)?;
        let m2 = read_message(&mut stream, Duration::from_secs(15))
            .await
            .ok_or(TransportError::PeerLost)?;
        if m2.is_empty() {
            return Err(TransportError::Busy);
        }
        let mut payload = Vec::new();
        let ready = waiting.read_message(&m2, &mut payload)?;
        let mut m3 = Vec::new();
        let session = ready.write_message(&[], &mut m3)?;
        let m3 = framed(&m3);
        stream
            .write_all(&m3)
            .await
            .map_err(|_| TransportError::PeerLost)?;
        Ok(Self::established(
            stream,
            session,
            keypair.public(),
            Transcript {
                m1,
                m2: framed(&m2),
                m3,
            },
            start_nonce,
        ))
    }

    /// A session over `stream` whose handshake was run elsewhere.
    pub fn established(
        stream: Io,
        session: TransportSession,
        id: NodeId,
        transcript: Transcript,
        start_nonce: u64,
    ) -> Self {
        let node = session.remote();
        let (mut sealer, opener) = session.split();
        let mut decoder = RecordDecoder::new(opener, 64 << 20);
        if start_nonce > 0 {
            sealer.advance_nonce_for_testing(start_nonce);
            decoder.advance_nonce_for_testing(start_nonce);
        }
        Self {
            id,
            node,
            node_manifest: None,
            version: 1,
            transcript,
            stream,
            sealer,
            decoder,
            rbuf: BytesMut::new(),
            inbox: VecDeque::new(),
            seen: Vec::new(),
            raw_in: Vec::new(),
            transport_close: None,
            broken: None,
            ended: false,
        }
    }

    /// Sends our hello (protocol 2, [`Speaks::V2`]) and waits for the
    /// node's; `false` when the node's first frame was not a hello (it is
    /// then left in the inbox).
    pub async fn hello(&mut self) -> bool {
        self.hello_as(Speaks::V2).await
    }

    /// The hellos of WIRE.md 4.1 as a peer that `speaks`: our first hello
    /// (`protocol` 1; the version-1 view when our manifest has a stream
    /// verb), the node's first hello, then on a version-2 session our
    /// whole manifest (`protocol` 2) when the first was a partial view,
    /// and the node's whole manifest when its first hello was one, which
    /// must come before any other frame. `false` when the node's first
    /// frame was not a hello (it is then left in the inbox).
    pub async fn hello_as(&mut self, speaks: Speaks) -> bool {
        let whole = peer_manifest(self.id, speaks);
        let first = whole.version_1_view();
        self.send(&[&hello_record_of(&first, 1)]).await;
        let m = match self.next(Duration::from_secs(10)).await {
            Some(Frame::Hello(h)) => {
                assert_eq!(h.protocol, 1, "a first hello names protocol 1 (4.1)");
                let m: Manifest = h.manifest.decode().unwrap();
                assert_eq!(m.node_id, self.node, "the node names itself");
                assert!(
                    !m.has_protocol_2_verbs(),
                    "a first hello shows no stream verb"
                );
                m
            }
            Some(other) => {
                self.inbox.push_front(other);
                return false;
            }
            None => return false,
        };
        let version = speaks.max().min(m.protocol());
        let partial = m.is_partial_view();
        self.node_manifest = Some(m);
        if version < PROTOCOL_V2 {
            return true;
        }
        self.version = version;
        if first.is_partial_view() {
            self.send(&[&hello_record_of(&whole, version)]).await;
        }
        if partial {
            match self.next(Duration::from_secs(10)).await {
                Some(Frame::Hello(h)) => {
                    assert_eq!(
                        h.protocol, version,
                        "the manifest of the session's version names it"
                    );
                    let m: Manifest = h.manifest.decode().unwrap();
                    assert_eq!(m.node_id, self.node);
                    // At the view's epoch, or a newer one when the
                    // manifest changed meanwhile.
                    let view = self.node_manifest.as_ref().map_or(0, |v| v.epoch);
                    assert!(
                        m.epoch >= view,
                        "the whole manifest is not older than the view"
                    );
                    self.node_manifest = Some(m);
                }
                other => panic!(
                    "after a partial view the node's whole manifest comes first, got {other:?}"
                ),
            }
        }
        true
    }

    // ---------------------------------------------------------------
    // Sending

    /// Seals `plaintext` into one prefixed Noise message (not sent).
    pub fn seal(&mut self, plaintext: &[u8]) -> Vec<u8> {
        self.try_seal(plaintext).expect("our sealer works")
    }

    /// As [`Wire::seal`], with the sealer's error.
    pub fn try_seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, TransportError> {
        let mut out = Vec::new();
        self.sealer.seal(plaintext, &mut out)?;
        Ok(framed(&out))
    }

    /// Replaces our sending key by `REKEY(k)` (as after a REKEY chunk).
    pub fn rekey(&mut self) {
        self.sealer.rekey();
    }

    /// Our sending counter.
    pub fn nonce(&self) -> u64 {
        self.sealer.nonce()
    }

    /// Seals `records` into one message (not sent).
    pub fn seal_records(&mut self, records: &[&[u8]]) -> Vec<u8> {
        self.seal(&records_plaintext(records))
    }

    /// Writes bytes as they are; `false` when the stream refused them.
    pub async fn write(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok() && self.stream.flush().await.is_ok()
    }

    /// Seals `records` into one message and writes it.
    pub async fn send(&mut self, records: &[&[u8]]) -> bool {
        let msg = self.seal_records(records);
        self.write(&msg).await
    }

    /// Sends one record: in a RECORD chunk when it fits in one message,
    /// split otherwise.
    pub async fn send_record(&mut self, record: &[u8]) -> bool {
        if record.len() <= MAX_PLAINTEXT - 3 {
            self.send(&[record]).await
        } else {
            self.send_split(record).await
        }
    }

    /// Sends a record of any size, split into FIRST and NEXT chunks that
    /// fill the messages (WIRE.md 1.5).
    pub async fn send_split(&mut self, record: &[u8]) -> bool {
        let total = u32::try_from(record.len()).unwrap();
        let first = MAX_PLAINTEXT - 3 - 4;
        let (head, mut rest) = record.split_at(first.min(record.len() - 1));
        let msg = self.seal(&first_chunk(total, head));
        let mut ok = self.write(&msg).await;
        while !rest.is_empty() {
            let n = rest.len().min(MAX_PLAINTEXT - 3);
            let msg = self.seal(&chunk(NEXT, &rest[..n]));
            ok &= self.write(&msg).await;
            rest = &rest[n..];
        }
        ok
    }

    /// Sends `records` packed into as few messages as they fit in (each a
    /// RECORD chunk); `false` when the stream refused them.
    pub async fn send_batched(&mut self, records: &[Vec<u8>]) -> bool {
        let mut ok = true;
        let mut plaintext = Vec::new();
        for r in records {
            assert!(r.len() + 3 <= MAX_PLAINTEXT, "a record for one chunk");
            if plaintext.len() + 3 + r.len() > MAX_PLAINTEXT {
                let msg = self.seal(&plaintext);
                ok &= self.write(&msg).await;
                plaintext.clear();
            }
            plaintext.extend(chunk(RECORD, r));
        }
        if !plaintext.is_empty() {
            let msg = self.seal(&plaintext);
            ok &= self.write(&msg).await;
        }
        ok
    }

    /// Half-closes our side of the stream.
    pub async fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown().await;
    }

    // ---------------------------------------------------------------
    // Receiving

    /// Reads once from the stream (at most `within`); `false` when nothing
    /// came in time or the stream is over.
    async fn fill(&mut self, within: Duration) -> bool {
        if self.ended {
            return false;
        }
        self.rbuf.reserve(64 * 1024);
        match tokio::time::timeout(within, self.stream.read_buf(&mut self.rbuf)).await {
            Err(_) => false,
            Ok(Ok(0) | Err(_)) => {
                self.ended = true;
                false
            }
            Ok(Ok(_)) => {
                self.digest();
                true
            }
        }
    }

    /// Opens every complete message in the buffer, one at a time.
    fn digest(&mut self) {
        loop {
            if self.transport_close.is_some() || self.broken.is_some() {
                self.rbuf.clear();
                return;
            }
            if self.rbuf.len() < 2 {
                return;
            }
            let len = usize::from(u16::from_be_bytes([self.rbuf[0], self.rbuf[1]]));
            if self.rbuf.len() < 2 + len {
                return;
            }
            let mut msg = self.rbuf.split_to(2 + len);
            self.raw_in.push(msg.to_vec());
            let mut records = Vec::new();
            match self.decoder.decode(&mut msg, &mut records) {
                Ok(d) => {
                    for r in records {
                        let f = decode_frame(&r)
                            .expect("the node only sends valid frames")
                            .to_frame()
                            .unwrap();
                        self.seen.push(f.clone());
                        self.inbox.push_back(f);
                    }
                    if let Some(c) = d.close {
                        self.transport_close = Some(c);
                    }
                }
                Err(e) => self.broken = Some(e),
            }
        }
    }

    /// The next frame within `within`, or `None` (nothing came, or the
    /// session is over).
    pub async fn next(&mut self, within: Duration) -> Option<Frame> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(f) = self.inbox.pop_front() {
                return Some(f);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.fill(left).await {
                return self.inbox.pop_front();
            }
        }
    }

    /// Waits (up to 10 s) for the response to `req_id`; other frames stay
    /// in the inbox.
    pub async fn response(&mut self, req_id: &str) -> ResponseEnvelope {
        self.try_response(req_id, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("no response to {req_id:?} (ended: {})", self.ended))
    }

    /// The response to `req_id` within `within`, if one comes.
    pub async fn try_response(
        &mut self,
        req_id: &str,
        within: Duration,
    ) -> Option<ResponseEnvelope> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(pos) = self
                .inbox
                .iter()
                .position(|f| matches!(f, Frame::Response(r) if r.req_id.as_str() == req_id))
            {
                let Some(Frame::Response(r)) = self.inbox.remove(pos) else {
                    unreachable!()
                };
                return Some(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.ended {
                return None;
            }
            self.fill(left).await;
        }
    }

    /// Reads until the node's close frame (its code) or the end of the
    /// stream (`None`), within `within`.
    pub async fn close_code(&mut self, within: Duration) -> Option<CloseCode> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(Frame::Close(c)) => return Some(c.code),
                Some(_) => {}
                None => return None,
            }
        }
    }

    /// Reads (and keeps) until the stream ends; `true` when it did within
    /// `within`.
    pub async fn until_end(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.fill(left).await;
        }
        true
    }

    /// The first frame (in the inbox, or arriving within `within`) that
    /// `pick` accepts, taken out of the inbox; other frames stay there.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        mut pick: impl FnMut(&Frame) -> bool,
    ) -> Option<Frame> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(pos) = self.inbox.iter().position(&mut pick) {
                return self.inbox.remove(pos);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.ended {
                return None;
            }
            self.fill(left).await;
        }
    }

    /// Reads what comes within `within` into the inbox (and `seen`).
    pub async fn drain(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.ended {
                return;
            }
            self.fill(left).await;
        }
    }

    /// The items received so far for stream `req_id`, decoded as `T`.
    pub fn items_of<T: serde::de::DeserializeOwned>(&self, req_id: &str) -> Vec<T> {
        self.seen
            .iter()
            .filter_map(|f| match f {
                Frame::Item(i) if i.req_id.as_str() == req_id => Some(i.item.decode().unwrap()),
                _ => None,
            })
            .collect()
    }

    /// Responses received so far for `req_id`.
    pub fn responses_to(&self, req_id: &str) -> usize {
        self.seen
            .iter()
            .filter(|f| matches!(f, Frame::Response(r) if r.req_id.as_str() == req_id))
            .count()
    }
}
