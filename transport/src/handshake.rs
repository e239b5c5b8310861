//! The Noise XX handshake as a chain of states that consume themselves.
//!
//! ```text
//! XX:
//!   -> e
//!   <- e, ee, s, es
//!   -> s, se
//! ```
//!
//! Initiator: [`Initiator`] → `write_message` → [`InitiatorAwaitingReply`] →
//! `read_message` → [`InitiatorReadyToFinish`] → `write_message` →
//! [`TransportSession`].
//!
//! Responder: [`Responder`] → `read_message` → [`ResponderReadyToReply`] →
//! `write_message` → [`ResponderAwaitingFinish`] → `read_message` →
//! [`TransportSession`].

use std::fmt;

use capwire_envelope::NodeId;
use x25519_dalek::{PublicKey, ReusableSecret, StaticSecret};

use crate::error::{TransportError, Violation};
use crate::keys::{Drawn, EntropySource, Keypair, canonical_node_id, secret_bytes};
use crate::session::TransportSession;
use crate::symmetric::{MAX_MESSAGE_LEN, SymmetricState, TAGLEN};

/// The Noise protocol name, hashed into the initial state.
pub const PROTOCOL_NAME: &str = "Noise_XX_25519_ChaChaPoly_BLAKE2s";

/// The prologue of capwire protocol version 1: the ASCII bytes `capwire/1`.
pub const PROLOGUE: &[u8] = b"capwire/1";

const DHLEN: usize = 32;

/// Length of message 1 with an empty payload: `e`.
pub const MESSAGE_1_LEN: usize = DHLEN;
/// Length of message 2 with an empty payload: `e`, encrypted `s`, tag.
pub const MESSAGE_2_LEN: usize = DHLEN + DHLEN + TAGLEN + TAGLEN;
/// Length of message 3 with an empty payload: encrypted `s`, tag.
pub const MESSAGE_3_LEN: usize = DHLEN + TAGLEN + TAGLEN;

/// Everything both roles carry through the handshake.
struct Core {
    ss: SymmetricState,
    s: StaticSecret,
    s_pub: [u8; DHLEN],
    e: ReusableSecret,
    e_pub: [u8; DHLEN],
}

impl Core {
    fn new(
        keypair: &Keypair,
        prologue: &[u8],
        entropy: &dyn EntropySource,
    ) -> Result<Self, TransportError> {
        let drawn = secret_bytes(entropy)?;
        let e = ReusableSecret::random_from_rng(Drawn(&drawn));
        let e_pub = PublicKey::from(&e).to_bytes();
        let mut ss = SymmetricState::initialize(PROTOCOL_NAME.as_bytes());
        ss.mix_hash(prologue);
        Ok(Self {
            ss,
            s: keypair.secret().clone(),
            s_pub: keypair.encoding(),
            e,
            e_pub,
        })
    }

    /// `MixKey(DH(ours, theirs))`, refusing a non-contributory result.
    fn mix_dh_ephemeral(&mut self, theirs: &[u8; DHLEN]) -> Result<(), TransportError> {
        let shared = self.e.diffie_hellman(&PublicKey::from(*theirs));
        if !shared.was_contributory() {
            return Err(Violation::LowOrderKey.into());
        }
        self.ss.mix_key(shared.as_bytes());
        Ok(())
    }

    fn mix_dh_static(&mut self, theirs: &[u8; DHLEN]) -> Result<(), TransportError> {
        let shared = self.s.diffie_hellman(&PublicKey::from(*theirs));
        if !shared.was_contributory() {
            return Err(Violation::LowOrderKey.into());
        }
        self.ss.mix_key(shared.as_bytes());
        Ok(())
    }

    fn write_payload(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        self.ss.encrypt_and_hash(payload, out)
    }
}

fn check_len(msg: &[u8], min: usize) -> Result<(), TransportError> {
    if msg.len() > MAX_MESSAGE_LEN {
        return Err(Violation::MessageLength.into());
    }
    if msg.len() < min {
        return Err(Violation::ShortMessage.into());
    }
    Ok(())
}

