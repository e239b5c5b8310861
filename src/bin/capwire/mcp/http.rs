//! `capwire mcp --http ADDR`: MCP's streamable HTTP transport (rmcp's
//! service) and the served nodes' A2A Agent Cards, on hyper, on a
//! loopback address only (the face has no authentication of its own: who
//! can reach it has the control plane's authority over the tools):
//!
//! ```text
//!  POST|GET|DELETE /mcp                     ─► MCP (streamable HTTP; a
//!                                              DELETE that closes a
//!                                              session is answered 200,
//!                                              one of no open session
//!                                              404)
//!  GET /.well-known/agent-card.json         ─► the card of the one node
//!                                              served (404 with the
//!                                              paths when there are more)
//!  GET /nodes/NAME/.well-known/agent-card.json ─► NAME's card
//!  other                                    ─► 404
//! ```
//!
//! Every path answers only a request whose `Host` is a loopback name or
//! the address listened on (403 otherwise), against DNS rebinding.
//!
//! Bounds: 64 connections at once (more wait in the backlog), a request
//! head within 5 s and 64 KiB, an MCP body of 4 MiB (rmcp's bound), and
//! 64 MCP sessions at once (one more `initialize` is answered 503; an
//! idle session ends after 5 minutes).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::http::uri::Authority;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value as Json, json};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::catalog::NodeView;
use super::server::Face;
use crate::ctl::card::card_json;
use crate::exit::Failure;

/// Connections served at once.
const MAX_CONNECTIONS: usize = 64;
/// MCP sessions at once.
const MAX_SESSIONS: usize = 64;
/// The longest request head.
const MAX_HEAD: usize = 64 * 1024;
/// Time for a request head to arrive.
const HEAD_WAIT: Duration = Duration::from_secs(5);

/// The path of the MCP endpoint.
pub(crate) const MCP_PATH: &str = "/mcp";
/// Where A2A looks for an agent's card.
pub(crate) const CARD_PATH: &str = "/.well-known/agent-card.json";

type Body = BoxBody<Bytes, Infallible>;

struct Routes {
    mcp: StreamableHttpService<Face, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    nodes: watch::Receiver<Arc<Vec<NodeView>>>,
    /// The `Host`s served (rmcp checks those of `/mcp` with the same
    /// list).
    hosts: Vec<Allowed>,
}

/// The `Host` values served, against DNS rebinding (a page elsewhere whose
/// name was made to resolve to loopback sends its own name): the loopback
/// names on any port, and the address listened on.
fn allowed_hosts(addr: SocketAddr) -> Vec<String> {
    vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
        addr.to_string(),
    ]
}

/// One allowed `Host`: a name, and a port unless any is allowed.
#[derive(Debug, PartialEq)]
struct Allowed {
    host: String,
    port: Option<u16>,
}

impl Allowed {
    /// `HOST`, `HOST:PORT` or `[IPV6]:PORT`, as rmcp reads its list and
    /// a request's `Host`.
    fn parse(text: &str) -> Option<Allowed> {
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        let (host, port) = match text.parse::<Authority>() {
            Ok(authority) => (authority.host().to_owned(), authority.port_u16()),
            Err(_) => (text.to_owned(), None),
        };
        Some(Allowed {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase(),
            port,
        })
    }
}

/// What to answer `req` when it does not name a host served (by its
/// `Host`, else the authority of its target); `None` when it does.
fn host_refused<B>(req: &Request<B>, allowed: &[Allowed]) -> Option<Response<Body>> {
    let named = match req.headers().get(header::HOST) {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.parse::<Authority>().ok()),
        None => req.uri().authority().cloned(),
    };
    let Some(named) = named else {
        return Some(json_response(
            StatusCode::BAD_REQUEST,
            &json!({"error": "no Host, or one that is not a host and port"}),
        ));
    };
    let host = named
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = named.port_u16();
    if allowed
        .iter()
        .any(|a| a.host == host && a.port.is_none_or(|p| port == Some(p)))
    {
        return None;
    }
    tracing::warn!(
        host = named.as_str(),
        "refused a request for another Host (possible DNS rebinding)"
    );
    Some(json_response(
        StatusCode::FORBIDDEN,
        &json!({"error": format!("Host {:?} is not served here", named.as_str())}),
    ))
}

/// Serves until `stop` is cancelled. `bound` is told the address once it
/// listens.
///
/// # Errors
/// The address cannot be bound.
pub(crate) async fn serve(
    face: Face,
    nodes: watch::Receiver<Arc<Vec<NodeView>>>,
    listener: TcpListener,
    stop: CancellationToken,
) -> Result<(), Failure> {
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::failed(format!("cannot read the bound address: {e}")))?;
    let sessions = Arc::new(LocalSessionManager::default());
    let hosts = allowed_hosts(addr);
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts.clone())
        .with_cancellation_token(stop.child_token());
    let routes = Arc::new(Routes {
        mcp: StreamableHttpService::new(move || Ok(face.clone()), Arc::clone(&sessions), config),
        sessions,
        nodes,
        hosts: hosts.iter().filter_map(|h| Allowed::parse(h)).collect(),
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return Ok(()),
            },
            () = stop.cancelled() => return Ok(()),
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return Ok(()),
        };
        let routes = Arc::clone(&routes);
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let routes = Arc::clone(&routes);
                async move { Ok::<_, Infallible>(routes.route(req).await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_WAIT)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                served = conn.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!("an HTTP connection ended: {e}");
                    }
                }
                () = stop.cancelled() => {}
            }
        });
    }
}

