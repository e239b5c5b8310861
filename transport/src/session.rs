//! The transport phase: a finished handshake's pair of cipher states.

use std::fmt;

use capwire_envelope::NodeId;

use crate::error::{TransportError, Violation};
use crate::symmetric::{CipherState, HASHLEN, MAX_MESSAGE_LEN, MAX_PLAINTEXT_LEN, TAGLEN};

/// A finished Noise handshake: authenticated peer identity and one cipher
/// state per direction. It works on buffers only; see
/// [`RecordEncoder`](crate::RecordEncoder) and
/// [`RecordDecoder`](crate::RecordDecoder) for the record layer on top.
pub struct TransportSession {
    sealer: Sealer,
    opener: Opener,
    remote: NodeId,
    remote_raw: [u8; 32],
    handshake_hash: [u8; HASHLEN],
}

impl TransportSession {
    pub(crate) fn new(
        send: CipherState,
        recv: CipherState,
        remote: NodeId,
        remote_raw: [u8; 32],
        handshake_hash: [u8; HASHLEN],
    ) -> Self {
        Self {
            sealer: Sealer { cipher: send },
            opener: Opener {
                cipher: recv,
                failed: false,
            },
            remote,
            remote_raw,
            handshake_hash,
        }
    }

    /// The peer's static key in canonical form: its identity.
    pub fn remote(&self) -> NodeId {
        self.remote
    }

    /// The peer's static key exactly as it was sent (possibly a
    /// non-canonical encoding of [`remote`](Self::remote)).
    pub fn remote_static_as_sent(&self) -> [u8; 32] {
        self.remote_raw
    }

    /// The handshake hash `h`: a value both sides share and nobody else
    /// knows, usable for channel binding.
    pub fn handshake_hash(&self) -> [u8; 32] {
        self.handshake_hash
    }

    /// Encrypts one Noise transport message; see [`Sealer::seal`].
    ///
    /// # Errors
    /// As [`Sealer::seal`].
    pub fn seal(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        self.sealer.seal(plaintext, out)
    }

    /// Decrypts one Noise transport message; see [`Opener::open`].
    ///
    /// # Errors
    /// As [`Opener::open`].
    pub fn open(&mut self, message: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        self.opener.open(message, out)
    }

    /// The sending and receiving halves, to be driven independently.
    pub fn split(self) -> (Sealer, Opener) {
        (self.sealer, self.opener)
    }
}

impl fmt::Debug for TransportSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportSession")
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

/// The sending half of a transport session.
pub struct Sealer {
    cipher: CipherState,
}

impl Sealer {
    /// Encrypts `plaintext` (at most 65519 bytes) as one Noise transport
    /// message (ciphertext then 16-byte tag) appended to `out`.
    ///
    /// # Errors
    /// [`TransportError::RecordTooLarge`] when the message would exceed
    /// 65535 bytes; [`TransportError::NonceExhausted`] when the counter has
    /// reached 2^64-1.
    pub fn seal(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        let start = out.len();
        out.extend_from_slice(plaintext);
        out.resize(start + plaintext.len() + TAGLEN, 0);
        match self.seal_in_place(&mut out[start..], plaintext.len()) {
            Ok(_) => Ok(()),
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Encrypts `message[..plaintext_len]` in place and writes the tag
    /// right after it. Returns the message length (`plaintext_len + 16`).
    ///
    /// # Errors
    /// As [`seal`](Self::seal); also [`TransportError::RecordTooLarge`] when
    /// `message` has no room for the tag.
    pub fn seal_in_place(
        &mut self,
        message: &mut [u8],
        plaintext_len: usize,
    ) -> Result<usize, TransportError> {
        if plaintext_len > MAX_PLAINTEXT_LEN || message.len() < plaintext_len + TAGLEN {
            return Err(TransportError::RecordTooLarge {
                len: plaintext_len,
                max: MAX_PLAINTEXT_LEN.min(message.len().saturating_sub(TAGLEN)),
            });
        }
        let (body, rest) = message.split_at_mut(plaintext_len);
        match self.cipher.encrypt_in_place(&[], body)? {
            Some(tag) => rest[..TAGLEN].copy_from_slice(&tag),
            None => return Err(TransportError::NonceExhausted),
        }
        Ok(plaintext_len + TAGLEN)
    }

    /// Replaces the key by `REKEY(k)` (Noise spec section 4.2); the nonce
    /// counter carries on.
    pub fn rekey(&mut self) {
        self.cipher.rekey();
    }

    /// The nonce the next message will use.
    pub fn nonce(&self) -> u64 {
        self.cipher.nonce()
    }

    /// Moves the nonce counter forward to `n` (never backwards).
    #[cfg(feature = "test-hooks")]
    pub fn advance_nonce_for_testing(&mut self, n: u64) {
        self.cipher.advance_nonce(n);
    }
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("nonce", &self.nonce())
            .finish_non_exhaustive()
    }
}

/// The receiving half of a transport session. After any failure it refuses
/// everything: a session never recovers from an error.
pub struct Opener {
    cipher: CipherState,
    failed: bool,
}

impl Opener {
    /// Authenticates and decrypts one Noise transport message, appending
    /// the plaintext to `out`. On failure nothing is appended.
    ///
    /// # Errors
    /// [`TransportError::PeerMisbehaved`] for a short, oversize or forged
    /// message, and for every call after a failure;
    /// [`TransportError::NonceExhausted`] at the end of the counter.
    pub fn open(&mut self, message: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        let start = out.len();
        out.extend_from_slice(message);
        match self.open_in_place(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                Ok(())
            }
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Authenticates and decrypts `message` (ciphertext then tag) in place.
    /// Returns the plaintext length: the plaintext is `message[..len]`. On
    /// failure the buffer holds no plaintext and the counter does not move.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_in_place(&mut self, message: &mut [u8]) -> Result<usize, TransportError> {
        if self.failed {
            return Err(Violation::Decrypt.into());
        }
        let result = self.open_checked(message);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn open_checked(&mut self, message: &mut [u8]) -> Result<usize, TransportError> {
        if message.len() > MAX_MESSAGE_LEN {
            return Err(Violation::MessageLength.into());
        }
        let Some(len) = message.len().checked_sub(TAGLEN) else {
            return Err(Violation::ShortMessage.into());
        };
        let (body, tag) = message.split_at_mut(len);
        let mut tag_bytes = [0u8; TAGLEN];
        tag_bytes.copy_from_slice(tag);
        self.cipher.decrypt_in_place(&[], body, &tag_bytes)?;
        Ok(len)
    }

    /// Replaces the key by `REKEY(k)`; the nonce counter carries on.
    pub fn rekey(&mut self) {
        self.cipher.rekey();
    }

    /// The nonce the next message must have been sealed with.
    pub fn nonce(&self) -> u64 {
        self.cipher.nonce()
    }

    /// Whether a failure has ended this half for good.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// Moves the nonce counter forward to `n` (never backwards).
    #[cfg(feature = "test-hooks")]
    pub fn advance_nonce_for_testing(&mut self, n: u64) {
        self.cipher.advance_nonce(n);
    }
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("nonce", &self.nonce())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}
