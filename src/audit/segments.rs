//! Where the audit log's bytes live: segments of [`SEGMENT`] entries, each
//! an entries file (`<n>.log`: every entry as a 4-byte big-endian length
//! and its bytes) and a hashes file (`<n>.hash`: the tree's stored hashes
//! that the segment's leaves complete, 32 bytes each, in stored order), in
//! a directory of their own, or in memory for a node without a state
//! directory. Small named files beside them hold what pruning keeps and
//! the last signed checkpoint.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Entries per segment (a power of two, so that a pruned prefix ends on a
/// subtree boundary).
pub(crate) const SEGMENT: u64 = 1024;

/// A place for segments.
pub(crate) trait Segments: Send {
    /// The segments present, lowest first.
    fn list(&self) -> io::Result<Vec<u64>>;
    /// Appends to segment `seg` (made when missing).
    fn append(&mut self, seg: u64, entries: &[u8], hashes: &[u8]) -> io::Result<()>;
    /// The whole entries file of `seg`.
    fn read_entries(&self, seg: u64) -> io::Result<Vec<u8>>;
    /// The stored hash at `offset` (in hashes) of `seg`'s hashes file, if
    /// there is one.
    fn read_hash(&self, seg: u64, offset: u64) -> io::Result<Option<[u8; 32]>>;
    /// Lengths in bytes of `seg`'s entries and hashes files.
    fn lens(&self, seg: u64) -> io::Result<(u64, u64)>;
    /// Cuts `seg`'s files to these lengths (after a crash mid-write).
    fn truncate(&mut self, seg: u64, entries: u64, hashes: u64) -> io::Result<()>;
    /// Deletes `seg`.
    fn remove(&mut self, seg: u64) -> io::Result<()>;
    /// Makes what was appended durable.
    fn sync(&mut self) -> io::Result<()>;
    /// What makes what was appended so far durable, to run without the
    /// log's lock (`None`: nothing to do).
    fn syncer(&mut self) -> io::Result<Option<Syncer>>;
    /// A small named file, if present.
    fn read_meta(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Replaces a small named file, atomically (and durably when asked).
    fn write_meta(&mut self, name: &str, data: &[u8], durable: bool) -> io::Result<()>;
}

/// Syncs what was appended, apart from the log's lock: the open
/// segment's files, and those of the segments left since the last sync
/// (by path; one pruned meanwhile is gone, and nothing to sync).
pub(crate) struct Syncer {
    files: Vec<File>,
    paths: Vec<PathBuf>,
}

impl Syncer {
    /// Syncs them.
    pub(crate) fn sync(self) -> io::Result<()> {
        for p in &self.paths {
            if let Some(f) = missing_is_none(File::open(p))? {
                f.sync_data()?;
            }
        }
        for f in &self.files {
            f.sync_data()?;
        }
        Ok(())
    }
}

/// Segments as files in a directory.
pub(crate) struct DirSegments {
    dir: PathBuf,
    /// The segment being appended to, with its files open.
    open: Option<(u64, File, File)>,
    /// Segments left since the last sync: the next sync (or syncer)
    /// covers them too.
    left: Vec<u64>,
}

impl DirSegments {
    /// The directory `dir`, made (private to this user) when missing.
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            open: None,
            left: Vec::new(),
        })
    }

    fn path(&self, seg: u64, ext: &str) -> PathBuf {
        self.dir.join(format!("{seg:012}.{ext}"))
    }

    fn files(&mut self, seg: u64) -> io::Result<&mut (u64, File, File)> {
        if self.open.as_ref().is_none_or(|(s, _, _)| *s != seg) {
            // A segment left is synced with the next sync (not here: this
            // runs on the path of a call's answer).
            if let Some((s, _, _)) = self.open.take() {
                self.left.push(s);
            }
            let open = |p: PathBuf| {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(p)
            };
            let entries = open(self.path(seg, "log"))?;
            let hashes = open(self.path(seg, "hash"))?;
            self.open = Some((seg, entries, hashes));
        }
        match self.open.as_mut() {
            Some(f) => Ok(f),
            None => Err(io::Error::other("no open segment")),
        }
    }
}

