//! Brute-force oracles for the strategies, written from the definitions in the crate's guide
//! (`tollgate::guide`: "Choosing a strategy", "Formulas per strategy"), independently of `src/strategy`: they keep the log of
//! admitted requests (or, for GCRA, the continuous-state leaky bucket, ITU-T I.371's other
//! formulation) and recompute every figure from it.
//!
//! Shared by the `strategy_*`, `time_and_numbers`, `accuracy`, `concurrency` and `memory_store`
//! test binaries through `#[path = "support/oracle.rs"] mod oracle;`.
//!
//! Scaling (documented here once, read by every binary that includes this file):
//! - `PROPTEST_CASES` (default 256): cases per proptest;
//! - `TOLLGATE_SCALE` (default 1): multiplies the steps per trace (200 by default) and the sizes of
//!   the simulations and concurrency runs. The longer tier runs
//!   `PROPTEST_CASES=10000 TOLLGATE_SCALE=10 cargo test --release --all-features --test <area> <module>`.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, RngAlgorithm};
use tollgate::store::MemoryStore;
use tollgate::{Decision, ManualClock, Outcome, Quota, RateLimiter, Strategy};

pub(crate) const S: u64 = 1_000_000_000;
pub(crate) const MS: u64 = 1_000_000;

/// `TOLLGATE_SCALE`, at least 1.
pub(crate) fn scale() -> u64 {
    std::env::var("TOLLGATE_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The most steps a proptest trace has: 200 x `TOLLGATE_SCALE`.
pub(crate) fn max_steps() -> usize {
    usize::try_from(200 * scale()).unwrap_or(200)
}

/// Proptest's config (XorShift generator) with `PROPTEST_CASES` (default 256) and failures persisted to `path`, a file
/// committed in git (like governor's `tests/proptests.regressions`).
pub(crate) fn config(path: &'static str) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(path))),
        // ChaCha dominates the run time of a debug build; XorShift is plenty for test inputs.
        rng_algorithm: RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    }
}

pub(crate) type Limiter = RateLimiter<u64, MemoryStore<u64>, ManualClock>;

/// A limiter on a memory store and a `ManualClock` set to `at` nanoseconds since the epoch.
pub(crate) fn build(strategy: Strategy, quotas: &[Quota], at: u64) -> (Limiter, ManualClock) {
    let clock = ManualClock::default();
    clock.set_nanos(at);
    let mut b = RateLimiter::builder()
        .strategy(strategy)
        .clock(clock.clone());
    for q in quotas {
        b = b.quota(*q);
    }
    (b.build().expect("valid rule"), clock)
}

/// A quota from text.
pub(crate) fn q(text: &str) -> Quota {
    text.parse().expect("valid quota")
}

/// What a decision must say, in nanoseconds. `retry_after` is 0 unless rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Expect {
    pub(crate) outcome: Outcome,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after: u64,
    pub(crate) retry_after: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Expect {
    /// The figures of a real decision.
    pub(crate) fn of(d: &Decision) -> Self {
        Self {
            outcome: d.outcome(),
            limit: u64::from(d.limit()),
            remaining: u64::from(d.remaining()),
            reset_after: nanos(d.reset_after()),
            retry_after: d.retry_after().map_or(0, nanos),
        }
    }

    fn allowed(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Self {
            outcome: Outcome::Allowed,
            limit,
            remaining,
            reset_after,
            retry_after: 0,
        }
    }

    fn rejected(limit: u64, remaining: u64, reset_after: u64, retry_after: u64) -> Self {
        Self {
            outcome: Outcome::Rejected,
            limit,
            remaining,
            reset_after,
            retry_after,
        }
    }

    fn exceeds(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Self {
            outcome: Outcome::Exceeds,
            limit,
            remaining,
            reset_after,
            retry_after: 0,
        }
    }
}

/// One quota's oracle. Time must not go backwards between calls.
pub(crate) trait QuotaOracle {
    /// The decision for `cost` at `t`, without consuming.
    fn check(&mut self, t: u64, cost: u64) -> Expect;
    /// Records an admitted request.
    fn commit(&mut self, t: u64, cost: u64);
    /// Settles, at `t`, a reservation of `reserved` admitted at `at`, for `actual`.
    fn settle(&mut self, t: u64, at: u64, reserved: u64, actual: u64);
}

/// `count` moved by `actual - reserved`: not below 0, and a charge not past `cap` (unless the count
/// is already above it).
fn settled(count: u64, reserved: u64, actual: u64, cap: u64) -> u64 {
    if actual <= reserved {
        count.saturating_sub(reserved - actual)
    } else {
        (count + (actual - reserved)).min(count.max(cap))
    }
}

/// `N`, `W` (ns), `B` and `T = ceil(W / N)` of a quota in the memory store's unit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct P {
    pub(crate) n: u64,
    pub(crate) w: u64,
    pub(crate) b: u64,
    pub(crate) t: u64,
}

