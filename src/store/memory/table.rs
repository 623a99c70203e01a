//! A table of keys spread over segment maps ([`Spread`]: at least [`SEGMENTS`], more for a large
//! cap), and the sweeping and room-making that work on one segment at a time (a sweep never holds
//! more than one shard lock).

use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use foldhash::fast::RandomState;

use super::general::{Entry, Rules};
use super::packed::{PackedRule, USED};
use super::sketch::Sketch;

/// How many maps a table's keys are spread over at the least (a store of at most
/// `SEGMENTS * KEYS_PER_SEGMENT` keys); a larger cap spreads them over more ([`Spread`]).
pub(super) const SEGMENTS: usize = 64;
/// The keys a segment holds at most on average at the cap, up to a cap of
/// `SEGMENTS << MAX_EXTRA_BITS` segments of them (3.4 x 10^7 keys; past that, and without a cap,
/// a segment holds 1/4096 of the keys): a paced sweep step works on one segment, so this bounds
/// the work one decision does for the sweep (and the time a shard lock is held) whatever the cap.
pub(super) const KEYS_PER_SEGMENT: usize = 8_192;
/// How many times more segments than [`SEGMENTS`] a table may have, as a power of two.
const MAX_EXTRA_BITS: u32 = 6;
/// The lowest hash bit of the segment index of a store of [`SEGMENTS`] segments (6 bits from there).
const SEGMENT_BITS_FROM: u32 = 49;

/// How a store spreads its keys over the segment maps of each of its tables: `SEGMENTS << e`
/// segments for the smallest `e` (up to [`MAX_EXTRA_BITS`]) that leaves at most
/// [`KEYS_PER_SEGMENT`] keys to a segment at the cap. A key's segment is taken from bits
/// `49 - e` to 54 of its hash, which neither the maps' shard choice (the top bits, under the 7 of
/// the table's tags) nor their buckets (the low bits) use; its top 6 bits are those of a store of
/// [`SEGMENTS`] segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Spread {
    shift: u32,
    mask: usize,
}

impl Spread {
    /// The spread of a store holding at most `max_keys` keys.
    pub(super) fn for_cap(max_keys: usize) -> Self {
        let extra = (0..MAX_EXTRA_BITS)
            .find(|&e| max_keys.div_ceil(SEGMENTS << e) <= KEYS_PER_SEGMENT)
            .unwrap_or(MAX_EXTRA_BITS);
        Self {
            shift: SEGMENT_BITS_FROM - extra,
            mask: (SEGMENTS << extra) - 1,
        }
    }

    /// How many segments each table has (a multiple of 64).
    #[inline]
    pub(super) fn count(self) -> usize {
        self.mask + 1
    }

    /// The segment of a key of hash `hash`.
    #[inline]
    pub(super) fn segment_of(self, hash: u64) -> usize {
        (hash >> self.shift) as usize & self.mask
    }

    /// Shards per segment map: four in a store of [`SEGMENTS`] segments, two in one of more (it
    /// has more maps, hence more shards, already).
    fn shards(self) -> usize {
        if self.count() == SEGMENTS { 4 } else { 2 }
    }
}

/// What eviction sees of a held value at some time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Look {
    /// Its state equals a new key's: dropped without a record.
    Fresh,
    /// No room for a request of cost 1 until this time: never evicted.
    Blocked(u64),
    /// Room, at this distance from a new key's state: twice the spent share of the most spent
    /// quota (0 to 255 of 255), plus one if used since the last look (second chance). The nearest
    /// go first.
    Room(u16),
}

/// The nearness of a key with `remaining` of `limit` left, used since the last look or not.
pub(super) fn nearness(limit: u64, remaining: u64, used: bool) -> u16 {
    // Limits and bursts fit in 32 bits: `spent * 255` fits in 64.
    let spent = limit.saturating_sub(remaining).min(u64::from(u32::MAX));
    let level = (spent * 255).checked_div(limit).unwrap_or(0).min(255);
    level as u16 * 2 + u16::from(used)
}

/// The largest nearness plus one.
const LEVELS: usize = 512;

