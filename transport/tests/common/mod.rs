//! Shared test helpers: endpoints, connected pairs, and an independent
//! implementation of the capwire wire format built on `snow`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use capwire_transport::{
    Connection, ContactPolicy, Endpoint, Keypair, PROLOGUE, PROTOCOL_NAME, TransportConfig,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

pub fn endpoint(config: TransportConfig, policy: ContactPolicy) -> Endpoint {
    Endpoint::new(Keypair::generate().unwrap(), config, policy)
}

pub fn default_endpoint() -> Endpoint {
    endpoint(TransportConfig::default(), ContactPolicy::AcceptAny)
}

/// Two connected endpoints over an in-memory pair: (client side, server side).
pub async fn connected(client: &Endpoint, server: &Endpoint) -> (Connection, Connection) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let server = server.clone();
    let accept = tokio::spawn(async move { server.accept(b).await });
    let c = client.connect(a, None).await.unwrap();
    let s = accept.await.unwrap().unwrap();
    (c, s)
}

pub async fn pair(config: TransportConfig) -> (Connection, Connection) {
    let a = endpoint(config.clone(), ContactPolicy::AcceptAny);
    let b = endpoint(config, ContactPolicy::AcceptAny);
    connected(&a, &b).await
}

pub fn duplex() -> (DuplexStream, DuplexStream) {
    tokio::io::duplex(256 * 1024)
}

// ---------------------------------------------------------------------------
// The wire format re-implemented around snow, following WIRE.md section 1,
// without any of the crate's own framing code.

pub const RECORD: u8 = 0x01;
pub const FIRST: u8 = 0x02;
pub const NEXT: u8 = 0x03;
pub const CLOSE: u8 = 0x04;
pub const REKEY: u8 = 0x05;
pub const MAX_PLAINTEXT: usize = 65535 - 16;

pub fn snow_builder(secret: &[u8; 32]) -> snow::Builder<'_> {
    snow::Builder::new(PROTOCOL_NAME.parse().unwrap())
        .local_private_key(secret)
        .unwrap()
        .prologue(PROLOGUE)
        .unwrap()
}

pub async fn write_msg<S: AsyncWrite + Unpin>(s: &mut S, msg: &[u8]) -> std::io::Result<()> {
    let mut framed = Vec::with_capacity(2 + msg.len());
    framed.extend_from_slice(&u16::try_from(msg.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(msg);
    s.write_all(&framed).await?;
    s.flush().await
}

/// Reads one length-prefixed message; `None` at a clean end of stream.
pub async fn read_msg<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match s.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut msg).await?;
    Ok(Some(msg))
}

/// What the snow-based peer received.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    Record(Vec<u8>),
    Close(u8, String),
}

