//! The replay ledger: which (sender, req_id) pairs are running or finished.
//!
//! It makes request handling idempotent per (sender, req_id): a request
//! that is still running is answered `duplicate`, a finished one gets its
//! remembered response again (byte for byte), and a handler never runs
//! twice for a pair the ledger remembers.
//!
//! ```text
//!  Ledger ── one partition per sender ──► SenderLedger
//!                                          live:      running and finished entries,
//!                                                     each bound to its route (cap, verb)
//!                                          forgotten: finished entries whose response was
//!                                                     released (numeric ids as ranges,
//!                                                     others as 64-bit digests)
//! ```
//!
//! Every partition has its own quota, in bytes, that counts each entry's
//! whole cost (key, bookkeeping and response), so one sender can never
//! make room by evicting another sender's entries. When a sender goes over
//! its quota its *own* oldest responses are released first; the entries
//! stay known ("forgotten"), so a repeat is answered `duplicate` and never
//! runs again. A sender whose forgotten entries alone fill its quota is
//! answered `overloaded` until they leave the window. Every operation is
//! O(1) amortised (forgotten numeric ids cost O(log ranges)), and each
//! partition has its own lock, so one peer's history does not slow
//! another's requests.
//!
//! Pure state: every method takes `now`; nothing here does I/O.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_envelope::{NodeId, ReqId};

/// Bytes charged for one live entry besides its response bytes: its map
/// slot (with the table's control byte and load factor) and its
/// completion-order slot, both counted twice since a table may have just
/// doubled, plus the response buffer's sharing header and allocation slack.
/// A test with a counting allocator checks it covers what the heap grows by.
pub(crate) const ENTRY_COST: usize = 2 * ((std::mem::size_of::<(Key, Entry)>() + 1) * 8 / 7)
    + 2 * std::mem::size_of::<(Instant, Key, u64)>()
    + 48;
/// Bytes charged for one forgotten entry kept as a digest.
pub(crate) const DIGEST_COST: usize = 48;
/// Bytes charged for one range of forgotten numeric ids.
pub(crate) const RANGE_COST: usize = 96;
/// Bytes charged for a partition itself.
pub(crate) const PARTITION_COST: usize = 512;
/// How often the ranges of forgotten ids are swept for expiry.
const RANGE_SWEEP: Duration = Duration::from_secs(1);

/// Bounds of the ledger.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LedgerLimits {
    /// How long finished requests are remembered.
    pub(crate) window: Duration,
    /// Bytes all partitions together may cost.
    pub(crate) max_bytes: usize,
    /// Bytes one sender's partition may cost.
    pub(crate) sender_max_bytes: usize,
}

/// What the ledger knows about a request that just arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Check {
    /// Not known: it may run (then call [`SenderLedger::begin`]).
    New,
    /// The same pair is running now.
    Running,
    /// Finished before: send this encoded response frame again.
    Replay(Bytes),
    /// Finished before, but its response has been released.
    Forgotten,
    /// Known under another (cap, verb): never answered with its result.
    OtherVerb,
    /// Not known, and now recorded as running (asked for with `begin`).
    Begun,
    /// The sender has used up its quota (or the node its budget).
    Full,
}

/// Node-wide totals, shared by every partition.
#[derive(Debug, Default)]
struct Totals {
    /// Bytes charged by all partitions.
    bytes: AtomicUsize,
    /// The bytes all partitions would cost if every finished entry had
    /// been forgotten: what admission must keep within the budget.
    floor: AtomicUsize,
}

/// The node's ledger: one partition per sender.
#[derive(Debug)]
pub(crate) struct Ledger {
    limits: LedgerLimits,
    totals: Arc<Totals>,
    hasher: RandomState,
    partitions: Mutex<HashMap<NodeId, Arc<Partition>>>,
}

