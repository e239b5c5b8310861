//! Tests of the durable store and the state directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use capwire_envelope::NodeId;
use capwire_transport::Keypair;
use redb::{ReadableDatabase, TableDefinition, TableHandle};

use super::dir::{KEY_FILE, STORE_FILE, StateDir};
use super::memory::MemoryStore;
use super::redb::{Opened, RedbStore};
use super::{
    AnswerKey, AnswerRecord, Batch, BindingRecord, ConfigRecord, ContactRecord, Loaded,
    MemberRecord, RevocationEntry, RevocationsRecord, RosterMeta, Store, StoreError,
    TaskEventRecord, TaskRecord,
};

// The layout on disk, spelled out independently of the implementation.
const META: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("meta");
const CONTACTS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("contacts");

fn id(n: u8) -> NodeId {
    NodeId::from_bytes([n; 32])
}

fn contact(n: u8, name: &str) -> ContactRecord {
    ContactRecord {
        id: id(n),
        name: name.into(),
        addr: format!("tcp:127.0.0.1:{}", 4000 + u16::from(n)),
    }
}

fn member(cid: &str, name: &str) -> MemberRecord {
    MemberRecord {
        cid: cid.into(),
        name: name.into(),
        bio: "a bio".into(),
        persona: "a persona".into(),
        monitoring: "on".into(),
        status: "running".into(),
        node_id: Some(id(9)),
        addrs: vec!["tcp:127.0.0.1:5000".into(), "tcp:[::1]:5000".into()],
        caps: vec!["echo@1.0.0".into()],
        origin: Some((id(1), "req-create".into())),
        watcher: Some(id(2)),
        placement: None,
    }
}

fn answer(sender: u8, req_id: &str, seq: u64) -> AnswerRecord {
    AnswerRecord {
        key: AnswerKey {
            sender: id(sender),
            req_id: req_id.into(),
        },
        cap: "roster".into(),
        verb: "create".into(),
        ok: seq.is_multiple_of(2),
        body: vec![0x82, 0x01, 0x02, seq as u8],
        at_ms: 1_700_000_000_000 + seq,
        seq,
    }
}

/// A batch with one record of every kind.
fn full_batch() -> Batch {
    Batch {
        binding: Some(BindingRecord {
            controller: Some(id(7)),
            epoch: 3,
            grant_key: Some(format!("ed25519/{}", "ab".repeat(32))),
        }),
        revocations: Some(RevocationsRecord {
            ids: vec![RevocationEntry {
                id: vec![9; 64],
                until_ms: 1_900_000_000_000,
                epoch: Some(3),
            }],
            clock_floor_ms: Some(1_800_000_000_000),
        }),
        config: Some(ConfigRecord {
            version: 2,
            value: vec![0xa1, 0x61, b'k', 0x05],
        }),
        put_contacts: vec![contact(2, "bob"), contact(1, "alice")],
        roster: Some(RosterMeta {
            version: 4,
            next_cid: 12,
        }),
        put_members: vec![member("c2", "second"), member("c1", "first")],
        put_answers: vec![answer(5, "r2", 2), answer(5, "r1", 1), answer(4, "r9", 3)],
        clock_floor_ms: Some(1_800_000_000_500),
        ..Batch::default()
    }
}

/// `loaded` with its vectors in key order, as a durable store loads them.
fn in_key_order(mut loaded: Loaded) -> Loaded {
    loaded
        .contacts
        .sort_by(|a, b| a.id.as_bytes().cmp(b.id.as_bytes()));
    loaded.members.sort_by(|a, b| a.cid.cmp(&b.cid));
    loaded.answers.sort_by(|a, b| a.key.cmp(&b.key));
    loaded
}

