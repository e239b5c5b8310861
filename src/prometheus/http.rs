//! A tiny HTTP/1.1 endpoint for the scraper, on tokio alone. It answers
//! one request per connection and closes it:
//!
//! ```text
//!  GET|HEAD /metrics  ─► 200, the Prometheus text (HEAD: headers only)
//!  other method       ─► 405 (Allow: GET, HEAD)
//!  other path         ─► 404
//!  not HTTP/1.x       ─► 400
//!  head over the size ─► 431      no whole head in time ─► 408
//! ```
//!
//! The scraper is treated as hostile: the request head is bounded in
//! size and must arrive within a deadline, the answer must be taken
//! within another, connections beyond a cap wait in the listen backlog,
//! and nothing a client sends can make it panic or allocate more than
//! the head's bound.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::node::Node;

/// Bounds of the metrics endpoint, per connection and in all.
///
/// ```
/// use std::time::Duration;
/// use capwire::prometheus::ServerLimits;
///
/// let limits = ServerLimits { read_timeout: Duration::from_secs(2), ..ServerLimits::default() };
/// assert_eq!(limits.max_request_bytes, 8 * 1024);
/// ```
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Bytes of request head (request line and headers) read at most;
    /// a longer head is answered 431 and the connection closed.
    /// Default 8 KiB.
    pub max_request_bytes: usize,
    /// Time for the whole request head to arrive, from the accept; a
    /// client that is slower (or silent) is answered 408 and cut off.
    /// Default 5 s.
    pub read_timeout: Duration,
    /// Time for the client to take the answer; then the connection is
    /// dropped. Default 5 s.
    pub write_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    /// Default 16 (0 is taken as 1).
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_request_bytes: 8 * 1024,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 16,
        }
    }
}

/// Serves `node`'s metrics on `listener` with the default
/// [`ServerLimits`], until the node shuts down (it stops accepting when
/// the node's shutdown starts, and returns once the connections it was
/// serving are dropped).
///
/// ```no_run
/// use capwire::Node;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = Node::builder("metered").start().await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
/// tokio::spawn(capwire::prometheus::serve(node.clone(), listener));
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Dropping the future stops serving and drops the connections.
pub async fn serve(node: Node, listener: TcpListener) {
    serve_with(node, listener, ServerLimits::default()).await;
}

/// As [`serve`], with other bounds.
///
/// # Cancel safety
/// Dropping the future stops serving and drops the connections.
pub async fn serve_with(node: Node, listener: TcpListener, limits: ServerLimits) {
    let stop = node.rt.peers.stopping().clone();
    run(node, listener, limits, stop).await;
}

/// A metrics endpoint running in the background: bound by
/// [`bind`](Self::bind), it serves until the node shuts down or
/// [`stop`](Self::stop) is called. Dropping the handle leaves it running.
///
/// ```
/// use capwire::Node;
/// use capwire::prometheus::MetricsServer;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = Node::builder("metered").start().await?;
/// let server = MetricsServer::bind("127.0.0.1:0".parse()?, node.clone()).await?;
///
/// let mut http = tokio::net::TcpStream::connect(server.local_addr()).await?;
/// http.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await?;
/// let mut answer = String::new();
/// http.read_to_string(&mut answer).await?;
/// assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"));
/// assert!(answer.contains("capwire_inflight 0"));
///
/// server.stop();
/// server.stopped().await;
/// node.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `addr` and serves `node`'s metrics there, in a task of the
    /// node's, with the default [`ServerLimits`].
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn bind(addr: SocketAddr, node: Node) -> io::Result<Self> {
        Self::bind_with(addr, node, ServerLimits::default()).await
    }

    /// As [`bind`](Self::bind), with other bounds.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn bind_with(addr: SocketAddr, node: Node, limits: ServerLimits) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let stop = node.rt.peers.stopping().child_token();
        // On the node's tracker: the node's shutdown waits for it too.
        let tracker = node.rt.tracker.clone();
        let task = tracker.spawn(run(node, listener, limits, stop.clone()));
        Ok(Self {
            local_addr,
            stop,
            task,
        })
    }

    /// The address it listens on (with the port actually bound).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and drops the connections being served (the node
    /// goes on).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Waits until it has stopped (after [`stop`](Self::stop), or once
    /// the node's shutdown has started) and its port is free.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

/// Accepts until `stop`; one task per connection, at most
/// `max_connections` at once.
async fn run(node: Node, listener: TcpListener, limits: ServerLimits, stop: CancellationToken) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let limits = Arc::new(limits);
    let tracker = TaskTracker::new();
    loop {
        // A permit before accept: beyond the cap, clients wait in the
        // listen backlog.
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // E.g. out of file descriptors: a pause, then again.
                tracing::debug!(error = %e, "metrics endpoint: accept failed");
                drop(permit);
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                }
            }
        };
        let (node, limits, stop) = (node.clone(), limits.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = answer(stream, &node, &limits) => {}
            }
            drop(permit);
        });
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// Reads one request head, answers it and closes the connection.
async fn answer(mut stream: TcpStream, node: &Node, limits: &ServerLimits) {
    let head = tokio::time::timeout(
        limits.read_timeout,
        read_head(&mut stream, limits.max_request_bytes),
    )
    .await;
    let response = match head {
        Ok(Ok(head)) => respond(&head, node),
        Ok(Err(HeadError::TooLarge)) => plain("431 Request Header Fields Too Large", ""),
        // The client went away or the stream failed: nobody to answer.
        Ok(Err(HeadError::Closed)) => return,
        Err(_) => plain("408 Request Timeout", ""),
    };
    let _ = tokio::time::timeout(limits.write_timeout, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await;
}

/// Why no request head was read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// The head is longer than the bound.
    TooLarge,
    /// The stream ended or failed first.
    Closed,
}

