//! A hand-rolled Noise XX (WIRE.md 1.3) over snow's primitives, for the
//! one thing no honest implementation lets a test do: send a static key
//! it has no secret for. A low-order point's Diffie-Hellman output is 32
//! zero bytes whatever the scalar, so the forger knows it and can finish
//! every other step of the handshake correctly; the only reason left for
//! the node to refuse is the key itself. The same code with a genuine key
//! (the control case) is accepted.

use std::time::Duration;

use capwire::envelope::{Frame, decode_frame};
use capwire::transport::{PROLOGUE, PROTOCOL_NAME};
use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash};
use tokio::io::AsyncWriteExt;

use crate::kit::wire::{Io, framed, read_message};

/// Every low-order point of Curve25519 (the seven of WIRE.md 1.3 and
/// SECURITY.md), each also with bit 255 set: 14 encodings. The last three
/// bases (`p - 1`, `p`, `p + 1`) are themselves non-canonical or on the
/// edge of the field.
pub fn low_order_encodings() -> Vec<[u8; 32]> {
    const BASE: [&str; 7] = [
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    ];
    let mut all = Vec::new();
    for b in BASE {
        let mut point = [0u8; 32];
        for (i, o) in point.iter_mut().enumerate() {
            *o = u8::from_str_radix(&b[2 * i..2 * i + 2], 16).unwrap();
        }
        all.push(point);
        let mut high = point;
        high[31] |= 0x80;
        all.push(high);
    }
    all
}

/// A static key the forger sends: a genuine one, or a point it has no
/// secret for (low order: every DH with it is zero).
pub enum Static {
    Genuine([u8; 32]),
    LowOrder([u8; 32]),
}

impl Static {
    fn public(&self) -> [u8; 32] {
        match self {
            Static::Genuine(secret) => {
                let mut dh = dh();
                dh.set(secret);
                dh.pubkey().try_into().unwrap()
            }
            Static::LowOrder(point) => *point,
        }
    }

    fn dh(&self, remote: &[u8]) -> [u8; 32] {
        match self {
            Static::Genuine(secret) => {
                let mut d = dh();
                d.set(secret);
                let mut out = [0u8; 32];
                d.dh(remote, &mut out).unwrap();
                out
            }
            Static::LowOrder(_) => [0u8; 32],
        }
    }
}

fn dh() -> Box<dyn Dh> {
    DefaultResolver.resolve_dh(&DHChoice::Curve25519).unwrap()
}

fn hash() -> Box<dyn Hash> {
    DefaultResolver.resolve_hash(&HashChoice::Blake2s).unwrap()
}

fn cipher(key: &[u8; 32]) -> Box<dyn Cipher> {
    let mut c = DefaultResolver
        .resolve_cipher(&CipherChoice::ChaChaPoly)
        .unwrap();
    c.set(key);
    c
}

fn ephemeral() -> Box<dyn Dh> {
    let mut rng = DefaultResolver.resolve_rng().unwrap();
    let mut e = dh();
    e.generate(&mut *rng).unwrap();
    e
}

fn edh(e: &dyn Dh, remote: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    e.dh(remote, &mut out).unwrap();
    out
}

/// Noise's SymmetricState.
struct Symmetric {
    ck: [u8; 32],
    h: [u8; 32],
    k: Option<[u8; 32]>,
    n: u64,
}

impl Symmetric {
    fn new() -> Self {
        let mut h = [0u8; 32];
        let mut hs = hash();
        hs.input(PROTOCOL_NAME.as_bytes());
        hs.result(&mut h);
        let mut s = Self {
            ck: h,
            h,
            k: None,
            n: 0,
        };
        s.mix_hash(PROLOGUE);
        s
    }

    fn mix_hash(&mut self, data: &[u8]) {
        let mut hs = hash();
        hs.input(&self.h);
        hs.input(data);
        hs.result(&mut self.h);
    }

    fn mix_key(&mut self, ikm: &[u8]) {
        let (mut ck, mut k) = ([0u8; 32], [0u8; 32]);
        hash().hkdf(&self.ck, ikm, 2, &mut ck, &mut k, &mut []);
        self.ck = ck;
        self.k = Some(k);
        self.n = 0;
    }

    fn encrypt_and_hash(&mut self, plaintext: &[u8]) -> Vec<u8> {
        let out = match &self.k {
            None => plaintext.to_vec(),
            Some(k) => {
                let mut out = vec![0u8; plaintext.len() + 16];
                cipher(k).encrypt(self.n, &self.h, plaintext, &mut out);
                self.n += 1;
                out
            }
        };
        self.mix_hash(&out);
        out
    }

