//! The request ledger: which (sender, req_id) pairs are running or finished.
//!
//! It makes request handling idempotent per (sender, req_id): a request that
//! is still running is answered `duplicate`, a finished one gets its
//! remembered response again, and a handler never runs twice for the same
//! pair while the pair is remembered. Memory is bounded by a count, a byte
//! budget for remembered responses, and a time window.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use capwire_envelope::{NodeId, ReqId};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

type Key = (NodeId, ReqId);

#[derive(Debug)]
enum Slot {
    /// The handler is running; cancelling the token cancels it.
    Running(CancellationToken),
    /// Finished at `at`; `response` is the encoded response frame, or `None`
    /// when it was dropped to stay within the byte budget.
    Done {
        at: Instant,
        response: Option<Bytes>,
    },
}

/// What to do with a newly arrived request.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Not seen before: run it. The ledger now holds it as running.
    Run,
    /// The same pair is running now.
    Running,
    /// Finished before; send this encoded response again.
    Replay(Bytes),
    /// Finished before, but its response is no longer kept.
    Forgotten,
    /// Not seen before, and there is no room to run it now. Nothing was
    /// recorded: the same request may be sent again later.
    NoRoom,
}

/// Bounds of the ledger.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LedgerLimits {
    pub(crate) window: Duration,
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: usize,
}

#[derive(Debug)]
pub(crate) struct Ledger {
    limits: LedgerLimits,
    slots: HashMap<Key, Slot>,
    /// Finished entries in completion order (oldest first).
    order: VecDeque<(Instant, Key)>,
    bytes: usize,
}