fn check_room(start: usize, out: &[u8]) -> Result<(), TransportError> {
    let len = out.len() - start;
    if len > MAX_MESSAGE_LEN {
        return Err(TransportError::RecordTooLarge {
            len,
            max: MAX_MESSAGE_LEN,
        });
    }
    Ok(())
}

fn key(bytes: &[u8]) -> [u8; DHLEN] {
    let mut k = [0u8; DHLEN];
    k.copy_from_slice(&bytes[..DHLEN]);
    k
}

macro_rules! opaque_debug {
    ($($t:ident),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )*};
}

opaque_debug!(
    Initiator,
    InitiatorAwaitingReply,
    Responder,
    ResponderReadyToReply,
    ResponderAwaitingFinish
);

/// The initiator before message 1.
pub struct Initiator {
    core: Core,
}

impl Initiator {
    /// Starts a handshake with the capwire prologue ([`PROLOGUE`]), drawing
    /// the ephemeral key from `entropy`.
    ///
    /// # Errors
    /// [`TransportError::Rng`] when `entropy` fails.
    pub fn new(keypair: &Keypair, entropy: &dyn EntropySource) -> Result<Self, TransportError> {
        Self::with_prologue(keypair, PROLOGUE, entropy)
    }

    /// Starts a handshake with another prologue (both sides must use the
    /// same; capwire always uses [`PROLOGUE`]).
    ///
    /// # Errors
    /// [`TransportError::Rng`] when `entropy` fails.
    pub fn with_prologue(
        keypair: &Keypair,
        prologue: &[u8],
        entropy: &dyn EntropySource,
    ) -> Result<Self, TransportError> {
        Ok(Self {
            core: Core::new(keypair, prologue, entropy)?,
        })
    }

    /// Appends message 1 (`-> e`, then the payload in clear) to `out`.
    ///
    /// # Errors
    /// [`TransportError::RecordTooLarge`] when the message would exceed
    /// 65535 bytes.
    pub fn write_message(
        mut self,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<InitiatorAwaitingReply, TransportError> {
        let start = out.len();
        let e_pub = self.core.e_pub;
        out.extend_from_slice(&e_pub);
        self.core.ss.mix_hash(&e_pub);
        let result = self
            .core
            .write_payload(payload, out)
            .and_then(|()| check_room(start, out));
        if let Err(e) = result {
            out.truncate(start);
            return Err(e);
        }
        Ok(InitiatorAwaitingReply { core: self.core })
    }
}

/// The initiator after message 1, waiting for message 2.
pub struct InitiatorAwaitingReply {
    core: Core,
}

impl InitiatorAwaitingReply {
    /// Reads message 2 (`<- e, ee, s, es`), appending its payload to
    /// `payload`.
    ///
    /// # Errors
    /// [`TransportError::PeerMisbehaved`]: short or oversize message,
    /// low-order key, failed authentication.
    pub fn read_message(
        mut self,
        msg: &[u8],
        payload: &mut Vec<u8>,
    ) -> Result<InitiatorReadyToFinish, TransportError> {
        check_len(msg, DHLEN + DHLEN + TAGLEN + TAGLEN)?;
        let re = key(msg);
        self.core.ss.mix_hash(&re);
        self.core.mix_dh_ephemeral(&re)?;
        let mut rs_buf = Vec::with_capacity(DHLEN);
        self.core
            .ss
            .decrypt_and_hash(&msg[DHLEN..DHLEN + DHLEN + TAGLEN], &mut rs_buf)?;
        let rs = key(&rs_buf);
        self.core.mix_dh_ephemeral(&rs)?;
        self.core
            .ss
            .decrypt_and_hash(&msg[DHLEN + DHLEN + TAGLEN..], payload)?;
        Ok(InitiatorReadyToFinish {
            core: self.core,
            re,
            rs,
        })
    }
}

/// The initiator after message 2: the responder's static key is known and
/// authenticated; message 3 finishes the handshake.
pub struct InitiatorReadyToFinish {
    core: Core,
    re: [u8; DHLEN],
    rs: [u8; DHLEN],
}

impl InitiatorReadyToFinish {
    /// The responder's static key, in canonical form.
    pub fn remote(&self) -> NodeId {
        canonical_node_id(&NodeId::from_bytes(self.rs))
    }

