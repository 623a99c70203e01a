//! Where the limiter's time comes from.
//!
//! Time is a `u64` count of nanoseconds since the Unix epoch, so clock-aligned windows line up with
//! UTC (a `1/hour` fixed window resets at the top of every UTC hour), as they do with Redis's `TIME`.
//! Only the limiter reads a clock; strategies take `now` as an argument.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::rule::Rule;
use crate::strategy::Strategy;

/// A source of time: nanoseconds since the Unix epoch.
///
/// Implementations should not go backwards; the strategies tolerate it anyway (a key's state is
/// never rewound, and a step back never admits more than holding time still would).
pub trait Clock: Send + Sync + 'static {
    /// The current time in nanoseconds since the Unix epoch.
    fn now(&self) -> u64;

    /// The time for a decision under `rule`, when it is not the rule the clock was chosen for (a
    /// per-request rule, a tier, a rule changed by a reload). [`now`](Self::now) by default;
    /// [`SystemClock`] reads its precise time instead when it reads the coarse time and `rule`
    /// cannot take its steps (see [`SystemClock::suited_to`]). A clock that wraps another should
    /// forward it.
    fn now_for(&self, rule: &Rule) -> u64 {
        let _ = rule;
        self.now()
    }
}

/// The default clock: Unix time read once at creation (once per process for the clocks
/// [`SystemClock::suited_to`] makes, which share one time line), then advanced by [`Instant`]
/// (monotonic).
///
/// It never goes back when the wall clock is stepped (NTP, an operator). [`SystemClock::new`] costs
/// one `Instant::now()` per read (some 20-40 ns on a VM, as much as a whole decision); resolution:
/// nanoseconds.
///
/// The builder's default is [`SystemClock::suited_to`] the limiter's rule: when no quota of the rule
/// needs finer than a millisecond, a read is one load of a process-wide time refreshed every
/// millisecond (the same as [`CoarseClock`]'s, shared by every limiter, asleep while nothing reads
/// it), about 1 ns. Why that is
/// safe, and what it costs:
///
/// - **It never admits more.** The time read lags real time by at most the refresh interval plus
///   the refreshing thread's scheduling delay, and never goes back. A lagging time only moves a
///   window's end, or a bucket's refill, later: a quota counts the same requests against a window
///   that ends up to that much late, or a bucket that has refilled a little less.
/// - **Where it admits less.** Time moves in steps of about 1 ms, so a bucket refills in steps of
///   `rate x 1 ms` tokens: when the burst is smaller than that, a step's refill is cut to the burst
///   and the bucket admits at most `burst` per step (at most one per millisecond for burst 1). The
///   default therefore keeps the precise clock for a bucket whose depth (`burst x T`) is under
///   2 ms, and for any window shorter than a second (where a millisecond is more than 0.1% of it).
///   A request's wait (`Retry-After`) is computed from the lagging time and may end up to a
///   millisecond early: a client retrying at once is rejected again, never let through early.
/// - **What the refreshing thread costs.** While decisions come it wakes every millisecond. Where
///   it shares a CPU with the request workers (a one-CPU container), each wake-up interrupts one:
///   an HTTP server on one core at ~113,000 requests a second saw 4,819 wake-ups in 5 s, 0.6% of
///   the CPU, and 5,034 involuntary switches of its worker. [`SystemClock::new`] has no thread and
///   reads the precise time on every decision instead.
///
/// A decision under another rule than the limiter's own (a per-request rule, a tier) reads the
/// precise time when that rule cannot take the steps ([`Clock::now_for`]). The clocks the builder
/// and a rules file give by default read one time line, the coarse time's own.
///
/// Pass [`SystemClock::new`] (or any other clock) to the builder to choose yourself.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    base: u64,
    start: Instant,
    /// The process-wide coarse time, when this clock reads it.
    coarse: Option<&'static CoarseInner>,
}

/// How finely the shared coarse time is refreshed.
const SHARED_RESOLUTION: Duration = Duration::from_millis(1);

/// The time line of the clocks [`SystemClock::suited_to`] makes, precise or coarse: one anchor, so
/// that a limiter that reads both (its own rule coarse, another precise) never sees them disagree
/// by more than the coarse time's lag, whatever the wall clock did between their creations.
fn anchor() -> SystemClock {
    static ANCHOR: OnceLock<SystemClock> = OnceLock::new();
    *ANCHOR.get_or_init(SystemClock::new)
}

