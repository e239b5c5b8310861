//! Counters per (cap, verb, outcome), readable from the node.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// A request with the same (sender, req_id) was still running.
    Duplicate,
    /// A repeated request answered from the ledger; no handler ran.
    Replayed,
    /// Refused because too many requests were in flight.
    Overloaded,
    /// Cancelled by the caller or by its deadline before it finished.
    Cancelled,
}

impl Outcome {
    /// A short stable name, used in traces.
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
        }
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
#[derive(Debug, Clone, Default)]
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

const OUTCOMES: [Outcome; 9] = [
    Outcome::Ok,
    Outcome::Failed,
    Outcome::UnknownVerb,
    Outcome::Unauthorized,
    Outcome::BadArgs,
    Outcome::Duplicate,
    Outcome::Replayed,
    Outcome::Overloaded,
    Outcome::Cancelled,
];

type PerVerb = HashMap<Box<str>, [u64; OUTCOMES.len()]>;

/// Counters. Registered names get their own rows; all other names share one
/// counter, so a peer cannot grow this table by inventing names.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    known: Mutex<HashMap<Box<str>, PerVerb>>,
    unknown: AtomicU64,
}

impl Metrics {
    /// Counts an outcome for a (cap, verb) that the registry knows.
    pub(crate) fn count_known(&self, cap: &str, verb: &str, outcome: Outcome) {
        let slot = OUTCOMES.iter().position(|o| *o == outcome).unwrap_or(0);
        let mut map = self.known.lock().unwrap_or_else(|e| e.into_inner());
        // Borrowed lookups first, so the steady state allocates nothing.
        if let Some(verbs) = map.get_mut(cap) {
            if let Some(counts) = verbs.get_mut(verb) {
                counts[slot] += 1;
                return;
            }
            let mut counts = [0; OUTCOMES.len()];
            counts[slot] = 1;
            verbs.insert(verb.into(), counts);
            return;
        }
        let mut counts = [0; OUTCOMES.len()];
        counts[slot] = 1;
        map.entry(cap.into())
            .or_default()
            .insert(verb.into(), counts);
    }

    /// Counts an envelope whose (cap, verb) is not registered.
    pub(crate) fn count_unknown(&self) {
        self.unknown.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let map = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows = Vec::new();
        for (cap, verbs) in map.iter() {
            for (verb, counts) in verbs {
                for (outcome, count) in OUTCOMES.iter().zip(counts) {
                    if *count > 0 {
                        rows.push(MetricRow {
                            cap: Some(cap.to_string()),
                            verb: Some(verb.to_string()),
                            outcome: *outcome,
                            count: *count,
                        });
                    }
                }
            }
        }
        drop(map);
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
