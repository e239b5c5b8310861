//! The peer table: at most one session per peer, waiting for a session,
//! the contacts, the session budgets, and the hello every new session
//! starts with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use capwire_authz::SharedBinding;
use capwire_envelope::{NodeId, ReqId};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::net::conn::SessionHooks;
use crate::net::counters::Direction;
use crate::net::session::Session;
use crate::proto::codec::Hellos;
use crate::proto::streams::Window;
use crate::tap::Tap;

pub(crate) use crate::contact::Contact;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many sessions the node keeps, by direction, and the slots kept for
/// contacts and the bound control plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BudgetLimits {
    pub(crate) inbound: usize,
    pub(crate) outbound: usize,
    pub(crate) reserved: usize,
}

#[derive(Debug, Default)]
struct Budgets {
    inbound: AtomicUsize,
    outbound: AtomicUsize,
    reserved: AtomicUsize,
}

/// One session's place in a budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    peers: Arc<Peers>,
    pool: Pool,
}

#[derive(Debug, Clone, Copy)]
enum Pool {
    Inbound,
    Outbound,
    Reserved,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.peers.counter(self.pool).fetch_sub(1, Ordering::AcqRel);
    }
}

fn take(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// The table of live sessions, one per peer.
pub(crate) struct Peers {
    local: NodeId,
    binding: Arc<SharedBinding>,
    /// Keys are authenticated identities, not peer-chosen text.
    table: Mutex<HashMap<NodeId, Arc<Session>, foldhash::fast::RandomState>>,
    /// Sessions past their handshake that wait for the peer's hellos, by
    /// session id: a call to that peer waits for them to open.
    opening: Mutex<HashMap<u64, NodeId>>,
    changed: watch::Sender<u64>,
    hello: Mutex<Hellos>,
    contacts: Mutex<HashMap<NodeId, (Contact, CancellationToken)>>,
    budgets: Budgets,
    budget_limits: BudgetLimits,
    next_req: AtomicU64,
    next_session: AtomicU64,
    /// Cancelled when the node stops accepting and dialling.
    stopping: CancellationToken,
    /// Where copies of outbound envelopes go while a control plane is bound.
    tap: Arc<Tap>,
    /// How this node's stream calls are sized and bounded.
    stream_defaults: StreamDefaults,
}

/// How this node's stream calls are sized: the window each grants, and
/// how long one waits for its next item.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamDefaults {
    pub(crate) window: Window,
    pub(crate) idle: std::time::Duration,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("local", &self.local)
            .field("sessions", &lock(&self.table).len())
            .finish_non_exhaustive()
    }
}

