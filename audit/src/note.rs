//! Checkpoints (C2SP tlog-checkpoint) signed as notes (C2SP signed-note)
//! with Ed25519.
//!
//! A checkpoint body is
//!
//! ```text
//! <origin>
//! <tree size, decimal>
//! <root hash, base64>
//! [extension lines]
//! ```
//!
//! and a signed note is the body, an empty line, then one line per
//! signature: `— <key name> <base64(key id || signature)>`.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use blake2::Blake2sMac256;
use blake2::digest::{KeyInit, Mac};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::hash::Hash;

/// The largest note [`NoteVerifier::verify`] reads.
pub const MAX_NOTE_LEN: usize = 1 << 20;

/// The most signature lines [`NoteVerifier::verify`] reads.
pub const MAX_SIGNATURES: usize = 100;

/// The signature algorithm byte of Ed25519 in key ids and verifier keys.
const ALG_ED25519: u8 = 1;

/// The start of a signature line: an em dash and a space.
const SIG_PREFIX: &str = "\u{2014} ";

/// Why a checkpoint, a note or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    /// The text does not have the note or checkpoint shape.
    #[error("malformed note: {0}")]
    Malformed(&'static str),
    /// The tree size line is not a decimal `u64` without leading zeros.
    #[error("malformed checkpoint: bad tree size")]
    BadTreeSize,
    /// The root hash line is not the base64 of 32 bytes.
    #[error("malformed checkpoint: bad root hash")]
    BadRootHash,
    /// A key name is empty or has whitespace or '+'.
    #[error("bad key name")]
    BadKeyName,
    /// A verifier key text could not be used.
    #[error("bad verifier key: {0}")]
    BadVerifierKey(&'static str),
    /// The note is longer than [`MAX_NOTE_LEN`].
    #[error("note of {len} bytes is too large")]
    TooLarge {
        /// The note's length in bytes.
        len: usize,
    },
    /// The note has more than [`MAX_SIGNATURES`] signature lines.
    #[error("note has too many signatures")]
    TooManySignatures,
    /// No signature line is by the verifier's key.
    #[error("note has no signature by this key")]
    NoSignature,
    /// The signature by the verifier's key is not valid.
    #[error("note signature is not valid")]
    BadSignature,
}

/// A tree head: the log's name, its size and its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's unique name (one non-empty line).
    pub origin: String,
    /// The number of leaves.
    pub size: u64,
    /// The RFC 6962 root of the tree.
    pub root: Hash,
    /// Extension lines (each non-empty, without the newline).
    pub extensions: Vec<String>,
}

/// Checks one line of text: non-empty, no ASCII control characters.
fn check_line(line: &str, what: &'static str) -> Result<(), NoteError> {
    if line.is_empty() || line.chars().any(|c| c.is_ascii_control()) {
        return Err(NoteError::Malformed(what));
    }
    Ok(())
}

impl Checkpoint {
    /// The checkpoint's text, each line ending in a newline.
    pub fn body(&self) -> String {
        let mut out = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            B64.encode(self.root)
        );
        for line in &self.extensions {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// Checks that [`Self::body`] is a checkpoint text that parses back to
    /// `self`; a note signed over anything else verifies nowhere.
    pub fn validate(&self) -> Result<(), NoteError> {
        check_line(&self.origin, "bad origin line")?;
        for line in &self.extensions {
            check_line(line, "bad extension line")?;
        }
        Ok(())
    }

    /// Parses a checkpoint text, strictly.
    pub fn parse_body(text: &str) -> Result<Self, NoteError> {
        let Some(text) = text.strip_suffix('\n') else {
            return Err(NoteError::Malformed("checkpoint does not end in a newline"));
        };
        let mut lines = text.split('\n');
        let origin = lines.next().unwrap_or_default();
        check_line(origin, "bad origin line")?;
        let size = lines
            .next()
            .ok_or(NoteError::Malformed("missing tree size line"))?;
        let root = lines
            .next()
            .ok_or(NoteError::Malformed("missing root hash line"))?;
        let size = parse_size(size)?;
        let root = B64
            .decode(root)
            .ok()
            .and_then(|r| Hash::try_from(r).ok())
            .ok_or(NoteError::BadRootHash)?;
        let extensions = lines
            .map(|line| check_line(line, "bad extension line").map(|()| line.to_owned()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            origin: origin.to_owned(),
            size,
            root,
            extensions,
        })
    }
}

fn parse_size(s: &str) -> Result<u64, NoteError> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return Err(NoteError::BadTreeSize);
    }
    s.parse().map_err(|_| NoteError::BadTreeSize)
}

fn check_name(name: &str) -> Result<(), NoteError> {
    if name.is_empty()
        || name.contains('+')
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(NoteError::BadKeyName);
    }
    Ok(())
}

/// The signed-note key id of an Ed25519 key: the first 4 bytes of
/// SHA-256(name || "\n" || 0x01 || public key).
fn key_id(name: &str, public: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ALG_ED25519]);
    h.update(public);
    let digest = h.finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key signing a log's checkpoints: an Ed25519 key and its name.
pub struct AuditKey {
    key: SigningKey,
    name: String,
    id: [u8; 4],
}

