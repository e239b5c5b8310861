//! capwire: capability-aware, authenticated messaging between the nodes of
//! an agent cluster.
//!
//! A [`Node`] has an X25519 identity, advertises a manifest of versioned
//! capabilities, and exchanges control envelopes with its peers over a
//! Noise XX channel. Every inbound envelope passes the chokepoint
//! (`control_auth_class` and the authorizer gate) before its arguments are
//! decoded and its handler runs.
//!
//! ```
//! use capwire::manifest::verb;
//! use capwire::{Capability, HandlerError, Node};
//! use serde::{Deserialize, Serialize};
//!
//! // An app's own args type. Its JSON Schema goes into the manifest; it is
//! // derived through capwire's re-export of schemars, so the app's
//! // Cargo.toml needs only capwire, tokio and serde.
//! #[derive(Serialize, Deserialize, capwire::JsonSchema)]
//! #[schemars(crate = "capwire::schemars")]
//! struct Greet {
//!     name: String,
//! }
//!
//! verb! {
//!     /// Any peer may ask for a greeting.
//!     struct Hello: request "app.greeter" / "hello", Bootstrap, Greet => String;
//! }
//!
//! async fn hello(args: Greet) -> Result<String, HandlerError> {
//!     Ok(format!("hello, {}", args.name))
//! }
//! # // Nothing but capwire's re-export can serve the derive above: this
//! # // empty module hides any `schemars` crate the doctest could see.
//! # mod schemars {}
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Node::builder("greeter")
//!     .listen("127.0.0.1:0".parse()?)
//!     .capability(Capability::new("app.greeter", "1.0.0")?.handle(Hello, hello))
//!     .start()
//!     .await?;
//! let client = Node::builder("client").start().await?;
//!
//! let peer = client.connect(&server.local_addrs()[0], Some(server.id())).await?;
//! let reply = peer.request(Hello, Greet { name: "world".into() }).await?;
//! assert_eq!(reply, "hello, world");
//!
//! // The peer's manifest (from its hello) carries the derived schema.
//! let manifest = peer.manifest().expect("a session is up");
//! let verb = manifest.capability("app.greeter").and_then(|c| c.verb("hello"));
//! let schema = verb.and_then(|v| v.args_schema.as_deref()).unwrap_or_default();
//! assert!(schema.contains("\"name\""));
//!
//! client.shutdown().await;
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! ```text
//!  peer ── Noise XX (capwire-transport) ── records ── frames (capwire-envelope)
//!                                                        │
//!            decide(): control_auth_class + gate (capwire-authz) ──deny──► error response
//!                                                        │ permit
//!                               args decode ─► handler ─► response (runtime-encoded)
//! ```
//!
//! # Custom argument types
//!
//! A verb's args and result are any types that implement serde's
//! `Serialize` and `Deserialize` and [`JsonSchema`]. capwire re-exports the
//! schema crate it is built with as [`capwire::schemars`](crate::schemars),
//! so an app derives the trait without a `schemars` dependency of its own
//! (and cannot pick a mismatched version): derive `capwire::JsonSchema` and
//! point the derive at the re-export with
//! `#[schemars(crate = "capwire::schemars")]`, as above. A `use
//! capwire::schemars;` in the module works too, instead of the attribute.
//! The [`verb!`](crate::manifest::verb) macro itself names only capwire's
//! own paths.
//!
//! # Binding a node
//!
//! [`Controller`](crate::manifest::DeclaredClass::Controller) verbs run
//! only for the node's bound control plane. The node opens a bind with
//! [`Node::invite`] (one line of text: its id, addresses and a one-time
//! code); the control plane connects and presents the code with
//! [`Peer::bind`] (or does both with [`Node::connect_invite`]). A node may
//! also narrow what its control plane may call with its own
//! [`Authorizer`](crate::authz::Authorizer), set with
//! [`NodeBuilder::authorizer`]; see `examples/authorizer.rs`.
//!
//! ```
//! use capwire::manifest::verb;
//! use capwire::envelope::ErrorCode;
//! use capwire::{Capability, HandlerError, Node};
//!
//! verb! { struct Reset: request "app.counter" / "reset", Controller, () => u64; }
//!
//! async fn reset(_args: ()) -> Result<u64, HandlerError> {
//!     Ok(0)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = Node::builder("counter")
//!     .listen("127.0.0.1:0".parse()?)
//!     .capability(Capability::new("app.counter", "1.0.0")?.handle(Reset, reset))
//!     .start()
//!     .await?;
//! let control_plane = Node::builder("control-plane").start().await?;
//! let peer = control_plane.connect(&node.local_addrs()[0], Some(node.id())).await?;
//!
//! // Not bound yet: the controller verb is refused before its handler runs.
//! let refused = peer.request(Reset, ()).await.unwrap_err();
//! assert_eq!(refused.code(), Some(&ErrorCode::Unauthorized));
//!
//! let invite = node.invite(None)?; // print it; the control plane pastes it
//! peer.bind(&invite).await?;
//! assert_eq!(node.controller(), Some(control_plane.id()));
//! assert_eq!(peer.request(Reset, ()).await?, 0);
//!
//! control_plane.shutdown().await;
//! node.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Threading model
//!
//! Each connection is served by **one task**, its driver, which owns the
//! stream in both directions, the record layer (sealing, opening,
//! packing, splitting) and, through a lock held for microseconds at a time,
//! the session's I/O-free state machine (`proto`). The driver reads what
//! the socket has, decides every envelope (chokepoint, ledger, bounds),
//! and polls each handler once right there: a handler that finishes
//! without waiting (most do) costs no task and no wake-up, and its
//! response goes into the very next write. A handler that waits moves to
//! a task of its own and hands its response back with one wake-up. Calls
//! from the application (`Peer::request`, `notify`) queue their frame
//! under the same lock and wake the driver: one hand-off. Besides the
//! drivers, a node runs one accept loop per listener, one dial loop per
//! contact, a task for each handshake in progress, one that expires the
//! pending bind, and one that sweeps the replay ledger.
//!
//! All of these are spawned on the tokio runtime that called
//! [`NodeBuilder::start`] (sessions opened by [`Node::connect`] on the
//! runtime that called it). Either flavour works; a current-thread
//! runtime must keep being driven (e.g. `block_on`) for the node to make
//! progress, and dropping that runtime ends the node's tasks.
//!
//! # Bounds
//!
//! What one peer can cost a node is bounded by [`Limits`]: jobs in flight
//! per session, bytes queued per session (responses waiting for the wire
//! included, so a peer that never reads fills its own queue, is no longer
//! read, and is dropped after `write_timeout`), bytes of notifications
//! waiting for a slot, calls waiting for answers, and its share of the
//! replay ledger (counted in bytes of whole entries; a sender only ever
//! releases its own). Inbound connections need a handshake permit before
//! they are accepted, pass an accept rate and a per-source bound, and must
//! send their first handshake message within a short deadline; inbound
//! and outbound sessions have separate budgets, with slots kept for
//! contacts and the bound control plane. Shutdown ends within
//! `shutdown_grace + close_timeout + 350 ms` whatever peers do.