impl Peers {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        local: NodeId,
        binding: Arc<SharedBinding>,
        hello: Hellos,
        budget_limits: BudgetLimits,
        first_req: u64,
        stopping: CancellationToken,
        tap: Arc<Tap>,
        stream_defaults: StreamDefaults,
    ) -> Self {
        Self {
            local,
            binding,
            table: Mutex::new(HashMap::default()),
            opening: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
            hello: Mutex::new(hello),
            contacts: Mutex::new(HashMap::new()),
            budgets: Budgets::default(),
            budget_limits,
            next_req: AtomicU64::new(first_req),
            next_session: AtomicU64::new(1),
            stopping,
            tap,
            stream_defaults,
        }
    }

    pub(crate) fn tap(&self) -> &Tap {
        &self.tap
    }

    pub(crate) fn stream_defaults(&self) -> StreamDefaults {
        self.stream_defaults
    }

    pub(crate) fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// A fresh request id.
    pub(crate) fn next_req_id(&self) -> ReqId {
        ReqId::from_u64(self.next_req.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// The hellos a new session starts with.
    pub(crate) fn hello(&self) -> Hellos {
        lock(&self.hello).clone()
    }

    /// A new manifest: every session sends it, and new ones start with it.
    pub(crate) fn announce(&self, hello: Hellos) {
        *lock(&self.hello) = hello.clone();
        for s in self.sessions() {
            s.announce(hello.clone());
        }
    }

    /// The live session with `id`, if any.
    pub(crate) fn session(&self, id: &NodeId) -> Option<Arc<Session>> {
        lock(&self.table).get(id).filter(|s| !s.is_ended()).cloned()
    }

    /// Every live session.
    pub(crate) fn sessions(&self) -> Vec<Arc<Session>> {
        lock(&self.table).values().cloned().collect()
    }

    pub(crate) fn connected(&self) -> Vec<NodeId> {
        lock(&self.table)
            .iter()
            .filter(|(_, s)| !s.is_ended())
            .map(|(k, _)| *k)
            .collect()
    }

    // ---------------------------------------------------------------
    // Contacts

    /// Records a contact; returns the token of its dial loop, and cancels
    /// the loop of the contact it replaces.
    pub(crate) fn add_contact(&self, contact: Contact) -> CancellationToken {
        let token = self.stopping.child_token();
        let previous = lock(&self.contacts).insert(contact.id, (contact, token.clone()));
        if let Some((_, old)) = previous {
            old.cancel();
        }
        token
    }

    /// Stops dialling `id` (its current session, if any, stays up).
    pub(crate) fn remove_contact(&self, id: &NodeId) -> bool {
        match lock(&self.contacts).remove(id) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    pub(crate) fn is_contact(&self, id: &NodeId) -> bool {
        lock(&self.contacts).contains_key(id)
    }

    /// `session` passed its handshake and waits for the peer's hellos
    /// (until it opens or ends).
    pub(crate) fn opening(&self, session: &Session) {
        lock(&self.opening).insert(session.id(), session.remote());
    }

    /// Whether a session with `id` is past its handshake but not open yet
    /// (the peer's whole manifest may still be on its way: 4.1).
    fn is_opening(&self, id: &NodeId) -> bool {
        lock(&self.opening).values().any(|r| r == id)
    }

    pub(crate) fn contacts(&self) -> Vec<Contact> {
        lock(&self.contacts)
            .values()
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Contacts and the bound control plane get the reserved slots.
    pub(crate) fn is_priority(&self, id: &NodeId) -> bool {
        self.is_contact(id) || self.binding.snapshot().is_controller(id)
    }

    // ---------------------------------------------------------------
    // Budgets

    fn counter(&self, pool: Pool) -> &AtomicUsize {
        match pool {
            Pool::Inbound => &self.budgets.inbound,
            Pool::Outbound => &self.budgets.outbound,
            Pool::Reserved => &self.budgets.reserved,
        }
    }

    /// A slot for a new session with `remote` in `direction`, if the
    /// budgets allow one.
    pub(crate) fn take_slot(
        self: &Arc<Self>,
        direction: Direction,
        remote: &NodeId,
    ) -> Option<Slot> {
        let l = self.budget_limits;
        let (pool, max) = match direction {
            Direction::Inbound => (Pool::Inbound, l.inbound),
            Direction::Outbound => (Pool::Outbound, l.outbound),
        };
        if take(self.counter(pool), max) {
            return Some(Slot {
                peers: self.clone(),
                pool,
            });
        }
        if self.is_priority(remote) && take(&self.budgets.reserved, l.reserved) {
            return Some(Slot {
                peers: self.clone(),
                pool: Pool::Reserved,
            });
        }
        None
    }

    /// Sessions counted against each budget: (inbound, outbound, reserved).
    pub(crate) fn budget_use(&self) -> (usize, usize, usize) {
        (
            self.budgets.inbound.load(Ordering::Relaxed),
            self.budgets.outbound.load(Ordering::Relaxed),
            self.budgets.reserved.load(Ordering::Relaxed),
        )
    }

    // ---------------------------------------------------------------
    // Waiting

    /// Waits for a session with `id` until `deadline`. Returns at once with
    /// `None` when `id` is neither connected nor a contact being dialled.
    pub(crate) async fn wait_session(
        &self,
        id: &NodeId,
        deadline: Instant,
    ) -> Option<Arc<Session>> {
        self.wait_for(id, deadline, false).await
    }

    /// Waits until a session with `id` is up (whoever dials), or `deadline`.
    pub(crate) async fn wait_any_session(
        &self,
        id: &NodeId,
        deadline: Instant,
    ) -> Option<Arc<Session>> {
        self.wait_for(id, deadline, true).await
    }

    async fn wait_for(&self, id: &NodeId, deadline: Instant, any: bool) -> Option<Arc<Session>> {
        if let Some(s) = self.session(id) {
            return Some(s);
        }
        let mut changes = self.changed.subscribe();
        loop {
            if let Some(s) = self.session(id) {
                return Some(s);
            }
            if (!any && !self.is_contact(id) && !self.is_opening(id))
                || self.stopping.is_cancelled()
            {
                return None;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

impl SessionHooks for Peers {
    /// At most one session per peer: when both peers dial at once, both
    /// keep the session dialled by the smaller node id; a newer session
    /// from the same dialler replaces the older one.
    fn opened(&self, session: &Arc<Session>) -> Arc<Session> {
        let remote = session.remote();
        let initiator = |s: &Session| match s.direction() {
            Direction::Inbound => s.remote(),
            Direction::Outbound => self.local,
        };
        let (winner, loser) = {
            let mut table = lock(&self.table);
            let keep_new = match table.get(&remote) {
                None => true,
                Some(old) if old.is_ended() || old.lock().is_closing() => true,
                Some(old) => {
                    let preferred = self.local.min(remote);
                    initiator(old) == initiator(session) || initiator(session) == preferred
                }
            };
            if keep_new {
                let old = table.insert(remote, session.clone());
                (session.clone(), old.filter(|o| o.id() != session.id()))
            } else {
                let current = table
                    .get(&remote)
                    .cloned()
                    .unwrap_or_else(|| session.clone());
                (current, None)
            }
        };
        if let Some(old) = loser {
            old.close(
                capwire_envelope::CloseCode::Replaced,
                "another session with this peer replaces this one",
            );
        }
        // In the table now (or replaced): no longer opening.
        lock(&self.opening).remove(&session.id());
        // A manifest announced while this session was opening (made with
        // the hellos of then, and not in the table yet) is sent now: it is
        // in the table, so any later one reaches it too.
        let current = self.hello();
        if winner.lock().hellos() != &current {
            winner.announce(current);
        }
        self.bump();
        winner
    }

    fn manifest_changed(&self, _session: &Arc<Session>) {
        self.bump();
    }

    fn ended(&self, session: &Arc<Session>) {
        lock(&self.opening).remove(&session.id());
        {
            let mut table = lock(&self.table);
            if table
                .get(&session.remote())
                .is_some_and(|s| s.id() == session.id())
            {
                table.remove(&session.remote());
            }
        }
        self.bump();
    }
}
