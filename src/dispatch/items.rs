//! The handler's side of a stream (protocol 2, WIRE.md 4.9): [`Items`],
//! which a stream verb's handler writes its items to, each waiting for
//! the caller's credit. The caller's side is in `client/stream.rs`; the
//! public module is [`crate::stream`].

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use capwire_envelope::{ErrorCode, ReqId};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::authority::Authority;
use crate::dispatch::error::HandlerError;
use crate::proto::codec;
use crate::proto::session::ItemRefused;

/// Where the items of one of the peer's streams go: a session that queues
/// them within the credit its caller granted. Declared here, implemented
/// by the connection layer (`net::session::Session`), so that a handler's
/// items reach the wire without this layer naming the one above.
pub(crate) trait StreamOut: Send + Sync + 'static {
    /// Queues an item of the stream `req_id`, at once or not at all;
    /// `Ok(true)` when the send queue has a backlog (a producer in a loop
    /// should let the writer run). `holds` is asked under the session's
    /// lock, so no item is queued behind an answer sent after what made it
    /// false.
    ///
    /// # Errors
    /// Why it cannot go now ([`ItemRefused::NoCredit`],
    /// [`ItemRefused::Full`]: wait and try again;
    /// [`ItemRefused::Unauthorized`] when `holds` said no) or ever.
    fn send_item(
        &self,
        req_id: &ReqId,
        frame: &Bytes,
        len: usize,
        holds: &dyn Fn() -> bool,
    ) -> Result<bool, ItemRefused>;

    /// Waits until the send queue may have room for `len` bytes; `false`
    /// at `deadline`.
    fn room(
        &self,
        len: usize,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

/// What the handler serving one of the peer's streams sends its items
/// through: the session, the stream's id, and what wakes it when the peer
/// grants credit.
#[derive(Clone)]
pub(crate) struct Served {
    pub(crate) out: Arc<dyn StreamOut>,
    pub(crate) req_id: ReqId,
    pub(crate) credit: Arc<Notify>,
    /// The longest the handler waits for credit.
    pub(crate) idle: Duration,
    /// The node's stream counters.
    pub(crate) counters: Arc<StreamCounters>,
    /// For a stream of a controller verb: the authority it was opened on,
    /// asked before each item.
    pub(crate) authority: Option<Arc<Authority>>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("req_id", &self.req_id)
            .finish_non_exhaustive()
    }
}

/// The node's stream counters.
#[derive(Debug, Default)]
pub(crate) struct StreamCounters {
    pub(crate) items_sent: AtomicU64,
    pub(crate) items_received: AtomicU64,
    pub(crate) stalls: AtomicU64,
}

/// Why an item could not be sent: the stream is over for this handler,
/// which should return (with `?`, the error becomes the stream's end).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamClosed {
    /// The caller cancelled the stream, the session ended, or the node is
    /// shutting down.
    #[error("the stream was closed: the caller is gone")]
    Gone,
    /// The caller granted no room for the item within the stream's idle
    /// bound ([`Limits::stream_idle_timeout`](crate::Limits)).
    #[error("the caller took no item within the stream's idle bound")]
    Idle,
    /// The item is larger than the caller's whole window, or than a record
    /// may be: it could never be sent.
    #[error("the item is larger than the caller accepts")]
    TooLarge,
    /// The item has no encoding in the strict CBOR profile.
    #[error("the item could not be encoded: {0}")]
    Encode(String),
    /// The authority the stream was opened on has ended: the control
    /// plane that opened it was unbound, or the grant that let it through
    /// was revoked or expired (the stream ends `unauthorized`).
    #[error("the authority that opened the stream has ended")]
    Unauthorized,
}

impl From<StreamClosed> for HandlerError {
    fn from(e: StreamClosed) -> Self {
        let code = match e {
            StreamClosed::Gone => ErrorCode::Cancelled,
            StreamClosed::Idle => ErrorCode::Timeout,
            StreamClosed::TooLarge => ErrorCode::TooLarge,
            StreamClosed::Encode(_) => ErrorCode::Internal,
            StreamClosed::Unauthorized => ErrorCode::Unauthorized,
        };
        HandlerError::new(code, e.to_string())
    }
}

/// The sender a stream handler writes its items to. Each
/// [`send`](Items::send) waits until the caller has granted room for the
/// item, so the handler never runs ahead of its consumer by more than the
/// caller's window.
pub struct Items<T> {
    served: Served,
    deadline: Instant,
    /// Items sent (each an event on the stream's server span).
    sent: u64,
    _item: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for Items<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Items")
            .field("req_id", &self.served.req_id)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize> Items<T> {
    pub(crate) fn new(served: Served, deadline: Instant) -> Self {
        Self {
            served,
            deadline,
            sent: 0,
            _item: PhantomData,
        }
    }

    /// From now on, every item is sent only while `authority` holds (a
    /// stream whose right to go on depends on more than its admission).
    pub(crate) fn hold(&mut self, authority: Arc<crate::authority::Authority>) {
        self.served.authority = Some(authority);
    }

    /// Sends one item, waiting for the caller's credit (and for room in
    /// the session's send queue).
    ///
    /// # Errors
    /// [`StreamClosed`]: the stream cannot go on; return from the handler.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while it waits, the item was not sent, and its
    /// credit is untouched.
    pub async fn send(&mut self, item: T) -> Result<(), StreamClosed> {
        let s = &self.served;
        let (frame, len) =
            codec::item_of(&s.req_id, &item).map_err(|e| StreamClosed::Encode(e.to_string()))?;
        loop {
            let credit = s.credit.notified();
            tokio::pin!(credit);
            credit.as_mut().enable();
            // The authority is asked in full here, and once more, cheaply,
            // under the session's lock as the item is queued: nothing is
            // queued after the change that ended it.
            if let Some(a) = &s.authority {
                a.check().map_err(|_| StreamClosed::Unauthorized)?;
            }
            let holds = || s.authority.as_ref().is_none_or(|a| a.unchanged());
            match s.out.send_item(&s.req_id, &frame, len, &holds) {
                Ok(backlog) => {
                    s.counters.items_sent.fetch_add(1, Ordering::Relaxed);
                    self.sent += 1;
                    crate::trace::event_here("item", self.sent);
                    if backlog {
                        // A producer in a loop lets the writer run.
                        tokio::task::yield_now().await;
                    }
                    return Ok(());
                }
                Err(ItemRefused::NoCredit) => {
                    s.counters.stalls.fetch_add(1, Ordering::Relaxed);
                    // Past the budget the runtime stops the handler anyway
                    // (the stream ends with `timeout`).
                    let idle = Instant::now() + s.idle;
                    if tokio::time::timeout_at(idle.min(self.deadline), credit)
                        .await
                        .is_err()
                    {
                        return Err(StreamClosed::Idle);
                    }
                }
                Err(ItemRefused::Full) => {
                    let idle = Instant::now() + s.idle;
                    if !s.out.room(frame.len(), idle.min(self.deadline)).await {
                        return Err(StreamClosed::Idle);
                    }
                }
                Err(ItemRefused::TooLarge) => return Err(StreamClosed::TooLarge),
                Err(ItemRefused::Closed) => return Err(StreamClosed::Gone),
                // Changed just now: asked in full on the next turn.
                Err(ItemRefused::Unauthorized) => {}
            }
        }
    }
}
