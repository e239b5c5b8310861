//! The durable store: one redb file.
//!
//! Layout (format [`FORMAT_VERSION`]):
//! - `meta` (`&str` -> `&[u8]`): `format` (the format number, 4 bytes
//!   little-endian), `node_id` (32 bytes), `binding`, `config`, `roster`
//!   (records);
//! - `contacts` (node id, 32 bytes -> record);
//! - `members` (cid -> record);
//! - `answers` (32-byte sender followed by the req_id bytes -> record);
//! - `tasks` (16-byte task id -> record), `task_args` (task id -> its args,
//!   a CBOR item) and `task_events` (task id followed by the seq as 8
//!   bytes big-endian -> record); a store made before tasks existed gets
//!   them at its first write that needs them.
//!
//! Records are strict-profile CBOR items (`capwire_envelope::to_vec`).
//!
//! A new file is built under a temporary name and linked into place only
//! once it holds the format key and every table, so a crash while creating
//! it never leaves a half-made `state.redb` behind. An existing file is
//! checked through a read-only handle first (which never writes), so a file
//! that is not ours is refused without being touched.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use capwire_envelope::NodeId;
use redb::backends::FileBackend;
use redb::{
    Builder, Database, DatabaseError, Durability, ReadTransaction, ReadableDatabase, ReadableTable,
    TableDefinition, TableError, WriteTransaction,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::records::FORMAT_VERSION;
use super::{
    AnswerKey, AnswerRecord, Batch, ContactRecord, Loaded, MemberRecord, RosterMeta, Store,
    StoreError, TaskEventRecord, TaskRecord,
};

const META: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("meta");
const CONTACTS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("contacts");
const MEMBERS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("members");
const ANSWERS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("answers");
const TASKS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("tasks");
const TASK_EVENTS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("task_events");
const TASK_ARGS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("task_args");

/// The table key of a task event: the task's id, then the seq big-endian
/// (so that a task's events are in order and together).
fn event_key(id: &[u8], seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + 8);
    key.extend_from_slice(id);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

const KEY_FORMAT: &str = "format";
const KEY_NODE_ID: &str = "node_id";
const KEY_BINDING: &str = "binding";
const KEY_CONFIG: &str = "config";
const KEY_REVOCATIONS: &str = "revocations";
const KEY_ROSTER: &str = "roster";
const KEY_CLOCK_FLOOR: &str = "clock_floor";

/// redb caches at most this much of the file (its default is 1 GiB).
const CACHE_BYTES: usize = 16 << 20;

/// What [`RedbStore::open`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Opened {
    /// The file did not exist and was created by this open.
    pub(crate) created: bool,
    /// The node the store belongs to, once [`RedbStore::set_node_id`] has
    /// recorded it.
    pub(crate) node_id: Option<NodeId>,
}

/// A [`Store`] in one redb file. The open handle holds redb's lock on the
/// file: no other handle, in this process or another, opens it meanwhile.
#[derive(Debug)]
pub(crate) struct RedbStore {
    db: Database,
    path: PathBuf,
}

