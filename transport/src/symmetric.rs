//! Noise's `CipherState` and `SymmetricState` for ChaChaPoly and BLAKE2s
//! (Noise specification, revision 34, sections 4 and 5.1-5.2).

use blake2::{Blake2s256, Digest};
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce, Tag};
use zeroize::Zeroizing;

use crate::error::{TransportError, Violation};

/// BLAKE2s output length.
pub(crate) const HASHLEN: usize = 32;
/// BLAKE2s block length, hence the length of HMAC's key pads.
const BLOCKLEN: usize = 64;
/// Poly1305 tag length.
pub(crate) const TAGLEN: usize = 16;
/// Largest Noise message, ciphertext and tag included.
pub(crate) const MAX_MESSAGE_LEN: usize = 65535;
/// Largest plaintext one transport message can carry.
pub(crate) const MAX_PLAINTEXT_LEN: usize = MAX_MESSAGE_LEN - TAGLEN;

const IPAD: u8 = 0x36;
const OPAD: u8 = 0x5c;

/// A BLAKE2s-256 hasher that puts itself back to its initial state after
/// every digest and when dropped, so that its own memory keeps neither the
/// bytes it hashed nor a chaining value derived from them.
///
/// `blake2` 0.10 offers no `Zeroize` for its hashers (and this crate uses
/// no `unsafe`), so the state is overwritten through the hasher's API:
/// `reset` restores the chaining value and counter to their public initial
/// values, and hashing one block of zeros then overwrites the whole 64-byte
/// block buffer, which holds the last (unprocessed) input block. What this
/// cannot reach: the compression function's working vector and message
/// words (stack and registers, overwritten by the next compression), and
/// the 32-byte temporaries the `blake2`/`digest` crates copy the output
/// through while finalizing.
struct WipingHasher(Blake2s256);

impl WipingHasher {
    fn new() -> Self {
        Self(Blake2s256::new())
    }

    fn update(&mut self, data: &[u8]) {
        Digest::update(&mut self.0, data);
    }

    /// Writes the digest of everything hashed so far into `out`, then
    /// wipes; the hasher can be used again.
    fn finalize_into(&mut self, out: &mut [u8; HASHLEN]) {
        let out = blake2::digest::Output::<Blake2s256>::from_mut_slice(out);
        Digest::finalize_into_reset(&mut self.0, out);
        self.wipe();
    }

    fn wipe(&mut self) {
        Digest::reset(&mut self.0);
        Digest::update(&mut self.0, [0u8; BLOCKLEN]);
        Digest::reset(&mut self.0);
        // Keep the stores above from being optimized away as dead.
        std::hint::black_box(&mut self.0);
    }
}

impl Drop for WipingHasher {
    fn drop(&mut self) {
        self.wipe();
    }
}

/// HMAC over BLAKE2s with its 64-byte block, as the Noise spec defines it
/// (RFC 2104; not BLAKE2s keyed mode): `H((K0 ^ opad) || H((K0 ^ ipad) ||
/// message))`, where `K0` is the key (hashed first if longer than a block)
/// padded with zeros to a block.
///
/// Wiped after use: the key pads (one `Zeroizing` block reused for both),
/// the hashed long key, the inner digest, and both hashers' chaining values
/// and block buffers (see [`WipingHasher`]). The result is returned in a
/// `Zeroizing` buffer. Not wiped: what [`WipingHasher`] cannot reach, and
/// whatever copies the compiler makes when it moves these values.
fn hmac(key: &[u8], parts: &[&[u8]]) -> Zeroizing<[u8; HASHLEN]> {
    let mut hasher = WipingHasher::new();
    let mut pad = Zeroizing::new([0u8; BLOCKLEN]);
    if key.len() > BLOCKLEN {
        let mut hashed = Zeroizing::new([0u8; HASHLEN]);
        hasher.update(key);
        hasher.finalize_into(&mut hashed);
        pad[..HASHLEN].copy_from_slice(hashed.as_ref());
    } else {
        pad[..key.len()].copy_from_slice(key);
    }
    pad.iter_mut().for_each(|b| *b ^= IPAD);
    hasher.update(pad.as_ref());
    for part in parts {
        hasher.update(part);
    }
    let mut inner = Zeroizing::new([0u8; HASHLEN]);
    hasher.finalize_into(&mut inner);
    pad.iter_mut().for_each(|b| *b ^= IPAD ^ OPAD);
    hasher.update(pad.as_ref());
    hasher.update(inner.as_ref());
    let mut out = Zeroizing::new([0u8; HASHLEN]);
    hasher.finalize_into(&mut out);
    out
}

/// `HKDF(chaining_key, input_key_material, 2)`.
pub(crate) fn hkdf2(
    chaining_key: &[u8; HASHLEN],
    ikm: &[u8],
) -> (Zeroizing<[u8; HASHLEN]>, Zeroizing<[u8; HASHLEN]>) {
    let temp_key = hmac(chaining_key, &[ikm]);
    let out1 = hmac(temp_key.as_ref(), &[&[0x01]]);
    let out2 = hmac(temp_key.as_ref(), &[out1.as_ref(), &[0x02]]);
    (out1, out2)
}