/// One sender's partition, behind its own lock.
pub(crate) type Partition = Mutex<SenderLedger>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sizes of the ledger, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerSizes {
    /// Requests running now.
    pub running: usize,
    /// Finished requests whose response is remembered.
    pub remembered: usize,
    /// Finished requests remembered without their response.
    pub forgotten: usize,
    /// Bytes charged, whole cost.
    pub bytes: usize,
    /// Senders with a partition.
    pub senders: usize,
}

impl Ledger {
    pub(crate) fn new(limits: LedgerLimits) -> Self {
        Self {
            limits,
            totals: Arc::new(Totals::default()),
            hasher: RandomState::new(),
            partitions: Mutex::new(HashMap::new()),
        }
    }

    /// The partition of `sender`, made on first use.
    pub(crate) fn partition(&self, sender: NodeId) -> Arc<Partition> {
        let mut map = lock(&self.partitions);
        map.entry(sender)
            .or_insert_with(|| {
                Arc::new(Mutex::new(SenderLedger::new(
                    self.limits,
                    self.totals.clone(),
                    self.hasher.clone(),
                )))
            })
            .clone()
    }

    /// Expires old entries everywhere and drops partitions that hold
    /// nothing and that no session uses.
    pub(crate) fn sweep(&self, now: Instant) {
        let partitions: Vec<(NodeId, Arc<Partition>)> = lock(&self.partitions)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut empty = Vec::new();
        for (id, p) in partitions {
            let mut part = lock(&p);
            part.expire(now);
            if part.is_empty() {
                empty.push(id);
            }
        }
        let mut map = lock(&self.partitions);
        for id in empty {
            // Two references: the map's and none other (ours was dropped).
            if map
                .get(&id)
                .is_some_and(|p| Arc::strong_count(p) == 1 && lock(p).is_empty())
            {
                map.remove(&id);
            }
        }
    }

    /// Current sizes.
    pub(crate) fn sizes(&self) -> LedgerSizes {
        let partitions: Vec<Arc<Partition>> = lock(&self.partitions).values().cloned().collect();
        let mut sizes = LedgerSizes {
            senders: partitions.len(),
            bytes: self.totals.bytes.load(Ordering::Relaxed),
            ..LedgerSizes::default()
        };
        for p in partitions {
            let part = lock(&p);
            sizes.running += part.running;
            sizes.remembered += part.done.len();
            sizes.forgotten += part.forgotten.len();
        }
        sizes
    }
}

/// Longest request id kept inline in a [`Key`].
const INLINE: usize = 22;

/// A request id as a map key, compact: ids of up to 22 bytes (every
/// counter) are kept inline, longer ones on the heap. Hashed and compared
/// by their text.
#[derive(Debug, Clone)]
enum Key {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

impl Key {
    fn new(id: &ReqId) -> Self {
        let b = id.as_bytes();
        if b.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..b.len()].copy_from_slice(b);
            // b.len() <= 22
            Key::Inline(b.len() as u8, buf)
        } else {
            Key::Heap(b.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline(len, buf) => &buf[..usize::from(*len)],
            Key::Heap(b) => b,
        }
    }

    fn to_req_id(&self) -> ReqId {
        std::str::from_utf8(self.as_bytes())
            .ok()
            .and_then(|s| ReqId::try_from(s).ok())
            .unwrap_or(ReqId::EMPTY)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
    }
}

/// The binding epoch of a bootstrap verb's answer: none.
const NO_EPOCH: u64 = u64::MAX;

#[derive(Debug)]
enum Entry {
    Running {
        route: u32,
    },
    Done {
        route: u32,
        /// For controller verbs, the binding epoch the answer belongs to;
        /// [`NO_EPOCH`] for bootstrap verbs.
        epoch: u64,
        seq: u64,
        response: Bytes,
    },
}

