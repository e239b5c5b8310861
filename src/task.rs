//! Tasks (protocol 2): long-running work that outlives the request and the
//! session that started it, durably.
//!
//! A task verb is declared with `verb!` and the kind `task`; submitting it
//! answers at once with a task id, and its handler then runs on the node,
//! with a [`Task`] to report progress, to ask its submitter for input, and
//! to see whether it was cancelled. Its result (or error) ends it. Every
//! event is written before the handler goes on, and `core.tasks` lets the
//! submitter and the node's control plane get, list, subscribe to, answer
//! and cancel it (WIRE.md 4.10):
//!
//! ```
//! use std::time::Duration;
//! use capwire::manifest::verb;
//! use capwire::{Capability, HandlerError, Node, Task};
//! # use capwire::manifest::TaskState;
//!
//! verb! {
//!     /// Counts to the number asked for, asking first whether to.
//!     struct Count: task "app.work" / "count", Bootstrap, u32 => u32;
//! }
//!
//! async fn count(to: u32, task: Task) -> Result<u32, HandlerError> {
//!     let go: bool = task.ask(&format!("count to {to}?"), Duration::from_secs(60)).await?;
//!     if !go {
//!         return Err(HandlerError::app("declined", "not counting").unwrap());
//!     }
//!     for n in 1..=to {
//!         task.progress(&n).await?; // durable before it returns
//!     }
//!     Ok(to)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Node::builder("worker")
//!     .listen("127.0.0.1:0".parse()?)
//!     .capability(Capability::new("app.work", "1.0.0")?.task(Count, count))
//!     .start()
//!     .await?;
//! let client = Node::builder("client").start().await?;
//! let peer = client.connect(&worker.local_addrs()[0], Some(worker.id())).await?;
//!
//! let task = peer.submit(Count, 3).await?; // the task's id, at once
//! let mut events = task.events(1).await?;
//! while let Some(event) = events.next().await {
//!     let event = event?;
//!     if event.state == TaskState::InputRequired {
//!         task.respond(&true).await?;
//!     }
//! }
//! assert_eq!(task.result().await?, 3);
//! # client.shutdown().await;
//! # worker.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! **Why a kind of its own.** A task is answered by an id, not by its
//! result, and its handler takes a [`Task`] and outlives the request: a
//! request verb run as a task would look like a request in the manifest
//! while answering otherwise, and its handler's shape would not say that it
//! can be resumed, asked for input or watched. The `task` kind says all of
//! it, to callers and to tools that read the manifest.

pub use crate::client::task::{TaskEvents, TaskHandle};
pub use crate::tasks::task::{Task, TaskError};