    /// Appends message 3 (`-> s, se`) to `out` and finishes.
    ///
    /// # Errors
    /// [`TransportError::RecordTooLarge`] for an oversize payload;
    /// [`TransportError::PeerMisbehaved`] for a low-order ephemeral key.
    pub fn write_message(
        mut self,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<TransportSession, TransportError> {
        let start = out.len();
        let s_pub = self.core.s_pub;
        let result = self
            .core
            .ss
            .encrypt_and_hash(&s_pub, out)
            .and_then(|()| self.core.mix_dh_static(&self.re))
            .and_then(|()| self.core.write_payload(payload, out))
            .and_then(|()| check_room(start, out));
        if let Err(e) = result {
            out.truncate(start);
            return Err(e);
        }
        let remote = self.remote();
        let hash = self.core.ss.handshake_hash();
        let (c1, c2) = self.core.ss.split();
        Ok(TransportSession::new(c1, c2, remote, self.rs, hash))
    }
}

impl fmt::Debug for InitiatorReadyToFinish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitiatorReadyToFinish")
            .field("remote", &self.remote())
            .finish_non_exhaustive()
    }
}

/// The responder before message 1.
pub struct Responder {
    core: Core,
}

impl Responder {
    /// Prepares to answer a handshake with the capwire prologue
    /// ([`PROLOGUE`]), drawing the ephemeral key from `entropy`.
    ///
    /// # Errors
    /// [`TransportError::Rng`] when `entropy` fails.
    pub fn new(keypair: &Keypair, entropy: &dyn EntropySource) -> Result<Self, TransportError> {
        Self::with_prologue(keypair, PROLOGUE, entropy)
    }

    /// As [`new`](Self::new) with another prologue.
    ///
    /// # Errors
    /// [`TransportError::Rng`] when `entropy` fails.
    pub fn with_prologue(
        keypair: &Keypair,
        prologue: &[u8],
        entropy: &dyn EntropySource,
    ) -> Result<Self, TransportError> {
        Ok(Self {
            core: Core::new(keypair, prologue, entropy)?,
        })
    }

    /// Reads message 1 (`-> e`), appending its payload to `payload`.
    ///
    /// # Errors
    /// [`TransportError::PeerMisbehaved`] for a short or oversize message.
    pub fn read_message(
        mut self,
        msg: &[u8],
        payload: &mut Vec<u8>,
    ) -> Result<ResponderReadyToReply, TransportError> {
        check_len(msg, DHLEN)?;
        let re = key(msg);
        self.core.ss.mix_hash(&re);
        self.core.ss.decrypt_and_hash(&msg[DHLEN..], payload)?;
        Ok(ResponderReadyToReply {
            core: self.core,
            re,
        })
    }
}

/// The responder after message 1.
pub struct ResponderReadyToReply {
    core: Core,
    re: [u8; DHLEN],
}

