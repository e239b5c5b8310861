//! `core.cluster`: the node's children (agent nodes it provisions), their
//! roster, and introductions between them.

use capwire_envelope::NodeId;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::manifest::MonitoringStatus;
use crate::monitoring::NoArgs;
use crate::verb;

/// The id of the cluster capability.
pub const CORE_CLUSTER: &str = "core.cluster";

/// Where a child is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChildStatus {
    /// Being created; its name is taken.
    Pending,
    /// Running.
    Running,
    /// Its process (or node) ended; it stays in the roster until removed.
    Exited,
    /// Being removed.
    Removing,
}

/// One child in the roster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The child id, unique for the life of the parent.
    pub cid: String,
    /// The child's name, unique in the roster.
    pub name: String,
    /// Free text about the child.
    pub bio: String,
    /// Free text: the persona the child's agent plays.
    pub persona: String,
    /// Whether the parent's control plane watches the child: `off`,
    /// `pending` (a bind for it is open on the child) or `on`.
    pub monitoring: MonitoringStatus,
    /// The child's capabilities, as `id@version`.
    pub caps: Vec<String>,
    /// Where the child is in its life.
    pub status: ChildStatus,
    /// The child's key, once it runs.
    #[schemars(with = "Option<String>")]
    pub node_id: Option<NodeId>,
    /// Where the child listens.
    pub addrs: Vec<String>,
}

/// The roster: every child and the version it is at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Roster {
    /// The children, by cid.
    pub members: Vec<Member>,
    /// Bumped on every change.
    pub version: u64,
}

/// Args of `core.cluster/create`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// The new child's name (1 to 64 bytes, unique).
    pub name: String,
    /// Its bio (at most 4096 bytes).
    #[serde(default)]
    pub bio: Option<String>,
}

/// Where and how a child runs, for a host backed by an orchestrator
/// (`core.cluster/create_placed`): its image, its limits, where it may be
/// placed. Every key may be absent: the host's default then holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// The image to run (a local image reference, e.g. `capwire:latest`).
    #[serde(default)]
    pub image: Option<String>,
    /// Memory limit, in bytes (at least 6 MiB).
    #[serde(default)]
    pub memory: Option<u64>,
    /// CPU limit, in thousandths of a CPU (`500` is half a CPU).
    #[serde(default)]
    pub cpus_milli: Option<u64>,
    /// Most processes (and threads) the child may run.
    #[serde(default)]
    pub pids: Option<u64>,
    /// How often the host restarts a child that failed before it gives
    /// up and reports it exited.
    #[serde(default)]
    pub restarts: Option<u32>,
    /// Placement constraints, in the orchestrator's own syntax (Swarm:
    /// `node.labels.zone==a`).
    #[serde(default)]
    pub constraints: Vec<String>,
    /// Extra labels, `key=value`, put on what the host makes.
    #[serde(default)]
    pub labels: Vec<String>,
}

impl Placement {
    /// `true` when nothing is asked for (the host's defaults hold).
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Args of `core.cluster/create_placed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePlacedArgs {
    /// The new child's name (1 to 64 bytes, unique).
    pub name: String,
    /// Its bio (at most 4096 bytes).
    #[serde(default)]
    pub bio: Option<String>,
    /// Where and how it runs.
    pub placement: Placement,
}

/// What a child's host reports of it: `running`, `restarting`, `exited`
/// (with its code, and whether it was killed for memory), or the
/// roster's own `pending` and `removing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Being created.
    Pending,
    /// Running.
    Running,
    /// Stopped, and its host is starting it again (a restart policy).
    Restarting,
    /// Stopped, and not started again (yet).
    Exited,
    /// Being removed.
    Removing,
}

/// One child's state, as its host reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildState {
    /// The child id.
    pub cid: String,
    /// Where it is.
    pub state: RunState,
    /// The exit code of its last exit; `None` when it never exited or
    /// its host does not know one.
    pub exit_code: Option<i64>,
    /// Its last exit was a kill for going over its memory limit.
    pub oom_killed: bool,
    /// How often its host started it again on its own.
    pub restarts: u64,
    /// The host's own words (at most 1024 bytes); may be empty.
    pub detail: String,
}

