//! A node's state directory through the public API: what survives a
//! restart, and what a bad directory gets (a typed error, nothing lost).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use capwire::manifest::{GetConfig, NoArgs, SetConfig, SetConfigArgs};
use capwire::{Keypair, Node, NodeError, StoreError};

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
    std::fs::create_dir(&state).unwrap();
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
