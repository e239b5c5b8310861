//! A store in memory, for nodes without a state directory: the same
//! rules, nothing survives the process.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeBounds;
use std::sync::{Mutex, PoisonError};

use super::{Batch, Loaded, Store, StoreError, TaskEventRecord, TaskRecord};

/// Task events by (task id, seq).
type Events = BTreeMap<(Vec<u8>, u64), TaskEventRecord>;

/// Keeps what a durable store would, in memory. Tasks, their events and
/// their args are kept by key (a node keeps thousands, each changed by
/// every event), everything else as [`Loaded`] has it.
#[derive(Debug, Default)]
pub(crate) struct MemoryStore {
    /// Everything but the tasks.
    state: Mutex<Loaded>,
    tasks: Mutex<HashMap<Vec<u8>, TaskRecord>>,
    events: Mutex<Events>,
    args: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
}

/// Deletes the events whose keys are in `range`: one task's, in seq
/// order, without looking at any other task's.
fn remove_events(events: &mut Events, range: impl RangeBounds<(Vec<u8>, u64)>) {
    let keys: Vec<(Vec<u8>, u64)> = events.range(range).map(|(k, _)| k.clone()).collect();
    for k in keys {
        events.remove(&k);
    }
}

impl MemoryStore {
    pub(crate) fn new() -> Self {
        Self::default()
    }
}

/// Applies `batch` to `state`, as a durable store does, but for its
/// tasks (kept apart: see [`MemoryStore`]).
pub(crate) fn apply(state: &mut Loaded, batch: &Batch) {
    if let Some(b) = &batch.binding {
        state.binding = Some(b.clone());
    }
    if let Some(c) = &batch.config {
        state.config = Some(c.clone());
    }
    if let Some(r) = &batch.revocations {
        state.revocations = Some(r.clone());
    }
    if let Some(f) = batch.clock_floor_ms {
        state.clock_floor_ms = Some(f);
    }
    for id in &batch.del_contacts {
        state.contacts.retain(|c| &c.id != id);
    }
    for c in &batch.put_contacts {
        state.contacts.retain(|x| x.id != c.id);
        state.contacts.push(c.clone());
    }
    if let Some(r) = batch.roster {
        state.roster = r;
    }
    for cid in &batch.del_members {
        state.members.retain(|m| &m.cid != cid);
    }
    for m in &batch.put_members {
        state.members.retain(|x| x.cid != m.cid);
        state.members.push(m.clone());
    }
    for k in &batch.del_answers {
        state.answers.retain(|a| &a.key != k);
    }
    for a in &batch.put_answers {
        state.answers.retain(|x| x.key != a.key);
        state.answers.push(a.clone());
    }
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Loaded, StoreError> {
        let mut loaded = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        loaded.tasks = tasks.values().cloned().collect();
        loaded.tasks.sort_by_key(|t| t.order);
        Ok(loaded)
    }

    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        apply(
            &mut self.state.lock().unwrap_or_else(PoisonError::into_inner),
            batch,
        );
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        for id in &batch.del_tasks {
            tasks.remove(id);
        }
        for t in &batch.put_tasks {
            tasks.insert(t.id.clone(), t.clone());
        }
        drop(tasks);
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        for id in &batch.del_tasks {
            remove_events(&mut events, (id.clone(), 0)..=(id.clone(), u64::MAX));
        }
        for (id, e) in &batch.put_task_events {
            events.insert((id.clone(), e.seq), e.clone());
        }
        // After the puts: a fold may reach events put in this batch.
        for (id, from, to) in &batch.fold_task_events {
            if from < to {
                remove_events(&mut events, (id.clone(), *from)..(id.clone(), *to));
            }
        }
        let mut args = self.args.lock().unwrap_or_else(PoisonError::into_inner);
        for id in &batch.del_tasks {
            args.remove(id);
        }
        for (id, a) in &batch.put_task_args {
            args.insert(id.clone(), a.clone());
        }
        Ok(())
    }

    fn task_args(&self, id: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .args
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned())
    }

    fn task_events(
        &self,
        id: &[u8],
        from: u64,
        limit: usize,
    ) -> Result<Vec<TaskEventRecord>, StoreError> {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(events
            .range((id.to_vec(), from)..=(id.to_vec(), u64::MAX))
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect())
    }
}
