//! Identity key files: a node's secret key on disk, in the form a state
//! directory keeps it (`identity.key`: the line `capwire-identity-v1`, then
//! the secret as 64 lowercase hex digits and a newline), readable by its
//! owner only.
//!
//! `capwire keygen` writes one; placed as `identity.key` in a new state
//! directory it becomes that node's identity, and
//! [`NodeBuilder::keypair`](crate::NodeBuilder::keypair) takes one read
//! with [`read_key_file`].
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("identity.key");
//! let key = capwire::Keypair::generate()?;
//! capwire::identity::write_key_file(&path, &key)?;
//! assert_eq!(capwire::identity::read_key_file(&path)?.public(), key.public());
//! // An existing file is never replaced.
//! assert!(capwire::identity::write_key_file(&path, &key).is_err());
//! # Ok(()) }
//! ```

use std::io;
use std::path::Path;

use capwire_transport::Keypair;

use crate::store::StoreError;
use crate::store::dir::{create_key_at, read_key_at};

/// Reads the key file at `path`.
///
/// # Errors
/// [`StoreError::Io`] when it cannot be read (or does not exist),
/// [`StoreError::Identity`] when other users may read it (mode not 0600 or
/// stricter), [`StoreError::Corrupt`] when it is not a key file.
pub fn read_key_file(path: &Path) -> Result<Keypair, StoreError> {
    read_key_at(path)?.ok_or_else(|| StoreError::Io {
        path: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::NotFound),
    })
}

/// Writes `keypair` to a new key file at `path`, mode 0600, synced to disk.
///
/// # Errors
/// [`StoreError::Io`] when the file exists already (it is never replaced)
/// or cannot be written.
pub fn write_key_file(path: &Path, keypair: &Keypair) -> Result<(), StoreError> {
    create_key_at(path, keypair)
}
