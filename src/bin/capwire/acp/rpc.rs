//! JSON-RPC 2.0 as ACP carries it: one message a line on stdin and
//! stdout. Lines are bounded ([`MAX_LINE`]); a line that is too long, not
//! JSON or not a JSON-RPC message is answered with the error JSON-RPC
//! names and the loop goes on. Everything written to stdout goes through
//! one writer ([`Out`]), a whole line at a time, so that nothing but ACP
//! messages ever reaches it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// The longest line read (a message of ACP): 1 MiB. A longer one is
/// skipped to its end and answered `-32600`.
pub(crate) const MAX_LINE: usize = 1024 * 1024;
/// Requests of the client handled at once; one more is answered
/// [`code::BUSY`].
pub(crate) const MAX_CALLS: usize = 64;
/// Requests of this face waiting on the client at once.
const MAX_WAITING: usize = 64;
/// How long a request of this face waits on the client's answer.
pub(crate) const CLIENT_WAIT: Duration = Duration::from_secs(600);

/// JSON-RPC's error codes, and ACP's.
pub(crate) mod code {
    pub(crate) const PARSE: i64 = -32700;
    pub(crate) const INVALID_REQUEST: i64 = -32600;
    pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
    pub(crate) const INVALID_PARAMS: i64 = -32602;
    pub(crate) const INTERNAL: i64 = -32603;
    /// ACP: a session or a resource that does not exist.
    pub(crate) const NOT_FOUND: i64 = -32002;
    /// Too much at once (calls, sessions), or the cluster refused.
    pub(crate) const BUSY: i64 = -32000;
}

/// An error answer.
#[derive(Debug, Clone)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) data: Option<Box<Json>>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(crate) fn with_data(mut self, data: Json) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    fn to_json(&self) -> Json {
        let mut e = json!({ "code": self.code, "message": self.message });
        if let Some(d) = &self.data {
            e["data"] = (**d).clone();
        }
        e
    }
}

/// One line of input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    Text(Vec<u8>),
    /// Over [`MAX_LINE`]: skipped to its end.
    TooLong,
}

/// The next line of `input` (without its end), `None` at its end. Never
/// holds more than [`MAX_LINE`] bytes of one line.
pub(crate) async fn next_line<R: AsyncBufRead + Unpin>(
    input: &mut R,
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = input.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Some(Line::TooLong),
                (false, true) => None,
                (false, false) => Some(Line::Text(line)),
            });
        }
        let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        if !too_long {
            if line.len() + part.len() > max {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(part);
            }
        }
        let used = ended.unwrap_or(chunk.len());
        input.consume(used);
        if ended.is_some() {
            if too_long {
                return Ok(Some(Line::TooLong));
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(Line::Text(line)));
        }
    }
}

/// A message read: what the loop does with it.
#[derive(Debug)]
pub(crate) enum Message {
    Request {
        id: Json,
        method: String,
        params: Json,
    },
    Notification {
        method: String,
        params: Json,
    },
    Response {
        id: Json,
        result: Result<Json, RpcError>,
    },
}

