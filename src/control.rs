//! The node's binding to its control plane and its manifest: the pending
//! bind, bind and unbind, and the manifest epoch, kept by the manifest
//! crate's [`ManifestTracker`]. Every change that shows in the manifest
//! (a bind, an unbind, a pending bind opened, used up or expired) bumps
//! the epoch and sends the new hello on every session.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use capwire_authz::{BindCode, BindFailure, BindUndo, Binding, Refused, SharedBinding};
use capwire_envelope::{Limits as WireLimits, NodeId};
use capwire_manifest::{Manifest, ManifestTracker, Registry};
use tokio::sync::Notify;

use crate::audit::{AuditLog, Entry, Kind};
use crate::authority::Authorities;
use crate::dispatch::handler::RouteHandler;
use crate::error::NodeError;
use crate::net::peers::Peers;
use crate::proto::codec::{self, Hellos};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The binding and the manifest of one node.
pub(crate) struct Control {
    binding: Arc<SharedBinding>,
    tracker: Mutex<ManifestTracker>,
    registry: Arc<Registry<RouteHandler>>,
    peers: Arc<Peers>,
    wire_limits: WireLimits,
    /// Wakes the expiry task when a pending bind is made.
    pending_changed: Notify,
    /// The manifest, for watchers.
    manifest_tx: tokio::sync::watch::Sender<Manifest>,
    /// Told of every binding change: work the old binding admitted stops.
    authorities: Arc<Authorities>,
    /// Where binding changes are recorded.
    audit: Arc<AuditLog>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

/// The hello frames for `manifest`.
pub(crate) fn hello_for(manifest: &Manifest, limits: WireLimits) -> Result<Hellos, NodeError> {
    codec::hellos(manifest, limits)
        .map_err(|e| NodeError::Config(format!("the manifest does not encode: {e}")))
}

impl Control {
    pub(crate) fn new(
        binding: Arc<SharedBinding>,
        tracker: ManifestTracker,
        registry: Arc<Registry<RouteHandler>>,
        peers: Arc<Peers>,
        wire_limits: WireLimits,
        authorities: Arc<Authorities>,
        audit: Arc<AuditLog>,
    ) -> Self {
        let manifest_tx = tokio::sync::watch::channel(tracker.manifest().clone()).0;
        Self {
            manifest_tx,
            authorities,
            audit,
            binding,
            tracker: Mutex::new(tracker),
            registry,
            peers,
            wire_limits,
            pending_changed: Notify::new(),
        }
    }

    /// Records a change of the binding in the audit log: the control
    /// plane it is about, the epoch it made, and what it was.
    fn record_binding(&self, peer: Option<&NodeId>, epoch: u64, what: &str) {
        let mut e = Entry::new(Kind::Bind);
        e.peer = peer;
        e.epoch = Some(epoch);
        e.detail = Some(what);
        self.audit.record(&e);
    }

    /// The current manifest.
    pub(crate) fn manifest(&self) -> Manifest {
        lock(&self.tracker).manifest().clone()
    }

    /// Watches the manifest.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<Manifest> {
        self.manifest_tx.subscribe()
    }

    /// Drops the pending bind, if any.
    pub(crate) fn cancel_pending(&self, now: Instant) {
        if self.binding.cancel_pending() {
            self.refresh(now);
        }
    }

    /// The current binding.
    pub(crate) fn binding(&self) -> Binding {
        self.binding.snapshot()
    }

    /// What running work holds its authority from.
    pub(crate) fn authorities(&self) -> &Arc<Authorities> {
        &self.authorities
    }