/// One sender's entries.
#[derive(Debug)]
pub(crate) struct SenderLedger {
    limits: LedgerLimits,
    totals: Arc<Totals>,
    live: HashMap<Key, Entry, RandomState>,
    /// Finished entries in completion order: (finished at, key, seq).
    done: VecDeque<(Instant, Key, u64)>,
    forgotten: Forgotten,
    running: usize,
    seq: u64,
    /// Bytes charged by this partition.
    bytes: usize,
    /// What this partition adds to `Totals::floor`.
    floor: usize,
    /// Loop iterations spent on upkeep (tests check it stays linear).
    #[cfg(test)]
    work: usize,
}

impl Drop for SenderLedger {
    fn drop(&mut self) {
        self.totals.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        self.totals.floor.fetch_sub(self.floor, Ordering::Relaxed);
    }
}

impl SenderLedger {
    fn new(limits: LedgerLimits, totals: Arc<Totals>, hasher: RandomState) -> Self {
        let mut part = Self {
            limits,
            totals,
            live: HashMap::with_hasher(hasher.clone()),
            done: VecDeque::new(),
            forgotten: Forgotten::new(hasher),
            running: 0,
            seq: 0,
            bytes: 0,
            floor: 0,
            #[cfg(test)]
            work: 0,
        };
        // A partition's own cost counts in bytes, not against admission.
        part.charge(PARTITION_COST as isize, 0);
        part
    }

    /// Adjusts this partition's and the node's accounting.
    fn charge(&mut self, bytes: isize, floor: isize) {
        fn apply(local: &mut usize, total: &AtomicUsize, delta: isize) {
            if delta >= 0 {
                *local += delta.unsigned_abs();
                total.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
            } else {
                *local = local.saturating_sub(delta.unsigned_abs());
                total.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
            }
        }
        apply(&mut self.bytes, &self.totals.bytes, bytes);
        apply(&mut self.floor, &self.totals.floor, floor);
    }

    fn is_empty(&self) -> bool {
        self.live.is_empty() && self.forgotten.len() == 0
    }

    /// Looks up `req_id` for a request to `route`, under binding epoch
    /// `binding_epoch`; with `begin`, a request not known is recorded as
    /// running at once ([`Check::Begun`]). With `keyed` (the route's
    /// handler finds a repeat by its own durable key, as a task submit
    /// finds its task), a request whose response was released is taken
    /// as not known: the handler answers it. Expires old entries first.
    pub(crate) fn check(
        &mut self,
        req_id: &ReqId,
        route: u32,
        binding_epoch: u64,
        now: Instant,
        begin: bool,
        keyed: bool,
    ) -> Check {
        use std::collections::hash_map::Entry as Slot;
        self.expire(now);
        let key = Key::new(req_id);
        let vacant = match self.live.entry(key) {
            Slot::Occupied(o) => match o.get() {
                Entry::Running { route: r } => {
                    return if *r == route {
                        Check::Running
                    } else {
                        Check::OtherVerb
                    };
                }
                Entry::Done {
                    route: r,
                    epoch,
                    response,
                    ..
                } => {
                    if *r != route {
                        return Check::OtherVerb;
                    }
                    if *epoch == NO_EPOCH || *epoch == binding_epoch {
                        return Check::Replay(response.clone());
                    }
                    // A controller answer from an earlier binding: forgotten,
                    // as if it had left the window.
                    let (key, old) = o.remove_entry();
                    if let Entry::Done { response, .. } = old {
                        self.charge(
                            -((ENTRY_COST + response.len()) as isize),
                            -(DIGEST_COST as isize),
                        );
                    }
                    match self.live.entry(key) {
                        Slot::Vacant(v) => v,
                        Slot::Occupied(_) => return Check::Running,
                    }
                }
            },
            Slot::Vacant(v) => {
                if !keyed && self.forgotten.contains(req_id) {
                    return Check::Forgotten;
                }
                v
            }
        };
        let own = self.floor + DIGEST_COST;
        let total = self.totals.floor.load(Ordering::Relaxed) + DIGEST_COST;
        if own > self.limits.sender_max_bytes || total > self.limits.max_bytes {
            return Check::Full;
        }
        if !begin {
            return Check::New;
        }
        vacant.insert(Entry::Running { route });
        self.running += 1;
        self.charge(ENTRY_COST as isize, DIGEST_COST as isize);
        Check::Begun
    }