/// `line` as a message, or the error to answer it with (and the id to
/// answer, `null` when none can be told).
pub(crate) fn parse(line: &[u8]) -> Result<Message, (Json, RpcError)> {
    let value: Json = serde_json::from_slice(line).map_err(|e| {
        (
            Json::Null,
            RpcError::new(code::PARSE, format!("not JSON: {e}")),
        )
    })?;
    let Json::Object(mut m) = value else {
        return Err((
            Json::Null,
            RpcError::new(code::INVALID_REQUEST, "a message is a JSON object"),
        ));
    };
    let id = m.remove("id");
    let id_ok = |id: &Json| matches!(id, Json::String(_) | Json::Number(_) | Json::Null);
    if let Some(id) = &id
        && !id_ok(id)
    {
        return Err((
            Json::Null,
            RpcError::new(code::INVALID_REQUEST, "an id is a string or a number"),
        ));
    }
    if m.get("jsonrpc") != Some(&json!("2.0")) {
        return Err((
            id.unwrap_or(Json::Null),
            RpcError::new(code::INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\""),
        ));
    }
    if let Some(method) = m.remove("method") {
        let Json::String(method) = method else {
            return Err((
                id.unwrap_or(Json::Null),
                RpcError::new(code::INVALID_REQUEST, "a method is a string"),
            ));
        };
        let params = m.remove("params").unwrap_or(Json::Null);
        return Ok(match id {
            Some(id) => Message::Request { id, method, params },
            None => Message::Notification { method, params },
        });
    }
    let Some(id) = id else {
        return Err((
            Json::Null,
            RpcError::new(code::INVALID_REQUEST, "neither a request nor a response"),
        ));
    };
    let result = match (m.remove("result"), m.remove("error")) {
        (Some(r), None) => Ok(r),
        (None, Some(e)) => Err(RpcError {
            code: e
                .get("code")
                .and_then(Json::as_i64)
                .unwrap_or(code::INTERNAL),
            message: e
                .get("message")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned(),
            data: e.get("data").cloned().map(Box::new),
        }),
        _ => {
            return Err((
                Json::Null,
                RpcError::new(code::INVALID_REQUEST, "a response has a result or an error"),
            ));
        }
    };
    Ok(Message::Response { id, result })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The one way to stdout: whole lines, in order, and the requests of
/// this face waiting on their answers.
pub(crate) struct Out {
    lines: mpsc::Sender<String>,
    waiting: Mutex<HashMap<i64, oneshot::Sender<Result<Json, RpcError>>>>,
    next_id: AtomicI64,
}

impl Out {
    /// An `Out` and the writer that drains it into `output` until every
    /// sender is gone.
    pub(crate) fn new<W: AsyncWrite + Unpin + Send + 'static>(
        mut output: W,
    ) -> (Arc<Out>, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<String>(256);
        let writer = tokio::spawn(async move {
            while let Some(mut line) = rx.recv().await {
                line.push('\n');
                if output.write_all(line.as_bytes()).await.is_err() || output.flush().await.is_err()
                {
                    // The client is gone: nothing more can be said.
                    return;
                }
            }
        });
        let out = Arc::new(Out {
            lines: tx,
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(0),
        });
        (out, writer)
    }

    async fn send(&self, message: &Json) {
        // A message is one line: serde_json writes no raw newline.
        let _ = self.lines.send(message.to_string()).await;
    }

    /// Answers request `id`.
    pub(crate) async fn respond(&self, id: Json, result: Result<Json, RpcError>) {
        let message = match result {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err(e) => json!({ "jsonrpc": "2.0", "id": id, "error": e.to_json() }),
        };
        self.send(&message).await;
    }

    /// Sends a notification.
    pub(crate) async fn notify(&self, method: &str, params: Json) {
        debug_assert!(
            super::table::outbound(method)
                .is_some_and(|r| r.kind == super::table::Kind::Notification),
            "{method}"
        );
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
            .await;
    }

    /// Sends a request and waits for its answer ([`CLIENT_WAIT`] at most).
    pub(crate) async fn request(&self, method: &str, params: Json) -> Result<Json, RpcError> {
        debug_assert!(
            super::table::outbound(method).is_some_and(|r| r.has_result),
            "{method}"
        );
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiting = lock(&self.waiting);
            if waiting.len() >= MAX_WAITING {
                return Err(RpcError::new(
                    code::BUSY,
                    "too many questions wait on the client",
                ));
            }
            waiting.insert(id, tx);
        }
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        let answer = tokio::time::timeout(CLIENT_WAIT, rx).await;
        lock(&self.waiting).remove(&id);
        match answer {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RpcError::new(code::INTERNAL, "the client went")),
            Err(_) => Err(RpcError::new(code::INTERNAL, "the client did not answer")),
        }
    }

    /// Hands a response of the client to the request it answers (one for
    /// no request of this face is dropped).
    pub(crate) fn resolve(&self, id: &Json, result: Result<Json, RpcError>) {
        let Some(id) = id.as_i64() else {
            return;
        };
        if let Some(tx) = lock(&self.waiting).remove(&id) {
            let _ = tx.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut reader = tokio::io::BufReader::with_capacity(7, input);
        let mut all = Vec::new();
        while let Some(line) = next_line(&mut reader, max).await.unwrap() {
            all.push(line);
        }
        all
    }

    #[tokio::test]
    async fn lines_are_cut_at_newlines_and_bounded() {
        let got = lines(b"{\"a\":1}\nxxxxxxxxxxxxxxxxxxxxxxxx\r\n\nend", 10).await;
        assert_eq!(
            got,
            vec![
                Line::Text(b"{\"a\":1}".to_vec()),
                Line::TooLong,
                Line::Text(Vec::new()),
                Line::Text(b"end".to_vec()),
            ]
        );
        assert_eq!(lines(b"0123456789abc", 10).await, vec![Line::TooLong]);
    }

    #[test]
    fn messages_are_told_apart_and_bad_ones_named() {
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#),
            Ok(Message::Request { .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","method":"session/cancel"}"#),
            Ok(Message::Notification { .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            Ok(Message::Response { result: Ok(_), .. })
        ));
        let code_of = |text: &[u8]| parse(text).unwrap_err().1.code;
        assert_eq!(code_of(b"{not json"), code::PARSE);
        assert_eq!(code_of(b"[1,2]"), code::INVALID_REQUEST);
        assert_eq!(code_of(br#"{"id":1,"method":"x"}"#), code::INVALID_REQUEST);
        assert_eq!(
            code_of(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
            code::INVALID_REQUEST
        );
        assert_eq!(
            code_of(br#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            code::INVALID_REQUEST
        );
        let (id, e) = parse(br#"{"jsonrpc":"1.0","id":9,"method":"x"}"#).unwrap_err();
        assert_eq!((id, e.code), (json!(9), code::INVALID_REQUEST));
    }
}
