//! Counters per (cap, verb, outcome), readable from the node.
//!
//! Each registered route has its own row of atomic counters, found by the
//! route's index, so counting takes no lock; names that are not registered
//! share one counter, so a peer cannot grow the table by inventing names.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use capwire_manifest::Registry;

/// What became of one inbound envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Outcome {
    /// Authorized; the handler ran and succeeded.
    Ok,
    /// Authorized; the handler ran and returned an error (or panicked).
    Failed,
    /// Denied by the chokepoint: unknown or unlisted (cap, verb).
    UnknownVerb,
    /// Denied by the chokepoint: controller verb from a non-controller.
    Unauthorized,
    /// Authorized, but the arguments did not decode into the verb's type.
    BadArgs,
    /// A request with the same (sender, req_id) was running, was answered
    /// under another (cap, verb), or its response was released.
    Duplicate,
    /// A repeated request answered from the ledger; no handler ran.
    Replayed,
    /// Refused because a bound was reached (in flight, ledger quota).
    Overloaded,
    /// Cancelled by the caller, by shutdown or by its deadline.
    Cancelled,
    /// The frame's shape did not match the verb's kind: a request verb
    /// sent without `req_id`, or a notification verb with one.
    WrongKind,
}

impl Outcome {
    /// Every outcome, in counter order.
    pub const ALL: [Outcome; 10] = [
        Outcome::Ok,
        Outcome::Failed,
        Outcome::UnknownVerb,
        Outcome::Unauthorized,
        Outcome::BadArgs,
        Outcome::Duplicate,
        Outcome::Replayed,
        Outcome::Overloaded,
        Outcome::Cancelled,
        Outcome::WrongKind,
    ];

    /// A short stable name, used in traces and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::UnknownVerb => "unknown_verb",
            Outcome::Unauthorized => "unauthorized",
            Outcome::BadArgs => "bad_args",
            Outcome::Duplicate => "duplicate",
            Outcome::Replayed => "replayed",
            Outcome::Overloaded => "overloaded",
            Outcome::Cancelled => "cancelled",
            Outcome::WrongKind => "wrong_kind",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One counter of a [`MetricsSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricRow {
    /// The capability, or `None` for names that are not registered.
    pub cap: Option<String>,
    /// The verb, or `None` for names that are not registered.
    pub verb: Option<String>,
    /// The outcome counted.
    pub outcome: Outcome,
    /// How many envelopes had this outcome.
    pub count: u64,
}

/// A copy of the node's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Every non-zero counter, sorted.
    pub rows: Vec<MetricRow>,
}

impl MetricsSnapshot {
    /// The count for a registered (cap, verb) and outcome; 0 if never seen.
    pub fn count(&self, cap: &str, verb: &str, outcome: Outcome) -> u64 {
        self.rows
            .iter()
            .find(|r| {
                r.cap.as_deref() == Some(cap)
                    && r.verb.as_deref() == Some(verb)
                    && r.outcome == outcome
            })
            .map_or(0, |r| r.count)
    }

    /// The count of envelopes whose (cap, verb) is not registered.
    pub fn unknown(&self) -> u64 {
        self.rows
            .iter()
            .filter(|r| r.cap.is_none())
            .map(|r| r.count)
            .sum()
    }
}

type Row = [AtomicU64; Outcome::ALL.len()];

/// The counters.
pub(crate) struct Metrics {
    names: Box<[(String, String)]>,
    rows: Box<[Row]>,
    unknown: AtomicU64,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("routes", &self.names.len())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// One row per route of `registry`, in the registry's route order.
    pub(crate) fn for_registry<H>(registry: &Registry<H>) -> Self {
        let names: Box<[(String, String)]> = registry
            .routes()
            .map(|r| {
                (
                    r.info().cap().as_str().to_owned(),
                    r.info().verb().as_str().to_owned(),
                )
            })
            .collect();
        let rows = names
            .iter()
            .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
            .collect();
        Self {
            names,
            rows,
            unknown: AtomicU64::new(0),
        }
    }

    /// Counts an outcome for the route with this index.
    pub(crate) fn count(&self, route: u32, outcome: Outcome) {
        if let Some(row) = usize::try_from(route).ok().and_then(|i| self.rows.get(i)) {
            row[outcome.slot()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts an envelope whose (cap, verb) is not registered.
    pub(crate) fn count_unknown(&self) {
        self.unknown.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let mut rows = Vec::new();
        for ((cap, verb), row) in self.names.iter().zip(self.rows.iter()) {
            for (outcome, counter) in Outcome::ALL.iter().zip(row.iter()) {
                let count = counter.load(Ordering::Relaxed);
                if count > 0 {
                    rows.push(MetricRow {
                        cap: Some(cap.clone()),
                        verb: Some(verb.clone()),
                        outcome: *outcome,
                        count,
                    });
                }
            }
        }
        let unknown = self.unknown.load(Ordering::Relaxed);
        if unknown > 0 {
            rows.push(MetricRow {
                cap: None,
                verb: None,
                outcome: Outcome::UnknownVerb,
                count: unknown,
            });
        }
        rows.sort();
        MetricsSnapshot { rows }
    }
}