/// Reads until the end of the request head (an empty line), at most
/// `max` bytes; returns the head (anything after it is not read on
/// purpose: the request has no body worth reading).
async fn read_head<S>(stream: &mut S, max: usize) -> Result<Vec<u8>, HeadError>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(max.min(1024));
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let from = buf.len().saturating_sub(3);
        let room = max.saturating_sub(buf.len());
        buf.extend_from_slice(chunk.get(..n.min(room)).unwrap_or_default());
        if let Some(end) = head_end(&buf, from) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() >= max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Where the first empty line of `buf` ends (`\n\r\n` or `\n\n`),
/// looking from `from` on.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find_map(|i| match buf.get(i..) {
        Some([b'\n', b'\n', ..]) => Some(i + 2),
        Some([b'\n', b'\r', b'\n', ..]) => Some(i + 3),
        _ => None,
    })
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// `GET /metrics`, or `HEAD` (`body: false`).
    Metrics { body: bool },
    /// Another method on `/metrics`.
    BadMethod,
    /// Another path.
    NotFound,
    /// Not an HTTP/1.x request line.
    BadRequest,
}

/// Reads the request line of `head`.
fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::BadRequest;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_graphic())
        || !version.starts_with("HTTP/1.")
    {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Route::NotFound;
    }
    match method {
        "GET" => Route::Metrics { body: true },
        "HEAD" => Route::Metrics { body: false },
        _ => Route::BadMethod,
    }
}

/// The answer to a request head.
fn respond(head: &[u8], node: &Node) -> Vec<u8> {
    match route(head) {
        Route::Metrics { body } => {
            let text = super::encode(node);
            let mut out = head_of("200 OK", super::CONTENT_TYPE, text.len(), "");
            if body {
                out.extend_from_slice(text.as_bytes());
            }
            out
        }
        Route::BadMethod => plain("405 Method Not Allowed", "Allow: GET, HEAD\r\n"),
        Route::NotFound => plain("404 Not Found", ""),
        Route::BadRequest => plain("400 Bad Request", ""),
    }
}

/// A short plain-text answer whose body is its status.
fn plain(status: &str, extra_headers: &str) -> Vec<u8> {
    let body = format!("{status}\n");
    let mut out = head_of(
        status,
        "text/plain; charset=utf-8",
        body.len(),
        extra_headers,
    );
    out.extend_from_slice(body.as_bytes());
    out
}

fn head_of(status: &str, content_type: &str, len: usize, extra_headers: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\nCache-Control: no-store\r\nConnection: close\r\n{extra_headers}\r\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_ends_at_the_first_empty_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nbody", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n", 0), None);
        assert_eq!(head_end(b"", 0), None);
        assert_eq!(head_end(b"\n", 5), None);
    }

    #[tokio::test]
    async fn heads_are_read_in_pieces_and_bounded() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move { read_head(&mut server, 64).await });
        for piece in [
            &b"GET /metrics HTTP/1.1\r"[..],
            b"\n",
            b"Host: x\r\n\r",
            b"\nrest",
        ] {
            client.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        let head = reader.await.unwrap().unwrap();
        assert_eq!(head, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");

        let (mut client, mut server) = tokio::io::duplex(4096);
        client.write_all(&[b'a'; 100]).await.unwrap();
        assert_eq!(read_head(&mut server, 64).await, Err(HeadError::TooLarge));

        let (client, mut server) = tokio::io::duplex(64);
        drop(client);
        assert_eq!(read_head(&mut server, 64).await, Err(HeadError::Closed));
    }

    #[test]
    fn request_lines_are_routed() {
        let cases: [(&[u8], Route); 12] = [
            (
                b"GET /metrics HTTP/1.1\r\n\r\n",
                Route::Metrics { body: true },
            ),
            (
                b"GET /metrics?x=1 HTTP/1.0\n\n",
                Route::Metrics { body: true },
            ),
            (
                b"HEAD /metrics HTTP/1.1\r\n\r\n",
                Route::Metrics { body: false },
            ),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Route::BadMethod),
            (b"get /metrics HTTP/1.1\r\n\r\n", Route::BadMethod),
            (b"GET / HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET /metrics/ HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET /metrics HTTP/2\r\n\r\n", Route::BadRequest),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"GET /metrics\r\n\r\n", Route::BadRequest),
            (b"\xff\xfe /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"", Route::BadRequest),
        ];
        for (head, want) in cases {
            assert_eq!(route(head), want, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn plain_answers_close_the_connection() {
        let text = String::from_utf8(plain("404 Not Found", "")).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(text.ends_with("\r\n\r\n404 Not Found\n"));
        assert!(text.contains("Content-Length: 14\r\n"));
    }
}