/// Brings the coarse time `clock` reads, if it is a [`SystemClock`] on it, up to `now` (see
/// [`CoarseInner::advance_to`]): for a decision whose time came from another clock's precise
/// reading.
#[cfg(feature = "rules")]
pub(crate) fn advance_to<C: Clock>(clock: &C, now: u64) {
    let coarse = (clock as &dyn std::any::Any)
        .downcast_ref::<SystemClock>()
        .and_then(|c| c.coarse);
    if let Some(c) = coarse {
        c.advance_to(now);
    }
}

/// The process-wide coarse clock behind [`SystemClock::suited_to`], started on first use (`None`
/// when its thread could not be started).
fn shared_coarse() -> Option<&'static CoarseInner> {
    static SHARED: OnceLock<Option<CoarseClock>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let clock = CoarseClock::on(anchor(), SHARED_RESOLUTION);
            clock.inner.cached.then_some(clock)
        })
        .as_ref()
        .map(|c| &*c.inner)
}

/// Whether every quota of `rule` is served as well by a clock read in steps of `resolution`
/// (see [`SystemClock`]): windows of a second or more, bucket depths of twice the step or more.
fn tolerates_steps(rule: &Rule, resolution: Duration) -> bool {
    let step = saturating_nanos(resolution);
    rule.nanos().iter().all(|p| match rule.strategy() {
        Strategy::TokenBucket | Strategy::LeakyBucket => p.tau() >= step.saturating_mul(2),
        _ => p.window >= step.saturating_mul(1000),
    })
}

impl SystemClock {
    /// A clock anchored at the current Unix time.
    pub fn new() -> Self {
        let base = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            base,
            start: Instant::now(),
            coarse: None,
        }
    }

    /// The clock the builder gives a limiter of `rule` by default: reading a process-wide time
    /// refreshed every millisecond when `rule` allows it (see [`SystemClock`] for when and why),
    /// precise otherwise.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tollgate::{Quota, Rule, Strategy, SystemClock};
    ///
    /// let per_minute = Rule::parse(Strategy::SlidingWindow, "100/minute").unwrap();
    /// assert_eq!(SystemClock::suited_to(&per_minute).resolution(), Duration::from_millis(1));
    /// // A bucket one token deep at 10,000 per second refills every 100 µs: precise.
    /// let quota = Quota::per_second(NonZeroU32::new(10_000).unwrap()).with_burst(NonZeroU32::MIN);
    /// let fine = Rule::new(Strategy::TokenBucket, vec![quota]).unwrap();
    /// assert_eq!(SystemClock::suited_to(&fine).resolution(), Duration::from_nanos(1));
    /// ```
    pub fn suited_to(rule: &Rule) -> Self {
        let clock = anchor();
        if !tolerates_steps(rule, SHARED_RESOLUTION) {
            return clock;
        }
        Self {
            coarse: shared_coarse(),
            ..clock
        }
    }

    /// The precise clock on the time line [`suited_to`](Self::suited_to)'s clocks share.
    #[cfg(feature = "rules")]
    pub(crate) fn precise() -> Self {
        anchor()
    }

    /// The step in which the time read moves: 1 ns for the precise clock, the refresh interval
    /// (1 ms) for the shared coarse time.
    pub fn resolution(&self) -> Duration {
        self.coarse
            .map_or(Duration::from_nanos(1), |c| c.resolution)
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        if let Some(coarse) = self.coarse {
            return coarse.read();
        }
        let elapsed = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.base.saturating_add(elapsed)
    }

    /// The coarse time when `rule` takes its steps, else the precise time of the coarse time's own
    /// source, which the coarse time then never falls behind (one time line for both).
    #[inline]
    fn now_for(&self, rule: &Rule) -> u64 {
        match self.coarse {
            Some(c) if !tolerates_steps(rule, c.resolution) => c.read_precise(),
            _ => self.now(),
        }
    }
}

/// A clock on tokio's time (`tokio::time::Instant`), anchored at the Unix time of its creation.
///
/// With `tokio::time::pause()` (or `#[tokio::test(start_paused = true)]`) it advances only when the
/// test advances tokio's time, so pacing tests run without real sleeps.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    base: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock anchored at the current Unix time and tokio instant.
    pub fn new() -> Self {
        Self {
            base: SystemClock::new().base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.base.saturating_add(elapsed)
    }
}

/// A clock that moves only when told to: for tests. Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(Duration::from_secs(45));
/// let seen_by_limiter = clock.clone();
/// clock.advance(Duration::from_secs(60));
/// assert_eq!(seen_by_limiter.now(), 105_000_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `since_epoch` (time since the Unix epoch) until moved.
    pub fn new(since_epoch: Duration) -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(saturating_nanos(since_epoch))),
        }
    }

    /// Moves the clock forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the time; it may go backwards (to test how the limiter copes).
    pub fn set(&self, since_epoch: Duration) {
        self.nanos
            .store(saturating_nanos(since_epoch), Ordering::SeqCst);
    }

    /// Sets the time in nanoseconds since the Unix epoch.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