impl RedbStore {
    /// Opens the store at `path`, creating it (mode 0600) when it does not
    /// exist. An existing file is never recreated, repaired beyond redb's
    /// own crash recovery, or rewritten when it is not a store of this
    /// format.
    ///
    /// # Errors
    /// [`StoreError::Locked`] when another handle has it open;
    /// [`StoreError::Corrupt`] when it is not a redb file or is damaged;
    /// [`StoreError::Foreign`] when it is a redb file of something else, or
    /// of another format; [`StoreError::Permission`] / [`StoreError::Io`].
    pub(crate) fn open(path: &Path) -> Result<(RedbStore, Opened), StoreError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Self::open_existing(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match Self::create(path)? {
                Some(created) => Ok(created),
                // Another process created it first.
                None => Self::open_existing(path),
            },
            Err(e) => Err(io_error(path, e)),
        }
    }

    /// Records the node the store belongs to (durably).
    ///
    /// # Errors
    /// [`StoreError::Write`] when the write fails.
    pub(crate) fn set_node_id(&self, id: NodeId) -> Result<(), StoreError> {
        let txn = self.begin_write()?;
        let written = (|| -> Result<(), redb::Error> {
            let mut meta = txn.open_table(META)?;
            meta.insert(KEY_NODE_ID, id.as_bytes().as_slice())?;
            Ok(())
        })();
        finish(txn, written)
    }

    /// Builds a new store under a temporary name and links it to `path`.
    /// `None` when `path` appeared meanwhile.
    fn create(path: &Path) -> Result<Option<(RedbStore, Opened)>, StoreError> {
        let temp = temp_name(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| io_error(&temp, e))?;
        let built = Self::initialize(path, &temp, file).and_then(|db| {
            match std::fs::hard_link(&temp, path) {
                Ok(()) => Ok(Some(db)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(io_error(path, e)),
            }
        });
        // The temporary name goes whatever happened; the file lives on
        // under `path` when the link was made.
        let removed = std::fs::remove_file(&temp).map_err(|e| io_error(&temp, e));
        let Some(db) = built? else {
            return Ok(None);
        };
        removed?;
        sync_dir(path)?;
        Ok(Some((
            RedbStore {
                db,
                path: path.to_path_buf(),
            },
            Opened {
                created: true,
                node_id: None,
            },
        )))
    }

    /// Makes `file` a store of this format: the format key and every table.
    fn initialize(path: &Path, temp: &Path, file: File) -> Result<Database, StoreError> {
        let backend = FileBackend::new(file).map_err(|e| open_error(temp, e.into()))?;
        let db = Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(backend)
            .map_err(|e| open_error(temp, e.into()))?;
        let store = RedbStore {
            db,
            path: path.to_path_buf(),
        };
        let txn = store.begin_write()?;
        let written = (|| -> Result<(), redb::Error> {
            let mut meta = txn.open_table(META)?;
            meta.insert(KEY_FORMAT, FORMAT_VERSION.to_le_bytes().as_slice())?;
            txn.open_table(CONTACTS)?;
            txn.open_table(MEMBERS)?;
            txn.open_table(ANSWERS)?;
            txn.open_table(TASKS)?;
            txn.open_table(TASK_EVENTS)?;
            txn.open_table(TASK_ARGS)?;
            Ok(())
        })();
        finish(txn, written)?;
        Ok(store.db)
    }

    fn open_existing(path: &Path) -> Result<(RedbStore, Opened), StoreError> {
        let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
        if !meta.is_file() {
            return Err(StoreError::Foreign {
                path: path.to_path_buf(),
                detail: "not a regular file".into(),
            });
        }
        guarded(path, || Self::check_read_only(path))?;
        let db = guarded(path, || {
            let mut builder = Builder::new();
            builder.set_cache_size(CACHE_BYTES);
            builder.open(path).map_err(|e| open_error(path, e.into()))
        })?;
        let store = RedbStore {
            db,
            path: path.to_path_buf(),
        };
        let node_id = guarded(path, || {
            let txn = store
                .db
                .begin_read()
                .map_err(|e| open_error(path, e.into()))?;
            check_format(path, &txn)
        })?;
        Ok((
            store,
            Opened {
                created: false,
                node_id,
            },
        ))
    }

    /// Checks the file through a read-only handle, which writes nothing,
    /// so that a file that is not ours stays exactly as it was. A file that
    /// was not closed cleanly cannot be read that way: the writable open
    /// then runs redb's crash recovery, and the file is checked after it.
    fn check_read_only(path: &Path) -> Result<(), StoreError> {
        let db = match Builder::new()
            .set_cache_size(CACHE_BYTES)
            .open_read_only(path)
        {
            Ok(db) => db,
            Err(DatabaseError::RepairAborted) => {
                tracing::warn!(
                    path = %path.display(),
                    "state file was not closed cleanly; recovering it"
                );
                return Ok(());
            }
            Err(e) => return Err(open_error(path, e.into())),
        };
        let txn = db.begin_read().map_err(|e| open_error(path, e.into()))?;
        check_format(path, &txn).map(drop)
    }

    fn begin_write(&self) -> Result<WriteTransaction, StoreError> {
        let mut txn = self.db.begin_write().map_err(write_error)?;
        if let Err(e) = txn.set_durability(Durability::Immediate) {
            let _ = txn.abort();
            return Err(write_error(e));
        }
        Ok(txn)
    }

    fn read_all(&self) -> Result<Loaded, StoreError> {
        let path = &self.path;
        let txn = self
            .db
            .begin_read()
            .map_err(|e| open_error(path, e.into()))?;
        let table_error = |e: TableError| open_error(path, e.into());
        let storage_error = |e: redb::StorageError| open_error(path, e.into());

        let meta = txn.open_table(META).map_err(table_error)?;
        let meta_record = |key: &str| -> Result<Option<Vec<u8>>, StoreError> {
            Ok(meta
                .get(key)
                .map_err(storage_error)?
                .map(|v| v.value().to_vec()))
        };
        let mut loaded = Loaded {
            binding: meta_record(KEY_BINDING)?
                .map(|v| decode(path, "binding", &v))
                .transpose()?,
            config: meta_record(KEY_CONFIG)?
                .map(|v| decode(path, "config", &v))
                .transpose()?,
            revocations: meta_record(KEY_REVOCATIONS)?
                .map(|v| decode(path, "revocations", &v))
                .transpose()?,
            roster: meta_record(KEY_ROSTER)?
                .map(|v| decode::<RosterMeta>(path, "roster", &v))
                .transpose()?
                .unwrap_or_default(),
            clock_floor_ms: meta_record(KEY_CLOCK_FLOOR)?
                .map(|v| decode::<u64>(path, "clock floor", &v))
                .transpose()?,
            ..Loaded::default()
        };

        for item in txn
            .open_table(CONTACTS)
            .map_err(table_error)?
            .iter()
            .map_err(storage_error)?
        {
            let (k, v) = item.map_err(storage_error)?;
            let record: ContactRecord = decode(path, "contact", v.value())?;
            check_key(path, "contact", k.value(), record.id.as_bytes())?;
            loaded.contacts.push(record);
        }
        for item in txn
            .open_table(MEMBERS)
            .map_err(table_error)?
            .iter()
            .map_err(storage_error)?
        {
            let (k, v) = item.map_err(storage_error)?;
            let record: MemberRecord = decode(path, "member", v.value())?;
            check_key(path, "member", k.value().as_bytes(), record.cid.as_bytes())?;
            loaded.members.push(record);
        }
        for item in txn
            .open_table(ANSWERS)
            .map_err(table_error)?
            .iter()
            .map_err(storage_error)?
        {
            let (k, v) = item.map_err(storage_error)?;
            let record: AnswerRecord = decode(path, "answer", v.value())?;
            check_key(path, "answer", k.value(), &answer_key(&record.key))?;
            loaded.answers.push(record);
        }
        // A store made before tasks existed has no such table yet.
        match txn.open_table(TASKS) {
            Ok(table) => {
                for item in table.iter().map_err(storage_error)? {
                    let (k, v) = item.map_err(storage_error)?;
                    let record: TaskRecord = decode(path, "task", v.value())?;
                    check_key(path, "task", k.value(), &record.id)?;
                    loaded.tasks.push(record);
                }
            }
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(table_error(e)),
        }
        Ok(loaded)
    }
}

