//! The body of the `handshake_responder` fuzz target, shared with its
//! property-test twin (`tests/handshake_responder_twin.rs`): a responder
//! fed arbitrary bytes as Noise messages 1 and 3 never panics and fails
//! only with typed errors that leave the payload buffer as it was; it
//! finishes only on exactly the message 3 the real initiator would send,
//! and then names the initiator by its canonical key.
//!
//! The first byte of an input picks the scenario, the rest is up to five
//! parts, each a 2-byte big-endian length and its bytes (missing parts are
//! empty):
//!
//! ```text
//! flags & 3 = 0  message 1 = part 0, message 3 = part 1 (both raw bytes)
//! flags & 3 = 1  a real message 1 (payload part 0), message 3 = part 1
//! flags & 3 = 2, 3
//!                a real handshake: payloads parts 0 (message 1), 2
//!                (message 2) and 1 (message 3); part 3 tampers with
//!                message 1, part 4 with message 3 (see `tamper`)
//! flags & 4      the initiator sends its static key with bit 255 set
//! flags & 8      the initiator uses another prologue
//! ```
//!
//! Keys and ephemerals are fixed, so that every input replays exactly.

use std::sync::OnceLock;

use capwire_envelope::NodeId;
use capwire_transport::{
    EntropyError, EntropySource, Initiator, Keypair, MAX_MESSAGE_LEN, Responder,
    ResponderAwaitingFinish, TransportError, TransportSession, canonical_node_id,
};

/// Deterministic "randomness": every byte is the same.
struct Fixed(u8);

impl EntropySource for Fixed {
    fn try_fill(&self, dest: &mut [u8]) -> Result<(), EntropyError> {
        dest.fill(self.0);
        Ok(())
    }
}

fn responder_keys() -> &'static Keypair {
    static KEYS: OnceLock<Keypair> = OnceLock::new();
    KEYS.get_or_init(|| Keypair::from_secret_bytes([0x11; 32]))
}

fn initiator_keys(high_bit: bool) -> &'static Keypair {
    static KEYS: OnceLock<[Keypair; 2]> = OnceLock::new();
    let [plain, high] = KEYS.get_or_init(|| {
        let kp = Keypair::from_secret_bytes([0x22; 32]);
        let mut encoding = *kp.public().as_bytes();
        encoding[31] |= 0x80;
        let high = kp
            .clone()
            .with_public_encoding_for_testing(encoding)
            .expect("bit 255 names the same key");
        [kp, high]
    });
    if high_bit { high } else { plain }
}

/// Splits `data` into up to `N` parts, each a 2-byte big-endian length
/// (cut to what is left) and its bytes.
fn parts<const N: usize>(mut data: &[u8]) -> [&[u8]; N] {
    let mut out = [&[][..]; N];
    for part in &mut out {
        if data.len() < 2 {
            break;
        }
        let len = usize::from(u16::from_be_bytes([data[0], data[1]])).min(data.len() - 2);
        *part = &data[2..2 + len];
        data = &data[2 + len..];
    }
    out
}

/// A changed copy of `msg`: `spec` empty leaves it alone; otherwise
/// `spec[0] % 3` picks XOR-ing `spec[1..]` over its start, cutting it to
/// `spec[1]` bytes fewer (at least one), or appending `spec[1..]`.
fn tamper(msg: &[u8], spec: &[u8]) -> Vec<u8> {
    let mut out = msg.to_vec();
    let Some((&op, rest)) = spec.split_first() else {
        return out;
    };
    match op % 3 {
        0 => {
            for (o, x) in out.iter_mut().zip(rest) {
                *o ^= x;
            }
        }
        1 => {
            let cut = usize::from(rest.first().copied().unwrap_or(0)).max(1);
            out.truncate(msg.len().saturating_sub(cut));
        }
        _ => out.extend_from_slice(rest),
    }
    out
}

/// A peer's bytes may only ever cause a protocol violation.
fn assert_peer_fault(e: &TransportError) {
    assert!(
        matches!(e, TransportError::PeerMisbehaved(_)),
        "a peer's bytes caused {e:?}"
    );
}

/// Checks one input. Panics only when a property is broken.
pub(crate) fn check(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let [p0, p1, p2, p3, p4] = parts::<5>(rest);
    let initiator = initiator_keys(flags & 4 != 0);
    let prologue: &[u8] = if flags & 8 != 0 {
        b"capwire/0"
    } else {
        b"capwire/1"
    };
    let responder = Responder::new(responder_keys(), &Fixed(0x33)).expect("entropy never fails");
    match flags & 3 {
        0 => raw(responder, p0, p1),
        1 => real_first(responder, initiator, prologue, p0, p1),
        _ => real(responder, initiator, prologue, [p0, p2, p1], p3, p4),
    }
}

