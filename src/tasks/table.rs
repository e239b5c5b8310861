//! The tasks of a node as plain state: who submitted what, in which order,
//! in which state, and the rules every change follows. No I/O: the task
//! service decides with it, writes the change, then publishes it.
//!
//! What is kept in memory is each task's record, which holds no bodies
//! (the args and the events stay on disk, and are read when asked for), so
//! that the memory a node spends on tasks is bounded by `max_tasks` records
//! of a few hundred bytes.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use capwire_envelope::{ErrorBody, ErrorCode, NodeId};
use capwire_manifest::{TaskEventKind, TaskState};

use crate::store::{Batch, TaskAuthority, TaskEventRecord, TaskRecord, TaskTrace};

/// A task's id: 16 random bytes, written as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TaskId(pub(crate) [u8; 16]);

impl TaskId {
    /// A fresh id from the operating system's RNG.
    ///
    /// # Errors
    /// The RNG failed (no fallback).
    pub(crate) fn random() -> Result<Self, ErrorBody> {
        let mut id = [0u8; 16];
        getrandom::getrandom(&mut id).map_err(|_| {
            ErrorBody::new(ErrorCode::Internal, "the random number generator failed")
        })?;
        Ok(Self(id))
    }

    /// The id in `text` (32 lowercase hex digits), if it is one.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        if text.len() != 32 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let bytes = base16ct::lower::decode_vec(text).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }

    pub(crate) fn from_slice(bytes: &[u8]) -> Option<Self> {
        Some(Self(bytes.try_into().ok()?))
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&base16ct::lower::encode_string(&self.0))
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({self})")
    }
}

/// The bounds tasks live within.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TaskLimits {
    /// Tasks kept in all, running or ended.
    pub(crate) max_tasks: usize,
    /// Tasks kept per submitter.
    pub(crate) max_per_sender: usize,
    /// Events kept per task; older ones are folded away.
    pub(crate) max_events: u64,
    /// The largest body of one event (progress, question, answer, result).
    pub(crate) max_body: usize,
    /// How long an ended task is kept.
    pub(crate) retention_ms: u64,
}

/// A task as the table keeps it: its record, without the bodies.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) record: TaskRecord,
}

/// The node's tasks.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskTable {
    tasks: HashMap<TaskId, Entry>,
    /// Submissions in order (`order` of the record): for `list`.
    order: BTreeMap<u64, TaskId>,
    /// (submitter, req_id) -> task: the same submit finds its task.
    origin: HashMap<(NodeId, String), TaskId>,
    per_sender: HashMap<NodeId, usize>,
    next_order: u64,
}

/// A change decided: what to write, and what to publish once written.
#[derive(Debug, Default)]
pub(crate) struct Change {
    pub(crate) batch: Batch,
    /// The events written: task, state after it, seq, kind.
    pub(crate) changed: Vec<(TaskId, TaskState, u64, TaskEventKind)>,
}

impl TaskTable {
    /// The table of `records` (as loaded).
    pub(crate) fn load(records: Vec<TaskRecord>) -> Self {
        let mut t = Self::default();
        for r in records {
            t.insert(r);
        }
        t
    }

    fn insert(&mut self, r: TaskRecord) {
        let Some(id) = TaskId::from_slice(&r.id) else {
            return;
        };
        self.next_order = self.next_order.max(r.order + 1);
        self.order.insert(r.order, id);
        self.origin.insert((r.submitter, r.req_id.clone()), id);
        if !self.tasks.contains_key(&id) {
            *self.per_sender.entry(r.submitter).or_default() += 1;
        }
        self.tasks.insert(id, Entry { record: r });
    }

    fn remove(&mut self, id: &TaskId) {
        let Some(e) = self.tasks.remove(id) else {
            return;
        };
        self.order.remove(&e.record.order);
        self.origin
            .remove(&(e.record.submitter, e.record.req_id.clone()));
        if let Some(n) = self.per_sender.get_mut(&e.record.submitter) {
            *n -= 1;
            if *n == 0 {
                self.per_sender.remove(&e.record.submitter);
            }
        }
    }

