//! The embedded store: per-key state in [`DashMap`]s, evicted automatically.
//!
//! Keys are spread over segment maps per table ([`Spread`](table::Spread): at least
//! [`SEGMENTS`](table::SEGMENTS), more for a large cap, so that a segment holds at most about
//! [`KEYS_PER_SEGMENT`](table::KEYS_PER_SEGMENT) keys at the cap) so that eviction can work one
//! segment at a time: a sweep never holds more than one shard lock, a concurrent check waits at
//! most for one shard's scan, and a decision runs the paced sweep steps due since the last one, up to
//! about [`KEYS_PER_SEGMENT`](table::KEYS_PER_SEGMENT) keys. A one-quota rule of the fixed window, sliding window counter or buckets gets a table
//! of packed 8-byte states updated by compare-and-swap ([`packed`]); other rules keep general
//! entries ([`general`]).

mod blocked;
mod builder;
mod catch_up;
mod evict;
mod general;
mod identity;
mod many;
#[cfg(any(tollgate_loom, shuttle))]
mod model;
mod packed;
mod prefetch;
mod sketch;
mod sweep;
mod table;

use std::future::Ready;
use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use dashmap::mapref::one::RefMut;
use foldhash::fast::RandomState;
use parking_lot::Mutex;

use self::blocked::BlockedCache;
pub use self::builder::MemoryStoreBuilder;
use self::catch_up::CATCH_UP_AFTER;
use self::general::{Entry, Rules};
use self::packed::{NOW_LIMIT, PackedRule};
pub(crate) use self::sketch::MAX_SKETCH_BYTES;
use self::sketch::Sketch;
use self::sweep::{Pacing, caught_bits};
use self::table::{Held, Segmented, Spread, Table};
use super::{Answer, LimiterNames, Scope, Store};
use crate::decision::{Decision, Outcome, to_decision};
use crate::error::StoreError;
use crate::rule::Rule;
use crate::stats::{CacheLine, Counter, HeldCount, Stats};
use crate::strategy::{Op, Verdict};

/// How many distinct packable rules get a packed table; keys of further rules use general entries.
const PACKED_RULES: usize = 4;
/// From this cap on, the key count is gathered per thread ([`HeldCount`]): the cap may then be
/// overshot by up to 63 keys per inserting thread (under 0.1 % of it for 15 threads).
const GATHERED_COUNT_FROM: usize = 1 << 20;
/// The key cap of a store built without one ([`MemoryStoreBuilder::DEFAULT_MAX_KEYS`]).
pub(crate) const DEFAULT_MAX_KEYS: usize = 8_000_000;
/// What a hit on a retired table's cell answers in place of a verdict (never used as one: the
/// general entry decides).
const RETIRED: Verdict = Verdict {
    outcome: Outcome::Rejected,
    // No quota has this limit (limits are `u32`).
    limit: u64::MAX,
    remaining: 0,
    reset_after: 0,
    retry_after: 0,
};
/// How often the overflow warning may repeat.
const OVERFLOW_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Which packed table of its store a limiter's own rule uses: 0 before the first call, `t + 1` for
/// table `t`, [`TableHint::GENERAL`] for none (general entries).
#[derive(Debug, Default)]
pub(crate) struct TableHint(AtomicU8);

impl TableHint {
    const GENERAL: u8 = u8::MAX;
}

// `t + 1` for every packed table stays below the general marker.
const _: () = assert!(PACKED_RULES < TableHint::GENERAL as usize);