/// A peer speaking the capwire wire format through snow.
pub struct SnowPeer<S> {
    pub stream: S,
    pub transport: snow::TransportState,
    partial: Option<(Vec<u8>, usize)>,
    queue: std::collections::VecDeque<Got>,
    /// REKEY chunks received (and acted on).
    pub rekeys: usize,
    /// Transport messages received.
    pub messages: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> SnowPeer<S> {
    pub async fn connect(mut stream: S, secret: &[u8; 32]) -> Self {
        let mut hs = snow_builder(secret).build_initiator().unwrap();
        let mut buf = vec![0u8; 65535];
        let n = hs.write_message(&[], &mut buf).unwrap();
        write_msg(&mut stream, &buf[..n]).await.unwrap();
        let m2 = read_msg(&mut stream).await.unwrap().unwrap();
        hs.read_message(&m2, &mut buf).unwrap();
        let n = hs.write_message(&[], &mut buf).unwrap();
        write_msg(&mut stream, &buf[..n]).await.unwrap();
        Self::new(stream, hs.into_transport_mode().unwrap())
    }

    pub async fn accept(mut stream: S, secret: &[u8; 32]) -> Self {
        let mut hs = snow_builder(secret).build_responder().unwrap();
        let mut buf = vec![0u8; 65535];
        let m1 = read_msg(&mut stream).await.unwrap().unwrap();
        hs.read_message(&m1, &mut buf).unwrap();
        let n = hs.write_message(&[], &mut buf).unwrap();
        write_msg(&mut stream, &buf[..n]).await.unwrap();
        let m3 = read_msg(&mut stream).await.unwrap().unwrap();
        hs.read_message(&m3, &mut buf).unwrap();
        Self::new(stream, hs.into_transport_mode().unwrap())
    }

    fn new(stream: S, transport: snow::TransportState) -> Self {
        Self {
            stream,
            transport,
            partial: None,
            queue: Default::default(),
            rekeys: 0,
            messages: 0,
        }
    }

    pub fn remote_static(&self) -> [u8; 32] {
        self.transport
            .get_remote_static()
            .unwrap()
            .try_into()
            .unwrap()
    }

    /// Seals one plaintext (at most 65519 bytes) and writes it.
    pub async fn send_plaintext(&mut self, plain: &[u8]) {
        let mut out = vec![0u8; plain.len() + 16];
        let n = self.transport.write_message(plain, &mut out).unwrap();
        write_msg(&mut self.stream, &out[..n]).await.unwrap();
    }

    /// Sends records, one message each, splitting those that do not fit
    /// (FIRST with the total length, then NEXT parts, one per message).
    pub async fn send_records(&mut self, records: &[&[u8]]) {
        for record in records {
            if record.len() + 3 <= MAX_PLAINTEXT {
                let mut plain = vec![RECORD];
                plain.extend_from_slice(&u16::try_from(record.len()).unwrap().to_be_bytes());
                plain.extend_from_slice(record);
                self.send_plaintext(&plain).await;
                continue;
            }
            let first_len = MAX_PLAINTEXT - 3 - 4;
            let mut plain = vec![FIRST];
            plain.extend_from_slice(&u16::try_from(4 + first_len).unwrap().to_be_bytes());
            plain.extend_from_slice(&u32::try_from(record.len()).unwrap().to_be_bytes());
            plain.extend_from_slice(&record[..first_len]);
            self.send_plaintext(&plain).await;
            for part in record[first_len..].chunks(MAX_PLAINTEXT - 3) {
                let mut plain = vec![NEXT];
                plain.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
                plain.extend_from_slice(part);
                self.send_plaintext(&plain).await;
            }
        }
    }

    pub async fn send_close(&mut self, code: u8, reason: &str) {
        let mut plain = vec![CLOSE];
        plain.extend_from_slice(&u16::try_from(1 + reason.len()).unwrap().to_be_bytes());
        plain.push(code);
        plain.extend_from_slice(reason.as_bytes());
        self.send_plaintext(&plain).await;
    }

    /// The next record or close; `None` at end of stream.
    pub async fn recv(&mut self) -> Option<Got> {
        loop {
            if let Some(got) = self.queue.pop_front() {
                return Some(got);
            }
            let msg = read_msg(&mut self.stream).await.unwrap()?;
            self.messages += 1;
            let mut plain = vec![0u8; msg.len()];
            let n = self.transport.read_message(&msg, &mut plain).unwrap();
            plain.truncate(n);
            let mut rest = &plain[..];
            while !rest.is_empty() {
                let kind = rest[0];
                let len = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
                let body = &rest[3..3 + len];
                rest = &rest[3 + len..];
                match kind {
                    RECORD => {
                        assert!(self.partial.is_none());
                        self.queue.push_back(Got::Record(body.to_vec()));
                    }
                    FIRST => {
                        let total = u32::from_be_bytes(body[..4].try_into().unwrap()) as usize;
                        self.partial = Some((body[4..].to_vec(), total));
                    }
                    NEXT => {
                        let (mut record, total) = self.partial.take().unwrap();
                        record.extend_from_slice(body);
                        assert!(record.len() <= total);
                        if record.len() == total {
                            self.queue.push_back(Got::Record(record));
                        } else {
                            self.partial = Some((record, total));
                        }
                    }
                    CLOSE => self.queue.push_back(Got::Close(
                        body[0],
                        String::from_utf8(body[1..].to_vec()).unwrap(),
                    )),
                    REKEY => {
                        assert!(rest.is_empty(), "REKEY is the last chunk");
                        self.transport.rekey_incoming();
                        self.rekeys += 1;
                    }
                    other => panic!("unknown chunk type {other}"),
                }
            }
        }
    }

    pub async fn recv_record(&mut self) -> Vec<u8> {
        match self.recv().await {
            Some(Got::Record(r)) => r,
            other => panic!("expected a record, got {other:?}"),
        }
    }
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ---------------------------------------------------------------------------
// A man in the middle that sees whole messages.

/// What the relay does with one message from the client.
#[derive(Debug)]
pub enum Out {
    ToServer(Vec<u8>),
    ToClient(Vec<u8>),
}

/// Relays messages between `client_side` and `server_side`. Every message
/// from the client (index 0 is handshake message 1, index 1 is message 3,
/// transport messages follow) goes through `tamper`; messages from the
/// server pass unchanged.
pub fn relay<F>(client_side: DuplexStream, server_side: DuplexStream, mut tamper: F)
where
    F: FnMut(usize, Vec<u8>) -> Vec<Out> + Send + 'static,
{
    let (mut cr, mut cw) = tokio::io::split(client_side);
    let (mut sr, mut sw) = tokio::io::split(server_side);
    let (to_client, mut to_client_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let from_server = to_client.clone();
    tokio::spawn(async move {
        while let Ok(Some(m)) = read_msg(&mut sr).await {
            if from_server.send(m).is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(m) = to_client_rx.recv().await {
            if write_msg(&mut cw, &m).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    });
    tokio::spawn(async move {
        let mut index = 0;
        while let Ok(Some(m)) = read_msg(&mut cr).await {
            for out in tamper(index, m) {
                match out {
                    Out::ToServer(m) => {
                        let _ = write_msg(&mut sw, &m).await;
                    }
                    Out::ToClient(m) => {
                        let _ = to_client.send(m);
                    }
                }
            }
            index += 1;
        }
        let _ = sw.shutdown().await;
    });
}

/// Two endpoints connected through a relay: (client, server).
pub async fn connected_via<F>(
    client: &Endpoint,
    server: &Endpoint,
    tamper: F,
) -> (Connection, Connection)
where
    F: FnMut(usize, Vec<u8>) -> Vec<Out> + Send + 'static,
{
    let (c, c_relay) = duplex();
    let (s_relay, s) = duplex();
    relay(c_relay, s_relay, tamper);
    let server = server.clone();
    let accept = tokio::spawn(async move { server.accept(s).await });
    let client = client.connect(c, None).await.unwrap();
    let server = accept.await.unwrap().unwrap();
    (client, server)
}
