//! The incremental sweep: idle keys go away as traffic flows, one segment at a time, paced by
//! time and by inserts.

use std::hash::Hash;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::table::{SEGMENTS, Segmented};
use super::{CATCH_UP_AFTER, MemoryStore};
use crate::stats::HeldCount;

/// While traffic flows, one segment is swept every this many nanoseconds (the whole store every
/// 8 s). Paced by time, not by calls: at 10^6 keys a step scans ~16 k entries (about a
/// millisecond), so the sweep costs a fraction of a percent of a core whatever the request rate.
pub(super) const SWEEP_STEP_EVERY: u64 = 8_000_000_000 / SEGMENTS as u64;

/// When the sweep runs, and whether a catch-up after a gap is under way.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// When the next timed sweep step is due (see [`SWEEP_STEP_EVERY`]).
    pub(super) next_step_at: AtomicU64,
    /// While a catch-up runs: the start of the gap it follows (every state older than the gap
    /// is read as of then); 0 otherwise.
    pub(super) catch_up_from: AtomicU64,
}

// The catch-up keeps one bit per segment.
const _: () = assert!(SEGMENTS <= 64);

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K> {
    /// Every table: the general entries, then the packed tables claimed so far.
    pub(super) fn tables(&self) -> impl Iterator<Item = &dyn Segmented> {
        std::iter::once(&self.general as &dyn Segmented).chain(
            self.packed
                .iter()
                .filter_map(OnceLock::get)
                .map(|t| t as &dyn Segmented),
        )
    }

    /// Sweeps one segment every [`SWEEP_STEP_EVERY`] while calls come in, so idle keys go away as
    /// traffic flows. The hot path only reads a shared word that changes once per step.
    #[inline]
    pub(super) fn tick(&self, now: u64) {
        // Acquire: a thread that sees a deadline moved after a gap sees the catch-up started.
        let due = self.pacing.0.next_step_at.load(Ordering::Acquire);
        // The second test restarts the pacing after the clock went back.
        if now >= due || due > now.saturating_add(SWEEP_STEP_EVERY) {
            self.timed_step(due, now);
        }
    }

    #[cold]
    pub(super) fn timed_step(&self, due: u64, now: u64) {
        // Every thread that sees the gap starts the catch-up before it decides; the others see
        // the deadline moved after it was started.
        if due != 0 && now.saturating_sub(due) >= CATCH_UP_AFTER {
            self.catch_up(due, now);
        }
        let next = now.saturating_add(SWEEP_STEP_EVERY);
        // One caller per step: the one that moves the deadline.
        if self
            .pacing
            .0
            .next_step_at
            .compare_exchange(due, next, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            self.sweep_step(now);
        }
    }

    /// After enough inserts (one segment's share of the keys held), sweep one segment: amortised, each
    /// insert pays for about one entry examined. Told of inserts as the key count publishes them
    /// (`published` at a time), so that this shared word is not written on every insert.
    pub(super) fn after_insert(&self, published: u64, now: u64) {
        let inserts = self.inserts.fetch_add(published, Ordering::Relaxed) + published;
        if inserts >= (self.keys.published() / SEGMENTS as u64).max(HeldCount::BATCH) {
            self.inserts.store(0, Ordering::Relaxed);
            self.sweep_step(now);
        }
    }

    pub(super) fn next_segment(&self) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % SEGMENTS
    }

    /// Drops the expired keys of the next segment of every table.
    pub(super) fn sweep_step(&self, now: u64) {
        let i = self.next_segment();
        self.sweep_segment(i, now);
    }

    /// Drops the keys of segment `i` of every table fresh at `now`; during a catch-up that has
    /// not reached the segment, their states read as of the gap's start (see
    /// [`MemoryStore::catch_up`]). Returns how many.
    pub(super) fn sweep_segment(&self, i: usize, now: u64) -> usize {
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        let bit = 1u64 << i;
        let catching_up = from != 0 && self.caught.load(Ordering::Acquire) & bit == 0;
        let read_at = if catching_up { from } else { now };
        let removed: usize = self.tables().map(|t| t.sweep(i, read_at, now)).sum();
        if removed > 0 {
            self.keys.remove(removed as u64);
        }
        if catching_up
            && self.caught.fetch_or(bit, Ordering::Release) | bit == u64::MAX
            && self
                .pacing
                .0
                .catch_up_from
                .compare_exchange(from, 0, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        {
            // Every segment swept as of the gap's start: a key dropped as fresh by the catch-up
            // must not stay cached as blocked.
            self.blocked.invalidate();
        }
        removed
    }

    /// Sweeps every segment.
    pub fn sweep_all(&self, now: u64) {
        for i in 0..SEGMENTS {
            self.sweep_segment(i, now);
        }
        // Called with any time: a key swept as fresh then must not stay cached as blocked. After
        // the removals, so that a rejection cached meanwhile is from the older generation.
        self.blocked.invalidate();
    }
}
