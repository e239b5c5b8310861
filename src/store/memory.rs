//! A store in memory, for nodes without a state directory: the same
//! rules, nothing survives the process.

use std::sync::{Mutex, PoisonError};

use super::{Batch, Loaded, Store, StoreError};

/// Keeps what a durable store would, in memory.
#[derive(Debug, Default)]
pub(crate) struct MemoryStore {
    state: Mutex<Loaded>,
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
        Ok(())
    }
}
