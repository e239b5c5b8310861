//! The audit log (WIRE.md 5.6): every decision of the chokepoint and every
//! change of the node's state, kept in order as the leaves of an RFC 6962
//! Merkle tree, with signed checkpoints and proofs (`capwire-audit` does
//! the math; this file keeps the bytes).
//!
//! An entry is recorded in memory, hashed into the tree at once, and
//! written to its segment (`segments.rs`) before anything that
//! acknowledges it leaves the node: the connection driver calls
//! [`AuditLog::flush`] before each write to a peer, so a kill of the
//! process never leaves an acknowledged call without its entry. A
//! checkpoint is signed only over entries made durable (synced). When the
//! log is over its budget the oldest segments are pruned, and the log
//! says so in an entry of its own; when it cannot be written at all, the
//! node refuses what it would have to record (`unavailable`) rather than
//! go on unrecorded.

pub(crate) mod entry;
pub(crate) mod segments;

use std::collections::BTreeMap;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use capwire_audit::{
    AuditKey, Checkpoint, Frontier, Hash, HashReader, ProofError, leaf_hash, split_stored_index,
    stored_count, stored_index,
};
use capwire_envelope::NodeId;

pub(crate) use entry::{By, Entry, Kind};
use segments::{SEGMENT, Segments};

use crate::config::MIN_AUDIT_BUDGET;

/// Why the log could not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuditError {
    /// Entries or hashes asked for were pruned.
    #[error("entries below {0} were pruned to keep the log within its budget")]
    Pruned(u64),
    /// Arguments out of range.
    #[error("{0}")]
    Range(String),
    /// The log cannot be read or written.
    #[error("the audit log cannot be used: {0}")]
    Io(String),
}

/// What the log holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Entries recorded since the log began (the tree's size).
    pub entries: u64,
    /// The first entry still kept (entries below it were pruned).
    pub first_kept: u64,
    /// Bytes the kept segments take.
    pub bytes: u64,
    /// Segments pruned to keep within the budget.
    pub pruned_segments: u64,
}

/// Bytes waiting to be written to one segment.
#[derive(Default)]
struct Pending {
    seg: u64,
    entries: Vec<u8>,
    hashes: Vec<u8>,
}

/// Hashes wait in memory up to this many bytes: an entry reaches its file
/// before what acknowledges it; its hashes, which the entries determine,
/// follow in batches (and before any proof, checkpoint or sync).
const HASH_BATCH: usize = 64 << 10;

struct Inner {
    store: Box<dyn Segments>,
    frontier: Frontier,
    /// Entries recorded (the tree's size, what is pending included).
    size: u64,
    /// Entries written to the segments.
    written: u64,
    /// What waits, by segment: at most two (a segment's end and the next
    /// one's start), their buffers kept from write to write.
    pending: Vec<Pending>,
    /// Pending buffers to use again.
    spare: Vec<Pending>,
    /// The first entry kept.
    first: u64,
    /// Stored hashes kept for the pruned prefix (its complete subtrees).
    kept: BTreeMap<u64, Hash>,
    /// Bytes of each kept segment.
    seg_bytes: BTreeMap<u64, u64>,
    bytes: u64,
    budget: u64,
    pruned_segments: u64,
    /// The last signed checkpoint: its size and note.
    signed: Option<(u64, String)>,
    /// Spare buffer for one entry's bytes.
    scratch: Vec<u8>,
}

/// The node's audit log.
pub(crate) struct AuditLog {
    inner: Mutex<Inner>,
    /// Entries wait to be written.
    pending: AtomicBool,
    /// The log could not be written: what it would record is refused.
    failed: AtomicBool,
    key: AuditKey,
    vkey: String,
    recorded: AtomicU64,
    /// Off (`Limits::audit`): nothing is recorded.
    on: bool,
    /// A task prunes when told ([`AuditLog::pruner`] runs); without
    /// one, `flush` prunes itself.
    pruner: AtomicBool,
    prune_wanted: tokio::sync::Notify,
    /// Capabilities whose calls' args are kept (`Capability::audit_args`).
    keep_args: std::sync::OnceLock<Vec<String>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("vkey", &self.vkey)
            .finish_non_exhaustive()
    }
}

fn io_err(e: impl std::fmt::Display) -> AuditError {
    AuditError::Io(e.to_string())
}

/// Reads stored hashes from the segments, and from what pruning kept.
struct Reader<'a>(&'a Inner);

