//! The remembered answers of state-changing controller requests, as the
//! store keeps them: per sender, bounded in bytes (the sender's own
//! oldest answers go first) and in time (wall clock, so that the window
//! means the same after a restart).

use std::collections::{HashMap, VecDeque};

use capwire_envelope::{ErrorBody, NodeId, RawValue};

use crate::store::{AnswerKey, AnswerRecord};

/// What a remembered answer says.
pub(crate) type Answer = Result<RawValue, ErrorBody>;

/// Bounds of the remembered answers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnswerLimits {
    /// How long an answer is remembered, in milliseconds.
    pub(crate) window_ms: u64,
    /// Bytes one sender's answers may take.
    pub(crate) sender_max_bytes: usize,
}

#[derive(Debug, Default)]
struct SenderAnswers {
    /// Oldest first: (seq, req_id).
    order: VecDeque<(u64, String)>,
    bytes: usize,
}

/// The index of remembered answers (what the store holds, in memory).
#[derive(Debug)]
pub(crate) struct Answers {
    by_key: HashMap<AnswerKey, AnswerRecord>,
    senders: HashMap<NodeId, SenderAnswers>,
    next_seq: u64,
    limits: AnswerLimits,
}

/// How a lookup came out.
#[derive(Debug, PartialEq)]
pub(crate) enum Lookup {
    /// Never answered (or forgotten): run it.
    New,
    /// Answered before, for the same (cap, verb): this is the answer.
    Answered(Answer),
    /// Answered before, for another (cap, verb).
    OtherVerb,
}

fn decode(record: &AnswerRecord) -> Answer {
    let body = RawValue::from_slice(&record.body);
    if record.ok {
        body.map_err(|e| ErrorBody::new(capwire_envelope::ErrorCode::Internal, e.to_string()))
    } else {
        match capwire_envelope::from_slice::<ErrorBody>(&record.body) {
            Ok(b) => Err(b),
            Err(e) => Err(ErrorBody::new(
                capwire_envelope::ErrorCode::Internal,
                format!("remembered answer unreadable: {e}"),
            )),
        }
    }
}

impl Answers {
    /// The index of `records` (as loaded), dropping those older than the
    /// window at `now_ms`; returns it with the keys of the dropped ones.
    pub(crate) fn load(
        records: Vec<AnswerRecord>,
        limits: AnswerLimits,
        now_ms: u64,
    ) -> (Self, Vec<AnswerKey>) {
        let mut records = records;
        records.sort_by_key(|r| r.seq);
        let mut me = Self {
            by_key: HashMap::new(),
            senders: HashMap::new(),
            next_seq: records.last().map_or(1, |r| r.seq + 1),
            limits,
        };
        let mut expired = Vec::new();
        for r in records {
            if r.at_ms.saturating_add(limits.window_ms) <= now_ms {
                expired.push(r.key);
                continue;
            }
            me.insert(r);
        }
        (me, expired)
    }

    fn insert(&mut self, r: AnswerRecord) {
        let s = self.senders.entry(r.key.sender).or_default();
        s.order.push_back((r.seq, r.key.req_id.clone()));
        s.bytes += r.cost();
        self.by_key.insert(r.key.clone(), r);
    }

    fn remove(&mut self, key: &AnswerKey) {
        if let Some(r) = self.by_key.remove(key)
            && let Some(s) = self.senders.get_mut(&key.sender)
        {
            s.bytes -= r.cost();
            s.order.retain(|(seq, _)| *seq != r.seq);
            if s.order.is_empty() {
                self.senders.remove(&key.sender);
            }
        }
    }

    /// What became of `key` on (`cap`, `verb`).
    pub(crate) fn lookup(&self, key: &AnswerKey, cap: &str, verb: &str, now_ms: u64) -> Lookup {
        match self.by_key.get(key) {
            Some(r) if r.at_ms.saturating_add(self.limits.window_ms) <= now_ms => Lookup::New,
            Some(r) if r.cap == cap && r.verb == verb => Lookup::Answered(decode(r)),
            Some(_) => Lookup::OtherVerb,
            None => Lookup::New,
        }
    }

