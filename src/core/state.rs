//! The owner of the node's durable state: the store, and the in-memory
//! copy of what it holds. Every durable change is decided under one async
//! lock, written as one batch (with the answer of the request that made
//! it), and only then applied in memory and answered.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use capwire_authz::Binding;
use capwire_envelope::{ErrorBody, ErrorCode, NodeId, RawValue, ReqId};
use capwire_manifest::{ConfigValue, Roster as RosterView, VerbDef};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::task::TaskTracker;

use crate::contact::Contact;
use crate::control::Control;
use crate::core::answers::{Answer, AnswerLimits, Answers, Lookup};
use crate::core::events::{ControlEvent, EVENT_BUFFER};
use crate::core::roster::Roster;
use crate::dispatch::extract::{Context, Extensions, FromContext};
use crate::dispatch::handler::HandlerError;
use crate::handle::NodeHandle;
use crate::host::Host;
use crate::invite::Invite;
use crate::net::Net;
use crate::store::{
    AnswerKey, Batch, BindingRecord, ConfigRecord, ContactRecord, Loaded, MemberRecord, RosterMeta,
    Store,
};
use crate::tap::{Tap, unix_ms};

/// The durable state, in memory. Changed only under [`CoreState::durable`].
#[derive(Debug)]
pub(crate) struct Durable {
    pub(crate) answers: Answers,
    pub(crate) config: ConfigRecord,
    pub(crate) contacts: BTreeMap<NodeId, ContactRecord>,
    pub(crate) roster: Roster,
}

/// A binding change, decided and not yet written: see
/// [`CoreState::binding_change`].
#[derive(Debug)]
pub(crate) struct BindingChange {
    pub(crate) binding: Binding,
    /// Members watched for another control plane, now `off`.
    pub(crate) handed_over: Vec<MemberRecord>,
    /// The roster's counters after the change, when it changes the roster.
    pub(crate) meta: Option<RosterMeta>,
}

impl BindingChange {
    /// The roster as it is once the change is applied.
    pub(crate) fn roster(&self, d: &Durable) -> RosterView {
        match self.meta {
            Some(meta) => d.roster.view_with(meta, &self.handed_over),
            None => d.roster.view(),
        }
    }
}

/// Bounds the core capabilities work within.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoreLimits {
    pub(crate) answers: AnswerLimits,
    pub(crate) host_timeout: Duration,
    pub(crate) max_children: usize,
    pub(crate) copy_body_max: usize,
}

/// Identifies a state-changing request: who sent it, its req_id, its verb.
#[derive(Debug, Clone)]
pub(crate) struct OnceKey {
    pub(crate) key: AnswerKey,
    pub(crate) cap: &'static str,
    pub(crate) verb: &'static str,
}

impl OnceKey {
    pub(crate) fn of<V: VerbDef>(sender: NodeId, req_id: &ReqId) -> Self {
        Self {
            key: AnswerKey {
                sender,
                req_id: req_id.as_str().to_owned(),
            },
            cap: V::CAP,
            verb: V::VERB,
        }
    }
}

/// Starts dial loops for durable contacts (set once the network exists).
#[derive(Debug)]
pub(crate) struct Dialer {
    pub(crate) net: Weak<Net>,
    pub(crate) tracker: TaskTracker,
    pub(crate) reconnect: (Duration, Duration),
}