/// Reads `m1` into a responder and answers it; `None` when either step
/// fails (with a peer fault, the payload untouched).
fn answer(
    responder: Responder,
    m1: &[u8],
    m2_payload: &[u8],
) -> Option<(ResponderAwaitingFinish, Vec<u8>, Vec<u8>)> {
    let mut payload = b"kept".to_vec();
    let ready = match responder.read_message(m1, &mut payload) {
        Ok(ready) => ready,
        Err(e) => {
            assert_peer_fault(&e);
            assert_eq!(payload, b"kept", "a refused message 1 left bytes behind");
            return None;
        }
    };
    assert_eq!(&payload[..4], b"kept");
    assert_eq!(
        &payload[4..],
        &m1[32..],
        "message 1's payload is sent in clear"
    );
    let mut m2 = b"head".to_vec();
    match ready.write_message(m2_payload, &mut m2) {
        Ok(waiting) => {
            assert_eq!(&m2[..4], b"head");
            Some((waiting, m2[4..].to_vec(), payload[4..].to_vec()))
        }
        Err(TransportError::RecordTooLarge { .. }) => {
            assert!(m2_payload.len() + 96 > MAX_MESSAGE_LEN);
            None
        }
        Err(e) => {
            // A low-order ephemeral key in message 1.
            assert_peer_fault(&e);
            assert_eq!(m2, b"head", "a refused message 2 left bytes behind");
            None
        }
    }
}

/// Reads `m3`; on failure checks the error and that no payload came out.
fn finish(waiting: ResponderAwaitingFinish, m3: &[u8]) -> Option<(TransportSession, Vec<u8>)> {
    let mut payload = b"kept".to_vec();
    match waiting.read_message(m3, &mut payload) {
        Ok(session) => {
            assert_eq!(&payload[..4], b"kept");
            Some((session, payload[4..].to_vec()))
        }
        Err(e) => {
            assert_peer_fault(&e);
            assert_eq!(payload, b"kept", "a refused message 3 released plaintext");
            None
        }
    }
}

fn raw(responder: Responder, m1: &[u8], m3: &[u8]) {
    if let Some((waiting, _, _)) = answer(responder, m1, &[]) {
        // Whoever sent message 1 may know its secret: an accepted message
        // 3 is no break here, only the error shape is checked.
        let _ = finish(waiting, m3);
    }
}

fn real_first(responder: Responder, initiator: &Keypair, prologue: &[u8], p0: &[u8], m3: &[u8]) {
    let mut m1 = Vec::new();
    let Ok(sent) = Initiator::with_prologue(initiator, prologue, &Fixed(0x44))
        .expect("entropy never fails")
        .write_message(p0, &mut m1)
    else {
        return;
    };
    let Some((waiting, m2, _)) = answer(responder, &m1, &[]) else {
        panic!("a real message 1 was refused");
    };
    let Some((session, payload)) = finish(waiting, m3) else {
        return;
    };
    // Only the real initiator can have written it: the same bytes.
    let mut ignored = Vec::new();
    let ready = sent
        .read_message(&m2, &mut ignored)
        .expect("message 3 was accepted though no initiator could have written it");
    let mut genuine = Vec::new();
    ready
        .write_message(&payload, &mut genuine)
        .expect("the real message 3 is written");
    assert_eq!(genuine, m3, "a forged message 3 was accepted");
    assert_eq!(session.remote(), initiator.public());
}

fn real(
    responder: Responder,
    initiator: &Keypair,
    prologue: &[u8],
    [p1, p2, p3]: [&[u8]; 3],
    tamper1: &[u8],
    tamper3: &[u8],
) {
    if p2.len() + 96 > MAX_MESSAGE_LEN {
        return;
    }
    let mut m1 = Vec::new();
    let Ok(sent) = Initiator::with_prologue(initiator, prologue, &Fixed(0x44))
        .expect("entropy never fails")
        .write_message(p1, &mut m1)
    else {
        return;
    };
    let m1_seen = tamper(&m1, tamper1);
    let Some((waiting, m2, p1_seen)) = answer(responder, &m1_seen, p2) else {
        assert_ne!(m1_seen, m1, "a real message 1 was refused");
        return;
    };
    let mut p2_seen = Vec::new();
    let ready = match sent.read_message(&m2, &mut p2_seen) {
        Ok(ready) => ready,
        Err(e) => {
            assert_peer_fault(&e);
            assert!(
                m1_seen != m1 || prologue != b"capwire/1",
                "a real message 2 was refused"
            );
            return;
        }
    };
    assert_eq!(
        m1_seen, m1,
        "message 2 was accepted after message 1 changed"
    );
    assert_eq!(prologue, b"capwire/1", "the prologues differ");
    assert_eq!(p1_seen, p1);
    assert_eq!(p2_seen, p2);
    let mut m3 = Vec::new();
    let Ok(mut initiator_session) = ready.write_message(p3, &mut m3) else {
        return;
    };
    let m3_seen = tamper(&m3, tamper3);
    let Some((mut session, p3_seen)) = finish(waiting, &m3_seen) else {
        assert_ne!(m3_seen, m3, "a real message 3 was refused");
        return;
    };
    assert_eq!(m3_seen, m3, "a changed message 3 was accepted");
    assert_eq!(p3_seen, p3);
    assert_eq!(session.remote(), initiator.public());
    assert_eq!(
        canonical_node_id(&NodeId::from_bytes(session.remote_static_as_sent())),
        initiator.public()
    );
    assert_eq!(session.handshake_hash(), initiator_session.handshake_hash());
    // Both directions carry data.
    let (mut sealed, mut opened) = (Vec::new(), Vec::new());
    initiator_session.seal(b"ping", &mut sealed).expect("seals");
    session.open(&sealed, &mut opened).expect("opens");
    assert_eq!(opened, b"ping");
    sealed.clear();
    opened.clear();
    session.seal(b"pong", &mut sealed).expect("seals");
    initiator_session.open(&sealed, &mut opened).expect("opens");
    assert_eq!(opened, b"pong");
}
