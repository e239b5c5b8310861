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

pub use crate::client::stream::ItemStream;
pub use crate::dispatch::items::{Items, StreamClosed};
