//! The body of the `transport_open` fuzz target, shared with its
//! property-test twin (`tests/transport_open_twin.rs`): after a real
//! handshake, a receiver fed genuine, replayed, reordered, tampered, cut,
//! merged and made-up messages never panics, fails only with peer faults,
//! and never releases plaintext that the real sender did not seal at that
//! point of the stream.
//!
//! The first byte of an input picks the layer and its settings, the next
//! part (a 2-byte big-endian length and its bytes) is the sender's plan,
//! and the rest is the attacker's script:
//!
//! ```text
//! flags & 1      0: message by message through `TransportSession::open`;
//!                1: a byte stream through a `RecordDecoder`
//! flags & 2      (stream) the sender rekeys every second message
//! flags & 4      (stream) records are limited to 1024 bytes, else 1 MiB
//! flags >> 3     (stream) bytes per `decode` call: 0 = all, n = 37 * n
//! plan           (messages) plaintexts, each a 1-byte length and its bytes;
//!                (stream) 3-byte commands [op, a, b]: a record of
//!                u16(a, b) % 700 bytes, a record of 60000 + u16(a, b) %
//!                16384 bytes (split if over 65516), flush, keepalive,
//!                close (then nothing more); at most 256 KiB of records
//! script         ops on the sealed messages G[0..n] (see `Script`): the
//!                next one, G[a], G[a] with a byte flipped, G[a] cut
//!                short, raw bytes, G[a] and G[b] joined, all the rest
//! ```
//!
//! Keys and ephemerals are fixed, so that every input replays exactly.

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use capwire_transport::{
    CloseCode, CloseReason, EntropyError, EntropySource, Initiator, Keypair, RecordDecoder,
    RecordEncoder, Responder, TAG_LEN, TransportError, TransportSession,
};

/// Deterministic "randomness": every byte is the same.
struct Fixed(u8);

impl EntropySource for Fixed {
    fn try_fill(&self, dest: &mut [u8]) -> Result<(), EntropyError> {
        dest.fill(self.0);
        Ok(())
    }
}

/// A real handshake: (initiator's session, responder's session).
fn pair() -> (TransportSession, TransportSession) {
    static KEYS: OnceLock<(Keypair, Keypair)> = OnceLock::new();
    let (a, b) = KEYS.get_or_init(|| {
        (
            Keypair::from_secret_bytes([0x11; 32]),
            Keypair::from_secret_bytes([0x22; 32]),
        )
    });
    let (mut m1, mut m2, mut m3, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let i = Initiator::new(a, &Fixed(0x33))
        .and_then(|i| i.write_message(&[], &mut m1))
        .expect("message 1");
    let r = Responder::new(b, &Fixed(0x44))
        .and_then(|r| r.read_message(&m1, &mut p))
        .and_then(|r| r.write_message(&[], &mut m2))
        .expect("message 2");
    let i = i
        .read_message(&m2, &mut p)
        .and_then(|i| i.write_message(&[], &mut m3))
        .expect("message 3");
    let r = r.read_message(&m3, &mut p).expect("the handshake finishes");
    (i, r)
}

/// Splits one 2-byte-length-prefixed part off the front of `data`.
fn part(data: &[u8]) -> (&[u8], &[u8]) {
    if data.len() < 2 {
        return (&[], &[]);
    }
    let len = usize::from(u16::from_be_bytes([data[0], data[1]])).min(data.len() - 2);
    (&data[2..2 + len], &data[2 + len..])
}

/// A peer's bytes may only ever cause a protocol violation.
fn assert_peer_fault(e: &TransportError) {
    assert!(
        matches!(e, TransportError::PeerMisbehaved(_)),
        "a peer's bytes caused {e:?}"
    );
}

/// Reads the attacker's script: each op makes one delivery out of the
/// sealed messages.
struct Script<'a> {
    data: &'a [u8],
    cursor: usize,
}

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.data.split_first() else {
            return 0;
        };
        self.data = rest;
        b
    }

    /// The next delivery, or `None` at the end of the script.
    fn next(&mut self, sealed: &[Vec<u8>]) -> Option<Vec<u8>> {
        if self.data.is_empty() {
            return None;
        }
        let op = self.byte();
        let n = sealed.len();
        let pick = |i: u8| -> Vec<u8> {
            if n == 0 {
                Vec::new()
            } else {
                sealed[usize::from(i) % n].clone()
            }
        };
        Some(match op % 7 {
            0 => {
                let m = sealed.get(self.cursor).cloned().unwrap_or_default();
                self.cursor += 1;
                m
            }
            1 => pick(self.byte()),
            2 => {
                let mut m = pick(self.byte());
                let (at, x) = (self.byte(), self.byte());
                if !m.is_empty() {
                    let at = usize::from(at) * 257 % m.len();
                    m[at] ^= x;
                }
                m
            }
            3 => {
                let mut m = pick(self.byte());
                let cut = usize::from(self.byte()) + 1;
                m.truncate(m.len().saturating_sub(cut));
                m
            }
            4 => {
                let len = usize::from(self.byte()).min(self.data.len());
                let (raw, rest) = self.data.split_at(len);
                self.data = rest;
                raw.to_vec()
            }
            5 => {
                let mut m = pick(self.byte());
                m.extend_from_slice(&pick(self.byte()));
                m
            }
            _ => {
                let rest = sealed.get(self.cursor..).unwrap_or_default().concat();
                self.cursor = n;
                rest
            }
        })
    }
}