/// A cheap clock: reads a cached time that a background thread refreshes every `resolution`
/// (1 ms by default), the way nginx caches its time once per event-loop turn.
///
/// A read is one atomic load (about 1 ns) instead of a monotonic clock read (`Instant::now()`, some
/// 20-30 ns on a VM). The cost is resolution: the time read lags real time by up to `resolution`
/// plus the updater thread's scheduling delay (more on an overloaded machine). A lagging clock only
/// makes the limiter stricter (a window ends, or a bucket refills, up to that much later); it never
/// admits more. Use it when quotas are much coarser than a millisecond (per second, per minute).
///
/// The time is Unix time like [`SystemClock`]'s, monotonic (it never goes back), and starts at the
/// current time. Clones share one cached time and one updater thread, which ends soon after the last
/// clone is dropped. If the thread cannot be started the clock reads [`SystemClock`] directly.
///
/// An idle process spends nothing on it: after 100 refreshes with no read the updater sleeps, and
/// the next read takes the time from [`SystemClock`] itself and wakes it. The first read after each
/// refresh marks it read (one atomic write per refresh, not per read).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, CoarseClock};
///
/// let clock = CoarseClock::new();
/// assert_eq!(clock.resolution(), Duration::from_millis(1));
/// let a = clock.now();
/// std::thread::sleep(Duration::from_millis(20));
/// // Later, never earlier (how much later depends on when the updater thread last ran).
/// assert!(clock.now() >= a);
/// ```
#[derive(Clone, Debug)]
pub struct CoarseClock {
    inner: Arc<CoarseInner>,
}

#[derive(Debug)]
struct CoarseInner {
    /// The cached time, its two low bits flags (see [`UNREAD`], [`ASLEEP`]): a nanosecond or three
    /// less, whatever the resolution.
    nanos: AtomicU64,
    source: SystemClock,
    resolution: Duration,
    /// `false` when the updater thread could not be started: read `source` instead.
    cached: bool,
    /// The updater thread, to wake it when a read finds it asleep or the clock is dropped.
    ticker: OnceLock<std::thread::Thread>,
}

/// Flag of the cached time: no read has seen it since the updater refreshed it. Set by the updater,
/// cleared by the first read, so that a read of a time already read (nearly all) finds both flags
/// clear and returns the time as it is.
const UNREAD: u64 = 1;
/// Flag of the cached time: the updater has gone to sleep (no read for [`IDLE_TICKS`] refreshes),
/// the time is stale; the next read refreshes it and wakes the updater.
const ASLEEP: u64 = 2;
const FLAGS: u64 = UNREAD | ASLEEP;
/// Refreshes in a row with no read after which the updater sleeps until the next read: an idle
/// process spends no CPU on its clock (a wake-up every millisecond costs some 2 % of a core on a VM).
const IDLE_TICKS: u32 = 100;

impl CoarseInner {
    /// The cached time. The first read after a refresh marks it read (one write per refresh, not
    /// per read); a read that finds the updater asleep reads the source and wakes it.
    #[inline]
    fn read(&self) -> u64 {
        let n = self.nanos.load(Ordering::Relaxed);
        if n & FLAGS == 0 {
            return n;
        }
        self.read_cold(n)
    }

    #[cold]
    #[inline(never)]
    fn read_cold(&self, n: u64) -> u64 {
        if n & ASLEEP == 0 {
            return self.nanos.fetch_and(!UNREAD, Ordering::Relaxed) & !FLAGS;
        }
        // Never behind what any read returned before: the source is monotonic and the stored
        // time only grows.
        let fresh = self.source.now() & !FLAGS;
        let now = self.nanos.fetch_max(fresh, Ordering::Relaxed).max(fresh);
        if let Some(t) = self.ticker.get() {
            t.unpark();
        }
        now & !FLAGS
    }

    /// The source's time, which the cached time then never falls behind (see
    /// [`advance_to`](Self::advance_to)).
    fn read_precise(&self) -> u64 {
        self.advance_to(self.source.now())
    }

