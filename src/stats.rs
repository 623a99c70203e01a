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

#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

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

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        let mut i = STRIPE.get();
        if i == UNSET {
            i = choose_stripe();
        }
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
}
