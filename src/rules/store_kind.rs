//! What a rules file needs to know of its limits' store, whose type is generic: whether it can
//! decide a `fail_mode = "local"` limit during an outage, and the Redis store behind it (its local
//! fallback switched per limit, its in-flight leases for `concurrency`).

use super::file::{FailMode, LimitSpec};
use crate::layer::ConcurrencyLimit;
use crate::store::{MemoryStore, Store};

/// What the store does for a limit's `fail_mode = "local"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LocalFallback {
    /// A Redis store with a local fallback: the limit decides in this process during an outage.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Available,
    /// A store without one: the file is refused at that line.
    Missing,
    /// The memory store, which never fails: no effect (warned once).
    NeverFails,
}

impl LocalFallback {
    /// The local fallback of the stores `make_store` gives (one made to look).
    pub(super) fn of<St: Store<Vec<u8>>>(make_store: impl FnOnce() -> St) -> Self {
        if std::any::TypeId::of::<St>() == std::any::TypeId::of::<MemoryStore<Vec<u8>>>() {
            return Self::NeverFails;
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = redis_of(&make_store()) {
            return if redis.has_local_fallback() {
                Self::Available
            } else {
                Self::Missing
            };
        }
        #[cfg(not(feature = "redis"))]
        let _ = make_store;
        Self::Missing
    }
}

/// A new limit's store: on Redis, with a local fallback switch of its own (see
/// [`apply_fail_mode`]), since the store's clones share everything else.
pub(super) fn limit_store<St: Store<Vec<u8>>>(store: St) -> St {
    #[cfg(feature = "redis")]
    {
        let mut store = store;
        if let Some(redis) =
            (&mut store as &mut dyn std::any::Any).downcast_mut::<crate::store::redis::RedisStore>()
        {
            *redis = redis.clone().with_fallback_switch();
        }
        store
    }
    #[cfg(not(feature = "redis"))]
    store
}

/// Sets a limit's store to its `fail_mode`: a limit failing `open` or `closed` gets the store's
/// error during an outage (for its policy), a `local` one or one without a mode the store's local
/// fallback (if it has one). Called at every load, so a reload changing the mode applies.
pub(super) fn apply_fail_mode<St: Store<Vec<u8>>>(store: &St, mode: Option<FailMode>) {
    #[cfg(feature = "redis")]
    if let Some(redis) = redis_of(store) {
        redis.use_local_fallback(!matches!(mode, Some(FailMode::Open | FailMode::Closed)));
    }
    #[cfg(not(feature = "redis"))]
    let _ = (store, mode);
}

/// The Redis store `store` is, if it is one.
#[cfg(feature = "redis")]
fn redis_of<St: Store<Vec<u8>>>(store: &St) -> Option<&crate::store::redis::RedisStore> {
    (store as &dyn std::any::Any).downcast_ref::<crate::store::redis::RedisStore>()
}

/// A new cap of `spec`'s `concurrency` on its limiter's `store`: on Redis, leases shared by every
/// instance using the limit's name (as [`ConcurrencyLimit::redis`]); elsewhere a count in this
/// process. `None` without a `concurrency`.
pub(super) fn new_cap<St: Store<Vec<u8>>>(
    spec: &LimitSpec,
    store: &St,
) -> Result<Option<ConcurrencyLimit<Vec<u8>>>, crate::ConfigError> {
    let Some(n) = spec.concurrency else {
        return Ok(None);
    };
    #[cfg(feature = "redis")]
    if let Some(redis) = redis_of(store) {
        return ConcurrencyLimit::redis(redis.clone(), &spec.name, n).map(Some);
    }
    #[cfg(not(feature = "redis"))]
    let _ = store;
    ConcurrencyLimit::memory(n).named(&spec.name).map(Some)
}