    /// Brings the cached time up to `now` (a precise reading on its time line), so that a coarse
    /// read after it is not earlier: a store that sees both (a key decided under a finer rule,
    /// then one under the limiter's own) never finds time going back by the coarse time's lag,
    /// e.g. a key swept at the precise time and decided again in its window at the coarse one.
    /// When it moves the time it counts as a read, and wakes a sleeping updater. Returns the
    /// later of the two.
    fn advance_to(&self, now: u64) -> u64 {
        let now = now & !FLAGS;
        let cached = self.nanos.load(Ordering::Relaxed);
        if cached & !FLAGS >= now {
            return cached & !FLAGS;
        }
        let prev = self.nanos.fetch_max(now, Ordering::Relaxed);
        if prev & ASLEEP != 0 && prev < now {
            if let Some(t) = self.ticker.get() {
                t.unpark();
            }
        }
        now.max(prev & !FLAGS)
    }

    /// One refresh by the updater; `false` when it went to sleep instead (no read for
    /// [`IDLE_TICKS`] refreshes), to be woken by a read or by the clock's drop.
    fn refresh(&self, idle: &mut u32) -> bool {
        let prev = self.nanos.load(Ordering::Relaxed);
        *idle = if prev & UNREAD != 0 { *idle + 1 } else { 0 };
        if *idle >= IDLE_TICKS {
            *idle = 0;
            // Fails when a read marked the time meanwhile: stay awake.
            return self
                .nanos
                .compare_exchange(prev, prev | ASLEEP, Ordering::Relaxed, Ordering::Relaxed)
                .is_err();
        }
        self.nanos
            .fetch_max((self.source.now() & !FLAGS) | UNREAD, Ordering::Relaxed);
        true
    }

    fn asleep(&self) -> bool {
        self.nanos.load(Ordering::Relaxed) & ASLEEP != 0
    }
}

impl Drop for CoarseInner {
    fn drop(&mut self) {
        // A sleeping updater would never see the clock gone.
        if let Some(t) = self.ticker.get() {
            t.unpark();
        }
    }
}

impl CoarseClock {
    /// A clock refreshed every millisecond.
    pub fn new() -> Self {
        Self::with_resolution(Duration::from_millis(1))
    }

    /// A clock refreshed every `resolution` (at least 50 µs).
    pub fn with_resolution(resolution: Duration) -> Self {
        Self::on(SystemClock::new(), resolution)
    }

    /// A clock caching `source`'s time every `resolution` (at least 50 µs).
    fn on(source: SystemClock, resolution: Duration) -> Self {
        let resolution = resolution.max(Duration::from_micros(50));
        let make = |cached| {
            Arc::new(CoarseInner {
                nanos: AtomicU64::new(source.now() & !FLAGS),
                source,
                resolution,
                cached,
                ticker: OnceLock::new(),
            })
        };
        let inner = make(true);
        let weak = Arc::downgrade(&inner);
        let spawned = std::thread::Builder::new()
            .name("tollgate-clock".into())
            .spawn(move || {
                let mut idle = 0;
                loop {
                    std::thread::sleep(resolution);
                    let Some(inner) = weak.upgrade() else { break };
                    if inner.refresh(&mut idle) {
                        continue;
                    }
                    drop(inner);
                    // Asleep until a read (or the clock's drop) wakes it; a spurious wake-up
                    // looks again.
                    while weak.upgrade().is_some_and(|i| i.asleep()) {
                        std::thread::park();
                    }
                }
            });
        let inner = match spawned {
            Ok(handle) => {
                let _ = inner.ticker.set(handle.thread().clone());
                inner
            }
            Err(_) => make(false),
        };
        Self { inner }
    }

    /// How often the cached time is refreshed.
    pub fn resolution(&self) -> Duration {
        self.inner.resolution
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        if self.inner.cached {
            self.inner.read()
        } else {
            self.inner.source.now()
        }
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn now_for(&self, rule: &Rule) -> u64 {
        (**self).now_for(rule)
    }
}

pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_unix_time_and_monotonic() {
        let c = SystemClock::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let a = c.now();
        assert!(a.abs_diff(wall) < 1_000_000_000);
        let b = c.now();
        assert!(b >= a);
    }

