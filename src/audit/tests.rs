use super::segments::{self, DirSegments, MemorySegments, Segments};
use super::*;
use capwire_audit::{NoteVerifier, verify_consistency, verify_inclusion};

const SECRET: [u8; 32] = [9; 32];

fn node() -> NodeId {
    NodeId::from_bytes([3; 32])
}

fn open_dir(dir: &std::path::Path, budget: u64) -> AuditLog {
    AuditLog::open(
        Box::new(DirSegments::open(dir).unwrap()),
        &SECRET,
        &node(),
        budget,
        true,
    )
    .unwrap()
}

fn call(log: &AuditLog, n: u64) {
    let peer = NodeId::from_bytes([5; 32]);
    let req = format!("r{n}");
    let mut e = Entry::new(Kind::Call);
    e.peer = Some(&peer);
    e.cap = Some("app.echo");
    e.verb = Some("say");
    e.req = Some(&req);
    e.class = Some("bootstrap");
    e.by = Some(By::Bootstrap);
    e.outcome = Some("ok");
    log.record(&e);
}

fn leaves(log: &AuditLog, from: u64, to: u64) -> Vec<Hash> {
    let mut out = Vec::new();
    let mut next = from;
    while next < to {
        let batch = log.entries(next, to).unwrap();
        next = batch.last().unwrap().0 + 1;
        out.extend(batch.iter().map(|(_, b)| leaf_hash(b)));
    }
    out
}

#[test]
fn checkpoints_and_proofs_verify_across_segments_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_dir(dir.path(), 64 << 20);
    for n in 0..(2 * SEGMENT + 17) {
        call(&log, n);
    }
    let (note, size, pruned) = log.checkpoint().unwrap();
    assert_eq!(
        (size, pruned),
        (2 * SEGMENT + 18, 0),
        "the open entry and the calls"
    );
    let verifier = NoteVerifier::parse(log.verifier_key()).unwrap();
    let cp = verifier.verify(&note).unwrap();
    assert_eq!(cp.size, size);
    let all = leaves(&log, 0, size);
    for index in [0, 1, SEGMENT - 1, SEGMENT, size - 1] {
        let proof = log.prove_inclusion(index, size).unwrap();
        verify_inclusion(index, size, &all[index as usize], &proof, &cp.root).unwrap();
    }
    drop(log);
    // Reopened: the same tree, and it grows on.
    let log = open_dir(dir.path(), 64 << 20);
    call(&log, 1);
    let (note2, size2, _) = log.checkpoint().unwrap();
    let cp2 = verifier.verify(&note2).unwrap();
    assert_eq!(size2, size + 2, "an open entry and one call more");
    let proof = log.prove_consistency(size, size2).unwrap();
    verify_consistency(size, size2, &cp.root, &cp2.root, &proof).unwrap();
}

#[test]
fn a_crash_mid_write_is_repaired_to_a_consistent_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_dir(dir.path(), 64 << 20);
    for n in 0..100 {
        call(&log, n);
    }
    let (note, size, _) = log.checkpoint().unwrap();
    for n in 0..50 {
        call(&log, n);
    }
    log.flush();
    drop(log);
    // A record cut in half, and hashes never written.
    let seg = dir.path().join(format!("{:012}.log", 0));
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 7)
        .unwrap();
    let hashes = dir.path().join(format!("{:012}.hash", 0));
    let hlen = std::fs::metadata(&hashes).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&hashes)
        .unwrap()
        .set_len(hlen - 32 * 40 - 5)
        .unwrap();
    let log = open_dir(dir.path(), 64 << 20);
    let (note2, size2, _) = log.checkpoint().unwrap();
    let verifier = NoteVerifier::parse(log.verifier_key()).unwrap();
    let (cp, cp2) = (
        verifier.verify(&note).unwrap(),
        verifier.verify(&note2).unwrap(),
    );
    assert_eq!(
        size2,
        size + 49 + 1,
        "the cut entry is gone, an open entry is new"
    );
    let proof = log.prove_consistency(size, size2).unwrap();
    verify_consistency(size, size2, &cp.root, &cp2.root, &proof).unwrap();
    // The root is the one the entries make.
    let all = leaves(&log, 0, size2);
    let mut f = capwire_audit::Frontier::new();
    for h in all {
        f.push(h);
    }
    assert_eq!(f.root(), cp2.root);
}