impl HashReader for Reader<'_> {
    type Error = AuditError;

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, AuditError> {
        let inner = self.0;
        indexes
            .iter()
            .map(|&i| {
                if let Some(h) = inner.kept.get(&i) {
                    return Ok(*h);
                }
                let (level, k) = split_stored_index(i);
                // The hash is written with the leaf that completes it.
                let last_leaf = ((k + 1) << level) - 1;
                let seg = last_leaf / SEGMENT;
                if last_leaf < inner.first {
                    return Err(AuditError::Pruned(inner.first));
                }
                let base = stored_count(seg * SEGMENT);
                match inner.store.read_hash(seg, i - base).map_err(io_err)? {
                    Some(h) => Ok(h),
                    None => Err(AuditError::Io(format!("stored hash {i} is missing"))),
                }
            })
            .collect()
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The log's origin line and key name for node `id`.
pub(crate) fn origin(id: &NodeId) -> String {
    format!("capwire.audit/{id}")
}

/// Splits an entries file into its records: (offset after, bytes).
fn records(file: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let len = file.get(at..at + 4)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let body = file.get(at + 4..at + 4 + len)?;
        at += 4 + len;
        Some((at, body))
    })
}

const PRUNED: &str = "pruned";
const CHECKPOINT: &str = "checkpoint";

impl AuditLog {
    /// Opens the log kept in `store` (recovering from a crash mid-write)
    /// for the node whose identity secret is `secret`.
    ///
    /// # Errors
    /// The segments cannot be read or repaired.
    pub(crate) fn open(
        mut store: Box<dyn Segments>,
        secret: &[u8; 32],
        id: &NodeId,
        budget: u64,
        on: bool,
    ) -> Result<Self, AuditError> {
        let key = AuditKey::from_secret(secret, &origin(id)).map_err(io_err)?;
        let vkey = key.verifier_key();
        // What pruning kept: the first kept entry, then (index, hash)s.
        let mut first = 0;
        let mut kept = BTreeMap::new();
        if let Some(b) = store.read_meta(PRUNED).map_err(io_err)? {
            if b.len() < 8 || (b.len() - 8) % 40 != 0 {
                return Err(AuditError::Io("the pruned-prefix file is malformed".into()));
            }
            first = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
            for c in b[8..].chunks_exact(40) {
                let i = u64::from_be_bytes(c[..8].try_into().unwrap_or_default());
                let h: Hash = c[8..].try_into().unwrap_or_default();
                kept.insert(i, h);
            }
        }
        let mut segs = store.list().map_err(io_err)?;
        // Segments a crash left behind while pruning.
        for s in segs.iter().filter(|s| (**s + 1) * SEGMENT <= first) {
            store.remove(*s).map_err(io_err)?;
        }
        segs.retain(|s| (*s + 1) * SEGMENT > first);
        let mut seg_bytes = BTreeMap::new();
        for s in &segs {
            let (e, h) = store.lens(*s).map_err(io_err)?;
            seg_bytes.insert(*s, e + h);
        }
        let mut inner = Inner {
            store,
            frontier: Frontier::new(),
            size: first,
            written: first,
            pending: Vec::new(),
            spare: Vec::new(),
            first,
            kept,
            bytes: 0,
            seg_bytes,
            budget: budget.max(MIN_AUDIT_BUDGET),
            pruned_segments: 0,
            signed: None,
            scratch: Vec::with_capacity(256),
        };
        match segs.last().copied() {
            None => {
                inner.frontier =
                    Frontier::from_reader(first, &Reader(&inner)).map_err(|e| io_err(proof(e)))?;
            }
            Some(last) => inner.recover(last)?,
        }
        inner.bytes = inner.seg_bytes.values().sum();
        if let Some(note) = inner.store.read_meta(CHECKPOINT).map_err(io_err)?
            && let Ok(note) = String::from_utf8(note)
            && let Ok(cp) = key.verifier().verify(&note)
            && cp.size <= inner.written
        {
            inner.signed = Some((cp.size, note));
        }
        let log = Self {
            inner: Mutex::new(inner),
            pending: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            key,
            vkey,
            recorded: AtomicU64::new(0),
            on,
            pruner: AtomicBool::new(false),
            prune_wanted: tokio::sync::Notify::new(),
            keep_args: std::sync::OnceLock::new(),
        };
        if !on {
            return Ok(log);
        }
        let mut open = Entry::new(Kind::Open);
        open.detail = Some(concat!("capwire ", env!("CARGO_PKG_VERSION")));
        log.record(&open);
        Ok(log)
    }