    /// Records `req_id` as running (after [`check`](Self::check) said `New`).
    #[cfg(test)]
    pub(crate) fn begin(&mut self, req_id: &ReqId, route: u32) {
        let previous = self.live.insert(Key::new(req_id), Entry::Running { route });
        debug_assert!(previous.is_none());
        self.running += 1;
        self.charge(ENTRY_COST as isize, DIGEST_COST as isize);
    }

    /// Records the response of a running request. `epoch` is the binding
    /// epoch for controller verbs.
    pub(crate) fn complete(
        &mut self,
        req_id: &ReqId,
        route: u32,
        epoch: Option<u64>,
        response: Bytes,
        now: Instant,
    ) {
        let key = Key::new(req_id);
        let Some(slot) = self.live.get_mut(&key) else {
            return;
        };
        if !matches!(slot, Entry::Running { .. }) {
            return;
        }
        self.seq += 1;
        let seq = self.seq;
        let len = response.len();
        *slot = Entry::Done {
            route,
            epoch: epoch.unwrap_or(NO_EPOCH),
            seq,
            response,
        };
        self.running = self.running.saturating_sub(1);
        if crate::seeded_bugs::planted(crate::seeded_bugs::Bug::LedgerForgetsEarly) {
            self.live.remove(&key);
            self.charge(-(ENTRY_COST as isize), -(DIGEST_COST as isize));
            return;
        }
        self.charge(len as isize, 0);
        self.done.push_back((now, key, seq));
        self.expire(now);
        self.make_room();
    }

    /// Forgets a running request that will not finish here (it was never
    /// started). Leaves no trace, so the same request may come again.
    pub(crate) fn abandon(&mut self, req_id: &ReqId) {
        let key = Key::new(req_id);
        if let Some(Entry::Running { .. }) = self.live.get(&key) {
            self.live.remove(&key);
            self.running = self.running.saturating_sub(1);
            self.charge(-(ENTRY_COST as isize), -(DIGEST_COST as isize));
        }
    }

    /// Over quota: release this sender's own oldest responses, keeping
    /// their requests known.
    fn make_room(&mut self) {
        loop {
            #[cfg(test)]
            {
                self.work += 1;
            }
            let over_own = self.bytes > self.limits.sender_max_bytes;
            let over_all = self.totals.bytes.load(Ordering::Relaxed) > self.limits.max_bytes;
            if !(over_own || over_all) {
                return;
            }
            let Some((at, key, seq)) = self.done.pop_front() else {
                return;
            };
            if let Some(Entry::Done {
                seq: s, response, ..
            }) = self.live.get(&key)
                && *s == seq
            {
                let freed = (ENTRY_COST + response.len()) as isize;
                self.live.remove(&key);
                let added = self.forgotten.insert(&key.to_req_id(), at);
                // Its floor share moves from the live entry to the
                // forgotten one.
                self.charge(added - freed, added - DIGEST_COST as isize);
            }
        }
    }

    fn remove_done(&mut self, key: &Key) {
        if let Some(Entry::Done { response, .. }) = self.live.remove(key) {
            self.charge(
                -((ENTRY_COST + response.len()) as isize),
                -(DIGEST_COST as isize),
            );
        }
        // Its slot in `done` is skipped when it reaches the front (the
        // sequence number no longer matches).
    }

    /// Drops everything older than the window.
    pub(crate) fn expire(&mut self, now: Instant) {
        let window = self.limits.window;
        while let Some((at, _, _)) = self.done.front() {
            #[cfg(test)]
            {
                self.work += 1;
            }
            if now.saturating_duration_since(*at) < window {
                break;
            }
            let Some((_, key, seq)) = self.done.pop_front() else {
                break;
            };
            if matches!(self.live.get(&key), Some(Entry::Done { seq: s, .. }) if *s == seq) {
                self.remove_done(&key);
            }
        }
        let freed = self.forgotten.expire(now, window);
        if freed > 0 {
            self.charge(-(freed as isize), -(freed as isize));
        }
        if self.done.is_empty() && self.done.capacity() > 64 {
            self.done.shrink_to_fit();
        }
        if self.live.is_empty() && self.live.capacity() > 64 {
            self.live.shrink_to_fit();
        }
    }