impl Ledger {
    pub(crate) fn new(limits: LedgerLimits) -> Self {
        Self {
            limits,
            slots: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Registers a new request, or says why it must not run. A request
    /// seen before is recognised whether or not there is `room`; a new one
    /// is admitted only when there is.
    pub(crate) fn admit(
        &mut self,
        sender: NodeId,
        req_id: &ReqId,
        cancel: &CancellationToken,
        room: bool,
        now: Instant,
    ) -> Admission {
        self.expire(now);
        let key = (sender, req_id.clone());
        match self.slots.get(&key) {
            Some(Slot::Running(_)) => Admission::Running,
            Some(Slot::Done {
                response: Some(r), ..
            }) => Admission::Replay(r.clone()),
            Some(Slot::Done { response: None, .. }) => Admission::Forgotten,
            None if !room => Admission::NoRoom,
            None => {
                self.slots.insert(key, Slot::Running(cancel.clone()));
                Admission::Run
            }
        }
    }

    /// Records the response of a request that was admitted with `Run`.
    pub(crate) fn complete(
        &mut self,
        sender: NodeId,
        req_id: &ReqId,
        response: Bytes,
        now: Instant,
    ) {
        let key = (sender, req_id.clone());
        let keep = response.len() <= self.limits.max_bytes;
        if keep {
            self.bytes += response.len();
        }
        self.slots.insert(
            key.clone(),
            Slot::Done {
                at: now,
                response: keep.then_some(response),
            },
        );
        self.order.push_back((now, key));
        self.expire(now);
    }

    /// Cancels a running request; `true` when there was one.
    pub(crate) fn cancel(&self, sender: NodeId, req_id: &ReqId) -> bool {
        match self.slots.get(&(sender, req_id.clone())) {
            Some(Slot::Running(token)) => {
                token.cancel();
                true
            }
            _ => false,
        }
    }

    /// Number of requests running now.
    pub(crate) fn running(&self) -> usize {
        self.slots.len() - self.order.len()
    }

    /// Number of finished requests remembered.
    pub(crate) fn remembered(&self) -> usize {
        self.order.len()
    }

    fn expire(&mut self, now: Instant) {
        // Over the byte budget: drop the oldest responses but keep their
        // entries, so a repeat is still recognised and not run again.
        let mut idx = 0;
        while self.bytes > self.limits.max_bytes && idx < self.order.len() {
            let key = &self.order[idx].1;
            if let Some(Slot::Done { response, .. }) = self.slots.get_mut(key)
                && let Some(r) = response.take()
            {
                self.bytes -= r.len();
            }
            idx += 1;
        }
        while let Some((at, _)) = self.order.front() {
            let too_old = now.saturating_duration_since(*at) >= self.limits.window;
            if !too_old && self.order.len() <= self.limits.max_entries {
                break;
            }
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            // Only remove the slot if it is the entry this record describes.
            if let Some(Slot::Done { at: slot_at, .. }) = self.slots.get(&key)
                && *slot_at == at
                && let Some(Slot::Done {
                    response: Some(r), ..
                }) = self.slots.remove(&key)
            {
                self.bytes -= r.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LedgerLimits {
        LedgerLimits {
            window: Duration::from_secs(60),
            max_entries: 3,
            max_bytes: 10,
        }
    }

    fn id(n: u64) -> ReqId {
        ReqId::from_u64(n)
    }

    #[test]
    fn run_then_replay() {
        let mut l = Ledger::new(limits());
        let a = NodeId::from_bytes([1; 32]);
        let t = Instant::now();
        let tok = CancellationToken::new();
        assert!(matches!(l.admit(a, &id(1), &tok, true, t), Admission::Run));
        assert!(matches!(
            l.admit(a, &id(1), &tok, true, t),
            Admission::Running
        ));
        // another sender with the same req_id is independent
        let b = NodeId::from_bytes([2; 32]);
        assert!(matches!(l.admit(b, &id(1), &tok, true, t), Admission::Run));
        assert!(l.cancel(a, &id(1)));
        assert!(tok.is_cancelled());
        l.complete(a, &id(1), Bytes::from_static(b"resp"), t);
        match l.admit(a, &id(1), &tok, true, t) {
            Admission::Replay(r) => assert_eq!(&r[..], b"resp"),
            other => panic!("{other:?}"),
        }
        assert_eq!(l.running(), 1);
        assert_eq!(l.remembered(), 1);
        // Without room, known requests are still recognised; new ones are
        // refused and leave no trace.
        assert!(matches!(
            l.admit(a, &id(1), &tok, false, t),
            Admission::Replay(_)
        ));
        assert!(matches!(
            l.admit(b, &id(1), &tok, false, t),
            Admission::Running
        ));
        assert!(matches!(
            l.admit(a, &id(9), &tok, false, t),
            Admission::NoRoom
        ));
        assert!(matches!(l.admit(a, &id(9), &tok, true, t), Admission::Run));
    }

    #[test]
    fn bounded_by_count_time_and_bytes() {
        let mut l = Ledger::new(limits());
        let a = NodeId::from_bytes([1; 32]);
        let t = Instant::now();
        let tok = CancellationToken::new();
        for n in 0..5 {
            assert!(matches!(l.admit(a, &id(n), &tok, true, t), Admission::Run));
            l.complete(a, &id(n), Bytes::from_static(b"1234"), t);
        }
        assert_eq!(l.remembered(), 3);
        assert!(l.bytes <= 10);
        // the oldest two were dropped entirely and may run again
        assert!(matches!(l.admit(a, &id(0), &tok, true, t), Admission::Run));
        // entry 2's response was dropped for bytes but the entry is kept
        assert!(matches!(
            l.admit(a, &id(2), &tok, true, t),
            Admission::Forgotten
        ));
        assert!(matches!(
            l.admit(a, &id(4), &tok, true, t),
            Admission::Replay(_)
        ));
        let later = t + Duration::from_secs(61);
        assert!(matches!(
            l.admit(a, &id(4), &tok, true, later),
            Admission::Run
        ));
        assert_eq!(l.remembered(), 0);
        assert_eq!(l.bytes, 0);
    }
}
