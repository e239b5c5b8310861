//! The sessions of `capwire acp`, kept in the control plane's state
//! directory (`acp-sessions.json`) so that `session/load` finds a session
//! after the face, or the editor, started again: each session's node,
//! verb and the tasks its prompts submitted, in order. Bounded: the
//! newest [`MAX_SESSIONS`] sessions, the newest [`MAX_TASKS`] tasks of
//! each. Replaced whole and durably (a private file, synced and renamed
//! over the old one), under a lock (`acp-sessions.lock`) that faces on
//! the same state directory take in turn, so that none loses another's
//! session.
//!
//! What each prompt asked is kept beside it, one file per session
//! (`acp-sessions/ID.json`: each task's args and the key its prompt's
//! text went under), so that a load replays the user's side of the
//! conversation too. Bounded: the newest prompts within
//! [`MAX_PROMPT_BYTES`] per session; a session's file goes with it.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use capwire::files::{Replace, write_private};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// Sessions kept.
pub(crate) const MAX_SESSIONS: usize = 1000;
/// Tasks kept per session.
pub(crate) const MAX_TASKS: usize = 200;
/// The prompts kept per session, in bytes of their args as JSON: the
/// newest within it (one prompt is at most 64 KiB of text).
pub(crate) const MAX_PROMPT_BYTES: usize = 256 * 1024;

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

/// What one prompt asked: the task's args, and the key its text went
/// under.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Prompt {
    pub(crate) task: String,
    pub(crate) text_field: String,
    pub(crate) args: Json,
}

impl Prompt {
    /// The prompt's text, when its args hold it.
    pub(crate) fn text(&self) -> Option<&str> {
        self.args.get(&self.text_field).and_then(Json::as_str)
    }
}

/// A session's prompts file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Prompts {
    /// Oldest first.
    prompts: Vec<Prompt>,
}

