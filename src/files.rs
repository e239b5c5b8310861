//! Private files, replaced atomically and durably: how capwire writes its
//! own files beside a store (a node's `identity.key`, the control plane's
//! book of nodes), for applications that keep secrets of their own there.
//!
//! [`write_private`] writes a temporary file beside the target (mode 0600,
//! a fresh name), syncs it, renames it into place and then syncs the
//! directory, so that after a crash or a power cut the target holds either
//! its old contents or the new ones, never a part, and the rename itself is
//! not lost. Temporary files a crash left behind are removed by the next
//! write; one that cannot be removed breaks nothing.
//!
//! ```
//! use capwire::files::{Replace, write_private};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! write_private(dir.path(), "token", b"first", Replace::Always)?;
//! write_private(dir.path(), "token", b"second", Replace::Always)?;
//! assert_eq!(std::fs::read(dir.path().join("token"))?, b"second");
//! // A file that must never be replaced (a key) is refused when it exists.
//! assert!(write_private(dir.path(), "token", b"third", Replace::Never).is_err());
//! # Ok(()) }
//! ```

use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// What [`write_private`] does when the target exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Replace it.
    Always,
    /// Refuse (`AlreadyExists`) and leave it as it is.
    Never,
}

/// The end of every temporary file's name.
const TEMP_SUFFIX: &str = ".new";

/// Writes `contents` as `dir/name`, mode 0600, atomically and durably (see
/// the [module docs](self)). The caller must be the only writer of `name`
/// in `dir` (a state directory's lock gives that).
///
/// # Errors
/// The I/O error of the step that failed; `AlreadyExists` when the target
/// exists and `replace` is [`Replace::Never`]. Nothing is left of a write
/// that failed: the target is as it was.
pub fn write_private(dir: &Path, name: &str, contents: &[u8], replace: Replace) -> io::Result<()> {
    let prefix = format!(".{name}.");
    remove_leftovers(dir, &prefix);
    let mut file = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(TEMP_SUFFIX)
        .permissions(Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    file.write_all(contents)?;
    file.as_file().sync_all()?;
    let target = dir.join(name);
    // On failure the temporary file is removed as it drops.
    match replace {
        Replace::Always => file.persist(&target).map_err(|e| e.error)?,
        Replace::Never => file.persist_noclobber(&target).map_err(|e| e.error)?,
    };
    // The rename is durable once the directory is.
    sync_dir(dir)
}

/// Syncs a directory, making the creations and renames in it durable.
///
/// # Errors
/// The directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes the files in `dir` named `PREFIX...new`, as far as it can (a
/// leftover that stays breaks nothing: every write takes a new name).
fn remove_leftovers(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Only files: none of ours is anything else.
        if entry.file_type().is_ok_and(|t| t.is_file())
            && name.len() > prefix.len()
            && name.starts_with(prefix)
            && name.ends_with(TEMP_SUFFIX)
        {
            let _ = fs::remove_file(entry.path());
        }
    }
}