impl ResponderReadyToReply {
    /// Appends message 2 (`<- e, ee, s, es`) to `out`.
    ///
    /// # Errors
    /// [`TransportError::PeerMisbehaved`] when the initiator's ephemeral key
    /// has low order; [`TransportError::RecordTooLarge`] for an oversize
    /// payload.
    pub fn write_message(
        mut self,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<ResponderAwaitingFinish, TransportError> {
        let start = out.len();
        let e_pub = self.core.e_pub;
        let s_pub = self.core.s_pub;
        let re = self.re;
        out.extend_from_slice(&e_pub);
        self.core.ss.mix_hash(&e_pub);
        let result = self
            .core
            .mix_dh_ephemeral(&re)
            .and_then(|()| self.core.ss.encrypt_and_hash(&s_pub, out))
            .and_then(|()| self.core.mix_dh_static(&re))
            .and_then(|()| self.core.write_payload(payload, out))
            .and_then(|()| check_room(start, out));
        if let Err(e) = result {
            out.truncate(start);
            return Err(e);
        }
        Ok(ResponderAwaitingFinish { core: self.core })
    }
}

/// The responder after message 2, waiting for message 3.
pub struct ResponderAwaitingFinish {
    core: Core,
}

impl ResponderAwaitingFinish {
    /// Reads message 3 (`-> s, se`), appending its payload to `payload`,
    /// and finishes. The initiator's identity is
    /// [`TransportSession::remote`].
    ///
    /// # Errors
    /// [`TransportError::PeerMisbehaved`]: short or oversize message,
    /// low-order key, failed authentication.
    pub fn read_message(
        mut self,
        msg: &[u8],
        payload: &mut Vec<u8>,
    ) -> Result<TransportSession, TransportError> {
        check_len(msg, DHLEN + TAGLEN + TAGLEN)?;
        let mut rs_buf = Vec::with_capacity(DHLEN);
        self.core
            .ss
            .decrypt_and_hash(&msg[..DHLEN + TAGLEN], &mut rs_buf)?;
        let rs = key(&rs_buf);
        self.core.mix_dh_ephemeral(&rs)?;
        self.core
            .ss
            .decrypt_and_hash(&msg[DHLEN + TAGLEN..], payload)?;
        let remote = canonical_node_id(&NodeId::from_bytes(rs));
        let hash = self.core.ss.handshake_hash();
        let (c1, c2) = self.core.ss.split();
        Ok(TransportSession::new(c2, c1, remote, rs, hash))
    }
}

#[cfg(test)]
mod tests {
    //! Hostile peers that run the transcript correctly but use low-order
    //! keys: without the contributory check their messages would be
    //! accepted, so these tests prove the check itself.

    use super::*;
    use crate::keys::OsEntropy;

    /// Every encoding of a low-order point: the five low-order
    /// u-coordinates, their `+ p` aliases that fit in 255 bits, and each of
    /// those with bit 255 set.
    pub(crate) fn low_order_encodings() -> Vec<[u8; 32]> {
        fn hex(s: &str) -> [u8; 32] {
            let mut out = [0u8; 32];
            for (i, o) in out.iter_mut().enumerate() {
                *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
            }
            out
        }
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        let mut p_minus_1 = p;
        p_minus_1[0] = 0xec;
        let mut p_plus_1 = p;
        p_plus_1[0] = 0xee;
        let mut one = [0u8; 32];
        one[0] = 1;
        let base = [
            [0u8; 32],
            one,
            hex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
            hex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
            p_minus_1,
            p,
            p_plus_1,
        ];
        let mut all = Vec::new();
        for b in base {
            all.push(b);
            let mut high = b;
            high[31] |= 0x80;
            all.push(high);
        }
        all
    }

    #[test]
    fn the_encodings_really_have_low_order() {
        let s = StaticSecret::from([0x42; 32]);
        for point in low_order_encodings() {
            assert!(!s.diffie_hellman(&PublicKey::from(point)).was_contributory());
        }
    }

    fn low_order_dh() -> [u8; 32] {
        [0; 32]
    }

    #[test]
    fn responder_refuses_low_order_ephemeral() {
        let kp = Keypair::generate().unwrap();
        for point in low_order_encodings() {
            let responder = Responder::new(&kp, &OsEntropy).unwrap();
            let mut payload = Vec::new();
            let ready = responder.read_message(&point, &mut payload).unwrap();
            let mut out = Vec::new();
            let err = ready.write_message(&[], &mut out).unwrap_err();
            assert!(matches!(
                err,
                TransportError::PeerMisbehaved(Violation::LowOrderKey)
            ));
            assert!(out.is_empty(), "nothing written after a refusal");
        }
    }

