//! Hosts: what provisions the child nodes of `core.cluster`.
//!
//! The cluster capability keeps the roster and decides; a [`Host`] only
//! runs children. Two hosts come with capwire: [`InProcessHost`] (each
//! child a full node in this process, on loopback) and [`ProcessHost`]
//! (each child a supervised `capwire node` process). With the `docker`
//! feature, two more drive the Docker Engine API: `DockerHost` (each
//! child a container) and `SwarmHost` (each child a Swarm service). A
//! host backed by another orchestrator (Kubernetes StatefulSets, systemd
//! units) implements the same trait; the capability does not change.
//!
//! What a host is asked, and what it answers:
//!
//! ```text
//!  core.cluster ──check(spec)──────────► refuse a placement it cannot honour
//!               ──start(spec)──────────► ChildInfo (node id, addresses, caps)
//!               ──stop / open_bind / close_bind / add_contact
//!               ──retain(parent, keep)─► remove what it runs for `parent`
//!                                        that the roster no longer has
//!               ◄──events()─────────── Exited, Monitoring, Run (state,
//!                                        exit code, OOM kill, restarts)
//! ```
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

#[cfg(feature = "docker")]
pub(crate) mod docker;
#[cfg(feature = "docker")]
pub(crate) mod engine;
#[cfg(feature = "docker")]
pub mod image;
pub(crate) mod in_process;
pub(crate) mod pipe;
pub(crate) mod process;
#[cfg(feature = "docker")]
pub(crate) mod swarm;

use std::future::Future;
use std::pin::Pin;

use capwire_envelope::NodeId;
use capwire_manifest::MonitoringStatus;

use crate::addr::Addr;
use crate::contact::Contact;
use crate::invite::Invite;

pub use capwire_manifest::{Placement, RunState};
#[cfg(feature = "docker")]
pub use docker::DockerHost;
#[cfg(feature = "docker")]
pub use engine::{EngineConfig, Network};
pub use in_process::{ChildFactory, InProcessHost};
pub use process::ProcessHost;
#[cfg(feature = "docker")]
pub use swarm::SwarmHost;

/// A boxed future, as host methods return them (so that `dyn Host` works).
pub type HostFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, HostError>> + Send + 'a>>;

/// What the parent asks a host to run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// The parent's key: a host backed by an orchestrator labels what it
    /// makes with it, so that the parent finds its own children again.
    pub parent: Option<NodeId>,
    /// Where and how the child runs (image, limits, placement); empty:
    /// the host's defaults. A host that cannot honour it refuses it in
    /// [`Host::check`].
    pub placement: Placement,
}

/// How a child runs, as its host reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRun {
    /// Where it is.
    pub state: RunState,
    /// The exit code of its last exit, if it exited.
    pub exit_code: Option<i64>,
    /// Its last exit was a kill for going over its memory limit.
    pub oom_killed: bool,
    /// How often its host (or orchestrator) started it again on its own.
    pub restarts: u64,
    /// In words.
    pub detail: String,
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
    /// The orchestrator reports a change of the child's run: it exited
    /// (with its code, killed for memory or not), is being restarted, or
    /// runs again (then with how to reach it: a restarted child keeps its
    /// identity, its addresses may change).
    Run {
        /// Which child.
        cid: String,
        /// Its run now.
        run: ChildRun,
        /// How to reach it, when it runs again.
        info: Option<ChildInfo>,
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
    /// The child cannot run as asked (a placement the host cannot honour,
    /// limits that make no sense); refused before anything is made.
    #[error("refused: {0}")]
    Refused(String),
    /// What the host needs is not there (an orchestrator that does not
    /// answer, an image that does not exist); nothing was made.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// Runs child nodes for `core.cluster`.
///
/// Every method may be called again after a crash of the parent for the
/// same child, so each must be idempotent: [`start`](Host::start) ensures
/// the child runs (adopting one that already does), [`stop`](Host::stop)
/// of an absent child succeeds. The parent bounds every call with
/// [`Limits::host_timeout`](crate::Limits::host_timeout).
pub trait Host: Send + Sync + 'static {
    /// Checks, before anything is made, that the host can run `spec` as
    /// asked: [`HostError::Refused`] otherwise. Default: a host that takes
    /// no placement refuses any.
    fn check(&self, spec: &ChildSpec) -> Result<(), HostError> {
        if spec.placement.is_empty() {
            Ok(())
        } else {
            Err(HostError::Refused(
                "this host runs children on the parent's machine: it takes no \
                 image, limits or placement"
                    .to_owned(),
            ))
        }
    }

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

    /// Removes what the host runs for `parent` whose cid is not in
    /// `keep` (left over by a parent that crashed between its steps), so
    /// that nothing is orphaned. Called when the parent starts, once its
    /// roster is reconciled. Default: nothing (a host whose children end
    /// with the parent leaves none over).
    fn retain(&self, parent: NodeId, keep: Vec<String>) -> HostFuture<'_, ()> {
        let _ = (parent, keep);
        Box::pin(async { Ok(()) })
    }

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
