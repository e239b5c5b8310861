//! Where the items of one of our streams wait between the session's driver
//! and the caller's [`ItemStream`](crate::ItemStream): a queue that needs no
//! bound of its own, since the session core delivers an item only within
//! the credit it granted (at most one window), and a peer that sends
//! beyond it loses the session instead.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use crate::proto::session::Reply;

/// What the consumer of a stream gets next.
#[derive(Debug)]
pub(crate) enum Next {
    /// An item (its encoded `item` value).
    Item(Bytes),
    /// The stream ended with this response.
    End(Reply),
    /// The session ended first.
    Lost,
}

#[derive(Debug, Default)]
enum Ended {
    #[default]
    Not,
    Answered(Reply),
    Lost,
    /// Told to the consumer.
    Told,
}

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Bytes>,
    end: Ended,
    waker: Option<Waker>,
}

/// The items of one stream, as the driver delivers them.
#[derive(Debug, Default)]
pub(crate) struct StreamSink {
    state: Mutex<State>,
}

impl StreamSink {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(mut state: MutexGuard<'_, State>) {
        let waker = state.waker.take();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// An item arrived (within credit).
    pub(crate) fn push(&self, item: Bytes) {
        let mut state = self.lock();
        if !matches!(state.end, Ended::Not) {
            return;
        }
        state.items.push_back(item);
        Self::wake(state);
    }

    /// The stream ended: `Some(reply)` with its response, `None` when the
    /// session ended first. Items before it are still taken first.
    fn finish(&self, end: Option<Reply>) {
        let mut state = self.lock();
        if matches!(state.end, Ended::Not) {
            state.end = end.map_or(Ended::Lost, Ended::Answered);
        }
        Self::wake(state);
    }

    /// The next item or the end, or `Pending` (after registering `cx`).
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        let mut state = self.lock();
        if let Some(item) = state.items.pop_front() {
            return Poll::Ready(Next::Item(item));
        }
        match std::mem::replace(&mut state.end, Ended::Told) {
            Ended::Answered(reply) => Poll::Ready(Next::End(reply)),
            // Once told, the end is told again as a loss: the consumer
            // stops at the first.
            Ended::Lost | Ended::Told => Poll::Ready(Next::Lost),
            Ended::Not => {
                state.end = Ended::Not;
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// Items waiting to be taken.
    pub(crate) fn buffered(&self) -> usize {
        self.lock().items.len()
    }
}

/// The end of one stream, held by the session core as the stream's waiter:
/// answered with the stream's response, or dropped (the session ended), in
/// which case the consumer is told the stream was lost.
#[derive(Debug)]
pub(crate) struct StreamEnd(Option<Arc<StreamSink>>);

impl StreamEnd {
    pub(crate) fn new(sink: Arc<StreamSink>) -> Self {
        Self(Some(sink))
    }

    /// The stream's response arrived.
    pub(crate) fn answer(mut self, reply: Reply) {
        if let Some(sink) = self.0.take() {
            sink.finish(Some(reply));
        }
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        if let Some(sink) = self.0.take() {
            sink.finish(None);
        }
    }
}