fn open_store(path: &Path) -> (RedbStore, Opened) {
    RedbStore::open(path).expect("open store")
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

/// Compares without printing a whole database file on failure.
fn assert_unchanged(path: &Path, before: &[u8]) {
    let after = fs::read(path).expect("read");
    let first_change = before.iter().zip(&after).position(|(a, b)| a != b);
    assert!(
        after == before,
        "{} changed: {} bytes before, {} after, first difference at {first_change:?}",
        path.display(),
        before.len(),
        after.len()
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_key(dir: &Path, kp: &Keypair) {
    let path = dir.join(KEY_FILE);
    fs::write(
        &path,
        format!(
            "capwire-identity-v1\n{}\n",
            hex(kp.secret_bytes().as_slice())
        ),
    )
    .expect("write key");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// A state directory that has been opened once (and closed again).
fn made_dir() -> (tempfile::TempDir, std::path::PathBuf, NodeId) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    let node = StateDir::open(&dir, None)
        .expect("first open")
        .keypair()
        .public();
    (tmp, dir, node)
}

// ---- the store ----

#[test]
fn long_answers_and_configurations_read_back_after_reopening() {
    // Byte strings longer than the decoder's scratch buffer (256 bytes):
    // a remembered answer of a member with a long bio, a configuration of
    // a few KiB.
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(STORE_FILE);
    let (store, _) = open_store(&path);
    let long = |n: usize| -> Vec<u8> { capwire_envelope::to_vec(&"x".repeat(n)).expect("encodes") };
    let mut answer = answer(1, "r1", 2);
    answer.body = long(4096);
    let config = ConfigRecord {
        version: 1,
        value: long(60 * 1024),
    };
    store
        .commit(&Batch {
            config: Some(config.clone()),
            put_answers: vec![answer.clone()],
            ..Batch::default()
        })
        .expect("commit");
    drop(store);
    let (store, _) = open_store(&path);
    let loaded = store.load().expect("a long record reads back");
    assert_eq!(loaded.config, Some(config));
    assert_eq!(loaded.answers, vec![answer]);
}

#[test]
fn every_record_kind_round_trips_and_survives_reopening() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(STORE_FILE);
    let (store, opened) = open_store(&path);
    assert_eq!(
        opened,
        Opened {
            created: true,
            node_id: None
        }
    );
    assert_eq!(store.load().expect("load"), Loaded::default());

    let batch = full_batch();
    store.commit(&batch).expect("commit");
    let expected = Loaded {
        binding: batch.binding.clone(),
        revocations: batch.revocations.clone(),
        config: batch.config.clone(),
        // Key order, not the order they were put in.
        contacts: vec![contact(1, "alice"), contact(2, "bob")],
        roster: RosterMeta {
            version: 4,
            next_cid: 12,
        },
        members: vec![member("c1", "first"), member("c2", "second")],
        answers: vec![answer(4, "r9", 3), answer(5, "r1", 1), answer(5, "r2", 2)],
        tasks: Vec::new(),
        clock_floor_ms: Some(1_800_000_000_500),
    };
    assert_eq!(store.load().expect("load"), expected);

    store.set_node_id(id(42)).expect("set node id");
    drop(store);
    let (store, opened) = open_store(&path);
    assert_eq!(
        opened,
        Opened {
            created: false,
            node_id: Some(id(42))
        }
    );
    assert_eq!(store.load().expect("load after reopen"), expected);
}

#[test]
fn puts_replace_and_deletes_remove() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(STORE_FILE);
    let (store, _) = open_store(&path);
    store.commit(&full_batch()).expect("commit");

    let mut replaced = answer(5, "r1", 7);
    replaced.body = b"other".to_vec();
    store
        .commit(&Batch {
            binding: Some(BindingRecord {
                controller: None,
                epoch: 4,
                grant_key: None,
            }),
            put_contacts: vec![contact(1, "alice renamed")],
            del_contacts: vec![id(2), id(200)],
            put_members: vec![member("c1", "first renamed")],
            del_members: vec!["c2".into(), "absent".into()],
            put_answers: vec![replaced.clone()],
            del_answers: vec![
                AnswerKey {
                    sender: id(4),
                    req_id: "r9".into(),
                },
                AnswerKey {
                    sender: id(4),
                    req_id: "absent".into(),
                },
            ],
            ..Batch::default()
        })
        .expect("commit changes");
    // A delete and a put of the same key in one batch: the put wins.
    store
        .commit(&Batch {
            del_contacts: vec![id(3)],
            put_contacts: vec![contact(3, "carol")],
            ..Batch::default()
        })
        .expect("commit delete and put");
    drop(store);

    let (store, _) = open_store(&path);
    let loaded = store.load().expect("load");
    assert_eq!(
        loaded.binding,
        Some(BindingRecord {
            controller: None,
            epoch: 4,
            grant_key: None,
        })
    );
    // Untouched by the later batches.
    assert_eq!(loaded.config, full_batch().config);
    assert_eq!(loaded.roster.next_cid, 12);
    assert_eq!(
        loaded.contacts,
        vec![contact(1, "alice renamed"), contact(3, "carol")]
    );
    assert_eq!(loaded.members, vec![member("c1", "first renamed")]);
    assert_eq!(loaded.answers, vec![replaced, answer(5, "r2", 2)]);
}

#[test]
fn a_sequence_of_batches_leaves_what_the_memory_store_leaves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (store, _) = open_store(&tmp.path().join(STORE_FILE));
    let memory = MemoryStore::new();
    let batches = [
        full_batch(),
        Batch {
            del_contacts: vec![id(1)],
            put_contacts: vec![contact(1, "again"), contact(0, "zero")],
            del_members: vec!["c1".into()],
            put_answers: vec![answer(3, "", 9)],
            ..Batch::default()
        },
        Batch::default(),
        Batch {
            roster: Some(RosterMeta {
                version: 5,
                next_cid: 13,
            }),
            put_members: vec![member("c3", "third")],
            del_answers: vec![answer(5, "r2", 0).key],
            ..Batch::default()
        },
    ];
    for batch in &batches {
        store.commit(batch).expect("redb commit");
        memory.commit(batch).expect("memory commit");
        assert_eq!(
            store.load().expect("redb load"),
            in_key_order(memory.load().expect("memory load"))
        );
    }
}