    #[test]
    fn initiator_refuses_low_order_ephemeral() {
        let kp = Keypair::generate().unwrap();
        let responder_kp = Keypair::generate().unwrap();
        for point in low_order_encodings() {
            let initiator = Initiator::new(&kp, &OsEntropy).unwrap();
            let mut m1 = Vec::new();
            let waiting = initiator.write_message(&[], &mut m1).unwrap();
            // A forger replaying the transcript with a low-order e: ee = 0.
            let mut ss = SymmetricState::initialize(PROTOCOL_NAME.as_bytes());
            ss.mix_hash(PROLOGUE);
            ss.mix_hash(&m1);
            ss.mix_hash(&[]);
            let mut m2 = point.to_vec();
            ss.mix_hash(&point);
            ss.mix_key(&low_order_dh());
            ss.encrypt_and_hash(responder_kp.public().as_bytes(), &mut m2)
                .unwrap();
            let es = responder_kp
                .secret()
                .diffie_hellman(&PublicKey::from(key(&m1)));
            ss.mix_key(es.as_bytes());
            ss.encrypt_and_hash(&[], &mut m2).unwrap();
            let mut payload = Vec::new();
            let err = waiting.read_message(&m2, &mut payload).unwrap_err();
            assert!(matches!(
                err,
                TransportError::PeerMisbehaved(Violation::LowOrderKey)
            ));
        }
    }

    #[test]
    fn initiator_refuses_low_order_static() {
        let kp = Keypair::generate().unwrap();
        for point in low_order_encodings() {
            let initiator = Initiator::new(&kp, &OsEntropy).unwrap();
            let mut m1 = Vec::new();
            let waiting = initiator.write_message(&[], &mut m1).unwrap();
            // A forger with a genuine ephemeral but a low-order static key:
            // es = DH(e_i, s_r) = 0, which the forger can compute.
            let e = StaticSecret::from([0x33; 32]);
            let e_pub = PublicKey::from(&e).to_bytes();
            let mut ss = SymmetricState::initialize(PROTOCOL_NAME.as_bytes());
            ss.mix_hash(PROLOGUE);
            ss.mix_hash(&m1);
            ss.mix_hash(&[]);
            let mut m2 = e_pub.to_vec();
            ss.mix_hash(&e_pub);
            ss.mix_key(e.diffie_hellman(&PublicKey::from(key(&m1))).as_bytes());
            ss.encrypt_and_hash(&point, &mut m2).unwrap();
            ss.mix_key(&low_order_dh());
            ss.encrypt_and_hash(&[], &mut m2).unwrap();
            let mut payload = Vec::new();
            let err = waiting.read_message(&m2, &mut payload).unwrap_err();
            assert!(matches!(
                err,
                TransportError::PeerMisbehaved(Violation::LowOrderKey)
            ));
        }
    }

    #[test]
    fn responder_refuses_low_order_static() {
        let kp = Keypair::generate().unwrap();
        for point in low_order_encodings() {
            // A forger with a genuine ephemeral but a low-order static key.
            let e = StaticSecret::from([0x44; 32]);
            let e_pub = PublicKey::from(&e).to_bytes();
            let mut ss = SymmetricState::initialize(PROTOCOL_NAME.as_bytes());
            ss.mix_hash(PROLOGUE);
            ss.mix_hash(&e_pub);
            ss.mix_hash(&[]);

            let responder = Responder::new(&kp, &OsEntropy).unwrap();
            let mut payload = Vec::new();
            let ready = responder.read_message(&e_pub, &mut payload).unwrap();
            let mut m2 = Vec::new();
            let waiting = ready.write_message(&[], &mut m2).unwrap();

            // The forger reads message 2 as a real initiator would.
            let re = key(&m2);
            ss.mix_hash(&re);
            ss.mix_key(e.diffie_hellman(&PublicKey::from(re)).as_bytes());
            let mut rs = Vec::new();
            ss.decrypt_and_hash(&m2[32..80], &mut rs).unwrap();
            ss.mix_key(e.diffie_hellman(&PublicKey::from(key(&rs))).as_bytes());
            ss.decrypt_and_hash(&m2[80..], &mut Vec::new()).unwrap();
            // Message 3 with the low-order static key: se = DH(s_i, e_r) = 0.
            let mut m3 = Vec::new();
            ss.encrypt_and_hash(&point, &mut m3).unwrap();
            ss.mix_key(&low_order_dh());
            ss.encrypt_and_hash(&[], &mut m3).unwrap();

            let err = waiting.read_message(&m3, &mut payload).unwrap_err();
            assert!(matches!(
                err,
                TransportError::PeerMisbehaved(Violation::LowOrderKey)
            ));
        }
    }

