//! Overload and outages: shedding a check, the local fallback, warnings at most once a second.

use std::sync::atomic::Ordering;

use super::degraded::Local;
use std::time::Instant;

use super::send::Shed;
use super::{RedisFuture, RedisStore, SHED_WAIT, WARN_EVERY, nanos};
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::rule::Rule;
use crate::strategy::Op;

impl RedisStore {
    /// A store on `inner`, deciding by its local fallback (if it has one) during an outage.
    pub(super) fn of(inner: std::sync::Arc<super::Inner>) -> Self {
        Self {
            inner,
            no_fallback: None,
        }
    }

    /// Whether the store was built with a local fallback
    /// ([`local_fallback`](super::RedisStoreBuilder::local_fallback)).
    #[cfg(feature = "rules")]
    pub(crate) fn has_local_fallback(&self) -> bool {
        self.inner.local.is_some()
    }

    /// The local fallback this store's checks decide by during an outage: the store's, unless
    /// this store's switch turned it off.
    pub(super) fn local(&self) -> Option<&Local> {
        let off = self
            .no_fallback
            .as_ref()
            .is_some_and(|off| off.load(Ordering::Relaxed));
        self.inner.local.as_ref().filter(|_| !off)
    }

    /// This store with a switch of its own (shared by its clones) to turn the local fallback off
    /// for its checks ([`RedisStore::use_local_fallback`]): a rules file limit's store.
    #[cfg(feature = "rules")]
    pub(crate) fn with_fallback_switch(mut self) -> Self {
        self.no_fallback = Some(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
            false,
        )));
        self
    }

    /// Whether this store's checks decide by the local fallback during an outage (`true`) or fail
    /// (`false`, for the failure policy); no effect on a store without a switch.
    #[cfg(feature = "rules")]
    pub(crate) fn use_local_fallback(&self, on: bool) {
        if let Some(off) = &self.no_fallback {
            off.store(!on, Ordering::Relaxed);
        }
    }

    pub(super) fn warn(&self, e: &StoreError) {
        if self.inner.last_warn.ready(WARN_EVERY) {
            tracing::warn!(
                error = %e,
                store_errors = self.inner.errors.get(),
                "rate-limit Redis store failed (logged at most once per second)"
            );
        }
    }

    /// A check rejected locally because the store has no room to ask Redis in time (overload),
    /// counted by reason and warned about at most once a second.
    pub(super) fn shed(&self, why: Shed, limit: u32, now: u64) -> Decision {
        let i = &self.inner;
        i.shed.add(1);
        i.rejected.add(1);
        match why {
            Shed::OwnKey => i.shed_own_key.add(1),
            Shed::NoRoom => i.shed_no_room.add(1),
            Shed::Slow => i.shed_slow.add(1),
        }
        if i.last_shed_warn.ready(WARN_EVERY) {
            let total = i.shed.get();
            let since = total.saturating_sub(i.shed_warned.swap(total, Ordering::Relaxed));
            tracing::warn!(
                shed = since,
                shed_total = total,
                own_key = i.shed_own_key.get(),
                no_room = i.shed_no_room.get(),
                no_reply_in_time = i.shed_slow.get(),
                timeout = ?i.timeout,
                "rate-limit Redis store shed {since} checks since the last warning (answered 429 \
                 without asking Redis): own_key = a key's own flood waited behind its own checks in \
                 flight; no_room = {} calls in flight to Redis; no_reply_in_time = Redis or this \
                 process slower than the timeout, raise the store timeout if this keeps growing \
                 while Redis is healthy (logged at most once per second)",
                i.max_in_flight
            );
        }
        let wait = nanos(SHED_WAIT);
        Decision {
            outcome: Outcome::Rejected,
            limit,
            remaining: 0,
            reset_after: wait,
            retry_after: wait,
            time: now,
            quota: 0,
            cost: 0,
            local: false,
            bound: 0,
            shed: true,
        }
    }

    /// Redis failed: the local limiter decides in degraded mode, else the error goes to the
    /// layer's failure policy.
    pub(super) fn outage(
        &self,
        base: &String,
        cache_key: Option<u64>,
        (rule, tag): (&Rule, u64),
        op: Op,
        now: u64,
        e: StoreError,
    ) -> Result<Decision, StoreError> {
        let Some(local) = self.local() else {
            return self.outage_error(e);
        };
        self.inner.errors.add(1);
        self.warn(&e);
        // Keys Redis reported blocked stay blocked for the wait it reported.
        if let (Op::Check(c), Some(cache), Some(ck)) = (op, &self.inner.cache, cache_key) {
            if c > 0 {
                if let Some(mut d) = cache.get_stale(ck, Instant::now()) {
                    self.inner.local_rejected.add(1);
                    self.inner.rejected.add(1);
                    d.local = true;
                    return Ok(d);
                }
            }
        }
        let mut d = local.decide(base, rule, tag, op, now);
        d.local = true;
        if let Op::Check(_) = op {
            if d.is_allowed() {
                self.inner.local_allowed.add(1);
                self.inner.allowed.add(1);
            } else {
                self.inner.local_rejected.add(1);
                self.inner.rejected.add(1);
            }
        }
        Ok(d)
    }

    pub(super) fn outage_error(&self, e: StoreError) -> Result<Decision, StoreError> {
        self.inner.errors.add(1);
        self.warn(&e);
        Err(e)
    }

    pub(super) fn fail(&self, e: StoreError) -> RedisFuture {
        self.inner.errors.add(1);
        self.warn(&e);
        Box::pin(std::future::ready(Err(e)))
    }
}
