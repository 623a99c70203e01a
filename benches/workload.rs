//! The limiters under test and the quotas of each workload.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::MonotonicClock;
use governor::{Quota, RateLimiter as Governor};
use tollgate::{Clock, CoarseClock, RateLimiter, Strategy, SystemClock};

/// Allow-all for every strategy but the moving window: `u32::MAX` per day, so neither a hot key nor
/// a run of a few minutes ever reaches the limit, and pre-populated keys stay held all along.
pub const ALLOW_ALL: &str = "4294967295/day";
/// Allow-all for the moving window (its limit is at most 2^20): a ring of at most ~0.5 M entries.
pub const ALLOW_ALL_MOVING: &str = "1048576/20ms";
/// Reject-all: the first request of a key is admitted (done while populating), every later one not.
pub const REJECT_ALL: &str = "1/day";

/// Allowed or rejected: what the workload expects of every timed check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    AllowAll,
    RejectAll,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::AllowAll => "allow_all",
            Mode::RejectAll => "reject_all",
        }
    }

    pub fn quota(self, strategy: Strategy, hot: bool) -> &'static str {
        match (self, strategy) {
            (Mode::RejectAll, _) => REJECT_ALL,
            (Mode::AllowAll, Strategy::MovingWindow) if hot => ALLOW_ALL_MOVING,
            (Mode::AllowAll, Strategy::MovingWindow) => "1048576/day",
            (Mode::AllowAll, _) => ALLOW_ALL,
        }
    }

    fn governor_quota(self) -> Quota {
        match self {
            Mode::AllowAll => Quota::with_period(Duration::from_nanos(
                86_400_000_000_000 / u64::from(u32::MAX),
            ))
            .unwrap()
            .allow_burst(NonZeroU32::MAX),
            Mode::RejectAll => Quota::with_period(Duration::from_secs(86_400)).unwrap(),
        }
    }
}

/// One rate limiter under test, keyed by `u64`.
pub trait Limiter: Send + Sync {
    /// `true` when allowed.
    fn check(&self, key: u64) -> bool;

    /// Makes `key` known, as the workload expects it (see [`populate`]).
    fn populate(&self, key: u64) {
        self.check(key);
    }
}

/// tollgate's limiter, and the cost a key is populated with.
pub struct Tollgate<C: Clock> {
    pub limiter: RateLimiter<u64, tollgate::store::MemoryStore<u64>, C>,
    pub populate_cost: u32,
}

impl<C: Clock> Limiter for Tollgate<C> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.limiter.check_now(&key, 1).is_allowed()
    }

    fn populate(&self, key: u64) {
        self.limiter.check_now(&key, self.populate_cost);
    }
}

type GovernorQuanta = governor::DefaultKeyedRateLimiter<u64>;
type GovernorMonotonic = Governor<
    u64,
    governor::state::keyed::DefaultKeyedStateStore<u64>,
    MonotonicClock,
    governor::middleware::NoOpMiddleware<std::time::Instant>,
>;

impl Limiter for GovernorQuanta {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.check_key(&key).is_ok()
    }
}

impl Limiter for GovernorMonotonic {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.check_key(&key).is_ok()
    }
}

/// Builds one limiter under test.
pub type Make = Box<dyn Fn() -> Box<dyn Limiter>>;

/// The implementations compared in every group: (name, how to build it).
pub fn all(mode: Mode, hot: bool) -> Vec<(String, Make)> {
    let mut v: Vec<(String, Make)> = Vec::new();
    v.push((
        "governor/quanta".into(),
        Box::new(move || Box::new(GovernorQuanta::keyed(mode.governor_quota()))),
    ));
    v.push((
        "governor/monotonic".into(),
        Box::new(move || {
            Box::new(GovernorMonotonic::dashmap_with_clock(
                mode.governor_quota(),
                MonotonicClock,
            ))
        }),
    ));
    for strategy in Strategy::ALL {
        let quota = mode.quota(strategy, hot);
        // A bucket's state is fresh again (and swept) T = 20 µs after one unit: take half the
        // bucket so that populated keys stay held, as governor's do.
        let cost = if mode == Mode::AllowAll && strategy.is_bucket() {
            1 << 31
        } else {
            1
        };
        v.push((
            format!("tollgate/{strategy}/coarse"),
            Box::new(move || Box::new(tollgate(strategy, quota, CoarseClock::new(), cost))),
        ));
        v.push((
            format!("tollgate/{strategy}/system"),
            Box::new(move || Box::new(tollgate(strategy, quota, SystemClock::new(), cost))),
        ));
    }
    v
}

fn tollgate<C: Clock>(
    strategy: Strategy,
    quota: &str,
    clock: C,
    populate_cost: u32,
) -> Tollgate<C> {
    let limiter = RateLimiter::builder()
        .strategy(strategy)
        .quotas(quota)
        .unwrap()
        .clock(clock)
        .build()
        .unwrap();
    Tollgate {
        limiter,
        populate_cost,
    }
}

/// Makes `n` keys (0..n) known to the limiter, as the workload expects them: admitted once (so that
/// reject-all keys are blocked). For allow-all, enough is consumed for the key to stay held (a token
/// bucket's state would otherwise be fresh again, and swept, 20 µs later).
pub fn populate(limiter: &dyn Limiter, n: u64) {
    for k in 0..n {
        limiter.populate(k);
    }
}

/// A tiny xorshift generator: the same cost for every implementation.
#[derive(Clone, Copy, Debug)]
pub struct Rng(pub u64);

impl Rng {
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        ((u128::from(x) * u128::from(n)) >> 64) as u64
    }
}
