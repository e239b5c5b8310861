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
use crate::audit::AuditLog;
use crate::authority::Authorities;
use crate::clock::{Clock, WallClock};
use crate::config::Limits;
use crate::control::{Control, hello_for};
use crate::core::answers::AnswerLimits;
use crate::core::audit as core_audit;
use crate::core::grant_state::GrantState;
use crate::core::monitoring;
use crate::core::state::{Core, CoreLimits, CoreState, Dialer};
use crate::core::{
    cluster, configuration, connect, grants as core_grants, protocol, tasks as core_tasks,
};
use crate::dispatch::Dispatcher;
use crate::dispatch::extract::Extensions;
use crate::dispatch::extract::Tasks;
use crate::dispatch::handler::RouteHandler;
use crate::error::NodeError;
use crate::handle::NodeHandle;
use crate::host::{Host, InProcessHost};
use crate::net::Net;
use crate::net::accept::{AcceptGate, AcceptLimits};
use crate::net::conn::{ConnEnv, Timing};
use crate::net::peers::{BudgetLimits, Contact, Peers, StreamDefaults};
use crate::proto::ledger::{Ledger, LedgerLimits};
use crate::proto::session::SessionLimits;
use crate::proto::streams::Window;
use crate::store::memory::MemoryStore;
use crate::store::{Batch, Loaded, Store};
use crate::tap::{Tap, TapLimits};
use crate::tasks::{TaskLimits, TaskService};

/// How often the replay ledger is swept of expired entries.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How often the clock's floor is written, when the clock was read for
/// an expiry since: at most one small write a second.
const FLOOR_EVERY: Duration = Duration::from_secs(1);

/// What [`build`] starts from (what the node builder collected).
pub(crate) struct Parts {
    pub(crate) app_id: String,
    pub(crate) name: Option<String>,
    pub(crate) description: String,
    pub(crate) keypair: Option<Keypair>,
    pub(crate) policy: ContactPolicy,
    pub(crate) caps: Vec<capwire_manifest::Capability<RouteHandler>>,
    /// The capabilities whose args the audit log keeps.
    pub(crate) audit_args: Vec<String>,
    pub(crate) limits: Limits,
    pub(crate) transport: TransportConfig,
    pub(crate) extensions: Extensions,
    pub(crate) authorizer: Option<Arc<dyn Authorizer>>,
    pub(crate) controller: Option<NodeId>,
    pub(crate) state_dir: Option<std::path::PathBuf>,
    pub(crate) host: Option<Arc<dyn Host>>,
    pub(crate) wall_clock: Option<Arc<dyn WallClock>>,
}

/// The node's state, opened (off the executor) before the node is built.
pub(crate) struct Opened {
    pub(crate) keypair: Keypair,
    pub(crate) store: Arc<dyn Store>,
    /// A real disk is behind the store: commits go to a blocking thread.
    pub(crate) blocking: bool,
    pub(crate) loaded: Loaded,
    pub(crate) dir: Option<std::path::PathBuf>,
}

/// Opens the state directory of `parts` (or a store in memory) and reads it.
///
/// # Errors
/// The directory or its store cannot be used; a given keypair that is not
/// the directory's.
pub(crate) fn open_state(
    dir: Option<std::path::PathBuf>,
    keypair: Option<Keypair>,
) -> Result<Opened, NodeError> {
    match dir {
        Some(dir) => {
            let state = crate::store::dir::StateDir::open(&dir, keypair)?;
            let store: Arc<dyn Store> = state.store();
            let loaded = store.load()?;
            Ok(Opened {
                keypair: state.keypair().clone(),
                store,
                blocking: true,
                loaded,
                dir: Some(dir),
            })
        }
        None => Ok(Opened {
            keypair: match keypair {
                Some(k) => k,
                None => Keypair::generate()?,
            },
            store: Arc::new(MemoryStore::new()),
            blocking: false,
            loaded: Loaded::default(),
            dir: None,
        }),
    }
}

