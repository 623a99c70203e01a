//! The incremental sweep: idle keys go away as traffic flows, one segment at a time, paced by
//! time and by inserts. A step sweeps one segment, which holds at most
//! [`KEYS_PER_SEGMENT`](super::table::KEYS_PER_SEGMENT) keys on average at the cap (the segment
//! count grows with the cap, see [`Spread`]): the work a decision does for the sweep is bounded
//! whatever the cap.

use std::hash::Hash;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::table::{KEYS_PER_SEGMENT, SEGMENTS, Segmented, Spread};
use super::{CATCH_UP_AFTER, MemoryStore};
use crate::stats::HeldCount;

/// While traffic flows, every segment is swept once in this many nanoseconds, one segment per
/// step ([`Pacing::step_every`]): one step every 125 ms in a store of 64 segments, every 7.8 ms in
/// one of 1024 (the default cap). Paced by time, not by calls: a step scans about 8 k entries at
/// most at the cap (0.1-0.3 ms at 8 x 10^6 keys; up to about 0.9 ms for a catch-up step of a rule
/// with a time on a ring, which reads each state twice), so the sweep costs the same share of a
/// core whatever the request rate (2-3 % at 8 x 10^6 keys, as in 64 segments). A decision runs the steps due since the last one until they have looked at
/// [`KEYS_PER_SEGMENT`] keys (a segment's worth at the cap; one step after a gap, see
/// [`MemoryStore::catch_up`]): with rare decisions, a rotation takes 8 s or one decision per
/// 8 k keys held, whichever is longer (inserts pace steps too).
pub(super) const ROTATION: u64 = 8_000_000_000;

/// The longest time between two timed steps (a store of [`SEGMENTS`] segments): 125 ms.
const LONGEST_STEP_EVERY: u64 = ROTATION / SEGMENTS as u64;

/// When the sweep runs, and whether a catch-up after a gap is under way.
#[derive(Debug)]
pub(super) struct Pacing {
    /// When the next timed sweep step is due (see [`ROTATION`]).
    pub(super) next_step_at: AtomicU64,
    /// While a catch-up runs: the start of the gap it follows (every state older than the gap
    /// is read as of then); 0 otherwise.
    pub(super) catch_up_from: AtomicU64,
    /// The time between two timed steps: [`ROTATION`] over the segment count.
    pub(super) step_every: u64,
}

impl Pacing {
    pub(super) fn new(spread: Spread) -> Self {
        Self {
            next_step_at: AtomicU64::new(0),
            catch_up_from: AtomicU64::new(0),
            step_every: ROTATION / spread.count() as u64,
        }
    }
}

// The catch-up keeps one bit per segment, in whole words.
const _: () = assert!(SEGMENTS % 64 == 0);

