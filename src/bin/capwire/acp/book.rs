//! The sessions of `capwire acp`, kept in the control plane's state
//! directory (`acp-sessions.json`) so that `session/load` finds a session
//! after the face, or the editor, started again: each session's node,
//! verb and the tasks its prompts submitted, in order. Bounded: the
//! newest [`MAX_SESSIONS`] sessions, the newest [`MAX_TASKS`] tasks of
//! each. Written whole to a temporary file and renamed over the old one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Sessions kept.
pub(crate) const MAX_SESSIONS: usize = 1000;
/// Tasks kept per session.
pub(crate) const MAX_TASKS: usize = 200;

/// One session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The node's key.
    pub(crate) node: String,
    /// `CAP/VERB`.
    pub(crate) verb: String,
    /// Its tasks, oldest first.
    pub(crate) tasks: Vec<String>,
    /// When it was last used (ms since the Unix epoch): the oldest go
    /// first.
    pub(crate) used_ms: u64,
}

/// The file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    sessions: BTreeMap<String, Entry>,
}

/// Where the sessions are kept.
#[derive(Debug, Clone)]
pub(crate) struct Book {
    path: PathBuf,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Book {
    pub(crate) fn in_dir(dir: &Path) -> Book {
        Book {
            path: dir.join("acp-sessions.json"),
        }
    }

    /// What the file holds (nothing when it is missing or unreadable: a
    /// damaged book loses its sessions, not the face).
    fn read(&self) -> File {
        std::fs::read(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The session `id`, if kept.
    pub(crate) fn get(&self, id: &str) -> Option<Entry> {
        self.read().sessions.remove(id)
    }

    /// Keeps `entry` as session `id` (read again first, so that another
    /// face's sessions stay), within the bounds.
    pub(crate) fn put(&self, id: &str, mut entry: Entry) -> std::io::Result<()> {
        let mut file = self.read();
        if entry.tasks.len() > MAX_TASKS {
            entry.tasks.drain(..entry.tasks.len() - MAX_TASKS);
        }
        entry.used_ms = now_ms();
        file.sessions.insert(id.to_owned(), entry);
        while file.sessions.len() > MAX_SESSIONS {
            let oldest = file
                .sessions
                .iter()
                .min_by_key(|(_, e)| e.used_ms)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => file.sessions.remove(&k),
                None => break,
            };
        }
        let text = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, &text)?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_kept_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let book = Book::in_dir(dir.path());
        assert_eq!(book.get("s"), None);
        let entry = Entry {
            node: "n".into(),
            verb: "app.agent/work".into(),
            tasks: (0..MAX_TASKS + 5).map(|i| i.to_string()).collect(),
            used_ms: 0,
        };
        book.put("s", entry).unwrap();
        let got = book.get("s").unwrap();
        assert_eq!(got.tasks.len(), MAX_TASKS);
        assert_eq!(got.tasks[0], "5");
        // A damaged file is read as empty, and written over.
        std::fs::write(dir.path().join("acp-sessions.json"), b"{oops").unwrap();
        assert_eq!(book.get("s"), None);
        book.put("t", Entry::default()).unwrap();
        assert!(book.get("t").is_some());
    }
}
