//! Quota leases ([`RedisStoreBuilder::leases`](super::RedisStoreBuilder::leases)): an instance
//! takes a slice of a key's quota from Redis in one script call and decides locally against it.
//!
//! - **Fetch**: `lua/lease_driver.lua` after the strategy's own script charges the slice with the
//!   strategy's `check` and `commit` (cost = the slice), so the global state counts it at once and
//!   exactly as that many admitted requests. The slice is `min(asked, room / shrink)`, at least the
//!   request's cost; without room for the cost nothing is charged and the reply is the check's
//!   rejection. One fetch per key is in flight per process: concurrent checks wait for it.
//! - **Life**: a lease dies at the end of the window (fixed window) or bucket (sliding window
//!   counter) it was drawn from, and `grant x T` after it was drawn for the token bucket. Its
//!   deadline is the life Redis computed, counted from the moment the call was sent on both the
//!   limiter's clock and the process's monotonic clock (whichever ends it first), so it ends no
//!   later than Redis's own window does even when the limiter's clock lags real time.
//! - **Return**: a lease unused for the idle time, or replaced while units were left, gives them
//!   back through the store's settlement arithmetic (reserved = the slice, actual = the units
//!   used, at the lease's time). A dead window lease needs no return: its window or bucket is
//!   over. A dead token-bucket lease's units are still counted in the bucket, so they go back too
//!   (when it is replaced or swept; the settlement never moves the bucket below now).
//! - **Reset**: a `Reset` drops this instance's lease of the key (its units count as expired) and
//!   keeps the key's slot, so a fetch in flight still lands. In Redis it bumps the key's reset
//!   epoch (`lua/hash_driver.lua`; only a key a lease was drawn from has one). A grant carries the
//!   epoch it was drawn under, and a lease admits only until its renewal is due
//!   ([`Leasing::renew_after`]): the renewal's grant of another epoch drops the old lease (its
//!   units count as expired), and a return carries its lease's epoch, so Redis ignores one from
//!   before a reset. The bound is under [`Leasing`].
//! - **Counters**: `granted = leased + returned + expired + units_held` ([`LeaseCounters`]).
//! - **Size**: the key's demand on this instance over the horizon (units asked since the last
//!   fetch, scaled to the horizon), at most four times the previous lease, at most `limit /
//!   max_share`; in Redis also at most `room / shrink`, so leases shrink as the key nears its limit.

mod fetch;
mod settings;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::watch;

pub use self::settings::{LeaseCounters, Leasing};
use super::scripts::{FIXED, GCRA, PRELUDE, SLIDING};
use super::send::Shed;
use super::{
    Inner, RedisFuture, RedisStore, SILENCE, TICK_NANOS, keys, limit_of, nanos, redis_keys,
    script_args,
};
use crate::decision::{Decision, Outcome};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::rule::Rule;
use crate::stats::Counter;
use crate::store::{Answer, Scope, StoreKey, name_hash};
use crate::strategy::{Op, Strategy};

/// The lease script's driver, after the prelude and a strategy's script.
const LEASE_DRIVER: &str = include_str!("lua/lease_driver.lua");

/// The leases of one store.
pub(super) struct Leases {
    cfg: Leasing,
    slots: DashMap<u64, Slot>,
    /// EVALSHA hash and source of the lease script per family: fixed, sliding, GCRA.
    scripts: [(String, Arc<str>); 3],
    fetches: Counter,
    granted: Counter,
    leased: Counter,
    returned: Counter,
    expired: Counter,
}

impl Leases {
    pub(super) fn new(cfg: Leasing) -> Self {
        let script = |strategy: &str| {
            let mut src = String::from(PRELUDE);
            src.push_str(strategy);
            src.push_str(LEASE_DRIVER);
            let sha = ::redis::Script::new(&src).get_hash().to_owned();
            (sha, Arc::<str>::from(src))
        };
        Self {
            cfg,
            slots: DashMap::new(),
            scripts: [script(FIXED), script(SLIDING), script(GCRA)],
            fetches: Counter::default(),
            granted: Counter::default(),
            leased: Counter::default(),
            returned: Counter::default(),
            expired: Counter::default(),
        }
    }

