//! The state directory: its permissions, its lock, the identity key.
//!
//! A state directory is its user's alone: it must belong to the effective
//! user of the process and let nobody else in (no group or other bits,
//! so mode 0700), which is checked on every open, not only when it is
//! created; a directory that fails is refused with the command that fixes
//! it. It holds `state.redb` (the [`RedbStore`], whose lock
//! keeps every other node out while it is open) and `identity.key` (the
//! node's secret key: `capwire-identity-v1\n`, 64 lowercase hex digits,
//! `\n`; mode 0600). The store records the node id the key belongs to, so
//! a key and a store that do not belong together are refused, and a store
//! whose key is lost is never given a new identity.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use capwire_transport::Keypair;
use zeroize::Zeroize;

use super::StoreError;
use super::redb::{RedbStore, io_error};
use crate::files::{Replace, write_private};

/// The store's file in the state directory.
pub(crate) const STORE_FILE: &str = "state.redb";
/// The identity key's file in the state directory.
pub(crate) const KEY_FILE: &str = "identity.key";
// A new key file is written as `.identity.key.XXXXXX.new` (a fresh random
// name each time) before it is renamed into place (`crate::files`).
const KEY_HEADER: &[u8] = b"capwire-identity-v1\n";
/// The whole key file: header, 64 hex digits, newline.
const KEY_TEXT_LEN: usize = KEY_HEADER.len() + 64 + 1;

/// An open state directory: its store (locked for as long as this value
/// or a clone of [`StateDir::store`] lives) and the node's identity.
#[derive(Debug)]
pub(crate) struct StateDir {
    store: Arc<RedbStore>,
    keypair: Keypair,
}

impl StateDir {
    /// Opens the state directory at `path`, creating it (mode 0700, parents
    /// too) when missing.
    ///
    /// The identity: a new directory takes `keypair`, or a generated key,
    /// and writes it to `identity.key`; an existing one uses the key it
    /// holds, and `keypair`, when given, must be that key.
    ///
    /// # Errors
    /// [`StoreError::NotADirectory`], [`StoreError::NotPrivate`] (another
    /// user owns it, or its mode lets others in), [`StoreError::Permission`],
    /// [`StoreError::Locked`] (another node has it open), the store's
    /// errors, [`StoreError::Identity`] (key and store do not belong
    /// together, the key is missing while the store exists, `keypair` is
    /// another key, or the key file is readable by other users) and
    /// [`StoreError::Corrupt`] (the key file is damaged).
    pub(crate) fn open(path: &Path, keypair: Option<Keypair>) -> Result<StateDir, StoreError> {
        prepare_dir(path)?;
        let (store, opened) = RedbStore::open(&path.join(STORE_FILE))?;
        let identity = |detail: String| StoreError::Identity {
            path: path.to_path_buf(),
            detail,
        };
        let stored = read_key_file(path)?;
        let (chosen, record) = match (opened.node_id, stored) {
            (Some(id), Some(stored)) => {
                if stored.public() != id {
                    return Err(identity(format!(
                        "{KEY_FILE} holds the key of node {}, but the store belongs to node {id}",
                        stored.public()
                    )));
                }
                (stored, false)
            }
            (Some(id), None) => {
                return Err(identity(format!(
                    "the store belongs to node {id}, but {KEY_FILE} is missing; restore it \
                     from a backup (a new identity is never made for an existing store)"
                )));
            }
            (None, Some(stored)) => (stored, true),
            (None, None) => {
                let new = match keypair {
                    Some(ref given) => given.clone(),
                    None => Keypair::generate().map_err(|e| StoreError::Io {
                        path: path.join(KEY_FILE),
                        source: io::Error::other(e),
                    })?,
                };
                write_key_file(path, &new)?;
                (new, true)
            }
        };
        if let Some(given) = &keypair
            && given.public() != chosen.public()
        {
            return Err(identity(format!(
                "the given key is node {}, but this directory belongs to node {}",
                given.public(),
                chosen.public()
            )));
        }
        if record {
            store.set_node_id(chosen.public())?;
        }
        Ok(StateDir {
            store: Arc::new(store),
            keypair: chosen,
        })
    }

    /// The store. The directory stays locked until every clone is dropped.
    pub(crate) fn store(&self) -> Arc<RedbStore> {
        Arc::clone(&self.store)
    }

    /// The node's identity.
    pub(crate) fn keypair(&self) -> &Keypair {
        &self.keypair
    }
}

/// Makes sure `path` is a directory we can use, and ours alone, creating
/// it when missing.
fn prepare_dir(path: &Path) -> Result<(), StoreError> {
    let not_a_directory = || StoreError::NotADirectory(path.to_path_buf());
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            check_private(path, &meta)?;
            // Listing it proves it can be read; writing is proven by the
            // store and key files, whose errors say Permission too.
            fs::read_dir(path).map_err(|e| io_error(path, e))?;
            Ok(())
        }
        Ok(_) => Err(not_a_directory()),
        Err(e) if e.kind() == io::ErrorKind::NotADirectory => Err(not_a_directory()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::NotADirectory => not_a_directory(),
                    _ => io_error(path, e),
                })?;
            // Whatever the umask left, the directory is ours alone.
            fs::set_permissions(path, Permissions::from_mode(0o700))
                .map_err(|e| io_error(path, e))?;
            // A directory someone else made meanwhile is not ours.
            let meta = fs::metadata(path).map_err(|e| io_error(path, e))?;
            check_private(path, &meta)?;
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
            Ok(())
        }
        Err(e) => Err(io_error(path, e)),
    }
}

