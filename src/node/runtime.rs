//! The composition root: builds every part of a node in dependency order
//! and owns them.
//!
//! ```text
//!  registry ─► binding ─► ledger ─► manifest tracker ─► peers (hello, budgets)
//!      └──────────────────────────────┐                   │
//!                                  control ◄──────────────┘
//!                                     │ (handles for handlers)
//!                                 dispatcher (registry, gate, binding, ledger, metrics)
//!                                     │
//!                          net (endpoint, accept bounds, drivers) ─► listeners, contacts
//! ```

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capwire_authz::{Authorizer, BindingState, Gate, SharedBinding};
use capwire_envelope::{Limits as WireLimits, NodeId};
use capwire_manifest::{ManifestTracker, MonitoringHandlers, NodeInfo, Registry};
use capwire_transport::{
    ContactPolicy, Endpoint, EntropySource, Keypair, OsEntropy, TransportConfig, canonical_node_id,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::addr::Addr;
use crate::config::Limits;
use crate::control::{Control, hello_for};
use crate::core::monitoring::{self, ControlHandle};
use crate::dispatch::Dispatcher;
use crate::dispatch::extract::Extensions;
use crate::dispatch::handler::RouteHandler;
use crate::error::NodeError;
use crate::net::Net;
use crate::net::accept::{AcceptGate, AcceptLimits};
use crate::net::conn::{ConnEnv, Timing};
use crate::net::peers::{BudgetLimits, Contact, Peers};
use crate::node::handle::NodeHandle;
use crate::proto::ledger::{Ledger, LedgerLimits};
use crate::proto::session::SessionLimits;

/// How often the replay ledger is swept of expired entries.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// What [`build`] starts from (what the node builder collected).
pub(crate) struct Parts {
    pub(crate) app_id: String,
    pub(crate) name: Option<String>,
    pub(crate) description: String,
    pub(crate) keypair: Option<Keypair>,
    pub(crate) policy: ContactPolicy,
    pub(crate) caps: Vec<capwire_manifest::Capability<RouteHandler>>,
    pub(crate) limits: Limits,
    pub(crate) transport: TransportConfig,
    pub(crate) extensions: Extensions,
    pub(crate) authorizer: Option<Arc<dyn Authorizer>>,
    pub(crate) controller: Option<NodeId>,
}

/// Everything a running node owns.
pub(crate) struct Runtime {
    pub(crate) id: NodeId,
    pub(crate) limits: Limits,
    pub(crate) net: Arc<Net>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) control: Arc<Control>,
    pub(crate) handle: NodeHandle,
    pub(crate) tracker: TaskTracker,
    /// Stops the node's own background tasks (expiry, sweeping).
    pub(crate) stop_background: CancellationToken,
    pub(crate) stop_handlers: CancellationToken,
    pub(crate) local_addrs: Mutex<Vec<Addr>>,
    pub(crate) shutdown: tokio::sync::Mutex<bool>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Builds a node's parts. Nothing runs yet.
pub(crate) fn build(p: Parts) -> Result<Runtime, NodeError> {
    p.limits.validate().map_err(NodeError::Config)?;
    p.transport.validate()?;
    let keypair = match p.keypair {
        Some(k) => k,
        None => Keypair::generate()?,
    };
    let id = keypair.public();
    let limits = p.limits;

    let mut info = NodeInfo::new(id, p.app_id).with_description(p.description);
    if let Some(name) = p.name {
        info = info.with_name(name);
    }
    let mut registry = Registry::builder(
        info,
        MonitoringHandlers {
            bind: monitoring::bind_handler(),
            disable: monitoring::disable_handler(),
        },
    );
    for cap in p.caps {
        registry = registry.capability(cap);
    }
    let registry = Arc::new(registry.build()?);

    let binding = Arc::new(SharedBinding::new(BindingState::restore(
        p.controller.map(|c| canonical_node_id(&c)),
    )));
    let ledger = Ledger::new(LedgerLimits {
        window: limits.replay_window,
        max_bytes: limits.replay_max_bytes,
        sender_max_bytes: limits.replay_sender_max_bytes,
    });
    let now = tokio::time::Instant::now().into_std();
    let tracker_state = ManifestTracker::new(&*registry, binding.status(now));
    let wire_limits = WireLimits {
        max_record: u32::try_from(p.transport.max_record_size).unwrap_or(u32::MAX),
        max_inflight: u32::try_from(limits.max_inflight_per_session).unwrap_or(u32::MAX),
        keepalive_ms: u32::try_from(p.transport.keepalive_interval.as_millis()).unwrap_or(u32::MAX),
    };
    let hello = hello_for(tracker_state.manifest(), wire_limits)?;

    // Request ids continue from a random point, so that a node restarted
    // with the same identity does not reuse the ids of its previous run
    // while its peers still remember their answers.
    let mut start = [0u8; 8];
    OsEntropy
        .try_fill(&mut start)
        .map_err(|_| capwire_transport::TransportError::Rng)?;
    let first_req = u64::from_le_bytes(start) >> 1;

    let stopping = CancellationToken::new();
    let peers = Arc::new(Peers::new(
        id,
        binding.clone(),
        hello,
        BudgetLimits {
            inbound: limits.max_inbound_sessions,
            outbound: limits.max_outbound_sessions,
            reserved: limits.reserved_sessions,
        },
        first_req,
        stopping,
    ));

    let gate = match p.authorizer {
        Some(a) => Gate::from_arc(a),
        None => Gate::default(),
    };
    let control = Arc::new(Control::new(
        binding.clone(),
        tracker_state,
        registry.clone(),
        peers.clone(),
        wire_limits,
    ));
    let handle = NodeHandle::new(id, peers.clone(), control.clone(), limits.default_deadline);
    let mut extensions = p.extensions;
    extensions.insert_runtime(ControlHandle(control.clone()));
    extensions.insert_runtime(handle.clone());
    let dispatcher = Arc::new(
        Dispatcher::new(
            registry,
            gate,
            binding,
            ledger,
            Arc::new(extensions),
            limits.max_handler_time,
        )
        .map_err(NodeError::Config)?,
    );

    let endpoint = Endpoint::try_new(keypair, p.transport.clone(), p.policy)?;
    let tracker = TaskTracker::new();
    let stop_handlers = CancellationToken::new();
    let env = Arc::new(ConnEnv {
        dispatcher: dispatcher.clone(),
        tracker: tracker.clone(),
        hooks: peers.clone(),
        timing: Timing {
            keepalive: p.transport.keepalive_interval,
            idle: p.transport.idle_timeout,
            write_timeout: limits.write_timeout,
            close_timeout: limits.close_timeout,
        },
        close_all: CancellationToken::new(),
    });
    let net = Arc::new(Net {
        endpoint,
        peers: peers.clone(),
        env,
        dispatcher: dispatcher.clone(),
        session_limits: SessionLimits {
            max_inflight: limits.max_inflight_per_session,
            max_pending_calls: limits.max_pending_calls_per_session,
            max_queued_bytes: limits.max_queued_bytes_per_session,
            max_parked_bytes: limits.max_parked_bytes_per_session,
            max_record: p.transport.max_record_size,
            hello_timeout: limits.hello_timeout,
        },
        accept: Arc::new(AcceptGate::new(AcceptLimits {
            max_handshakes: p.transport.max_concurrent_handshakes,
            per_source: limits.max_handshakes_per_source,
            rate_per_sec: limits.accept_rate,
            burst: limits.accept_burst,
        })),
        tracker: tracker.clone(),
        stop_handlers: stop_handlers.clone(),
        connect_timeout: limits.connect_timeout,
        refused: AtomicU64::new(0),
    });
    Ok(Runtime {
        id,
        limits,
        net,
        peers,
        dispatcher,
        control,
        handle,
        tracker,
        stop_background: CancellationToken::new(),
        stop_handlers,
        local_addrs: Mutex::new(Vec::new()),
        shutdown: tokio::sync::Mutex::new(false),
    })
}

impl Runtime {
    /// Starts the node's own background tasks: pending-bind expiry and
    /// ledger sweeping.
    pub(crate) fn spawn_background(&self) {
        let control = self.control.clone();
        let stop = self.stop_background.clone();
        self.tracker.spawn(control.expire_pending(stop));
        let dispatcher = self.dispatcher.clone();
        let stop = self.stop_background.clone();
        self.tracker.spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {
                        dispatcher.ledger().sweep(tokio::time::Instant::now().into_std());
                    }
                }
            }
        });
    }

    /// Starts the dial loop of `contact`.
    pub(crate) fn start_contact(&self, contact: Contact) {
        let token = self.peers.add_contact(contact.clone());
        let net = self.net.clone();
        let reconnect = (self.limits.reconnect_initial, self.limits.reconnect_max);
        self.tracker.spawn(crate::net::dialer::contact_loop(
            net, contact, token, reconnect,
        ));
    }
}