fn nonce(n: u64) -> Nonce {
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&n.to_le_bytes());
    bytes.into()
}

/// A key (possibly none yet) and its nonce counter. The counter only moves
/// forward, and only after a successful operation; the value 2^64-1 is
/// reserved (for rekeying) and never used to encrypt a message, so the
/// counter never wraps.
pub(crate) struct CipherState {
    aead: Option<ChaCha20Poly1305>,
    n: u64,
}

impl CipherState {
    pub(crate) fn empty() -> Self {
        Self { aead: None, n: 0 }
    }

    pub(crate) fn with_key(key: &[u8; 32]) -> Self {
        Self {
            aead: Some(ChaCha20Poly1305::new(key.into())),
            n: 0,
        }
    }

    pub(crate) fn has_key(&self) -> bool {
        self.aead.is_some()
    }

    pub(crate) fn nonce(&self) -> u64 {
        self.n
    }

    /// Moves the counter to `n` if that is ahead of it (never backwards, so
    /// no nonce can be reused).
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) fn advance_nonce(&mut self, n: u64) {
        self.n = self.n.max(n);
    }

    /// Encrypts `buf` in place and returns the tag. Without a key, leaves
    /// `buf` as it is and returns `None`.
    pub(crate) fn encrypt_in_place(
        &mut self,
        ad: &[u8],
        buf: &mut [u8],
    ) -> Result<Option<Tag>, TransportError> {
        let Some(aead) = &self.aead else {
            return Ok(None);
        };
        if self.n == u64::MAX {
            return Err(TransportError::NonceExhausted);
        }
        let tag = aead
            .encrypt_in_place_detached(&nonce(self.n), ad, buf)
            .map_err(|_| TransportError::NonceExhausted)?;
        self.n += 1;
        Ok(Some(tag))
    }

    /// Authenticates and decrypts `buf` in place. On failure `buf` is left
    /// as ciphertext and the counter does not move.
    pub(crate) fn decrypt_in_place(
        &mut self,
        ad: &[u8],
        buf: &mut [u8],
        tag: &[u8; TAGLEN],
    ) -> Result<(), TransportError> {
        let Some(aead) = &self.aead else {
            return Ok(());
        };
        if self.n == u64::MAX {
            return Err(TransportError::NonceExhausted);
        }
        aead.decrypt_in_place_detached(&nonce(self.n), ad, buf, tag.into())
            .map_err(|_| TransportError::PeerMisbehaved(Violation::Decrypt))?;
        self.n += 1;
        Ok(())
    }

    /// `REKEY(k)`: the first 32 bytes of `ENCRYPT(k, 2^64-1, "", zeros(32))`.
    /// The counter is kept.
    pub(crate) fn rekey(&mut self) {
        if let Some(aead) = &self.aead {
            let mut key = Zeroizing::new([0u8; 32]);
            // Encrypting 32 bytes cannot fail.
            if aead
                .encrypt_in_place_detached(&nonce(u64::MAX), &[], key.as_mut())
                .is_ok()
            {
                self.aead = Some(ChaCha20Poly1305::new(key.as_ref().into()));
            }
        }
    }
}

/// The handshake's hashing and key-mixing state.
pub(crate) struct SymmetricState {
    ck: Zeroizing<[u8; HASHLEN]>,
    h: [u8; HASHLEN],
    cipher: CipherState,
}

impl SymmetricState {
    pub(crate) fn initialize(protocol_name: &[u8]) -> Self {
        let mut h = [0u8; HASHLEN];
        if protocol_name.len() <= HASHLEN {
            h[..protocol_name.len()].copy_from_slice(protocol_name);
        } else {
            h = Blake2s256::digest(protocol_name).into();
        }
        Self {
            ck: Zeroizing::new(h),
            h,
            cipher: CipherState::empty(),
        }
    }

    pub(crate) fn mix_hash(&mut self, data: &[u8]) {
        let mut hasher = Blake2s256::new();
        hasher.update(self.h);
        hasher.update(data);
        self.h = hasher.finalize().into();
    }

    pub(crate) fn mix_key(&mut self, ikm: &[u8]) {
        let (ck, k) = hkdf2(&self.ck, ikm);
        self.ck = ck;
        self.cipher = CipherState::with_key(&k);
    }

    pub(crate) fn handshake_hash(&self) -> [u8; HASHLEN] {
        self.h
    }

    /// Appends `EncryptAndHash(plaintext)` to `out`.
    pub(crate) fn encrypt_and_hash(
        &mut self,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), TransportError> {
        let start = out.len();
        out.extend_from_slice(plaintext);
        let h = self.h;
        match self.cipher.encrypt_in_place(&h, &mut out[start..]) {
            Ok(Some(tag)) => out.extend_from_slice(&tag),
            Ok(None) => {}
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        }
        self.mix_hash_range(out, start);
        Ok(())
    }

    fn mix_hash_range(&mut self, out: &[u8], start: usize) {
        let mut hasher = Blake2s256::new();
        hasher.update(self.h);
        hasher.update(&out[start..]);
        self.h = hasher.finalize().into();
    }

