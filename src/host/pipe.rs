//! The pipe protocol's parent side, over any byte pipe: a child process's
//! standard input and output (the process host) or a container's,
//! attached through the engine's API (the container hosts). The protocol itself is described
//! in the process host's documentation; a parent attached to a child
//! that already runs asks it `{"id":N,"op":"ready"}`, answered with the
//! ready line's `node_id`, `addrs` and `caps` in the reply, followed by
//! the child's monitoring state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use capwire_envelope::NodeId;
use capwire_manifest::MonitoringStatus;
use futures_util::{Stream, StreamExt};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::codec::LinesCodecError;
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::host::{ChildInfo, HostError, HostEvent};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn failed(e: impl std::fmt::Display) -> HostError {
    HostError::Failed(e.to_string())
}

/// Longest line, either way, its newline not counted.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Where requests to the child are written.
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// What a child reports of its monitoring: a state (the newest wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watched {
    pub(crate) status: MonitoringStatus,
    pub(crate) controller: Option<NodeId>,
}

/// The state a child starts with, as far as the host knows.
pub(crate) const UNWATCHED: Watched = Watched {
    status: MonitoringStatus::Off,
    controller: None,
};

/// The requests waiting for their reply, by id; `None` once the child is
/// gone.
type Replies = Option<HashMap<u64, oneshot::Sender<Value>>>;

/// A running child on the other end of a pipe (the pipe itself is its
/// supervisor's).
pub(crate) struct Proc {
    pub(crate) info: ChildInfo,
    pub(crate) stdin: tokio::sync::Mutex<Option<Writer>>,
    pub(crate) replies: Mutex<Replies>,
    next: AtomicU64,
    /// Set when the parent stops it (its exit is then no event).
    pub(crate) stopping: AtomicBool,
    /// Cancelled to have the supervisor end the child (or the session
    /// with it).
    pub(crate) kill: CancellationToken,
    /// Cancelled by the supervisor once the child (or the session with
    /// it) is gone.
    pub(crate) reaped: CancellationToken,
}

/// A request's entry in the table of waiting replies: it leaves the table
/// when this is dropped, whatever ended the wait (the reply, the caller's
/// timeout, a dropped future, an error writing the request).
struct Waiting<'a> {
    proc: &'a Proc,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(waiting) = lock(&self.proc.replies).as_mut() {
            waiting.remove(&self.id);
        }
    }
}

impl Proc {
    pub(crate) fn new(info: ChildInfo, stdin: Option<Writer>) -> Self {
        Self {
            info,
            stdin: tokio::sync::Mutex::new(stdin),
            replies: Mutex::new(Some(HashMap::new())),
            next: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            kill: CancellationToken::new(),
            reaped: CancellationToken::new(),
        }
    }

    /// Enters request `id` in the table of waiting replies.
    fn wait_for(&self, id: u64) -> Result<(Waiting<'_>, oneshot::Receiver<Value>), HostError> {
        let (tx, rx) = oneshot::channel();
        lock(&self.replies)
            .as_mut()
            .ok_or_else(|| failed("the child exited"))?
            .insert(id, tx);
        Ok((Waiting { proc: self, id }, rx))
    }

    /// Hands a reply to its request, if it still waits.
    pub(crate) fn reply(&self, id: u64, reply: Value) {
        let waiter = lock(&self.replies).as_mut().and_then(|w| w.remove(&id));
        if let Some(tx) = waiter {
            let _ = tx.send(reply);
        }
    }

    /// The child is gone: every waiting request fails, and new ones do.
    pub(crate) fn gone(&self) {
        lock(&self.replies).take();
    }

    /// Sends `request` (an object without its `id`) and waits for its
    /// reply; a reply with `ok` false is a failure with its `error`.
    pub(crate) async fn ask(&self, mut request: Value) -> Result<Value, HostError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        request["id"] = json!(id);
        let mut line = request.to_string();
        if line.len() > MAX_LINE {
            return Err(failed("the request is longer than a pipe line may be"));
        }
        line.push('\n');
        let (_waiting, reply) = self.wait_for(id)?;
        {
            let mut stdin = self.stdin.lock().await;
            let Some(stdin) = stdin.as_mut() else {
                return Err(failed("the child is stopping"));
            };
            stdin.write_all(line.as_bytes()).await.map_err(failed)?;
            stdin.flush().await.map_err(failed)?;
        }
        let reply = reply.await.map_err(|_| failed("the child exited"))?;
        if reply["ok"] == true {
            Ok(reply)
        } else {
            Err(failed(reply["error"].as_str().unwrap_or("refused")))
        }
    }
}