    pub(crate) fn get(&self, id: &TaskId) -> Option<&Entry> {
        self.tasks.get(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// The task a submit of `req_id` by `sender` made, if any.
    pub(crate) fn by_origin(&self, sender: &NodeId, req_id: &str) -> Option<TaskId> {
        self.origin.get(&(*sender, req_id.to_owned())).copied()
    }

    /// Tasks by state, for the metrics.
    pub(crate) fn counts(&self) -> BTreeMap<TaskState, usize> {
        let mut c = BTreeMap::new();
        for e in self.tasks.values() {
            *c.entry(e.record.state).or_default() += 1;
        }
        c
    }

    /// The tasks not ended, for a restart.
    pub(crate) fn unfinished(&self) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, e)| !e.record.state.is_final())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Tasks `who` may see (submitted by it, or any when `all`), newest
    /// first, from before `before`, passing `keep`; at most `limit`, and
    /// whether more are left.
    pub(crate) fn page(
        &self,
        who: &NodeId,
        all: bool,
        before: Option<&TaskId>,
        limit: usize,
        keep: impl Fn(&TaskRecord) -> bool,
    ) -> (Vec<TaskId>, bool) {
        let upper = before
            .and_then(|b| self.tasks.get(b))
            .map_or(u64::MAX, |e| e.record.order);
        let mut out = Vec::new();
        for (_, id) in self.order.range(..upper).rev() {
            let Some(e) = self.tasks.get(id) else {
                continue;
            };
            if !(all || e.record.submitter == *who) || !keep(&e.record) {
                continue;
            }
            if out.len() == limit {
                return (out, true);
            }
            out.push(*id);
        }
        (out, false)
    }

    /// A new task, submitted by `sender` with `req_id` to `cap`/`verb`
    /// with `args`: its record and first event (`submitted`).
    /// `priority` tells the node's bound control plane and its contacts
    /// from strangers: strangers together keep at most nine tenths of
    /// `max_tasks`, and when the node is full, a submit of the control
    /// plane or a contact makes room by deleting the oldest ended task of
    /// a stranger before its retention passes.
    ///
    /// # Errors
    /// `overloaded` when the node, or this sender, keeps as many tasks as
    /// it may.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit(
        &mut self,
        limits: &TaskLimits,
        id: TaskId,
        sender: NodeId,
        req_id: &str,
        cap: &str,
        verb: &str,
        args: Vec<u8>,
        authority: Option<TaskAuthority>,
        trace: Option<TaskTrace>,
        priority: &dyn Fn(&NodeId) -> bool,
        now: u64,
        change: &mut Change,
    ) -> Result<TaskRecord, ErrorBody> {
        if self.per_sender.get(&sender).copied().unwrap_or(0) >= limits.max_per_sender {
            return Err(ErrorBody::new(
                ErrorCode::Overloaded,
                "this sender has as many tasks as it may (ended ones until their retention passes); retry later",
            ));
        }
        let full = || {
            ErrorBody::new(
                ErrorCode::Overloaded,
                "the node keeps as many tasks as it may (ended ones until their retention passes); retry later",
            )
        };
        let reserve = limits.max_tasks / 10;
        if priority(&sender) {
            if self.tasks.len() >= limits.max_tasks {
                let oldest = self.order.values().copied().find(|id| {
                    self.tasks.get(id).is_some_and(|e| {
                        e.record.state.is_final() && !priority(&e.record.submitter)
                    })
                });
                let Some(oldest) = oldest else {
                    return Err(full());
                };
                self.remove(&oldest);
                change.batch.del_tasks.push(oldest.0.to_vec());
            }
        } else if self.tasks.len() >= limits.max_tasks
            || (self.tasks.len() >= limits.max_tasks - reserve
                && self
                    .per_sender
                    .iter()
                    .filter(|(who, _)| !priority(who))
                    .map(|(_, n)| n)
                    .sum::<usize>()
                    >= limits.max_tasks - reserve)
        {
            return Err(full());
        }
        let record = TaskRecord {
            id: id.0.to_vec(),
            cap: cap.to_owned(),
            verb: verb.to_owned(),
            submitter: sender,
            req_id: req_id.to_owned(),
            state: TaskState::Submitted,
            created_ms: now,
            updated_ms: now,
            seq: 1,
            first_seq: 1,
            order: self.next_order,
            question_seq: None,
            progress_seq: None,
            error: None,
            authority,
            trace,
        };
        self.next_order += 1;
        let event = TaskEventRecord {
            seq: 1,
            at_ms: now,
            state: TaskState::Submitted,
            kind: TaskEventKind::State,
            body: capwire_envelope::RawValue::null().as_bytes().to_vec(),
        };
        change.batch.put_tasks.push(record.clone());
        change.batch.put_task_args.push((id.0.to_vec(), args));
        change.batch.put_task_events.push((id.0.to_vec(), event));
        change
            .changed
            .push((id, TaskState::Submitted, 1, TaskEventKind::State));
        self.insert(record.clone());
        Ok(record)
    }

    /// Appends an event to task `id`, which changes its record; the new
    /// record. `None` when the task is gone or has ended (nothing happens
    /// to an ended task).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        limits: &TaskLimits,
        id: &TaskId,
        kind: TaskEventKind,
        state: TaskState,
        body: Vec<u8>,
        error: Option<ErrorBody>,
        now: u64,
        change: &mut Change,
    ) -> Option<TaskRecord> {
        let id = *id;
        let mut full = self.tasks.get(&id)?.record.clone();
        if full.state.is_final() {
            return None;
        }
        let (old_first, old_kept) = (full.first_seq, [full.progress_seq, full.question_seq]);
        let seq = full.seq + 1;
        match kind {
            TaskEventKind::Progress => full.progress_seq = Some(seq),
            TaskEventKind::Question => full.question_seq = Some(seq),
            _ => {}
        }
        if state != TaskState::InputRequired {
            full.question_seq = None;
        }
        if error.is_some() {
            full.error = error;
        }
        full.state = state;
        full.seq = seq;
        full.updated_ms = now;
        // Past the bound, the oldest events go, but for the last progress
        // and the question waited on, which the info shows until they are
        // replaced (the final event is the newest, so it always stays).
        if seq - full.first_seq + 1 > limits.max_events {
            full.first_seq = seq + 1 - limits.max_events;
        }
        let kept = [full.progress_seq, full.question_seq];
        let mut folds = fold_ranges(old_first, full.first_seq, old_kept, kept);
        if state.is_final()
            && crate::seeded_bugs::planted(crate::seeded_bugs::Bug::FoldDropsFinalState)
        {
            folds.push((seq, seq + 1));
        }
        for (from, to) in folds {
            change
                .batch
                .fold_task_events
                .push((full.id.clone(), from, to));
        }
        let event = TaskEventRecord {
            seq,
            at_ms: now,
            state,
            kind,
            body,
        };
        change.batch.put_tasks.push(full.clone());
        change.batch.put_task_events.push((full.id.clone(), event));
        change.changed.push((id, state, seq, kind));
        self.insert(full.clone());
        Some(full)
    }

    /// Applies a written batch: its task records and deletions.
    pub(crate) fn apply(&mut self, batch: &Batch) {
        for id in &batch.del_tasks {
            if let Some(id) = TaskId::from_slice(id) {
                self.remove(&id);
            }
        }
        for r in &batch.put_tasks {
            self.insert(r.clone());
        }
    }

    /// Ended tasks kept longer than the retention at `now`, oldest first,
    /// at most `limit`: deleted with their events.
    pub(crate) fn expire(
        &mut self,
        limits: &TaskLimits,
        now: u64,
        limit: usize,
        change: &mut Change,
    ) -> usize {
        let old: Vec<TaskId> = self
            .order
            .values()
            .filter(|id| {
                self.tasks.get(id).is_some_and(|e| {
                    e.record.state.is_final()
                        && e.record.updated_ms.saturating_add(limits.retention_ms) <= now
                })
            })
            .take(limit)
            .copied()
            .collect();
        for id in &old {
            self.remove(id);
            change.batch.del_tasks.push(id.0.to_vec());
        }
        old.len()
    }
}

