//! The audit log (WIRE.md 5.6) with real processes and files: a control
//! plane (`capwire ctl audit`) detects a log whose bytes were changed,
//! that was rolled back to an older copy, or that forked; an independent
//! verifier written from WIRE.md (tests/python/audit_verify.py) checks
//! what the control plane read and refuses it tampered; every call a
//! killed node answered has its entry after the restart; and a peer
//! flooding denied calls keeps the log within its budget.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pyenv;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use capwire::envelope::{ErrorCode, ReqId};
use capwire::manifest::ProtocolVersions;
use capwire::{Addr, Limits, Node, NodeId};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Process {
    child: Killed,
    addr: String,
    invite: String,
    node_id: String,
}

/// A loopback address with a free port: a restarted node listens where
/// the control plane's book says it does.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn start(state: &Path, listen: &str) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["node", "--json", "--listen", listen, "--state"])
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("capwire node starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the start line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("the start line is JSON");
    Process {
        child: Killed(child),
        addr: v["addrs"][0].as_str().expect("an address").to_owned(),
        invite: v["invite"].as_str().unwrap_or_default().to_owned(),
        node_id: v["node_id"].as_str().expect("a node id").to_owned(),
    }
}

fn ctl(cp: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_capwire"))
        .arg("ctl")
        .arg("--state")
        .arg(cp)
        .args(args)
        .output()
        .expect("capwire ctl runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `ctl audit n --entries`: its exit code and output.
fn audit(cp: &Path, dump: Option<&Path>) -> (i32, String) {
    let mut args = vec!["audit", "n", "--entries"];
    let d;
    if let Some(p) = dump {
        d = p.display().to_string();
        args.extend(["--dump", &d]);
    }
    let o = ctl(cp, &args);
    (o.status.code().unwrap_or(-1), text(&o))
}

fn calls(cp: &Path, n: usize) {
    for _ in 0..n {
        let o = ctl(cp, &["call", "n", "core.configuration", "get_config"]);
        assert!(o.status.success(), "{}", text(&o));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Where record `n` of an entries file starts (each record is a 4-byte
/// length and the entry).
fn start_of(file: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        let len = u32::from_be_bytes(file[at..at + 4].try_into().unwrap()) as usize;
        at += 4 + len;
    }
    at
}

fn segment(state: &Path) -> PathBuf {
    state.join("audit").join("000000000000.log")
}

/// Runs the independent verifier on a dump; `None` when Python is skipped.
fn verify(dump: &Path) -> Option<(bool, String)> {
    let python = pyenv::python()?;
    let o = Command::new(python)
        .arg(pyenv::repo().join("tests/python/audit_verify.py"))
        .arg(dump)
        .output()
        .expect("the verifier runs");
    Some((o.status.success(), text(&o)))
}

#[test]
fn a_control_plane_detects_a_log_changed_rolled_back_or_forked() {
    let dir = tempfile::tempdir().unwrap();
    let (state, cp) = (dir.path().join("node"), dir.path().join("cp"));
    let listen = free_addr();
    let node = start(&state, &listen);
    let o = ctl(&cp, &["bind", &node.invite, "--name", "n"]);
    assert!(o.status.success(), "{}", text(&o));
    calls(&cp, 3);
    let d1 = dir.path().join("d1.json");
    let (code, out) = audit(&cp, Some(&d1));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"status\":\"first\""), "{out}");
    // The independent verifier agrees, and refuses the dump tampered.
    if let Some((ok, report)) = verify(&d1) {
        assert!(ok, "{report}");
        let mut doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&d1).unwrap()).unwrap();
        let entry = doc["entries"][2]["entry"].as_str().unwrap().to_owned();
        let flipped = format!(
            "{}{}",
            &entry[..entry.len() - 1],
            if entry.ends_with('0') { "1" } else { "0" }
        );
        doc["entries"][2]["entry"] = serde_json::Value::String(flipped);
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, doc.to_string()).unwrap();
        let (ok, report) = verify(&bad).unwrap();
        assert!(!ok && report.contains("FAIL"), "{report}");
    }
    // An older copy of the log, kept aside.
    drop(node);
    let old = dir.path().join("old-audit");
    copy_dir(&state.join("audit"), &old);
    let node = start(&state, &listen);
    calls(&cp, 3);
    let d2 = dir.path().join("d2.json");
    let (code, out) = audit(&cp, Some(&d2));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"status\":\"consistent\""), "{out}");
    if let Some((ok, report)) = verify(&d2) {
        assert!(ok, "two checkpoints and a consistency proof: {report}");
    }

    // A byte of an entry changed on disk: the entries no longer make the
    // signed root. (An entry no checkpoint covered yet can be changed
    // unseen by anyone; one a checkpoint covered cannot.)
    drop(node);
    let seg = segment(&state);
    let clean = std::fs::read(&seg).unwrap();
    let mut bytes = clean.clone();
    // The last byte of entry 2 (covered by the checkpoints checked): each
    // record is a 4-byte length and the entry.
    let mut at = 0usize;
    for _ in 0..3 {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 4 + len;
    }
    bytes[at - 1] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let node = start(&state, &listen);
    let (code, out) = audit(&cp, None);
    assert_eq!(code, 9, "a changed entry is a rewritten log: {out}");
    assert!(out.contains("rewritten"), "{out}");
    drop(node);
    // An entry taken out: what follows moves up, and no longer makes the
    // signed root either.
    let mut cut = clean[..start_of(&clean, 2)].to_vec();
    cut.extend_from_slice(&clean[start_of(&clean, 3)..]);
    std::fs::write(&seg, &cut).unwrap();
    let node = start(&state, &listen);
    let (code, out) = audit(&cp, None);
    assert_eq!(code, 9, "a removed entry is a rewritten log: {out}");
    drop(node);
    std::fs::write(&seg, &clean).unwrap();

    // Rolled back to the older copy: fewer entries than last checked.
    std::fs::remove_dir_all(state.join("audit")).unwrap();
    copy_dir(&old, &state.join("audit"));
    let node = start(&state, &listen);
    let (code, out) = audit(&cp, None);
    assert_eq!(code, 9, "{out}");
    assert!(out.contains("rolled back"), "{out}");
    // The rolled-back log grows past the size checked: a fork, which no
    // consistency proof joins to what was checked.
    calls(&cp, 6);
    let (code, out) = audit(&cp, None);
    assert_eq!(code, 9, "{out}");
    assert!(out.contains("do not extend"), "{out}");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_a_killed_node_answered_has_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (state, cp) = (dir.path().join("node"), dir.path().join("cp"));
    let listen = free_addr();
    let node = start(&state, &listen);
    let o = ctl(&cp, &["bind", &node.invite, "--name", "n"]);
    assert!(o.status.success(), "{}", text(&o));
    let (code, out) = audit(&cp, None);
    assert_eq!(code, 0, "{out}");
    // A burst of calls from another node, killed in the middle.
    let client = Node::builder("client").start().await.unwrap();
    let id = NodeId::try_from(node.node_id.as_str()).unwrap();
    let addr: Addr = node.addr.parse().unwrap();
    let peer = client.connect(&addr, Some(id)).await.unwrap();
    let mut node = node;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut burst = Vec::new();
    for w in 0..8 {
        let (peer, acked) = (peer.clone(), acked.clone());
        burst.push(tokio::spawn(async move {
            for n in 0.. {
                let req = format!("w{w}n{n}");
                let id = ReqId::try_from(req.as_str()).unwrap();
                match peer
                    .request_with_id(
                        ProtocolVersions,
                        Default::default(),
                        &id,
                        Duration::from_secs(2),
                    )
                    .await
                {
                    Ok(_) => acked.lock().unwrap().push(req),
                    Err(_) => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    node.child.0.kill().unwrap();
    let _ = node.child.0.wait();
    for b in burst {
        let _ = b.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 20,
        "{} calls answered before the kill",
        acked.len()
    );
    // Restarted: consistent with the checkpoint kept before, and every
    // answered call has its entry.
    let _node = start(&state, &listen);
    let dump = dir.path().join("d.json");
    let (code, out) = audit(&cp, Some(&dump));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"status\":\"consistent\""), "{out}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&dump).unwrap()).unwrap();
    let mut seen = std::collections::HashSet::new();
    for e in doc["entries"].as_array().unwrap() {
        let bytes = hex(e["entry"].as_str().unwrap());
        let v: ciborium::Value = ciborium::from_reader(bytes.as_slice()).unwrap();
        let map = v.as_map().unwrap();
        let get = |k: &str| {
            map.iter()
                .find(|(key, _)| key.as_text() == Some(k))
                .and_then(|(_, v)| v.as_text().map(str::to_owned))
        };
        if get("verb").as_deref() == Some("versions") && get("outcome").as_deref() == Some("ok") {
            seen.insert(get("req").unwrap());
        }
    }
    let missing: Vec<&String> = acked.iter().filter(|r| !seen.contains(*r)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} answered calls have no entry: {missing:?}",
        missing.len(),
        acked.len()
    );
    if let Some((ok, report)) = verify(&dump) {
        assert!(ok, "{report}");
    }
    client.shutdown().await;
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denied_calls_keeps_the_log_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        audit_max_bytes: capwire::MIN_AUDIT_BUDGET,
        ..Limits::default()
    };
    let node = Node::builder("server")
        .listen("127.0.0.1:0".parse().unwrap())
        .limits(limits)
        .state_dir(dir.path().join("state"))
        .start()
        .await
        .unwrap();
    let client = Node::builder("client").start().await.unwrap();
    let addr = node.local_addrs()[0].clone();
    let peer = client.connect(&addr, Some(node.id())).await.unwrap();
    // Controller verbs from a stranger: every one denied, every one recorded.
    let mut flood = Vec::new();
    for w in 0..16 {
        let peer = peer.clone();
        flood.push(tokio::spawn(async move {
            let mut denied = 0u32;
            for _ in 0..1_000 {
                let r = peer
                    .request(capwire::manifest::GetConfig, Default::default())
                    .await;
                if matches!(r, Err(capwire::CallError::Denied(ref e)) if e.code == ErrorCode::Unauthorized) {
                    denied += 1;
                }
            }
            let _ = w;
            denied
        }));
    }
    let mut denied = 0;
    for f in flood {
        denied += f.await.unwrap();
    }
    assert_eq!(denied, 16_000);
    // Pruning runs beside the calls: within moments the log is back
    // within its budget.
    let mut stats = node.audit_stats();
    for _ in 0..100 {
        if stats.bytes <= capwire::MIN_AUDIT_BUDGET {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        stats = node.audit_stats();
    }
    assert!(stats.entries > 16_000, "{stats:?}");
    assert!(stats.bytes <= capwire::MIN_AUDIT_BUDGET, "{stats:?}");
    assert!(
        stats.first_kept > 0,
        "the oldest entries were pruned: {stats:?}"
    );
    let on_disk: u64 = std::fs::read_dir(dir.path().join("state/audit"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        on_disk <= capwire::MIN_AUDIT_BUDGET + 4096,
        "{on_disk} bytes on disk"
    );
    // And the node still serves.
    let v = peer
        .request(ProtocolVersions, Default::default())
        .await
        .unwrap();
    assert_eq!(v.versions, [1, 2, 3]);
    client.shutdown().await;
    node.shutdown().await;
}

capwire::manifest::verb! { /** Echo, its args kept in the log. */
pub struct Kept: request "app.kept" / "echo", Bootstrap, String => String; }
capwire::manifest::verb! { /** Echo, its args only digested. */
pub struct Plain: request "app.plain" / "echo", Bootstrap, String => String; }
capwire::manifest::verb! { /** A task that answers its args. */
pub struct Job: task "app.plain" / "job", Bootstrap, String => String; }

async fn echo(s: String) -> Result<String, capwire::HandlerError> {
    Ok(s)
}

async fn job(s: String, _task: capwire::Task) -> Result<String, capwire::HandlerError> {
    Ok(s)
}

/// One key and value of an entry.
type Field = (String, ciborium::Value);

/// The entries `[0, size)` as maps, read through `core.audit/entries`.
async fn read_entries(cp: &capwire::Peer) -> Vec<Vec<Field>> {
    use capwire::manifest::{AuditCheckpoint, AuditEntries, EntriesArgs, NoArgs};
    let size = cp.request(AuditCheckpoint, NoArgs {}).await.unwrap().size;
    let mut stream = cp
        .stream(AuditEntries, EntriesArgs { from: 0, to: size })
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(item) = stream.next().await {
        let item = item.unwrap();
        let v: ciborium::Value = ciborium::from_reader(hex(&item.entry).as_slice()).unwrap();
        out.push(
            v.as_map()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_text().unwrap().to_owned(), v.clone()))
                .collect(),
        );
    }
    assert_eq!(out.len() as u64, size);
    out
}

fn field<'a>(e: &'a [(String, ciborium::Value)], k: &str) -> Option<&'a ciborium::Value> {
    e.iter().find(|(key, _)| key == k).map(|(_, v)| v)
}