/// The detail of a breach.
pub(crate) fn broke(why: &str) -> String {
    format!("the child broke the pipe protocol: {why}")
}

/// What a failed read of a line says of the child: `Some` for a breach
/// (an over-long line, bytes that are not UTF-8), `None` for a failed
/// pipe.
pub(crate) fn read_error(e: &LinesCodecError) -> Option<String> {
    match e {
        LinesCodecError::MaxLineLengthExceeded => Some(format!("a line over {MAX_LINE} bytes")),
        LinesCodecError::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Some("output that is not UTF-8".to_owned())
        }
        LinesCodecError::Io(_) => None,
    }
}

/// The child's key, addresses and capabilities, as a ready line or the
/// reply to `ready` carries them.
pub(crate) fn info_of(v: &Value) -> Option<ChildInfo> {
    let node_id = v["node_id"]
        .as_str()
        .and_then(|s| NodeId::try_from(s).ok())?;
    let addrs = v["addrs"]
        .as_array()?
        .iter()
        .map(|a| a.as_str().and_then(|s| s.parse::<Addr>().ok()))
        .collect::<Option<_>>()?;
    let caps = v["caps"]
        .as_array()?
        .iter()
        .map(|c| c.as_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    Some(ChildInfo {
        node_id,
        addrs,
        caps,
    })
}

pub(crate) fn parse_ready(line: &str) -> Result<ChildInfo, String> {
    let bad = || broke(&format!("a first line that is not a ready line: {line}"));
    let v: Value = serde_json::from_str(line).map_err(|_| bad())?;
    if v["event"] != "ready" {
        return Err(bad());
    }
    info_of(&v).ok_or_else(bad)
}

/// What one line from a ready child says.
#[derive(Debug, PartialEq)]
pub(crate) enum Said {
    /// The reply to request `id`.
    Reply(u64, Value),
    /// Its monitoring state now.
    Monitoring(Watched),
    /// An event this host does not know.
    Other,
}

/// Reads one line from a ready child; `Err` says how it breaks the
/// protocol.
pub(crate) fn parse_line(line: &str) -> Result<Said, &'static str> {
    let v: Value = serde_json::from_str(line).map_err(|_| "a line that is not JSON")?;
    let Value::Object(obj) = v else {
        return Err("a line that is not a JSON object");
    };
    if let Some(id) = obj.get("reply") {
        let id = id.as_u64().ok_or("a reply whose id is not a number")?;
        if !obj.get("ok").is_some_and(Value::is_boolean) {
            return Err("a reply without a boolean ok");
        }
        return Ok(Said::Reply(id, Value::Object(obj)));
    }
    match obj.get("event").map(Value::as_str) {
        Some(Some("monitoring")) => parse_monitoring(&obj).map(Said::Monitoring),
        Some(Some(_)) => Ok(Said::Other),
        _ => Err("a line that is neither a reply nor an event"),
    }
}

fn parse_monitoring(event: &Map<String, Value>) -> Result<Watched, &'static str> {
    let status = match event.get("status").and_then(Value::as_str) {
        Some("off") => MonitoringStatus::Off,
        Some("pending") => MonitoringStatus::Pending,
        Some("on") => MonitoringStatus::On,
        _ => return Err("a monitoring status other than off, pending or on"),
    };
    let controller = match event.get("controller") {
        Some(Value::Null) => None,
        Some(Value::String(key)) => Some(
            NodeId::try_from(key.as_str())
                .map_err(|_| "a monitoring controller that is not a key")?,
        ),
        _ => return Err("a monitoring event without a controller key or null"),
    };
    Ok(Watched { status, controller })
}

/// Hands each new monitoring state of the child to the parent.
pub(crate) async fn forward(
    mut state: watch::Receiver<Watched>,
    cid: String,
    events: mpsc::Sender<HostEvent>,
) {
    // The first state (`UNWATCHED`) counts as seen: only changes go out.
    while state.changed().await.is_ok() {
        let Watched { status, controller } = *state.borrow_and_update();
        let event = HostEvent::Monitoring {
            cid: cid.clone(),
            status,
            controller,
        };
        if events.send(event).await.is_err() {
            return;
        }
    }
}

