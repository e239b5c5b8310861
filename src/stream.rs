//! Streams (protocol 2): a verb that answers with many items, with flow
//! control from the caller's consumer back to the handler that produces
//! them.
//!
//! A stream verb is declared with `verb!` and the kind `stream`; its
//! handler gets an [`Items`] sender and writes its items to it; the caller
//! gets an [`ItemStream`] from [`Peer::stream`](crate::Peer::stream):
//!
//! ```
//! use capwire::manifest::verb;
//! use capwire::{Capability, HandlerError, Items, Node};
//!
//! verb! {
//!     /// Counts from 1 to the number asked for.
//!     struct Count: stream "app.count" / "up", Bootstrap, u32 => u32;
//! }
//!
//! async fn up(to: u32, mut items: Items<u32>) -> Result<(), HandlerError> {
//!     for n in 1..=to {
//!         // Waits while the caller has no room: a slow consumer slows
//!         // this loop down, nothing piles up.
//!         items.send(n).await?;
//!     }
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Node::builder("counter")
//!     .listen("127.0.0.1:0".parse()?)
//!     .capability(Capability::new("app.count", "1.0.0")?.stream(Count, up))
//!     .start()
//!     .await?;
//! let client = Node::builder("client").start().await?;
//! let peer = client.connect(&server.local_addrs()[0], Some(server.id())).await?;
//!
//! let mut numbers = peer.stream(Count, 5).await?;
//! let mut got = Vec::new();
//! while let Some(n) = numbers.next().await {
//!     got.push(n?);
//! }
//! assert_eq!(got, [1, 2, 3, 4, 5]);
//! # client.shutdown().await;
//! # server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! **Why a sender, not a returned `Stream`.** Backpressure is what the
//! handler feels when it cannot go on: with a sender, that is an `.await`
//! that does not return until the caller has room for the item (its credit,
//! WIRE.md 4.9), written in the handler's own loop, whatever its items come
//! from (a model's callback, a channel, a loop). A handler that returns a
//! `Stream` would be polled by the runtime only when there is credit, which
//! is the same backpressure, but asks every producer to be written as a
//! lazy stream. The sender also says why a stream stopped
//! ([`StreamClosed`]): the caller went away, it was idle too long, an item
//! was too large.
//!
//! **Lifecycle.** The stream ends when the handler returns (its `Ok` or its
//! error is the end the caller sees); the caller dropping its
//! [`ItemStream`] cancels it, and the handler's future is dropped at once
//! (its token, [`Meta::cancel`](crate::Meta), fires too); `budget_ms` bounds
//! the whole stream and [`Limits::stream_idle_timeout`](crate::Limits)
//! the time between items, on both sides.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use capwire_envelope::{ErrorCode, RawValue, ReqId};
use futures_util::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, Sleep};

use crate::dispatch::error::HandlerError;
use crate::error::CallError;
use crate::net::session::Session;
use crate::net::streams::{Next, Served, StreamSink};
use crate::proto::codec;
use crate::proto::session::{ItemRefused, Reply};

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
            _item: PhantomData,
        }
    }

    /// From now on, every item is sent only while `authority` holds (a
    /// stream whose right to go on depends on more than its admission).
    pub(crate) fn hold(&mut self, authority: Arc<crate::dispatch::authority::Authority>) {
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
            match s.session.send_item(&s.req_id, &frame, len, holds) {
                Ok(backlog) => {
                    s.counters.items_sent.fetch_add(1, Ordering::Relaxed);
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
                    if s.session
                        .room(frame.len(), idle.min(self.deadline))
                        .await
                        .is_err()
                    {
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

/// The items of a stream this node called, as they arrive: a
/// [`Stream`] of `Result<T, CallError>`, ended by
/// `None` after the last item when the handler finished well, or by one
/// `Err` when it did not (its error, a lost session, a deadline). Taking
/// items is what grants the handler room for more.
///
/// Dropping it before the end cancels the stream: the peer is told, and
/// its handler stops.
pub struct ItemStream<T> {
    sink: Arc<StreamSink>,
    session: Arc<Session>,
    req_id: ReqId,
    /// When the whole stream's budget runs out, if it has one.
    deadline: Option<Instant>,
    idle: std::time::Duration,
    timer: Pin<Box<Sleep>>,
    done: bool,
    _item: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for ItemStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemStream")
            .field("req_id", &self.req_id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> ItemStream<T> {
    pub(crate) fn new(
        sink: Arc<StreamSink>,
        session: Arc<Session>,
        req_id: ReqId,
        deadline: Option<Instant>,
        idle: std::time::Duration,
    ) -> Self {
        let first = Instant::now() + idle;
        Self {
            sink,
            session,
            req_id,
            deadline,
            idle,
            timer: Box::pin(tokio::time::sleep_until(
                deadline.map_or(first, |d| d.min(first)),
            )),
            done: false,
            _item: PhantomData,
        }
    }

    /// The next item; `None` once the stream has ended (after the last
    /// item, or after the error that ended it).
    ///
    /// # Cancel safety
    /// Cancel safe: an item is taken only when it is returned.
    pub async fn next(&mut self) -> Option<Result<T, CallError>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// The stream's request id (as the peer sees it).
    pub fn req_id(&self) -> &ReqId {
        &self.req_id
    }

    /// Items that arrived and were not taken yet (at most the window).
    pub fn buffered(&self) -> usize {
        self.sink.buffered()
    }

    fn end(&mut self, e: CallError) -> Poll<Option<Result<T, CallError>>> {
        self.done = true;
        self.session.abandon_stream(&self.req_id);
        Poll::Ready(Some(Err(e)))
    }
}

impl<T: DeserializeOwned> Stream for ItemStream<T> {
    type Item = Result<T, CallError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.sink.poll_next(cx) {
            Poll::Ready(Next::Item(raw)) => {
                self.session.taken(&self.req_id, 1, raw.len() as u64);
                let this = &mut *self;
                let next = Instant::now() + this.idle;
                let due = this.deadline.map_or(next, |d| d.min(next));
                this.timer.as_mut().reset(due);
                // The frame decoder validated the item.
                let item = RawValue::dangerous_from_validated(raw)
                    .decode::<T>()
                    .map_err(|e| CallError::BadResult(e.to_string()));
                Poll::Ready(Some(item))
            }
            Poll::Ready(Next::End(Reply::Ok(_))) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Next::End(Reply::Err(body))) => {
                self.done = true;
                Poll::Ready(Some(Err(CallError::from_remote(body))))
            }
            Poll::Ready(Next::Lost) => {
                self.done = true;
                Poll::Ready(Some(Err(CallError::PeerLost)))
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let over = self.deadline.is_some_and(|d| Instant::now() >= d);
                    self.end(if over {
                        CallError::Timeout
                    } else {
                        CallError::Idle
                    })
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T> Drop for ItemStream<T> {
    fn drop(&mut self) {
        if !self.done {
            self.session.abandon_stream(&self.req_id);
        }
    }
}
