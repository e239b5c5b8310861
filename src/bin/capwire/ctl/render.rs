//! Records as text for people (or, with `--json`, as they are).

use std::fmt::Write as _;

use serde_json::Value as Json;
use tokio::io::AsyncWriteExt;

/// Prints records on stdout. Writing waits without holding up the
/// runtime, so a reader that does not keep up (a pipe into a slow
/// program) slows the command down, and Ctrl-C is still heard meanwhile.
/// Lines are buffered until [`Printer::flush`], which the caller does
/// whenever no record waits, so a record is never held back while the
/// next is awaited. A line cut short by a print that was dropped is
/// completed by the next print (or flush): every line stays whole.
pub(crate) struct Printer {
    out: tokio::io::BufWriter<tokio::io::Stdout>,
    json: bool,
    /// The line being written, and how much of it is.
    line: Vec<u8>,
    written: usize,
    /// Stream items printed (or being printed).
    items: u64,
    /// The task being followed: its node, how to name that node, its id
    /// and the seq of the next
    /// event (from the `submitted` and `event` records printed).
    following: Option<(Json, Json, Json, u64)>,
}

impl Printer {
    /// A printer of `--json` records (`json`) or of text for people.
    pub(crate) fn new(json: bool) -> Printer {
        Printer {
            out: tokio::io::BufWriter::new(tokio::io::stdout()),
            json,
            line: Vec::new(),
            written: 0,
            items: 0,
            following: None,
        }
    }

    /// The task whose events it printed (or whose id, when none yet), as
    /// the record `detached` that says where to pick up: for a command
    /// that follows a task and is interrupted.
    pub(crate) fn detached(&self) -> Option<Json> {
        let (peer, via, task, from) = self.following.as_ref()?;
        Some(serde_json::json!({
            "kind": "detached", "peer": peer, "via": via, "task": task, "from": from,
        }))
    }

    /// How many `item` records it printed.
    pub(crate) fn items(&self) -> u64 {
        self.items
    }

    /// Prints one record (nothing for a record that has no text), to the
    /// buffer: [`Printer::flush`] sends it on.
    ///
    /// # Errors
    /// Stdout cannot be written (a closed pipe, say).
    ///
    /// # Cancel safety
    /// Dropped while it waits, the rest of its line is written by the
    /// next call (or by [`Printer::flush`]): a line is never left cut.
    pub(crate) async fn print(&mut self, record: &Json) -> std::io::Result<()> {
        self.finish_line().await?;
        let text = if self.json {
            record.to_string()
        } else {
            human(record).trim_end_matches('\n').to_owned()
        };
        if text.is_empty() {
            return Ok(());
        }
        if record["kind"] == "item" {
            self.items += 1;
        }
        if record["kind"] == "submitted" {
            self.following = Some((
                record["peer"].clone(),
                record["via"].clone(),
                record["task"].clone(),
                1,
            ));
        }
        if record["kind"] == "event" {
            let next = record["seq"].as_u64().unwrap_or(0) + 1;
            self.following = Some((
                record["peer"].clone(),
                record["via"].clone(),
                record["task"].clone(),
                next,
            ));
        }
        self.line = text.into_bytes();
        self.line.push(b'\n');
        self.written = 0;
        self.finish_line().await
    }

    /// Writes what is left of the last line, and everything buffered.
    ///
    /// # Errors
    /// As [`Printer::print`].
    pub(crate) async fn flush(&mut self) -> std::io::Result<()> {
        self.finish_line().await?;
        self.out.flush().await
    }