/// Checks one input. Panics only when a property is broken.
pub(crate) fn check(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (plan, script) = part(rest);
    let script = Script {
        data: script,
        cursor: 0,
    };
    if flags & 1 == 0 {
        messages(plan, script);
    } else {
        stream(flags, plan, script);
    }
}

/// Message by message: `open` accepts exactly the message sealed with the
/// nonce it expects, releases exactly its plaintext, and after one failure
/// accepts nothing.
fn messages(plan: &[u8], mut script: Script<'_>) {
    let (sender, receiver) = pair();
    let (mut sealer, _) = sender.split();
    let (_, mut opener) = receiver.split();
    let mut plaintexts = Vec::new();
    let mut sealed = Vec::new();
    let mut rest = plan;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (plain, tail) = tail.split_at(len);
        rest = tail;
        let mut m = Vec::new();
        sealer.seal(plain, &mut m).expect("a small plaintext seals");
        assert_eq!(m.len(), plain.len() + TAG_LEN);
        plaintexts.push(plain.to_vec());
        sealed.push(m);
    }
    while let Some(m) = script.next(&sealed) {
        let failed = opener.has_failed();
        let nonce = opener.nonce();
        let expected = usize::try_from(nonce).ok().filter(|&k| k < sealed.len());
        let genuine = expected.is_some_and(|k| sealed[k] == m);
        let mut out = b"kept".to_vec();
        match opener.open(&m, &mut out) {
            Ok(()) => {
                assert!(!failed, "a failed receiver opened a message");
                assert!(genuine, "a message the sender did not seal next was opened");
                let k = expected.expect("a genuine message has an index");
                assert_eq!(&out[..4], b"kept");
                assert_eq!(&out[4..], plaintexts[k], "the wrong plaintext came out");
                assert_eq!(opener.nonce(), nonce + 1);
            }
            Err(e) => {
                assert_peer_fault(&e);
                assert!(failed || !genuine, "the next real message was refused");
                assert_eq!(out, b"kept", "a refused message released plaintext");
                assert_eq!(opener.nonce(), nonce, "a refusal moved the nonce");
                assert!(opener.has_failed(), "a refusal did not end the session");
            }
        }
    }
}

/// Bytes of records one input may push (the rest of its plan is skipped),
/// to keep every run fast.
const MAX_PUSHED: usize = 256 * 1024;

