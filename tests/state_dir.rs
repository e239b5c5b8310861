//! A node's state directory through the public API: what survives a
//! restart, and what a bad directory gets (a typed error, nothing lost).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use capwire::manifest::{GetConfig, NoArgs, SetConfig, SetConfigArgs};
use capwire::{Keypair, Node, NodeError, StoreError};

/// Makes `path` as a state directory must be: ours, mode 0700.
fn private_dir(path: &Path) {
    fs::DirBuilder::new().mode(0o700).create(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).unwrap();
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn start(dir: &std::path::Path) -> Result<Node, NodeError> {
    Node::builder("state-test")
        .state_dir(dir)
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
}

#[tokio::test]
async fn identity_binding_and_configuration_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    let cp = Node::builder("cp").start().await.unwrap();
    let node = start(&state).await.unwrap();
    let id = node.id();
    let (peer, _) = cp
        .connect_invite(&node.invite(Some(cp.id())).unwrap())
        .await
        .unwrap();
    let set = peer
        .request(
            SetConfig,
            SetConfigArgs {
                value: capwire::envelope::RawValue::encode("kept").unwrap(),
                if_version: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(set.version, 1);
    node.shutdown().await;
    drop(node);

    let node = start(&state).await.unwrap();
    assert_eq!(node.id(), id);
    assert_eq!(node.controller(), Some(cp.id()));
    assert_eq!(node.config().version, 1);
    assert_eq!(node.config().value.decode::<String>().unwrap(), "kept");
    let peer = cp.connect(&node.local_addrs()[0], Some(id)).await.unwrap();
    let got = peer.request(GetConfig, NoArgs {}).await.unwrap();
    assert_eq!(got.version, 1);
    // The binding epoch kept counting: an unbind now is a new epoch, and
    // the former controller is refused.
    assert_eq!(node.unbind().await.unwrap(), Some(cp.id()));
    let refused = peer.request(GetConfig, NoArgs {}).await.unwrap_err();
    assert_eq!(refused.code().map(|c| c.as_str()), Some("unauthorized"));
    node.shutdown().await;
    drop(node);
    let node = start(&state).await.unwrap();
    assert_eq!(node.controller(), None, "the unbind was written too");
    node.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test]
async fn a_state_path_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"not a directory").unwrap();
    let err = start(&file).await.unwrap_err();
    assert!(
        matches!(err, NodeError::Store(StoreError::NotADirectory(_))),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

#[tokio::test]
async fn a_corrupt_store_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    start(&state).await.unwrap().shutdown().await;
    let db = state.join("state.redb");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    let err = start(&state).await.unwrap_err();
    assert!(
        matches!(err, NodeError::Store(StoreError::Corrupt { .. })),
        "{err}"
    );
    assert_eq!(std::fs::read(&db).unwrap(), garbage, "nothing replaced");
}

#[tokio::test]
async fn a_store_of_another_program_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    private_dir(&state);
    let db = state.join("state.redb");
    {
        let other = redb::Database::create(&db).unwrap();
        let tx = other.begin_write().unwrap();
        {
            let table: redb::TableDefinition<'_, &str, u64> = redb::TableDefinition::new("theirs");
            tx.open_table(table).unwrap().insert("k", 1).unwrap();
        }
        tx.commit().unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let err = start(&state).await.unwrap_err();
    assert!(
        matches!(err, NodeError::Store(StoreError::Foreign { .. })),
        "{err}"
    );
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[tokio::test]
async fn another_key_for_an_existing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    let node = start(&state).await.unwrap();
    let id = node.id();
    node.shutdown().await;
    drop(node);
    let err = Node::builder("state-test")
        .state_dir(&state)
        .keypair(Keypair::generate().unwrap())
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(err, NodeError::Store(StoreError::Identity { .. })),
        "{err}"
    );
    assert_eq!(
        start(&state).await.unwrap().id(),
        id,
        "the identity is untouched"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn a_second_process_on_the_same_directory_is_refused() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    let mut first = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["node", "--json", "--state"])
        .arg(&state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(first.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("node_id"), "{line}");

    // Another process: refused with a clear message and exit code 1.
    let second = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["node", "--state"])
        .arg(&state)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use"), "{stderr}");
    // A node in this process: the typed error.
    let err = start(&state).await.unwrap_err();
    assert!(
        matches!(err, NodeError::Store(StoreError::Locked(_))),
        "{err}"
    );

    first.kill().unwrap();
    first.wait().unwrap();
    // Once the first is gone, the directory opens (after crash recovery).
    tokio::time::sleep(Duration::from_millis(50)).await;
    start(&state).await.unwrap().shutdown().await;
}