    /// A log that records nothing (`Limits::audit` off).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn off() -> Self {
        let off = Self::open(
            Box::<segments::MemorySegments>::default(),
            &[0; 32],
            &NodeId::from_bytes([0; 32]),
            MIN_AUDIT_BUDGET,
            false,
        );
        match off {
            Ok(log) => log,
            // Opening an empty log in memory reads nothing that can fail.
            Err(e) => unreachable!("an empty log in memory: {e}"),
        }
    }

    /// The verifier key of the log's checkpoints (signed-note key text).
    pub(crate) fn verifier_key(&self) -> &str {
        &self.vkey
    }

    /// Keeps the args of the calls of `caps` (set once, when the node is
    /// built).
    pub(crate) fn keep_args_of(&self, caps: impl Iterator<Item = String>) {
        let caps: Vec<String> = caps.collect();
        if !caps.is_empty() {
            let _ = self.keep_args.set(caps);
        }
    }

    /// Whether the calls of `cap` keep their args.
    pub(crate) fn keeps_args(&self, cap: &str) -> bool {
        self.keep_args
            .get()
            .is_some_and(|c| c.iter().any(|k| k == cap))
    }

    /// Whether it records anything (`Limits::audit`).
    pub(crate) fn is_on(&self) -> bool {
        self.on
    }

    /// The log could not be written: what it would record is refused.
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `entry` (in memory, hashed into the tree; written by the
    /// next [`flush`](Self::flush)).
    pub(crate) fn record(&self, entry: &Entry<'_>) {
        if !self.on {
            return;
        }
        let mut g = self.lock();
        let inner = &mut *g;
        let index = inner.size;
        let mut bytes = std::mem::take(&mut inner.scratch);
        bytes.clear();
        entry.encode(index, unix_ms(), &mut bytes);
        let seg = index / SEGMENT;
        match inner.pending.last_mut() {
            Some(p) if p.seg == seg => {}
            // A buffer emptied by the last write serves the next segment.
            Some(p) if p.entries.is_empty() && p.hashes.is_empty() => p.seg = seg,
            _ => {
                let mut p = inner.spare.pop().unwrap_or_default();
                p.seg = seg;
                inner.pending.push(p);
            }
        }
        let leaf = leaf_hash(&bytes);
        let Inner {
            pending, frontier, ..
        } = inner;
        if let Some(p) = pending.last_mut() {
            p.entries
                .extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            p.entries.extend_from_slice(&bytes);
            frontier.push_with(leaf, |h| p.hashes.extend_from_slice(h));
        }
        inner.scratch = bytes;
        inner.size += 1;
        drop(g);
        self.recorded.fetch_add(1, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
    }

    /// Writes what was recorded and not yet written (a no-op, one atomic
    /// load, when there is nothing). A write that fails puts the log in
    /// its failed state (logged once) and keeps what waits, for the next
    /// flush to try again; one that succeeds ends that state.
    pub(crate) fn flush(&self) {
        if !self.pending.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.lock();
        self.pending.store(false, Ordering::Release);
        if let Err(e) = self.write_pending(&mut g, false) {
            self.pending.store(true, Ordering::Release);
            if !self.failed.swap(true, Ordering::Relaxed) {
                tracing::error!(error = %e, "the audit log cannot be written: refusing what it would record");
            }
            return;
        }
        if self.failed.swap(false, Ordering::Relaxed) {
            tracing::warn!("the audit log is written again: envelopes are served again");
        }
        if g.bytes > g.budget {
            drop(g);
            if self.pruner.load(Ordering::Relaxed) {
                // Pruning syncs files: not on the path of an answer.
                self.prune_wanted.notify_one();
            } else {
                self.prune();
            }
        }
    }

    /// Prunes whenever the log goes over its budget, on a blocking
    /// thread, until `stop`.
    pub(crate) async fn pruner(
        self: std::sync::Arc<Self>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        self.pruner.store(true, Ordering::Relaxed);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.prune_wanted.notified() => {}
            }
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.prune()).await;
        }
        self.pruner.store(false, Ordering::Relaxed);
    }

    /// Writes every pending entry; the hashes too when `all` asks or
    /// enough of them wait (a segment's hashes are written when it is
    /// left for the next).
    fn write_pending(&self, g: &mut Inner, all: bool) -> Result<(), AuditError> {
        let Inner {
            store,
            pending,
            spare,
            seg_bytes,
            bytes,
            ..
        } = g;
        let last = pending.len().saturating_sub(1);
        for (i, p) in pending.iter_mut().enumerate() {
            let hashes = all || i < last || p.hashes.len() >= HASH_BATCH;
            let h: &[u8] = if hashes { &p.hashes } else { &[] };
            if p.entries.is_empty() && h.is_empty() {
                continue;
            }
            store.append(p.seg, &p.entries, h).map_err(io_err)?;
            let n = (p.entries.len() + h.len()) as u64;
            *seg_bytes.entry(p.seg).or_default() += n;
            *bytes += n;
            p.entries.clear();
            if hashes {
                p.hashes.clear();
            }
        }
        // The segments left behind are done: their buffers are spare (the
        // last one stays, to be used again).
        if pending.len() > 1 {
            let keep = pending.pop();
            spare.append(pending);
            pending.extend(keep);
        }
        g.written = g.size;
        Ok(())
    }

    /// Drops the oldest segments until the log is within nine tenths of
    /// its budget (keeping the last two), and records that it did.
    fn prune(&self) {
        let mut g = self.lock();
        if let Err(e) = self.write_pending(&mut g, true) {
            tracing::error!(error = %e, "the audit log could not be written before pruning");
            return;
        }
        let mut dropped = 0u64;
        while g.bytes > g.budget / 10 * 9 && g.seg_bytes.len() > 2 {
            let Some((&seg, _)) = g.seg_bytes.iter().next() else {
                break;
            };
            if let Err(e) = g.prune_through(seg) {
                tracing::error!(error = %e, "the audit log could not be pruned");
                break;
            }
            dropped += 1;
        }
        let first = g.first;
        drop(g);
        if dropped > 0 {
            let detail = format!("entries below {first} pruned to keep within the budget");
            let mut e = Entry::new(Kind::Prune);
            e.detail = Some(&detail);
            self.record(&e);
        }
    }

    /// Writes and syncs what was recorded.
    ///
    /// # Errors
    /// The log cannot be written or synced.
    pub(crate) fn sync(&self) -> Result<(), AuditError> {
        let mut g = self.lock();
        self.pending.store(false, Ordering::Release);
        self.write_pending(&mut g, true)?;
        g.store.sync().map_err(io_err)
    }

    /// What the log holds now.
    pub(crate) fn stats(&self) -> AuditStats {
        let g = self.lock();
        AuditStats {
            entries: g.size,
            first_kept: g.first,
            bytes: g.bytes,
            pruned_segments: g.pruned_segments,
        }
    }

    /// Writes and syncs what was recorded, then signs a checkpoint of it
    /// (or returns the last one, when nothing was recorded since).
    ///
    /// # Errors
    /// The log cannot be written or synced.
    pub(crate) fn checkpoint(&self) -> Result<(String, u64, u64), AuditError> {
        let mut g = self.lock();
        self.pending.store(false, Ordering::Release);
        self.write_pending(&mut g, true)?;
        if let Some((size, note)) = &g.signed
            && *size == g.written
        {
            return Ok((note.clone(), *size, g.first));
        }
        let cp = Checkpoint {
            origin: self.key.name().to_owned(),
            size: g.written,
            root: g.frontier.root(),
            extensions: Vec::new(),
        };
        let first = g.first;
        // The sync runs without the lock: calls go on being recorded
        // meanwhile (after the checkpoint's entries, which it makes
        // durable; a segment that was left was synced then).
        let syncer = g.store.syncer().map_err(io_err)?;
        drop(g);
        if let Some(s) = syncer {
            s.sync().map_err(io_err)?;
        }
        let note = self.key.sign(&cp);
        let mut g = self.lock();
        if g.signed.as_ref().is_none_or(|(size, _)| *size < cp.size) {
            // A cache of the last note: not synced (it is signed again
            // when lost).
            let _ = g.store.write_meta(CHECKPOINT, note.as_bytes(), false);
            g.signed = Some((cp.size, note.clone()));
        }
        Ok((note, cp.size, first))
    }

    /// The entries `[from, to)` of one segment at most (the one `from` is
    /// in): what a stream sends at a time.
    ///
    /// # Errors
    /// `Pruned` below the first kept entry, `Range` past the written ones.
    pub(crate) fn entries(&self, from: u64, to: u64) -> Result<Vec<(u64, Vec<u8>)>, AuditError> {
        let mut g = self.lock();
        self.pending.store(false, Ordering::Release);
        self.write_pending(&mut g, true)?;
        if from < g.first {
            return Err(AuditError::Pruned(g.first));
        }
        if to > g.written || from > to {
            return Err(AuditError::Range(format!(
                "entries {from}..{to} are not all in the log of {} entries",
                g.written
            )));
        }
        if from == to {
            return Ok(Vec::new());
        }
        let seg = from / SEGMENT;
        let file = g.store.read_entries(seg).map_err(io_err)?;
        drop(g);
        let base = seg * SEGMENT;
        let end = to.min(base + SEGMENT);
        Ok(records(&file)
            .enumerate()
            .map(|(i, (_, b))| (base + i as u64, b))
            .filter(|(i, _)| *i >= from && *i < end)
            .map(|(i, b)| (i, b.to_vec()))
            .collect())
    }

    /// The inclusion proof of entry `index` in the tree of `size`.
    ///
    /// # Errors
    /// `Range` for an index or size outside the written tree, `Pruned`.
    pub(crate) fn prove_inclusion(&self, index: u64, size: u64) -> Result<Vec<Hash>, AuditError> {
        let mut g = self.lock();
        self.write_pending(&mut g, true)?;
        if size > g.written || index >= size {
            return Err(AuditError::Range(format!(
                "entry {index} is not in a tree of {size} (the log has {} written)",
                g.written
            )));
        }
        capwire_audit::inclusion_proof(index, size, &Reader(&g)).map_err(proof)
    }

    /// The consistency proof from the tree of `from` to the tree of `size`.
    ///
    /// # Errors
    /// `Range` for sizes outside the written tree, `Pruned`.
    pub(crate) fn prove_consistency(&self, from: u64, size: u64) -> Result<Vec<Hash>, AuditError> {
        let mut g = self.lock();
        self.write_pending(&mut g, true)?;
        if size > g.written || from == 0 || from > size {
            return Err(AuditError::Range(format!(
                "no consistency proof from {from} to {size} (the log has {} written)",
                g.written
            )));
        }
        capwire_audit::consistency_proof(from, size, &Reader(&g)).map_err(proof)
    }
}

