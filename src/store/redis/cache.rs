//! The local blocked-key cache: keys Redis reported blocked, answered locally until the reported
//! wait is over.
//!
//! Deadlines are on this process's monotonic clock (`Instant` at reply time + `retry_after`), never
//! Redis time compared with the app's clock. Only rejections of cost 1 are cached, and a request of
//! any cost >= 1 is answered from the entry: no strategy admits cost `c` before it admits cost 1, so
//! a cached key is never rejected locally when Redis would admit it. Bounded: when full, expired
//! entries are dropped; if none has expired, new entries are not cached.
//!
//! Staleness is bounded too: an entry is dropped after `max_stale` (default 1 s) even when its wait
//! runs longer, so a reset or refund made through another instance is seen within that time (the
//! next call goes to Redis and caches the fresh answer).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::decision::Decision;

/// How often a full cache may scan itself for expired entries.
const PURGE_EVERY: Duration = Duration::from_millis(100);

pub(super) struct BlockCache {
    cap: usize,
    max_stale: Duration,
    map: Mutex<Map>,
    /// Bumped by every [`remove`](Self::remove) (a settlement, reset or step back): a rejection
    /// whose call was sent before it may be older than the settlement, and is not cached.
    removals: AtomicU64,
}

struct Map {
    entries: HashMap<u64, Blocked>,
    last_purge: Option<Instant>,
}

struct Blocked {
    at: Instant,
    until: Instant,
    /// When the entry stops answering: `until`, or `at + max_stale` if sooner.
    expires: Instant,
    decision: Decision,
}

/// The cache key of a logical key under a rule (its Redis keys and quota arguments): SipHash with a
/// per-process random key, so nobody can aim a collision at another client's cached rejection.
pub(super) fn fingerprint(redis_keys: &[String], rule_args: &[u64]) -> u64 {
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    STATE
        .get_or_init(Default::default)
        .hash_one((redis_keys, rule_args))
}

impl BlockCache {
    pub(super) fn new(cap: usize, max_stale: Duration) -> Self {
        Self {
            cap,
            max_stale,
            map: Mutex::new(Map {
                entries: HashMap::new(),
                last_purge: None,
            }),
            removals: AtomicU64::new(0),
        }
    }

    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    pub(super) fn len(&self) -> usize {
        self.map.lock().entries.len()
    }

    /// The cached rejection of `key` at `now`, with its waits shortened by the time since it was
    /// cached; `None` once the staleness bound has passed (the entry is dropped once the wait is
    /// over).
    pub(super) fn get(&self, key: u64, now: Instant) -> Option<Decision> {
        self.lookup(key, now, false)
    }

    /// As [`get`](Self::get), but past the staleness bound too, until the wait Redis reported is
    /// over: during an outage, a key known blocked stays blocked.
    pub(super) fn get_stale(&self, key: u64, now: Instant) -> Option<Decision> {
        self.lookup(key, now, true)
    }

    fn lookup(&self, key: u64, now: Instant, stale_ok: bool) -> Option<Decision> {
        let mut map = self.map.lock();
        let entry = map.entries.get(&key)?;
        if now >= entry.until {
            map.entries.remove(&key);
            return None;
        }
        if now >= entry.expires && !stale_ok {
            return None;
        }
        let elapsed = now.saturating_duration_since(entry.at);
        let mut d = entry.decision;
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        d.retry_after = nanos(entry.until.saturating_duration_since(now));
        d.reset_after = d.reset_after.saturating_sub(nanos(elapsed));
        d.time = d.time.saturating_add(nanos(elapsed));
        Some(d)
    }

    /// The removal count, read before a check is sent; see [`insert_unless_removed`].
    ///
    /// [`insert_unless_removed`]: Self::insert_unless_removed
    pub(super) fn removals(&self) -> u64 {
        self.removals.load(Ordering::Acquire)
    }

    /// Caches a rejection of a check sent when the removal count was `seen`, unless an entry was
    /// removed since: Redis may have decided the check before that settlement, and caching its
    /// rejection would refuse units the settlement gave back until the staleness bound.
    pub(super) fn insert_unless_removed(
        &self,
        key: u64,
        decision: Decision,
        now: Instant,
        seen: u64,
    ) {
        let mut map = self.map.lock();
        if self.removals.load(Ordering::Acquire) != seen {
            return;
        }
        self.insert_locked(&mut map, key, decision, now);
    }