/// Refuses a state directory that is not this user's alone: another
/// user's, or one whose mode lets group or others in (they could read the
/// key, change the store, or use a control plane's socket).
fn check_private(path: &Path, meta: &Metadata) -> Result<(), StoreError> {
    let not_private = |detail: String| StoreError::NotPrivate {
        path: path.to_path_buf(),
        detail,
    };
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(not_private(format!(
            "it belongs to uid {}, and this process runs as uid {me}; run it as the \
             directory's owner, or, if the directory is meant to be this user's, give it to \
             this user with `chown -R {me} {}`",
            meta.uid(),
            path.display()
        )));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(not_private(format!(
            "its mode {mode:03o} lets other users in, and it holds the node's secret key; \
             run `chmod 700 {}`",
            path.display()
        )));
    }
    Ok(())
}

/// Reads `dir`'s key file; `None` when there is none.
fn read_key_file(dir: &Path) -> Result<Option<Keypair>, StoreError> {
    read_key_at(&dir.join(KEY_FILE))
}

/// Reads the key file at `path`; `None` when there is none.
pub(crate) fn read_key_at(path: &Path) -> Result<Option<Keypair>, StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let path = path.to_path_buf();
    let corrupt = |detail: &str| StoreError::Corrupt {
        path: path.clone(),
        detail: detail.to_owned(),
    };
    let mut file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&path, e)),
    };
    let meta = file.metadata().map_err(|e| io_error(&path, e))?;
    if !meta.is_file() {
        return Err(corrupt("not a regular file"));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(StoreError::Identity {
            path: dir.to_path_buf(),
            detail: format!(
                "{} has mode {mode:03o}: other users may have read the secret key, so it is \
                 not used; if it has not leaked, run `chmod 600 {}`",
                path.display(),
                path.display()
            ),
        });
    }
    // A stack buffer one byte longer than a key file, so that a longer
    // file is noticed without the secret ever being copied to the heap.
    let mut text = [0u8; KEY_TEXT_LEN + 1];
    let result = read_up_to(&mut file, &mut text)
        .map_err(|e| io_error(&path, e))
        .and_then(|n| {
            parse_key(&text[..n]).ok_or_else(|| corrupt("not a capwire-identity-v1 key"))
        });
    text.zeroize();
    result.map(Some)
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The key in a key file's text, or `None` when the text is not exactly
/// a key file (lowercase hex only, as the format says).
fn parse_key(text: &[u8]) -> Option<Keypair> {
    let hex = text.strip_prefix(KEY_HEADER)?.strip_suffix(b"\n")?;
    if hex.len() != 64 {
        return None;
    }
    let mut secret = [0u8; 32];
    // base16ct decodes without branching on the digits: the secret does
    // not leak through timing.
    let valid = base16ct::lower::decode(hex, &mut secret).is_ok_and(|s| s.len() == 32);
    let keypair = valid.then(|| Keypair::from_secret_bytes(secret));
    secret.zeroize();
    keypair
}

/// Writes `keypair` as `dir`'s key file, atomically: a complete file
/// (mode 0600, synced) is renamed into place, never over a key file that
/// exists, and the directory synced.
fn write_key_file(dir: &Path, keypair: &Keypair) -> Result<(), StoreError> {
    with_key_text(keypair, |text| write_atomically(dir, KEY_FILE, text))
}

/// Writes a new key file at `path` (mode 0600), never replacing a file
/// that exists.
pub(crate) fn create_key_at(path: &Path, keypair: &Keypair) -> Result<(), StoreError> {
    with_key_text(keypair, |text| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        let written = file
            .write_all(text)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error(path, e));
        drop(file);
        if written.is_err() {
            let _ = fs::remove_file(path);
        }
        written?;
        match path.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => sync_dir(parent),
            None => Ok(()),
        }
    })
}

/// Runs `write` on the key file text of `keypair`, then wipes the text.
fn with_key_text(
    keypair: &Keypair,
    write: impl FnOnce(&[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let secret = keypair.secret_bytes();
    let mut text = [0u8; KEY_TEXT_LEN];
    let (header, rest) = text.split_at_mut(KEY_HEADER.len());
    header.copy_from_slice(KEY_HEADER);
    let result = match base16ct::lower::encode(&secret[..], &mut rest[..64]) {
        Ok(_) => {
            text[KEY_TEXT_LEN - 1] = b'\n';
            write(&text)
        }
        // 32 bytes always fit in 64 digits.
        Err(_) => Err(StoreError::Write("cannot encode the key".into())),
    };
    text.zeroize();
    result
}

/// Writes `text` as the new file `dir/name`, never replacing one that
/// exists, atomically and durably ([`write_private`]).
fn write_atomically(dir: &Path, name: &str, text: &[u8]) -> Result<(), StoreError> {
    write_private(dir, name, text, Replace::Never).map_err(|e| io_error(&dir.join(name), e))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    crate::files::sync_dir(dir).map_err(|e| io_error(dir, e))
}
