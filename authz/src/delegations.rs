//! The tokens presented to a node, per holder, and the answers they gave,
//! cached until they may change: what the chokepoint asks about a
//! controller verb from a sender that is not the bound control plane.
//!
//! Bounded: [`MAX_TOKENS_PER_HOLDER`] tokens per holder (a newer one
//! replaces the oldest), [`MAX_HOLDERS`] holders (then the holder whose
//! tokens expire first is dropped), [`MAX_ANSWERS_PER_HOLDER`] cached
//! answers per holder, and the revocations the node was told of
//! ([`MAX_REVOCATIONS`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use capwire_envelope::NodeId;

use crate::binding::Binding;
use crate::grant::{GrantDenied, Verified};

/// Tokens kept per holder.
pub const MAX_TOKENS_PER_HOLDER: usize = 4;
/// Holders with tokens kept.
pub const MAX_HOLDERS: usize = 4096;
/// Cached answers per holder (one per verb asked).
pub const MAX_ANSWERS_PER_HOLDER: usize = 64;
/// Revocations kept (each while the binding it was made under lasts).
pub const MAX_REVOCATIONS: usize = 10_000;
/// A known defect, planted by capwire's test-only `seeded-bugs` feature
/// to show its history checker catches it: a revocation is recorded, but
/// the tokens kept and the answers cached stay, and go on letting calls
/// through. Not an API.
#[cfg(feature = "seeded-bugs")]
#[doc(hidden)]
pub static SEEDED_CACHE_OUTLIVES_REVOCATION: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Longest an answer is cached without being asked again.
const ANSWER_TTL: Duration = Duration::from_secs(60);

/// A delegated call let through: which token did it, and until when the
/// answer holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delegated {
    /// The token's first revocation id, as lowercase hex.
    pub grant: Arc<str>,
    /// The answer holds until then (at most a minute ahead), unless a
    /// presentation, a revocation or a binding change comes first: work
    /// the token let through asks again then.
    pub until: SystemTime,
}

#[derive(Debug, Clone)]
struct Answer {
    until: SystemTime,
    epoch: u64,
    result: Result<Arc<str>, GrantDenied>,
}

struct Held {
    token: Arc<Verified>,
    id: Arc<str>,
}

#[derive(Default)]
struct Holder {
    tokens: Vec<Held>,
    answers: HashMap<(Box<str>, Box<str>), Answer>,
}

impl Holder {
    fn expires(&self) -> SystemTime {
        self.tokens
            .iter()
            .map(|h| h.token.expires())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

#[derive(Default)]
struct Inner {
    holders: HashMap<NodeId, Holder>,
    revoked: HashSet<Vec<u8>>,
    /// Bumped by every present, revocation and clear.
    generation: u64,
}

/// The presented tokens and the revocations of one node. Shared by the
/// chokepoint (which reads it) and the `core.grants` verbs (which
/// present and revoke).
#[derive(Default)]
pub struct Delegations {
    inner: Mutex<Inner>,
    counts: Counts,
}

/// What the node's grants did, counted.
#[derive(Default)]
struct Counts {
    presented: AtomicU64,
    calls: AtomicU64,
    /// Refusals (of presentations and of calls), by reason.
    refused: Mutex<BTreeMap<&'static str, u64>>,
}

/// A reading of the grant counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantCounts {
    /// Tokens presented and kept.
    pub presented: u64,
    /// Controller calls a token let through.
    pub calls: u64,
    /// Presentations and calls refused, by reason label (`expired`, ...).
    pub refused: Vec<(&'static str, u64)>,
}

impl std::fmt::Debug for Delegations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Delegations")
            .field("holders", &inner.holders.len())
            .field("revoked", &inner.revoked.len())
            .finish()
    }
}

/// Too many revocations are kept: the new one is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the node keeps at most 10000 revocations")]
pub struct TooManyRevocations;