fn task(n: u8, state: capwire_manifest::TaskState, seq: u64, first_seq: u64) -> TaskRecord {
    TaskRecord {
        id: vec![n; 16],
        cap: "app.work".into(),
        verb: "count".into(),
        submitter: id(n),
        req_id: format!("r{n}"),
        state,
        created_ms: 1_000,
        updated_ms: 1_000 + seq,
        seq,
        first_seq,
        order: u64::from(n),
        question_seq: None,
        progress_seq: (seq > 1).then_some(seq),
        error: None,
        authority: None,
        trace: None,
    }
}

fn task_event(seq: u64) -> TaskEventRecord {
    TaskEventRecord {
        seq,
        at_ms: 1_000 + seq,
        state: capwire_manifest::TaskState::Working,
        kind: capwire_manifest::TaskEventKind::Progress,
        body: vec![0x18, u8::try_from(seq).expect("small seq")],
    }
}

/// Batches of task records, args and events: puts of new and changed
/// records, a fold and a delete, each touching one task among others.
fn task_batches() -> Vec<Batch> {
    use capwire_manifest::TaskState::{Completed, Working};
    let events = |n: u8, seqs: std::ops::RangeInclusive<u64>| -> Vec<(Vec<u8>, TaskEventRecord)> {
        seqs.map(|s| (vec![n; 16], task_event(s))).collect()
    };
    vec![
        Batch {
            put_tasks: (1..=4).map(|n| task(n, Working, 3, 1)).collect(),
            put_task_args: (1..=4).map(|n| (vec![n; 16], vec![n])).collect(),
            put_task_events: (1..=4).flat_map(|n| events(n, 1..=3)).collect(),
            ..Batch::default()
        },
        Batch {
            put_tasks: vec![task(2, Working, 6, 4)],
            put_task_events: events(2, 4..=6),
            fold_task_events: vec![(vec![2; 16], 1, 4)],
            ..Batch::default()
        },
        Batch {
            put_tasks: vec![task(1, Completed, 4, 1)],
            put_task_events: events(1, 4..=4),
            del_tasks: vec![vec![3; 16]],
            ..Batch::default()
        },
    ]
}

#[test]
fn the_memory_store_keeps_tasks_as_redb_does() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (store, _) = open_store(&tmp.path().join(STORE_FILE));
    let memory = MemoryStore::new();
    for batch in &task_batches() {
        store.commit(batch).expect("redb commit");
        memory.commit(batch).expect("memory commit");
        let by_id = |mut l: Loaded| {
            l.tasks.sort_by(|a, b| a.id.cmp(&b.id));
            l
        };
        assert_eq!(
            by_id(store.load().expect("redb load")),
            by_id(memory.load().expect("memory load"))
        );
        for n in 1..=4u8 {
            let id = [n; 16];
            assert_eq!(
                store.task_events(&id, 1, usize::MAX).expect("redb events"),
                memory
                    .task_events(&id, 1, usize::MAX)
                    .expect("memory events"),
                "events of task {n}"
            );
            assert_eq!(
                store.task_args(&id).expect("redb args"),
                memory.task_args(&id).expect("memory args"),
                "args of task {n}"
            );
        }
    }
    let loaded = memory.load().expect("memory load");
    let ids: Vec<u8> = loaded.tasks.iter().map(|t| t.id[0]).collect();
    assert_eq!(ids, vec![1, 2, 4], "task 3 deleted, the rest in order");
    let seqs = |n: u8| -> Vec<u64> {
        let events = memory.task_events(&[n; 16], 1, usize::MAX).expect("events");
        events.iter().map(|e| e.seq).collect()
    };
    assert_eq!(seqs(1), vec![1, 2, 3, 4]);
    assert_eq!(seqs(2), vec![4, 5, 6], "folded below 4");
    assert!(seqs(3).is_empty(), "deleted with its task");
    assert_eq!(
        seqs(4),
        vec![1, 2, 3],
        "untouched by the others' fold and delete"
    );
}