fn proof(e: ProofError<AuditError>) -> AuditError {
    match e {
        ProofError::Read(e) => e,
        e => AuditError::Range(e.to_string()),
    }
}

impl Inner {
    /// Reads the last segment after a restart: cuts a record or hashes a
    /// crash left half-written, and writes the hashes it did not write.
    fn recover(&mut self, last: u64) -> Result<(), AuditError> {
        let base = last * SEGMENT;
        let file = self.store.read_entries(last).map_err(io_err)?;
        let mut end = 0usize;
        let mut bodies = Vec::new();
        for (after, body) in records(&file) {
            if bodies.len() as u64 == SEGMENT {
                break;
            }
            end = after;
            bodies.push(body);
        }
        let n = base + bodies.len() as u64;
        let hashes_len = self.store.lens(last).map_err(io_err)?.1 / 32;
        let stored_base = stored_count(base);
        // The most leaves whose hashes are all written.
        let mut m = n;
        while m > base && stored_count(m) - stored_base > hashes_len {
            m -= 1;
        }
        let m = m.max(base);
        self.store
            .truncate(last, end as u64, (stored_count(m) - stored_base) * 32)
            .map_err(io_err)?;
        self.frontier = Frontier::from_reader(m, &Reader(self)).map_err(proof)?;
        let mut missing = Vec::new();
        for body in &bodies[usize::try_from(m - base).unwrap_or(0)..] {
            for h in self.frontier.push(leaf_hash(body)) {
                missing.extend_from_slice(&h);
            }
        }
        if !missing.is_empty() {
            self.store.append(last, &[], &missing).map_err(io_err)?;
            self.store.sync().map_err(io_err)?;
        }
        let (e, h) = self.store.lens(last).map_err(io_err)?;
        self.seg_bytes.insert(last, e + h);
        self.size = n;
        self.written = n;
        Ok(())
    }

