//! Static identity keys, canonical node ids and the source of randomness.

use std::fmt;

use capwire_envelope::NodeId;
use rand_core::{CryptoRng, RngCore};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

use crate::error::TransportError;

/// The random number generator failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("entropy source failed")]
pub struct EntropyError;

/// Where key material comes from. The default, [`OsEntropy`], asks the
/// operating system. A failure is reported, never papered over: the
/// handshake or key generation that asked for bytes fails with
/// [`TransportError::Rng`].
pub trait EntropySource: Send + Sync {
    /// Fills `dest` entirely with cryptographically secure random bytes.
    ///
    /// # Errors
    /// [`EntropyError`] when no secure bytes can be produced.
    fn try_fill(&self, dest: &mut [u8]) -> Result<(), EntropyError>;
}

/// The operating system's random number generator (`getrandom`).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsEntropy;

impl EntropySource for OsEntropy {
    fn try_fill(&self, dest: &mut [u8]) -> Result<(), EntropyError> {
        rand_core::OsRng
            .try_fill_bytes(dest)
            .map_err(|_| EntropyError)
    }
}

/// 32 secret bytes drawn from `entropy`, zeroized on drop.
pub(crate) fn secret_bytes(
    entropy: &dyn EntropySource,
) -> Result<Zeroizing<[u8; 32]>, TransportError> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    entropy
        .try_fill(bytes.as_mut())
        .map_err(|_| TransportError::Rng)?;
    Ok(bytes)
}

/// Hands x25519-dalek bytes that were already drawn (fallibly) from an
/// [`EntropySource`], so that key constructors which only accept an RNG
/// never touch a generator that could panic.
pub(crate) struct Drawn<'a>(pub(crate) &'a [u8; 32]);

