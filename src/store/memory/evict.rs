//! Making room at the key cap: expired keys first, then the keys with room nearest a new key's
//! state; what they had spent goes to the sketch.

use std::hash::Hash;
use std::sync::atomic::Ordering;

use super::MemoryStore;
use super::table::{RoomScan, Segmented};

/// Segments a new key may examine to make room at the cap: bounds the work one request causes.
const SEGMENTS_PER_ROOM_CALL: usize = 2;

/// Entries the last-resort eviction of one key with room may look at (past the first segment
/// holding one): all of a small store, a bounded part of a large one.
const ENTRIES_PER_EVICTION: usize = 4096;

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K> {
    /// Makes room for one key at the cap, examining the new key's segment `home_i` of `home` and at
    /// most [`SEGMENTS_PER_ROOM_CALL`] segments in all (the cursor carries on from there next time).
    /// Returns `false` when they held no room; after two whole rotations without room (every key
    /// blocked), new keys go straight to the overflow state until the soonest blocked key frees up.
    pub(super) fn make_room(&self, home: &dyn Segmented, home_i: usize, now: u64) -> bool {
        if now < self.full_until.load(Ordering::Relaxed) {
            return false;
        }
        // Small batches, taken first from the segment the new key goes to: segments stay near
        // their share of the cap, so their tables stop growing once the cap is reached.
        let mut scan = RoomScan {
            batch: (self.max_keys / self.spread.count() / 16).clamp(1, 256),
            freed: 0,
            evicted: 0,
            soonest_room: u64::MAX,
            visited: 0,
            sketch: &self.sketch,
        };
        // Keys a catch-up drops as fresh on the way are room too (counted off by the sweep).
        let mut swept = self.catch_up_segment(home_i, now);
        home.make_room(home_i, now, &mut scan);
        for _ in 1..SEGMENTS_PER_ROOM_CALL {
            if scan.freed + swept >= scan.batch {
                break;
            }
            let i = self.next_segment();
            swept += self.catch_up_segment(i, now);
            for table in self.tables() {
                table.make_room(i, now, &mut scan);
            }
        }
        if scan.freed + swept == 0 {
            // The segments looked at held no key with room (a small cap leaves most segments
            // empty): evict the nearest key with room of the next segments of every table, from the
            // new key's, up to every segment of a small store and a bounded number of entries of a
            // large one.
            swept += self.evict_nearest(home_i, now, &mut scan);
        }
        self.keys.remove(scan.freed as u64);
        self.evictions.add(scan.evicted);
        if scan.freed + swept > 0 {
            self.fruitless.store(0, Ordering::Relaxed);
            return true;
        }
        // Two rotations: the first clears second-chance bits that the second honours.
        self.soonest_room
            .fetch_min(scan.soonest_room, Ordering::Relaxed);
        let scanned = self
            .fruitless
            .fetch_add(SEGMENTS_PER_ROOM_CALL, Ordering::Relaxed);
        if scanned + SEGMENTS_PER_ROOM_CALL >= 2 * self.spread.count() {
            self.fruitless.store(0, Ordering::Relaxed);
            // No blocked key seen: the keys had room but sat elsewhere; look again after a step
            // rather than never.
            let until = match self.soonest_room.swap(u64::MAX, Ordering::Relaxed) {
                u64::MAX => now.saturating_add(self.pacing.0.step_every),
                until => until,
            };
            self.full_until.store(until, Ordering::Relaxed);
        }
        false
    }

    /// Evicts the key with room nearest a new key's state among the segments from `home_i` on,
    /// until [`ENTRIES_PER_EVICTION`] entries were looked at (or every segment).
    /// Returns how many keys a catch-up dropped on the way instead (then it evicts none).
    pub(super) fn evict_nearest(&self, home_i: usize, now: u64, scan: &mut RoomScan<'_>) -> usize {
        let mut best: Option<(u16, usize, usize)> = None;
        let mut i = home_i;
        let segments = self.spread.count();
        for _ in 0..segments {
            let swept = self.catch_up_segment(i, now);
            if swept > 0 {
                return swept;
            }
            for (t, table) in self.tables().enumerate() {
                if let Some(n) = table.nearest(i, now, scan) {
                    if best.is_none_or(|(b, _, _)| n < b) {
                        best = Some((n, t, i));
                    }
                }
            }
            if best.is_some_and(|(n, _, _)| n == 0) || scan.visited >= ENTRIES_PER_EVICTION {
                break;
            }
            i = (i + 1) % segments;
        }
        if let Some((n, t, i)) = best {
            if let Some(table) = self.tables().nth(t) {
                table.evict_one(i, now, n, scan);
            }
        }
        0
    }
}
