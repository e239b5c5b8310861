//! The math of capwire's tamper-evident audit log: pure, no I/O.
//!
//! - [`hash`]: the RFC 6962 leaf and node hashes.
//! - [`tree`]: Merkle trees over a stored-hash layout (every complete
//!   subtree's hash stored once, as in Go's `golang.org/x/mod/sumdb/tlog`):
//!   appending leaves ([`Frontier`]), roots, and RFC 6962 / RFC 9162
//!   inclusion and consistency proofs, produced from `O(log n)` stored
//!   hashes and verified with none.
//! - [`note`]: checkpoints in the C2SP `tlog-checkpoint` format, signed
//!   with Ed25519 in the C2SP `signed-note` format.
//!
//! ```
//! use capwire_audit::{AuditKey, Checkpoint, Frontier, inclusion_proof, leaf_hash, verify_inclusion};
//!
//! let (mut frontier, mut store) = (Frontier::new(), Vec::new());
//! for entry in ["a", "b", "c"] {
//!     store.extend(frontier.push(leaf_hash(entry.as_bytes())));
//! }
//! let root = frontier.root();
//! let proof = inclusion_proof(1, 3, &store).unwrap();
//! assert!(verify_inclusion(1, 3, &leaf_hash(b"b"), &proof, &root).is_ok());
//!
//! let key = AuditKey::from_secret(&[7; 32], "example.com/log").unwrap();
//! let checkpoint = Checkpoint { origin: "example.com/log".into(), size: 3, root, extensions: vec![] };
//! let note = key.sign(&checkpoint);
//! assert_eq!(key.verifier().verify(&note).unwrap(), checkpoint);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod hash;
pub mod note;
pub mod tree;

pub use hash::{Hash, empty_root, leaf_hash, node_hash};
pub use note::{AuditKey, Checkpoint, MAX_NOTE_LEN, MAX_SIGNATURES, NoteError, NoteVerifier};
pub use tree::{
    Frontier, HashReader, MAX_PROOF_LEN, MissingHash, ProofError, VerifyError, consistency_proof,
    inclusion_proof, split_stored_index, stored_count, stored_index, tree_hash, verify_consistency,
    verify_inclusion,
};
