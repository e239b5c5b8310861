//! Shared helpers for the node's integration tests: an `app.echo`
//! capability whose handlers count what they do, node constructors, a wait
//! loop, and a scripted raw peer that speaks the wire protocol directly.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire::envelope::{
    Frame, FrameRef, Hello, Limits as WireLimits, NodeId, RawValue, ReqId, ResponseEnvelope,
    decode_frame, encode_cancel, encode_control, encode_frame,
};
use capwire::manifest::{Manifest, MonitoringHandlers, MonitoringStatus, NodeInfo, Registry, verb};
use capwire::transport::{Connection, Endpoint, RecordReceiver, RecordSender};
use capwire::{
    Addr, Capability, ContactPolicy, HandlerError, Keypair, Limits, Meta, Node, Peer, Sender,
    State, TransportConfig,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

verb! {
    /// Echoes text back; any contact may call it.
    pub struct Say: request "app.echo" / "say", Bootstrap, String => String;
}
verb! {
    /// A fire-and-forget note; any contact may send it.
    pub struct Note: notification "app.echo" / "note", Bootstrap, String;
}
verb! {
    /// Only the bound control plane may call it.
    pub struct Admin: request "app.echo" / "admin", Controller, String => String;
}
verb! {
    /// Panics in the handler.
    pub struct Boom: request "app.echo" / "boom", Bootstrap, String => String;
}
verb! {
    /// Waits until the test releases it (or it is cancelled); returns its tag.
    pub struct Hold: request "app.echo" / "hold", Bootstrap, u64 => u64;
}
verb! {
    /// A notification that waits like `Hold` (same counters and release).
    pub struct Wait: notification "app.echo" / "wait", Bootstrap, u64;
}
verb! {
    /// A notification whose handler fails ("refuse") or panics ("boom").
    pub struct Fail: notification "app.echo" / "fail", Bootstrap, String;
}
verb! {
    /// Returns a text of this many bytes.
    pub struct Repeat: request "app.echo" / "repeat", Bootstrap, u32 => String;
}
verb! {
    /// Sleeps this many milliseconds, then returns them.
    pub struct Delay: request "app.echo" / "delay", Bootstrap, u64 => u64;
}

/// What the `app.echo` handlers did, shared with the test through `State`.
#[derive(Debug)]
pub struct Counters {
    pub say: AtomicUsize,
    pub notes: AtomicUsize,
    pub last_note: Mutex<Option<(NodeId, String)>>,
    pub admin: AtomicUsize,
    pub boom: AtomicUsize,
    pub delay: AtomicUsize,
    /// `Hold` handlers that started.
    pub held: AtomicUsize,
    /// `Hold` handlers whose future ended: returned, or dropped when cancelled.
    pub held_ended: AtomicUsize,
    /// The `Meta.cancel` token of every `Hold` handler, in start order.
    pub held_tokens: Mutex<Vec<CancellationToken>>,
    /// Each permit lets one `Hold` handler return.
    pub release: Semaphore,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            say: AtomicUsize::new(0),
            notes: AtomicUsize::new(0),
            last_note: Mutex::new(None),
            admin: AtomicUsize::new(0),
            boom: AtomicUsize::new(0),
            delay: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            held_ended: AtomicUsize::new(0),
            held_tokens: Mutex::new(Vec::new()),
            release: Semaphore::new(0),
        }
    }
}

impl Counters {
    pub fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }

    /// The cancel token of the `n`-th `Hold` handler that started.
    pub fn held_token(&self, n: usize) -> CancellationToken {
        self.held_tokens.lock().unwrap()[n].clone()
    }

    /// Whether every started `Hold` handler's token has fired.
    pub fn all_held_cancelled(&self) -> bool {
        self.held_tokens
            .lock()
            .unwrap()
            .iter()
            .all(CancellationToken::is_cancelled)
    }
}

pub type Shared = Arc<Counters>;

async fn say(text: String, State(c): State<Shared>) -> Result<String, HandlerError> {
    c.say.fetch_add(1, Ordering::SeqCst);
    Ok(format!("echo: {text}"))
}