#[tokio::test]
async fn a_state_directory_others_can_enter_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    private_dir(&state);
    for open in [0o775, 0o755, 0o770, 0o750, 0o711, 0o701, 0o707, 0o1777] {
        fs::set_permissions(&state, fs::Permissions::from_mode(open)).unwrap();
        let err = start(&state).await.unwrap_err();
        let NodeError::Store(StoreError::NotPrivate {
            ref path,
            ref detail,
        }) = err
        else {
            panic!("{open:o}: {err}");
        };
        assert_eq!(path, &state);
        let fix = format!("chmod 700 {}", state.display());
        assert!(detail.contains(&fix), "{open:o}: the fix is named: {err}");
        assert_eq!(mode(&state), open, "the mode is left for the user to fix");
        assert!(
            names_in(&state).is_empty(),
            "nothing written: {:?}",
            names_in(&state)
        );
    }
    // Fixed, it opens; and a node's own directory is checked again on
    // every open, not only when it is made.
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).unwrap();
    let node = start(&state).await.unwrap();
    let id = node.id();
    node.shutdown().await;
    drop(node);
    fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
    let err = start(&state).await.unwrap_err();
    assert!(
        matches!(err, NodeError::Store(StoreError::NotPrivate { .. })),
        "{err}"
    );
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(start(&state).await.unwrap().id(), id, "nothing was lost");
}

#[tokio::test]
async fn a_state_directory_of_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let me = fs::metadata(dir.path()).unwrap().uid();
    let (state, owner) = if rustix::process::geteuid().is_root() {
        // Root can hand a directory to someone else.
        let state = dir.path().join("theirs");
        private_dir(&state);
        std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
        (state, 65534)
    } else {
        // Anyone else finds a directory that is not theirs at the root.
        (Path::new("/").to_path_buf(), 0)
    };
    assert_ne!(owner, me);
    let err = start(&state).await.unwrap_err();
    let NodeError::Store(StoreError::NotPrivate { ref detail, .. }) = err else {
        panic!("{err}");
    };
    assert!(
        detail.contains(&format!("belongs to uid {owner}")) && detail.contains("chown"),
        "the owner and the fix are named: {err}"
    );
}

#[tokio::test]
async fn a_new_state_directory_is_private_and_its_key_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("a").join("n");
    let node = start(&state).await.unwrap();
    let id = node.id();
    node.shutdown().await;
    drop(node);
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("identity.key")), 0o600);
    assert_eq!(names_in(&state), ["audit", "identity.key", "state.redb"]);
    assert_eq!(
        mode(&state.join("audit")),
        0o700,
        "the audit log's directory"
    );
    // The key, as `capwire keygen` writes it: one line of lowercase hex.
    let text = fs::read_to_string(state.join("identity.key")).unwrap();
    let hex = text
        .strip_prefix("capwire-identity-v1\n")
        .and_then(|t| t.strip_suffix('\n'))
        .unwrap();
    assert_eq!(hex.len(), 64);
    assert!(
        hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "{hex}"
    );
    let key = capwire::identity::read_key_file(&state.join("identity.key")).unwrap();
    assert_eq!(key.public(), id);
}

#[tokio::test]
async fn temporary_key_files_left_by_a_crash_break_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("n");
    private_dir(&state);
    // What a crash while writing the key could leave: the fixed name of
    // older versions, a random one, one only readable, and a directory
    // that happens to have such a name.
    for name in [".identity.key.new", ".identity.key.Ab3dE9.new"] {
        fs::write(state.join(name), b"capwire-identity-v1\nhalf").unwrap();
    }
    fs::write(state.join(".identity.key.r3ad0n.new"), b"x").unwrap();
    fs::set_permissions(
        state.join(".identity.key.r3ad0n.new"),
        fs::Permissions::from_mode(0o400),
    )
    .unwrap();
    fs::create_dir(state.join(".identity.key.adir00.new")).unwrap();
    let node = start(&state).await.unwrap();
    let id = node.id();
    node.shutdown().await;
    drop(node);
    assert_eq!(
        names_in(&state),
        [
            ".identity.key.adir00.new",
            "audit",
            "identity.key",
            "state.redb"
        ],
        "the leftover files are gone, the new key is in place"
    );
    assert_eq!(mode(&state.join("identity.key")), 0o600);
    assert_eq!(start(&state).await.unwrap().id(), id);
}
