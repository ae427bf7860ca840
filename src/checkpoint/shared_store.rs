//! The offset store the running pipeline opened, for `run`'s pruner: it
//! cannot open the store itself (the pipeline holds its lock), and it must
//! know which aggregates are parked (their rows are not pruned, audit F5).

use std::sync::{Arc, PoisonError, RwLock, Weak};

use super::OffsetStore;

/// Set by the pipeline once it opened the store; holds no reference that
/// would keep the store open after the pipeline dropped it.
#[derive(Debug, Default)]
pub struct SharedStore(RwLock<Weak<OffsetStore>>);

impl SharedStore {
    pub fn publish(&self, store: &Arc<OffsetStore>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(store);
    }

    /// The store, while the pipeline holds it open.
    pub fn get(&self) -> Option<Arc<OffsetStore>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade()
    }
}
