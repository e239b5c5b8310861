//! Dialling: one address with a deadline and retries on "busy", and the
//! loops that keep a session with each contact.

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::NodeId;
use capwire_transport::TransportError;
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::contact::Contact;
use crate::error::NodeError;
use crate::net::Net;
use crate::net::backoff::Backoff;
use crate::net::session::Session;

/// First pause after a "busy" answer; it doubles up to [`BUSY_MAX`].
const BUSY_FIRST: Duration = Duration::from_millis(10);
const BUSY_MAX: Duration = Duration::from_millis(500);

/// Dials `addr` and establishes a session, within the node's connect
/// timeout. A responder at capacity answers "busy"; the dial is retried
/// after a short, growing pause until the deadline.
pub(crate) async fn dial(
    net: &Arc<Net>,
    addr: &Addr,
    expected: Option<NodeId>,
) -> Result<Arc<Session>, NodeError> {
    let deadline = Instant::now() + net.connect_timeout;
    let mut pause = BUSY_FIRST;
    loop {
        let attempt = tokio::time::timeout_at(deadline, dial_once(net, addr, expected)).await;
        match attempt {
            Err(_) => return Err(NodeError::Timeout),
            Ok(Err(NodeError::Transport(TransportError::Busy)))
                if Instant::now() + pause < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BUSY_MAX);
            }
            Ok(r) => return r,
        }
    }
}

async fn dial_once(
    net: &Arc<Net>,
    addr: &Addr,
    expected: Option<NodeId>,
) -> Result<Arc<Session>, NodeError> {
    match addr {
        Addr::Tcp(sa) => {
            let stream = TcpStream::connect(sa).await?;
            let _ = stream.set_nodelay(true);
            net.connect_stream(stream, expected).await
        }
        #[cfg(unix)]
        Addr::Unix(path) => {
            let stream = UnixStream::connect(path).await?;
            net.connect_stream(stream, expected).await
        }
        #[cfg(not(unix))]
        Addr::Unix(_) => Err(NodeError::Config(
            "unix sockets are not supported here".into(),
        )),
    }
}

/// Keeps a session with `contact` until `token` is cancelled: dials when
/// there is none, waits while there is one, and redials with bounded
/// exponential backoff.
pub(crate) async fn contact_loop(
    net: Arc<Net>,
    contact: Contact,
    token: CancellationToken,
    reconnect: (Duration, Duration),
) {
    let seed = u64::from_le_bytes(contact.id.as_bytes()[..8].try_into().unwrap_or([1; 8]));
    let mut backoff = Backoff::new(reconnect.0, reconnect.1, seed);
    loop {
        if token.is_cancelled() {
            return;
        }
        let session = match net.peers.session(&contact.id) {
            Some(s) => Some(s),
            None => {
                let attempt = tokio::select! {
                    () = token.cancelled() => return,
                    r = dial(&net, &contact.addr, Some(contact.id)) => r,
                };
                match attempt {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::debug!(peer = %contact.id, error = %e, "dial failed");
                        None
                    }
                }
            }
        };
        if let Some(s) = session {
            backoff.reset();
            tokio::select! {
                () = token.cancelled() => return,
                () = s.ended() => {}
            }
        }
        // A pause, so that a peer which is going away is not redialled in
        // a tight loop.
        let delay = backoff.next_delay();
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}