/// Whether `id` is one this face made (`capwire-` and 32 hex digits):
/// only those name a file.
fn is_session_id(id: &str) -> bool {
    id.strip_prefix("capwire-").is_some_and(|hex| {
        hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Writes `value` as JSON over `path`, replaced whole and durably (a
/// private file: [`write_private`]).
fn write_whole<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let text = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::other("a file name that is not text"))?;
    write_private(dir, name, &text, Replace::Always)
}

/// Where the sessions are kept.
#[derive(Debug, Clone)]
pub(crate) struct Book {
    path: PathBuf,
    /// The sessions' prompts files.
    prompts_dir: PathBuf,
    /// Held while the book or a prompts file is read to be written.
    lock_path: PathBuf,
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
            prompts_dir: dir.join("acp-sessions"),
            lock_path: dir.join("acp-sessions.lock"),
        }
    }

    /// Waits for the book's lock (an advisory lock on its own file, let
    /// go when the file is closed: at the latest when the process ends).
    fn locked(&self) -> std::io::Result<std::fs::File> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&self.lock_path)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(file)
    }

    fn prompts_path(&self, id: &str) -> Option<PathBuf> {
        is_session_id(id).then(|| self.prompts_dir.join(format!("{id}.json")))
    }

    /// The prompts kept of session `id`, oldest first (none when its file
    /// is missing or unreadable).
    pub(crate) fn prompts(&self, id: &str) -> Vec<Prompt> {
        self.prompts_path(id)
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<Prompts>(&b).ok())
            .map(|p| p.prompts)
            .unwrap_or_default()
    }

    /// Keeps `prompt` as session `id`'s newest, within
    /// [`MAX_PROMPT_BYTES`] (the oldest go first; a prompt over it alone
    /// is not kept).
    pub(crate) fn put_prompt(&self, id: &str, prompt: Prompt) -> std::io::Result<()> {
        let Some(path) = self.prompts_path(id) else {
            return Ok(());
        };
        let _locked = self.locked()?;
        let mut file = Prompts {
            prompts: self.prompts(id),
        };
        file.prompts.push(prompt);
        let sizes: Vec<usize> = file
            .prompts
            .iter()
            .map(|p| serde_json::to_vec(&p.args).map_or(usize::MAX, |b| b.len()))
            .collect();
        let mut total = 0usize;
        let keep = sizes
            .iter()
            .rev()
            .take_while(|n| {
                total = total.saturating_add(**n);
                total <= MAX_PROMPT_BYTES
            })
            .count()
            .min(MAX_TASKS);
        file.prompts.drain(..file.prompts.len() - keep);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.prompts_dir)?;
        write_whole(&path, &file)
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
        let _locked = self.locked()?;
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
            let Some(k) = oldest else { break };
            file.sessions.remove(&k);
            // Its prompts go with it (a file never written is no error).
            if let Some(p) = self.prompts_path(&k) {
                let _ = std::fs::remove_file(p);
            }
        }
        write_whole(&self.path, &file)
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

    /// Faces on one state directory write the book at once: no session
    /// is lost.
    #[test]
    fn faces_writing_at_once_lose_no_session() {
        let dir = tempfile::tempdir().unwrap();
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let book = Book::in_dir(dir.path());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        book.put(&format!("capwire-{w}-{i}"), Entry::default())
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let book = Book::in_dir(dir.path());
        for w in 0..4 {
            for i in 0..50 {
                assert!(book.get(&format!("capwire-{w}-{i}")).is_some(), "{w}-{i}");
            }
        }
    }

    fn prompt(task: usize, text: &str) -> Prompt {
        Prompt {
            task: task.to_string(),
            text_field: "text".into(),
            args: serde_json::json!({ "text": text, "steps": 1 }),
        }
    }

    #[test]
    fn prompts_are_kept_per_session_within_their_bound() {
        let dir = tempfile::tempdir().unwrap();
        let book = Book::in_dir(dir.path());
        let id = "capwire-0123456789abcdef0123456789abcdef";
        assert!(book.prompts(id).is_empty());
        book.put_prompt(id, prompt(0, "first")).unwrap();
        book.put_prompt(id, prompt(1, "second")).unwrap();
        let kept = book.prompts(id);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].text(), Some("first"));
        assert_eq!(kept[1].task, "1");
        // 64 KiB prompts: the newest four fit in 256 KiB with their
        // args, so the oldest go.
        let big = "x".repeat(60 * 1024);
        for i in 2..10 {
            book.put_prompt(id, prompt(i, &big)).unwrap();
        }
        let kept = book.prompts(id);
        let tasks: Vec<&str> = kept.iter().map(|p| p.task.as_str()).collect();
        assert_eq!(tasks, ["6", "7", "8", "9"]);
        // A name that is not one of the face's ids names no file.
        book.put_prompt("../escape", prompt(0, "no")).unwrap();
        assert!(book.prompts("../escape").is_empty());
        assert!(!dir.path().join("escape.json").exists());
        // A damaged file is read as empty.
        std::fs::write(
            dir.path().join("acp-sessions").join(format!("{id}.json")),
            b"[",
        )
        .unwrap();
        assert!(book.prompts(id).is_empty());
    }

    #[test]
    fn a_session_s_prompts_go_when_the_book_lets_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let book = Book::in_dir(dir.path());
        let old = "capwire-00000000000000000000000000000000";
        book.put(old, Entry::default()).unwrap();
        book.put_prompt(old, prompt(0, "kept until the session goes"))
            .unwrap();
        // Sessions used later push it out of the book.
        std::thread::sleep(std::time::Duration::from_millis(2));
        for i in 0..MAX_SESSIONS {
            book.put(&format!("capwire-{:032x}", i + 1), Entry::default())
                .unwrap();
        }
        assert_eq!(book.get(old), None);
        assert!(book.prompts(old).is_empty());
        assert!(
            !dir.path()
                .join("acp-sessions")
                .join(format!("{old}.json"))
                .exists()
        );
    }
}
