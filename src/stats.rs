//! Counters that many threads bump without fighting over one cache line.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// Stripes a thread may own: its owner bumps it with a plain load and store (no atomic
/// read-modify-write on the hot path).
const OWNED: usize = 15;
/// The stripe that threads without one of their own share, bumped with `fetch_add`.
const SHARED: usize = OWNED;
const STRIPES: usize = OWNED + 1;

/// A counter split into cache-line-sized stripes; each thread bumps its own stripe.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    stripes: [Stripe; STRIPES],
}

/// A value alone on its cache lines (128 bytes: a line and the one the prefetcher pairs with it), so
/// that writes to its neighbours do not take it away from the cores reading it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CacheLine<T>(pub(crate) T);

type Stripe = CacheLine<AtomicU64>;

/// Stripe indices given back by threads that ended.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A thread's stripe index, owned for the thread's life and given back when it ends (through the
/// mutex, so the next owner sees the last value written).
struct Owned(usize);

impl Owned {
    fn acquire() -> usize {
        if let Some(i) = FREE.lock().pop() {
            return i;
        }
        let next = NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < OWNED).then_some(n + 1)
        });
        next.unwrap_or(SHARED)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // Bumps after this (from other thread-local destructors) go to the shared stripe.
        STRIPE.set(SHARED);
        if self.0 < OWNED {
            FREE.lock().push(self.0);
        }
    }
}

/// Not chosen yet.
const UNSET: usize = usize::MAX;

thread_local! {
    /// The thread's stripe: a plain word with no destructor, so that a bump reads it with one load
    /// (no lazy-initialisation or destructor-state check on the hot path).
    static STRIPE: std::cell::Cell<usize> = const { std::cell::Cell::new(UNSET) };
    /// Gives the stripe back when the thread ends (touched once per thread, when it is chosen).
    static OWNER: std::cell::Cell<Option<Owned>> = const { std::cell::Cell::new(None) };
}

/// The calling thread's stripe, chosen on its first bump.
#[cold]
fn choose_stripe() -> usize {
    let i = Owned::acquire();
    // A thread whose locals are being torn down keeps no stripe: it uses the shared one.
    match OWNER.try_with(|o| o.set(Some(Owned(i)))) {
        Ok(()) => {
            STRIPE.set(i);
            i
        }
        Err(_) => {
            if i < OWNED {
                FREE.lock().push(i);
            }
            SHARED
        }
    }
}

