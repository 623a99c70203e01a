//! The catch-up after a gap between decisions: states written before the gap are read as of its
//! start until every segment has been swept so.

use std::hash::Hash;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::MemoryStore;
use super::packed::{self, PackedRule};

/// A gap between decisions after which the first one sweeps every segment first
/// ([`MemoryStore::catch_up`]): 1/16 of the shortest ring, well before any ring time aliases.
pub(super) const CATCH_UP_AFTER: u64 = packed::RING_SPAN / 16;

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K> {
    /// After no decision for [`CATCH_UP_AFTER`] or more (an idle store, a suspended process, a
    /// clock jump forward), every state was written before `due`: read as of `now`, a packed time
    /// on a ring (a first-hit start, a large window index) older than 7/8 of its ring would look
    /// ahead of `now`, and its key stay blocked for hours. So, until every segment has been swept
    /// with its states read as of `due` (by the paced steps, one segment each, or by room-making
    /// and full sweeps, which reach a segment first), a decision on a ring table first drops its
    /// key's state if it is fresh read as of then ([`MemoryStore::caught_up`]). No decision waits
    /// for more than its own key and the paced step it would run anyway.
    #[cold]
    pub(super) fn catch_up(&self, due: u64, now: u64) {
        // Only the packed tables that keep a time on a ring can misread one (whole times, buckets
        // and general entries cannot).
        let rings = self
            .packed
            .iter()
            .filter_map(OnceLock::get)
            .any(|t| t.ctx.keeps_a_ring());
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        if !rings || from == due {
            return;
        }
        if from != 0 {
            // Another gap before the last catch-up reached every segment (traffic resumed, then
            // stopped for hours again within a rotation): its segments are swept now, as of its
            // own start (rare; the pause of the sweep before this change).
            for i in 0..self.spread.count() {
                self.sweep_segment(i, now);
            }
        }
        self.clear_caught();
        self.pacing.0.catch_up_from.store(due, Ordering::Release);
    }

    /// During a catch-up that has not reached segment `i`: drops the state in `cell` (a new
    /// key's) if it is fresh read as of the gap's start, as the catch-up's sweep would.
    #[inline]
    pub(super) fn caught_up(&self, rule: &PackedRule, i: usize, cell: &AtomicU64, now: u64) {
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        if from != 0 {
            self.catch_up_key(from, rule, i, cell, now);
        }
    }

    #[cold]
    pub(super) fn catch_up_key(
        &self,
        from: u64,
        rule: &PackedRule,
        i: usize,
        cell: &AtomicU64,
        now: u64,
    ) {
        if !rule.keeps_a_ring() || self.is_caught(i) {
            return;
        }
        let word = cell.load(Ordering::Relaxed);
        if word != 0 && rule.is_fresh(word, from, now) {
            // Lost to a decision that wrote the word since: that state is a recent one.
            let _ = cell.compare_exchange(word, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Sweeps segment `i` first if a catch-up has not reached it: room-making must not read a
    /// state from before the gap as of now. Returns how many keys that dropped (room made).
    pub(super) fn catch_up_segment(&self, i: usize, now: u64) -> usize {
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        if from != 0 && !self.is_caught(i) {
            self.sweep_segment(i, now)
        } else {
            0
        }
    }
}