    /// Appends `DecryptAndHash(ciphertext)` to `out`. On failure nothing is
    /// appended.
    pub(crate) fn decrypt_and_hash(
        &mut self,
        ciphertext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), TransportError> {
        if !self.cipher.has_key() {
            out.extend_from_slice(ciphertext);
            self.mix_hash(ciphertext);
            return Ok(());
        }
        let Some(body_len) = ciphertext.len().checked_sub(TAGLEN) else {
            return Err(Violation::ShortMessage.into());
        };
        let (body, tag) = ciphertext.split_at(body_len);
        let mut tag_bytes = [0u8; TAGLEN];
        tag_bytes.copy_from_slice(tag);
        let start = out.len();
        out.extend_from_slice(body);
        let h = self.h;
        if let Err(e) = self
            .cipher
            .decrypt_in_place(&h, &mut out[start..], &tag_bytes)
        {
            out.truncate(start);
            return Err(e);
        }
        self.mix_hash(ciphertext);
        Ok(())
    }

    /// `Split()`: the two transport cipher states (initiator to responder,
    /// responder to initiator).
    pub(crate) fn split(self) -> (CipherState, CipherState) {
        let (k1, k2) = hkdf2(&self.ck, &[]);
        (CipherState::with_key(&k1), CipherState::with_key(&k2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_blake2s_matches_the_hmac_definition() {
        // HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)) with a 64-byte block.
        let key = [0x0bu8; 20];
        let msg = b"Hi There";
        let mut block = [0u8; 64];
        block[..20].copy_from_slice(&key);
        let ipad: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
        let opad: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
        let inner = Blake2s256::new()
            .chain_update(&ipad)
            .chain_update(msg)
            .finalize();
        let outer = Blake2s256::new()
            .chain_update(&opad)
            .chain_update(inner)
            .finalize();
        assert_eq!(hmac(&key, &[msg]).as_ref(), outer.as_slice());
    }

    #[test]
    fn hmac_matches_the_hmac_crate_for_every_key_length() {
        use hmac::{Mac, SimpleHmac};
        let message: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        for key_len in [0usize, 1, 20, 32, 63, 64, 65, 100, 200] {
            let key: Vec<u8> = (0..key_len).map(|i| (i * 13 + 1) as u8).collect();
            for split in [0usize, 1, 64, 65, 299, 300] {
                let (a, b) = message.split_at(split);
                let mut reference = <SimpleHmac<Blake2s256> as Mac>::new_from_slice(&key).unwrap();
                reference.update(&message);
                let expected = reference.finalize().into_bytes();
                assert_eq!(
                    hmac(&key, &[a, b]).as_ref(),
                    expected.as_slice(),
                    "key of {key_len} bytes, split at {split}"
                );
            }
        }
    }

    #[test]
    fn a_wiped_hasher_is_back_to_its_public_initial_state() {
        let mut hasher = WipingHasher::new();
        hasher.update(&[0xa5; 100]);
        let mut out = [0u8; HASHLEN];
        hasher.finalize_into(&mut out);
        assert_eq!(out.as_slice(), Blake2s256::digest([0xa5; 100]).as_slice());
        // Chaining value and counter are the initial ones again: the
        // hasher now digests as a fresh one would.
        hasher.update(b"abc");
        hasher.finalize_into(&mut out);
        assert_eq!(out.as_slice(), Blake2s256::digest(b"abc").as_slice());
        hasher.update(&[0x5a; 10]);
        hasher.wipe();
        let fresh: [u8; HASHLEN] = hasher.0.clone().finalize().into();
        assert_eq!(fresh.as_slice(), Blake2s256::digest(b"").as_slice());
    }

    #[test]
    fn failed_decryption_leaves_the_counter_alone() {
        let mut tx = CipherState::with_key(&[1; 32]);
        let mut rx = CipherState::with_key(&[1; 32]);
        let mut buf = *b"hello";
        let tag = tx.encrypt_in_place(b"", &mut buf).unwrap().unwrap();
        let mut bad = buf;
        bad[0] ^= 1;
        let tag: [u8; 16] = tag.into();
        assert!(rx.decrypt_in_place(b"", &mut bad, &tag).is_err());
        assert_eq!(rx.nonce(), 0);
        assert_eq!(bad[1..], buf[1..], "no plaintext written on failure");
        rx.decrypt_in_place(b"", &mut buf, &tag).unwrap();
        assert_eq!(&buf, b"hello");
        assert_eq!(rx.nonce(), 1);
    }

    #[test]
    fn the_last_nonce_is_never_used() {
        let mut tx = CipherState::with_key(&[1; 32]);
        tx.advance_nonce(u64::MAX - 1);
        let mut buf = [0u8; 4];
        assert!(tx.encrypt_in_place(b"", &mut buf).unwrap().is_some());
        assert!(matches!(
            tx.encrypt_in_place(b"", &mut buf),
            Err(TransportError::NonceExhausted)
        ));
        assert_eq!(tx.nonce(), u64::MAX);
        tx.advance_nonce(3);
        assert_eq!(tx.nonce(), u64::MAX, "the counter never moves back");
    }
}