/// The calling thread's stripe: below [`OWNED`] one it owns, [`SHARED`] otherwise.
#[inline]
fn stripe() -> usize {
    match STRIPE.get() {
        UNSET => choose_stripe(),
        i => i,
    }
}

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        let i = stripe();
        match self.stripes.get(i) {
            // Only this thread writes stripe `i`: a load and a store cannot lose an update.
            Some(s) if i < OWNED => s.0.store(
                s.0.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            ),
            Some(s) => {
                s.0.fetch_add(n, Ordering::Relaxed);
            }
            None => {}
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// How many items a structure holds, when many threads add them one at a time: with a batch above
/// 1, each thread gathers its additions in a stripe of its own and publishes them a batch at a time,
/// so that two threads adding items do not pass one cache line back and forth on every addition.
/// Removals (in bulk, by sweeps) go straight to the published count. With a batch of 1 every
/// addition is published at once (an exact count at every moment, for small bounds).
#[derive(Debug)]
pub(crate) struct HeldCount {
    /// Published additions minus removals (wrapping: removals may be published first).
    published: Stripe,
    /// Additions not published yet, per owned stripe.
    pending: [Stripe; OWNED],
    batch: u64,
    /// How far the published count may be below the exact one.
    slack: u64,
}

impl HeldCount {
    /// The largest batch.
    pub(crate) const BATCH: u64 = 64;

    /// A count publishing additions `batch` (1 to [`BATCH`](Self::BATCH)) at a time.
    pub(crate) fn new(batch: u64) -> Self {
        let batch = batch.clamp(1, Self::BATCH);
        Self {
            published: Stripe::default(),
            pending: Default::default(),
            batch,
            slack: (batch - 1) * OWNED as u64,
        }
    }

    /// Counts one item added; returns how many additions this published (0 while gathering).
    #[inline]
    pub(crate) fn add_one(&self) -> u64 {
        let s = match self.pending.get(stripe()) {
            Some(s) if self.batch > 1 => s,
            _ => {
                self.published.0.fetch_add(1, Ordering::Relaxed);
                return 1;
            }
        };
        // Only this thread writes its stripe: a load and a store cannot lose an update.
        let n = s.0.load(Ordering::Relaxed) + 1;
        if n < self.batch {
            s.0.store(n, Ordering::Relaxed);
            return 0;
        }
        // Published before the stripe is emptied (released: a reader that sees it emptied sees
        // them published): a reader may count them twice for a moment, never miss them.
        self.published.0.fetch_add(n, Ordering::Relaxed);
        s.0.store(0, Ordering::Release);
        n
    }

    /// Counts `n` items removed.
    #[inline]
    pub(crate) fn remove(&self, n: u64) {
        self.published.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// The published count: at most `batch - 1` per thread below [`get`](Self::get).
    #[inline]
    pub(crate) fn published(&self) -> u64 {
        clamp_signed(self.published.0.load(Ordering::Relaxed))
    }

    /// The count, the gathered additions included (exact when no thread is adding or removing).
    pub(crate) fn get(&self) -> u64 {
        // The stripes before the published count (see `add_one`).
        let pending = self
            .pending
            .iter()
            .map(|s| s.0.load(Ordering::Acquire))
            .fold(0, u64::wrapping_add);
        clamp_signed(
            self.published
                .0
                .load(Ordering::Relaxed)
                .wrapping_add(pending),
        )
    }

    /// Whether the count is at least `n`: the published count answers when it is far enough
    /// below `n`; near `n`, the gathered additions are added in.
    #[inline]
    pub(crate) fn at_least(&self, n: u64) -> bool {
        self.published().saturating_add(self.slack) >= n && self.get() >= n
    }
}

/// A wrapping count read as signed, below zero as zero (removals published before the additions).
fn clamp_signed(n: u64) -> u64 {
    if n > i64::MAX as u64 { 0 } else { n }
}

/// A snapshot of a limiter's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests admitted.
    pub allowed: u64,
    /// Requests rejected (including costs that can never be admitted).
    pub rejected: u64,
    /// Calls the store could not answer.
    pub store_errors: u64,
    /// Requests let through because the store failed and the policy is fail-open.
    pub fail_open: u64,
    /// Keys removed to make room (not counting expired keys swept away).
    pub evictions: u64,
    /// Requests of new keys routed to the shared overflow key because every held key was blocked.
    pub overflow_hits: u64,
    /// Keys held now (in-process stores).
    pub keys: u64,
    /// Whether the store's circuit breaker is open now (the Redis store; `false` for others).
    pub breaker_open: bool,
    /// Requests refused because their per-request rule is one the store cannot honour
    /// ([`StoreErrorKind::InvalidRule`](crate::StoreErrorKind::InvalidRule)).
    pub invalid_rules: u64,
    /// Settlements refused because their reservation was made by another limiter, rule or key
    /// ([`StoreErrorKind::ForeignReservation`](crate::StoreErrorKind::ForeignReservation)).
    pub settle_refused: u64,
    /// Units settled above a reservation that a moving window could not record, its log already
    /// holding its limit (the log keeps one entry per unit, at most the limit: the rest of a debt
    /// beyond a full window is forgiven, and counted here).
    pub settle_dropped_units: u64,
    /// Whether the store cannot be used now: the Redis store before its first connection (Redis
    /// not answering yet, or a host name that does not resolve) and while its circuit breaker is
    /// open; `false` for in-process stores. `tollgate_store_up` is its negation.
    pub store_down: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_add_from_more_threads_than_stripes() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..40 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.add(1);
                    }
                });
            }
        });
        assert_eq!(c.get(), 40_000);
        // Stripes of ended threads are reused, and keep their counts.
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| c.add(2));
            }
        });
        assert_eq!(c.get(), 40_016);
    }

    #[test]
    fn a_held_count_is_exact_once_threads_stop_and_published_within_its_slack() {
        let c = HeldCount::new(HeldCount::BATCH);
        std::thread::scope(|s| {
            for _ in 0..40 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.add_one();
                    }
                });
            }
        });
        assert_eq!(c.get(), 40_000);
        assert!(c.published() <= 40_000 && c.published() + c.slack >= 40_000);
        c.remove(40_000);
        assert_eq!(c.get(), 0);
        assert!(!c.at_least(1));
        // Removals published before the additions they follow read as nothing held, not as
        // a wrapped-around huge count.
        let d = HeldCount::new(HeldCount::BATCH);
        d.add_one();
        d.remove(1);
        assert_eq!(d.published(), 0);
        assert_eq!(d.get(), 0);
        assert!(!d.at_least(1));
        d.add_one();
        assert!(d.at_least(1) && !d.at_least(2));
        // A batch of 1 publishes every addition.
        let e = HeldCount::new(1);
        assert_eq!(e.add_one(), 1);
        assert_eq!(e.published(), 1);
    }
}