impl RngCore for Drawn<'_> {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        // x25519-dalek asks for exactly 32 bytes once.
        for (d, s) in dest.iter_mut().zip(self.0.iter().cycle()) {
            *d = *s;
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl CryptoRng for Drawn<'_> {}

/// The canonical form of an X25519 public key.
///
/// X25519 ignores bit 255 of a u-coordinate and reduces it modulo
/// p = 2^255 - 19, so several 32-byte strings name the same key. The
/// canonical form clears bit 255 and reduces modulo p; two keys are the same
/// key exactly when their canonical forms are equal. Keys produced by X25519
/// itself are already canonical.
///
/// ```
/// use capwire_envelope::NodeId;
/// use capwire_transport::canonical_node_id;
/// let mut bytes = [7u8; 32];
/// bytes[31] = 0x07;
/// let key = NodeId::from_bytes(bytes);
/// bytes[31] |= 0x80; // bit 255 set: the same key
/// assert_eq!(canonical_node_id(&NodeId::from_bytes(bytes)), key);
/// ```
pub fn canonical_node_id(id: &NodeId) -> NodeId {
    let mut b = *id.as_bytes();
    b[31] &= 0x7f;
    // Values in [p, 2^255) have the form p + r with r in [0, 19): bytes
    // 0xed..=0xff in the lowest position, 0xff in the middle, 0x7f on top.
    if b[31] == 0x7f && b[1..31].iter().all(|&x| x == 0xff) && b[0] >= 0xed {
        let low = b[0] - 0xed;
        b = [0u8; 32];
        b[0] = low;
    }
    NodeId::from_bytes(b)
}

/// A node's static X25519 identity key pair. The secret is zeroized when
/// the value is dropped and never appears in `Debug` output.
///
/// ```
/// use capwire_transport::Keypair;
/// let kp = Keypair::generate().unwrap();
/// let again = Keypair::from_secret_bytes(*kp.secret_bytes());
/// assert_eq!(kp.public(), again.public());
/// println!("{kp:?}"); // Keypair { public: NodeId(…), .. }
/// ```
#[derive(Clone)]
pub struct Keypair {
    secret: StaticSecret,
    public: NodeId,
    /// The bytes sent as our static key: `public`, unless a test chose
    /// another encoding of the same key.
    encoding: [u8; 32],
}

impl Keypair {
    /// A fresh key pair from the operating system's random number generator.
    ///
    /// # Errors
    /// [`TransportError::Rng`] when the generator fails; there is no fallback.
    pub fn generate() -> Result<Self, TransportError> {
        Self::generate_with(&OsEntropy)
    }

    /// A fresh key pair from the given entropy source.
    ///
    /// # Errors
    /// [`TransportError::Rng`] when the source fails.
    pub fn generate_with(entropy: &dyn EntropySource) -> Result<Self, TransportError> {
        let bytes = secret_bytes(entropy)?;
        Ok(Self::from_secret_bytes(*bytes))
    }

    /// Rebuilds a key pair from a stored secret (as given by
    /// [`secret_bytes`](Self::secret_bytes)).
    pub fn from_secret_bytes(mut bytes: [u8; 32]) -> Self {
        let secret = StaticSecret::from(bytes);
        bytes.zeroize();
        let encoding = PublicKey::from(&secret).to_bytes();
        Self {
            secret,
            public: NodeId::from_bytes(encoding),
            encoding,
        }
    }

    /// The secret key bytes, for persisting. Zeroized when the returned
    /// value is dropped.
    pub fn secret_bytes(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.secret.to_bytes())
    }

    /// The public key: this node's identity.
    pub fn public(&self) -> NodeId {
        self.public
    }

    pub(crate) fn secret(&self) -> &StaticSecret {
        &self.secret
    }

    /// The 32 bytes the handshake sends as our static key.
    pub(crate) fn encoding(&self) -> [u8; 32] {
        self.encoding
    }

    /// Makes the handshake send `encoding` as our static key instead of the
    /// canonical bytes. `encoding` must name the same key (for example with
    /// bit 255 set), which lets tests play a peer that uses a
    /// non-canonical encoding.
    ///
    /// # Errors
    /// [`TransportError::InvalidConfig`] when `encoding` is another key.
    #[cfg(feature = "test-hooks")]
    pub fn with_public_encoding_for_testing(
        mut self,
        encoding: [u8; 32],
    ) -> Result<Self, TransportError> {
        if canonical_node_id(&NodeId::from_bytes(encoding)) != self.public {
            return Err(TransportError::InvalidConfig("not an encoding of this key"));
        }
        self.encoding = encoding;
        Ok(self)
    }
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keypair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [u8; 32] = {
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        p
    };

    #[test]
    fn canonical_form_reduces_and_clears_bit_255() {
        // p itself is 0, p + 1 is 1, p + 18 is 18.
        let mut p = P;
        assert_eq!(
            canonical_node_id(&NodeId::from_bytes(p)),
            NodeId::from_bytes([0; 32])
        );
        p[0] = 0xee;
        let mut one = [0u8; 32];
        one[0] = 1;
        assert_eq!(
            canonical_node_id(&NodeId::from_bytes(p)),
            NodeId::from_bytes(one)
        );
        p[0] = 0xff;
        let mut eighteen = [0u8; 32];
        eighteen[0] = 18;
        assert_eq!(
            canonical_node_id(&NodeId::from_bytes(p)),
            NodeId::from_bytes(eighteen)
        );
        // p - 1 is canonical already.
        let mut pm1 = P;
        pm1[0] = 0xec;
        assert_eq!(
            canonical_node_id(&NodeId::from_bytes(pm1)),
            NodeId::from_bytes(pm1)
        );
        // Bit 255 is ignored.
        let mut high = pm1;
        high[31] |= 0x80;
        assert_eq!(
            canonical_node_id(&NodeId::from_bytes(high)),
            NodeId::from_bytes(pm1)
        );
    }

    #[test]
    fn canonical_form_names_the_key_x25519_uses() {
        let kp = Keypair::from_secret_bytes([9; 32]);
        let other = StaticSecret::from([5u8; 32]);
        let mut alias = *kp.public().as_bytes();
        alias[31] |= 0x80;
        let a = other.diffie_hellman(&PublicKey::from(*kp.public().as_bytes()));
        let b = other.diffie_hellman(&PublicKey::from(alias));
        assert_eq!(a.as_bytes(), b.as_bytes());
        assert_eq!(canonical_node_id(&NodeId::from_bytes(alias)), kp.public());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let kp = Keypair::from_secret_bytes([0xa5; 32]);
        let text = format!("{kp:?}");
        assert!(!text.contains("a5a5"), "{text}");
        assert!(text.contains(&kp.public().to_string()));
    }

    struct Broken;
    impl EntropySource for Broken {
        fn try_fill(&self, _: &mut [u8]) -> Result<(), EntropyError> {
            Err(EntropyError)
        }
    }

    #[test]
    fn key_generation_fails_without_entropy() {
        assert!(matches!(
            Keypair::generate_with(&Broken),
            Err(TransportError::Rng)
        ));
    }

    #[test]
    fn generated_keys_differ_and_round_trip() {
        let a = Keypair::generate().unwrap();
        let b = Keypair::generate().unwrap();
        assert_ne!(a.public(), b.public());
        assert_eq!(
            Keypair::from_secret_bytes(*a.secret_bytes()).public(),
            a.public()
        );
    }
}