#[test]
fn a_store_left_by_a_crash_opens_with_every_committed_batch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(STORE_FILE);
    let (store, _) = open_store(&path);
    store.commit(&full_batch()).expect("commit");
    store.set_node_id(id(42)).expect("set node id");
    // The file as a crash right now would leave it: never closed.
    let crashed = tmp.path().join("crashed");
    fs::create_dir(&crashed).expect("mkdir");
    fs::copy(&path, crashed.join(STORE_FILE)).expect("copy");
    let expected = store.load().expect("load");
    drop(store);

    let (store, opened) = open_store(&crashed.join(STORE_FILE));
    assert_eq!(opened.node_id, Some(id(42)));
    assert_eq!(store.load().expect("load recovered"), expected);
}

#[test]
fn a_record_that_does_not_decode_is_corrupt() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(STORE_FILE);
    drop(open_store(&path));
    {
        let db = redb::Database::open(&path).expect("plain open");
        let txn = db.begin_write().expect("begin");
        txn.open_table(CONTACTS)
            .expect("contacts")
            .insert([1u8; 32].as_slice(), [0xffu8, 0x00].as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }
    let (store, _) = open_store(&path);
    let err = store.load().expect_err("garbage record");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

// ---- the directory ----

#[test]
fn a_second_open_is_locked_out_until_the_first_is_gone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    let first = StateDir::open(&dir, None).expect("first open");
    let node = first.keypair().public();

    let err = StateDir::open(&dir, None).expect_err("second open");
    assert!(
        matches!(err, StoreError::Locked(ref p) if p == &dir),
        "{err:?}"
    );

    // The store handle alone keeps the lock.
    let store = first.store();
    drop(first);
    let err = StateDir::open(&dir, None).expect_err("open while the store lives");
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    drop(store);

    let again = StateDir::open(&dir, None).expect("open after drop");
    assert_eq!(again.keypair().public(), node);
}

#[test]
fn a_regular_file_is_not_a_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("state");
    fs::write(&file, b"not a directory").expect("write");
    let err = StateDir::open(&file, None).expect_err("file");
    assert!(
        matches!(err, StoreError::NotADirectory(ref p) if p == &file),
        "{err:?}"
    );
    let err = StateDir::open(&file.join("below"), None).expect_err("below a file");
    assert!(matches!(err, StoreError::NotADirectory(_)), "{err:?}");
    assert_eq!(fs::read(&file).expect("read"), b"not a directory");
}

#[test]
fn a_store_of_random_bytes_is_corrupt_and_left_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).expect("a private state dir");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(dir.join(STORE_FILE), &bytes).expect("write");
    let err = StateDir::open(dir, None).expect_err("random bytes");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_unchanged(&dir.join(STORE_FILE), &bytes);
    assert!(!dir.join(KEY_FILE).exists());
}

#[test]
fn a_truncated_store_is_corrupt_and_left_alone() {
    let (_tmp, dir, _) = made_dir();
    let path = dir.join(STORE_FILE);
    let whole = fs::read(&path).expect("read");
    for len in [1, 100, 600, 4096, whole.len() / 2] {
        fs::write(&path, &whole[..len]).expect("truncate");
        let err = StateDir::open(&dir, None).expect_err("truncated");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{len}: {err:?}");
        assert_unchanged(&path, &whole[..len]);
    }
    fs::write(&path, b"").expect("empty");
    let err = StateDir::open(&dir, None).expect_err("empty");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(fs::read(&path).expect("read"), b"");
}

#[test]
fn another_redb_database_is_foreign_and_left_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).expect("a private state dir");
    let path = dir.join(STORE_FILE);
    {
        let other: TableDefinition<'_, u64, u64> = TableDefinition::new("other");
        let db = redb::Database::create(&path).expect("plain create");
        let txn = db.begin_write().expect("begin");
        txn.open_table(other)
            .expect("table")
            .insert(1, 2)
            .expect("insert");
        txn.commit().expect("commit");
    }
    let bytes = fs::read(&path).expect("read");
    let err = StateDir::open(dir, None).expect_err("foreign");
    assert!(matches!(err, StoreError::Foreign { .. }), "{err:?}");
    assert_unchanged(&path, &bytes);
    assert!(!dir.join(KEY_FILE).exists());
}

