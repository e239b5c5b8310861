//! Capability declarations, the registry and the manifest of a capwire node.
//!
//! One declaration per verb gives the manifest peers see, the chokepoint's
//! classification and the dispatch route:
//!
//! ```text
//!   verb! / VerbSpec ──► Capability ──► RegistryBuilder::build ──► Registry<H>
//!                                        (checks invariants)         │
//!                       Manifest ◄── Registry::manifest ◄────────────┤
//!            chokepoint (capwire-authz) ◄── Registry::lookup ◄───────┘
//! ```
//!
//! ```
//! use capwire_envelope::NodeId;
//! use capwire_manifest::{
//!     Capability, CapRequirement, MonitoringHandlers, MonitoringStatus, NodeInfo, Registry,
//!     VerbDef, Version, verb,
//! };
//!
//! // The args schema goes into the manifest; derive it through this
//! // crate's copy of schemars, so the app needs no schemars of its own.
//! #[derive(serde::Serialize, serde::Deserialize, capwire_manifest::JsonSchema)]
//! #[schemars(crate = "capwire_manifest::schemars")]
//! pub struct SayArgs { pub text: String }
//!
//! verb! {
//!     /// Echoes `text` back to any contact.
//!     pub struct Say: request "app.echo" / "say", Bootstrap, SayArgs => String;
//! }
//!
//! // `H` is whatever the runtime stores as a handler; here, a name.
//! let registry = Registry::builder(
//!     NodeInfo::new(NodeId::from_bytes([7; 32]), "echo-app"),
//!     MonitoringHandlers { bind: "bind", disable: "disable" },
//! )
//! .capability(Capability::new("app.echo", Version::new(1, 2, 0)).verb::<Say>("say"))
//! .build()?;
//!
//! let route = registry.lookup(Say::CAP, Say::VERB).expect("declared");
//! assert_eq!(route.info().verb().as_str(), "say");
//! assert!(registry.lookup("app.echo", "Say").is_none()); // exact bytes only
//!
//! let manifest = registry.manifest(MonitoringStatus::Off, 1);
//! assert!(manifest.capability("core.monitoring").is_some()); // always present
//! let wanted: CapRequirement = "app.echo@^1.2".parse()?;
//! assert_eq!(manifest.require(&wanted)?.version, Version::new(1, 2, 0));
//! # Ok::<(), capwire_manifest::ManifestError>(())
//! ```
//!
//! # Layout
//!
//! One file per concern, in layers; a file imports only from the layers
//! below it (the `mod` list below follows the same order, bottom first):
//!
//! ```text
//!   tracker                      the current manifest, epoch by epoch
//!   registry                     declarations checked into routes and a manifest
//!   validate                     the rules every manifest keeps
//!   configuration, connect, cluster   the other core capabilities' verbs
//!   monitoring, spec             core.monitoring; capability and verb declarations
//!   manifest                     the manifest's wire format
//!   error, verb                  ManifestError; typed verbs and verb!
//!   class, limits, requirement   leaves: classes and kinds, size bounds, CapRequirement
//! ```

mod class;
mod limits;
mod requirement;

mod error;
mod verb;

mod manifest;

mod audit;
mod cluster;
mod configuration;
mod connect;
mod grants;
mod monitoring;
mod protocol;
mod spec;
mod tasks;

mod validate;

mod registry;

mod tracker;

pub use audit::{
    AuditCheckpoint, AuditEntries, AuditProve, CheckpointReply, EntriesArgs, EntryItem,
    MAX_ENTRIES_PER_CALL, ProveArgs, ProveReply,
};
pub use class::{AuthClass, DeclaredClass, VerbKind};
pub use cluster::{
    CORE_CLUSTER, ChildArgs, ChildState, ChildStates, ChildStatus, ClusterContact, ClusterCreate,
    ClusterCreatePlaced, ClusterIntroduce, ClusterList, ClusterRemove, ClusterRoster,
    ClusterSetBio, ClusterSetMonitoring, ClusterSetPersona, ClusterStates, ContactReply,
    CreateArgs, CreatePlacedArgs, IntroducePairArgs, Member, Placement, Roster, RunState,
    SetBioArgs, SetMonitoringArgs, SetPersonaArgs,
};
pub use configuration::{
    CORE_CONFIGURATION, ConfigValue, GetConfig, SetConfig, SetConfigArgs, SetConfigReply,
};
pub use connect::{CORE_CONNECT, ConnectIntroduce, IntroduceArgs, IntroduceReply};
pub use error::ManifestError;
pub use grants::{
    CORE_GRANTS, GrantsInfo, GrantsInfoRead, GrantsPresent, GrantsRevoke, PresentArgs,
    PresentReply, RevokeArgs,
};
pub use limits::{
    MAX_APP_ID_LEN, MAX_CAPABILITIES, MAX_DESCRIPTION_LEN, MAX_MANIFEST_LEN, MAX_NAME_LEN,
    MAX_PARAMS_LEN, MAX_SCHEMA_LEN, MAX_VERBS,
};
pub use manifest::{CapabilityManifest, Manifest, MonitoringStatus, VerbManifest};
pub use monitoring::{
    BindArgs, BindReply, CORE_MONITORING, CopyDirection, CopyRecord, MonitoringBind,
    MonitoringCopy, MonitoringDisable, MonitoringStatusRead, MonitoringStatusReply, NoArgs,
};
pub use protocol::{
    CORE_AUDIT, CORE_PROTOCOL, PARTIAL_VIEW, ProtocolVersions, VersionsReply, capability_since,
    is_protocol_2_capability,
};
pub use registry::{MonitoringHandlers, NodeInfo, Registry, RegistryBuilder, Route, VerbInfo};
pub use requirement::CapRequirement;
// The schema crate of `VerbDef::Args` and `Output`, so that an app derives
// `JsonSchema` without a `schemars` dependency of its own (and at the very
// version these bounds name).
pub use schemars;
pub use schemars::JsonSchema;
pub use semver::{Version, VersionReq};
pub use spec::{Capability, VerbSpec};
pub use tasks::{
    CORE_TASKS, ListTasksArgs, RespondArgs, SubscribeArgs, TaskChanged, TaskEvent, TaskEventKind,
    TaskInfo, TaskList, TaskRef, TaskState, TaskSubmitted, TasksCancel, TasksChanged, TasksGet,
    TasksList, TasksRespond, TasksSubscribe,
};
pub use tracker::ManifestTracker;
pub use verb::{
    NotificationVerb, RequestVerb, StreamVerb, TaskVerb, UnaryVerb, VerbDef, cap_id_is_well_formed,
    verb_is_well_formed,
};