    /// Recomputes the manifest at `now`; if it changed, its epoch is bumped
    /// and every session is sent the new hello. The hello is handed to the
    /// sessions under the tracker's lock, so two refreshes at once announce
    /// their epochs in order: a newer hello is never replaced by an older
    /// one, on a session or as the hello new sessions start with.
    pub(crate) fn refresh(&self, now: Instant) {
        let mut tracker = lock(&self.tracker);
        let status = self.binding.status(now);
        if !tracker.refresh(&*self.registry, status) {
            return;
        }
        self.manifest_tx.send_replace(tracker.manifest().clone());
        match hello_for(tracker.manifest(), self.wire_limits) {
            Ok(hello) => self.peers.announce(hello),
            Err(e) => tracing::error!(error = %e, "manifest update not sent"),
        }
    }

    /// Opens a pending bind for `expected` (any control plane if `None`);
    /// returns its code.
    ///
    /// # Errors
    /// The system random number generator failed.
    pub(crate) fn open_pending(
        &self,
        expected: Option<NodeId>,
        now: Instant,
    ) -> Result<String, NodeError> {
        let code = BindCode::random()?;
        let text = code.expose().to_owned();
        self.binding.create_pending(code, expected, now);
        self.pending_changed.notify_one();
        self.refresh(now);
        Ok(text)
    }

    /// A bind attempt by `sender` that `check` may still refuse once the
    /// code is known to be right (see
    /// [`SharedBinding::try_bind_checked`]); a refusal changes nothing.
    ///
    /// # Errors
    /// Why it failed, or what `check` said.
    pub(crate) fn try_bind_checked<E>(
        &self,
        sender: &NodeId,
        code: &str,
        now: Instant,
        check: impl FnOnce(&Binding) -> Result<(), E>,
    ) -> Result<(Binding, BindUndo), Refused<E>> {
        let result = self.binding.try_bind_checked(sender, code, now, check);
        if let Ok((b, _)) = &result {
            self.authorities.changed();
            self.record_binding(Some(sender), b.epoch(), "bound");
        }
        if matches!(
            result,
            Ok(_)
                | Err(Refused::Failed(
                    BindFailure::TooManyAttempts | BindFailure::Expired
                ))
        ) {
            self.refresh(now);
        }
        if result.is_ok() {
            // Wakes manifest watchers also when a new controller leaves the manifest as it was.
            self.manifest_tx.send_modify(|_| ());
            tracing::info!(controller = %sender, "bound to a control plane");
        }
        result
    }

    /// Undoes a bind that could not be completed (see
    /// [`SharedBinding::undo_bind`]); whether it was undone.
    pub(crate) fn undo_bind(&self, undo: BindUndo, now: Instant) -> bool {
        let undone = self.binding.undo_bind(undo);
        if undone {
            self.authorities.changed();
            let b = self.binding.snapshot();
            self.record_binding(b.controller(), b.epoch(), "undone");
            tracing::warn!("a bind that could not be completed was undone");
            self.refresh(now);
        }
        undone
    }

    /// Unbinds the control plane; returns it, with what binds it again if
    /// the unbind cannot be written ([`undo_bind`](Self::undo_bind)).
    pub(crate) fn unbind(&self, now: Instant) -> Option<(NodeId, BindUndo)> {
        let previous = self.binding.unbind_undoable();
        if let Some((from, _)) = &previous {
            self.authorities.changed();
            self.record_binding(Some(from), self.binding.snapshot().epoch(), "unbound");
            self.refresh(now);
        }
        previous
    }

    /// Runs until `stop`: when a pending bind expires, the manifest says
    /// `off` (with a new epoch) at once, without waiting for someone to
    /// try the code.
    pub(crate) async fn expire_pending(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        loop {
            let now = tokio::time::Instant::now();
            let next = self.binding.pending(now.into_std()).map(|p| p.expires_at);
            let wake = async {
                match next {
                    Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.pending_changed.notified() => {}
                () = wake => {
                    // The manifest says `off` from now on; the expired bind
                    // itself stays until a bind attempt is answered
                    // `expired` (and clears it) or a new bind replaces it.
                    self.refresh(tokio::time::Instant::now().into_std());
                }
            }
        }
    }
}