    #[test]
    fn a_suited_clock_reads_the_precise_time_for_a_rule_that_cannot_take_its_steps() {
        use std::num::NonZeroU32;
        let per_minute = Rule::parse(Strategy::SlidingWindow, "100/minute").unwrap();
        // A bucket one token deep at 10,000 per second: 100 µs deep, finer than a step.
        let quota =
            crate::Quota::per_second(NonZeroU32::new(10_000).unwrap()).with_burst(NonZeroU32::MIN);
        let fine = Rule::new(Strategy::TokenBucket, vec![quota]).unwrap();
        let clock = SystemClock::suited_to(&per_minute);
        assert_eq!(clock.resolution(), Duration::from_millis(1));
        // The readings seen while spinning 5 ms: the coarse time moves once a millisecond, the
        // precise time at nearly every read.
        let distinct = |read: &dyn Fn() -> u64| {
            let start = Instant::now();
            let mut seen = std::collections::HashSet::new();
            while start.elapsed() < Duration::from_millis(5) {
                seen.insert(read());
            }
            seen.len()
        };
        let precise = distinct(&|| clock.now_for(&fine));
        let coarse = distinct(&|| clock.now_for(&per_minute));
        assert!(precise > 100, "{precise} distinct precise readings in 5 ms");
        assert!(coarse <= 50, "{coarse} distinct coarse readings in 5 ms");
        // One time line: the precise time is never behind a coarse reading taken before it, nor
        // the coarse time behind a precise reading taken before it.
        for _ in 0..10_000 {
            let c = clock.now();
            let p = clock.now_for(&fine);
            assert!(p >= c);
            assert!(clock.now() >= p);
        }
        // A precise reading taken elsewhere on the line brings the coarse time up to it.
        let shared = clock.coarse.unwrap();
        let precise = shared.source.now();
        shared.advance_to(precise);
        assert!(clock.now() >= precise & !FLAGS);
        // A precise clock reads the same for every rule.
        let precise_clock = SystemClock::suited_to(&fine);
        assert_eq!(precise_clock.resolution(), Duration::from_nanos(1));
        assert!(distinct(&|| precise_clock.now_for(&per_minute)) > 100);
    }

    #[test]
    fn coarse_clock_follows_system_time_within_its_resolution() {
        let c = CoarseClock::with_resolution(Duration::from_millis(2));
        let a = c.now();
        let wall = SystemClock::new().now();
        assert!(a <= wall + 1_000_000 && wall - a < 1_000_000_000);
        let mut last = a;
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(3));
            let n = c.now();
            assert!(n >= last, "monotonic");
            last = n;
        }
        assert!(last > a, "refreshed by the updater thread");
        assert!(SystemClock::new().now() - last < 1_000_000_000);
    }

    #[test]
    fn coarse_clock_updater_ends_with_the_last_clone() {
        let c = CoarseClock::with_resolution(Duration::from_millis(1));
        let weak = Arc::downgrade(&c.inner);
        let d = c.clone();
        drop(c);
        assert!(weak.upgrade().is_some());
        drop(d);
        std::thread::sleep(Duration::from_millis(20));
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn an_unread_coarse_clock_sleeps_and_the_next_read_is_fresh() {
        let c = CoarseClock::with_resolution(Duration::from_millis(1));
        let before = c.now();
        // No read for well over IDLE_TICKS refreshes: the updater goes to sleep.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !c.inner.asleep() {
            assert!(Instant::now() < deadline, "the updater never went to sleep");
            std::thread::sleep(Duration::from_millis(20));
        }
        let stale = c.inner.nanos.load(Ordering::Relaxed) & !FLAGS;
        std::thread::sleep(Duration::from_millis(30));
        // The read after the sleep is the source's time, not the stale one, and wakes it.
        let wall = SystemClock::new().now();
        let woken = c.now();
        assert!(
            woken >= before && woken > stale + 25_000_000,
            "fresh after sleep"
        );
        assert!(woken.abs_diff(wall) < 5_000_000);
        assert!(!c.inner.asleep());
        // Awake again: the updater refreshes without further cold reads.
        let mut last = woken;
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(3));
            let n = c.now();
            assert!(n >= last, "monotonic");
            last = n;
        }
        assert!(last >= woken + 30_000_000, "refreshed by the woken updater");
        // An asleep updater still ends with the clock.
        let weak = Arc::downgrade(&c.inner);
        drop(c);
        std::thread::sleep(Duration::from_millis(20));
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn coarse_reads_racing_the_updater_never_go_back() {
        let c = CoarseClock::with_resolution(Duration::from_micros(50));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut last = 0;
                    let end = Instant::now() + Duration::from_millis(300);
                    while Instant::now() < end {
                        let n = c.now();
                        assert!(n >= last, "monotonic");
                        last = n;
                        // Gaps long enough for the updater to fall asleep now and then.
                        if n % 7 == 0 {
                            std::thread::sleep(Duration::from_millis(8));
                        }
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
    }

    #[test]
    fn manual_clock_moves_when_told() {
        let c = ManualClock::new(Duration::from_secs(1));
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now(), 1_005_000_000);
        c.set(Duration::from_secs(0));
        assert_eq!(c.now(), 0);
        c.advance(Duration::MAX);
        assert_eq!(c.now(), u64::MAX);
    }
}