/// The node's durable state and what the core capabilities share.
pub(crate) struct CoreState {
    pub(crate) id: NodeId,
    store: Arc<dyn Store>,
    /// Commits go to a blocking thread (a real disk is behind the store).
    blocking: bool,
    pub(crate) durable: tokio::sync::Mutex<Durable>,
    pub(crate) control: Arc<Control>,
    pub(crate) tap: Arc<Tap>,
    pub(crate) handle: NodeHandle,
    pub(crate) host: Arc<dyn Host>,
    pub(crate) limits: CoreLimits,
    /// Delegated rights: the keys, the presented tokens, the revocations.
    pub(crate) grants: Arc<crate::core::grant_state::GrantState>,
    /// The audit log (`core.audit`).
    pub(crate) audit: Arc<crate::audit::AuditLog>,
    config_tx: watch::Sender<ConfigValue>,
    roster_tx: watch::Sender<RosterView>,
    /// The application's receivers of pushes (`Node::control_events`),
    /// made with the first of them: a node nobody listens to keeps no
    /// buffer (1,024 events), and a push with no receiver is dropped
    /// either way.
    events: OnceLock<broadcast::Sender<ControlEvent>>,
    dialer: OnceLock<Dialer>,
    /// The last bind opened on each child, for `core.cluster/contact`.
    pub(crate) invites: Mutex<HashMap<String, Invite>>,
    /// What the host last reported of each child's run (`core.cluster/states`).
    pub(crate) runs: Mutex<HashMap<String, crate::host::ChildRun>>,
    /// Cluster operations run one at a time (they wait for the host
    /// between their durable steps).
    pub(crate) cluster_ops: tokio::sync::Mutex<()>,
    /// Wakes the task that releases children from a former control plane.
    pub(crate) release_wanted: tokio::sync::Notify,
}

impl std::fmt::Debug for CoreState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreState")
            .field("id", &self.id)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// The configuration a record holds, as `get_config` answers it.
pub(crate) fn config_value(r: &ConfigRecord) -> ConfigValue {
    ConfigValue {
        value: RawValue::from_slice(&r.value).unwrap_or_else(|_| RawValue::null()),
        version: r.version,
    }
}

/// What an unset configuration is.
pub(crate) fn empty_config() -> ConfigRecord {
    ConfigRecord {
        version: 0,
        value: RawValue::null().as_bytes().to_vec(),
    }
}

fn internal(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::new(ErrorCode::Internal, e.to_string())
}

/// Turns a remembered answer back into the verb's result.
pub(crate) fn typed<T: DeserializeOwned>(answer: Answer) -> Result<T, HandlerError> {
    match answer {
        Ok(raw) => raw.decode::<T>().map_err(internal),
        Err(body) => Err(HandlerError::from(body)),
    }
}