    async fn finish_line(&mut self) -> std::io::Result<()> {
        while self.written < self.line.len() {
            let n = self.out.write(&self.line[self.written..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.written += n;
        }
        self.line.clear();
        self.written = 0;
        Ok(())
    }
}

fn s<'a>(v: &'a Json, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// A JSON value on one line, strings without quotes.
pub(crate) fn value_line(v: &Json) -> String {
    match v {
        Json::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// `HH:MM:SS.mmm` (UTC) of milliseconds since the Unix epoch.
pub(crate) fn clock(at_ms: u64) -> String {
    let day_ms = at_ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// One monitoring copy on one line.
pub(crate) fn copy_line(r: &Json) -> String {
    let arrow = if s(r, "dir") == "in" { "<-" } else { "->" };
    let mut line = format!(
        "{} {:<10} #{:<5} {arrow} {:<12} {}/{}",
        clock(r["at_ms"].as_u64().unwrap_or(0)),
        s(r, "from"),
        r["seq"].as_u64().unwrap_or(0),
        s(r, "peer"),
        s(r, "cap"),
        s(r, "verb"),
    );
    let req = s(r, "req_id");
    if req.is_empty() {
        line.push_str(" (notify)");
    } else {
        let _ = write!(line, " req={req}");
    }
    if r["truncated"].as_bool() == Some(true) {
        let _ = write!(line, " body: {} bytes, not copied", r["body_len"]);
    } else {
        let body = value_line(&r["body"]);
        let body: String = body.chars().take(60).collect();
        let _ = write!(line, " {body}");
    }
    if let Some(trace) = r["trace"].as_str() {
        let _ = write!(line, " trace={trace}");
    }
    let dropped = r["dropped"].as_u64().unwrap_or(0);
    if dropped > 0 {
        let _ = write!(line, "  ({dropped} copies dropped before this one)");
    }
    line
}

/// What became of a call this control plane made: `ok`, `denied: CODE`
/// or `failed: CODE`.
pub(crate) fn call_outcome(r: &Json) -> String {
    if r["ok"].as_bool() == Some(true) {
        "ok".to_owned()
    } else if r["denied"].as_bool() == Some(true) {
        format!("denied: {}", s(r, "error"))
    } else {
        format!("failed: {}", s(r, "error"))
    }
}

/// One call this control plane made, on one line.
pub(crate) fn call_line(r: &Json) -> String {
    format!(
        "{} call -> {:<12} {}/{}{} {}",
        clock(r["at_ms"].as_u64().unwrap_or(0)),
        s(r, "peer"),
        s(r, "cap"),
        s(r, "verb"),
        if r["notify"].as_bool() == Some(true) {
            " (notify)".to_owned()
        } else if r["stream"].as_bool() == Some(true) {
            format!(" (stream, {} items)", r["items"].as_u64().unwrap_or(0))
        } else {
            String::new()
        },
        call_outcome(r)
    )
}

fn member_line(m: &Json) -> String {
    format!(
        "{:<10} {:<12} {:<9} monitoring={:<8} {}",
        s(m, "cid"),
        s(m, "name"),
        s(m, "status"),
        s(m, "monitoring"),
        m["caps"]
            .as_array()
            .map(|c| c.iter().map(value_line).collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    )
}

/// The text of one record.
pub(crate) fn human(r: &Json) -> String {
    let mut out = String::new();
    match s(r, "kind") {
        "result" => out = pretty(&r["value"]),
        // A stream's items, a line of JSON each; its end is the exit code
        // (and an error's line on stderr).
        "item" => out = r["item"].to_string(),
        "end" | "error" | "cancelled" => {}
        "sent" => {
            out = format!(
                "sent {}/{} to {} (fire-and-forget: no answer)",
                s(r, "cap"),
                s(r, "verb"),
                s(r, "peer")
            );
        }
        "done" => out = s(r, "message").to_owned(),
        "trace" => out = format!("trace {}", s(r, "trace_id")),
        // The token alone, so that `TOKEN=$(capwire ctl grant ...)` works.
        "grant" => out = s(r, "token").to_owned(),
        "identity" => {
            out = format!(
                "node_id {}\ngrant_key {}",
                s(r, "node_id"),
                s(r, "grant_key")
            );
        }
        "bound" => {
            let _ = writeln!(out, "bound {} ({})", s(r, "name"), s(r, "node_id"));
            let m = &r["manifest"];
            let _ = writeln!(
                out,
                "  app {}, monitoring {}, {} capabilities",
                s(m, "app_id"),
                s(m, "monitoring"),
                m["capabilities"].as_array().map_or(0, Vec::len)
            );
            let _ = writeln!(
                out,
                "  roster version {}, {} members; config version {}",
                r["version"],
                r["members"].as_array().map_or(0, Vec::len),
                r["config"]["version"]
            );
        }
        "peers" => {
            let peers = r["peers"].as_array().cloned().unwrap_or_default();
            if peers.is_empty() {
                out = "no nodes yet: bind one with `capwire ctl bind INVITE`".into();
            }
            for p in &peers {
                let parent = match (p["parent"].as_str(), p["cid"].as_str()) {
                    (Some(parent), Some(cid)) => format!("  child {cid} of {parent}"),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    "{:<16} {}  {}{parent}",
                    s(p, "name"),
                    short(s(p, "node_id")),
                    p["addrs"]
                        .as_array()
                        .map(|a| a.iter().map(value_line).collect::<Vec<_>>().join(","))
                        .unwrap_or_default(),
                );
            }
        }
        "manifest" => {
            let _ = writeln!(
                out,
                "{} ({}) app {} epoch {} monitoring {}",
                s(r, "name"),
                s(r, "node_id"),
                s(r, "app_id"),
                r["epoch"],
                s(r, "monitoring")
            );
            for c in r["capabilities"].as_array().into_iter().flatten() {
                let _ = writeln!(out, "  {} {}", s(c, "id"), s(c, "version"));
                for v in c["verbs"].as_array().into_iter().flatten() {
                    let _ = writeln!(
                        out,
                        "    {:<16} {:<12} {}",
                        s(v, "name"),
                        s(v, "kind"),
                        s(v, "class")
                    );
                }
            }
        }
        // The card itself, as a person would save it.
        "card" => {
            out = serde_json::to_string_pretty(&r["card"]).unwrap_or_default();
        }
        "status" => {
            let v = &r["value"];
            out = format!(
                "{}: monitoring {}; {}; {} copies made",
                s(r, "peer"),
                s(v, "monitoring"),
                if v["you_are_controller"].as_bool() == Some(true) {
                    "this control plane is its controller"
                } else {
                    "this control plane is not its controller"
                },
                v["copy_seq"]
            );
        }
        "config" => {
            let v = &r["value"];
            out = format!("version {}: {}", v["version"], value_line(&v["value"]));
        }
        "config_set" => out = format!("configuration now at version {}", r["value"]["version"]),
        "member" => out = member_line(&r["value"]),
        "contact" => out = s(&r["value"], "invite").to_owned(),
        "roster" => {
            let members = r["members"].as_array().cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "roster of {} version {}: {} members",
                s(r, "peer"),
                r["version"],
                members.len()
            );
            for m in &members {
                let _ = writeln!(out, "  {}", member_line(m));
            }
        }
        "copy" => out = copy_line(r),
        "call" => out = call_line(r),
        "submitted" => {
            out = format!(
                "task {} on {} ({}/{}): {}",
                s(r, "task"),
                s(r, "peer"),
                s(r, "cap"),
                s(r, "verb"),
                s(r, "state")
            );
        }
        "event" => out = event_line(r),
        "waiting" => {
            out = format!(
                "      waits for an answer: capwire ctl tasks {} respond {} JSON",
                s(r, "via"),
                s(r, "task")
            );
        }
        "ended" => {
            out = format!(
                "task {} had ended ({}, last event #{}) before event #{}",
                s(r, "task"),
                s(r, "state"),
                r["seq"],
                r["from"]
            );
        }
        "detached" => {
            out = format!(
                "stopped following task {} (it goes on at the node): capwire ctl tasks {} watch \
                 {} --from {}",
                s(r, "task"),
                s(r, "via"),
                s(r, "task"),
                r["from"]
            );
        }
        "task" => out = task_text(s(r, "peer"), s(r, "via"), &r["value"]),
        "tasks" => out = tasks_text(r),
        "task_changed" => {
            out = format!(
                "{} {:<10} task {} {}/{} -> {} (event #{}, submitted by {})",
                clock(r["at_ms"].as_u64().unwrap_or(0)),
                s(r, "from"),
                s(r, "task"),
                s(r, "cap"),
                s(r, "verb"),
                s(r, "state"),
                r["seq"],
                s(r, "submitter")
            );
            let dropped = r["dropped"].as_u64().unwrap_or(0);
            if dropped > 0 {
                let _ = write!(out, "  ({dropped} changes dropped before this one)");
            }
        }
        "connected" => out = format!("connected to {}", s(r, "peer")),
        "disconnected" => out = format!("lost the session with {} (retrying)", s(r, "peer")),
        "lagged" => out = format!("missed {} pushes (this terminal was too slow)", r["missed"]),
        _ => out = r.to_string(),
    }
    out
}

/// One task event on one line: `#SEQ TIME STATE KIND BODY`.
fn event_line(r: &Json) -> String {
    let mut line = format!(
        "#{:<4} {} {:<14} {:<8}",
        r["seq"].as_u64().unwrap_or(0),
        clock(r["at_ms"].as_u64().unwrap_or(0)),
        s(r, "state"),
        s(r, "event"),
    );
    let body = &r["body"];
    if s(r, "event") == "error" {
        let _ = write!(line, " {}: {}", s(body, "code"), s(body, "message"));
    } else if !body.is_null() {
        let _ = write!(line, " {}", value_line(body));
    }
    line.trim_end().to_owned()
}

/// One task's info, a few lines.
fn task_text(peer: &str, via: &str, v: &Json) -> String {
    let mut out = format!(
        "task {} on {peer} ({}/{}): {}\n",
        s(v, "task"),
        s(v, "cap"),
        s(v, "verb"),
        s(v, "state")
    );
    let _ = writeln!(
        out,
        "  submitted {}, last event #{} at {} (events #{} to #{} kept)",
        clock(v["created_ms"].as_u64().unwrap_or(0)),
        v["seq"],
        clock(v["updated_ms"].as_u64().unwrap_or(0)),
        v["first_seq"],
        v["seq"]
    );
    if !v["progress"].is_null() {
        let _ = writeln!(out, "  progress {}", value_line(&v["progress"]));
    }
    if let Some(seq) = v["question_seq"].as_u64() {
        let _ = writeln!(
            out,
            "  question (event #{seq}) {}\n  answer it: capwire ctl tasks {via} respond {} JSON",
            value_line(&v["question"]),
            s(v, "task")
        );
    }
    if s(v, "state") == "completed" {
        let _ = writeln!(out, "  result {}", value_line(&v["result"]));
    }
    if v["error"].is_object() {
        let e = &v["error"];
        let _ = writeln!(out, "  error {}: {}", s(e, "code"), s(e, "message"));
    }
    out
}

/// A page of `tasks list`: a line per task, newest first.
fn tasks_text(r: &Json) -> String {
    let tasks = r["tasks"].as_array().cloned().unwrap_or_default();
    if tasks.is_empty() {
        return format!(
            "no tasks on {} that this control plane may see",
            s(r, "peer")
        );
    }
    let mut out = format!(
        "{:<32}  {:<14} {:<24} {:>6}  {}\n",
        "TASK", "STATE", "CAP/VERB", "EVENTS", "UPDATED"
    );
    for t in &tasks {
        let _ = writeln!(
            out,
            "{:<32}  {:<14} {:<24} {:>6}  {}",
            s(t, "task"),
            s(t, "state"),
            format!("{}/{}", s(t, "cap"), s(t, "verb")),
            t["seq"].as_u64().unwrap_or(0),
            clock(t["updated_ms"].as_u64().unwrap_or(0))
        );
    }
    if let Some(next) = r["next"].as_str() {
        let _ = writeln!(out, "more: the same list with --before {next}");
    }
    out
}

fn pretty(v: &Json) -> String {
    match v {
        Json::String(text) => text.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string()),
    }
}