/// An in-process store on [`DashMap`](dashmap::DashMap), the default.
///
/// - Safe under many threads on one key: each key's state is updated atomically (a compare-and-swap
///   of its packed 8-byte state, or under its shard's write lock for general entries), so updates
///   are never lost and quotas never over-admit.
/// - Compact: under a one-quota rule of the clock-aligned fixed window, the sliding window counter or
///   the buckets, a key costs its own size plus 8 bytes in the map (as governor's keyed store).
/// - Keys whose state has become equivalent to a new key's are removed automatically and
///   incrementally, as traffic flows (no call from the user, no long pause), and the maps shrink.
///   [`RateLimiter::sweep`](crate::RateLimiter::sweep) forces a full pass.
/// - A cap on the number of keys bounds memory: [`MemoryStoreBuilder::DEFAULT_MAX_KEYS`] (8 x 10^6) unless changed with
///   [`MemoryStoreBuilder::max_keys`] (`usize::MAX` lifts it). When it is reached, room is made by
///   dropping expired keys, then the keys with room nearest a new key's state (the least spent
///   first; among equals, those unused since the last look). What an evicted key had spent is kept
///   in a bounded table (at most [`MemoryStoreBuilder::MAX_SKETCH_BYTES`], see [`MemoryStore::sketch_bytes`]) under a
///   fingerprint of the key, and a returning key starts at least as spent as its own record: a
///   flood of keys less spent than a key never gives it back quota it spent, and a key is never
///   charged what other keys spent (a fingerprint collision aside, under 2 x 10^-9 a lookup), so
///   floods of new keys cannot lock new keys out. A key that is currently blocked is never evicted. When every held key is blocked,
///   new keys share one overflow state with the same quotas (counted in
///   [`Stats::overflow_hits`], warned about at most every 10 s).
///
/// A key's state is identified by the limiter's name and the key: under another rule of that name
/// (a tier change, a reload, a quota changed in code) it is converted on access under the key's lock
/// (see [the guide](crate::guide::changing_limits)). A name of one rule keeps its keys in a packed
/// table when the rule packs; once a name is seen with a second rule, its packed tables take no new
/// key, and a key still held there moves to a general entry with its state when another rule of
/// its name reaches it (decisions under the recorded rule stay on the packed path: no extra lookup).
/// A key held by several limiters counts once per limiter against the cap.
/// Concurrent inserts may overshoot the cap by at most the number of inserting threads (with a cap
/// of 2^20 keys or more, by at most 64 keys per inserting thread: the count is gathered per thread).
pub struct MemoryStore<K> {
    general: Table<K, Entry>,
    /// What eviction forgot: evicted keys' spent quota (see [`sketch`]).
    sketch: Sketch,
    packed: [OnceLock<Table<K, AtomicU64>>; PACKED_RULES],
    /// The tag of the last rule found not packable with every packed slot taken or unfit: its
    /// calls skip the search (see [`MemoryStore::packed_table`]).
    unpackable: AtomicU64,
    /// Set once a key moved from a packed table to a general entry at [`NOW_LIMIT`]: from then
    /// on a key missing from its packed table is looked for among the general entries (the clock
    /// may step back below that instant).
    handed: AtomicBool,
    /// Keys of packed tables known to be blocked (see [`blocked`]).
    blocked: BlockedCache,
    route: RandomState,
    /// How keys are spread over segments (the same in every table).
    spread: Spread,
    max_keys: usize,
    /// Keys held: an insert writes its thread's stripe, not a line the other threads read.
    keys: HeldCount,
    cursor: AtomicUsize,
    /// Inserts published by `keys` since the last sweep step they paced.
    inserts: AtomicU64,
    /// Read by every decision, so alone on its line (the counters beside it are written by
    /// inserts and sweeps).
    pacing: CacheLine<Pacing>,
    /// During a catch-up ([`MemoryStore::catch_up`]): bit `i % 64` of word `i / 64` set once
    /// segment `i` was swept.
    caught: Box<[AtomicU64]>,
    full_until: AtomicU64,
    /// Segments examined at the cap since room was last found, and the soonest time a blocked key
    /// among them frees up: after two rotations without room, `full_until` takes that time.
    fruitless: AtomicUsize,
    soonest_room: AtomicU64,
    overflow: Mutex<Entry>,
    overflow_warn: crate::throttle::Throttle,
    allowed: Counter,
    rejected: Counter,
    evictions: Counter,
    overflow_hits: Counter,
    /// Settled units a full moving-window log could not hold.
    settle_dropped: Counter,
    names: LimiterNames,
    /// Lock stripes of multi-limit decisions (see [`many`]).
    stripes: many::Stripes,
}