/// Appends all of `buf` to `f`, or nothing: a write that fails midway is
/// cut off again.
fn append_all(f: &mut File, buf: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.write(&buf[done..]) {
            Ok(0) => {
                cut(f, done);
                return Err(io::ErrorKind::WriteZero.into());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                cut(f, done);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Takes the last `n` bytes written off `f` (best effort: a file that
/// cannot be cut is repaired when the log is opened again).
fn cut(f: &File, n: usize) {
    if n > 0
        && let Ok(m) = f.metadata()
    {
        let _ = f.set_len(m.len().saturating_sub(n as u64));
    }
}

fn missing_is_none<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Segments for DirSegments {
    fn list(&self) -> io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(n) = name.strip_suffix(".log")
                && n.len() == 12
                && let Ok(n) = n.parse::<u64>()
            {
                out.push(n);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    fn append(&mut self, seg: u64, entries: &[u8], hashes: &[u8]) -> io::Result<()> {
        let (_, e, h) = self.files(seg)?;
        // All or nothing, so that the log's retry appends each record once.
        append_all(e, entries)?;
        if let Err(err) = append_all(h, hashes) {
            cut(e, entries.len());
            return Err(err);
        }
        Ok(())
    }

    fn read_entries(&self, seg: u64) -> io::Result<Vec<u8>> {
        Ok(missing_is_none(std::fs::read(self.path(seg, "log")))?.unwrap_or_default())
    }

    fn read_hash(&self, seg: u64, offset: u64) -> io::Result<Option<[u8; 32]>> {
        let Some(f) = missing_is_none(File::open(self.path(seg, "hash")))? else {
            return Ok(None);
        };
        let mut out = [0u8; 32];
        match f.read_exact_at(&mut out, offset * 32) {
            Ok(()) => Ok(Some(out)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn lens(&self, seg: u64) -> io::Result<(u64, u64)> {
        let len = |p: PathBuf| -> io::Result<u64> {
            Ok(missing_is_none(std::fs::metadata(p))?.map_or(0, |m| m.len()))
        };
        Ok((len(self.path(seg, "log"))?, len(self.path(seg, "hash"))?))
    }

    fn truncate(&mut self, seg: u64, entries: u64, hashes: u64) -> io::Result<()> {
        self.open = None;
        for (ext, len) in [("log", entries), ("hash", hashes)] {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(self.path(seg, ext))?;
            f.set_len(len)?;
            f.sync_all()?;
        }
        Ok(())
    }

    fn remove(&mut self, seg: u64) -> io::Result<()> {
        if self.open.as_ref().is_some_and(|(s, _, _)| *s == seg) {
            self.open = None;
        }
        for ext in ["log", "hash"] {
            missing_is_none(std::fs::remove_file(self.path(seg, ext)))?;
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        match self.syncer()? {
            Some(s) => s.sync(),
            None => Ok(()),
        }
    }

    fn syncer(&mut self) -> io::Result<Option<Syncer>> {
        let mut paths = Vec::new();
        for s in std::mem::take(&mut self.left) {
            paths.extend([self.path(s, "log"), self.path(s, "hash")]);
        }
        let mut files = Vec::new();
        if let Some((_, e, h)) = &self.open {
            files.extend([e.try_clone()?, h.try_clone()?]);
        }
        Ok((!files.is_empty() || !paths.is_empty()).then_some(Syncer { files, paths }))
    }

    fn read_meta(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        missing_is_none(std::fs::read(self.dir.join(name)))
    }

    fn write_meta(&mut self, name: &str, data: &[u8], durable: bool) -> io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(name))?;
        if durable {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Segments in memory (a node without a state directory).
#[derive(Default)]
pub(crate) struct MemorySegments {
    segs: BTreeMap<u64, (Vec<u8>, Vec<u8>)>,
    meta: BTreeMap<String, Vec<u8>>,
}

impl Segments for MemorySegments {
    fn list(&self) -> io::Result<Vec<u64>> {
        Ok(self.segs.keys().copied().collect())
    }

    fn append(&mut self, seg: u64, entries: &[u8], hashes: &[u8]) -> io::Result<()> {
        let s = self.segs.entry(seg).or_default();
        s.0.extend_from_slice(entries);
        s.1.extend_from_slice(hashes);
        Ok(())
    }

    fn read_entries(&self, seg: u64) -> io::Result<Vec<u8>> {
        Ok(self.segs.get(&seg).map(|s| s.0.clone()).unwrap_or_default())
    }

    fn read_hash(&self, seg: u64, offset: u64) -> io::Result<Option<[u8; 32]>> {
        let Some((_, h)) = self.segs.get(&seg) else {
            return Ok(None);
        };
        let at = usize::try_from(offset * 32).unwrap_or(usize::MAX);
        Ok(h.get(at..at.saturating_add(32))
            .and_then(|b| <[u8; 32]>::try_from(b).ok()))
    }

    fn lens(&self, seg: u64) -> io::Result<(u64, u64)> {
        Ok(self
            .segs
            .get(&seg)
            .map_or((0, 0), |s| (s.0.len() as u64, s.1.len() as u64)))
    }

    fn truncate(&mut self, seg: u64, entries: u64, hashes: u64) -> io::Result<()> {
        let s = self.segs.entry(seg).or_default();
        s.0.truncate(usize::try_from(entries).unwrap_or(usize::MAX));
        s.1.truncate(usize::try_from(hashes).unwrap_or(usize::MAX));
        Ok(())
    }

    fn remove(&mut self, seg: u64) -> io::Result<()> {
        self.segs.remove(&seg);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn syncer(&mut self) -> io::Result<Option<Syncer>> {
        Ok(None)
    }

    fn read_meta(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.meta.get(name).cloned())
    }

    fn write_meta(&mut self, name: &str, data: &[u8], _durable: bool) -> io::Result<()> {
        self.meta.insert(name.to_owned(), data.to_vec());
        Ok(())
    }
}