impl Store for RedbStore {
    fn load(&self) -> Result<Loaded, StoreError> {
        guarded(&self.path, || self.read_all())
    }

    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        // Everything is encoded before the transaction begins.
        let binding = batch.binding.as_ref().map(encode).transpose()?;
        let config = batch.config.as_ref().map(encode).transpose()?;
        let revocations = batch.revocations.as_ref().map(encode).transpose()?;
        let roster = batch.roster.as_ref().map(encode).transpose()?;
        let clock_floor = batch.clock_floor_ms.as_ref().map(encode).transpose()?;
        let contacts = batch
            .put_contacts
            .iter()
            .map(|c| Ok((c.id.as_bytes().to_vec(), encode(c)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let members = batch
            .put_members
            .iter()
            .map(|m| Ok((m.cid.as_str(), encode(m)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let answers = batch
            .put_answers
            .iter()
            .map(|a| Ok((answer_key(&a.key), encode(a)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let tasks = batch
            .put_tasks
            .iter()
            .map(|t| Ok((t.id.as_slice(), encode(t)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let events = batch
            .put_task_events
            .iter()
            .map(|(id, e)| Ok((event_key(id, e.seq), encode(e)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let touches_tasks = !(batch.put_tasks.is_empty()
            && batch.put_task_args.is_empty()
            && batch.del_tasks.is_empty()
            && batch.put_task_events.is_empty()
            && batch.fold_task_events.is_empty());

        let txn = self.begin_write()?;
        let written = (|| -> Result<(), redb::Error> {
            let mut meta = txn.open_table(META)?;
            for (key, value) in [
                (KEY_BINDING, &binding),
                (KEY_CONFIG, &config),
                (KEY_REVOCATIONS, &revocations),
                (KEY_ROSTER, &roster),
                (KEY_CLOCK_FLOOR, &clock_floor),
            ] {
                if let Some(value) = value {
                    meta.insert(key, value.as_slice())?;
                }
            }
            let mut table = txn.open_table(CONTACTS)?;
            for id in &batch.del_contacts {
                table.remove(id.as_bytes().as_slice())?;
            }
            for (key, value) in &contacts {
                table.insert(key.as_slice(), value.as_slice())?;
            }
            let mut table = txn.open_table(MEMBERS)?;
            for cid in &batch.del_members {
                table.remove(cid.as_str())?;
            }
            for (key, value) in &members {
                table.insert(*key, value.as_slice())?;
            }
            let mut table = txn.open_table(ANSWERS)?;
            for key in &batch.del_answers {
                table.remove(answer_key(key).as_slice())?;
            }
            for (key, value) in &answers {
                table.insert(key.as_slice(), value.as_slice())?;
            }
            if touches_tasks {
                let mut table = txn.open_table(TASKS)?;
                for id in &batch.del_tasks {
                    table.remove(id.as_slice())?;
                }
                for (key, value) in &tasks {
                    table.insert(*key, value.as_slice())?;
                }
                let mut table = txn.open_table(TASK_EVENTS)?;
                for id in &batch.del_tasks {
                    let (from, to) = (event_key(id, 0), event_key(id, u64::MAX));
                    table.retain_in(from.as_slice()..=to.as_slice(), |_, _| false)?;
                }
                for (key, value) in &events {
                    table.insert(key.as_slice(), value.as_slice())?;
                }
                // After the puts: a fold may reach events put in this batch.
                for (id, from, to) in &batch.fold_task_events {
                    if from >= to {
                        continue;
                    }
                    let (from, to) = (event_key(id, *from), event_key(id, *to));
                    table.retain_in(from.as_slice()..to.as_slice(), |_, _| false)?;
                }
                let mut table = txn.open_table(TASK_ARGS)?;
                for id in &batch.del_tasks {
                    table.remove(id.as_slice())?;
                }
                for (id, args) in &batch.put_task_args {
                    table.insert(id.as_slice(), args.as_slice())?;
                }
            }
            Ok(())
        })();
        finish(txn, written)
    }

    fn task_args(&self, id: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let path = &self.path;
        guarded(path, || {
            let txn = self
                .db
                .begin_read()
                .map_err(|e| open_error(path, e.into()))?;
            let table = match txn.open_table(TASK_ARGS) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(open_error(path, e.into())),
            };
            Ok(table
                .get(id)
                .map_err(|e| open_error(path, e.into()))?
                .map(|v| v.value().to_vec()))
        })
    }

    fn task_events(
        &self,
        id: &[u8],
        from: u64,
        limit: usize,
    ) -> Result<Vec<TaskEventRecord>, StoreError> {
        let path = &self.path;
        guarded(path, || {
            let txn = self
                .db
                .begin_read()
                .map_err(|e| open_error(path, e.into()))?;
            let table = match txn.open_table(TASK_EVENTS) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(open_error(path, e.into())),
            };
            let (lo, hi) = (event_key(id, from), event_key(id, u64::MAX));
            // (`from` may be 0: the first event is 1.)
            let mut out = Vec::new();
            for item in table
                .range(lo.as_slice()..=hi.as_slice())
                .map_err(|e| open_error(path, e.into()))?
                .take(limit)
            {
                let (_, v) = item.map_err(|e| open_error(path, e.into()))?;
                out.push(decode(path, "task event", v.value())?);
            }
            Ok(out)
        })
    }
}

/// Commits `txn` when `written` is `Ok`, aborts it otherwise.
fn finish(txn: WriteTransaction, written: Result<(), redb::Error>) -> Result<(), StoreError> {
    match written {
        Ok(()) => txn.commit().map_err(write_error),
        Err(e) => {
            // Dropping the transaction would abort it too; an abort that
            // fails changes nothing on disk either.
            let _ = txn.abort();
            Err(write_error(e))
        }
    }
}

/// Checks that `txn` reads a store of this format; returns its node id.
fn check_format(path: &Path, txn: &ReadTransaction) -> Result<Option<NodeId>, StoreError> {
    let foreign = |detail: String| StoreError::Foreign {
        path: path.to_path_buf(),
        detail,
    };
    let meta = txn
        .open_table(META)
        .map_err(|e| open_error(path, e.into()))?;
    let format = meta
        .get(KEY_FORMAT)
        .map_err(|e| open_error(path, e.into()))?
        .ok_or_else(|| foreign("no format key in table meta".into()))?;
    let format = <[u8; 4]>::try_from(format.value())
        .map(u32::from_le_bytes)
        .map_err(|_| foreign(format!("format key of {} bytes", format.value().len())))?;
    if format != FORMAT_VERSION {
        return Err(foreign(format!(
            "format {format}, this build reads format {FORMAT_VERSION}"
        )));
    }
    txn.open_table(CONTACTS)
        .map_err(|e| open_error(path, e.into()))?;
    txn.open_table(MEMBERS)
        .map_err(|e| open_error(path, e.into()))?;
    txn.open_table(ANSWERS)
        .map_err(|e| open_error(path, e.into()))?;
    let node_id = meta
        .get(KEY_NODE_ID)
        .map_err(|e| open_error(path, e.into()))?;
    node_id
        .map(|v| {
            NodeId::from_slice(v.value()).map_err(|e| StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("meta node_id: {e}"),
            })
        })
        .transpose()
}

/// Runs `f`, reporting a panic inside redb (which a damaged file can
/// cause) as [`StoreError::Corrupt`].
fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unreadable".into());
        Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("reading it failed: {detail}"),
        })
    })
}

/// The table key of an answer: the sender's 32 bytes, then the req_id.
fn answer_key(key: &AnswerKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + key.req_id.len());
    out.extend_from_slice(key.sender.as_bytes());
    out.extend_from_slice(key.req_id.as_bytes());
    out
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    capwire_envelope::to_vec(value).map_err(|e| StoreError::Write(format!("encoding: {e}")))
}

fn decode<T: DeserializeOwned>(path: &Path, what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    capwire_envelope::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: format!("{what} record: {e}"),
    })
}

fn check_key(path: &Path, what: &str, key: &[u8], expected: &[u8]) -> Result<(), StoreError> {
    if key == expected {
        Ok(())
    } else {
        Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("{what} record stored under another key"),
        })
    }
}

/// The directory holding `path`, named by [`StoreError::Locked`].
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A name beside `path` that no other open uses.
fn temp_name(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    parent(path).join(format!(
        ".{name}.{}.{}.{nanos}.new",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

fn sync_dir(path: &Path) -> Result<(), StoreError> {
    let dir = parent(path);
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(&dir, e))
}

pub(super) fn io_error(path: &Path, source: io::Error) -> StoreError {
    let path = path.to_path_buf();
    if source.kind() == io::ErrorKind::PermissionDenied {
        StoreError::Permission { path, source }
    } else {
        StoreError::Io { path, source }
    }
}

fn write_error(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Write(e.into().to_string())
}

/// Maps an error met while opening or reading the file at `path`.
fn open_error(path: &Path, e: redb::Error) -> StoreError {
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let foreign = |detail: String| StoreError::Foreign {
        path: path.to_path_buf(),
        detail,
    };
    match e {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => {
            StoreError::Locked(parent(path))
        }
        // redb reports a file that is not a redb database (wrong magic
        // number, empty) as InvalidData, and reading past the end of a
        // truncated one as UnexpectedEof.
        redb::Error::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ) =>
        {
            corrupt(e.to_string())
        }
        redb::Error::Io(e) => io_error(path, e),
        redb::Error::Corrupted(detail) => corrupt(detail),
        redb::Error::UpgradeRequired(v) => foreign(format!("redb file format {v}")),
        e @ (redb::Error::TableDoesNotExist(_)
        | redb::Error::TableTypeMismatch { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TypeDefinitionChanged { .. }) => foreign(e.to_string()),
        e => StoreError::Io {
            path: path.to_path_buf(),
            source: io::Error::other(e.to_string()),
        },
    }
}
