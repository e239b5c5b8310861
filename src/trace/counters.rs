//! How many trace contexts a node was sent, and how many it dropped, by
//! reason.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::trace::{TraceContext, TraceError};

/// The reasons a context is dropped, in the order of the counters.
const REASONS: [(TraceError, &str); 5] = [
    (TraceError::Item, "item"),
    (TraceError::Traceparent, "traceparent"),
    (TraceError::ZeroId, "zero_id"),
    (TraceError::Tracestate, "tracestate"),
    (TraceError::Version, "version"),
];

/// The node's trace context counters.
#[derive(Debug, Default)]
pub(crate) struct TraceCounters {
    accepted: AtomicU64,
    dropped: [AtomicU64; REASONS.len()],
}

impl TraceCounters {
    /// Reads the `trace` item of a control frame that came on a session of
    /// `version`, counting what became of it.
    pub(crate) fn read(&self, item: Option<&[u8]>, version: u32) -> Option<TraceContext> {
        let item = item?;
        let read = if version < capwire_envelope::PROTOCOL_V3 {
            Err(TraceError::Version)
        } else {
            TraceContext::from_item(item)
        };
        match read {
            Ok(cx) => {
                self.accepted.fetch_add(1, Ordering::Relaxed);
                Some(cx)
            }
            Err(e) => {
                if let Some(i) = REASONS.iter().position(|(r, _)| *r == e) {
                    self.dropped[i].fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(reason = %e, "trace context dropped");
                None
            }
        }
    }

    /// Contexts accepted, and those dropped by reason (only reasons seen).
    pub(crate) fn figures(&self) -> (u64, Vec<(&'static str, u64)>) {
        let dropped = REASONS
            .iter()
            .zip(&self.dropped)
            .map(|((_, name), n)| (*name, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        (self.accepted.load(Ordering::Relaxed), dropped)
    }
}