/// Everything a running node owns.
pub(crate) struct Runtime {
    pub(crate) id: NodeId,
    pub(crate) limits: Limits,
    pub(crate) net: Arc<Net>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) control: Arc<Control>,
    pub(crate) core: Arc<CoreState>,
    pub(crate) tasks: Arc<TaskService>,
    pub(crate) handle: NodeHandle,
    pub(crate) tracker: TaskTracker,
    /// Answers found expired when the store was read, to delete.
    pub(crate) expired_answers: Mutex<Vec<crate::store::AnswerKey>>,
    /// The contacts the store held when the node started, to dial.
    pub(crate) durable_contacts: Mutex<Vec<Contact>>,
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

/// Opens the node's audit log: in the state directory's `audit/`, in
/// memory without one, or off.
fn open_audit(
    dir: Option<&std::path::Path>,
    keypair: &Keypair,
    limits: &Limits,
) -> Result<AuditLog, NodeError> {
    let segments: Box<dyn crate::audit::segments::Segments> = match dir {
        Some(dir) if limits.audit => Box::new(
            crate::audit::segments::DirSegments::open(&dir.join("audit"))
                .map_err(|e| NodeError::Config(format!("the audit log's directory: {e}")))?,
        ),
        _ => Box::<crate::audit::segments::MemorySegments>::default(),
    };
    // In memory, the log keeps at most 16 MiB whatever the budget.
    let budget = match dir {
        Some(_) => limits.audit_max_bytes,
        None => limits.audit_max_bytes.min(16 << 20),
    };
    AuditLog::open(
        segments,
        &keypair.secret_bytes(),
        &keypair.public(),
        budget,
        limits.audit,
    )
    .map_err(|e| NodeError::Config(format!("the audit log: {e}")))
}

