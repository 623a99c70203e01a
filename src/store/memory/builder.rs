//! The options of a [`MemoryStore`].

use std::hash::Hash;

use super::{DEFAULT_MAX_KEYS, MAX_SKETCH_BYTES, MemoryStore};

/// Options of a [`MemoryStore`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct MemoryStoreBuilder {
    pub(super) max_keys: Option<usize>,
}

impl MemoryStoreBuilder {
    /// The key cap of a store built without one: 8 x 10^6 keys.
    pub const DEFAULT_MAX_KEYS: usize = DEFAULT_MAX_KEYS;

    /// The largest number of bytes a store's record of evicted keys (its sketch) can take,
    /// allocated on the first eviction of a key with spent quota and sized from the key cap.
    pub const MAX_SKETCH_BYTES: usize = MAX_SKETCH_BYTES;

    /// Caps the number of keys held (see [`MemoryStore`] for what happens at the cap); the
    /// default is [`MemoryStoreBuilder::DEFAULT_MAX_KEYS`], and `usize::MAX` lifts the cap.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys.max(1));
        self
    }

    /// Builds the store.
    pub fn build<K: Hash + Eq + Clone + Send + Sync + 'static>(self) -> MemoryStore<K> {
        MemoryStore::with_cap(self.max_keys.unwrap_or(DEFAULT_MAX_KEYS))
    }
}
