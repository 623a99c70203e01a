//! A table of keys spread over [`SEGMENTS`] maps, and the sweeping and room-making that work on one
//! segment at a time (a sweep never holds more than one shard lock).

use std::hash::Hash;
use std::sync::atomic::AtomicU64;

use dashmap::DashMap;
use foldhash::fast::RandomState;

use super::general::Entry;
use super::packed::{PackedRule, USED};

/// How many maps a table's keys are spread over (the unit of incremental sweeping).
pub(super) const SEGMENTS: usize = 64;
/// Shards per segment map.
const SHARDS_PER_SEGMENT: usize = 4;

/// What eviction needs to know of a held value.
pub(super) trait Held: Send + Sync + 'static {
    /// What the value is read with (the packed rule for packed words).
    type Ctx: Send + Sync + 'static;
    /// Whether the state equals a new key's at `now`.
    fn is_fresh(&mut self, ctx: &Self::Ctx, now: u64) -> bool;
    /// Until when the key has no room for a request of cost 1 (at most `now`: it has room).
    fn blocked_until(&mut self, ctx: &Self::Ctx, now: u64) -> u64;
    /// Clears the second-chance bit; returns whether it was set.
    fn take_used(&mut self) -> bool;
}

impl Held for Entry {
    type Ctx = ();

    fn is_fresh(&mut self, (): &(), now: u64) -> bool {
        Entry::is_fresh(self, now)
    }

    fn blocked_until(&mut self, (): &(), _now: u64) -> u64 {
        Entry::blocked_until(self)
    }

    fn take_used(&mut self) -> bool {
        std::mem::take(&mut self.used)
    }
}

impl Held for AtomicU64 {
    type Ctx = PackedRule;

    fn is_fresh(&mut self, rule: &PackedRule, now: u64) -> bool {
        rule.is_fresh(*self.get_mut(), now)
    }

    fn blocked_until(&mut self, rule: &PackedRule, now: u64) -> u64 {
        rule.blocked_until(*self.get_mut(), now)
    }

    fn take_used(&mut self) -> bool {
        let word = self.get_mut();
        let used = *word & USED != 0;
        *word &= !USED;
        used
    }
}

/// The progress of one search for room at the key cap.
#[derive(Debug)]
pub(super) struct RoomScan {
    /// Stop after freeing this many keys.
    pub(super) batch: usize,
    pub(super) freed: usize,
    /// Of the freed keys, those that still held state (not fresh).
    pub(super) evicted: u64,
    /// The soonest time a blocked key seen frees up.
    pub(super) soonest_room: u64,
}

/// The operations the store runs on every table, whatever its value type.
pub(super) trait Segmented: Send + Sync {
    /// Drops the fresh keys of segment `i`, shrinking it when mostly empty; returns how many.
    fn sweep(&self, i: usize, now: u64) -> usize;
    /// Frees up to the scan's batch in segment `i`: fresh keys, then keys with room not used since
    /// the last look (second chance). Never a blocked key.
    fn make_room(&self, i: usize, now: u64, scan: &mut RoomScan);
    /// Frees one key with room in segment `i`, used or not.
    fn evict_one(&self, i: usize, now: u64, scan: &mut RoomScan);
}

/// Keys of type `K` with values `V`, in [`SEGMENTS`] maps.
pub(super) struct Table<K, V: Held> {
    maps: Box<[DashMap<K, V, RandomState>]>,
    pub(super) ctx: V::Ctx,
}

impl<K: Hash + Eq, V: Held> Table<K, V> {
    pub(super) fn new(ctx: V::Ctx) -> Self {
        let maps = (0..SEGMENTS)
            .map(|_| {
                DashMap::with_hasher_and_shard_amount(RandomState::default(), SHARDS_PER_SEGMENT)
            })
            .collect();
        Self { maps, ctx }
    }

    /// Segment `i` (below [`SEGMENTS`]).
    #[inline]
    pub(super) fn segment(&self, i: usize) -> &DashMap<K, V, RandomState> {
        &self.maps[i]
    }

    /// The capacity of every segment map, summed (tests).
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.maps.iter().map(DashMap::capacity).sum()
    }
}

impl<K: Hash + Eq + Send + Sync + 'static, V: Held> Segmented for Table<K, V> {
    fn sweep(&self, i: usize, now: u64) -> usize {
        let segment = &self.maps[i];
        let mut removed = 0;
        segment.retain(|_, v| {
            let keep = !v.is_fresh(&self.ctx, now);
            removed += usize::from(!keep);
            keep
        });
        // Past 2.5 times what its keys need, a map has either lost most of its keys or doubled
        // over tombstones: under steady churn at a cap (one eviction per insert) hashbrown grows a
        // table whose deleted slots use up its free ones instead of rehashing it in place. A map
        // that has just grown sits at about twice its keys and is left alone, with room to lose a
        // fifth of them before it is shrunk (no shrink-and-grow back and forth at the boundary).
        if segment.capacity() > 5 * segment.len() / 2 + 64 {
            segment.shrink_to_fit();
        }
        removed
    }

    fn make_room(&self, i: usize, now: u64, scan: &mut RoomScan) {
        self.maps[i].retain(|_, v| {
            if scan.freed >= scan.batch {
                return true;
            }
            let drop = if v.is_fresh(&self.ctx, now) {
                true
            } else {
                let blocked_until = v.blocked_until(&self.ctx, now);
                if blocked_until > now {
                    scan.soonest_room = scan.soonest_room.min(blocked_until);
                    false
                } else if v.take_used() {
                    false
                } else {
                    scan.evicted += 1;
                    true
                }
            };
            scan.freed += usize::from(drop);
            !drop
        });
    }

    fn evict_one(&self, i: usize, now: u64, scan: &mut RoomScan) {
        self.maps[i].retain(|_, v| {
            if scan.freed > 0 {
                return true;
            }
            let blocked_until = v.blocked_until(&self.ctx, now);
            if blocked_until > now {
                scan.soonest_room = scan.soonest_room.min(blocked_until);
                return true;
            }
            scan.evicted += u64::from(!v.is_fresh(&self.ctx, now));
            scan.freed += 1;
            false
        });
    }
}
