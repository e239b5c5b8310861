//! Hosts: what provisions the child nodes of `core.cluster`.
//!
//! The cluster capability keeps the roster and decides; a [`Host`] only
//! runs children. Two hosts come with capwire: [`InProcessHost`] (each
//! child a full node in this process, on loopback) and [`ProcessHost`]
//! (each child a supervised `capwire node` process). A host backed by an
//! orchestrator (Kubernetes pods, systemd units) implements the same
//! trait; the capability does not change.
//!
//! Who controls a child: its parent owns its life (start, stop, restart)
//! through the host, and speaks to it only through the host's local
//! channel (a `Node` handle, a pipe, an orchestrator API), never over the
//! network. No control plane is bound to a new child. When the parent's
//! control plane asks for it (`core.cluster/set_monitoring`), the parent
//! has the host open a bind on the child reserved for that control plane,
//! and `core.cluster/contact` hands the control plane the child's invite;
//! once it binds, the control plane is the child's control plane like any
//! other node's.

pub(crate) mod in_process;
pub(crate) mod process;

use std::future::Future;
use std::pin::Pin;

use capwire_envelope::NodeId;
use capwire_manifest::MonitoringStatus;

use crate::addr::Addr;
use crate::invite::Invite;
use crate::net::peers::Contact;

pub use in_process::{ChildFactory, InProcessHost};
pub use process::ProcessHost;

/// A boxed future, as host methods return them (so that `dyn Host` works).
pub type HostFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, HostError>> + Send + 'a>>;

/// What the parent asks a host to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    /// The child id: stable for the child's life, also across restarts of
    /// the parent. A host keys the child's state (identity included) on it.
    pub cid: String,
    /// The child's name in the roster.
    pub name: String,
    /// Its bio.
    pub bio: String,
    /// Where it listened last time, if it ran before; a host should reuse
    /// these addresses when it can, so that the child's peers find it.
    pub addrs: Vec<Addr>,
}

/// A running child, as its host reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildInfo {
    /// The child's key.
    pub node_id: NodeId,
    /// Where it listens.
    pub addrs: Vec<Addr>,
    /// Its capabilities, as `id@version`.
    pub caps: Vec<String>,
}

/// Something that happened to a child on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostEvent {
    /// The child stopped without being asked to.
    Exited {
        /// Which child.
        cid: String,
        /// Why, in words (exit status, error).
        detail: String,
    },
    /// The child's monitoring changed: its status (a control plane bound
    /// it, or unbound it, or its pending bind opened, expired or was used
    /// up) or the control plane it is bound to (one bound it in place of
    /// another). A host also reports the state of a child it starts when
    /// that is not `off` with no controller (a child restarted with the
    /// binding it kept). A host keeps only each child's newest state for
    /// the parent: states the parent has not taken yet are replaced, not
    /// queued, so a quick succession may show only its last state.
    Monitoring {
        /// Which child.
        cid: String,
        /// Its status now.
        status: MonitoringStatus,
        /// The key of the control plane the child is bound to now; `None`
        /// when it is not bound. Lets the parent tell a child bound to its
        /// own control plane from one still bound to a former one.
        controller: Option<NodeId>,
    },
}

/// Why a host operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The host has no child with this id.
    #[error("no such child: {0}")]
    NotFound(String),
    /// The child could not be started, or failed while being asked.
    #[error("child failed: {0}")]
    Failed(String),
    /// The host is at its limit.
    #[error("host is at capacity: {0}")]
    Capacity(String),
}

/// Runs child nodes for `core.cluster`.
///
/// Every method may be called again after a crash of the parent for the
/// same child, so each must be idempotent: [`start`](Host::start) ensures
/// the child runs (adopting one that already does), [`stop`](Host::stop)
/// of an absent child succeeds. The parent bounds every call with
/// [`Limits::host_timeout`](crate::Limits::host_timeout).
pub trait Host: Send + Sync + 'static {
    /// Ensures the child runs; returns how to reach it.
    fn start(&self, spec: ChildSpec) -> HostFuture<'_, ChildInfo>;

    /// Stops the child and deletes what the host keeps for it (its
    /// identity included). An absent child is already stopped.
    fn stop(&self, cid: &str) -> HostFuture<'_, ()>;

    /// Opens a bind on the child that only `controller` can use; returns
    /// the child's invite (with the code).
    fn open_bind(&self, cid: &str, controller: NodeId) -> HostFuture<'_, Invite>;

    /// Unbinds the child's control plane and drops any open bind.
    fn close_bind(&self, cid: &str) -> HostFuture<'_, ()>;

    /// Makes `contact` a durable contact of the child.
    fn add_contact(&self, cid: &str, contact: Contact) -> HostFuture<'_, ()>;

    /// Takes the stream of [`HostEvent`]s; called once, when the parent
    /// starts. A host without events returns `None`.
    fn events(&self) -> Option<tokio::sync::mpsc::Receiver<HostEvent>>;

    /// The parent is shutting down: stop the children that cannot outlive
    /// it, keeping their state (they are started again by the parent's
    /// next run). Default: nothing (children run on their own).
    fn shutdown(&self) -> HostFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}
