//! A store in memory, for nodes without a state directory: the same
//! rules, nothing survives the process.

use std::sync::{Mutex, PoisonError};

use super::{Batch, Loaded, Store, StoreError, TaskEventRecord};

/// Keeps what a durable store would, in memory.
#[derive(Debug, Default)]
pub(crate) struct MemoryStore {
    state: Mutex<Loaded>,
    events: Mutex<std::collections::BTreeMap<(Vec<u8>, u64), TaskEventRecord>>,
    args: Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>,
}

impl MemoryStore {
    pub(crate) fn new() -> Self {
        Self::default()
    }
}

/// Applies `batch` to `state`, as a durable store does.
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
    for id in &batch.del_tasks {
        state.tasks.retain(|t| &t.id != id);
    }
    for t in &batch.put_tasks {
        state.tasks.retain(|x| x.id != t.id);
        state.tasks.push(t.clone());
    }
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Loaded, StoreError> {
        Ok(self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        apply(
            &mut self.state.lock().unwrap_or_else(PoisonError::into_inner),
            batch,
        );
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        for id in &batch.del_tasks {
            events.retain(|(t, _), _| t != id);
        }
        for (id, e) in &batch.put_task_events {
            events.insert((id.clone(), e.seq), e.clone());
        }
        // After the puts: a fold may reach events put in this batch.
        for (id, from, to) in &batch.fold_task_events {
            if from >= to {
                continue;
            }
            let gone: Vec<_> = events
                .range((id.clone(), *from)..(id.clone(), *to))
                .map(|(k, _)| k.clone())
                .collect();
            for k in gone {
                events.remove(&k);
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