#[test]
fn a_store_of_another_format_is_foreign_and_left_alone() {
    let (_tmp, dir, _) = made_dir();
    let path = dir.join(STORE_FILE);
    {
        let db = redb::Database::open(&path).expect("plain open");
        let txn = db.begin_write().expect("begin");
        txn.open_table(META)
            .expect("meta")
            .insert("format", 2u32.to_le_bytes().as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }
    let bytes = fs::read(&path).expect("read");
    let err = StateDir::open(&dir, None).expect_err("format 2");
    assert!(
        matches!(err, StoreError::Foreign { ref detail, .. } if detail.contains("format 2")),
        "{err:?}"
    );
    assert_unchanged(&path, &bytes);
}

#[test]
fn a_store_missing_a_table_is_foreign() {
    let (_tmp, dir, _) = made_dir();
    let path = dir.join(STORE_FILE);
    {
        let db = redb::Database::open(&path).expect("plain open");
        let tables: Vec<String> = db
            .begin_read()
            .expect("read")
            .list_tables()
            .expect("list")
            .map(|t| t.name().to_owned())
            .collect();
        for table in ["meta", "contacts", "members", "answers"] {
            assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
        }
        let txn = db.begin_write().expect("begin");
        let answers: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("answers");
        assert!(txn.delete_table(answers).expect("delete"));
        txn.commit().expect("commit");
    }
    let err = StateDir::open(&dir, None).expect_err("no answers table");
    assert!(matches!(err, StoreError::Foreign { .. }), "{err:?}");
}

#[test]
fn a_lost_key_file_is_never_replaced() {
    let (_tmp, dir, node) = made_dir();
    fs::remove_file(dir.join(KEY_FILE)).expect("remove key");
    let err = StateDir::open(&dir, None).expect_err("no key");
    assert!(
        matches!(err, StoreError::Identity { ref detail, .. } if detail.contains(&node.to_string())),
        "{err:?}"
    );
    let given = Keypair::generate().expect("keypair");
    let err = StateDir::open(&dir, Some(given)).expect_err("no key, one given");
    assert!(matches!(err, StoreError::Identity { .. }), "{err:?}");
    assert!(!dir.join(KEY_FILE).exists());
}

#[test]
fn a_key_file_of_another_key_is_refused() {
    let (_tmp, dir, _) = made_dir();
    let other = Keypair::generate().expect("keypair");
    write_key(&dir, &other);
    let err = StateDir::open(&dir, None).expect_err("other key");
    assert!(matches!(err, StoreError::Identity { .. }), "{err:?}");
    let err = StateDir::open(&dir, Some(other)).expect_err("other key, given");
    assert!(matches!(err, StoreError::Identity { .. }), "{err:?}");
}

#[test]
fn a_garbage_key_file_is_corrupt() {
    let (_tmp, dir, node) = made_dir();
    let path = dir.join(KEY_FILE);
    let good = fs::read_to_string(&path).expect("read key");
    let hex = good
        .strip_prefix("capwire-identity-v1\n")
        .and_then(|s| s.strip_suffix('\n'))
        .expect("key file layout")
        .to_owned();
    for bad in [
        String::new(),
        "garbage".to_owned(),
        format!("capwire-identity-v2\n{hex}\n"),
        format!("capwire-identity-v1\n{}\n", hex.to_uppercase()),
        format!("capwire-identity-v1\n{hex}"),
        format!("capwire-identity-v1\n{hex}\n\n"),
        format!("capwire-identity-v1\n{}\n", &hex[..62]),
        format!("capwire-identity-v1\n{}zz\n", &hex[..62]),
    ] {
        fs::write(&path, &bad).expect("write");
        let err = StateDir::open(&dir, None).expect_err("garbage key");
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "{bad:?}: {err:?}"
        );
        assert_eq!(fs::read_to_string(&path).expect("read"), bad);
    }
    fs::write(&path, &good).expect("restore");
    let again = StateDir::open(&dir, None).expect("restored key");
    assert_eq!(again.keypair().public(), node);
}

#[test]
fn a_key_file_others_can_read_is_refused() {
    let (_tmp, dir, node) = made_dir();
    let path = dir.join(KEY_FILE);
    for leaked in [0o644, 0o640, 0o604, 0o660] {
        fs::set_permissions(&path, fs::Permissions::from_mode(leaked)).expect("chmod");
        let err = StateDir::open(&dir, None).expect_err("leaked key");
        assert!(
            matches!(err, StoreError::Identity { ref detail, .. } if detail.contains("chmod 600")),
            "{leaked:o}: {err:?}"
        );
        assert_eq!(mode(&path), leaked, "the mode is left for the user to fix");
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(
        StateDir::open(&dir, None)
            .expect("fixed")
            .keypair()
            .public(),
        node
    );
}

#[test]
fn a_given_key_must_be_the_stored_one() {
    let (_tmp, dir, node) = made_dir();
    let other = Keypair::generate().expect("keypair");
    let err = StateDir::open(&dir, Some(other)).expect_err("another key");
    assert!(matches!(err, StoreError::Identity { .. }), "{err:?}");

    let key_text = fs::read(dir.join(KEY_FILE)).expect("read key");
    let hex = std::str::from_utf8(&key_text[20..84]).expect("hex");
    let mut secret = [0u8; 32];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digit");
    }
    let same = Keypair::from_secret_bytes(secret);
    assert_eq!(same.public(), node);
    let opened = StateDir::open(&dir, Some(same)).expect("the same key");
    assert_eq!(opened.keypair().public(), node);
}