    /// The record for `answer` and the keys it pushes out: the sender's
    /// expired answers, then its oldest until it fits its quota. Nothing
    /// changes until [`Answers::apply`].
    pub(crate) fn prepare(
        &self,
        key: AnswerKey,
        cap: &str,
        verb: &str,
        answer: &Answer,
        now_ms: u64,
    ) -> Result<(AnswerRecord, Vec<AnswerKey>), capwire_envelope::EncodeError> {
        let (ok, body) = match answer {
            Ok(v) => (true, v.as_bytes().to_vec()),
            Err(b) => (false, capwire_envelope::to_vec(b)?),
        };
        let record = AnswerRecord {
            key,
            cap: cap.to_owned(),
            verb: verb.to_owned(),
            ok,
            body,
            at_ms: now_ms,
            seq: self.next_seq,
        };
        let mut out = Vec::new();
        if let Some(s) = self.senders.get(&record.key.sender) {
            let mut bytes = s.bytes + record.cost();
            // A replaced answer (an expired one under the same key) frees its bytes.
            if let Some(old) = self.by_key.get(&record.key) {
                bytes -= old.cost();
                out.push(old.key.clone());
            }
            for (_, req_id) in &s.order {
                let k = AnswerKey {
                    sender: record.key.sender,
                    req_id: req_id.clone(),
                };
                if k == record.key {
                    continue;
                }
                let Some(old) = self.by_key.get(&k) else {
                    continue;
                };
                let expired = old.at_ms.saturating_add(self.limits.window_ms) <= now_ms;
                if !expired && bytes <= self.limits.sender_max_bytes {
                    break;
                }
                bytes -= old.cost();
                out.push(k);
            }
        }
        Ok((record, out))
    }

    /// Makes a prepared change (now durable) visible.
    pub(crate) fn apply(&mut self, record: AnswerRecord, released: &[AnswerKey]) {
        for k in released {
            self.remove(k);
        }
        self.remove(&record.key);
        self.next_seq = self.next_seq.max(record.seq + 1);
        self.insert(record);
    }

    /// Answers remembered, over all senders.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8, req: &str) -> AnswerKey {
        AnswerKey {
            sender: NodeId::from_bytes([n; 32]),
            req_id: req.to_owned(),
        }
    }

    fn answers(max: usize) -> Answers {
        Answers::load(
            Vec::new(),
            AnswerLimits {
                window_ms: 1000,
                sender_max_bytes: max,
            },
            0,
        )
        .0
    }

    fn put(a: &mut Answers, k: AnswerKey, now: u64) -> Vec<AnswerKey> {
        let (r, out) = a
            .prepare(k, "core.x", "set", &Ok(RawValue::null()), now)
            .unwrap();
        a.apply(r, &out);
        out
    }

    #[test]
    fn answers_are_bound_to_their_verb_and_expire() {
        let mut a = answers(1 << 20);
        put(&mut a, key(1, "r1"), 10);
        assert_eq!(
            a.lookup(&key(1, "r1"), "core.x", "set", 20),
            Lookup::Answered(Ok(RawValue::null()))
        );
        assert_eq!(
            a.lookup(&key(1, "r1"), "core.x", "get", 20),
            Lookup::OtherVerb
        );
        assert_eq!(a.lookup(&key(2, "r1"), "core.x", "set", 20), Lookup::New);
        assert_eq!(a.lookup(&key(1, "r1"), "core.x", "set", 1010), Lookup::New);
    }

    #[test]
    fn a_sender_over_its_quota_releases_only_its_own_oldest() {
        let one = answers(1 << 20);
        let (r, _) = one
            .prepare(key(1, "r9"), "core.x", "set", &Ok(RawValue::null()), 0)
            .unwrap();
        let mut a = answers(r.cost() * 3);
        put(&mut a, key(2, "victim"), 0);
        for i in 0..3 {
            assert!(put(&mut a, key(1, &format!("r{i}")), 0).is_empty());
        }
        assert_eq!(put(&mut a, key(1, "r3"), 0), vec![key(1, "r0")]);
        assert_eq!(a.len(), 4);
        assert!(matches!(
            a.lookup(&key(2, "victim"), "core.x", "set", 0),
            Lookup::Answered(_)
        ));
    }

    #[test]
    fn loading_drops_what_has_expired() {
        let mut a = answers(1 << 20);
        put(&mut a, key(1, "old"), 0);
        put(&mut a, key(1, "new"), 900);
        let records: Vec<_> = a.by_key.values().cloned().collect();
        let (b, expired) = Answers::load(
            records,
            AnswerLimits {
                window_ms: 1000,
                sender_max_bytes: 1 << 20,
            },
            1500,
        );
        assert_eq!(expired, vec![key(1, "old")]);
        assert_eq!(b.len(), 1);
        assert_eq!(b.next_seq, 3);
    }
}