/// Builds a node's parts. Nothing runs yet.
pub(crate) fn build(p: Parts, opened: Opened) -> Result<Runtime, NodeError> {
    p.limits.validate().map_err(NodeError::Config)?;
    p.transport.validate()?;
    let Opened {
        keypair,
        store,
        blocking,
        mut loaded,
        dir,
    } = opened;
    let task_records = std::mem::take(&mut loaded.tasks);
    let id = keypair.public();
    let grants = Arc::new(GrantState::new(
        &keypair.secret_bytes(),
        loaded
            .binding
            .as_ref()
            .map(|b| (b.epoch, b.grant_key.as_deref())),
        loaded.revocations.take(),
        Arc::new({
            let clock = match p.wall_clock {
                Some(c) => Clock::new(c),
                None => Clock::default(),
            };
            if let Some(floor) = loaded.clock_floor_ms {
                clock.raise_floor_ms(floor);
            }
            clock
        }),
    ));
    let limits = p.limits;
    let audit = Arc::new(open_audit(dir.as_deref(), &keypair, &limits)?);
    audit.keep_args_of(p.audit_args.iter().cloned());

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
    )
    .monitoring_verb::<capwire_manifest::MonitoringStatusRead>(monitoring::status_handler())
    .monitoring_verb::<capwire_manifest::MonitoringCopy>(monitoring::copy_handler())
    .core_capability(configuration::capability())
    .core_capability(connect::capability())
    .core_capability(cluster::capability())
    .core_capability(protocol::capability())
    .core_capability(core_tasks::capability())
    .core_capability(core_grants::capability(grants.params()));
    if audit.is_on() {
        registry = registry.core_capability(core_audit::capability(audit.verifier_key()));
    }
    for cap in p.caps {
        registry = registry.capability(cap);
    }
    let registry = Arc::new(registry.build()?);

    // A binding in the store wins over the builder's.
    let restored = match &loaded.binding {
        Some(b) => {
            BindingState::restore_binding(capwire_authz::Binding::new(b.controller, b.epoch))
        }
        None => BindingState::restore(p.controller.map(|c| canonical_node_id(&c))),
    };
    let binding = Arc::new(SharedBinding::new(restored));
    let tap = Arc::new(Tap::new(TapLimits {
        max_len: limits.copy_queue_len,
        max_bytes: limits.copy_queue_bytes,
        body_max: limits.copy_body_max,
    }));
    tap.set_controller(binding.snapshot().controller().copied());
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
        tap.clone(),
        StreamDefaults {
            window: Window {
                items: limits.stream_window_items,
                bytes: limits.stream_window_bytes,
            },
            idle: limits.stream_idle_timeout,
        },
    ));

    let gate = match p.authorizer {
        Some(a) => Gate::from_arc(a),
        None => Gate::default(),
    };
    let authorities = Arc::new(Authorities::new(
        binding.clone(),
        grants.delegations.clone(),
        grants.clock.clone(),
    ));
    let control = Arc::new(Control::new(
        binding.clone(),
        tracker_state,
        registry.clone(),
        peers.clone(),
        wire_limits,
        authorities.clone(),
        audit.clone(),
    ));
    let handle = NodeHandle::new(
        id,
        peers.clone(),
        control.clone(),
        limits.default_deadline,
        grants.key().clone(),
    );
    let host: Arc<dyn Host> = match p.host {
        Some(h) => h,
        None => {
            let mut h = InProcessHost::new();
            if let Some(dir) = &dir {
                h = h.state_dir(dir.join("children"));
            }
            Arc::new(h)
        }
    };
    let durable_contacts: Vec<Contact> = loaded
        .contacts
        .iter()
        .filter_map(|c| {
            Some(Contact {
                name: c.name.clone(),
                id: c.id,
                addr: c.addr.parse().ok()?,
            })
        })
        .collect();
    let tasks = Arc::new(TaskService::new(
        task_records,
        store.clone(),
        blocking,
        TaskLimits {
            max_tasks: limits.max_tasks,
            max_per_sender: limits.max_tasks_per_sender,
            max_events: limits.max_task_events,
            max_body: limits.max_task_body,
            retention_ms: u64::try_from(limits.task_retention.as_millis()).unwrap_or(u64::MAX),
        },
        binding.clone(),
        authorities.clone(),
        audit.clone(),
    ));
    // Capacity for tasks is kept for the control plane and contacts.
    let contacts = Arc::downgrade(&peers);
    tasks.set_priority(Box::new(move |id| {
        contacts.upgrade().is_some_and(|p| p.is_contact(id))
    }));
    let (core, expired_answers) = CoreState::new(
        id,
        store,
        blocking,
        loaded,
        control.clone(),
        tap.clone(),
        handle.clone(),
        host,
        CoreLimits {
            answers: AnswerLimits {
                window_ms: u64::try_from(limits.durable_replay_window.as_millis())
                    .unwrap_or(u64::MAX),
                sender_max_bytes: limits.replay_sender_max_bytes,
            },
            host_timeout: limits.host_timeout,
            max_children: limits.max_children,
            copy_body_max: limits.copy_body_max,
        },
        grants.clone(),
        audit.clone(),
    );
    let core = Arc::new(core);
    let mut extensions = p.extensions;
    extensions.insert_runtime(Core(core.clone()));
    extensions.insert_runtime(handle.clone());
    extensions.insert_runtime(Tasks(tasks.clone()));
    let extensions = Arc::new(extensions);
    tasks.set_resumer(Arc::new(Resume {
        registry: registry.clone(),
        extensions: Arc::downgrade(&extensions),
        reply_room: p.transport.max_record_size,
    }));
    let dispatcher = Arc::new(
        Dispatcher::new(
            registry,
            gate,
            binding,
            ledger,
            extensions,
            limits.max_handler_time,
            tap,
            grants.delegations.clone(),
            authorities,
            audit.clone(),
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
            stream_idle: limits.stream_idle_timeout,
        },
        close_all: CancellationToken::new(),
        stats: Arc::default(),
        streams: Arc::default(),
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
            max_stream_window_bytes: limits.max_stream_window_bytes_per_session as u64,
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
    core.set_dialer(Dialer {
        net: Arc::downgrade(&net),
        tracker: tracker.clone(),
        reconnect: (limits.reconnect_initial, limits.reconnect_max),
    });
    Ok(Runtime {
        id,
        limits,
        net,
        peers,
        dispatcher,
        control,
        core,
        tasks,
        handle,
        tracker,
        expired_answers: Mutex::new(expired_answers),
        durable_contacts: Mutex::new(durable_contacts),
        stop_background: CancellationToken::new(),
        stop_handlers,
        local_addrs: Mutex::new(Vec::new()),
        shutdown: tokio::sync::Mutex::new(false),
    })
}

