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
//! use capwire::{Capability, HandlerError, Node};
//! use capwire::manifest::verb;
//!
//! verb! { pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
//!
//! async fn say(text: String) -> Result<String, HandlerError> {
//!     Ok(format!("echo: {text}"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Node::builder("echo")
//!     .listen("127.0.0.1:0".parse()?)
//!     .capability(Capability::new("app.echo", "1.0.0")?.handle(Say, say))
//!     .start()
//!     .await?;
//! let client = Node::builder("client").start().await?;
//!
//! let peer = client.connect(&server.local_addrs()[0], Some(server.id())).await?;
//! assert_eq!(peer.request(Say, "hi".into()).await?, "echo: hi");
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
mod client;
mod config;
mod control;
mod core;
mod dispatch;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
mod invite;
mod net;
mod node;
pub mod prometheus;
mod proto;
mod stats;
mod store;
mod tap;

pub use addr::{Addr, AddrParseError};
pub use client::Peer;
pub use config::Limits;
pub use core::configuration::ConfigWatch;
pub use core::events::ControlEvent;
pub use dispatch::error::HandlerError;
pub use dispatch::extract::{Context, Extensions, FromContext, Meta, Sender, State};
pub use dispatch::handler::Handler;
pub use dispatch::metrics::{MetricRow, MetricsSnapshot, Outcome};
pub use error::{CallError, NodeError};
pub use invite::{Invite, InviteParseError, MAX_INVITE_LEN};
pub use net::peers::Contact;
pub use net::session::Direction;
pub use node::builder::{Capability, NodeBuilder};
pub use node::handle::NodeHandle;
pub use node::{ManifestWatch, Node};
pub use proto::ledger::LedgerSizes;
pub use stats::{HandshakeFailure, NodeStats};
pub use store::StoreError;

pub use capwire_authz as authz;
pub use capwire_envelope as envelope;
pub use capwire_manifest as manifest;
pub use capwire_transport as transport;

pub use capwire_envelope::NodeId;
pub use capwire_transport::{ContactPolicy, Keypair, TransportConfig};

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
