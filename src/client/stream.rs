//! Streams from the caller's side: [`Peer::stream`](crate::Peer::stream)
//! and the [`ItemStream`] it returns, whose taking of items grants the
//! handler credit for more.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use capwire_envelope::{RawValue, ReqId};
use capwire_manifest::StreamVerb;
use futures_util::Stream;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, Sleep};

use crate::client::Peer;
use crate::error::CallError;
use crate::net::session::Session;
use crate::net::streams::{Next, StreamSink};
use crate::proto::codec;
use crate::proto::session::Reply;
use crate::tap::Way;
use crate::time::deadline_after;

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
    /// The stream's client span: its items are events on it, and it ends
    /// with the stream.
    span: tracing::Span,
    /// Items taken.
    taken: u64,
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
        span: tracing::Span,
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
            span,
            taken: 0,
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
        self.session.abandon_stream(&self.req_id);
        self.ended(Some(e))
    }

    /// The stream ended: well (`None`) or with `e`.
    fn ended(&mut self, e: Option<CallError>) -> Poll<Option<Result<T, CallError>>> {
        self.done = true;
        match e {
            None => {
                crate::trace::record_end(&self.span, "ok", true);
                Poll::Ready(None)
            }
            Some(e) => {
                let code = e.code().map_or("error", |c| c.as_str());
                crate::trace::record_end(&self.span, code, false);
                Poll::Ready(Some(Err(e)))
            }
        }
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
                this.taken += 1;
                crate::trace::item_event(&this.span, "item", this.taken);
                // The frame decoder validated the item.
                let item = RawValue::dangerous_from_validated(raw)
                    .decode::<T>()
                    .map_err(|e| CallError::BadResult(e.to_string()));
                Poll::Ready(Some(item))
            }
            Poll::Ready(Next::End(Reply::Ok(_))) => self.ended(None),
            Poll::Ready(Next::End(Reply::Err(body))) => {
                self.ended(Some(CallError::from_remote(body)))
            }
            Poll::Ready(Next::Lost) => self.ended(Some(CallError::PeerLost)),
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
            crate::trace::record_end(&self.span, "cancelled", false);
        }
    }
}

impl Peer {
    /// Calls stream verb `V`: returns once the stream is open (its control
    /// frame and first grant queued); its items then come on the
    /// [`ItemStream`] as the handler produces them, within the window of
    /// [`Limits::stream_window_items`](crate::Limits) and
    /// [`stream_window_bytes`](crate::Limits) (see [`crate::stream`]).
    /// The whole stream has no deadline of its own (the peer bounds it by
    /// its `max_handler_time`); [`Limits::stream_idle_timeout`](crate::Limits)
    /// bounds the wait for each item.
    ///
    /// # Errors
    /// [`CallError::Unsupported`] when the peer speaks protocol 1 only
    /// (nothing is sent); [`CallError::Unreachable`] without a session;
    /// `Overloaded` when this session's streams hold all the window they
    /// may; `Encode`, `TooLarge`. Errors of the stream itself (denied,
    /// the handler's error, a lost session) come as the stream's last item.
    ///
    /// # Cancel safety
    /// Dropped before it returns, the stream is not opened (or, once
    /// queued, is cancelled). Dropping the [`ItemStream`] cancels it.
    pub async fn stream<V: StreamVerb>(
        &self,
        _verb: V,
        args: V::Args,
    ) -> Result<ItemStream<V::Output>, CallError> {
        self.stream_as::<V>(&args, None).await
    }

    /// As [`Peer::stream`], with a deadline for the whole stream: the
    /// peer is given it as the stream's budget, and the stream ends with
    /// [`CallError::Timeout`] when it passes.
    ///
    /// # Errors
    /// As [`Peer::stream`].
    ///
    /// # Cancel safety
    /// As [`Peer::stream`].
    pub async fn stream_within<V: StreamVerb>(
        &self,
        _verb: V,
        args: V::Args,
        deadline: Duration,
    ) -> Result<ItemStream<V::Output>, CallError> {
        self.stream_as::<V>(&args, Some(deadline)).await
    }

