//! The baselines' wire, shared by the benches: a TCP connection carrying
//! 2-byte length-prefixed messages, in clear (raw TCP) or as Noise
//! transport messages of the snow crate after an XX handshake
//! (`Noise_XX_25519_ChaChaPoly_BLAKE2s`, capwire's prologue), written the
//! way a tokio user would: one `write_all` per Noise message, raw TCP
//! through a `BufWriter` flushed when about to wait (so it batches: an
//! upper bound), a 64 KiB `BufReader` on the receiving side.
#![allow(dead_code)]

use capwire::transport::{PROLOGUE, PROTOCOL_NAME};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub(crate) fn snow_builder(secret: &[u8]) -> snow::Builder<'_> {
    snow::Builder::new(PROTOCOL_NAME.parse().unwrap())
        .local_private_key(secret)
        .unwrap()
        .prologue(PROLOGUE)
        .unwrap()
}

pub(crate) async fn write_framed(s: &mut TcpStream, msg: &[u8]) {
    let mut framed = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(msg);
    s.write_all(&framed).await.unwrap();
}

pub(crate) async fn read_framed(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf).await.unwrap();
    buf
}

/// The Noise XX handshake, unbuffered, as the transport bench does it.
pub(crate) async fn snow_handshake(s: &mut TcpStream, initiator: bool) -> snow::TransportState {
    let key = snow_builder(&[0; 32]).generate_keypair().unwrap().private;
    let mut out = vec![0u8; 65535];
    let hs = if initiator {
        let mut hs = snow_builder(&key).build_initiator().unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        write_framed(s, &out[..n]).await;
        let msg = read_framed(s).await;
        hs.read_message(&msg, &mut out).unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        write_framed(s, &out[..n]).await;
        hs
    } else {
        let mut hs = snow_builder(&key).build_responder().unwrap();
        let msg = read_framed(s).await;
        hs.read_message(&msg, &mut out).unwrap();
        let n = hs.write_message(&[], &mut out).unwrap();
        write_framed(s, &out[..n]).await;
        let msg = read_framed(s).await;
        hs.read_message(&msg, &mut out).unwrap();
        hs
    };
    hs.into_transport_mode().unwrap()
}

/// One end of a baseline connection.
pub(crate) struct Wire {
    r: BufReader<OwnedReadHalf>,
    w: BufWriter<OwnedWriteHalf>,
    noise: Option<Box<snow::TransportState>>,
    out: Vec<u8>,
    inb: Vec<u8>,
}

impl Wire {
    pub(crate) async fn open(mut s: TcpStream, noise: bool, initiator: bool) -> Self {
        s.set_nodelay(true).unwrap();
        let noise = if noise {
            Some(Box::new(snow_handshake(&mut s, initiator).await))
        } else {
            None
        };
        let (r, w) = s.into_split();
        Self {
            r: BufReader::with_capacity(64 * 1024, r),
            w: BufWriter::with_capacity(64 * 1024, w),
            noise,
            out: vec![0u8; 2 + 65535],
            inb: Vec::new(),
        }
    }

    /// snow: one `write_all` per message; raw: into the `BufWriter`.
    pub(crate) async fn send(&mut self, payload: &[u8]) {
        match &mut self.noise {
            Some(t) => {
                let n = t.write_message(payload, &mut self.out[2..]).unwrap();
                self.out[..2].copy_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
                self.w
                    .get_mut()
                    .write_all(&self.out[..2 + n])
                    .await
                    .unwrap();
            }
            None => {
                let len = u16::try_from(payload.len()).unwrap().to_be_bytes();
                self.w.write_all(&len).await.unwrap();
                self.w.write_all(payload).await.unwrap();
            }
        }
    }

    pub(crate) async fn flush(&mut self) {
        self.w.flush().await.unwrap();
    }

    /// Whether a message may be waiting in the read buffer.
    pub(crate) fn buffered(&self) -> bool {
        !self.r.buffer().is_empty()
    }

    /// The next message's payload into `into`; false at the end.
    pub(crate) async fn recv(&mut self, into: &mut Vec<u8>) -> bool {
        let mut len = [0u8; 2];
        if self.r.read_exact(&mut len).await.is_err() {
            return false;
        }
        let n = usize::from(u16::from_be_bytes(len));
        match &mut self.noise {
            Some(t) => {
                self.inb.resize(n, 0);
                if self.r.read_exact(&mut self.inb).await.is_err() {
                    return false;
                }
                into.resize(n, 0);
                let p = t.read_message(&self.inb, into).unwrap();
                into.truncate(p);
            }
            None => {
                into.resize(n, 0);
                if self.r.read_exact(into).await.is_err() {
                    return false;
                }
            }
        }
        true
    }
}

impl Wire {
    /// Sends `n` messages of `payload` with up to `window` unanswered,
    /// reading one answer for each; flushes only when about to wait.
    pub(crate) async fn pipelined(&mut self, payload: &[u8], n: u64, window: u64) {
        let mut msg = Vec::new();
        let (mut sent, mut done) = (0u64, 0u64);
        while done < n {
            while sent - done < window && sent < n {
                self.send(payload).await;
                sent += 1;
            }
            if !self.buffered() {
                self.flush().await;
            }
            assert!(self.recv(&mut msg).await);
            done += 1;
        }
    }
}