    /// Caches a rejection of cost 1 received at `now` (the tests' shorthand).
    #[cfg(test)]
    fn insert(&self, key: u64, decision: Decision, now: Instant) {
        let mut map = self.map.lock();
        self.insert_locked(&mut map, key, decision, now);
    }

    fn insert_locked(&self, map: &mut Map, key: u64, decision: Decision, now: Instant) {
        let Some(until) = now.checked_add(Duration::from_nanos(decision.retry_after)) else {
            return;
        };
        let expires = now
            .checked_add(self.max_stale)
            .map_or(until, |s| s.min(until));
        if map.entries.len() >= self.cap && !map.entries.contains_key(&key) {
            let due = map
                .last_purge
                .is_none_or(|t| now.saturating_duration_since(t) >= PURGE_EVERY);
            if !due {
                return;
            }
            map.last_purge = Some(now);
            map.entries.retain(|_, b| b.expires > now);
            if map.entries.len() >= self.cap {
                return;
            }
        }
        map.entries.insert(
            key,
            Blocked {
                at: now,
                until,
                expires,
                decision,
            },
        );
    }

    pub(super) fn remove(&self, key: u64) {
        let mut map = self.map.lock();
        self.removals.fetch_add(1, Ordering::AcqRel);
        map.entries.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    fn rejected(wait_ms: u64) -> Decision {
        Decision {
            outcome: Outcome::Rejected,
            limit: 5,
            remaining: 0,
            reset_after: wait_ms * 1_000_000,
            retry_after: wait_ms * 1_000_000,
            time: 1_000_000_000,
            quota: 0,
            cost: 0,
            local: false,
            bound: 0,
            shed: false,
        }
    }

    #[test]
    fn answers_until_the_deadline_then_forgets() {
        let c = BlockCache::new(4, Duration::from_secs(60));
        let t0 = Instant::now();
        c.insert(1, rejected(100), t0);
        let d = c.get(1, t0 + Duration::from_millis(40)).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(60)));
        assert_eq!(d.time(), Duration::from_millis(1040));
        assert!(c.get(1, t0 + Duration::from_millis(100)).is_none());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_rejection_sent_before_a_settlement_is_not_cached() {
        let c = BlockCache::new(4, Duration::from_secs(60));
        let t0 = Instant::now();
        // A check is sent, a settlement of the key is issued, then the check's rejection arrives.
        let seen = c.removals();
        c.remove(1);
        c.insert_unless_removed(1, rejected(100), t0, seen);
        assert!(
            c.get(1, t0).is_none(),
            "the rejection may predate the settlement"
        );
        // A check sent after the settlement is cached as usual.
        let seen = c.removals();
        c.insert_unless_removed(1, rejected(100), t0, seen);
        assert!(c.get(1, t0).is_some());
    }

    #[test]
    fn stays_within_its_capacity() {
        let c = BlockCache::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        for k in 0..100 {
            c.insert(k, rejected(1000), t0 + Duration::from_millis(k));
            assert!(c.len() <= 3);
        }
        // Once entries expire, room is made again.
        c.insert(500, rejected(10), t0 + Duration::from_secs(5));
        assert!(c.get(500, t0 + Duration::from_secs(5)).is_some());
    }

    #[test]
    fn a_long_wait_is_answered_for_at_most_the_staleness_bound() {
        let c = BlockCache::new(4, Duration::from_millis(50));
        let t0 = Instant::now();
        c.insert(1, rejected(3_600_000), t0);
        let d = c.get(1, t0 + Duration::from_millis(40)).unwrap();
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_millis(3_600_000 - 40)),
            "the wait reported is Redis's, not the staleness bound"
        );
        assert!(c.get(1, t0 + Duration::from_millis(50)).is_none());
        assert!(
            c.get_stale(1, t0 + Duration::from_millis(60)).is_some(),
            "kept for degraded mode until the wait is over"
        );
        assert!(c.get_stale(1, t0 + Duration::from_secs(3600)).is_none());
    }
}