#[test]
fn a_new_directory_takes_the_given_key_and_records_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    let given = Keypair::generate().expect("keypair");
    let opened = StateDir::open(&dir, Some(given.clone())).expect("open");
    assert_eq!(opened.keypair().public(), given.public());
    drop(opened);

    assert_eq!(
        fs::read_to_string(dir.join(KEY_FILE)).expect("read key"),
        format!(
            "capwire-identity-v1\n{}\n",
            hex(given.secret_bytes().as_slice())
        )
    );
    let (_, opened) = open_store(&dir.join(STORE_FILE));
    assert_eq!(opened.node_id, Some(given.public()));
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != KEY_FILE && n != STORE_FILE)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_new_store_keeps_an_existing_key_file() {
    // As after a crash between writing the key file and recording it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).expect("a private state dir");
    let key = Keypair::generate().expect("keypair");
    write_key(dir, &key);
    let err = StateDir::open(dir, Some(Keypair::generate().expect("keypair")))
        .expect_err("another key given");
    assert!(matches!(err, StoreError::Identity { .. }), "{err:?}");

    let opened = StateDir::open(dir, None).expect("open");
    assert_eq!(opened.keypair().public(), key.public());
    drop(opened);
    let (_, opened) = open_store(&dir.join(STORE_FILE));
    assert_eq!(opened.node_id, Some(key.public()));
}

#[test]
fn the_directory_and_its_files_are_private() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("a").join("b").join("state");
    let opened = StateDir::open(&dir, None).expect("open");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&tmp.path().join("a")), 0o700);
    assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.join(STORE_FILE)), 0o600);
    drop(opened);
    // Reopening changes none of it.
    drop(StateDir::open(&dir, None).expect("reopen"));
    assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.join(STORE_FILE)), 0o600);
}

// ---------------------------------------------------------------------
// Tasks: records, args, events and folding, in both stores.

mod tasks {
    use capwire_envelope::{ErrorBody, ErrorCode};
    use capwire_manifest::{TaskEventKind, TaskState};

    use super::super::{TaskEventRecord, TaskRecord};
    use super::*;
    use crate::tasks::table::{Change, TaskId, TaskLimits, TaskTable};

    /// Stores by name.
    type Named = Vec<(&'static str, Box<dyn Store>)>;

    /// A redb store in a fresh directory and a memory store, by name.
    fn both() -> (tempfile::TempDir, Named) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (redb, _) = open_store(&tmp.path().join(STORE_FILE));
        let stores: Vec<(&'static str, Box<dyn Store>)> = vec![
            ("redb", Box::new(redb)),
            ("memory", Box::new(MemoryStore::new())),
        ];
        (tmp, stores)
    }

    fn task(n: u8, seq: u64, state: TaskState) -> TaskRecord {
        TaskRecord {
            id: vec![n; 16],
            cap: "app.x".into(),
            verb: "go".into(),
            submitter: id(n),
            req_id: format!("r{n}"),
            state,
            created_ms: 1_000,
            updated_ms: 1_000 + seq,
            seq,
            first_seq: 1,
            order: u64::from(n),
            question_seq: None,
            progress_seq: None,
            error: (state == TaskState::Failed)
                .then(|| ErrorBody::new(ErrorCode::Internal, "it broke")),
            authority: None,
            trace: None,
        }
    }

    fn event(seq: u64) -> TaskEventRecord {
        TaskEventRecord {
            seq,
            at_ms: 2_000 + seq,
            state: TaskState::Working,
            kind: TaskEventKind::Progress,
            body: vec![0x19, 0x01, seq as u8],
        }
    }

    fn events(n: u8, seqs: impl IntoIterator<Item = u64>) -> Vec<(Vec<u8>, TaskEventRecord)> {
        seqs.into_iter().map(|s| (vec![n; 16], event(s))).collect()
    }

    fn seqs(store: &dyn Store, n: u8) -> Vec<u64> {
        store
            .task_events(&[n; 16], 0, usize::MAX)
            .expect("events")
            .into_iter()
            .map(|e| e.seq)
            .collect()
    }

    fn sorted(mut tasks: Vec<TaskRecord>) -> Vec<TaskRecord> {
        tasks.sort_by(|a, b| a.id.cmp(&b.id));
        tasks
    }

