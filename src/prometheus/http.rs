//! The HTTP/1.1 endpoint for the scraper, on hyper. It answers one
//! request per connection and closes it:
//!
//! ```text
//!  GET|HEAD /metrics  ─► 200, the Prometheus text (HEAD: headers only)
//!  other method       ─► 405 (Allow: GET, HEAD)
//!  other path         ─► 404
//!  not HTTP/1.x       ─► 400
//!  head over the size ─► 431      no whole head in time ─► 408
//!  source over its bound, or the last free slot to a source that
//!  already has one    ─► 503, at once, before any byte is read
//! ```
//!
//! The scraper is treated as hostile. hyper parses the request head
//! within a size bound (`max_buf_size`) and a deadline
//! (`header_read_timeout`); the answer must be taken within another
//! deadline. Connections are bounded in all (beyond, they wait in the
//! listen backlog) and per source address; a source that already has a
//! connection never gets the last free slot, so that one address opening
//! silent sockets cannot keep a scraper elsewhere out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::node::Node;

/// The least head bound hyper accepts (its minimum read buffer).
const MIN_REQUEST_BYTES: usize = 8 * 1024;

/// Bounds of the metrics endpoint, per connection, per source address and
/// in all.
///
/// ```
/// use std::time::Duration;
/// use capwire::prometheus::ServerLimits;
///
/// let limits = ServerLimits { read_timeout: Duration::from_secs(1), ..ServerLimits::default() };
/// assert_eq!(limits.max_request_bytes, 8 * 1024);
/// assert_eq!(limits.max_connections_per_source, 4);
/// ```
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Bytes of request head (request line and headers) read at most;
    /// a longer head is answered 431 and the connection closed.
    /// Default 8 KiB, which is also the least taken (a smaller value
    /// counts as 8 KiB).
    pub max_request_bytes: usize,
    /// Time for the whole request head to arrive, from the accept; a
    /// client that is slower (or silent) is answered 408 and cut off.
    /// Short on purpose: a scraper sends its head at once. Default 2 s.
    pub read_timeout: Duration,
    /// Time for the client to take the answer, once its head is read;
    /// then the connection is dropped. Default 5 s.
    pub write_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    /// Default 16 (0 is taken as 1).
    pub max_connections: usize,
    /// Connections served at once from one source address; one more
    /// from that address is answered 503 and closed at once. Whatever
    /// this bound, a source that already has a connection never gets the
    /// last free slot: it is kept for a new source. Default 4 (0 is
    /// taken as 1).
    pub max_connections_per_source: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_request_bytes: MIN_REQUEST_BYTES,
            read_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(5),
            max_connections: 16,
            max_connections_per_source: 4,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connections being served, by source address. It holds an entry
/// only for a source with a connection open, so at most
/// `max_connections` entries.
#[derive(Debug)]
struct Sources {
    per_source: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place: its share of the source's bound and its slot
/// in all, given back when dropped.
#[derive(Debug)]
struct Place {
    sources: Arc<Sources>,
    source: IpAddr,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = lock(&self.sources.open);
        if let Some(n) = open.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.source);
            }
        }
    }
}

impl Sources {
    /// A place for a connection from `source` that holds `slot`, unless
    /// the source is at its bound, or `slot` is the last one free
    /// (`last`) and the source already has a connection.
    fn enter(
        self: &Arc<Self>,
        source: IpAddr,
        slot: OwnedSemaphorePermit,
        last: bool,
    ) -> Option<Place> {
        let mut open = lock(&self.open);
        let n = open.get(&source).copied().unwrap_or(0);
        if n >= self.per_source || (last && n > 0) {
            return None;
        }
        open.insert(source, n + 1);
        drop(open);
        Some(Place {
            sources: self.clone(),
            source,
            _slot: slot,
        })
    }
}

/// What every connection shares.
struct Endpoint {
    node: Node,
    http: http1::Builder,
    write_timeout: Duration,
}

/// Accepts until `stop`; one task per connection, at most
/// `max_connections` at once and `max_connections_per_source` from one
/// address.
async fn run(node: Node, listener: TcpListener, limits: ServerLimits, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let sources = Arc::new(Sources {
        per_source: limits.max_connections_per_source.max(1),
        open: Mutex::new(HashMap::new()),
    });
    let mut http = http1::Builder::new();
    http.keep_alive(false)
        .title_case_headers(true)
        .max_buf_size(limits.max_request_bytes.max(MIN_REQUEST_BYTES))
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    let endpoint = Arc::new(Endpoint {
        node,
        http,
        write_timeout: limits.write_timeout,
    });
    let busy = busy();
    let tracker = TaskTracker::new();
    loop {
        // A slot before accept: beyond the cap, clients wait in the
        // listen backlog.
        let slot = tokio::select! {
            () = stop.cancelled() => break,
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // E.g. out of file descriptors: a pause, then again.
                tracing::debug!(error = %e, "metrics endpoint: accept failed");
                drop(slot);
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                }
            }
        };
        let source = peer.ip().to_canonical();
        let last = slots.available_permits() == 0;
        let Some(place) = sources.enter(source, slot, last) else {
            tracing::debug!(%source, "metrics endpoint: source over its bound");
            // Nothing is read from it; the answer fits any socket buffer,
            // so it is written now or not at all.
            let _ = stream.try_write(&busy);
            continue;
        };
        let (endpoint, stop) = (endpoint.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = answer(stream, &endpoint) => {}
            }
            drop(place);
        });
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// Serves one request on `stream` and closes it.
async fn answer(mut stream: TcpStream, endpoint: &Endpoint) {
    // hyper closes without a word when the head is late or is HTTP/2's
    // preface; the client is told why.
    let status = match serve_one(&mut stream, endpoint).await {
        Unanswered::No => return,
        Unanswered::Late => StatusCode::REQUEST_TIMEOUT,
        Unanswered::Http2 => StatusCode::BAD_REQUEST,
    };
    let _ = tokio::time::timeout(endpoint.write_timeout, async {
        stream.write_all(&plain(status, "")).await?;
        stream.shutdown().await
    })
    .await;
}