impl P {
    pub(crate) fn of(q: &Quota) -> Self {
        let n = u64::from(q.limit());
        let w = nanos(q.period());
        Self {
            n,
            w,
            b: u64::from(q.burst()),
            t: w.div_ceil(n).max(1),
        }
    }
}

/// The oracle for `strategy` and quota `q`.
pub(crate) fn oracle(strategy: Strategy, q: &Quota) -> Box<dyn QuotaOracle> {
    let p = P::of(q);
    match strategy {
        Strategy::FixedWindow => Box::new(FixedAligned {
            p,
            per: BTreeMap::new(),
        }),
        Strategy::FixedWindowFirstHit => Box::new(FixedFirstHit { p, window: None }),
        Strategy::MovingWindow => Box::new(Moving {
            p,
            log: VecDeque::new(),
        }),
        Strategy::SlidingWindow => Box::new(Sliding {
            p,
            buckets: BTreeMap::new(),
        }),
        _ => Box::new(Bucket { p, x: 0, lct: 0 }),
    }
}

/// Fixed window aligned to Unix time: window `k` is `[kW, (k+1)W)`.
pub(crate) struct FixedAligned {
    p: P,
    /// Admitted cost per window index.
    per: BTreeMap<u64, u64>,
}

impl QuotaOracle for FixedAligned {
    fn check(&mut self, t: u64, cost: u64) -> Expect {
        let P { n, w, .. } = self.p;
        let k = t / w;
        let used = self.per.get(&k).copied().unwrap_or(0);
        let end = (k + 1).saturating_mul(w).saturating_sub(t);
        if cost > n {
            Expect::exceeds(n, n - used, if used > 0 { end } else { 0 })
        } else if used + cost <= n {
            Expect::allowed(n, n - used - cost, if used + cost > 0 { end } else { 0 })
        } else {
            Expect::rejected(n, n - used, end, end)
        }
    }

    fn commit(&mut self, t: u64, cost: u64) {
        *self.per.entry(t / self.p.w).or_default() += cost;
    }

    /// The count of the reservation's window moves, if that window is the current one.
    fn settle(&mut self, t: u64, at: u64, reserved: u64, actual: u64) {
        let k = at / self.p.w;
        if k == t / self.p.w {
            let n = self.per.entry(k).or_default();
            *n = settled(*n, reserved, actual, self.p.n);
        }
    }
}

/// Fixed window opened by the first admitted request at or after the previous window's end.
pub(crate) struct FixedFirstHit {
    p: P,
    /// The last window opened: (start, admitted cost in it).
    window: Option<(u64, u64)>,
}

impl FixedFirstHit {
    /// The open window at `t` (start, used).
    fn open(&self, t: u64) -> Option<(u64, u64)> {
        self.window
            .filter(|&(s, used)| used > 0 && t - s < self.p.w)
    }
}

