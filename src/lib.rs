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

mod addr;
mod backoff;
mod config;
mod dispatch;
mod error;
mod handler;
mod ledger;
mod metrics;
mod monitoring;
mod node;
mod peer;
mod session;

pub use addr::{Addr, AddrParseError};
pub use config::Limits;
pub use error::{CallError, NodeError};
pub use handler::{Context, FromContext, Handler, HandlerError, Meta, Sender, State};
pub use metrics::{MetricRow, MetricsSnapshot, Outcome};
pub use node::{Capability, Contact, Invite, Node, NodeBuilder};
pub use peer::Peer;

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
    }
}