#[test]
fn over_its_budget_the_log_prunes_its_oldest_segments_and_says_so() {
    let log = AuditLog::open(
        Box::<MemorySegments>::default(),
        &SECRET,
        &node(),
        MIN_AUDIT_BUDGET,
        true,
    )
    .unwrap();
    let verifier = NoteVerifier::parse(log.verifier_key()).unwrap();
    let (early, early_size, _) = log.checkpoint().unwrap();
    for n in 0..30_000 {
        call(&log, n);
        log.flush();
    }
    let stats = log.stats();
    assert!(stats.bytes <= MIN_AUDIT_BUDGET, "{stats:?}");
    assert!(
        stats.first_kept > 0 && stats.pruned_segments > 0,
        "{stats:?}"
    );
    let (note, size, first) = log.checkpoint().unwrap();
    assert_eq!(first, stats.first_kept);
    let cp = verifier.verify(&note).unwrap();
    // Kept entries still prove against the checkpoint.
    let kept = leaves(&log, first, size);
    for index in [first, first + 1, size - 1] {
        let proof = log.prove_inclusion(index, size).unwrap();
        verify_inclusion(
            index,
            size,
            &kept[(index - first) as usize],
            &proof,
            &cp.root,
        )
        .unwrap();
    }
    // Pruned ones are refused, clearly.
    assert!(matches!(log.entries(0, 1), Err(AuditError::Pruned(f)) if f == first));
    assert!(matches!(
        log.prove_inclusion(0, size),
        Err(AuditError::Pruned(_))
    ));
    assert!(matches!(
        log.prove_consistency(early_size, size),
        Err(AuditError::Pruned(_))
    ));
    let _ = verifier.verify(&early).unwrap();
    // The log said it pruned.
    let said = kept.len() as u64 == size - first
        && log
            .entries(first, size)
            .unwrap()
            .iter()
            .chain(
                log.entries(size - (size - first).min(SEGMENT), size)
                    .unwrap()
                    .iter(),
            )
            .any(|(_, b)| b.windows(5).any(|w| w == b"prune"));
    assert!(said, "a prune entry is in the log");
}

/// Segments in memory whose appends fail while `fail` is set.
struct Flaky {
    inner: MemorySegments,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Segments for Flaky {
    fn list(&self) -> std::io::Result<Vec<u64>> {
        self.inner.list()
    }
    fn append(&mut self, seg: u64, entries: &[u8], hashes: &[u8]) -> std::io::Result<()> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("no space left"));
        }
        self.inner.append(seg, entries, hashes)
    }
    fn read_entries(&self, seg: u64) -> std::io::Result<Vec<u8>> {
        self.inner.read_entries(seg)
    }
    fn read_hash(&self, seg: u64, offset: u64) -> std::io::Result<Option<[u8; 32]>> {
        self.inner.read_hash(seg, offset)
    }
    fn lens(&self, seg: u64) -> std::io::Result<(u64, u64)> {
        self.inner.lens(seg)
    }
    fn truncate(&mut self, seg: u64, entries: u64, hashes: u64) -> std::io::Result<()> {
        self.inner.truncate(seg, entries, hashes)
    }
    fn remove(&mut self, seg: u64) -> std::io::Result<()> {
        self.inner.remove(seg)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn syncer(&mut self) -> std::io::Result<Option<segments::Syncer>> {
        self.inner.syncer()
    }
    fn read_meta(&self, name: &str) -> std::io::Result<Option<Vec<u8>>> {
        self.inner.read_meta(name)
    }
    fn write_meta(&mut self, name: &str, data: &[u8], durable: bool) -> std::io::Result<()> {
        self.inner.write_meta(name, data, durable)
    }
}

#[test]
fn a_log_that_cannot_be_written_refuses_until_it_can_and_loses_nothing() {
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = AuditLog::open(
        Box::new(Flaky {
            inner: MemorySegments::default(),
            fail: fail.clone(),
        }),
        &SECRET,
        &node(),
        MIN_AUDIT_BUDGET,
        true,
    )
    .unwrap();
    call(&log, 0);
    log.flush();
    assert!(!log.is_failed());
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    call(&log, 1);
    log.flush();
    assert!(
        log.is_failed(),
        "a write that fails puts the log in its failed state"
    );
    log.flush();
    assert!(log.is_failed(), "and it stays there while writes fail");
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    log.flush();
    assert!(!log.is_failed(), "the next write that succeeds ends it");
    let (note, size, _) = log.checkpoint().unwrap();
    assert_eq!(size, 3, "the opening and both calls, each once");
    let cp = NoteVerifier::parse(log.verifier_key())
        .unwrap()
        .verify(&note)
        .unwrap();
    let all = leaves(&log, 0, size);
    let mut f = capwire_audit::Frontier::new();
    for h in all {
        f.push(h);
    }
    assert_eq!(f.root(), cp.root);
}
