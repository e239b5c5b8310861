//! The control plane's address book: the nodes it bound, by name, kept in
//! `peers.json` in its state directory (mode 0600). Each change replaces
//! the file atomically and durably: the new book is written to a fresh
//! temporary file beside it and synced, renamed over `peers.json`, and
//! then the directory is synced, so that after a power cut the book is
//! the old one or the new one, never neither.

use std::fs;
use std::path::{Path, PathBuf};

use capwire::files::{Replace, write_private};
use capwire::{Addr, Invite, NodeId};
use serde::{Deserialize, Serialize};

use crate::exit::Failure;

const FILE: &str = "peers.json";
/// A new book is written as `.peers.json.XXXXXX.new` before it replaces
/// the old one.
/// A book larger than this is refused rather than read.
const MAX_FILE: u64 = 4 << 20;

/// One node the control plane knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The name commands refer to it by.
    pub(crate) name: String,
    /// Its key.
    pub(crate) node_id: NodeId,
    /// Where to reach it (`tcp://HOST:PORT`, `unix:PATH`).
    pub(crate) addrs: Vec<String>,
    /// For a child: the name of the node whose cluster it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<String>,
    /// For a child: its cid in the parent's roster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cid: Option<String>,
}

impl Entry {
    /// The addresses that parse (the book is ours, so all of them do).
    pub(crate) fn addrs(&self) -> Vec<Addr> {
        self.addrs.iter().filter_map(|a| a.parse().ok()).collect()
    }
}

/// The book.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Book {
    pub(crate) peers: Vec<Entry>,
    #[serde(skip)]
    dir: PathBuf,
}

impl Book {
    /// Reads the book in `dir` (empty when there is none).
    pub(crate) fn load(dir: &Path) -> Result<Book, Failure> {
        let path = dir.join(FILE);
        let bad = |e: String| Failure::failed(format!("cannot read {}: {e}", path.display()));
        let mut book = match fs::metadata(&path) {
            Ok(meta) if meta.len() > MAX_FILE => return Err(bad("too large".into())),
            Ok(_) => {
                let text = fs::read(&path).map_err(|e| bad(e.to_string()))?;
                serde_json::from_slice::<Book>(&text).map_err(|e| bad(e.to_string()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Book::default(),
            Err(e) => return Err(bad(e.to_string())),
        };
        book.dir = dir.to_path_buf();
        Ok(book)
    }

    fn save(&self) -> Result<(), Failure> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| Failure::failed(e.to_string()))?;
        write_private(&self.dir, FILE, &text, Replace::Always).map_err(|e| {
            Failure::failed(format!(
                "cannot write {}: {e}",
                self.dir.join(FILE).display()
            ))
        })
    }

    /// Adds or updates the entry for `entry.node_id` (its name replaces an
    /// entry of that name for another key).
    pub(crate) fn put(&mut self, entry: Entry) -> Result<(), Failure> {
        self.peers
            .retain(|p| p.node_id != entry.node_id && p.name != entry.name);
        self.peers.push(entry);
        self.peers.sort_by(|a, b| a.name.cmp(&b.name));
        self.save()
    }

    /// Forgets the entry named or keyed `spec`; whether there was one.
    pub(crate) fn remove(&mut self, id: NodeId) -> Result<bool, Failure> {
        let before = self.peers.len();
        self.peers.retain(|p| p.node_id != id);
        if self.peers.len() == before {
            return Ok(false);
        }
        self.save().map(|()| true)
    }

    /// The node `spec` names: an invite (`capwire://...`; its addresses
    /// come first), a name in the book, or a key of a node in the book.
    pub(crate) fn resolve(&self, spec: &str) -> Result<Entry, Failure> {
        if spec.contains("://") || spec.contains('@') {
            let invite: Invite = spec
                .parse()
                .map_err(|e| Failure::usage(format!("{spec:?} is not an invite: {e}")))?;
            let mut addrs: Vec<String> = invite.addrs.iter().map(ToString::to_string).collect();
            let Some(known) = self.peers.iter().find(|p| p.node_id == invite.node_id) else {
                return Ok(Entry {
                    name: short(&invite.node_id),
                    node_id: invite.node_id,
                    addrs,
                    parent: None,
                    cid: None,
                });
            };
            // A node in the book: where the invite says it is now, then
            // where the book says.
            for a in &known.addrs {
                if !addrs.contains(a) {
                    addrs.push(a.clone());
                }
            }
            return Ok(Entry {
                addrs,
                ..known.clone()
            });
        }
        if let Some(p) = self.peers.iter().find(|p| p.name == spec) {
            return Ok(p.clone());
        }
        if let Ok(id) = NodeId::try_from(spec)
            && let Some(p) = self.peers.iter().find(|p| p.node_id == id)
        {
            return Ok(p.clone());
        }
        Err(self.unknown(spec))
    }

    /// The node cluster and config commands go to: `spec`, or the one node
    /// in the book that is nobody's child.
    pub(crate) fn target(&self, spec: Option<&str>) -> Result<Entry, Failure> {
        if let Some(spec) = spec {
            return self.resolve(spec);
        }
        let mut roots = self.peers.iter().filter(|p| p.parent.is_none());
        match (roots.next(), roots.next()) {
            (Some(p), None) => Ok(p.clone()),
            (None, _) => Err(Failure::usage(
                "no node is bound yet: run `capwire ctl bind INVITE` first",
            )),
            (Some(_), Some(_)) => Err(Failure::usage(format!(
                "several nodes are bound ({}); say which with --peer NAME",
                self.names()
            ))),
        }
    }

    /// The name a key has here, or its short form.
    pub(crate) fn name_of(&self, id: &NodeId) -> String {
        self.peers
            .iter()
            .find(|p| &p.node_id == id)
            .map_or_else(|| short(id), |p| p.name.clone())
    }

    fn names(&self) -> String {
        self.peers
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn unknown(&self, spec: &str) -> Failure {
        if self.peers.is_empty() {
            Failure::usage(format!(
                "unknown peer {spec:?}: no node is bound yet (`capwire ctl bind INVITE`)"
            ))
        } else {
            Failure::usage(format!(
                "unknown peer {spec:?}; known: {} (or give an invite)",
                self.names()
            ))
        }
    }
}

/// The first 12 hex digits of a key.
pub(crate) fn short(id: &NodeId) -> String {
    id.to_string().chars().take(12).collect()
}