    /// The leasing settings.
    pub(super) fn cfg(&self) -> &Leasing {
        &self.cfg
    }

    fn script(&self, strategy: Strategy) -> Option<&(String, Arc<str>)> {
        let i = match strategy {
            Strategy::FixedWindow => 0,
            Strategy::SlidingWindow => 1,
            Strategy::TokenBucket => 2,
            _ => return None,
        };
        self.scripts.get(i)
    }
}

/// Whether a strategy can be leased, and why not.
fn refusal(strategy: Strategy) -> Option<&'static str> {
    crate::error::lease_refusal(strategy)
}

/// The map key of a logical key in a scope.
fn slot_id(base: &str, tag: u64) -> u64 {
    super::cache::fingerprint(std::slice::from_ref(&base.to_owned()), &[tag])
}

/// What a lease's return needs: the key's base name and its scope.
struct Back {
    base: String,
    rule: Rule,
    tag: u64,
}

/// A key's lease and its fetch on this instance.
struct Slot {
    lease: Option<Lease>,
    /// The fetch in flight: its sender is dropped when it is done.
    fetching: Option<watch::Receiver<()>>,
    /// Fetches finished.
    done: u64,
    /// What the last finished fetch brought, for the checks that waited for it.
    last: Fetched,
    /// The size of the last lease asked for.
    size: u64,
    /// Units asked for since the last fetch (the demand).
    asked: u64,
    /// The limiter's time of the last fetch (0: none yet).
    since: u64,
    /// The largest lease for the key's rule (0 until the first fetch).
    cap: u64,
    /// When the key was last checked here, and the limiter's time then.
    used_at: Instant,
    now_seen: u64,
    back: Arc<Back>,
}

impl Slot {
    /// The size of the next lease: the demand over the horizon, at most four times the last one,
    /// between the cost and the cap.
    fn next_size(&mut self, cfg: &Leasing, now: u64, cost: u64) -> u64 {
        let span = now.saturating_sub(self.since);
        let by_rate = if self.since == 0 {
            1
        } else if span == 0 {
            u64::MAX
        } else {
            let scaled = u128::from(self.asked) * cfg.horizon.as_nanos() / u128::from(span);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        };
        let size = by_rate
            .min(self.size.saturating_mul(4).max(1))
            .min(self.cap)
            .max(cost);
        self.size = size;
        self.asked = 0;
        self.since = now.max(1);
        size
    }
}

#[derive(Clone, Debug)]
enum Fetched {
    Nothing,
    Granted,
    /// Redis refused a lease for this cost (the key's epoch then).
    Rejected(Decision, u32, u64),
    Shed,
    Failed(StoreError),
}

/// Units of a key's quota counted in Redis and not yet used.
#[derive(Clone, Copy, Debug)]
struct Lease {
    left: u64,
    granted: u64,
    /// Redis's time of the grant (ns): the reservation's time when it is returned.
    at: u64,
    /// The limiter's time when the call was sent, and when the lease dies.
    sent: u64,
    until: u64,
    /// When the lease dies on the process's monotonic clock (the call's sending + its life): a
    /// limiter clock that lags real time cannot stretch a lease past Redis's window.
    until_i: Instant,
    /// When the lease stops admitting until a renewal finds its key not reset (the call's sending
    /// + [`Leasing::renew_after`], at most its death), on both clocks.
    fresh: u64,
    fresh_i: Instant,
    /// The key's reset epoch the lease was granted under (Redis's: a reset bumps it).
    epoch: u64,
    /// Redis's time when the lease dies (ns): leases of one window end together and merge.
    end: u64,
    bucket: bool,
    limit: u32,
    /// What Redis had left after the grant, and its reset then (ns).
    remaining: u64,
    reset_after: u64,
    quota: u16,
}