/// Finds the handler that runs a task again after a restart: the task
/// verb's route in the registry, if it is a resumable task handler.
struct Resume {
    registry: Arc<Registry<RouteHandler>>,
    /// Weak: the extensions hold the task service, which holds this.
    extensions: std::sync::Weak<Extensions>,
    reply_room: usize,
}

impl crate::tasks::Resumer for Resume {
    fn resume(
        &self,
        cap: &str,
        verb: &str,
        submitter: NodeId,
        req_id: &str,
        args: capwire_envelope::RawValue,
        fresh: bool,
    ) -> Option<crate::tasks::Start> {
        let route = self.registry.lookup(cap, verb)?;
        let origin = crate::dispatch::extract::Origin {
            submitter,
            req_id: capwire_envelope::ReqId::try_from(req_id).ok()?,
            extensions: self.extensions.upgrade()?,
            channel: crate::dispatch::extract::Channel {
                reply_room: self.reply_room,
                version: capwire_envelope::PROTOCOL_V2,
            },
        };
        route
            .dangerous_handler()
            .handler()
            .resume(&args, origin, fresh)
    }
}

/// Writes the clock's floor (the latest date it gave for an expiry) at
/// most every [`FLOOR_EVERY`] while it moves, and once more when the node
/// stops: a restart with the clock set back then takes no date earlier
/// than one the node judged a token by, give or take that second.
async fn keep_clock_floor(core: Arc<CoreState>, stop: CancellationToken) {
    let clock = core.grants.clock.clone();
    let mut written = clock.given_ms();
    // A store that cannot be written is said once, not every second.
    let mut failing = false;
    let mut tick = tokio::time::interval(FLOOR_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            () = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        let given = clock.given_ms();
        if given > written {
            let batch = Batch {
                clock_floor_ms: Some(given),
                ..Batch::default()
            };
            match core.commit(batch).await {
                Ok(()) => {
                    written = given;
                    failing = false;
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = ?e, "the clock's floor was not written");
                }
                Err(_) => {}
            }
        }
        if stopping {
            return;
        }
    }
}

impl Runtime {
    /// Starts the node's own background tasks: pending-bind expiry,
    /// ledger sweeping, monitoring copies, roster pushes, the host's
    /// events, and the reconciliation of the roster with the host; and
    /// dials the durable contacts.
    pub(crate) fn spawn_background(&self) {
        let stop = self.stop_background.clone();
        self.tracker
            .spawn(monitoring::copy_loop(self.core.clone(), stop.clone()));
        self.tracker
            .spawn(cluster::push_loop(self.core.clone(), stop.clone()));
        self.tracker
            .spawn(cluster::host_events(self.core.clone(), stop.clone()));
        self.tracker
            .spawn(cluster::release_loop(self.core.clone(), stop.clone()));
        self.tracker.spawn(self.tasks.clone().run(stop.clone()));
        self.tracker
            .spawn(self.core.audit.clone().pruner(stop.clone()));
        self.tracker.spawn(core_tasks::push_loop(
            self.core.clone(),
            self.tasks.clone(),
            stop.clone(),
        ));
        // Reconciling waits for the host; shutdown does not wait for it.
        tokio::spawn(cluster::reconcile(self.core.clone()));
        let expired = std::mem::take(
            &mut *self
                .expired_answers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if !expired.is_empty() {
            let core = self.core.clone();
            self.tracker.spawn(async move {
                let _d = core.durable.lock().await;
                let batch = Batch {
                    del_answers: expired,
                    ..Batch::default()
                };
                if let Err(e) = core.commit(batch).await {
                    tracing::warn!(error = ?e, "expired answers not deleted");
                }
            });
        }
        let contacts = std::mem::take(
            &mut *self
                .durable_contacts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for c in contacts {
            self.start_contact(c);
        }
        let control = self.control.clone();
        let stop = self.stop_background.clone();
        self.tracker.spawn(control.expire_pending(stop));
        self.tracker.spawn(keep_clock_floor(
            self.core.clone(),
            self.stop_background.clone(),
        ));
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