impl QuotaOracle for FixedFirstHit {
    fn check(&mut self, t: u64, cost: u64) -> Expect {
        let P { n, w, .. } = self.p;
        match self.open(t) {
            None if cost > n => Expect::exceeds(n, n, 0),
            None if cost == 0 => Expect::allowed(n, n, 0),
            None => Expect::allowed(n, n - cost, w),
            Some((s, used)) => {
                let end = w - (t - s);
                if cost > n {
                    Expect::exceeds(n, n - used, end)
                } else if used + cost <= n {
                    Expect::allowed(n, n - used - cost, end)
                } else {
                    Expect::rejected(n, n - used, end, end)
                }
            }
        }
    }

    fn commit(&mut self, t: u64, cost: u64) {
        self.window = match self.open(t) {
            Some((s, used)) => Some((s, used + cost)),
            None => Some((t, cost)),
        };
    }

    /// The count of the reservation's window moves if it is still open; a window settled to 0 is
    /// closed (the next admission opens one).
    fn settle(&mut self, t: u64, at: u64, reserved: u64, actual: u64) {
        if let Some((s, used)) = self.open(t).filter(|&(s, _)| at >= s) {
            self.window = Some((s, settled(used, reserved, actual, self.p.n)));
        }
    }
}

/// Moving window: the admitted requests with `ts > t - W`.
pub(crate) struct Moving {
    p: P,
    /// Admitted (time, cost), oldest first; entries that left the window are dropped (time never
    /// goes back between calls).
    log: VecDeque<(u64, u64)>,
}

impl QuotaOracle for Moving {
    fn check(&mut self, t: u64, cost: u64) -> Expect {
        let P { n, w, .. } = self.p;
        while self.log.front().is_some_and(|&(ts, _)| t - ts >= w) {
            self.log.pop_front();
        }
        let live = &self.log;
        let used: u64 = live.iter().map(|e| e.1).sum();
        let reset = live.back().map_or(0, |&(ts, _)| w - (t - ts));
        if cost > n {
            return Expect::exceeds(n, n.saturating_sub(used), reset);
        }
        if used + cost <= n {
            return Expect::allowed(n, n - used - cost, if cost > 0 { w } else { reset });
        }
        // One timestamp per unit of cost, oldest first: the k-th must expire.
        let k = used + cost - n - 1;
        let mut seen = 0;
        let mut wait = 0;
        for &(ts, c) in live {
            if seen + c > k {
                wait = w - (t - ts);
                break;
            }
            seen += c;
        }
        Expect::rejected(n, n.saturating_sub(used), reset, wait)
    }

    fn commit(&mut self, t: u64, cost: u64) {
        self.log.push_back((t, cost));
    }

    /// At the reservation's own time: a refund removes units admitted at `at`, a charge adds units
    /// at `at` up to `N` live units (the rest is dropped). Nothing once `at` left the window.
    fn settle(&mut self, t: u64, at: u64, reserved: u64, actual: u64) {
        let P { n, w, .. } = self.p;
        while self.log.front().is_some_and(|&(ts, _)| t - ts >= w) {
            self.log.pop_front();
        }
        if at > t || t - at >= w {
            return;
        }
        if actual <= reserved {
            let mut give = reserved - actual;
            for e in self.log.iter_mut().filter(|e| e.0 == at) {
                let take = give.min(e.1);
                e.1 -= take;
                give -= take;
            }
            self.log.retain(|e| e.1 > 0);
        } else {
            let used: u64 = self.log.iter().map(|e| e.1).sum();
            let put = (actual - reserved).min(n.saturating_sub(used));
            if put > 0 {
                let i = self.log.partition_point(|e| e.0 <= at);
                self.log.insert(i, (at, put));
            }
        }
    }
}

/// Sliding window counter: admitted cost per clock-aligned bucket, and the integer formula.
pub(crate) struct Sliding {
    p: P,
    buckets: BTreeMap<u64, u64>,
}