    #[test]
    fn task_records_args_and_events_round_trip_and_survive_reopening() {
        let (tmp, stores) = both();
        let records = vec![
            task(1, 3, TaskState::Working),
            task(2, 5, TaskState::Failed),
        ];
        let mut put_task_events = events(1, 1..=3);
        put_task_events.extend(events(2, 1..=5));
        let batch = Batch {
            put_tasks: records.clone(),
            put_task_args: vec![(vec![1; 16], vec![0x61, b'a']), (vec![2; 16], vec![0xf6])],
            put_task_events,
            ..Batch::default()
        };
        for (name, store) in &stores {
            store.commit(&batch).expect("commit");
            let loaded = store.load().expect("load");
            assert_eq!(sorted(loaded.tasks), records, "{name}: records");
            assert_eq!(
                store.task_events(&[1; 16], 1, 10).unwrap(),
                vec![event(1), event(2), event(3)],
                "{name}"
            );
            assert_eq!(
                seqs(&**store, 2),
                [1, 2, 3, 4, 5],
                "{name}: another task's own"
            );
            // From and limit: a window of the log, in order.
            let window: Vec<u64> = store
                .task_events(&[2; 16], 2, 2)
                .unwrap()
                .into_iter()
                .map(|e| e.seq)
                .collect();
            assert_eq!(window, [2, 3], "{name}: from 2, at most 2");
            assert!(
                store.task_events(&[2; 16], 6, 10).unwrap().is_empty(),
                "{name}"
            );
            assert!(
                store.task_events(&[3; 16], 0, 10).unwrap().is_empty(),
                "{name}"
            );
            assert_eq!(
                store.task_args(&[1; 16]).unwrap(),
                Some(vec![0x61, b'a']),
                "{name}"
            );
            assert_eq!(store.task_args(&[3; 16]).unwrap(), None, "{name}");
        }
        drop(stores);
        let (store, _) = open_store(&tmp.path().join(STORE_FILE));
        assert_eq!(
            sorted(store.load().unwrap().tasks),
            records,
            "after reopening"
        );
        assert_eq!(seqs(&store, 1), [1, 2, 3]);
        assert_eq!(store.task_args(&[2; 16]).unwrap(), Some(vec![0xf6]));
    }

    #[test]
    fn a_deleted_task_takes_its_args_and_events_and_nothing_else() {
        let (_tmp, stores) = both();
        for (name, store) in &stores {
            let mut put_task_events = events(1, 1..=4);
            put_task_events.extend(events(2, 1..=2));
            store
                .commit(&Batch {
                    put_tasks: vec![
                        task(1, 4, TaskState::Completed),
                        task(2, 2, TaskState::Working),
                    ],
                    put_task_args: vec![(vec![1; 16], vec![0x01]), (vec![2; 16], vec![0x02])],
                    put_task_events,
                    ..Batch::default()
                })
                .unwrap();
            store
                .commit(&Batch {
                    del_tasks: vec![vec![1; 16], vec![9; 16]],
                    ..Batch::default()
                })
                .unwrap();
            let loaded = store.load().unwrap();
            assert_eq!(loaded.tasks, vec![task(2, 2, TaskState::Working)], "{name}");
            assert!(seqs(&**store, 1).is_empty(), "{name}: its events");
            assert_eq!(store.task_args(&[1; 16]).unwrap(), None, "{name}: its args");
            assert_eq!(seqs(&**store, 2), [1, 2], "{name}: the other task's events");
            assert_eq!(
                store.task_args(&[2; 16]).unwrap(),
                Some(vec![0x02]),
                "{name}"
            );
        }
    }

    #[test]
    fn a_fold_in_the_same_write_as_new_events_applies_after_them() {
        let (_tmp, stores) = both();
        for (name, store) in &stores {
            store
                .commit(&Batch {
                    put_tasks: vec![
                        task(1, 3, TaskState::Working),
                        task(2, 3, TaskState::Working),
                    ],
                    put_task_events: [events(1, 1..=3), events(2, 1..=3)].concat(),
                    ..Batch::default()
                })
                .unwrap();
            // Seven more events of task 1 in one write, which also folds
            // away all but the newest four, keeping event 2 (say, the
            // last progress), and never touches task 2.
            store
                .commit(&Batch {
                    put_task_events: events(1, 4..=10),
                    fold_task_events: vec![(vec![1; 16], 1, 2), (vec![1; 16], 3, 7)],
                    ..Batch::default()
                })
                .unwrap();
            assert_eq!(
                seqs(&**store, 1),
                [2, 7, 8, 9, 10],
                "{name}: the kept events"
            );
            assert_eq!(
                seqs(&**store, 2),
                [1, 2, 3],
                "{name}: another task's events"
            );
            // The kept one is read as any other.
            let kept = store.task_events(&[1; 16], 2, 1).unwrap();
            assert_eq!(kept, vec![event(2)], "{name}");
            // Empty and reversed ranges delete nothing.
            store
                .commit(&Batch {
                    fold_task_events: vec![(vec![1; 16], 8, 8), (vec![1; 16], 10, 7)],
                    ..Batch::default()
                })
                .unwrap();
            assert_eq!(seqs(&**store, 1), [2, 7, 8, 9, 10], "{name}");
        }
    }