    #[test]
    fn a_forger_with_a_real_key_gets_through_the_same_code_path() {
        // Control for the tests above: the same forging code with genuine
        // keys produces a message the responder accepts.
        let kp = Keypair::generate().unwrap();
        let forger_static = Keypair::generate().unwrap();
        let e = StaticSecret::from([0x44; 32]);
        let e_pub = PublicKey::from(&e).to_bytes();
        let mut ss = SymmetricState::initialize(PROTOCOL_NAME.as_bytes());
        ss.mix_hash(PROLOGUE);
        ss.mix_hash(&e_pub);
        ss.mix_hash(&[]);
        let responder = Responder::new(&kp, &OsEntropy).unwrap();
        let mut payload = Vec::new();
        let ready = responder.read_message(&e_pub, &mut payload).unwrap();
        let mut m2 = Vec::new();
        let waiting = ready.write_message(&[], &mut m2).unwrap();
        let re = key(&m2);
        ss.mix_hash(&re);
        ss.mix_key(e.diffie_hellman(&PublicKey::from(re)).as_bytes());
        let mut rs = Vec::new();
        ss.decrypt_and_hash(&m2[32..80], &mut rs).unwrap();
        ss.mix_key(e.diffie_hellman(&PublicKey::from(key(&rs))).as_bytes());
        ss.decrypt_and_hash(&m2[80..], &mut Vec::new()).unwrap();
        let mut m3 = Vec::new();
        ss.encrypt_and_hash(forger_static.public().as_bytes(), &mut m3)
            .unwrap();
        let se = forger_static.secret().diffie_hellman(&PublicKey::from(re));
        ss.mix_key(se.as_bytes());
        ss.encrypt_and_hash(&[], &mut m3).unwrap();
        let session = waiting.read_message(&m3, &mut payload).unwrap();
        assert_eq!(session.remote(), forger_static.public());
    }

    #[test]
    fn roles_agree_and_messages_have_the_documented_lengths() {
        let a = Keypair::generate().unwrap();
        let b = Keypair::generate().unwrap();
        let mut m1 = Vec::new();
        let init = Initiator::new(&a, &OsEntropy)
            .unwrap()
            .write_message(&[], &mut m1)
            .unwrap();
        assert_eq!(m1.len(), MESSAGE_1_LEN);
        let mut p = Vec::new();
        let resp = Responder::new(&b, &OsEntropy)
            .unwrap()
            .read_message(&m1, &mut p)
            .unwrap();
        let mut m2 = Vec::new();
        let resp = resp.write_message(&[], &mut m2).unwrap();
        assert_eq!(m2.len(), MESSAGE_2_LEN);
        let init = init.read_message(&m2, &mut p).unwrap();
        assert_eq!(init.remote(), b.public());
        let mut m3 = Vec::new();
        let mut si = init.write_message(&[], &mut m3).unwrap();
        assert_eq!(m3.len(), MESSAGE_3_LEN);
        let mut sr = resp.read_message(&m3, &mut p).unwrap();
        assert!(p.is_empty());
        assert_eq!(sr.remote(), a.public());
        assert_eq!(si.handshake_hash(), sr.handshake_hash());
        let mut c = Vec::new();
        si.seal(b"ping", &mut c).unwrap();
        let mut plain = Vec::new();
        sr.open(&c, &mut plain).unwrap();
        assert_eq!(plain, b"ping");
    }
}