impl Sliding {
    /// `cur + floor(prev * (W - e) / W)` at `t`, with `extra` added to `t`'s bucket.
    fn weighted(&self, t: u64, at_bucket: u64, extra: u64) -> u64 {
        let w = self.p.w;
        let b = t / w;
        let e = t % w;
        let count = |k: u64| {
            self.buckets.get(&k).copied().unwrap_or(0) + if k == at_bucket { extra } else { 0 }
        };
        let cur = count(b);
        let prev = if b == 0 { 0 } else { count(b - 1) };
        cur + (u128::from(prev) * u128::from(w - e) / u128::from(w)) as u64
    }

    /// The earliest `t' >= t` (no more requests) at which `pred(weighted(t'))` holds, minus `t`.
    /// The weighted count never grows without requests, so a binary search finds it.
    fn first(&self, t: u64, extra: u64, pred: impl Fn(u64) -> bool) -> u64 {
        let b = t / self.p.w;
        let (mut lo, mut hi) = (t, t.saturating_add(2 * self.p.w));
        if pred(self.weighted(lo, b, extra)) {
            return 0;
        }
        assert!(pred(self.weighted(hi, b, extra)), "nothing left after 2W");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if pred(self.weighted(mid, b, extra)) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi - t
    }
}

impl QuotaOracle for Sliding {
    fn check(&mut self, t: u64, cost: u64) -> Expect {
        let n = self.p.n;
        let b = t / self.p.w;
        let wc = self.weighted(t, b, 0);
        let remaining = n.saturating_sub(wc);
        let reset = |extra| self.first(t, extra, |x| x == 0);
        if cost > n {
            Expect::exceeds(n, remaining, reset(0))
        } else if cost == 0 {
            // A peek is always admitted, also over a charge that took the weighted count past `N`.
            Expect::allowed(n, remaining, reset(0))
        } else if wc + cost <= n {
            Expect::allowed(n, n - wc - cost, reset(cost))
        } else {
            let retry = self.first(t, 0, |x| x + cost <= n);
            Expect::rejected(n, remaining, reset(0), retry)
        }
    }

    fn commit(&mut self, t: u64, cost: u64) {
        *self.buckets.entry(t / self.p.w).or_default() += cost;
    }

    /// The count of the reservation's bucket moves, if it is the current or the previous one.
    fn settle(&mut self, t: u64, at: u64, reserved: u64, actual: u64) {
        let (k, now) = (at / self.p.w, t / self.p.w);
        if k == now || k + 1 == now {
            let n = self.buckets.entry(k).or_default();
            *n = settled(*n, reserved, actual, self.p.n);
        }
    }
}

/// Token / leaky bucket as the continuous-state leaky bucket: content `x` (in ns of work) drains at
/// one ns per ns; a request of cost `c` adds `c*T` and is admitted when the content stays <= `B*T`.
pub(crate) struct Bucket {
    p: P,
    x: u64,
    lct: u64,
}

impl Bucket {
    fn content(&self, t: u64) -> u64 {
        self.x.saturating_sub(t - self.lct)
    }
}

impl QuotaOracle for Bucket {
    fn check(&mut self, t: u64, cost: u64) -> Expect {
        let P { b, t: tt, .. } = self.p;
        let cap = b * tt;
        let x = self.content(t);
        let left = |x: u64| ((cap - x.min(cap)) / tt).min(b);
        if cost > b {
            Expect::exceeds(b, left(x), x)
        } else if x + cost * tt <= cap {
            Expect::allowed(b, left(x + cost * tt), x + cost * tt)
        } else {
            Expect::rejected(b, left(x), x, x + cost * tt - cap)
        }
    }

    fn commit(&mut self, t: u64, cost: u64) {
        self.x = self.content(t) + cost * self.p.t;
        self.lct = t;
    }