mod addr;
mod audit;
mod authority;
mod client;
pub mod clock;
mod config;
mod contact;
mod control;
mod core;
mod dispatch;
mod error;
pub mod files;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod grants;
mod handle;
pub mod host;
pub mod identity;
mod invite;
pub mod json;
mod net;
mod node;
#[cfg(feature = "prometheus")]
pub mod prometheus;
mod proto;
#[doc(hidden)]
#[cfg_attr(not(feature = "seeded-bugs"), allow(dead_code))]
pub mod seeded_bugs;
mod stats;
mod store;
pub mod stream;
mod tap;
pub mod task;
mod tasks;
mod time;
pub mod trace;

pub use addr::{Addr, AddrParseError};
pub use audit::AuditStats;
pub use client::Peer;
pub use config::{Limits, MIN_AUDIT_BUDGET};
pub use contact::Contact;
pub use core::configuration::ConfigWatch;
pub use core::events::ControlEvent;
pub use dispatch::error::HandlerError;
pub use dispatch::extract::{Context, Extensions, FromContext, Meta, Sender, State};
pub use dispatch::handler::{Handler, StreamHandler, TaskHandler};
pub use dispatch::metrics::{MetricRow, MetricsSnapshot, Outcome};
pub use dispatch::raw::RawVerb;
pub use error::{CallError, NodeError};
pub use handle::NodeHandle;
pub use invite::{Invite, InviteParseError, MAX_INVITE_LEN};
pub use net::counters::Direction;
pub use net::counters::HandshakeFailure;
pub use node::builder::{Capability, NodeBuilder};
pub use node::{ManifestWatch, Node};
pub use proto::ledger::LedgerSizes;
pub use stats::NodeStats;
pub use store::StoreError;
pub use stream::{ItemStream, Items, StreamClosed};
pub use task::{Task, TaskError, TaskEvents, TaskHandle};

pub use capwire_authz as authz;
pub use capwire_envelope as envelope;
pub use capwire_manifest as manifest;
pub use capwire_transport as transport;

pub use capwire_envelope::NodeId;
pub use capwire_transport::{ContactPolicy, Keypair, TransportConfig};
// The schema crate of verb args and results, for apps' own types:
// `#[derive(capwire::JsonSchema)] #[schemars(crate = "capwire::schemars")]`.
pub use capwire_manifest::{JsonSchema, schemars};

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        send_sync::<crate::Node>();
        send_sync::<crate::Peer>();
        send_sync::<crate::Capability>();
        send_sync::<crate::NodeBuilder>();
        send_sync::<crate::CallError>();
        send_sync::<crate::NodeError>();
        send_sync::<crate::HandlerError>();
        send_sync::<crate::Context>();
        send_sync::<crate::MetricsSnapshot>();
        send_sync::<crate::NodeHandle>();
        send_sync::<crate::Extensions>();
    }
}