/// Result of `core.cluster/states`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildStates {
    /// One state per member, by cid.
    pub children: Vec<ChildState>,
    /// The roster version the states go with.
    pub version: u64,
}

/// Args naming one child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildArgs {
    /// The child id.
    pub cid: String,
}

/// Args of `core.cluster/set_bio`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBioArgs {
    /// The child id.
    pub cid: String,
    /// The new bio (at most 4096 bytes).
    pub bio: String,
}

/// Args of `core.cluster/set_persona`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPersonaArgs {
    /// The child id.
    pub cid: String,
    /// The new persona (at most 4096 bytes).
    pub persona: String,
}

/// Args of `core.cluster/set_monitoring`. The control plane that will
/// watch the child is the parent's bound control plane, never named here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetMonitoringArgs {
    /// The child id.
    pub cid: String,
    /// `true`: open a bind on the child reserved for the parent's control
    /// plane; `false`: unbind the child.
    pub enabled: bool,
}

/// Result of `core.cluster/contact`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContactReply {
    /// The child's invite in its text form: key, addresses and, while its
    /// monitoring is `pending`, the bind code.
    pub invite: String,
}

/// Args of `core.cluster/introduce`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntroducePairArgs {
    /// One child id.
    pub peer_a: String,
    /// Another child id.
    pub peer_b: String,
}

verb! {
    /// `core.cluster/list` (controller): the roster.
    pub struct ClusterList: request "core.cluster" / "list", Controller, NoArgs => Roster;
}

verb! {
    /// `core.cluster/create` (controller): provisions a child; `duplicate`
    /// when the name is taken (pending creates included), `timeout` when
    /// the host does not have it running in time.
    pub struct ClusterCreate: request "core.cluster" / "create", Controller, CreateArgs => Member;
}

verb! {
    /// `core.cluster/create_placed` (controller, core.cluster 1.1): as
    /// `create`, with where and how the child runs; `bad_args` when the
    /// host refuses the placement (before anything is made).
    pub struct ClusterCreatePlaced: request "core.cluster" / "create_placed", Controller, CreatePlacedArgs => Member;
}

verb! {
    /// `core.cluster/states` (controller, core.cluster 1.1): what the host
    /// reports of each child (running, restarting, exited with its code,
    /// killed for memory).
    pub struct ClusterStates: request "core.cluster" / "states", Controller, NoArgs => ChildStates;
}

verb! {
    /// `core.cluster/remove` (controller): stops and forgets a child; an
    /// absent child is already removed (success).
    pub struct ClusterRemove: request "core.cluster" / "remove", Controller, ChildArgs => ();
}

verb! {
    /// `core.cluster/set_bio` (controller).
    pub struct ClusterSetBio: request "core.cluster" / "set_bio", Controller, SetBioArgs => Member;
}

verb! {
    /// `core.cluster/set_persona` (controller).
    pub struct ClusterSetPersona: request "core.cluster" / "set_persona", Controller, SetPersonaArgs => Member;
}

verb! {
    /// `core.cluster/set_monitoring` (controller); `not_bound` when the
    /// parent has no control plane.
    pub struct ClusterSetMonitoring: request "core.cluster" / "set_monitoring", Controller, SetMonitoringArgs => Member;
}

verb! {
    /// `core.cluster/contact` (controller): the child's invite.
    pub struct ClusterContact: request "core.cluster" / "contact", Controller, ChildArgs => ContactReply;
}

verb! {
    /// `core.cluster/introduce` (controller): the two children become each
    /// other's contacts; `bad_args` if they are the same, `not_found` if
    /// either is unknown.
    pub struct ClusterIntroduce: request "core.cluster" / "introduce", Controller, IntroducePairArgs => ();
}

verb! {
    /// `core.cluster/roster` (notification, bootstrap): the roster, pushed
    /// by a parent to its control plane after every change. Every node
    /// accepts it and hands it to its application with the sender's key.
    pub struct ClusterRoster: notification "core.cluster" / "roster", Bootstrap, Roster;
}