/// What hyper left unanswered.
enum Unanswered {
    /// Nothing: it answered, or there is nobody to answer.
    No,
    /// The head did not arrive within the deadline.
    Late,
    /// The client speaks HTTP/2.
    Http2,
}

/// Lets hyper read the head, answer it and close; the answer must be
/// taken within the write deadline.
async fn serve_one(stream: &mut TcpStream, endpoint: &Endpoint) -> Unanswered {
    let head_read = Notify::new();
    let service = hyper::service::service_fn(|request: Request<Incoming>| {
        head_read.notify_one();
        std::future::ready(Ok::<_, Infallible>(respond(&request, &endpoint.node)))
    });
    let conn = endpoint
        .http
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => return match done {
            Err(e) if e.is_timeout() => Unanswered::Late,
            Err(e) if e.is_parse_version_h2() => Unanswered::Http2,
            _ => Unanswered::No,
        },
        () = head_read.notified() => {}
    }
    let _ = tokio::time::timeout(endpoint.write_timeout, conn).await;
    Unanswered::No
}

/// The answer to a request.
fn respond(request: &Request<Incoming>, node: &Node) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, None);
    }
    let body = match *request.method() {
        Method::GET => true,
        Method::HEAD => false,
        _ => return reply(StatusCode::METHOD_NOT_ALLOWED, Some("GET, HEAD")),
    };
    let text = super::encode(node);
    let len = text.len();
    let mut response = Response::new(Full::new(if body {
        Bytes::from(text)
    } else {
        Bytes::new()
    }));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::CONTENT_TYPE),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    closing(headers);
    response
}

/// A short plain-text answer whose body is its status, with an `Allow`
/// header if given.
fn reply(status: StatusCode, allow: Option<&'static str>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(status_line(status))));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    closing(headers);
    if let Some(allow) = allow {
        headers.insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    response
}

fn closing(headers: &mut hyper::HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// `"404 Not Found\n"`: the body of a short answer.
fn status_line(status: StatusCode) -> String {
    format!(
        "{} {}\n",
        status.as_str(),
        status.canonical_reason().unwrap_or_default()
    )
}

/// A whole plain-text answer, written without hyper (when hyper is no
/// longer, or not yet, in charge of the connection).
fn plain(status: StatusCode, extra_headers: &str) -> Vec<u8> {
    let body = status_line(status);
    let head = body.trim_end();
    let len = body.len();
    format!(
        "HTTP/1.1 {head}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len}\r\nCache-Control: no-store\r\nConnection: close\r\n{extra_headers}\r\n{body}"
    )
    .into_bytes()
}

/// The answer to a connection refused for its source.
fn busy() -> Vec<u8> {
    plain(StatusCode::SERVICE_UNAVAILABLE, "Retry-After: 1\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_answers_close_the_connection() {
        let text = String::from_utf8(plain(StatusCode::REQUEST_TIMEOUT, "")).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(text.ends_with("\r\n\r\n408 Request Timeout\n"));
        assert!(text.contains("Content-Length: 20\r\n"));
        let text = String::from_utf8(busy()).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nRetry-After: 1\r\n"));
    }

    #[tokio::test]
    async fn a_source_at_its_bound_or_asking_for_the_last_slot_is_refused() {
        let slots = Arc::new(Semaphore::new(4));
        let sources = Arc::new(Sources {
            per_source: 2,
            open: Mutex::new(HashMap::new()),
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        let slot = || slots.clone().try_acquire_owned().unwrap();
        let a1 = sources.enter(a, slot(), false).unwrap();
        let a2 = sources.enter(a, slot(), false).unwrap();
        assert!(
            sources.enter(a, slot(), false).is_none(),
            "a is at its bound"
        );
        let b1 = sources.enter(b, slot(), false).unwrap();
        assert!(
            sources.enter(b, slot(), true).is_none(),
            "the last slot is for a new source"
        );
        let c1 = sources.enter(c, slot(), true).unwrap();
        assert_eq!(slots.available_permits(), 0);
        drop((a1, b1, c1));
        assert_eq!(slots.available_permits(), 3);
        assert_eq!(lock(&sources.open).get(&a), Some(&1));
        drop(a2);
        assert!(
            lock(&sources.open).is_empty(),
            "no entry outlives its connections"
        );
    }
}
