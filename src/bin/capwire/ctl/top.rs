//! `capwire ctl top`: a live view of the cluster, redrawn as pushes
//! arrive (and once a second): the members of each bound node's cluster
//! and their monitoring, the calls each watched node received per
//! (cap, verb) with how many its chokepoint denied, the calls this control
//! plane made (those other `ctl` commands hand to it included), and the
//! latest monitoring copies.
//!
//! Denials are judged from the copies with the node's own rule: a
//! received (cap, verb) its manifest does not list is `unknown_verb`, a
//! controller verb from anyone but this control plane is `unauthorized`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use serde_json::Value as Json;
use tokio::io::AsyncBufReadExt;

use super::render::{call_outcome, clock, copy_line};
use super::{Backend, ClusterOp, CtlCommand, NodeArg};
use crate::exit::Failure;

#[derive(Default)]
struct Counts {
    received: u64,
    denied: u64,
    sent: u64,
}

/// The calls this control plane made to one (node, cap, verb).
#[derive(Default)]
struct Made {
    calls: u64,
    denied: u64,
    failed: u64,
    last: String,
}

#[derive(Default)]
struct View {
    me: String,
    /// The bound nodes that are nobody's child.
    roots: Vec<String>,
    /// Peer name -> connected.
    peers: BTreeMap<String, bool>,
    /// Parent name -> roster record.
    rosters: BTreeMap<String, Json>,
    /// Node name -> (cap, verb) -> class.
    manifests: HashMap<String, HashMap<(String, String), String>>,
    /// (node, cap, verb) -> counts.
    calls: BTreeMap<(String, String, String), Counts>,
    /// (node, cap, verb) -> the calls made to it from here.
    made: BTreeMap<(String, String, String), Made>,
    copies: VecDeque<String>,
    keep: usize,
    copies_seen: u64,
    gaps: u64,
    status: String,
}

impl View {
    fn apply(&mut self, r: &Json) -> Option<String> {
        let text = |k: &str| r[k].as_str().unwrap_or("").to_owned();
        match r["kind"].as_str().unwrap_or("") {
            "peers" => {
                self.me = text("me");
                for p in r["peers"].as_array().into_iter().flatten() {
                    let name = p["name"].as_str().unwrap_or("").to_owned();
                    let connected = p["connected"].as_bool().unwrap_or(false);
                    if p["parent"].is_null() {
                        self.roots.push(name.clone());
                    }
                    self.peers.entry(name).or_insert(connected);
                }
            }
            "roster" => {
                self.rosters.insert(text("peer"), r.clone());
            }
            "manifest" => {
                let mut verbs = HashMap::new();
                for c in r["capabilities"].as_array().into_iter().flatten() {
                    for v in c["verbs"].as_array().into_iter().flatten() {
                        verbs.insert(
                            (
                                c["id"].as_str().unwrap_or("").to_owned(),
                                v["name"].as_str().unwrap_or("").to_owned(),
                            ),
                            v["class"].as_str().unwrap_or("").to_owned(),
                        );
                    }
                }
                self.manifests.insert(text("name_in_book"), verbs);
            }
            "connected" => {
                let name = text("peer");
                let new = !self.manifests.contains_key(&name);
                self.peers.insert(name.clone(), true);
                // A node seen for the first time: learn its verbs.
                return new.then_some(name);
            }
            "disconnected" => {
                self.peers.insert(text("peer"), false);
            }
            "copy" => {
                self.copies_seen += 1;
                self.gaps += r["dropped"].as_u64().unwrap_or(0);
                let node = text("from");
                let key = (node.clone(), text("cap"), text("verb"));
                let counts = self.calls.entry(key.clone()).or_default();
                if r["dir"].as_str() == Some("in") {
                    counts.received += 1;
                    if let Some(verbs) = self.manifests.get(&node) {
                        let denied = match verbs.get(&(key.1.clone(), key.2.clone())) {
                            None => true,
                            Some(class) => {
                                class == "controller" && r["peer_id"].as_str() != Some(&self.me)
                            }
                        };
                        if denied {
                            counts.denied += 1;
                        }
                    }
                } else {
                    counts.sent += 1;
                }
                self.copies.push_back(copy_line(r));
                while self.copies.len() > self.keep {
                    self.copies.pop_front();
                }
            }
            "call" => {
                let made = self
                    .made
                    .entry((text("peer"), text("cap"), text("verb")))
                    .or_default();
                made.calls += 1;
                if r["denied"].as_bool() == Some(true) {
                    made.denied += 1;
                } else if r["ok"].as_bool() != Some(true) {
                    made.failed += 1;
                }
                made.last = call_outcome(r);
            }
            "lagged" => self.status = format!("missed {} pushes", r["missed"]),
            _ => {}
        }
        None
    }