/// What eviction needs to know of a held value.
pub(super) trait Held: Send + Sync + 'static {
    /// What the value is read with (the packed rule for packed words, the rules seen for general
    /// entries).
    type Ctx: Send + Sync + 'static;
    /// Whether the state equals a new key's at `now`.
    /// Whether the state, as written by `read_at` (its time fields read relative to that time),
    /// is a new key's at `now`.
    fn is_fresh(&mut self, ctx: &Self::Ctx, read_at: u64, now: u64) -> bool;
    /// How the value looks at `now` to eviction.
    fn look(&mut self, ctx: &Self::Ctx, now: u64) -> Look;
    /// Clears the second-chance bit.
    fn clear_used(&mut self);
    /// Folds what the key (routed by `key_hash`) has spent into `sketch` before it is dropped.
    fn forget(&self, ctx: &Self::Ctx, key_hash: u64, now: u64, sketch: &Sketch);
}

impl Held for Entry {
    type Ctx = Rules;

    fn is_fresh(&mut self, _: &Rules, _: u64, now: u64) -> bool {
        // General entries keep their times whole: nothing is read relative to a time.
        Entry::is_fresh(self, now)
    }

    fn look(&mut self, rules: &Rules, now: u64) -> Look {
        Entry::look(self, rules, now)
    }

    fn clear_used(&mut self) {
        self.used = false;
    }

    fn forget(&self, rules: &Rules, key_hash: u64, now: u64, sketch: &Sketch) {
        Entry::forget(self, rules, key_hash, now, sketch);
    }
}

impl Held for AtomicU64 {
    type Ctx = PackedRule;

    fn is_fresh(&mut self, rule: &PackedRule, read_at: u64, now: u64) -> bool {
        rule.is_fresh(*self.get_mut(), read_at, now)
    }

    fn look(&mut self, rule: &PackedRule, now: u64) -> Look {
        rule.look(*self.get_mut(), now)
    }

    fn clear_used(&mut self) {
        *self.get_mut() &= !USED;
    }

    fn forget(&self, rule: &PackedRule, key_hash: u64, now: u64, sketch: &Sketch) {
        rule.forget(self.load(Ordering::Relaxed), key_hash, now, sketch);
    }
}

/// The progress of one search for room at the key cap.
#[derive(Debug)]
pub(super) struct RoomScan<'a> {
    /// Stop after freeing this many keys.
    pub(super) batch: usize,
    pub(super) freed: usize,
    /// Of the freed keys, those that still held state (not fresh).
    pub(super) evicted: u64,
    /// The soonest time a blocked key seen frees up.
    pub(super) soonest_room: u64,
    /// Entries looked at.
    pub(super) visited: usize,
    /// Where evicted keys' spent quota goes.
    pub(super) sketch: &'a Sketch,
}