impl Lease {
    /// Whether the lease is still alive at the limiter's `now` and the monotonic `now_i`.
    fn alive(&self, now: u64, now_i: Instant) -> bool {
        now < self.until && now_i < self.until_i
    }

    /// Takes `cost` units if the lease holds them and is fresh (or `renewed`: the caller waited
    /// for the call that granted or renewed it, so it takes from it however long that took).
    fn take(&mut self, cost: u64, now: u64, now_i: Instant, renewed: bool) -> Option<Decision> {
        let stale = now >= self.fresh || now_i >= self.fresh_i;
        if (stale && !renewed) || self.left < cost || !self.alive(now, now_i) {
            return None;
        }
        self.left -= cost;
        let elapsed = now.saturating_sub(self.sent);
        let remaining = self.remaining.saturating_add(self.left);
        Some(Decision {
            outcome: Outcome::Allowed,
            limit: self.limit,
            remaining: u32::try_from(remaining).unwrap_or(u32::MAX).min(self.limit),
            reset_after: self.reset_after.saturating_sub(elapsed),
            retry_after: 0,
            // Inside the lease's window: a settlement finds the window it was counted in.
            time: self.at.saturating_add(elapsed),
            quota: self.quota,
            cost: u32::try_from(cost).unwrap_or(u32::MAX),
            // A lease's answer counts as its verdict, not as the outage fallback's.
            local: false,
            bound: 0,
            shed: false,
        })
    }

    /// The settlement giving the unused units back (sent with the lease's epoch: after a reset of
    /// the key Redis ignores it).
    fn give_back(&self) -> Option<Op> {
        (self.left > 0).then(|| Op::Settle {
            reserved: u32::try_from(self.granted).unwrap_or(u32::MAX),
            actual: u32::try_from(self.granted - self.left).unwrap_or(u32::MAX),
            at: self.at,
            bound: 0,
        })
    }
}

/// One step of a leased check.
enum Step {
    /// Admitted from the key's lease.
    Leased(Decision),
    /// Decided here (counted as a decision).
    Done(Decision),
    /// Answered as shed (counted by `shed`).
    Shed,
    /// The fetch failed: the failure policy answers.
    Failed(StoreError),
    Wait(watch::Receiver<()>),
    Fetch(watch::Sender<()>, watch::Receiver<()>, u64),
}

/// A lease call: everything the fetching task needs.
struct Call {
    id: u64,
    redis_keys: Vec<String>,
    args: Vec<u64>,
    sha: String,
    src: Arc<str>,
    quotas: usize,
    now: u64,
    bucket: bool,
}

impl RedisStore {
    /// The store's entry point: a check on a leasable rule goes through the key's lease, anything
    /// else to Redis as without leasing.
    pub(super) fn lease_or_apply<K: StoreKey>(
        &self,
        key: &K,
        scope: Scope<'_>,
        op: Op,
        now: u64,
    ) -> Answer<RedisFuture> {
        let (rule, tag) = (scope.rule(), scope.tag());
        let base = keys::base_key(&self.inner.prefix, key, name_hash(scope.name()));
        let Some(leases) = &self.inner.leases else {
            return Answer::later(self.apply_base(base, rule, tag, op, now));
        };
        let cost = match op {
            Op::Check(c) if c > 0 && refusal(rule.strategy()).is_none() => c,
            Op::Reset => {
                // Redis forgets the key, units leased included: this instance's lease goes (its
                // units counted as expired), the slot stays, so a fetch in flight still lands.
                if let Some(mut slot) = leases.slots.get_mut(&slot_id(&base, tag)) {
                    if let Some(l) = slot.lease.take() {
                        leases.expired.add(l.left);
                    }
                }
                return Answer::later(self.apply_base(base, rule, tag, op, now));
            }
            _ => return Answer::later(self.apply_base(base, rule, tag, op, now)),
        };
        let id = slot_id(&base, tag);
        if let Some(mut slot) = leases.slots.get_mut(&id) {
            let now_i = Instant::now();
            slot.asked = slot.asked.saturating_add(u64::from(cost));
            slot.used_at = now_i;
            slot.now_seen = now;
            if let Some(d) = slot
                .lease
                .as_mut()
                .and_then(|l| l.take(u64::from(cost), now, now_i, false))
            {
                drop(slot);
                leases.leased.add(u64::from(cost));
                self.inner.allowed.add(1);
                return Answer::now(Ok(d));
            }
            if slot.cap != 0 && u64::from(cost) > slot.cap {
                drop(slot);
                return Answer::later(self.apply_base(base, rule, tag, op, now));
            }
            drop(slot);
            return Answer::later(Box::pin(self.clone().leased(
                base,
                id,
                rule.clone(),
                (tag, cost, now),
                true,
            )));
        }
        Answer::later(Box::pin(self.clone().leased(
            base,
            id,
            rule.clone(),
            (tag, cost, now),
            false,
        )))
    }