    /// Requests running now.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.running
    }

    /// Bytes charged by this partition.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Finished requests whose responses were released: canonical decimal ids
/// (what counters produce) as ranges, any other id as a 64-bit digest.
#[derive(Debug)]
struct Forgotten {
    hasher: RandomState,
    /// start -> (last id of the range, time of its latest addition).
    ranges: BTreeMap<u64, (u64, Instant)>,
    digests: HashMap<u64, Instant, RandomState>,
    /// Digests in insertion order, for expiry.
    digest_order: VecDeque<(Instant, u64)>,
    next_range_sweep: Option<Instant>,
    count: usize,
}

/// `Some(n)` when `id` is a canonical decimal number (no sign, no leading
/// zero) that fits in 64 bits.
fn numeric(id: &str) -> Option<u64> {
    let b = id.as_bytes();
    if b.is_empty() || b.len() > 20 || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    if !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    id.parse().ok()
}

impl Forgotten {
    fn new(hasher: RandomState) -> Self {
        Self {
            ranges: BTreeMap::new(),
            digests: HashMap::with_hasher(hasher.clone()),
            hasher,
            digest_order: VecDeque::new(),
            next_range_sweep: None,
            count: 0,
        }
    }

    fn len(&self) -> usize {
        self.count
    }

    fn digest(&self, id: &str) -> u64 {
        self.hasher.hash_one(id.as_bytes())
    }

    fn contains(&self, id: &ReqId) -> bool {
        match numeric(id.as_str()) {
            Some(n) => self
                .ranges
                .range(..=n)
                .next_back()
                .is_some_and(|(_, (end, _))| n <= *end),
            None => self.digests.contains_key(&self.digest(id.as_str())),
        }
    }

    /// Adds `id`; returns how many bytes its cost changed by (a merge of
    /// two ranges makes it negative).
    fn insert(&mut self, id: &ReqId, at: Instant) -> isize {
        let Some(n) = numeric(id.as_str()) else {
            let d = self.digest(id.as_str());
            if self.digests.insert(d, at).is_some() {
                // The same digest again: refreshed, not added.
                self.digest_order.push_back((at, d));
                return 0;
            }
            self.count += 1;
            self.digest_order.push_back((at, d));
            return DIGEST_COST as isize;
        };
        let before = self.ranges.range(..=n).next_back().map(|(s, v)| (*s, *v));
        if let Some((start, (end, _))) = before
            && n <= end
        {
            // Already covered: refresh the range's time.
            self.ranges.insert(start, (end, at));
            return 0;
        }
        self.count += 1;
        let after = n
            .checked_add(1)
            .and_then(|next| self.ranges.get(&next).map(|v| (next, *v)));
        let joins_before = before.is_some_and(|(_, (end, _))| end.checked_add(1) == Some(n));
        match (before, after) {
            (Some((start, _)), Some((next, (next_end, _)))) if joins_before => {
                self.ranges.remove(&next);
                self.ranges.insert(start, (next_end, at));
                -(RANGE_COST as isize)
            }
            (Some((start, _)), _) if joins_before => {
                self.ranges.insert(start, (n, at));
                0
            }
            (_, Some((next, (next_end, _)))) => {
                self.ranges.remove(&next);
                self.ranges.insert(n, (next_end, at));
                0
            }
            _ => {
                self.ranges.insert(n, (n, at));
                self.next_range_sweep.get_or_insert(at + RANGE_SWEEP);
                RANGE_COST as isize
            }
        }
    }

