//! Counters that many threads bump without fighting over one cache line.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const STRIPES: usize = 16;

/// A counter split into cache-line-sized stripes; each thread bumps its own stripe.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    stripes: [Stripe; STRIPES],
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        i.get()
    })
}

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        if let Some(s) = self.stripes.get(stripe_index()) {
            s.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
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
}