impl Delegations {
    /// With these revocations already made (loaded from the store).
    pub fn with_revoked(revoked: impl IntoIterator<Item = Vec<u8>>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                holders: HashMap::new(),
                revoked: revoked.into_iter().collect(),
                generation: 0,
            }),
            counts: Counts::default(),
        }
    }

    /// Counts a presentation: kept, or refused for `why`.
    pub fn count_present(&self, result: Result<(), &GrantDenied>) {
        match result {
            Ok(()) => {
                self.counts.presented.fetch_add(1, Ordering::Relaxed);
            }
            Err(why) => self.count_refused(why),
        }
    }

    /// Counts a controller call a token let through.
    pub fn count_call(&self) {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal for `why`.
    pub fn count_refused(&self, why: &GrantDenied) {
        *self
            .counts
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(why.as_str())
            .or_default() += 1;
    }

    /// The counters now.
    pub fn counts(&self) -> GrantCounts {
        GrantCounts {
            presented: self.counts.presented.load(Ordering::Relaxed),
            calls: self.counts.calls.load(Ordering::Relaxed),
            refused: self
                .counts
                .refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `true` when `id` was revoked.
    pub fn is_revoked(&self, id: &[u8]) -> bool {
        self.lock().revoked.contains(id)
    }

    /// The number of revocations kept.
    pub fn revocations(&self) -> usize {
        self.lock().revoked.len()
    }

    /// The number of holders with tokens.
    pub fn holders(&self) -> usize {
        self.lock().holders.len()
    }

    /// Keeps a verified token for its holder `holder`. Checked again
    /// against the revocations under the lock, so a revocation that raced
    /// the verification still wins.
    ///
    /// # Errors
    /// [`GrantDenied::Revoked`].
    pub fn present(
        &self,
        holder: NodeId,
        token: Verified,
        now: SystemTime,
    ) -> Result<(), GrantDenied> {
        let mut inner = self.lock();
        if token
            .revocation_ids()
            .iter()
            .any(|id| inner.revoked.contains(id))
        {
            return Err(GrantDenied::Revoked);
        }
        if !inner.holders.contains_key(&holder) && inner.holders.len() >= MAX_HOLDERS {
            inner
                .holders
                .retain(|_, h| h.expires() + Duration::from_secs(1) > now);
            if inner.holders.len() >= MAX_HOLDERS
                && let Some(first) = inner
                    .holders
                    .iter()
                    .min_by_key(|(_, h)| h.expires())
                    .map(|(id, _)| *id)
            {
                inner.holders.remove(&first);
            }
        }
        let entry = inner.holders.entry(holder).or_default();
        let id: Arc<str> = token.id().into();
        entry
            .tokens
            .retain(|h| h.id != id && h.token.expires() + Duration::from_secs(1) > now);
        if entry.tokens.len() >= MAX_TOKENS_PER_HOLDER {
            entry.tokens.remove(0);
        }
        entry.tokens.push(Held {
            token: Arc::new(token),
            id,
        });
        entry.answers.clear();
        inner.generation += 1;
        Ok(())
    }

    /// Records a revocation and forgets every kept token it revokes.
    ///
    /// # Errors
    /// [`TooManyRevocations`] when [`MAX_REVOCATIONS`] are kept.
    pub fn revoke(&self, id: Vec<u8>) -> Result<(), TooManyRevocations> {
        let mut inner = self.lock();
        if !inner.revoked.contains(&id) && inner.revoked.len() >= MAX_REVOCATIONS {
            return Err(TooManyRevocations);
        }
        #[cfg(feature = "seeded-bugs")]
        if SEEDED_CACHE_OUTLIVES_REVOCATION.load(std::sync::atomic::Ordering::Relaxed) {
            inner.revoked.insert(id);
            return Ok(());
        }
        for holder in inner.holders.values_mut() {
            holder
                .tokens
                .retain(|h| !h.token.revocation_ids().contains(&id));
            holder.answers.clear();
        }
        inner.revoked.insert(id);
        inner.generation += 1;
        Ok(())
    }

    /// Forgets revocations (their time passed, see the store).
    pub fn forget_revocations(&self, ids: &[Vec<u8>]) {
        let mut inner = self.lock();
        for id in ids {
            inner.revoked.remove(id);
        }
    }

    /// Forgets every kept token: the binding changed, so all are void.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.holders.clear();
        inner.generation += 1;
    }

    /// Whether a token presented by `sender` lets it call `cap`/`verb`
    /// now, under `binding`. `None` when `sender` presented no token.
    pub fn check(
        &self,
        sender: &NodeId,
        cap: &str,
        verb: &str,
        binding: &Binding,
        now: SystemTime,
    ) -> Option<Result<Delegated, GrantDenied>> {
        let key = (Box::<str>::from(cap), Box::<str>::from(verb));
        let (tokens, generation) = {
            let inner = self.lock();
            let holder = inner.holders.get(sender)?;
            if holder.tokens.is_empty() {
                return None;
            }
            if let Some(a) = holder.answers.get(&key)
                && a.epoch == binding.epoch()
                && now < a.until
            {
                let until = a.until;
                return Some(a.result.clone().map(|grant| Delegated { grant, until }));
            }
            let tokens: Vec<(Arc<Verified>, Arc<str>)> = holder
                .tokens
                .iter()
                .map(|h| (Arc::clone(&h.token), Arc::clone(&h.id)))
                .collect();
            (tokens, inner.generation)
        };
        // Evaluated without the lock: other holders are not kept waiting.
        let mut best = Err(GrantDenied::NotGranted);
        let mut until = now + ANSWER_TTL;
        let mut allowing = None;
        for (token, id) in &tokens {
            if let Some(next) = token.next_change(now) {
                until = until.min(next);
            }
            let answer = if token.epoch() != binding.epoch() {
                Err(GrantDenied::BindingChanged)
            } else {
                token.allows(cap, verb, now).map(|()| Arc::clone(id))
            };
            match answer {
                Ok(id) => {
                    best = Ok(id);
                    allowing = Some(Arc::clone(token));
                    break;
                }
                // The most telling refusal: anything beats not granted.
                Err(e) if best == Err(GrantDenied::NotGranted) => best = Err(e),
                Err(_) => {}
            }
        }
        // Never in the past (a date at `now` was passed over above).
        let until = until.max(now + Duration::from_millis(1));
        let mut inner = self.lock();
        if inner.generation != generation {
            // Presented, revoked or cleared meanwhile: not cached, and a
            // token revoked meanwhile lets nothing through.
            if let Some(t) = allowing
                && (t
                    .revocation_ids()
                    .iter()
                    .any(|id| inner.revoked.contains(id))
                    || !inner.holders.contains_key(sender))
            {
                return Some(Err(GrantDenied::Revoked));
            }
            return Some(best.map(|grant| Delegated { grant, until }));
        }
        // A refusal for cost may be the machine's load: asked again.
        if best == Err(GrantDenied::TooCostly) {
            return Some(Err(GrantDenied::TooCostly));
        }
        if let Some(holder) = inner.holders.get_mut(sender) {
            if holder.answers.len() >= MAX_ANSWERS_PER_HOLDER {
                holder.answers.clear();
            }
            holder.answers.insert(
                key,
                Answer {
                    until,
                    epoch: binding.epoch(),
                    result: best.clone(),
                },
            );
        }
        Some(best.map(|grant| Delegated { grant, until }))
    }

    /// The latest time any kept token with a block of revocation id `id`
    /// could be valid until (its authority block's expiry, through that
    /// second), if the node holds one: after it, a revocation of `id`
    /// refuses nothing a presentation could bring.
    pub fn lifetime_of(&self, id: &[u8]) -> Option<SystemTime> {
        self.lock()
            .holders
            .values()
            .flat_map(|h| &h.tokens)
            .filter(|h| h.token.revocation_ids().iter().any(|r| r == id))
            .map(|h| h.token.lifetime_end() + Duration::from_secs(1))
            .max()
    }
}