/// A stream through a record decoder: the records released are always a
/// prefix of the records the sender pushed, and an honest stream releases
/// them all.
fn stream(flags: u8, plan: &[u8], mut script: Script<'_>) {
    let (sender, receiver) = pair();
    let (sealer, _) = sender.split();
    let (_, opener) = receiver.split();
    let max = if flags & 4 != 0 { 1024 } else { 1 << 20 };
    let rekey = (flags & 2 != 0).then_some(2);
    let mut encoder = RecordEncoder::new(sealer, max, rekey);
    let mut decoder = RecordDecoder::new(opener, max);

    let mut records: Vec<Vec<u8>> = Vec::new();
    let mut close: Option<CloseReason> = None;
    let mut pushed = 0;
    for cmd in plan.chunks_exact(3) {
        let n = usize::from(u16::from_be_bytes([cmd[1], cmd[2]]));
        let mark = records.len() as u8;
        match cmd[0] % 5 {
            0 | 1 => {
                let len = if cmd[0] % 5 == 0 {
                    n % 700
                } else {
                    60_000 + n % 16_384
                };
                if pushed + len > MAX_PUSHED {
                    continue;
                }
                pushed += len;
                let r: Vec<u8> = (0..len).map(|i| (i as u8) ^ mark).collect();
                match encoder.push_record(&r) {
                    Ok(()) => records.push(r),
                    Err(TransportError::RecordTooLarge { .. }) => assert!(len > max),
                    Err(e) => panic!("pushing a record failed: {e:?}"),
                }
            }
            2 => encoder.flush().expect("flush"),
            3 => encoder.keepalive().expect("keepalive"),
            _ => {
                let reason = "r".repeat(usize::from(cmd[1]) % 40);
                let code = CloseCode::from_byte(cmd[2]);
                encoder.close(code, &reason).expect("close");
                close = Some(CloseReason { code, reason });
                break;
            }
        }
    }
    encoder.flush().expect("flush");
    let wire = encoder.wire().to_vec();
    let sealed = split_messages(&wire);

    let mut attack = Vec::new();
    while let Some(m) = script.next(&sealed) {
        attack.extend_from_slice(&m);
    }
    let step = match usize::from(flags >> 3) {
        0 => attack.len().max(1),
        n => 37 * n,
    };
    let mut buf = BytesMut::new();
    let mut out: Vec<Bytes> = Vec::new();
    let mut result = Ok(());
    let mut got_close = None;
    for chunk in attack.chunks(step) {
        buf.extend_from_slice(chunk);
        // On an error, the records of the messages before the refused one
        // (authenticated, in this call) stay in `out`: the prefix check
        // below covers them.
        match decoder.decode(&mut buf, &mut out) {
            Ok(d) => got_close = d.close.or(got_close),
            Err(e) => {
                assert_peer_fault(&e);
                result = Err(e);
                break;
            }
        }
    }
    assert!(out.len() <= records.len(), "more records than were sent");
    for (got, sent) in out.iter().zip(&records) {
        assert_eq!(
            got.as_ref(),
            sent.as_slice(),
            "a record the sender did not send"
        );
    }
    let honest = wire.starts_with(&attack);
    if honest {
        assert!(result.is_ok(), "an honest stream was refused: {result:?}");
    }
    if attack == wire {
        assert_eq!(out.len(), records.len(), "an honest stream lost records");
        assert_eq!(got_close, close, "the close record changed");
    }
    if result.is_err() {
        // Any error is final.
        let mut more = BytesMut::from(&wire[..]);
        let mark = out.len();
        assert!(decoder.decode(&mut more, &mut out).is_err());
        assert_eq!(out.len(), mark);
    }
}

/// The sealed messages of `wire`, each with its length prefix.
fn split_messages(wire: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = wire;
    while rest.len() >= 2 {
        let len = 2 + usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        out.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    out
}
