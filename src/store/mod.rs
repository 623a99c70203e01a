//! Where per-key state lives: in memory ([`MemoryStore`], the default) or on Redis (feature `redis`).
//!
//! A store applies an [`Op`] to one key under a [`Rule`], atomically for all quotas of the rule, and
//! answers with a future so that a network store fits behind the same trait as the memory store
//! (whose future is a ready value: no boxing, no allocation).

mod key;
mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

use std::future::Future;

pub use key::StoreKey;
pub use memory::{DEFAULT_MAX_KEYS, MAX_SKETCH_BYTES, MemoryStore, MemoryStoreBuilder};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::rule::Rule;
use crate::stats::Stats;
use crate::strategy::Op;

/// A place to keep per-key state.
///
/// Implementations apply `op` to `key` atomically across all of `rule`'s quotas and count their own
/// decisions in [`Store::stats`].
pub trait Store<K>: Send + Sync + 'static {
    /// The answer; a ready value for in-process stores.
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Applies `op` to `key` under `rule`. `now` is the limiter's clock (nanoseconds since the Unix
    /// epoch); a store with its own time source (Redis's `TIME`) may use that instead.
    fn apply(&self, key: &K, rule: &Rule, op: Op, now: u64) -> Self::Future;

    /// Counters: decisions, errors, evictions, keys held.
    fn stats(&self) -> Stats;

    /// Removes state that has become equivalent to a new key's. Stores that expire state
    /// themselves (Redis TTLs) do nothing.
    fn sweep(&self, now: u64) {
        let _ = now;
    }
}