async fn note(
    text: String,
    Sender(from): Sender,
    State(c): State<Shared>,
) -> Result<(), HandlerError> {
    *c.last_note.lock().unwrap() = Some((from, text));
    c.notes.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn admin(
    text: String,
    Sender(from): Sender,
    State(c): State<Shared>,
) -> Result<String, HandlerError> {
    c.admin.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{text} for {from}"))
}

async fn boom(text: String, State(c): State<Shared>) -> Result<String, HandlerError> {
    c.boom.fetch_add(1, Ordering::SeqCst);
    match text.as_str() {
        "boom" => panic!("the handler blew up on purpose"),
        "refuse" => Err(HandlerError::app("refused", "not today").unwrap()),
        _ => Ok(text),
    }
}

struct HeldEnded(Shared);

impl Drop for HeldEnded {
    fn drop(&mut self) {
        self.0.held_ended.fetch_add(1, Ordering::SeqCst);
    }
}

async fn hold(tag: u64, meta: Meta, State(c): State<Shared>) -> Result<u64, HandlerError> {
    let _ended = HeldEnded(c.clone());
    c.held_tokens.lock().unwrap().push(meta.cancel.clone());
    c.held.fetch_add(1, Ordering::SeqCst);
    let permit = c
        .release
        .acquire()
        .await
        .expect("the semaphore is never closed");
    permit.forget();
    Ok(tag)
}

async fn wait(tag: u64, meta: Meta, State(c): State<Shared>) -> Result<(), HandlerError> {
    hold(tag, meta, State(c)).await.map(|_| ())
}

async fn fail(text: String, State(c): State<Shared>) -> Result<(), HandlerError> {
    boom(text, State(c)).await.map(|_| ())
}

async fn repeat(len: u32) -> Result<String, HandlerError> {
    Ok("x".repeat(len as usize))
}

async fn delay(ms: u64, State(c): State<Shared>) -> Result<u64, HandlerError> {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    c.delay.fetch_add(1, Ordering::SeqCst);
    Ok(ms)
}

/// The `app.echo` capability, version 1.4.2, with every verb above.
pub fn echo_cap() -> Capability {
    Capability::new("app.echo", "1.4.2")
        .unwrap()
        .handle(Say, say)
        .handle(Note, note)
        .handle(Admin, admin)
        .handle(Boom, boom)
        .handle(Hold, hold)
        .handle(Wait, wait)
        .handle(Fail, fail)
        .handle(Delay, delay)
        .handle(Repeat, repeat)
}

/// A node with `app.echo`, listening on loopback TCP.
pub async fn echo_node(limits: Limits) -> (Node, Shared) {
    let counters = Shared::default();
    let node = Node::builder("echo-server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(echo_cap())
        .state(counters.clone())
        .limits(limits)
        .start()
        .await
        .unwrap();
    (node, counters)
}

/// A node with `app.echo` that does not listen (for in-memory pairs).
pub async fn echo_node_unlistening(limits: Limits) -> (Node, Shared) {
    let counters = Shared::default();
    let node = Node::builder("echo-server")
        .capability(echo_cap())
        .state(counters.clone())
        .limits(limits)
        .start()
        .await
        .unwrap();
    (node, counters)
}

/// A node with no capabilities of its own, that does not listen.
pub async fn client_node() -> Node {
    Node::builder("client").start().await.unwrap()
}

/// The first TCP address `node` listens on.
pub fn tcp_addr(node: &Node) -> SocketAddr {
    node.local_addrs()
        .into_iter()
        .find_map(|a| match a {
            Addr::Tcp(sa) => Some(sa),
            Addr::Unix(_) => None,
        })
        .expect("the node listens on TCP")
}

/// Connects `client` to `server` over loopback TCP.
pub async fn connect_tcp(client: &Node, server: &Node) -> Peer {
    client
        .connect(&Addr::Tcp(tcp_addr(server)), Some(server.id()))
        .await
        .unwrap()
}

/// Connects `client` to `server` over an in-memory pair.
pub async fn connect_memory(client: &Node, server: &Node) -> Peer {
    let (a, b) = tokio::io::duplex(256 * 1024);
    server.accept_stream(b);
    client.connect_stream(a, Some(server.id())).await.unwrap()
}

/// Polls `cond` every few milliseconds until it holds; fails the test after
/// 10 s (of tokio time, so it also works under `tokio::time::pause()`).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Raw CBOR args.
pub fn raw<T: serde::Serialize + ?Sized>(value: &T) -> RawValue {
    RawValue::encode(value).unwrap()
}

/// A manifest for a node with no capabilities beyond `core.monitoring`.
pub fn bare_manifest(id: NodeId) -> Manifest {
    Registry::builder(
        NodeInfo::new(id, "raw-peer"),
        MonitoringHandlers {
            bind: (),
            disable: (),
        },
    )
    .build()
    .unwrap()
    .manifest(MonitoringStatus::Off, 1)
}

/// A hello frame announcing `manifest`.
pub fn hello_frame(manifest: &Manifest) -> Frame {
    Frame::Hello(Hello::new(raw(manifest), WireLimits::default()))
}

/// Encodes any frame into a record.
pub fn record(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out).unwrap();
    out
}

/// A scripted peer that speaks the protocol directly: the Noise handshake
/// through `capwire_transport::Endpoint`, a hello with a valid manifest,
/// then whatever frames the test writes. Every frame it receives is kept,
/// so tests can check what did (and did not) cross the wire.
pub struct RawPeer {
    pub id: NodeId,
    /// The manifest from the node's hello.
    pub node_manifest: Manifest,
    sender: RecordSender,
    receiver: RecordReceiver,
    /// Frames received and not yet taken by `response`.
    unread: VecDeque<Frame>,
    /// Every frame received after the hello, in order.
    pub received: Vec<Frame>,
    /// The session has ended (close record, stream end or error).
    pub ended: bool,
    _endpoint: Endpoint,
}

impl RawPeer {
    /// Dials `node` over loopback TCP with a fresh identity.
    pub async fn connect(node: &Node) -> Self {
        Self::connect_as(node, Keypair::generate().unwrap()).await
    }

    /// Dials `node` over loopback TCP as `keypair`.
    pub async fn connect_as(node: &Node, keypair: Keypair) -> Self {
        let stream = TcpStream::connect(tcp_addr(node)).await.unwrap();
        Self::over(stream, node.id(), keypair).await
    }

    /// Runs the handshake (as initiator) and the hello exchange over
    /// `stream`.
    pub async fn over<S>(stream: S, node: NodeId, keypair: Keypair) -> Self
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let manifest = bare_manifest(keypair.public());
        Self::over_with_manifest(stream, node, keypair, &manifest).await
    }

    /// As [`RawPeer::over`], announcing `manifest` in the hello.
    pub async fn over_with_manifest<S>(
        stream: S,
        node: NodeId,
        keypair: Keypair,
        manifest: &Manifest,
    ) -> Self
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let endpoint = Endpoint::new(
            keypair,
            TransportConfig::default(),
            ContactPolicy::AcceptAny,
        );
        let conn = endpoint.connect(stream, Some(node)).await.unwrap();
        Self::hello_exchange(endpoint, conn, manifest).await
    }

    /// Runs the handshake as responder (a node dialled us) and the hello
    /// exchange.
    pub async fn accept<S>(stream: S, keypair: Keypair) -> Self
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let manifest = bare_manifest(keypair.public());
        let endpoint = Endpoint::new(
            keypair,
            TransportConfig::default(),
            ContactPolicy::AcceptAny,
        );
        let conn = endpoint.accept(stream).await.unwrap();
        Self::hello_exchange(endpoint, conn, &manifest).await
    }

    async fn hello_exchange(endpoint: Endpoint, conn: Connection, manifest: &Manifest) -> Self {
        let id = endpoint.local_id();
        let node = conn.remote();
        let (sender, mut receiver) = conn.split();
        let mut out = Vec::new();
        encode_frame(&hello_frame(manifest), &mut out).unwrap();
        sender.send(out).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), receiver.recv())
            .await
            .expect("the node sends its hello")
            .unwrap()
            .expect("a hello, not the end of the session");
        // A node that refuses our hello may close before its own hello went
        // out (WIRE.md 4.2): the close is then the first frame.
        let mut unread = VecDeque::new();
        let node_manifest = match decode_frame(&first).unwrap() {
            FrameRef::Hello(hello) => {
                let m: Manifest = hello.decode_manifest().unwrap();
                assert_eq!(m.node_id, node);
                m
            }
            other => {
                let frame = other.to_frame().unwrap();
                assert!(
                    matches!(frame, Frame::Close(_)),
                    "the first frame must be a hello or a close: {frame:?}"
                );
                unread.push_back(frame);
                bare_manifest(node)
            }
        };
        Self {
            id,
            node_manifest,
            sender,
            receiver,
            unread,
            received: Vec::new(),
            ended: false,
            _endpoint: endpoint,
        }
    }

    /// Sends one record as it is.
    pub async fn send_record(&self, record: Vec<u8>) {
        self.sender.send(record).await.unwrap();
    }

    /// Sends a control envelope with a 30 s budget; an empty `req_id`
    /// makes it fire-and-forget.
    pub async fn control(&self, cap: &str, verb: &str, req_id: &str, args: &RawValue) {
        self.control_with_budget(cap, verb, req_id, Some(30_000), args)
            .await;
    }

    /// Sends a control envelope with the given budget (milliseconds).
    pub async fn control_with_budget(
        &self,
        cap: &str,
        verb: &str,
        req_id: &str,
        budget_ms: Option<u64>,
        args: &RawValue,
    ) {
        let req_id = if req_id.is_empty() {
            ReqId::EMPTY
        } else {
            ReqId::try_from(req_id).unwrap()
        };
        let mut out = Vec::new();
        encode_control(&mut out, cap, verb, &req_id, budget_ms, args.as_bytes()).unwrap();
        self.send_record(out).await;
    }

    /// Sends a cancel frame.
    pub async fn cancel(&self, req_id: &str) {
        let mut out = Vec::new();
        encode_cancel(&mut out, &ReqId::try_from(req_id).unwrap()).unwrap();
        self.send_record(out).await;
    }

    /// Receives the next frame, or `None` when nothing arrives within
    /// `within` or the session has ended (then `ended` is set).
    pub async fn next_frame(&mut self, within: Duration) -> Option<Frame> {
        if let Some(f) = self.unread.pop_front() {
            return Some(f);
        }
        self.read_one(within).await
    }

    async fn read_one(&mut self, within: Duration) -> Option<Frame> {
        if self.ended {
            return None;
        }
        let record = match tokio::time::timeout(within, self.receiver.recv()).await {
            Err(_) => return None,
            Ok(Ok(Some(record))) => record,
            Ok(Ok(None) | Err(_)) => {
                self.ended = true;
                return None;
            }
        };
        let frame = decode_frame(&record).unwrap().to_frame().unwrap();
        self.received.push(frame.clone());
        Some(frame)
    }

    /// Waits (up to 10 s) for the response to `req_id`; frames that arrive
    /// before it stay available to `next_frame`.
    pub async fn response(&mut self, req_id: &str) -> ResponseEnvelope {
        if let Some(pos) = self
            .unread
            .iter()
            .position(|f| matches!(f, Frame::Response(r) if r.req_id.as_str() == req_id))
        {
            let Some(Frame::Response(r)) = self.unread.remove(pos) else {
                unreachable!()
            };
            return r;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = self.read_one(left).await.unwrap_or_else(|| {
                panic!("no response to {req_id:?} (session ended: {})", self.ended)
            });
            match frame {
                Frame::Response(r) if r.req_id.as_str() == req_id => return r,
                other => self.unread.push_back(other),
            }
        }
    }

    /// Reads frames until none arrives for `quiet`, keeping them in
    /// `received`.
    pub async fn drain(&mut self, quiet: Duration) {
        while self.read_one(quiet).await.is_some() {}
    }

    /// Every response frame received so far.
    pub fn responses(&self) -> Vec<&ResponseEnvelope> {
        self.received
            .iter()
            .filter_map(|f| match f {
                Frame::Response(r) => Some(r),
                _ => None,
            })
            .collect()
    }
}