    /// Refuses leasing for a strategy it cannot bound (called by `Builder::build`), unless the
    /// store checks such rules unleased ([`Leasing::skip_unleasable`]).
    pub(super) fn validate_leasing(&self, rule: &Rule) -> Result<(), ConfigError> {
        match (&self.inner.leases, refusal(rule.strategy())) {
            (Some(l), Some(_)) if !l.cfg.skip_unleasable => {
                Err(ConfigError::Unleasable(rule.strategy()))
            }
            _ => Ok(()),
        }
    }

    /// What the leases did so far (all zero without leasing).
    pub fn lease_counters(&self) -> LeaseCounters {
        let Some(l) = &self.inner.leases else {
            return LeaseCounters::default();
        };
        LeaseCounters {
            fetches: l.fetches.get(),
            granted: l.granted.get(),
            leased: l.leased.get(),
            returned: l.returned.get(),
            expired: l.expired.get(),
            held: l.slots.iter().filter(|s| s.lease.is_some()).count() as u64,
            units_held: l.slots.iter().filter_map(|s| s.lease.map(|l| l.left)).sum(),
        }
    }

    /// Gives every unused leased unit back to Redis now (before a graceful shutdown, or to see
    /// the exact global state), also on keys with a fetch in flight (a lease still in flight is
    /// not in hand yet). Returns the units given back.
    ///
    /// # Errors
    /// The first failed return; the other leases are still returned.
    pub async fn return_leases(&self) -> Result<u64, StoreError> {
        self.sweep_leases(true).await
    }