impl CoreState {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: NodeId,
        store: Arc<dyn Store>,
        blocking: bool,
        loaded: Loaded,
        control: Arc<Control>,
        tap: Arc<Tap>,
        handle: NodeHandle,
        host: Arc<dyn Host>,
        limits: CoreLimits,
        grants: Arc<crate::core::grant_state::GrantState>,
        audit: Arc<crate::audit::AuditLog>,
    ) -> (Self, Vec<AnswerKey>) {
        let (answers, expired) = Answers::load(loaded.answers, limits.answers, unix_ms());
        let config = loaded.config.unwrap_or_else(empty_config);
        let roster = Roster::load(loaded.roster, loaded.members);
        let (config_tx, _) = watch::channel(config_value(&config));
        let (roster_tx, _) = watch::channel(roster.view());
        let me = Self {
            id,
            store,
            blocking,
            durable: tokio::sync::Mutex::new(Durable {
                answers,
                config,
                contacts: loaded.contacts.into_iter().map(|c| (c.id, c)).collect(),
                roster,
            }),
            control,
            tap,
            handle,
            host,
            limits,
            grants,
            audit,
            config_tx,
            roster_tx,
            events: OnceLock::new(),
            dialer: OnceLock::new(),
            invites: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            cluster_ops: tokio::sync::Mutex::new(()),
            release_wanted: tokio::sync::Notify::new(),
        };
        (me, expired)
    }

    /// Gives the state its way to dial contacts, once the network exists.
    pub(crate) fn set_dialer(&self, dialer: Dialer) {
        let _ = self.dialer.set(dialer);
    }

    /// Writes `batch`, durably. Nothing in memory changes here.
    ///
    /// # Errors
    /// `internal` when the store refused the write.
    pub(crate) async fn commit(&self, batch: Batch) -> Result<(), HandlerError> {
        if batch.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        let result = if self.blocking {
            tokio::task::spawn_blocking(move || store.commit(&batch))
                .await
                .map_err(internal)?
        } else {
            store.commit(&batch)
        };
        result.map_err(|e| {
            tracing::error!(error = %e, "state write failed");
            HandlerError::new(ErrorCode::Internal, "the node could not write its state")
        })
    }

    /// What became of `key` before: `None` when it is new; its answer when
    /// it was answered (`duplicate` if that was for another verb).
    pub(crate) fn remembered(&self, d: &Durable, key: &OnceKey) -> Option<Answer> {
        match d.answers.lookup(&key.key, key.cap, key.verb, unix_ms()) {
            Lookup::New => None,
            Lookup::Answered(a) => Some(a),
            Lookup::OtherVerb => Some(Err(ErrorBody::new(
                ErrorCode::Duplicate,
                "this req_id was used for another verb",
            ))),
        }
    }

    /// Writes `batch` together with the answer `result` to `key`, then
    /// remembers the answer in memory. The caller applies its own part of
    /// the change after this returns `Ok`.
    ///
    /// # Errors
    /// `internal` when the answer does not encode or the write failed;
    /// then nothing was written.
    pub(crate) async fn finish<T: Serialize>(
        &self,
        d: &mut Durable,
        key: &OnceKey,
        mut batch: Batch,
        result: &Result<T, ErrorBody>,
    ) -> Result<(), HandlerError> {
        let answer: Answer = match result {
            Ok(v) => Ok(RawValue::encode(v).map_err(internal)?),
            Err(b) => Err(b.clone()),
        };
        let (record, released) = d
            .answers
            .prepare(key.key.clone(), key.cap, key.verb, &answer, unix_ms())
            .map_err(internal)?;
        batch.put_answers.push(record.clone());
        batch.del_answers.extend(released.iter().cloned());
        self.commit(batch).await?;
        d.answers.apply(record, &released);
        Ok(())
    }

    /// Runs `f` to completion even if the request that started it is
    /// cancelled: a durable change, once begun, is written and applied in
    /// memory together, or not at all.
    pub(crate) async fn detached<T, F>(&self, f: F) -> Result<T, HandlerError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, HandlerError>> + Send + 'static,
    {
        tokio::spawn(f).await.map_err(internal)?
    }

    /// What the binding as it is now (after a bind or unbind) changes in
    /// the durable state: the binding record, and the children watched for
    /// another control plane, which go `off`. Nothing is written yet.
    pub(crate) fn binding_change(&self, d: &Durable) -> BindingChange {
        let binding = self.control.binding();
        let handed_over = d.roster.handed_over(binding.controller());
        let meta = (!handed_over.is_empty()).then(|| d.roster.bumped(d.roster.meta));
        BindingChange {
            binding,
            handed_over,
            meta,
        }
    }

    /// Writes `change` and applies it; the children it took from their
    /// former control plane are then released from it in the background
    /// ([`release_loop`](crate::core::cluster::release_loop)). Called
    /// under the durable lock, so the last write is of the latest binding.
    ///
    /// # Errors
    /// `internal` when the store refused the write; nothing was written.
    pub(crate) async fn commit_binding(
        &self,
        d: &mut Durable,
        change: BindingChange,
    ) -> Result<(), HandlerError> {
        self.commit(Batch {
            binding: Some(BindingRecord {
                controller: change.binding.controller().copied(),
                epoch: change.binding.epoch(),
                grant_key: self
                    .grants
                    .controller_key(change.binding.epoch())
                    .map(|k| k.to_string()),
            }),
            roster: change.meta,
            put_members: change.handed_over.clone(),
            ..Batch::default()
        })
        .await?;
        if let Some(meta) = change.meta {
            d.roster.apply(meta, &change.handed_over, &[]);
            self.publish_roster(d);
        }
        self.release_wanted.notify_one();
        Ok(())
    }

    /// Writes the binding as it is now, with what it changes
    /// ([`binding_change`](Self::binding_change)).
    ///
    /// # Errors
    /// As [`commit_binding`](Self::commit_binding).
    pub(crate) async fn save_binding(&self, d: &mut Durable) -> Result<(), HandlerError> {
        let change = self.binding_change(d);
        self.commit_binding(d, change).await
    }

    /// The configuration now.
    pub(crate) fn config(&self) -> ConfigValue {
        self.config_tx.borrow().clone()
    }

    /// Watches the configuration.
    pub(crate) fn watch_config(&self) -> watch::Receiver<ConfigValue> {
        self.config_tx.subscribe()
    }

    /// Makes a written configuration visible.
    pub(crate) fn publish_config(&self, d: &mut Durable, record: ConfigRecord) {
        self.config_tx.send_replace(config_value(&record));
        d.config = record;
    }

    /// The roster now.
    pub(crate) fn roster(&self) -> RosterView {
        self.roster_tx.borrow().clone()
    }

    /// Watches the roster.
    pub(crate) fn watch_roster(&self) -> watch::Receiver<RosterView> {
        self.roster_tx.subscribe()
    }

    /// Makes the (written) roster visible and queues its push to the
    /// control plane.
    pub(crate) fn publish_roster(&self, d: &Durable) {
        self.roster_tx.send_replace(d.roster.view());
    }

    /// Starts keeping a session with `contact`.
    pub(crate) fn start_contact(&self, contact: Contact) {
        let Some(dialer) = self.dialer.get() else {
            return;
        };
        let Some(net) = dialer.net.upgrade() else {
            return;
        };
        let token = net.peers.add_contact(contact.clone());
        dialer.tracker.spawn(crate::net::dialer::contact_loop(
            net.clone(),
            contact,
            token,
            dialer.reconnect,
        ));
    }

    /// Copies and rosters received from other nodes.
    pub(crate) fn subscribe_events(&self) -> broadcast::Receiver<ControlEvent> {
        self.events
            .get_or_init(|| broadcast::channel(EVENT_BUFFER).0)
            .subscribe()
    }

    /// Hands a push to the application's receivers, if any.
    pub(crate) fn push_event(&self, event: ControlEvent) {
        if let Some(tx) = self.events.get() {
            // No receiver left is not an error.
            let _ = tx.send(event);
        }
    }

    /// Makes `contact` durable and dials it. `Ok(false)` when it was
    /// already known as it is.
    pub(crate) async fn add_contact(&self, contact: Contact) -> Result<bool, HandlerError> {
        let mut d = self.durable.lock().await;
        let record = ContactRecord {
            id: contact.id,
            name: contact.name.clone(),
            addr: contact.addr.to_string(),
        };
        if d.contacts.get(&contact.id) == Some(&record) {
            return Ok(false);
        }
        self.commit(Batch {
            put_contacts: vec![record.clone()],
            ..Batch::default()
        })
        .await?;
        d.contacts.insert(contact.id, record);
        drop(d);
        self.start_contact(contact);
        Ok(true)
    }

    /// Forgets a durable contact and stops dialling it.
    pub(crate) async fn remove_contact(&self, id: NodeId) -> Result<bool, HandlerError> {
        let mut d = self.durable.lock().await;
        if !d.contacts.contains_key(&id) {
            return Ok(false);
        }
        self.commit(Batch {
            del_contacts: vec![id],
            ..Batch::default()
        })
        .await?;
        d.contacts.remove(&id);
        drop(d);
        if let Some(net) = self.dialer.get().and_then(|d| d.net.upgrade()) {
            net.peers.remove_contact(&id);
        }
        Ok(true)
    }
}

/// The core capabilities' handle on the node's state, as handlers extract it.
#[derive(Clone, Debug)]
pub(crate) struct Core(pub(crate) Arc<CoreState>);

impl FromContext for Core {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        cx.runtime::<Core>().ok_or_else(|| {
            HandlerError::new(ErrorCode::Internal, "the core state is not installed")
        })
    }

    fn check(extensions: &Extensions) -> Result<(), String> {
        extensions
            .runtime::<Core>()
            .map(|_| ())
            .ok_or_else(|| "the core state is not installed".to_owned())
    }
}

/// `PoisonError`-tolerant lock.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