    fn limits() -> TaskLimits {
        TaskLimits {
            max_tasks: 10,
            max_per_sender: 10,
            max_events: 4,
            max_body: 1024,
            retention_ms: 1000,
        }
    }

    /// Appends `kind` (in `state`) to task `t` in `table`, into `change`.
    fn append(
        table: &mut TaskTable,
        t: TaskId,
        kind: TaskEventKind,
        state: TaskState,
        body: u8,
        change: &mut Change,
    ) -> TaskRecord {
        table
            .append(&limits(), &t, kind, state, vec![body], None, 10, change)
            .expect("the task takes the event")
    }

    /// What the task service writes, committed to both stores as it
    /// decides: many events of one task in one write (as a round of the
    /// service writes them), past `max_task_events`.
    #[test]
    fn the_events_a_round_folds_are_the_ones_the_record_no_longer_keeps() {
        use TaskEventKind as K;
        use TaskState as S;
        let (_tmp, stores) = both();
        let t = TaskId([7; 16]);
        let mut table = TaskTable::default();
        let mut change = Change::default();
        table
            .submit(
                &limits(),
                t,
                id(1),
                "r1",
                "app.x",
                "go",
                vec![0xf6],
                None,
                None,
                &|_: &NodeId| false,
                0,
                &mut change,
            )
            .unwrap();
        let write = |change: Change| {
            for (name, store) in &stores {
                store
                    .commit(&change.batch)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        };
        write(std::mem::take(&mut change));
        // One round: working, then ten progress events (a handler's
        // clones report at once): only the newest four stay.
        append(&mut table, t, K::State, S::Working, 0, &mut change);
        let mut r = None;
        for n in 1..=10 {
            r = Some(append(
                &mut table,
                t,
                K::Progress,
                S::Working,
                n,
                &mut change,
            ));
        }
        let r = r.unwrap();
        assert_eq!((r.seq, r.first_seq, r.progress_seq), (12, 9, Some(12)));
        write(std::mem::take(&mut change));
        for (name, store) in &stores {
            assert_eq!(
                seqs(&**store, 7),
                [9, 10, 11, 12],
                "{name}: the newest four"
            );
            let loaded = store.load().unwrap();
            assert_eq!(
                loaded.tasks,
                vec![r.clone()],
                "{name}: the record as decided"
            );
        }
        // Questions and answers push the last progress (12) below the
        // oldest kept: it stays, for the info, until another replaces it.
        for n in 0..3 {
            append(&mut table, t, K::Question, S::InputRequired, n, &mut change);
            append(&mut table, t, K::Answer, S::Working, n, &mut change);
        }
        let q = append(&mut table, t, K::Question, S::InputRequired, 9, &mut change);
        assert_eq!(
            (q.seq, q.first_seq, q.progress_seq, q.question_seq),
            (19, 16, Some(12), Some(19))
        );
        write(std::mem::take(&mut change));
        for (name, store) in &stores {
            assert_eq!(seqs(&**store, 7), [12, 16, 17, 18, 19], "{name}");
            let last = store.task_events(&[7; 16], 12, 1).unwrap();
            assert_eq!(
                (last[0].kind, last[0].body.clone()),
                (K::Progress, vec![10]),
                "{name}"
            );
        }
        // Progress while the question waits (a clone of the handler's
        // task): the question is kept below the window, the old progress
        // goes.
        for n in 20..=24 {
            append(&mut table, t, K::Progress, S::InputRequired, n, &mut change);
        }
        write(std::mem::take(&mut change));
        for (name, store) in &stores {
            assert_eq!(seqs(&**store, 7), [19, 21, 22, 23, 24], "{name}");
        }
        // The answer ends the wait: the question goes with the window.
        let a = append(&mut table, t, K::Answer, S::Working, 1, &mut change);
        let done = append(&mut table, t, K::Result, S::Completed, 2, &mut change);
        assert_eq!((a.question_seq, done.first_seq), (None, 23));
        write(std::mem::take(&mut change));
        for (name, store) in &stores {
            // The newest four, and nothing older: the question was
            // answered and the last progress is in the window.
            assert_eq!(seqs(&**store, 7), [23, 24, 25, 26], "{name}");
            let events = store.task_events(&[7; 16], 0, usize::MAX).unwrap();
            assert_eq!(
                events.last().unwrap().kind,
                K::Result,
                "{name}: the final event stays"
            );
        }
    }
}