/// The words of the catch-up's bits, one per segment of `spread`, all clear.
pub(super) fn caught_bits(spread: Spread) -> Box<[AtomicU64]> {
    (0..spread.count() / 64)
        .map(|_| AtomicU64::new(0))
        .collect()
}

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

    /// Sweeps one segment every [`Pacing::step_every`] while calls come in, so idle keys go away
    /// as traffic flows. The hot path only reads a shared word that changes once per step.
    #[inline]
    pub(super) fn tick(&self, now: u64) {
        // Acquire: a thread that sees a deadline moved after a gap sees the catch-up started.
        let due = self.pacing.0.next_step_at.load(Ordering::Acquire);
        // The second test restarts the pacing after the clock went back by more than the longest
        // step interval (a constant: the hot path reads no more than the deadline).
        if now >= due || due > now.saturating_add(LONGEST_STEP_EVERY) {
            self.timed_step(due, now);
        }
    }

    #[cold]
    pub(super) fn timed_step(&self, due: u64, now: u64) {
        // Every thread that sees the gap starts the catch-up before it decides; the others see
        // the deadline moved after it was started.
        let gap = due != 0 && now.saturating_sub(due) >= CATCH_UP_AFTER;
        if gap {
            self.catch_up(due, now);
        }
        let next = now.saturating_add(self.pacing.0.step_every);
        // One caller per step: the one that moves the deadline.
        if self
            .pacing
            .0
            .next_step_at
            .compare_exchange(due, next, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            // The steps due since the deadline (more than one after a pause in traffic), up to
            // one segment's worth at the cap of keys looked at: a store far below its cap (small
            // segments) still sweeps every segment within the rotation when decisions are rare.
            // One after a gap: the catch-up runs in paced steps (room-making and the decisions
            // meanwhile read the segments it has not reached as of the gap's start).
            let steps = if gap || due == 0 || now < due {
                1
            } else {
                ((now - due) / self.pacing.0.step_every + 1).min(self.spread.count() as u64)
            };
            let mut visited = 0;
            for _ in 0..steps {
                visited += self.sweep_step(now);
                if visited >= KEYS_PER_SEGMENT {
                    break;
                }
            }
        }
    }

    /// After enough inserts (one segment's share of the keys held), sweep one segment: amortised, each
    /// insert pays for about one entry examined. Told of inserts as the key count publishes them
    /// (`published` at a time), so that this shared word is not written on every insert.
    pub(super) fn after_insert(&self, published: u64, now: u64) {
        let inserts = self.inserts.fetch_add(published, Ordering::Relaxed) + published;
        let segments = self.spread.count() as u64;
        if inserts >= (self.keys.published() / segments).max(HeldCount::BATCH) {
            self.inserts.store(0, Ordering::Relaxed);
            self.sweep_step(now);
        }
    }

    pub(super) fn next_segment(&self) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % self.spread.count()
    }

    /// Drops the expired keys of the next segment of every table; returns how many keys it
    /// looked at.
    pub(super) fn sweep_step(&self, now: u64) -> usize {
        let i = self.next_segment();
        self.sweep_counting(i, now).1
    }

    /// Drops the keys of segment `i` of every table fresh at `now`; during a catch-up that has
    /// not reached the segment, their states read as of the gap's start (see
    /// [`MemoryStore::catch_up`]). Returns how many.
    pub(super) fn sweep_segment(&self, i: usize, now: u64) -> usize {
        self.sweep_counting(i, now).0
    }

    /// [`sweep_segment`](Self::sweep_segment), and how many keys it looked at.
    fn sweep_counting(&self, i: usize, now: u64) -> (usize, usize) {
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        let catching_up = from != 0 && !self.is_caught(i);
        let read_at = if catching_up { from } else { now };
        let (removed, visited) = self
            .tables()
            .map(|t| t.sweep(i, read_at, now))
            .fold((0, 0), |(r, v), (tr, tv)| (r + tr, v + tv));
        if removed > 0 {
            self.keys.remove(removed as u64);
        }
        if catching_up
            && self.mark_caught(i)
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
        (removed, visited)
    }

    /// Sweeps every segment.
    pub fn sweep_all(&self, now: u64) {
        for i in 0..self.spread.count() {
            self.sweep_segment(i, now);
        }
        // Called with any time: a key swept as fresh then must not stay cached as blocked. After
        // the removals, so that a rejection cached meanwhile is from the older generation.
        self.blocked.invalidate();
    }

    /// Whether the catch-up under way has swept segment `i` (as of the gap's start).
    pub(super) fn is_caught(&self, i: usize) -> bool {
        self.caught
            .get(i / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1u64 << (i % 64)) != 0)
    }

    /// Marks segment `i` swept by the catch-up; `true` when every segment now is. Sequentially
    /// consistent: of two threads marking the last two words, one sees both set.
    fn mark_caught(&self, i: usize) -> bool {
        let Some(word) = self.caught.get(i / 64) else {
            return false;
        };
        let bit = 1u64 << (i % 64);
        word.fetch_or(bit, Ordering::SeqCst) | bit == u64::MAX
            && self
                .caught
                .iter()
                .all(|w| w.load(Ordering::SeqCst) == u64::MAX)
    }

    /// Clears the catch-up's bits: no segment swept yet.
    pub(super) fn clear_caught(&self) {
        for word in &*self.caught {
            word.store(0, Ordering::Relaxed);
        }
    }
}