fn text_of(e: &[Field], k: &str) -> Option<String> {
    field(e, k).and_then(|v| v.as_text().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_decision_and_change_is_an_entry() {
    use capwire::grants::Right;
    use capwire::manifest::{GetConfig, NoArgs};
    let node = Node::builder("audited")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(
            capwire::Capability::new("app.kept", "1.0.0")
                .unwrap()
                .audit_args(true)
                .handle(Kept, echo),
        )
        .capability(
            capwire::Capability::new("app.plain", "1.0.0")
                .unwrap()
                .handle(Plain, echo)
                .task(Job, job),
        )
        .start()
        .await
        .unwrap();
    let addr = node.local_addrs()[0].clone();
    let cp_node = Node::builder("cp").start().await.unwrap();
    let cp = cp_node
        .connect_invite(&node.invite(Some(cp_node.id())).unwrap())
        .await
        .unwrap()
        .0;
    let worker = Node::builder("worker").start().await.unwrap();
    let from_worker = worker.connect(&addr, Some(node.id())).await.unwrap();
    // A stranger's controller call: denied.
    assert!(from_worker.request(GetConfig, NoArgs {}).await.is_err());
    // Calls whose args are kept, and not.
    from_worker.request(Kept, "keep me".into()).await.unwrap();
    from_worker
        .request(Plain, "digest me".into())
        .await
        .unwrap();
    // A task, to its end.
    let task = from_worker.submit(Job, "work".into()).await.unwrap();
    assert_eq!(task.result().await.unwrap(), "work");
    // A grant presented, used, revoked.
    let token = cp_node
        .grant(
            &cp,
            worker.id(),
            worker.grant_key(),
            vec![Right::verb("core.configuration", "get_config")],
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let grant = from_worker.present(&token).await.unwrap().grant;
    from_worker.request(GetConfig, NoArgs {}).await.unwrap();
    cp.revoke_grant(&grant).await.unwrap();

    let entries = read_entries(&cp).await;
    let find = |what: &dyn Fn(&[Field]) -> bool| entries.iter().find(|e| what(e)).cloned();
    let kind = |e: &[Field], k: &str| text_of(e, "k").as_deref() == Some(k);
    assert!(kind(&entries[0], "open"), "the log begins with its opening");
    let bound = find(&|e| kind(e, "bind")).expect("the bind");
    assert_eq!(text_of(&bound, "detail").as_deref(), Some("bound"));
    let denied =
        find(&|e| kind(e, "call") && text_of(e, "outcome").as_deref() == Some("unauthorized"))
            .expect("the denied call");
    assert_eq!(text_of(&denied, "class").as_deref(), Some("controller"));
    assert!(
        field(&denied, "by").is_none(),
        "a denied call names no authority"
    );
    let kept = find(&|e| text_of(e, "cap").as_deref() == Some("app.kept")).expect("the kept call");
    assert_eq!(
        field(&kept, "args").and_then(|v| v.as_text()),
        Some("keep me"),
        "its args, kept"
    );
    let plain = find(&|e| {
        text_of(e, "verb").as_deref() == Some("echo")
            && text_of(e, "cap").as_deref() == Some("app.plain")
    })
    .expect("the plain call");
    assert!(field(&plain, "args").is_none(), "only digested");
    assert_eq!(
        field(&plain, "arg")
            .and_then(|v| v.as_bytes())
            .map(Vec::len),
        Some(32)
    );
    assert_eq!(text_of(&plain, "by").as_deref(), Some("bootstrap"));
    let states: Vec<String> = entries
        .iter()
        .filter(|e| kind(e, "task"))
        .filter_map(|e| text_of(e, "outcome"))
        .collect();
    assert!(
        states.first().map(String::as_str) == Some("submitted")
            && states.last().map(String::as_str) == Some("completed"),
        "the task's states: {states:?}"
    );
    let presented =
        find(&|e| kind(e, "grant") && text_of(e, "detail").as_deref() == Some("presented"))
            .expect("the grant presented");
    assert_eq!(
        text_of(&presented, "grant").as_deref(),
        Some(grant.as_str())
    );
    let chain: Vec<Vec<u8>> = field(&presented, "holders")
        .and_then(|v| v.as_array())
        .expect("the chain of holders")
        .iter()
        .map(|k| k.as_bytes().unwrap().clone())
        .collect();
    assert_eq!(
        chain,
        [worker.id().as_bytes().to_vec()],
        "minted for the worker, no hand-on"
    );
    let delegated = find(&|e| kind(e, "call") && text_of(e, "by").as_deref() == Some("grant"))
        .expect("the call a grant let through");
    assert_eq!(
        text_of(&delegated, "grant").as_deref(),
        Some(grant.as_str())
    );
    assert_eq!(text_of(&delegated, "outcome").as_deref(), Some("ok"));
    let revoked = find(&|e| kind(e, "grant") && text_of(e, "detail").as_deref() == Some("revoked"))
        .expect("the revocation");
    assert_eq!(text_of(&revoked, "grant").as_deref(), Some(grant.as_str()));
    let by_cp =
        find(&|e| text_of(e, "verb").as_deref() == Some("revoke")).expect("the revoke call");
    assert_eq!(text_of(&by_cp, "by").as_deref(), Some("control_plane"));
    assert!(field(&by_cp, "epoch").is_some(), "with its binding epoch");
    for n in [worker, cp_node, node] {
        n.shutdown().await;
    }
}