/// The events to delete when the oldest kept goes from `old_first` to
/// `first`, as ranges `[from, to)`: those in between but for the ones
/// `kept` now, and those kept before below `old_first` that are `kept` no
/// more.
fn fold_ranges(
    old_first: u64,
    first: u64,
    old_kept: [Option<u64>; 2],
    kept: [Option<u64>; 2],
) -> Vec<(u64, u64)> {
    let keeps = |s: u64| kept.contains(&Some(s));
    let mut out: Vec<(u64, u64)> = old_kept
        .into_iter()
        .flatten()
        .filter(|s| *s < old_first && !keeps(*s))
        .map(|s| (s, s + 1))
        .collect();
    let mut stay: Vec<u64> = kept
        .into_iter()
        .flatten()
        .filter(|s| (old_first..first).contains(s))
        .collect();
    stay.sort_unstable();
    let mut from = old_first;
    for s in stay {
        if from < s {
            out.push((from, s));
        }
        from = s + 1;
    }
    if from < first {
        out.push((from, first));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> TaskLimits {
        TaskLimits {
            max_tasks: 3,
            max_per_sender: 2,
            max_events: 4,
            max_body: 1024,
            retention_ms: 1000,
        }
    }

    fn id(n: u8) -> TaskId {
        TaskId([n; 16])
    }

    const A: NodeId = NodeId::from_bytes([1; 32]);
    const B: NodeId = NodeId::from_bytes([2; 32]);

    /// Nobody is the control plane or a contact.
    fn stranger(_: &NodeId) -> bool {
        false
    }

    #[test]
    fn ids_print_and_parse_as_32_lowercase_hex_digits() {
        let t = id(0xab);
        let text = t.to_string();
        assert_eq!(text, "ab".repeat(16));
        assert_eq!(TaskId::parse(&text), Some(t));
        for bad in [
            "",
            "AB".repeat(16).as_str(),
            &"ab".repeat(15),
            &"zz".repeat(16),
        ] {
            assert_eq!(TaskId::parse(bad), None, "{bad:?}");
        }
        assert_ne!(TaskId::random().unwrap(), TaskId::random().unwrap());
    }

    #[test]
    fn quotas_bound_the_node_and_each_sender() {
        let mut t = TaskTable::default();
        let l = limits();
        let mut c = Change::default();
        t.submit(
            &l,
            id(1),
            A,
            "r1",
            "app.x",
            "go",
            vec![],
            None,
            None,
            &stranger,
            0,
            &mut c,
        )
        .unwrap();
        t.submit(
            &l,
            id(2),
            A,
            "r2",
            "app.x",
            "go",
            vec![],
            None,
            None,
            &stranger,
            0,
            &mut c,
        )
        .unwrap();
        let e = t.submit(
            &l,
            id(3),
            A,
            "r3",
            "app.x",
            "go",
            vec![],
            None,
            None,
            &stranger,
            0,
            &mut c,
        );
        assert_eq!(e.unwrap_err().code, ErrorCode::Overloaded, "A's quota");
        t.submit(
            &l,
            id(4),
            B,
            "r1",
            "app.x",
            "go",
            vec![],
            None,
            None,
            &stranger,
            0,
            &mut c,
        )
        .unwrap();
        let e = t.submit(
            &l,
            id(5),
            B,
            "r2",
            "app.x",
            "go",
            vec![],
            None,
            None,
            &stranger,
            0,
            &mut c,
        );
        assert_eq!(
            e.unwrap_err().code,
            ErrorCode::Overloaded,
            "the node's bound"
        );
        assert_eq!(t.by_origin(&A, "r2"), Some(id(2)));
        assert_eq!(t.by_origin(&B, "r2"), None);
    }

    #[test]
    fn events_follow_the_rules_and_old_ones_fold() {
        let mut t = TaskTable::default();
        let l = limits();
        let mut c = Change::default();
        t.submit(
            &l,
            id(1),
            A,
            "r1",
            "app.x",
            "go",
            vec![],
            None,
            None,
            &stranger,
            0,
            &mut c,
        )
        .unwrap();
        let mut r = None;
        for n in 0..6u8 {
            r = t.append(
                &l,
                &id(1),
                TaskEventKind::Progress,
                TaskState::Working,
                vec![n],
                None,
                1,
                &mut c,
            );
        }
        let r = r.unwrap();
        assert_eq!((r.seq, r.first_seq), (7, 4), "4 events kept");
        assert_eq!(r.progress_seq, Some(7));
        let q = t
            .append(
                &l,
                &id(1),
                TaskEventKind::Question,
                TaskState::InputRequired,
                vec![9],
                None,
                2,
                &mut c,
            )
            .unwrap();
        assert_eq!(q.question_seq, Some(8));
        let done = t
            .append(
                &l,
                &id(1),
                TaskEventKind::Result,
                TaskState::Completed,
                vec![7],
                None,
                3,
                &mut c,
            )
            .unwrap();
        assert_eq!(
            (done.state, done.question_seq),
            (TaskState::Completed, None)
        );
        // Nothing happens to an ended task.
        assert!(
            t.append(
                &l,
                &id(1),
                TaskEventKind::Progress,
                TaskState::Working,
                vec![],
                None,
                4,
                &mut c
            )
            .is_none()
        );
        // Kept for the retention, then gone.
        let mut c = Change::default();
        assert_eq!(t.expire(&l, 1002, 10, &mut c), 0);
        assert_eq!(t.expire(&l, 1003, 10, &mut c), 1);
        assert!(t.get(&id(1)).is_none());
        assert_eq!(t.by_origin(&A, "r1"), None);
        assert_eq!(c.batch.del_tasks, vec![id(1).0.to_vec()]);
    }

    #[test]
    fn pages_are_newest_first_and_only_what_the_caller_may_see() {
        let mut t = TaskTable::default();
        let l = TaskLimits {
            max_tasks: 100,
            max_per_sender: 100,
            ..limits()
        };
        let mut c = Change::default();
        for n in 0..5u8 {
            let who = if n % 2 == 0 { A } else { B };
            t.submit(
                &l,
                id(n),
                who,
                &format!("r{n}"),
                "app.x",
                "go",
                vec![],
                None,
                None,
                &stranger,
                0,
                &mut c,
            )
            .unwrap();
        }
        let (page, more) = t.page(&A, false, None, 2, |_| true);
        assert_eq!(page, vec![id(4), id(2)]);
        assert!(more);
        let (page, more) = t.page(&A, false, Some(&id(2)), 2, |_| true);
        assert_eq!(page, vec![id(0)]);
        assert!(!more);
        let (page, _) = t.page(&A, true, None, 10, |_| true);
        assert_eq!(page.len(), 5, "the control plane sees all");
    }
}