/// The operations the store runs on every table, whatever its value type.
pub(super) trait Segmented: Send + Sync {
    /// Drops the keys of segment `i` fresh at `now` (their states read as of `read_at`, see
    /// [`Held::is_fresh`]), shrinking it when mostly empty; returns how many, and how many keys
    /// it looked at.
    fn sweep(&self, i: usize, read_at: u64, now: u64) -> (usize, usize);
    /// Frees up to the scan's batch in segment `i`: fresh keys, then the keys with room nearest a
    /// new key's state (the least spent, unused since the last look first). Never a blocked key.
    fn make_room(&self, i: usize, now: u64, scan: &mut RoomScan<'_>);
    /// The nearness of the nearest key with room in segment `i` (0 for a fresh key), if any.
    fn nearest(&self, i: usize, now: u64, scan: &mut RoomScan<'_>) -> Option<u16>;
    /// Frees one key of segment `i` with room at most `nearness` from a new key's state.
    fn evict_one(&self, i: usize, now: u64, nearness: u16, scan: &mut RoomScan<'_>);
}

/// The capacity a segment map keeps beyond 2.5 times its keys before a sweep shrinks it.
const SHRINK_SLACK: usize = 64;

/// The keys and the capacity of a segment map, under one read lock per shard.
fn fill<K: Hash + Eq, V>(map: &DashMap<K, V, RandomState>) -> (usize, usize) {
    map.shards().iter().fold((0, 0), |(len, capacity), shard| {
        let shard = shard.read();
        (len + shard.len(), capacity + shard.capacity())
    })
}

/// Keys of type `K` with values `V`, in the segment maps of a [`Spread`].
pub(super) struct Table<K, V: Held> {
    /// Each made by the first key it holds: a store built for a large cap (1,024 segments at the
    /// default) costs about 48 bytes per segment until it fills, not its maps' shards (a rules
    /// file has a store per limit).
    maps: Box<[OnceLock<DashMap<K, V, RandomState>>]>,
    /// Shards of each segment map.
    shards: usize,
    pub(super) ctx: V::Ctx,
    /// The store's routing hasher: an evicted key's record in the sketch is found by its hash.
    route: RandomState,
}

impl<K: Hash + Eq, V: Held> Table<K, V> {
    pub(super) fn new(ctx: V::Ctx, route: RandomState, spread: Spread) -> Self {
        // The store's routing hasher in every map: a key's hash routes it to its segment and is
        // the one its map finds it by ([`Spread::segment_of`] takes bits the maps do not use).
        let maps = (0..spread.count()).map(|_| OnceLock::new()).collect();
        Self {
            maps,
            shards: spread.shards(),
            ctx,
            route,
        }
    }

    /// Segment `i` (below the spread's [`count`](Spread::count)), made if it was not yet: to
    /// insert into.
    #[inline]
    // In bounds: segment indices are below the spread's count (hash bits masked to it), nearness levels
    // below LEVELS.
    #[allow(clippy::indexing_slicing)]
    pub(super) fn segment(&self, i: usize) -> &DashMap<K, V, RandomState> {
        self.maps[i].get_or_init(|| DashMap::with_hasher_and_shard_amount(self.route, self.shards))
    }

    /// Segment `i` if it has been made: to read or remove from (`None` holds no key).
    #[inline]
    // In bounds: as in `segment`.
    #[allow(clippy::indexing_slicing)]
    pub(super) fn held(&self, i: usize) -> Option<&DashMap<K, V, RandomState>> {
        self.maps[i].get()
    }

    /// The value of `key` of segment `i`, whose hash under the store's routing hasher is `hash`,
    /// under its shard's read lock (the lock keeps the entry in place): the map's own lookup
    /// without hashing the key again.
    #[inline]
    pub(super) fn find<R>(
        &self,
        i: usize,
        hash: u64,
        key: &K,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let map = self.held(i)?;
        let shard = map.shards().get(map.determine_shard(hash as usize))?.read();
        let size = std::mem::size_of::<(K, dashmap::SharedValue<V>)>();
        super::prefetch::probe(
            shard.data_end().as_ptr().cast(),
            shard.buckets(),
            size,
            hash,
        );
        let (_, v) = shard.get(hash, |(k, _)| k == key)?;
        Some(f(v.get()))
    }

    /// The capacity of every segment map, summed (tests).
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.maps
            .iter()
            .filter_map(OnceLock::get)
            .map(DashMap::capacity)
            .sum()
    }

    /// Drops `v` of `key` at `now`: records what it had spent first, unless fresh.
    fn drop_one(&self, key: &K, v: &V, fresh: bool, now: u64, scan: &mut RoomScan<'_>) {
        if !fresh {
            v.forget(&self.ctx, self.route.hash_one(key), now, scan.sketch);
            scan.evicted += 1;
        }
        scan.freed += 1;
    }
}

impl<K: Hash + Eq + Send + Sync + 'static, V: Held> Segmented for Table<K, V> {
    // In bounds: segment indices are below the spread's count (hash bits masked to it), nearness levels
    // below LEVELS.
    #[allow(clippy::indexing_slicing)]
    fn sweep(&self, i: usize, read_at: u64, now: u64) -> (usize, usize) {
        let Some(segment) = self.held(i) else {
            return (0, 0);
        };
        // Most segments of a store far below its cap hold nothing: no write lock, no visit.
        let (visited, capacity) = fill(segment);
        if visited == 0 && capacity <= SHRINK_SLACK {
            return (0, 0);
        }
        let mut removed = 0;
        segment.retain(|_, v| {
            let keep = !v.is_fresh(&self.ctx, read_at, now);
            removed += usize::from(!keep);
            keep
        });
        let (len, capacity) = fill(segment);
        // Past 2.5 times what its keys need, a map has either lost most of its keys or doubled
        // over tombstones: under steady churn at a cap (one eviction per insert) hashbrown grows a
        // table whose deleted slots use up its free ones instead of rehashing it in place. A map
        // that has just grown sits at about twice its keys and is left alone, with room to lose a
        // fifth of them before it is shrunk (no shrink-and-grow back and forth at the boundary).
        if capacity > 5 * len / 2 + SHRINK_SLACK {
            segment.shrink_to_fit();
        }
        (removed, visited)
    }

    // In bounds: segment indices are below the spread's count (hash bits masked to it), nearness levels
    // below LEVELS.
    #[allow(clippy::indexing_slicing)]
    fn make_room(&self, i: usize, now: u64, scan: &mut RoomScan<'_>) {
        let Some(segment) = self.held(i) else {
            return;
        };
        // First pass: how near the keys are, to find the nearness below which the batch lies.
        let mut levels = [0u32; LEVELS];
        let mut fresh = 0;
        for mut r in segment.iter_mut() {
            scan.visited += 1;
            match r.value_mut().look(&self.ctx, now) {
                Look::Fresh => fresh += 1,
                Look::Blocked(until) => scan.soonest_room = scan.soonest_room.min(until),
                Look::Room(n) => levels[usize::from(n)] += 1,
            }
        }
        let wanted = scan.batch.saturating_sub(scan.freed);
        let mut threshold = None;
        let mut count = fresh;
        for (n, &k) in levels.iter().enumerate() {
            if count >= wanted {
                break;
            }
            if k > 0 {
                count += k as usize;
                threshold = Some(n as u16);
            }
        }
        // Second pass: drop the fresh keys and the nearest, up to the batch; the second-chance bit
        // of the keys kept is cleared.
        segment.retain(|k, v| {
            if scan.freed >= scan.batch {
                return true;
            }
            match v.look(&self.ctx, now) {
                Look::Fresh => {
                    self.drop_one(k, v, true, now, scan);
                    false
                }
                Look::Room(n) if threshold.is_some_and(|t| n <= t) => {
                    self.drop_one(k, v, false, now, scan);
                    false
                }
                _ => {
                    v.clear_used();
                    true
                }
            }
        });
    }

    // In bounds: segment indices are below the spread's count (hash bits masked to it), nearness levels
    // below LEVELS.
    #[allow(clippy::indexing_slicing)]
    fn nearest(&self, i: usize, now: u64, scan: &mut RoomScan<'_>) -> Option<u16> {
        let mut nearest = None;
        let segment = self.held(i)?;
        for mut r in segment.iter_mut() {
            scan.visited += 1;
            let n = match r.value_mut().look(&self.ctx, now) {
                Look::Fresh => 0,
                Look::Blocked(until) => {
                    scan.soonest_room = scan.soonest_room.min(until);
                    continue;
                }
                Look::Room(n) => n,
            };
            nearest = Some(nearest.map_or(n, |m: u16| m.min(n)));
            if n == 0 {
                break;
            }
        }
        nearest
    }

    // In bounds: segment indices are below the spread's count (hash bits masked to it), nearness levels
    // below LEVELS.
    #[allow(clippy::indexing_slicing)]
    fn evict_one(&self, i: usize, now: u64, nearness: u16, scan: &mut RoomScan<'_>) {
        let Some(segment) = self.held(i) else {
            return;
        };
        segment.retain(|k, v| {
            if scan.freed > 0 {
                return true;
            }
            let fresh = match v.look(&self.ctx, now) {
                Look::Fresh => true,
                Look::Room(n) if n <= nearness => false,
                _ => return true,
            };
            self.drop_one(k, v, fresh, now, scan);
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `find` reuses the store's hash for the map's own lookup: it must find what the map's API
    /// inserted (a hash the maps compute otherwise would miss every key, silently: the insert path
    /// would then answer, slower).
    #[test]
    fn a_key_inserted_through_the_map_is_found_by_the_routing_hash() {
        let route = RandomState::default();
        let rule =
            crate::rule::Rule::parse(crate::strategy::Strategy::TokenBucket, "10/s").unwrap();
        let packed = PackedRule::for_rule(&rule).unwrap();
        let spread = Spread::for_cap(8_000_000);
        let table: Table<u64, AtomicU64> = Table::new(packed, route, spread);
        for key in 0..10_000u64 {
            let hash = route.hash_one(key);
            table
                .segment(spread.segment_of(hash))
                .insert(key, AtomicU64::new(key));
        }
        for key in 0..10_000u64 {
            let hash = route.hash_one(key);
            let found = table.find(spread.segment_of(hash), hash, &key, |v| {
                v.load(Ordering::Relaxed)
            });
            assert_eq!(found, Some(key));
        }
        let hash = route.hash_one(10_000u64);
        assert_eq!(
            table.find(spread.segment_of(hash), hash, &10_000, |_| ()),
            None
        );
    }
}