/// Why a child's output lines ended.
pub(crate) enum LinesEnd {
    /// The output closed (or failed).
    Closed,
    /// The child broke the pipe protocol, as said.
    Broke(String),
}

/// Handles the child's output lines until they end or break the protocol:
/// replies to their waiters, monitoring states into `state`.
///
/// # Cancel safety
/// Cancel safe: a line is handled whole or not taken.
pub(crate) async fn read_lines<S>(
    proc: &Proc,
    lines: &mut S,
    state: &watch::Sender<Watched>,
) -> LinesEnd
where
    S: Stream<Item = Result<String, LinesCodecError>> + Unpin,
{
    loop {
        let line = match lines.next().await {
            None => return LinesEnd::Closed,
            Some(Ok(line)) => line,
            Some(Err(e)) => {
                return match read_error(&e) {
                    Some(why) => LinesEnd::Broke(why),
                    None => LinesEnd::Closed,
                };
            }
        };
        match parse_line(&line) {
            Ok(Said::Reply(id, reply)) => proc.reply(id, reply),
            Ok(Said::Monitoring(now)) => {
                state.send_if_modified(|s| {
                    let changed = *s != now;
                    *s = now;
                    changed
                });
            }
            Ok(Said::Other) => {}
            Err(why) => return LinesEnd::Broke(why.to_owned()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const KEY: &str = "1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn lines_from_a_ready_child() {
        let key = NodeId::try_from(KEY).unwrap();
        let on = |controller| Watched {
            status: MonitoringStatus::On,
            controller,
        };
        let ok: &[(&str, Said)] = &[
            (
                r#"{"event":"monitoring","status":"on","controller":"1111111111111111111111111111111111111111111111111111111111111111"}"#,
                Said::Monitoring(on(Some(key))),
            ),
            (
                r#"{"event":"monitoring","status":"on","controller":null}"#,
                Said::Monitoring(on(None)),
            ),
            (
                r#"{"event":"monitoring","status":"pending","controller":null}"#,
                Said::Monitoring(Watched {
                    status: MonitoringStatus::Pending,
                    controller: None,
                }),
            ),
            (
                r#"{"reply":7,"ok":true}"#,
                Said::Reply(7, json!({"reply": 7, "ok": true})),
            ),
            (r#"{"event":"later","x":1}"#, Said::Other),
        ];
        for (line, said) in ok {
            assert_eq!(parse_line(line).as_ref(), Ok(said), "{line}");
        }
        let broken = [
            "",
            "not json",
            "[1,2]",
            "\"text\"",
            "{}",
            r#"{"event":7}"#,
            r#"{"reply":"7","ok":true}"#,
            r#"{"reply":-1,"ok":true}"#,
            r#"{"reply":7}"#,
            r#"{"reply":7,"ok":"yes"}"#,
            r#"{"event":"monitoring","status":"on"}"#,
            r#"{"event":"monitoring","status":"ON","controller":null}"#,
            r#"{"event":"monitoring","controller":null}"#,
            r#"{"event":"monitoring","status":"on","controller":7}"#,
            r#"{"event":"monitoring","status":"on","controller":"11"}"#,
            r#"{"event":"monitoring","status":"on","controller":"1111111111111111111111111111111111111111111111111111111111111ABC"}"#,
        ];
        for line in broken {
            assert!(parse_line(line).is_err(), "{line}");
        }
    }

    #[test]
    fn the_first_line_must_be_a_ready_line() {
        let good = format!(
            r#"{{"event":"ready","node_id":"{KEY}","addrs":["tcp://127.0.0.1:9"],"caps":["app.x@1.0.0"]}}"#
        );
        let info = parse_ready(&good).unwrap();
        assert_eq!(info.addrs.len(), 1);
        assert_eq!(info.caps, ["app.x@1.0.0"]);
        for bad in [
            "hello".to_owned(),
            r#"{"event":"monitoring","status":"off","controller":null}"#.to_owned(),
            format!(r#"{{"event":"ready","node_id":"{KEY}","addrs":["nowhere"],"caps":[]}}"#),
            r#"{"event":"ready","node_id":"11","addrs":[],"caps":[]}"#.to_owned(),
        ] {
            let e = parse_ready(&bad).unwrap_err();
            assert!(e.contains("pipe protocol"), "{e}");
        }
    }
}
