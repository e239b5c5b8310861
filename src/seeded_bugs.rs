//! Known defects, planted at run time, so that the checked simulation
//! (`tests/checked_bugs.rs`) can show its history checker catches each
//! one. The switch (`plant`) exists only with the `seeded-bugs` feature,
//! which no build but that test's turns on; without it, `planted` is a
//! constant `false` and every branch on it is compiled away. Not an API.

#[cfg(feature = "seeded-bugs")]
use std::sync::atomic::{AtomicU8, Ordering};

/// A defect the checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Bug {
    /// The replay ledger forgets an answer as soon as it is sent: a
    /// request retried under its req_id runs its handler again.
    LedgerForgetsEarly = 1,
    /// The task table finds a submit's task by (sender, req_id) alone: a
    /// req_id reused on another task verb is answered with the first
    /// verb's task.
    TasksKeyedWithoutVerb = 2,
    /// Folding a task's old events deletes its final one: a subscriber
    /// that resumes after the end never sees the final state.
    FoldDropsFinalState = 3,
    /// A revocation leaves the presented tokens and the answers cached
    /// from them in place: the revoked grant goes on letting calls
    /// through.
    CacheOutlivesRevocation = 4,
    /// The node reads the wall clock without its floor: a clock set back
    /// makes an expired grant valid again.
    ClockRunsBack = 5,
}

#[cfg(feature = "seeded-bugs")]
static PLANTED: AtomicU8 = AtomicU8::new(0);

/// Plants `bug` in every node of this process (`None`: none).
#[cfg(feature = "seeded-bugs")]
pub fn plant(bug: Option<Bug>) {
    PLANTED.store(bug.map_or(0, |b| b as u8), Ordering::SeqCst);
    capwire_authz::SEEDED_CACHE_OUTLIVES_REVOCATION
        .store(bug == Some(Bug::CacheOutlivesRevocation), Ordering::SeqCst);
}

/// Whether `bug` is planted.
#[cfg(feature = "seeded-bugs")]
pub(crate) fn planted(bug: Bug) -> bool {
    PLANTED.load(Ordering::Relaxed) == bug as u8
}

/// Whether `bug` is planted: never, in this build.
#[cfg(not(feature = "seeded-bugs"))]
#[inline(always)]
pub(crate) const fn planted(_bug: Bug) -> bool {
    false
}