    /// Prunes every entry of segments up to `seg`: keeps the stored hashes
    /// of the complete subtrees left of the new first entry, then deletes
    /// the segments.
    fn prune_through(&mut self, seg: u64) -> Result<(), AuditError> {
        let first = (seg + 1) * SEGMENT;
        let mut indexes = Vec::new();
        let mut start = 0u64;
        for level in (0..64u8).rev() {
            if first & (1 << level) != 0 {
                indexes.push(stored_index(level, start >> level));
                start += 1 << level;
            }
        }
        let hashes = Reader(self).read_hashes(&indexes)?;
        let mut meta = Vec::with_capacity(8 + 40 * indexes.len());
        meta.extend_from_slice(&first.to_be_bytes());
        for (i, h) in indexes.iter().zip(&hashes) {
            meta.extend_from_slice(&i.to_be_bytes());
            meta.extend_from_slice(h);
        }
        self.store.write_meta(PRUNED, &meta, true).map_err(io_err)?;
        self.kept = indexes.into_iter().zip(hashes).collect();
        self.first = first;
        let gone: Vec<u64> = self.seg_bytes.range(..=seg).map(|(s, _)| *s).collect();
        for s in gone {
            self.store.remove(s).map_err(io_err)?;
            self.bytes -= self.seg_bytes.remove(&s).unwrap_or(0);
            self.pruned_segments += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