/// Binds `addr`, which must be a loopback address.
///
/// # Errors
/// It is not loopback, or it cannot be bound.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, Failure> {
    if !addr.ip().is_loopback() {
        return Err(Failure::usage(format!(
            "--http {addr}: not a loopback address. The MCP face has no authentication of its \
             own (whoever reaches it calls the tools with the control plane's authority), so \
             it listens on loopback only; put a proxy that authenticates in front of it to \
             reach it from elsewhere"
        )));
    }
    TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::failed(format!("cannot listen on {addr}: {e}")))
}

impl Routes {
    async fn route(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if path == MCP_PATH {
            let opens =
                req.method() == Method::POST && !req.headers().contains_key("mcp-session-id");
            if opens && self.sessions.sessions.read().await.len() >= MAX_SESSIONS {
                return json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"error": format!("{MAX_SESSIONS} MCP sessions are open already")}),
                );
            }
            // A DELETE: whether the session it closes is open.
            let closes = if req.method() == Method::DELETE {
                let id = req.headers().get("mcp-session-id");
                let id = id.and_then(|v| v.to_str().ok()).unwrap_or_default();
                Some(self.sessions.sessions.read().await.contains_key(id))
            } else {
                None
            };
            let mut response = self.mcp.handle(req).await;
            // rmcp answers every DELETE it takes with 202 Accepted. MCP's
            // clients take 200 or 204 for a session closed (the Python
            // SDK's warns of any other status), and a session that is not
            // open answers 404, as any request in it does.
            if let Some(open) = closes
                && response.status() == StatusCode::ACCEPTED
            {
                if open {
                    *response.status_mut() = StatusCode::OK;
                } else {
                    response = json_response(
                        StatusCode::NOT_FOUND,
                        &json!({"error": "no such MCP session: it ended, or never began"}),
                    );
                }
            }
            return response;
        }
        // The cards, and what is not served, answer only for the hosts
        // `/mcp` answers for.
        if let Some(refused) = host_refused(&req, &self.hosts) {
            return refused;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut response = json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({"error": "only GET and HEAD are served here"}),
            );
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let nodes = self.nodes.borrow().clone();
        if path == CARD_PATH {
            return match nodes.as_slice() {
                [one] => card_response(one),
                _ => json_response(
                    StatusCode::NOT_FOUND,
                    &json!({
                        "error": "more than one node is served: each has its card at its own path",
                        "cards": nodes.iter().map(card_path).collect::<Vec<_>>(),
                    }),
                ),
            };
        }
        if let Some(name) = path
            .strip_prefix("/nodes/")
            .and_then(|rest| rest.strip_suffix(CARD_PATH))
        {
            let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            if let Some(node) = nodes.iter().find(|n| n.name == name) {
                return card_response(node);
            }
        }
        json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": format!("nothing at {path}: MCP is at {MCP_PATH}")}),
        )
    }
}

/// Where `node`'s card is served.
pub(crate) fn card_path(node: &NodeView) -> String {
    let name =
        percent_encoding::utf8_percent_encode(&node.name, percent_encoding::NON_ALPHANUMERIC);
    format!("/nodes/{name}{CARD_PATH}")
}

fn card_response(node: &NodeView) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &card_json(&node.name, &node.manifest, &node.addrs),
    )
}

fn json_response(status: StatusCode, body: &Json) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(addr: &str) -> Vec<Allowed> {
        let addr: SocketAddr = addr.parse().expect("an address");
        allowed_hosts(addr)
            .iter()
            .filter_map(|h| Allowed::parse(h))
            .collect()
    }

    fn status(host: Option<&str>, allowed: &[Allowed]) -> Option<StatusCode> {
        let mut req = Request::builder().uri(CARD_PATH);
        if let Some(host) = host {
            req = req.header(header::HOST, host);
        }
        let req = req.body(()).expect("a request");
        host_refused(&req, allowed).map(|r| r.status())
    }

    #[test]
    fn loopback_names_on_any_port_and_the_bound_address() {
        let v4 = allowed("127.0.0.1:8377");
        for ok in [
            "127.0.0.1:8377",
            "localhost:8377",
            "LOCALHOST",
            "127.0.0.1:1",
            "[::1]:8377",
        ] {
            assert_eq!(status(Some(ok), &v4), None, "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8377",
            "127.0.0.2:8377",
            "10.0.0.1",
        ] {
            assert_eq!(
                status(Some(refused), &v4),
                Some(StatusCode::FORBIDDEN),
                "{refused}"
            );
        }
        assert_eq!(status(None, &v4), Some(StatusCode::BAD_REQUEST));
        assert_eq!(status(Some("a b"), &v4), Some(StatusCode::BAD_REQUEST));
        // Another loopback address: only with its own port.
        let other = allowed("127.0.0.5:9000");
        assert_eq!(status(Some("127.0.0.5:9000"), &other), None);
        assert_eq!(
            status(Some("127.0.0.5:9001"), &other),
            Some(StatusCode::FORBIDDEN)
        );
        let v6 = allowed("[::1]:9000");
        assert_eq!(status(Some("[::1]:9000"), &v6), None);
    }
}