    /// Drops dead window leases, gives back dead bucket leases and those unused for the idle time
    /// (all with `all`).
    async fn sweep_leases(&self, all: bool) -> Result<u64, StoreError> {
        let Some(leases) = &self.inner.leases else {
            return Ok(0);
        };
        let now_i = Instant::now();
        let idle = leases.cfg.idle;
        let mut back = Vec::new();
        leases.slots.retain(|_, slot| {
            let quiet = now_i.saturating_duration_since(slot.used_at);
            // The limiter's time now, as far as this task can tell (never before a check's).
            let now = slot.now_seen.saturating_add(nanos(quiet));
            if let Some(lease) = slot.lease {
                let dead = !lease.alive(now, now_i);
                if dead && !lease.bucket {
                    // Its window or bucket is over in Redis too: nothing to give back.
                    leases.expired.add(lease.left);
                    slot.lease = None;
                } else if dead || all || quiet >= idle {
                    // A dead bucket lease's units are still counted in the bucket's TAT.
                    slot.lease = None;
                    back.push((Arc::clone(&slot.back), lease, now));
                }
            }
            slot.fetching.is_some() || slot.lease.is_some() || quiet < idle.saturating_mul(4)
        });
        let mut first_error = None;
        let mut returned = 0;
        for (key, lease, now) in back {
            match self.give_back(&key, &lease, now).await {
                Ok(n) => returned += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(returned),
        }
    }

    /// Settles `lease`'s unused units in Redis: the units it gave back. Units whose return
    /// failed count as expired (they stay counted in Redis until their window or bucket ends).
    async fn give_back(&self, key: &Back, lease: &Lease, now: u64) -> Result<u64, StoreError> {
        let Some(op) = lease.give_back() else {
            return Ok(0);
        };
        let settled = self
            .apply_in_epoch(
                key.base.clone(),
                &key.rule,
                key.tag,
                op,
                now,
                Some(lease.epoch),
            )
            .await;
        if let Some(l) = &self.inner.leases {
            match settled {
                Ok(_) => l.returned.add(lease.left),
                Err(_) => l.expired.add(lease.left),
            }
        }
        settled.map(|_| lease.left)
    }

    /// A check that found no units in hand: waits for the key's fetch in flight, or starts one.
    async fn leased(
        self,
        base: String,
        id: u64,
        rule: Rule,
        (tag, cost, now): (u64, u32, u64),
        mut counted: bool,
    ) -> Result<Decision, StoreError> {
        let inner = Arc::clone(&self.inner);
        let Some(leases) = &inner.leases else {
            return self
                .apply_base(base, &rule, tag, Op::Check(cost), now)
                .await;
        };
        let op = Op::Check(cost);
        let strategy = rule.strategy();
        let params = match rule.params_in(TICK_NANOS) {
            Ok(p) => p,
            Err(e) => {
                return self.outage_error(StoreError::new(StoreErrorKind::Other, e.to_string()));
            }
        };
        let cap = leases.cfg.cap(strategy, &params);
        let Some((sha, src)) = leases.script(strategy).filter(|_| u64::from(cost) <= cap) else {
            // A cost above any lease: one call of its own, as without leasing.
            return self.apply_base(base, &rule, tag, op, now).await;
        };
        let now_us = if inner.client_time {
            (now / TICK_NANOS).max(1)
        } else {
            0
        };
        let args = match script_args(&rule, &params, op, now_us) {
            Ok(a) => a,
            Err(m) => return self.outage_error(StoreError::new(StoreErrorKind::Other, m)),
        };
        let redis_keys = redis_keys(&base, strategy, params.len());
        let cache_key = self.cache_key(&redis_keys, &args, params.len());
        // A key Redis reported blocked is answered locally, as without leasing.
        let cacheable = params
            .iter()
            .all(|p| u64::from(cost) <= p.limit.min(p.burst.max(1)));
        if let (Some(cache), Some(ck), true) = (&inner.cache, cache_key, cacheable) {
            if let Some(d) = cache.get(ck, Instant::now()) {
                inner.rejected.add(1);
                return Ok(d);
            }
        }
        let outage = |e: StoreError| self.outage(&base, cache_key, (&rule, tag), op, now, e);
        let deadline = tokio::time::Instant::now() + inner.timeout;
        let waited_from = inner.clock();
        let mut seen: Option<u64> = None;
        loop {
            let step = {
                let mut slot = leases.slots.entry(id).or_insert_with(|| Slot {
                    lease: None,
                    fetching: None,
                    done: 0,
                    last: Fetched::Nothing,
                    size: 0,
                    asked: 0,
                    since: 0,
                    cap,
                    used_at: Instant::now(),
                    now_seen: now,
                    back: Arc::new(Back {
                        base: base.clone(),
                        rule: rule.clone(),
                        tag,
                    }),
                });
                let slot = slot.value_mut();
                if !counted {
                    slot.asked = slot.asked.saturating_add(u64::from(cost));
                    counted = true;
                }
                slot.cap = cap;
                // A fetch whose task ended without recording (a runtime shutting down) is over.
                if slot
                    .fetching
                    .as_ref()
                    .is_some_and(|rx| rx.has_changed().is_err())
                {
                    slot.fetching = None;
                }
                // A check that waited for a fetch takes from what it brought, fresh or not: every
                // fetch serves its waiters (a slow reply cannot send them fetching again).
                let renewed = seen.is_some_and(|g| slot.done > g && slot.fetching.is_none());
                if let Some(d) = slot
                    .lease
                    .as_mut()
                    .and_then(|l| l.take(u64::from(cost), now, Instant::now(), renewed))
                {
                    Step::Leased(d)
                } else if let Some(rx) = &slot.fetching {
                    seen = Some(slot.done);
                    Step::Wait(rx.clone())
                } else {
                    // The fetch this check waited for (or made) is done: its answer holds.
                    let answered = match (&slot.last, seen) {
                        (_, None) => None,
                        (_, Some(g)) if slot.done <= g => None,
                        (Fetched::Rejected(d, c, _), _) if cost >= *c => Some(Step::Done(*d)),
                        (Fetched::Shed, _) => Some(Step::Shed),
                        (Fetched::Failed(e), _) => Some(Step::Failed(e.clone())),
                        _ => None,
                    };
                    match answered {
                        Some(step) => step,
                        None => {
                            let (tx, rx) = watch::channel(());
                            slot.fetching = Some(rx.clone());
                            seen = Some(slot.done);
                            let size = slot.next_size(&leases.cfg, now, u64::from(cost));
                            // A renewal: the rest of a live window lease merges with the grant,
                            // so only the difference is asked (the lease stays within its size).
                            let rest = slot
                                .lease
                                .filter(|l| !l.bucket && l.alive(now, Instant::now()))
                                .map_or(0, |l| l.left);
                            Step::Fetch(tx, rx, size.saturating_sub(rest).max(u64::from(cost)))
                        }
                    }
                }
            };
            let mut rx = match step {
                Step::Leased(d) => {
                    leases.leased.add(u64::from(cost));
                    inner.allowed.add(1);
                    return Ok(d);
                }
                Step::Done(d) => {
                    if d.is_allowed() {
                        inner.allowed.add(1);
                    } else {
                        inner.rejected.add(1);
                    }
                    return Ok(d);
                }
                Step::Shed => return Ok(self.shed(Shed::NoRoom, limit_of(&rule), now)),
                Step::Failed(e) => return outage(e),
                Step::Wait(rx) => rx,
                Step::Fetch(tx, rx, want) => {
                    let mut a = args.clone();
                    // The settle slots (`actual`), then the size asked and the shrink.
                    a.extend([0, want, u64::from(leases.cfg.shrink)]);
                    let fetch = Call {
                        id,
                        redis_keys: redis_keys.clone(),
                        args: a,
                        sha: sha.clone(),
                        src: Arc::clone(src),
                        quotas: params.len(),
                        now,
                        bucket: strategy.is_bucket(),
                    };
                    let Ok(rt) = tokio::runtime::Handle::try_current() else {
                        leases.slots.alter(&id, |_, mut s| {
                            s.fetching = None;
                            s
                        });
                        return outage(StoreError::new(
                            StoreErrorKind::Other,
                            "the Redis store needs a Tokio runtime",
                        ));
                    };
                    rt.spawn(self.clone().fetch(fetch, cost, tx, cache_key));
                    rx
                }
            };
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                inner.timed_out.add(1);
                // The fetch goes on: a late grant still becomes this instance's lease.
                if inner.replied_since(waited_from.saturating_sub(nanos(SILENCE))) {
                    return Ok(self.shed(Shed::Slow, limit_of(&rule), now));
                }
                return outage(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!("no lease from Redis within {:?}", inner.timeout),
                ));
            }
        }
    }
}

/// Returns idle leases every half idle time, until the store is dropped.
pub(super) fn sweep_in_background(inner: Weak<Inner>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        loop {
            let every = match inner
                .upgrade()
                .and_then(|i| i.leases.as_ref().map(|l| l.cfg.idle))
            {
                Some(idle) => (idle / 2).max(Duration::from_millis(5)),
                None => return,
            };
            tokio::time::sleep(every).await;
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let store = RedisStore::of(strong);
            if let Err(e) = store.sweep_leases(false).await {
                tracing::debug!(error = %e, "returning idle leases");
            }
        }
    });
}

#[cfg(test)]
mod tests;