    fn decrypt_and_hash(&mut self, ciphertext: &[u8]) -> Option<Vec<u8>> {
        let out = match &self.k {
            None => ciphertext.to_vec(),
            Some(k) => {
                let mut out = vec![0u8; ciphertext.len() - 16];
                cipher(k)
                    .decrypt(self.n, &self.h, ciphertext, &mut out)
                    .ok()?;
                self.n += 1;
                out
            }
        };
        self.mix_hash(ciphertext);
        Some(out)
    }

    /// (initiator to responder, responder to initiator).
    fn split(&self) -> ([u8; 32], [u8; 32]) {
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        hash().hkdf(&self.ck, &[], 2, &mut a, &mut b, &mut []);
        (a, b)
    }
}

/// How a forged handshake went.
#[derive(Debug, PartialEq, Eq)]
pub enum Forged {
    /// The node sent no (well-formed) message where the next one belongs:
    /// it aborted the handshake.
    Aborted,
    /// The handshake finished; the node's first transport message opened
    /// with the key it gave, and held this first frame.
    Accepted(Frame),
}

/// Opens the node's first transport message with `key` (counter 0) and
/// decodes its first record.
async fn first_frame(stream: &mut Io, key: &[u8; 32]) -> Forged {
    let Some(msg) = read_message(stream, Duration::from_secs(5)).await else {
        return Forged::Aborted;
    };
    let mut plain = vec![0u8; msg.len() - 16];
    cipher(key)
        .decrypt(0, &[], &msg, &mut plain)
        .expect("the node's first transport message opens with the forged key");
    assert_eq!(plain[0], crate::kit::wire::RECORD, "{plain:?}");
    let len = usize::from(u16::from_be_bytes([plain[1], plain[2]]));
    let frame = decode_frame(&plain[3..3 + len])
        .unwrap()
        .to_frame()
        .unwrap();
    Forged::Accepted(frame)
}

/// Plays the initiator against a node that accepts `stream`, sending `s`
/// as its static key in message 3.
pub async fn initiate(mut stream: Io, s: &Static) -> Forged {
    let mut ss = Symmetric::new();
    let e = ephemeral();
    ss.mix_hash(e.pubkey());
    ss.encrypt_and_hash(&[]);
    stream.write_all(&framed(e.pubkey())).await.unwrap();

    let Some(m2) = read_message(&mut stream, Duration::from_secs(5)).await else {
        return Forged::Aborted;
    };
    assert_eq!(m2.len(), 96, "message 2");
    let re = &m2[..32];
    ss.mix_hash(re);
    ss.mix_key(&edh(&*e, re));
    let rs = ss
        .decrypt_and_hash(&m2[32..80])
        .expect("the node's static key");
    ss.mix_key(&edh(&*e, &rs));
    ss.decrypt_and_hash(&m2[80..]).expect("message 2's payload");

    let mut m3 = ss.encrypt_and_hash(&s.public());
    ss.mix_key(&s.dh(re));
    m3.extend(ss.encrypt_and_hash(&[]));
    if stream.write_all(&framed(&m3)).await.is_err() {
        return Forged::Aborted;
    }
    let (_, from_node) = ss.split();
    first_frame(&mut stream, &from_node).await
}

/// Plays the responder for a node that dials over `stream`, sending `s`
/// as its static key in message 2.
pub async fn respond(mut stream: Io, s: &Static) -> Forged {
    let mut ss = Symmetric::new();
    let Some(m1) = read_message(&mut stream, Duration::from_secs(5)).await else {
        return Forged::Aborted;
    };
    assert_eq!(m1.len(), 32, "message 1");
    ss.mix_hash(&m1);
    ss.decrypt_and_hash(&[]);
    let e = ephemeral();
    ss.mix_hash(e.pubkey());
    let mut m2 = e.pubkey().to_vec();
    ss.mix_key(&edh(&*e, &m1));
    m2.extend(ss.encrypt_and_hash(&s.public()));
    ss.mix_key(&s.dh(&m1));
    m2.extend(ss.encrypt_and_hash(&[]));
    if stream.write_all(&framed(&m2)).await.is_err() {
        return Forged::Aborted;
    }

    let Some(m3) = read_message(&mut stream, Duration::from_secs(5)).await else {
        return Forged::Aborted;
    };
    if m3.len() != 64 {
        return Forged::Aborted;
    }
    let rs = ss
        .decrypt_and_hash(&m3[..48])
        .expect("the node's static key");
    ss.mix_key(&edh(&*e, &rs));
    ss.decrypt_and_hash(&m3[48..]).expect("message 3's payload");
    let (from_node, _) = ss.split();
    first_frame(&mut stream, &from_node).await
}