    /// Drops what is older than `window`; returns the bytes freed.
    fn expire(&mut self, now: Instant, window: Duration) -> usize {
        let mut freed = 0;
        while let Some((at, d)) = self.digest_order.front().copied() {
            if now.saturating_duration_since(at) < window {
                break;
            }
            self.digest_order.pop_front();
            if self.digests.get(&d) == Some(&at) {
                self.digests.remove(&d);
                self.count = self.count.saturating_sub(1);
                freed += DIGEST_COST;
            }
        }
        if self.next_range_sweep.is_some_and(|t| now >= t) {
            let before = self.ranges.len();
            let mut dropped_ids = 0u64;
            self.ranges.retain(|start, (end, last)| {
                let keep = now.saturating_duration_since(*last) < window;
                if !keep {
                    dropped_ids += *end - *start + 1;
                }
                keep
            });
            freed += (before - self.ranges.len()) * RANGE_COST;
            self.count = self
                .count
                .saturating_sub(usize::try_from(dropped_ids).unwrap_or(usize::MAX));
            self.next_range_sweep = (!self.ranges.is_empty()).then(|| now + RANGE_SWEEP);
        }
        if self.digests.is_empty() && self.digests.capacity() > 64 {
            self.digests.shrink_to_fit();
            self.digest_order.shrink_to_fit();
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: u32 = 1;

    fn limits(sender_max_bytes: usize, max_bytes: usize) -> LedgerLimits {
        LedgerLimits {
            window: Duration::from_secs(60),
            max_bytes,
            sender_max_bytes,
        }
    }

    fn id(n: u64) -> ReqId {
        ReqId::from_u64(n)
    }

    fn named(s: &str) -> ReqId {
        ReqId::try_from(s).unwrap()
    }

    fn run(p: &mut SenderLedger, req: &ReqId, response: &'static [u8], now: Instant) {
        assert_eq!(
            p.check(req, ROUTE, 0, now, false, false),
            Check::New,
            "{req:?}"
        );
        p.begin(req, ROUTE);
        p.complete(req, ROUTE, None, Bytes::from_static(response), now);
    }

    #[test]
    fn run_then_replay_and_duplicates() {
        let ledger = Ledger::new(limits(1 << 20, 1 << 24));
        let a = ledger.partition(NodeId::from_bytes([1; 32]));
        let b = ledger.partition(NodeId::from_bytes([2; 32]));
        let t = Instant::now();
        let mut a = a.lock().unwrap();
        assert_eq!(a.check(&id(1), ROUTE, 0, t, false, false), Check::New);
        a.begin(&id(1), ROUTE);
        assert_eq!(a.check(&id(1), ROUTE, 0, t, false, false), Check::Running);
        assert_eq!(a.check(&id(1), 2, 0, t, false, false), Check::OtherVerb);
        // Another sender with the same req_id is independent.
        assert_eq!(
            b.lock().unwrap().check(&id(1), ROUTE, 0, t, false, false),
            Check::New
        );
        a.complete(&id(1), ROUTE, None, Bytes::from_static(b"resp"), t);
        assert_eq!(
            a.check(&id(1), ROUTE, 0, t, false, false),
            Check::Replay(Bytes::from_static(b"resp"))
        );
        assert_eq!(
            a.check(&id(1), 2, 0, t, false, false),
            Check::OtherVerb,
            "never another verb's result"
        );
        assert_eq!(a.running(), 0);
        a.abandon(&id(9));
        assert_eq!(a.check(&id(9), ROUTE, 0, t, false, false), Check::New);
        a.begin(&id(9), ROUTE);
        a.abandon(&id(9));
        assert_eq!(
            a.check(&id(9), ROUTE, 0, t, false, false),
            Check::New,
            "abandoned leaves no trace"
        );
    }

    #[test]
    fn controller_answers_are_forgotten_when_the_binding_changes() {
        let ledger = Ledger::new(limits(1 << 20, 1 << 24));
        let p = ledger.partition(NodeId::from_bytes([1; 32]));
        let mut p = p.lock().unwrap();
        let t = Instant::now();
        assert_eq!(p.check(&id(5), ROUTE, 3, t, false, false), Check::New);
        p.begin(&id(5), ROUTE);
        p.complete(&id(5), ROUTE, Some(3), Bytes::from_static(b"ok"), t);
        assert!(matches!(
            p.check(&id(5), ROUTE, 3, t, false, false),
            Check::Replay(_)
        ));
        assert_eq!(p.check(&id(5), 7, 4, t, false, false), Check::OtherVerb);
        assert_eq!(p.check(&id(5), ROUTE, 4, t, false, false), Check::New);
    }

    #[test]
    fn one_sender_never_evicts_another() {
        // Room for a few dozen live entries per sender.
        let ledger = Ledger::new(limits(16 * 1024, 1 << 30));
        let t = Instant::now();
        let victim = ledger.partition(NodeId::from_bytes([1; 32]));
        run(
            &mut victim.lock().unwrap(),
            &named("victim-1"),
            b"answer",
            t,
        );
        let flooder = ledger.partition(NodeId::from_bytes([2; 32]));
        {
            let mut f = flooder.lock().unwrap();
            let mut n = 0u64;
            // Until the flooder is refused.
            loop {
                let r = named(&format!("x{n}"));
                match f.check(&r, ROUTE, 0, t, false, false) {
                    Check::New => {
                        f.begin(&r, ROUTE);
                        f.complete(&r, ROUTE, None, Bytes::from_static(b"no_pending"), t);
                    }
                    Check::Full => break,
                    other => panic!("{other:?}"),
                }
                n += 1;
                assert!(n < 100_000, "the flooder is bounded");
            }
            assert!(f.bytes() <= 16 * 1024 + PARTITION_COST + DIGEST_COST);
            // Its own oldest answers were released, but stay known.
            assert_eq!(
                f.check(&named("x0"), ROUTE, 0, t, false, false),
                Check::Forgotten
            );
        }
        assert_eq!(
            victim
                .lock()
                .unwrap()
                .check(&named("victim-1"), ROUTE, 0, t, false, false),
            Check::Replay(Bytes::from_static(b"answer")),
            "the victim's entry survives the flood"
        );
    }

    #[test]
    fn counters_forgotten_in_order_cost_one_range() {
        let ledger = Ledger::new(limits(64 * 1024, 1 << 30));
        let p = ledger.partition(NodeId::from_bytes([1; 32]));
        let mut p = p.lock().unwrap();
        let t = Instant::now();
        let start = 1u64 << 60;
        for n in start..start + 50_000 {
            run(&mut p, &id(n), b"a small answer of some bytes", t);
        }
        // Tens of thousands of answers through a 64 KiB quota: never full.
        assert!(p.bytes() <= 64 * 1024);
        assert_eq!(p.forgotten.ranges.len(), 1);
        assert_eq!(
            p.check(&id(start), ROUTE, 0, t, false, false),
            Check::Forgotten
        );
        assert_eq!(
            p.check(&id(start + 49_999), ROUTE, 0, t, false, false)
                .clone(),
            Check::Replay(Bytes::from_static(b"a small answer of some bytes"))
        );
        assert_eq!(
            p.check(&id(start + 50_000), ROUTE, 0, t, false, false),
            Check::New
        );
        // A route that finds repeats by its own key (a task submit) is let
        // through to it once the answer was released.
        assert_eq!(p.check(&id(start), ROUTE, 0, t, true, true), Check::Begun);
        assert_eq!(
            p.check(&id(start), ROUTE, 0, t, false, true),
            Check::Running
        );
    }

    #[test]
    fn ranges_merge_when_answers_come_out_of_order() {
        let mut f = Forgotten::new(RandomState::new());
        let t = Instant::now();
        assert_eq!(f.insert(&id(10), t), RANGE_COST as isize);
        assert_eq!(f.insert(&id(12), t), RANGE_COST as isize);
        assert_eq!(f.insert(&id(11), t), -(RANGE_COST as isize));
        assert_eq!(f.ranges.len(), 1);
        assert_eq!(f.insert(&id(9), t), 0);
        assert_eq!(f.insert(&id(13), t), 0);
        assert!(f.contains(&id(9)) && f.contains(&id(13)));
        assert!(!f.contains(&id(8)) && !f.contains(&id(14)));
        assert_eq!(f.len(), 5);
        // Not canonical numbers: digests.
        for s in ["010", "+1", "1a", "18446744073709551616"] {
            assert_eq!(numeric(s), None, "{s}");
            assert_eq!(f.insert(&named(s), t), DIGEST_COST as isize);
            assert!(f.contains(&named(s)));
        }
        assert_eq!(numeric("0"), Some(0));
        assert_eq!(numeric("18446744073709551615"), Some(u64::MAX));
        assert_eq!(f.insert(&id(u64::MAX), t), RANGE_COST as isize);
    }

    #[test]
    fn everything_leaves_after_the_window() {
        let ledger = Ledger::new(limits(32 * 1024, 1 << 30));
        let p = ledger.partition(NodeId::from_bytes([1; 32]));
        let t = Instant::now();
        {
            let mut p = p.lock().unwrap();
            for n in 0..200 {
                run(&mut p, &named(&format!("k{n}")), b"answer", t);
                run(&mut p, &id(n), b"answer", t);
            }
            assert!(p.forgotten.len() > 0);
        }
        let later = t + Duration::from_secs(61);
        {
            let mut p = p.lock().unwrap();
            assert_eq!(
                p.check(&named("k0"), ROUTE, 0, later, false, false),
                Check::New
            );
            assert_eq!(p.check(&id(0), ROUTE, 0, later, false, false), Check::New);
            assert!(p.is_empty());
            assert_eq!(p.bytes(), PARTITION_COST);
        }
        drop(p);
        ledger.sweep(later);
        assert_eq!(ledger.sizes().senders, 0);
        assert_eq!(ledger.totals.bytes.load(Ordering::Relaxed), 0);
        assert_eq!(ledger.totals.floor.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_node_budget_bounds_the_sum_of_senders() {
        // Each sender could hold 1 MiB, the node only 64 KiB in all.
        let ledger = Ledger::new(limits(1 << 20, 64 * 1024));
        let t = Instant::now();
        let mut refused = false;
        'senders: for s in 0..1000u16 {
            let mut key = [0u8; 32];
            key[..2].copy_from_slice(&s.to_le_bytes());
            let p = ledger.partition(NodeId::from_bytes(key));
            let mut p = p.lock().unwrap();
            for n in 0..10 {
                let r = named(&format!("s{n}"));
                match p.check(&r, ROUTE, 0, t, false, false) {
                    Check::New => {
                        p.begin(&r, ROUTE);
                        p.complete(&r, ROUTE, None, Bytes::from_static(b"x"), t);
                    }
                    Check::Full => {
                        refused = true;
                        break 'senders;
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert!(
            refused,
            "new senders are refused once the node budget is used"
        );
        assert!(ledger.totals.floor.load(Ordering::Relaxed) <= 64 * 1024 + DIGEST_COST);
    }

    #[test]
    fn upkeep_is_linear_in_the_number_of_completions() {
        // A quota that forces a release on nearly every completion.
        let ledger = Ledger::new(limits(256 * 1024, 1 << 30));
        let p = ledger.partition(NodeId::from_bytes([1; 32]));
        let mut p = p.lock().unwrap();
        let t = Instant::now();
        const N: usize = 30_000;
        for n in 0..N {
            let r = id(n as u64);
            assert_eq!(p.check(&r, ROUTE, 0, t, false, false), Check::New);
            p.begin(&r, ROUTE);
            p.complete(&r, ROUTE, None, Bytes::from_static(&[7; 300]), t);
        }
        assert!(
            p.work <= 4 * N,
            "upkeep took {} steps for {N} completions",
            p.work
        );
    }
}