impl AuditKey {
    /// The audit key of the identity whose secret is `secret`: the Ed25519
    /// seed is BLAKE2s-256 keyed with the secret over
    /// `"capwire audit key v1"`. `name` is the key's signed-note name.
    pub fn from_secret(secret: &[u8; 32], name: &str) -> Result<Self, NoteError> {
        check_name(name)?;
        let mut mac = <Blake2sMac256 as KeyInit>::new(secret.into());
        mac.update(b"capwire audit key v1");
        let seed = Zeroizing::new(<[u8; 32]>::from(mac.finalize().into_bytes()));
        let key = SigningKey::from_bytes(&seed);
        let id = key_id(name, key.verifying_key().as_bytes());
        Ok(Self {
            key,
            name: name.to_owned(),
            id,
        })
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Ed25519 public key.
    pub fn public(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    /// The signed-note key id.
    pub fn key_id(&self) -> [u8; 4] {
        self.id
    }

    /// The verifier key text: `<name>+<key id hex>+<base64(0x01 || public)>`.
    pub fn verifier_key(&self) -> String {
        let mut key = vec![ALG_ED25519];
        key.extend_from_slice(&self.public());
        format!("{}+{}+{}", self.name, hex(&self.id), B64.encode(key))
    }

    /// The verifier of this key's notes.
    pub fn verifier(&self) -> NoteVerifier {
        NoteVerifier {
            name: self.name.clone(),
            key: self.key.verifying_key(),
            id: self.id,
        }
    }

    /// The signed note of `checkpoint` (which should pass
    /// [`Checkpoint::validate`]).
    pub fn sign(&self, checkpoint: &Checkpoint) -> String {
        let mut note = checkpoint.body();
        let sig = self.key.sign(note.as_bytes());
        let mut blob = self.id.to_vec();
        blob.extend_from_slice(&sig.to_bytes());
        note.push('\n');
        note.push_str(&format!("{SIG_PREFIX}{} {}\n", self.name, B64.encode(blob)));
        note
    }
}

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditKey")
            .field("name", &self.name)
            .field("key_id", &hex(&self.id))
            .finish()
    }
}

/// A verifier of the notes signed by one [`AuditKey`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteVerifier {
    name: String,
    key: VerifyingKey,
    id: [u8; 4],
}

impl NoteVerifier {
    /// The verifier of the key `name` with Ed25519 public key `public`.
    pub fn new(name: &str, public: &[u8; 32]) -> Result<Self, NoteError> {
        check_name(name)?;
        let key = VerifyingKey::from_bytes(public)
            .map_err(|_| NoteError::BadVerifierKey("not an Ed25519 key"))?;
        Ok(Self {
            name: name.to_owned(),
            key,
            id: key_id(name, public),
        })
    }

    /// Parses a verifier key text, `<name>+<key id hex>+<base64(0x01 || public)>`.
    pub fn parse(vkey: &str) -> Result<Self, NoteError> {
        let mut parts = vkey.splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::BadVerifierKey("not name+id+key"));
        };
        let id_ok = id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit());
        let id = u32::from_str_radix(id, 16)
            .ok()
            .filter(|_| id_ok)
            .ok_or(NoteError::BadVerifierKey("key id is not 8 hex digits"))?;
        let key = B64
            .decode(key)
            .map_err(|_| NoteError::BadVerifierKey("key is not base64"))?;
        let public = match key.split_first() {
            Some((&ALG_ED25519, public)) => <[u8; 32]>::try_from(public)
                .map_err(|_| NoteError::BadVerifierKey("Ed25519 key is not 32 bytes"))?,
            _ => return Err(NoteError::BadVerifierKey("not an Ed25519 key")),
        };
        let verifier = Self::new(name, &public)?;
        if verifier.id != id.to_be_bytes() {
            return Err(NoteError::BadVerifierKey("key id does not match the key"));
        }
        Ok(verifier)
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The signed-note key id.
    pub fn key_id(&self) -> [u8; 4] {
        self.id
    }

    /// Checks the note's shape strictly, requires a valid signature by this
    /// key (other keys' signature lines are ignored) and returns its
    /// checkpoint.
    pub fn verify(&self, note: &str) -> Result<Checkpoint, NoteError> {
        if note.len() > MAX_NOTE_LEN {
            return Err(NoteError::TooLarge { len: note.len() });
        }
        if note.chars().any(|c| c.is_ascii_control() && c != '\n') {
            return Err(NoteError::Malformed("control character"));
        }
        let Some(split) = note.rfind("\n\n") else {
            return Err(NoteError::Malformed("no blank line before the signatures"));
        };
        let (body, sigs) = (&note[..split + 1], &note[split + 2..]);
        let Some(sigs) = sigs.strip_suffix('\n') else {
            return Err(NoteError::Malformed(
                "no signature line, or no final newline",
            ));
        };
        let mut ours = None;
        for (count, line) in sigs.split('\n').enumerate() {
            if count >= MAX_SIGNATURES {
                return Err(NoteError::TooManySignatures);
            }
            let line = line
                .strip_prefix(SIG_PREFIX)
                .ok_or(NoteError::Malformed("bad signature line"))?;
            let (name, blob) = line
                .split_once(' ')
                .ok_or(NoteError::Malformed("bad signature line"))?;
            check_name(name).map_err(|_| NoteError::Malformed("bad signature key name"))?;
            let blob = B64
                .decode(blob)
                .map_err(|_| NoteError::Malformed("signature is not base64"))?;
            if blob.len() < 5 {
                return Err(NoteError::Malformed("signature too short"));
            }
            // The first line by this key counts, the others are ignored.
            if ours.is_none() && name == self.name && blob[..4] == self.id {
                ours = Some(blob);
            }
        }
        let checkpoint = Checkpoint::parse_body(body)?;
        let blob = ours.ok_or(NoteError::NoSignature)?;
        let sig = Signature::from_slice(&blob[4..]).map_err(|_| NoteError::BadSignature)?;
        self.key
            .verify_strict(body.as_bytes(), &sig)
            .map_err(|_| NoteError::BadSignature)?;
        Ok(checkpoint)
    }
}