impl<K> std::fmt::Debug for MemoryStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.keys.get())
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Default for MemoryStore<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether `op` would create state for an unknown key: a check that consumes, or a settlement
/// that charges more than was reserved (the key's state may have been swept as fresh since).
fn creates_state(op: Op) -> bool {
    match op {
        Op::Check(c) => c > 0,
        Op::Settle {
            reserved, actual, ..
        } => actual > reserved,
        _ => false,
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K> {
    /// A store with the default cap on the number of keys, [`MemoryStoreBuilder::DEFAULT_MAX_KEYS`].
    pub fn new() -> Self {
        Self::with_cap(DEFAULT_MAX_KEYS)
    }

    /// Options: a cap on the number of keys.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    pub(super) fn with_cap(max_keys: usize) -> Self {
        let route = RandomState::default();
        let names = LimiterNames::default();
        let spread = Spread::for_cap(max_keys);
        Self {
            general: Table::new(Rules::new(names.clone()), route, spread),
            sketch: Sketch::new(max_keys),
            packed: std::array::from_fn(|_| OnceLock::new()),
            unpackable: AtomicU64::new(0),
            handed: AtomicBool::new(false),
            blocked: BlockedCache::default(),
            route,
            spread,
            max_keys,
            // Gathered per thread only where the cap is large enough for that to be noise: a
            // store with a small cap keeps an exact count (and its overshoot bound) at every moment.
            keys: HeldCount::new(if max_keys >= GATHERED_COUNT_FROM {
                HeldCount::BATCH
            } else {
                1
            }),
            cursor: AtomicUsize::new(0),
            inserts: AtomicU64::new(0),
            pacing: CacheLine(Pacing::new(spread)),
            caught: caught_bits(spread),
            full_until: AtomicU64::new(0),
            fruitless: AtomicUsize::new(0),
            soonest_room: AtomicU64::new(u64::MAX),
            overflow: Mutex::new(Entry::new()),
            overflow_warn: crate::throttle::Throttle::default(),
            allowed: Counter::default(),
            rejected: Counter::default(),
            evictions: Counter::default(),
            overflow_hits: Counter::default(),
            settle_dropped: Counter::default(),
            names,
            stripes: many::Stripes::default(),
        }
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        usize::try_from(self.keys.get()).unwrap_or(usize::MAX)
    }

    /// `true` when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cap on the number of keys, if any (`None`: lifted with `max_keys(usize::MAX)`).
    pub fn max_keys(&self) -> Option<usize> {
        (self.max_keys != usize::MAX).then_some(self.max_keys)
    }

    /// Applies `op` to `key` under `rule` (unscoped: the rule's own tag), at `now` in nanoseconds.
    /// Test hook (feature `test-util`): for the crate's tests and oracles, not part of the API.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn decide(&self, key: &K, rule: &Rule, op: Op, now: u64) -> Decision {
        self.decide_in(key, rule, rule.tag(), op, now)
    }

    /// Applies `op` to `key` under `rule` in the scope of tag `tag`, now; the memory store never
    /// fails.
    #[inline]
    pub(crate) fn decide_in(&self, key: &K, rule: &Rule, tag: u64, op: Op, now: u64) -> Decision {
        let table = if now < NOW_LIMIT {
            self.packed_table(rule, tag)
        } else {
            None
        };
        self.decide_on(table, key, rule, tag, op, now)
    }

    /// [`decide_in`](Self::decide_in) for a limiter's own rule, whose packed table (or none) is
    /// remembered in `hint` after the first call: later calls skip matching the rule to a table.
    /// A table once claimed keeps its rule for the store's life, and a rule without one never
    /// gets one, so the hint never goes stale.
    #[inline]
    pub(crate) fn decide_hinted(
        &self,
        hint: &TableHint,
        key: &K,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> Decision {
        if now >= NOW_LIMIT {
            return self.decide_on(None, key, rule, tag, op, now);
        }
        let t = hint.0.load(Ordering::Relaxed);
        let slot = usize::from(t).wrapping_sub(1);
        let table = match self.packed.get(slot).and_then(OnceLock::get) {
            Some(table) => Some((slot, table)),
            None if t == TableHint::GENERAL => None,
            None => self.learn(hint, rule, tag),
        };
        self.decide_on(table, key, rule, tag, op, now)
    }

    /// Finds the packed table of `rule` (or none) and remembers it in `hint`.
    #[cold]
    fn learn(
        &self,
        hint: &TableHint,
        rule: &Rule,
        tag: u64,
    ) -> Option<(usize, &Table<K, AtomicU64>)> {
        let found = self.packed_table(rule, tag);
        let t = found.map_or(TableHint::GENERAL, |(t, _)| (t + 1) as u8);
        hint.0.store(t, Ordering::Relaxed);
        found
    }

    /// Decides on the packed table `table` (claimed for `rule` and `tag`), or on general entries.
    #[inline(always)]
    fn decide_on(
        &self,
        table: Option<(usize, &Table<K, AtomicU64>)>,
        key: &K,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> Decision {
        self.tick(now);
        let hash = self.route.hash_one(key);
        if let Some((t, table)) = table {
            // The key's fingerprint in the blocked cache: its hash, told apart per table.
            let fingerprint = hash ^ ((t as u64) << 58);
            return self.decide_packed(t, table, hash, fingerprint, key, rule, tag, op, now);
        }
        self.decide_general(hash, key, rule, tag, op, now)
    }

    /// The packed table of `rule`, claiming a free one for a packable rule seen for the first time.
    #[inline]
    fn packed_table(&self, rule: &Rule, tag: u64) -> Option<(usize, &Table<K, AtomicU64>)> {
        if tag == self.unpackable.load(Ordering::Relaxed) {
            return None;
        }
        for (t, slot) in self.packed.iter().enumerate() {
            let table = match slot.get() {
                Some(table) => table,
                None => match self.claim(t, slot, rule, tag) {
                    Some(table) => table,
                    None => break,
                },
            };
            if table.ctx.matches(rule, tag) {
                return Some((t, table));
            }
        }
        self.unpackable.store(tag, Ordering::Relaxed);
        None
    }

    #[cold]
    fn claim<'a>(
        &self,
        t: usize,
        slot: &'a OnceLock<Table<K, AtomicU64>>,
        rule: &Rule,
        tag: u64,
    ) -> Option<&'a Table<K, AtomicU64>> {
        let packed = PackedRule::for_rule(rule)?.scoped(tag);
        // Another rule may win the race for this slot: the caller then looks at the next one.
        // Registered before the table is seen by any decision: a name's second rule retires it
        // before a key can be inserted there.
        Some(slot.get_or_init(|| {
            self.general.ctx.register_table(t, rule, tag);
            Table::new(packed, self.route, self.spread)
        }))
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn decide_packed(
        &self,
        t: usize,
        table: &Table<K, AtomicU64>,
        hash: u64,
        fingerprint: u64,
        key: &K,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> Decision {
        let packed = &table.ctx;
        // A request of cost 1 (the layer's) from a key known to be blocked: answered here.
        let miss = match op {
            Op::Check(1) => match self
                .blocked
                .lookup(fingerprint, now, || packed.reported_limit())
            {
                Ok(v) => return self.finish(0, v, 0, now, op),
                Err(miss) => Some(miss),
            },
            _ => None,
        };
        // A reset forgets the key's record too: held or not, its next request is a new key's.
        if matches!(op, Op::Reset) {
            packed.clear_record(&self.sketch, hash, now);
        }
        // After the blocked cache: a rejection from there does not need it.
        let i = self.spread.segment_of(hash);
        // The read lock only keeps the entry in place; the state changes by compare-and-swap.
        // Retirement is read under that lock: `adopt` takes a key out of a retired table under
        // the write lock, so a state applied here is either taken with it or never applied (a
        // cell left in a retired table, by an insert that saw the retirement too late, is never
        // counted on).
        let found = table.find(i, hash, key, |cell| {
            if self.general.ctx.is_retired(t) {
                return RETIRED;
            }
            self.caught_up(packed, i, cell, now);
            let v = packed.apply(cell, op, now);
            match (miss, v.outcome) {
                // Cached only when `now` is not clamped to the state's time (the clock went back):
                // the cache answers with times relative to `now`.
                (Some(miss), Outcome::Rejected)
                    if packed.time_floor(cell.load(Ordering::Relaxed), now) <= now =>
                {
                    self.blocked.insert(fingerprint, miss, now, &v);
                }
                // A refund or a reset may give room back before a cached rejection's time.
                (None, _) if !matches!(op, Op::Check(_) | Op::Peek) => self.blocked.invalidate(),
                _ => {}
            }
            v
        });
        if let Some(v) = found {
            if v.limit == RETIRED.limit {
                return self.decide_moved(hash, key, rule, tag, op, now);
            }
            return self.finish(0, v, 0, now, op);
        }
        // A key handed to a general entry at NOW_LIMIT, asked again after the clock stepped back:
        // its general entry answers (a fresh packed state would forget what it spent).
        if self.handed.load(Ordering::Relaxed) && self.general_holds(i, key, tag) {
            return self.decide_general(hash, key, rule, tag, op, now);
        }
        // Not held here, and the table retired (its name was seen with several rules): the key's
        // state, if any, is in a general entry or still in another retired table; a hit above
        // needs no such check, since a key is taken out of a retired table before any other
        // decision of its name uses its state (see `adopt`).
        if self.general.ctx.is_retired(t) {
            return self.decide_moved(hash, key, rule, tag, op, now);
        }
        if !creates_state(op) {
            // Peeking at or refunding a key that is not held changes nothing: answered from what
            // its record says it spent (an evicted key is not new to a peek: a rules-file reload
            // converts what a peek reports), or as a new key's.
            let start = match op {
                Op::Reset => 0,
                _ => packed.recall(&self.sketch, hash, now),
            };
            let v = table.ctx.apply(&AtomicU64::new(start), op, now);
            return self.finish(0, v, 0, now, op);
        }
        let new = || AtomicU64::new(packed.recall(&self.sketch, hash, now));
        let Some((cell, published)) = self.insert(table, i, key, new, now) else {
            return self.run_overflow(rule, tag, op, now);
        };
        // Retired since the check above: the general entry decides (and takes this cell, which
        // holds nothing spent by this call). Read under the cell's lock, which `adopt` takes after
        // the table was retired: a key is never held in a retired table and elsewhere at once.
        if self.general.ctx.is_retired(t) {
            drop(cell);
            return self.decide_moved(hash, key, rule, tag, op, now);
        }
        let v = table.ctx.apply(&*cell, op, now);
        drop(cell);
        if published > 0 {
            self.after_insert(published, now);
        }
        self.finish(0, v, 0, now, op)
    }

    /// [`decide_general`](Self::decide_general) for a key of a name seen with several rules,
    /// kept out of the packed path's code.
    #[cold]
    #[inline(never)]
    fn decide_moved(
        &self,
        hash: u64,
        key: &K,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> Decision {
        self.decide_general(hash, key, rule, tag, op, now)
    }

    fn decide_general(
        &self,
        hash: u64,
        key: &K,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> Decision {
        let i = self.spread.segment_of(hash);
        let segment = self.general.segment(i);
        if matches!(op, Op::Reset) {
            self.forget_everywhere(i, key, hash, rule, tag, now);
        }
        if let Some(mut entry) = segment.get_mut(key) {
            if !entry.first_is(tag) {
                self.reconcile(&mut entry, i, key, hash, rule, tag, now);
            }
            return self.run(&mut entry, rule, tag, op, now);
        }
        if !creates_state(op) {
            // From NOW_LIMIT on, a key may still be held in its packed table: answered from there.
            let mut entry = match (now >= NOW_LIMIT)
                .then(|| self.packed_state(i, key, rule, tag, now, false))
                .flatten()
            {
                Some(state) => Entry::with_states(&self.general.ctx, rule, tag, vec![state], now),
                // A key that is not held: what its record says it spent (see decide_packed), or
                // its state under the name's other rules.
                None if !matches!(op, Op::Reset) => {
                    match self.adopt(i, key, hash, rule, tag, now, false) {
                        Some(old) if !old.is_empty() => {
                            Entry::converted(&self.general.ctx, rule, tag, &old, now)
                        }
                        _ => Entry::recalled(&self.general.ctx, &self.sketch, hash, rule, tag, now),
                    }
                }
                None => Entry::new(),
            };
            let (index, v, dropped) = entry.run(rule, tag, op, now);
            return self.finish(index, v, dropped, now, op);
        }
        // From NOW_LIMIT on, a packable rule's keys live in general entries: a key still held in
        // its packed table moves over with its state (no fresh start across that instant).
        let handed = (now >= NOW_LIMIT)
            .then(|| self.packed_state(i, key, rule, tag, now, true))
            .flatten();
        // Run under the new entry's lock: a state taken from a retired packed table moves once.
        let new = || match handed {
            Some(state) => Entry::with_states(&self.general.ctx, rule, tag, vec![state], now),
            None => match self.adopt(i, key, hash, rule, tag, now, true) {
                Some(old) if !old.is_empty() => {
                    Entry::converted(&self.general.ctx, rule, tag, &old, now)
                }
                _ => Entry::recalled(&self.general.ctx, &self.sketch, hash, rule, tag, now),
            },
        };
        let Some((mut entry, published)) = self.insert(&self.general, i, key, new, now) else {
            return self.run_overflow(rule, tag, op, now);
        };
        // Inserted meanwhile by a decision of another scope (another rule of the name, or
        // another limiter): found, converted or recalled as for an entry found at once.
        if !entry.first_is(tag) {
            self.reconcile(&mut entry, i, key, hash, rule, tag, now);
        }
        let decision = self.run(&mut entry, rule, tag, op, now);
        drop(entry);
        if published > 0 {
            self.after_insert(published, now);
        }
        decision
    }

    /// The entry of a key not found a moment ago, inserted if still missing (and how many inserts
    /// that published to the key count: see [`HeldCount::add_one`]), or `None` at the cap when no
    /// room could be made.
    fn insert<'a, V: Held>(
        &self,
        table: &'a Table<K, V>,
        i: usize,
        key: &K,
        new: impl FnOnce() -> V,
        now: u64,
    ) -> Option<(RefMut<'a, K, V>, u64)>
    where
        Table<K, V>: Segmented,
    {
        if self.keys.at_least(self.max_keys as u64) && !self.make_room(table, i, now) {
            return None;
        }
        let mut published = 0;
        let entry = table.segment(i).entry(key.clone()).or_insert_with(|| {
            // Counted under the shard lock: a sweep cannot remove it (and decrement) first.
            published = self.keys.add_one();
            new()
        });
        Some((entry, published))
    }

    #[inline]
    fn run(&self, entry: &mut Entry, rule: &Rule, tag: u64, op: Op, now: u64) -> Decision {
        let (index, v, dropped) = entry.run(rule, tag, op, now);
        self.finish(index, v, dropped, now, op)
    }

    fn run_overflow(&self, rule: &Rule, tag: u64, op: Op, now: u64) -> Decision {
        self.overflow_hits.add(1);
        if self.overflow_warn.ready(OVERFLOW_WARN_EVERY) {
            tracing::warn!(
                max_keys = self.max_keys,
                overflow_hits = self.overflow_hits.get(),
                "rate-limit memory store is full of blocked keys; new keys share one overflow quota"
            );
        }
        let mut overflow = self.overflow.lock();
        if !overflow.first_is(tag) {
            overflow.convert_to(&self.general.ctx, rule, tag, now);
        }
        let (index, v, dropped) = overflow.run(rule, tag, op, now);
        drop(overflow);
        self.finish(index, v, dropped, now, op)
    }

    /// The decision of verdict `v` (of quota `index`), counted; `dropped`: the settled units a
    /// full moving-window log could not hold.
    #[inline]
    fn finish(&self, index: usize, v: Verdict, dropped: u64, now: u64, op: Op) -> Decision {
        let mut d = to_decision(index, v, now, 1);
        if let Op::Check(cost) = op {
            if v.outcome == Outcome::Allowed {
                self.allowed.add(1);
                // An admitted check's cost is its reservation.
                d.cost = cost;
            } else {
                self.rejected.add(1);
            }
        } else if dropped > 0 {
            self.settle_dropped.add(dropped);
        }
        d
    }

    /// Bytes taken by the record of evicted keys' spent quota (0 until a key with spent quota was
    /// evicted; at most [`MemoryStoreBuilder::MAX_SKETCH_BYTES`]).
    pub fn sketch_bytes(&self) -> usize {
        self.sketch.bytes()
    }

    fn counters(&self) -> Stats {
        Stats {
            allowed: self.allowed.get(),
            rejected: self.rejected.get(),
            evictions: self.evictions.get(),
            overflow_hits: self.overflow_hits.get(),
            settle_dropped_units: self.settle_dropped.get(),
            keys: self.len() as u64,
            ..Stats::default()
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Store<K> for MemoryStore<K> {
    /// Never used: the memory store answers at once.
    type Future = Ready<Result<Decision, StoreError>>;

    #[inline]
    fn apply(&self, key: &K, scope: Scope<'_>, op: Op, now: u64) -> Answer<Self::Future> {
        Answer::now(Ok(self.decide_in(key, scope.rule(), scope.tag(), op, now)))
    }

    /// At once, under lock stripes taken in one fixed order (no global lock): no reservation
    /// later rolled back is ever seen by another decision, so there is no false rejection.
    fn apply_all<'a>(
        &'a self,
        items: &'a [super::Item<'a, K, Self>],
        now: u64,
    ) -> super::AllAnswer<'a> {
        super::AllAnswer::now(many::apply_all(items, now))
    }

    fn names(&self) -> &LimiterNames {
        &self.names
    }

    fn stats(&self) -> Stats {
        self.counters()
    }

    fn sweep(&self, now: u64) {
        self.sweep_all(now);
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod catch_up_tests;