/// A loopback TCP relay to `target` that a test can cut: every relayed
/// connection is dropped at once, with no close record from either side.
pub struct Relay {
    pub addr: SocketAddr,
    cut: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = CancellationToken::new();
        let token = cut.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let (mut inbound, _) = tokio::select! {
                    _ = token.cancelled() => break,
                    a = listener.accept() => a.unwrap(),
                };
                let token = token.clone();
                conns.spawn(async move {
                    let mut outbound = TcpStream::connect(target).await.unwrap();
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
            conns.shutdown().await;
        });
        Self { addr, cut, task }
    }

    /// Drops every relayed connection.
    pub async fn cut(self) {
        self.cut.cancel();
        self.task.await.unwrap();
    }
}

/// A peer that drives the record layer itself over a stream it holds, so
/// a test decides exactly when it reads (a peer that stops reading stops
/// taking bytes from the stream).
pub struct ManualPeer<S> {
    pub id: NodeId,
    /// The transport close record, once it has arrived.
    pub transport_close: Option<capwire::transport::CloseReason>,
    stream: S,
    encoder: capwire::transport::RecordEncoder,
    decoder: capwire::transport::RecordDecoder,
    buf: bytes::BytesMut,
    _endpoint: Endpoint,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> ManualPeer<S> {
    fn with(endpoint: Endpoint, est: capwire::transport::Established<S>) -> Self {
        let id = endpoint.local_id();
        let (encoder, decoder) = endpoint.record_layer(est.session);
        Self {
            id,
            transport_close: None,
            stream: est.stream,
            encoder,
            decoder,
            buf: est.leftover,
            _endpoint: endpoint,
        }
    }

    /// Dials `node` over `stream` and sends a hello.
    pub async fn dial(stream: S, node: NodeId) -> Self {
        let mut peer = Self::dial_silent(stream, node).await;
        let manifest = bare_manifest(peer.id);
        peer.send(&record(&hello_frame(&manifest))).await;
        peer
    }

    /// Dials `node` over `stream`; sends nothing yet.
    pub async fn dial_silent(stream: S, node: NodeId) -> Self {
        let keypair = Keypair::generate().unwrap();
        let endpoint = Endpoint::new(
            keypair,
            TransportConfig::default(),
            ContactPolicy::AcceptAny,
        );
        let est = endpoint
            .handshake_initiator(stream, Some(node))
            .await
            .unwrap();
        Self::with(endpoint, est)
    }

    /// Sends an empty transport message (a keepalive).
    pub async fn keepalive(&mut self) {
        use tokio::io::AsyncWriteExt;
        self.encoder.keepalive().unwrap();
        self.stream.write_all(self.encoder.wire()).await.unwrap();
        self.encoder.consume_wire();
    }

    /// Answers `node`'s dial over `stream` and sends a hello.
    pub async fn answer(stream: S) -> Self {
        let keypair = Keypair::generate().unwrap();
        let manifest = bare_manifest(keypair.public());
        let endpoint = Endpoint::new(
            keypair,
            TransportConfig::default(),
            ContactPolicy::AcceptAny,
        );
        let est = endpoint.handshake_responder(stream).await.unwrap();
        let mut peer = Self::with(endpoint, est);
        peer.send(&record(&hello_frame(&manifest))).await;
        peer
    }

    /// Sends one record.
    pub async fn send(&mut self, record: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.encoder.push_record(record).unwrap();
        self.encoder.flush().unwrap();
        self.stream.write_all(self.encoder.wire()).await.unwrap();
        self.encoder.consume_wire();
    }

    /// Sends a control envelope.
    pub async fn control(&mut self, cap: &str, verb: &str, req_id: &str, args: &RawValue) {
        let req_id = if req_id.is_empty() {
            ReqId::EMPTY
        } else {
            ReqId::try_from(req_id).unwrap()
        };
        let mut out = Vec::new();
        encode_control(&mut out, cap, verb, &req_id, Some(30_000), args.as_bytes()).unwrap();
        self.send(&out).await;
    }

    /// Reads until nothing arrives for `quiet`; returns the frames.
    pub async fn read_for(&mut self, quiet: Duration) -> Vec<Frame> {
        use tokio::io::AsyncReadExt;
        let mut frames = Vec::new();
        loop {
            self.buf.reserve(64 * 1024);
            let n = match tokio::time::timeout(quiet, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return frames,
                Ok(Ok(0) | Err(_)) => return frames,
                Ok(Ok(n)) => n,
            };
            let _ = n;
            let mut records = Vec::new();
            let decoded = self.decoder.decode(&mut self.buf, &mut records);
            for r in records {
                frames.push(decode_frame(&r).unwrap().to_frame().unwrap());
            }
            match decoded {
                Err(_) => return frames,
                Ok(d) if d.close.is_some() => {
                    self.transport_close = d.close;
                    return frames;
                }
                Ok(_) => {}
            }
        }
    }
}