    /// An untyped stream: any `cap` and `verb` text, args as raw CBOR,
    /// each item as raw CBOR. For tools (and tests) that speak to stream
    /// verbs they have no Rust type for; `deadline`, when given, bounds the
    /// whole stream as in [`Peer::stream_within`].
    ///
    /// ```
    /// use capwire::envelope::RawValue;
    /// use capwire::manifest::verb;
    /// use capwire::{Capability, HandlerError, Items, Node};
    ///
    /// verb! {
    ///     /// Counts down to 1.
    ///     struct Down: stream "app.count" / "down", Bootstrap, u32 => u32;
    /// }
    ///
    /// async fn down(from: u32, mut items: Items<u32>) -> Result<(), HandlerError> {
    ///     for n in (1..=from).rev() {
    ///         items.send(n).await?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let server = Node::builder("counter")
    ///     .listen("127.0.0.1:0".parse()?)
    ///     .capability(Capability::new("app.count", "1.0.0")?.stream(Down, down))
    ///     .start()
    ///     .await?;
    /// let client = Node::builder("client").start().await?;
    /// let peer = client.connect(&server.local_addrs()[0], Some(server.id())).await?;
    ///
    /// let args = RawValue::encode(&3u32)?;
    /// let mut items = peer.stream_raw("app.count", "down", &args, None).await?;
    /// let mut got = Vec::new();
    /// while let Some(item) = items.next().await {
    ///     got.push(item?.decode::<u32>()?);
    /// }
    /// assert_eq!(got, [3, 2, 1]);
    /// # client.shutdown().await;
    /// # server.shutdown().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Peer::stream`]; a verb the peer does not have is refused
    /// (`unknown_verb`) as the stream's last item. Nothing checks that the
    /// verb is a stream: a request verb opened this way runs once and its
    /// answer is dropped (the stream ends with no item), so look its kind
    /// up in [`Peer::manifest`] first.
    ///
    /// # Cancel safety
    /// As [`Peer::stream`].
    pub async fn stream_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        deadline: Option<Duration>,
    ) -> Result<ItemStream<RawValue>, CallError> {
        self.stream_with((cap, verb), deadline, |req_id, budget, trace| {
            codec::control(cap, verb, req_id, budget, args, trace)
        })
        .await
    }

    async fn stream_as<V: StreamVerb>(
        &self,
        args: &V::Args,
        deadline: Option<Duration>,
    ) -> Result<ItemStream<V::Output>, CallError> {
        self.stream_with((V::CAP, V::VERB), deadline, |req_id, budget, trace| {
            codec::control_of(V::CAP, V::VERB, req_id, budget, args, trace)
        })
        .await
    }

    /// Opens a stream on `cap`/`verb` whose control frame `encode` builds
    /// from its req_id, budget and trace item. The stream is one client
    /// span, with its items as events.
    pub(crate) async fn stream_with<T: serde::de::DeserializeOwned>(
        &self,
        (cap, verb): (&str, &str),
        deadline: Option<Duration>,
        encode: impl FnOnce(
            &ReqId,
            Option<u64>,
            Option<&[u8]>,
        ) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<ItemStream<T>, CallError> {
        let (span, cx) = self.span(cap, verb);
        let defaults = self.peers.stream_defaults();
        let deadline_at = deadline.map(deadline_after);
        let open_by = deadline_at.unwrap_or_else(|| deadline_after(self.default_deadline));
        let session = self.session(open_by).await?;
        if session.lock().version() < capwire_envelope::PROTOCOL_V2 {
            return Err(CallError::Unsupported(
                "the peer speaks protocol 1, which has no streams".to_owned(),
            ));
        }
        let req_id = self.peers.next_req_id();
        let budget = deadline_at.map(|d| {
            u64::try_from(d.saturating_duration_since(Instant::now()).as_millis())
                .unwrap_or(u64::MAX)
        });
        let trace = Self::trace_item(&session, cx.as_ref());
        let frame = encode(&req_id, budget, trace.as_deref())
            .map_err(|e| CallError::Encode(e.to_string()))?;
        self.peers
            .tap()
            .record(Way::Out, &self.id, &frame, None, true);
        let sink = session
            .open_stream(req_id.clone(), frame, defaults.window, open_by)
            .await
            .map_err(|e| self.lost_or(e))?;
        Ok(ItemStream::new(
            sink,
            session,
            req_id,
            deadline_at,
            defaults.idle,
            span,
        ))
    }
}