    fn draw(&self) -> String {
        let mut out = String::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        let up = self.peers.values().filter(|c| **c).count();
        let _ = writeln!(
            out,
            "capwire top   {} UTC   nodes {} ({} connected)   copies {} (gaps {})   q+Enter or Ctrl-C quits",
            &clock(now)[..8],
            self.peers.len(),
            up,
            self.copies_seen,
            self.gaps
        );
        if !self.status.is_empty() {
            let _ = writeln!(out, "{}", self.status);
        }
        let _ = writeln!(out);
        for (parent, roster) in &self.rosters {
            let members = roster["members"].as_array().cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "MEMBERS of {parent} (roster v{}, {} members)",
                roster["version"],
                members.len()
            );
            let _ = writeln!(
                out,
                "  {:<10} {:<14} {:<9} {:<10} {:<10} CAPS",
                "CID", "NAME", "STATUS", "MONITORING", "SESSION"
            );
            for m in &members {
                let name = m["name"].as_str().unwrap_or("");
                let session = match self.peers.get(name) {
                    Some(true) => "up",
                    Some(false) => "down",
                    None => "-",
                };
                let caps = m["caps"]
                    .as_array()
                    .map(|c| {
                        c.iter()
                            .filter_map(Json::as_str)
                            .filter(|c| !c.starts_with("core."))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  {:<10} {:<14} {:<9} {:<10} {:<10} {caps}",
                    m["cid"].as_str().unwrap_or(""),
                    name,
                    m["status"].as_str().unwrap_or(""),
                    m["monitoring"].as_str().unwrap_or(""),
                    session,
                );
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "CALLS (from monitoring copies)");
        let _ = writeln!(
            out,
            "  {:<12} {:<32} {:>8} {:>8} {:>8}",
            "NODE", "CAP/VERB", "RECEIVED", "DENIED", "SENT"
        );
        for ((node, cap, verb), c) in &self.calls {
            let _ = writeln!(
                out,
                "  {:<12} {:<32} {:>8} {:>8} {:>8}",
                node,
                format!("{cap}/{verb}"),
                c.received,
                c.denied,
                c.sent
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "CALLS FROM THIS CONTROL PLANE");
        let _ = writeln!(
            out,
            "  {:<12} {:<32} {:>8} {:>8} {:>8}  LAST",
            "NODE", "CAP/VERB", "CALLS", "DENIED", "FAILED"
        );
        for ((node, cap, verb), m) in &self.made {
            let _ = writeln!(
                out,
                "  {:<12} {:<32} {:>8} {:>8} {:>8}  {}",
                node,
                format!("{cap}/{verb}"),
                m.calls,
                m.denied,
                m.failed,
                m.last
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "RECENT COPIES");
        for line in &self.copies {
            let _ = writeln!(out, "  {line}");
        }
        out
    }
}

/// Runs one command to its end and feeds its records to the view.
async fn fetch(
    backend: &Backend,
    command: CtlCommand,
    timeout: Duration,
    view: &mut View,
) -> Result<(), Failure> {
    let (mut rx, done) = backend.start(command, timeout);
    while let Some(r) = rx.recv().await {
        view.apply(&r);
    }
    done.await
        .unwrap_or_else(|e| Err(Failure::failed(e.to_string())))
}

async fn learn_manifest(backend: &Backend, name: &str, timeout: Duration, view: &mut View) {
    let (mut rx, done) = backend.start(
        CtlCommand::Manifest {
            node: NodeArg::new(name),
        },
        timeout,
    );
    while let Some(mut r) = rx.recv().await {
        r["name_in_book"] = Json::String(name.to_owned());
        view.apply(&r);
    }
    let _ = done.await;
}

/// `capwire ctl top`.
pub(crate) async fn run(backend: &Backend, timeout: Duration, keep: usize) -> Result<(), Failure> {
    let mut view = View {
        keep: keep.max(1),
        ..View::default()
    };
    fetch(backend, CtlCommand::Peers, timeout, &mut view).await?;
    if view.peers.is_empty() {
        return Err(Failure::usage(
            "no node is bound yet: run `capwire ctl bind INVITE` first",
        ));
    }
    let names: Vec<String> = view.peers.keys().cloned().collect();
    for name in &names {
        learn_manifest(backend, name, timeout, &mut view).await;
    }
    for name in view.roots.clone() {
        // A node that cannot be reached now shows up when it can.
        let _ = fetch(
            backend,
            CtlCommand::Cluster {
                peer: Some(name),
                op: ClusterOp::List,
            },
            timeout,
            &mut view,
        )
        .await;
    }
    let (mut records, watch) = backend.start(CtlCommand::Watch, timeout);
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut screen = std::io::stdout();
    let mut stdin_open = true;
    let signal = crate::node::wait_for_signal();
    tokio::pin!(signal);
    // The alternate screen, cursor hidden; restored on the way out.
    let _ = write!(screen, "\x1b[?1049h\x1b[?25l");
    let result = loop {
        let _ = write!(screen, "\x1b[H\x1b[2J{}", view.draw());
        let _ = screen.flush();
        tokio::select! {
            record = records.recv() => match record {
                Some(r) => {
                    if let Some(new) = view.apply(&r) {
                        learn_manifest(backend, &new, timeout, &mut view).await;
                    }
                }
                None => break Ok(()),
            },
            _ = tick.tick() => {}
            line = stdin.next_line(), if stdin_open => match line {
                Ok(Some(l)) if l.trim() == "q" => break Ok(()),
                Ok(Some(_)) => {}
                // No terminal input (or it closed): run until a signal.
                Ok(None) | Err(_) => stdin_open = false,
            },
            () = &mut signal => break Ok(()),
        }
    };
    let _ = write!(screen, "\x1b[?25h\x1b[?1049l");
    let _ = screen.flush();
    watch.abort();
    result
}