    /// TAT moves by `(actual - reserved) * T`: the content drops, not below 0, or grows, not past
    /// the bucket's depth (unless already above).
    fn settle(&mut self, t: u64, _at: u64, reserved: u64, actual: u64) {
        let x = self.content(t);
        let cap = self.p.b * self.p.t;
        self.x = if actual <= reserved {
            x.saturating_sub((reserved - actual) * self.p.t)
        } else {
            (x + (actual - reserved) * self.p.t).min(x.max(cap))
        };
        self.lct = t;
    }
}

/// Several quotas: all must admit; the reported quota per the guide's "Headers".
pub(crate) struct RuleOracle {
    pub(crate) quotas: Vec<Box<dyn QuotaOracle>>,
}

impl RuleOracle {
    pub(crate) fn new(strategy: Strategy, quotas: &[Quota]) -> Self {
        Self {
            quotas: quotas.iter().map(|q| oracle(strategy, q)).collect(),
        }
    }

    /// A settlement on every quota, answered as a peek afterwards.
    pub(crate) fn settle(
        &mut self,
        t: u64,
        at: u64,
        reserved: u64,
        actual: u64,
    ) -> (usize, Expect) {
        for o in &mut self.quotas {
            o.settle(t, at, reserved, actual);
        }
        self.decide(t, 0)
    }

    /// The reported quota's index and decision; commits to every quota when all admit.
    pub(crate) fn decide(&mut self, t: u64, cost: u64) -> (usize, Expect) {
        let all: Vec<Expect> = self.quotas.iter_mut().map(|o| o.check(t, cost)).collect();
        let rank = |o: Outcome| match o {
            Outcome::Allowed => 0,
            Outcome::Rejected => 1,
            _ => 2,
        };
        let mut best = 0;
        for (i, e) in all.iter().enumerate().skip(1) {
            let r = &all[best];
            let better = match rank(e.outcome).cmp(&rank(r.outcome)) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Equal if e.outcome == Outcome::Rejected => {
                    e.retry_after > r.retry_after
                }
                std::cmp::Ordering::Equal => {
                    e.remaining < r.remaining
                        || (e.remaining == r.remaining && e.reset_after > r.reset_after)
                }
            };
            if better {
                best = i;
            }
        }
        if cost > 0 && all.iter().all(|e| e.outcome == Outcome::Allowed) {
            for o in &mut self.quotas {
                o.commit(t, cost);
            }
        }
        (best, all[best])
    }
}

/// The most cost admitted in any trailing window `(t - w, t]` (two pointers; `log` sorted by time).
pub(crate) fn max_trailing(log: &[(u64, u64)], w: u64) -> u64 {
    let (mut lo, mut sum, mut best) = (0, 0, 0);
    for &(t, c) in log {
        sum += c;
        while t - log[lo].0 >= w {
            sum -= log[lo].1;
            lo += 1;
        }
        best = best.max(sum);
    }
    best
}

/// The most cost admitted in one clock-aligned window `[kW, (k+1)W)`.
pub(crate) fn max_aligned(log: &[(u64, u64)], w: u64) -> u64 {
    let mut per: BTreeMap<u64, u64> = BTreeMap::new();
    for &(t, c) in log {
        *per.entry(t / w).or_default() += c;
    }
    per.values().copied().max().unwrap_or(0)
}

/// Checks the bucket bound: in every closed interval `[a, b]`, admitted cost <= `B + floor((b-a)/T)`.
/// Returns the first violating pair.
pub(crate) fn bucket_bound_violation(log: &[(u64, u64)], b: u64, t: u64) -> Option<(usize, usize)> {
    for i in 0..log.len() {
        let mut sum = 0;
        for (j, &(tj, c)) in log.iter().enumerate().skip(i) {
            sum += c;
            if sum > b + (tj - log[i].0) / t {
                return Some((i, j));
            }
        }
    }
    None
}
