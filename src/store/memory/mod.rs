//! The embedded store: per-key state in [`DashMap`]s, evicted automatically.
//!
//! Keys are spread over [`SEGMENTS`] maps per table so that eviction can work one segment at a time:
//! a sweep never holds more than one shard lock, and a concurrent check waits at most for one
//! shard's scan. A one-quota rule of the fixed window, sliding window counter or buckets gets a table
//! of packed 8-byte states updated by compare-and-swap ([`packed`]); other rules keep general
//! entries ([`general`]).

mod blocked;
mod general;
mod many;
#[cfg(any(tollgate_loom, shuttle))]
mod model;
mod packed;

mod sketch;
mod table;

use std::future::Ready;
use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use dashmap::mapref::one::RefMut;
use foldhash::fast::RandomState;
use parking_lot::Mutex;

use self::blocked::BlockedCache;
use self::general::{Entry, Rules};
use self::packed::{NOW_LIMIT, PackedRule};
pub(crate) use self::sketch::MAX_SKETCH_BYTES;
use self::sketch::Sketch;
use self::table::{Held, RoomScan, SEGMENTS, Segmented, Table, segment_of};
use super::{Answer, LimiterNames, Scope, Store};
use crate::decision::{Decision, Outcome, to_decision};
use crate::error::StoreError;
use crate::rule::Rule;
use crate::stats::{CacheLine, Counter, HeldCount, Stats};
use crate::strategy::{Op, QuotaState, Verdict};

/// How many distinct packable rules get a packed table; keys of further rules use general entries.
const PACKED_RULES: usize = 4;
/// While traffic flows, one segment is swept every this many nanoseconds (the whole store every
/// 8 s). Paced by time, not by calls: at 10^6 keys a step scans ~16 k entries (about a
/// millisecond), so the sweep costs a fraction of a percent of a core whatever the request rate.
const SWEEP_STEP_EVERY: u64 = 8_000_000_000 / SEGMENTS as u64;
/// A gap between decisions after which the first one sweeps every segment first
/// ([`MemoryStore::catch_up`]): 1/16 of the shortest ring, well before any ring time aliases.
const CATCH_UP_AFTER: u64 = packed::RING_SPAN / 16;
/// Segments a new key may examine to make room at the cap: bounds the work one request causes.
const SEGMENTS_PER_ROOM_CALL: usize = 2;
/// Entries the last-resort eviction of one key with room may look at (past the first segment
/// holding one): all of a small store, a bounded part of a large one.
const ENTRIES_PER_EVICTION: usize = 4096;
/// From this cap on, the key count is gathered per thread ([`HeldCount`]): the cap may then be
/// overshot by up to 63 keys per inserting thread (under 0.1 % of it for 15 threads).
const GATHERED_COUNT_FROM: usize = 1 << 20;
/// The key cap of a store built without one ([`MemoryStoreBuilder::DEFAULT_MAX_KEYS`]).
pub(crate) const DEFAULT_MAX_KEYS: usize = 8_000_000;
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
    max_keys: usize,
    /// Keys held: an insert writes its thread's stripe, not a line the other threads read.
    keys: HeldCount,
    cursor: AtomicUsize,
    /// Inserts published by `keys` since the last sweep step they paced.
    inserts: AtomicU64,
    /// Read by every decision, so alone on its line (the counters beside it are written by
    /// inserts and sweeps).
    pacing: CacheLine<Pacing>,
    /// During a catch-up ([`MemoryStore::catch_up`]): bit `i` set once segment `i` was swept.
    caught: AtomicU64,
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
    names: LimiterNames,
    /// Lock stripes of multi-limit decisions (see [`many`]).
    stripes: many::Stripes,
}

/// When the sweep runs, and whether a catch-up after a gap is under way.
#[derive(Debug, Default)]
struct Pacing {
    /// When the next timed sweep step is due (see [`SWEEP_STEP_EVERY`]).
    next_step_at: AtomicU64,
    /// While a catch-up runs: the start of the gap it follows (every state older than the gap
    /// is read as of then); 0 otherwise.
    catch_up_from: AtomicU64,
}

// The catch-up keeps one bit per segment.
const _: () = assert!(SEGMENTS <= 64);

impl<K> std::fmt::Debug for MemoryStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.keys.get())
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

/// Options of a [`MemoryStore`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct MemoryStoreBuilder {
    max_keys: Option<usize>,
}

impl MemoryStoreBuilder {
    /// The key cap of a store built without one: 8 x 10^6 keys.
    pub const DEFAULT_MAX_KEYS: usize = DEFAULT_MAX_KEYS;

    /// The largest number of bytes a store's record of evicted keys (its sketch) can take,
    /// allocated on the first eviction of a key with spent quota and sized from the key cap.
    pub const MAX_SKETCH_BYTES: usize = MAX_SKETCH_BYTES;

    /// Caps the number of keys held (see [`MemoryStore`] for what happens at the cap); the
    /// default is [`MemoryStoreBuilder::DEFAULT_MAX_KEYS`], and `usize::MAX` lifts the cap.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys.max(1));
        self
    }

    /// Builds the store.
    pub fn build<K: Hash + Eq + Clone + Send + Sync + 'static>(self) -> MemoryStore<K> {
        MemoryStore::with_cap(self.max_keys.unwrap_or(DEFAULT_MAX_KEYS))
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

    fn with_cap(max_keys: usize) -> Self {
        let route = RandomState::default();
        Self {
            general: Table::new(Rules::default(), route),
            sketch: Sketch::new(max_keys),
            packed: std::array::from_fn(|_| OnceLock::new()),
            unpackable: AtomicU64::new(0),
            handed: AtomicBool::new(false),
            blocked: BlockedCache::default(),
            route,
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
            pacing: CacheLine(Pacing::default()),
            caught: AtomicU64::new(0),
            full_until: AtomicU64::new(0),
            fruitless: AtomicUsize::new(0),
            soonest_room: AtomicU64::new(u64::MAX),
            overflow: Mutex::new(Entry::new()),
            overflow_warn: crate::throttle::Throttle::default(),
            allowed: Counter::default(),
            rejected: Counter::default(),
            evictions: Counter::default(),
            overflow_hits: Counter::default(),
            names: LimiterNames::default(),
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
            Table::new(packed, self.route)
        }))
    }

    /// What the key `key` (hash `hash`, segment `i`) holds or left under the other rules of the
    /// limiter name of `rule`'s scope `tag`, when that name was seen with several rules: its
    /// states in retired packed tables (taken out of them when `take`), and the records eviction
    /// left under each of the name's rules. `None` for a name of one rule.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &self,
        i: usize,
        key: &K,
        hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
        take: bool,
    ) -> Option<Vec<crate::strategy::Held>> {
        let rules = &self.general.ctx;
        rules.register(rule, tag);
        let seen = rules.rules_of_name(rule, tag)?;
        let mut held = Vec::new();
        for (t, slot) in self.packed.iter().enumerate() {
            let Some(table) = slot.get() else { continue };
            let tag = table.ctx.tag();
            if !rules.is_retired(t) || !seen.iter().any(|s| s.0 == tag) {
                continue;
            }
            let word = if take {
                let word = table.segment(i).remove(key).map(|(_, c)| c.into_inner());
                if word.is_some() {
                    self.keys.remove(1);
                }
                word
            } else {
                table.segment(i).get(key).map(|c| c.load(Ordering::Relaxed))
            };
            if let Some(word) = word {
                held.push(table.ctx.held(word, now));
                if take {
                    // A rejection cached for the key in that table is no longer its state's.
                    self.blocked.invalidate();
                }
            }
        }
        for s in &seen {
            held.extend(general::recall_held(&self.sketch, hash, s, now));
        }
        Some(held)
    }

    /// Before a call under `rule` (scope `tag`) on a held key whose first slot is another
    /// scope's: the scope's state is found, or converted from the name's state under another
    /// rule, or adopted from a retired packed table or the sketch, or recalled as before.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn reconcile(
        &self,
        entry: &mut Entry,
        i: usize,
        key: &K,
        hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
    ) {
        let rules = &self.general.ctx;
        rules.register(rule, tag);
        if entry.convert_to(rules, rule, tag, now) {
            return;
        }
        match self.adopt(i, key, hash, rule, tag, now, true) {
            Some(old) if !old.is_empty() => entry.add_converted(rules, rule, tag, &old, now),
            _ => entry.recall_other(rules, &self.sketch, hash, rule, tag, now),
        }
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
        let i = segment_of(hash);
        // A request of cost 1 (the layer's) from a key known to be blocked: answered here.
        let miss = match op {
            Op::Check(1) => match self
                .blocked
                .lookup(fingerprint, now, || packed.reported_limit())
            {
                Ok(v) => return self.finish(0, v, now, op),
                Err(miss) => Some(miss),
            },
            _ => None,
        };
        // A reset forgets the key's record too: held or not, its next request is a new key's.
        if matches!(op, Op::Reset) {
            packed.clear_record(&self.sketch, hash, now);
        }
        // The read lock only keeps the entry in place; the state changes by compare-and-swap.
        // Retirement is read under that lock: `adopt` takes a key out of a retired table under
        // the write lock, so a state applied here is either taken with it or never applied (a
        // cell left in a retired table, by an insert that saw the retirement too late, is never
        // counted on).
        let found = table.find(hash, key, |cell| {
            if self.general.ctx.is_retired(t) {
                return None;
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
            Some(v)
        });
        match found {
            Some(Some(v)) => return self.finish(0, v, now, op),
            Some(None) => return self.decide_moved(hash, key, rule, tag, op, now),
            None => {}
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
            return self.finish(0, v, now, op);
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
        self.finish(0, v, now, op)
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

    /// Before a reset: drops what the sketch recalls of the key under the scope (and, for a name
    /// of several rules, under each of its rules), and its state in a retired packed table.
    #[cold]
    fn forget_everywhere(&self, i: usize, key: &K, hash: u64, rule: &Rule, tag: u64, now: u64) {
        // A name of several rules: its state in a retired packed table goes too.
        let _ = self.adopt(i, key, hash, rule, tag, now, true);
        general::clear_records(&self.sketch, hash, rule, tag, now);
        // A name of several rules: its records under each of them too.
        for (t, _, params) in self
            .general
            .ctx
            .rules_of_name(rule, tag)
            .unwrap_or_default()
        {
            for q in 0..params.len() {
                self.sketch.clear(sketch::quota_hash(hash, t, q), now);
            }
        }
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
        let i = segment_of(hash);
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
            let (index, v) = entry.run(rule, tag, op, now);
            return self.finish(index, v, now, op);
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

    /// The state of `key` in the packed table of `rule`, if it has one and holds the key; removed
    /// from there when `take`.
    #[cold]
    fn packed_state(
        &self,
        i: usize,
        key: &K,
        rule: &Rule,
        tag: u64,
        now: u64,
        take: bool,
    ) -> Option<QuotaState> {
        let table = self
            .packed
            .iter()
            .filter_map(OnceLock::get)
            .find(|t| t.ctx.matches(rule, tag))?;
        let word = if take {
            let (_, cell) = table.segment(i).remove(key)?;
            self.handed.store(true, Ordering::Relaxed);
            self.keys.remove(1);
            cell.into_inner()
        } else {
            table.segment(i).get(key)?.load(Ordering::Relaxed)
        };
        Some(table.ctx.state_of(word, now))
    }

    /// Whether a general entry holds `key`'s state in the scope of tag `tag`.
    #[cold]
    fn general_holds(&self, i: usize, key: &K, tag: u64) -> bool {
        self.general
            .segment(i)
            .get(key)
            .is_some_and(|entry| entry.holds(tag))
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
        let (index, v) = entry.run(rule, tag, op, now);
        self.finish(index, v, now, op)
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
        let (index, v) = overflow.run(rule, tag, op, now);
        drop(overflow);
        self.finish(index, v, now, op)
    }

    #[inline]
    fn finish(&self, index: usize, v: Verdict, now: u64, op: Op) -> Decision {
        let mut d = to_decision(index, v, now, 1);
        if let Op::Check(cost) = op {
            if v.outcome == Outcome::Allowed {
                self.allowed.add(1);
                // An admitted check's cost is its reservation.
                d.cost = cost;
            } else {
                self.rejected.add(1);
            }
        }
        d
    }

    /// Every table: the general entries, then the packed tables claimed so far.
    fn tables(&self) -> impl Iterator<Item = &dyn Segmented> {
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
    fn tick(&self, now: u64) {
        // Acquire: a thread that sees a deadline moved after a gap sees the catch-up started.
        let due = self.pacing.0.next_step_at.load(Ordering::Acquire);
        // The second test restarts the pacing after the clock went back.
        if now >= due || due > now.saturating_add(SWEEP_STEP_EVERY) {
            self.timed_step(due, now);
        }
    }

    #[cold]
    fn timed_step(&self, due: u64, now: u64) {
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
    fn after_insert(&self, published: u64, now: u64) {
        let inserts = self.inserts.fetch_add(published, Ordering::Relaxed) + published;
        if inserts >= (self.keys.published() / SEGMENTS as u64).max(HeldCount::BATCH) {
            self.inserts.store(0, Ordering::Relaxed);
            self.sweep_step(now);
        }
    }

    fn next_segment(&self) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % SEGMENTS
    }

    /// Drops the expired keys of the next segment of every table.
    fn sweep_step(&self, now: u64) {
        let i = self.next_segment();
        self.sweep_segment(i, now);
    }

    /// Drops the keys of segment `i` of every table fresh at `now`; during a catch-up that has
    /// not reached the segment, their states read as of the gap's start (see
    /// [`MemoryStore::catch_up`]). Returns how many.
    fn sweep_segment(&self, i: usize, now: u64) -> usize {
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

    /// After no decision for [`CATCH_UP_AFTER`] or more (an idle store, a suspended process, a
    /// clock jump forward), every state was written before `due`: read as of `now`, a packed time
    /// on a ring (a first-hit start, a large window index) older than 7/8 of its ring would look
    /// ahead of `now`, and its key stay blocked for hours. So, until every segment has been swept
    /// with its states read as of `due` (by the paced steps, one segment each, or by room-making
    /// and full sweeps, which reach a segment first), a decision on a ring table first drops its
    /// key's state if it is fresh read as of then ([`MemoryStore::caught_up`]). No decision waits
    /// for more than its own key and the paced step it would run anyway.
    #[cold]
    fn catch_up(&self, due: u64, now: u64) {
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
            for i in 0..SEGMENTS {
                self.sweep_segment(i, now);
            }
        }
        self.caught.store(0, Ordering::Relaxed);
        self.pacing.0.catch_up_from.store(due, Ordering::Release);
    }

    /// During a catch-up that has not reached segment `i`: drops the state in `cell` (a new
    /// key's) if it is fresh read as of the gap's start, as the catch-up's sweep would.
    #[inline]
    fn caught_up(&self, rule: &PackedRule, i: usize, cell: &AtomicU64, now: u64) {
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        if from != 0 {
            self.catch_up_key(from, rule, i, cell, now);
        }
    }

    #[cold]
    fn catch_up_key(&self, from: u64, rule: &PackedRule, i: usize, cell: &AtomicU64, now: u64) {
        if !rule.keeps_a_ring() || self.caught.load(Ordering::Acquire) & (1u64 << i) != 0 {
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
    fn catch_up_segment(&self, i: usize, now: u64) -> usize {
        let from = self.pacing.0.catch_up_from.load(Ordering::Acquire);
        if from != 0 && self.caught.load(Ordering::Acquire) & (1u64 << i) == 0 {
            self.sweep_segment(i, now)
        } else {
            0
        }
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

    /// Makes room for one key at the cap, examining the new key's segment `home_i` of `home` and at
    /// most [`SEGMENTS_PER_ROOM_CALL`] segments in all (the cursor carries on from there next time).
    /// Returns `false` when they held no room; after two whole rotations without room (every key
    /// blocked), new keys go straight to the overflow state until the soonest blocked key frees up.
    fn make_room(&self, home: &dyn Segmented, home_i: usize, now: u64) -> bool {
        if now < self.full_until.load(Ordering::Relaxed) {
            return false;
        }
        // Small batches, taken first from the segment the new key goes to: segments stay near
        // their share of the cap, so their tables stop growing once the cap is reached.
        let mut scan = RoomScan {
            batch: (self.max_keys / SEGMENTS / 16).clamp(1, 256),
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
        if scanned + SEGMENTS_PER_ROOM_CALL >= 2 * SEGMENTS {
            self.fruitless.store(0, Ordering::Relaxed);
            // No blocked key seen: the keys had room but sat elsewhere; look again after a step
            // rather than never.
            let until = match self.soonest_room.swap(u64::MAX, Ordering::Relaxed) {
                u64::MAX => now.saturating_add(SWEEP_STEP_EVERY),
                until => until,
            };
            self.full_until.store(until, Ordering::Relaxed);
        }
        false
    }

    /// Evicts the key with room nearest a new key's state among the segments from `home_i` on,
    /// until [`ENTRIES_PER_EVICTION`] entries were looked at (or every segment).
    /// Returns how many keys a catch-up dropped on the way instead (then it evicts none).
    fn evict_nearest(&self, home_i: usize, now: u64, scan: &mut RoomScan<'_>) -> usize {
        let mut best: Option<(u16, usize, usize)> = None;
        let mut i = home_i;
        for _ in 0..SEGMENTS {
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
            i = (i + 1) % SEGMENTS;
        }
        if let Some((n, t, i)) = best {
            if let Some(table) = self.tables().nth(t) {
                table.evict_one(i, now, n, scan);
            }
        }
        0
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
mod tests {
    use super::*;
    use crate::strategy::{self, Strategy};

    const S: u64 = 1_000_000_000;

    #[test]
    fn idle_keys_are_swept_and_memory_returned() {
        let store = MemoryStore::<u64>::new();
        let rule = Rule::parse(Strategy::FixedWindow, "10/s").unwrap();
        for k in 0..10_000 {
            store.decide(&k, &rule, Op::Check(1), 100 * S);
        }
        assert_eq!(store.len(), 10_000);
        store.sweep_all(101 * S - 1);
        assert_eq!(store.len(), 10_000, "still inside the window");
        store.sweep_all(101 * S);
        assert_eq!(store.len(), 0);
        let capacity: usize = store
            .packed
            .iter()
            .filter_map(OnceLock::get)
            .map(Table::capacity)
            .sum();
        assert!(capacity < 64 * 1024, "{capacity}");
    }

    #[test]
    fn regression_a_sweep_at_the_end_of_time_kept_blocked_keys() {
        // Bug (found by the core tests): at now == u64::MAX a state whose fresh_at saturated to
        // u64::MAX was swept as fresh, so `sweep()` reset a blocked key.
        for strategy in [
            Strategy::FixedWindow,
            Strategy::FixedWindowFirstHit,
            Strategy::MovingWindow,
            Strategy::SlidingWindow,
        ] {
            let rule = Rule::parse(strategy, "1/second").unwrap();
            let store = MemoryStore::<u64>::new();
            assert!(
                store.decide(&7, &rule, Op::Check(1), u64::MAX).is_allowed(),
                "{strategy}"
            );
            assert!(
                !store.decide(&7, &rule, Op::Check(1), u64::MAX).is_allowed(),
                "{strategy}"
            );
            store.sweep_all(u64::MAX);
            assert!(
                !store.decide(&7, &rule, Op::Check(1), u64::MAX).is_allowed(),
                "{strategy}"
            );
        }
    }

    #[test]
    fn packed_states_and_the_blocked_cache_decide_as_the_general_path() {
        for strategy in Strategy::ALL {
            let rule = Rule::parse(strategy, "5/s").unwrap();
            let store = MemoryStore::<u64>::new();
            let mut reference = vec![crate::strategy::QuotaState::new(strategy)];
            let mut x = 0x2545_f491_4f6c_dd1d_u64;
            let mut now = 1_000 * S;
            for i in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                now += x % (S / 4);
                let op = match i % 7 {
                    0 if i % 3 == 0 => Op::Settle {
                        reserved: 1,
                        actual: 0,
                        at: now,
                        bound: 0,
                    },
                    0 if i % 97 == 0 => Op::Reset,
                    1 => Op::Peek,
                    2 => Op::Check(u32::try_from(x % 7).unwrap()),
                    _ => Op::Check(1),
                };
                let got = store.decide(&7, &rule, op, now);
                let (index, v) = strategy::apply(&mut reference, strategy, rule.nanos(), now, op);
                assert_eq!(
                    got,
                    to_decision(index, v, now, 1).answering(op),
                    "{strategy} step {i}"
                );
            }
        }
    }

    #[test]
    fn multi_quota_states_held_as_words_decide_as_the_pure_arithmetic() {
        for strategy in Strategy::ALL {
            let rule = Rule::parse(strategy, "3/s; 7/10s; 20/minute; 100000/hour").unwrap();
            let store = MemoryStore::<u64>::new();
            let mut reference = vec![vec![crate::strategy::QuotaState::new(strategy); 4]; 3];
            let mut x = 0x2545_f491_4f6c_dd1d_u64;
            let mut now = 1_000 * S;
            for i in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                now += x % (S / 3);
                let op = match i % 9 {
                    0 => Op::Settle {
                        reserved: 1,
                        actual: 0,
                        at: now,
                        bound: 0,
                    },
                    1 => Op::Peek,
                    2 => Op::Check(u32::try_from(x % 5).unwrap()),
                    3 if i % 7 == 0 => Op::Settle {
                        reserved: 1,
                        actual: 2,
                        at: now - x % S,
                        bound: 0,
                    },
                    _ => Op::Check(1),
                };
                let key = x % 3;
                let got = store.decide(&key, &rule, op, now);
                let states = &mut reference[key as usize];
                let (index, v) = strategy::apply(states, strategy, rule.nanos(), now, op);
                assert_eq!(
                    got,
                    to_decision(index, v, now, 1).answering(op),
                    "{strategy} step {i}"
                );
            }
        }
    }

    #[test]
    fn an_evicted_key_back_under_its_second_rule_is_as_spent_as_it_left() {
        for strategy in [Strategy::MovingWindow, Strategy::FixedWindowFirstHit] {
            let a = Rule::parse(strategy, "10/hour").unwrap();
            let b = Rule::parse(strategy, "10/2hours").unwrap();
            let store = MemoryStore::<u64>::builder().max_keys(1).build();
            // Two limiters (names "a" and "b") on one key.
            let (ta, tb) = (Scope::new("a", &a).tag(), Scope::new("b", &b).tag());
            let now = 3_600 * S;
            assert!(store.decide_in(&1, &a, ta, Op::Check(1), now).is_allowed());
            assert!(store.decide_in(&1, &b, tb, Op::Check(9), now).is_allowed());
            // Key 2 evicts key 1 (the cap is 1), which comes back under rule a, then under b.
            assert!(
                store
                    .decide_in(&2, &a, ta, Op::Check(1), now + S)
                    .is_allowed()
            );
            assert!(store.stats().evictions >= 1, "{strategy}");
            let d = store.decide_in(&1, &a, ta, Op::Check(1), now + 2 * S);
            assert_eq!((d.is_allowed(), d.remaining()), (true, 8), "{strategy}");
            let d = store.decide_in(&1, &b, tb, Op::Check(1), now + 3 * S);
            assert_eq!((d.is_allowed(), d.remaining()), (true, 0), "{strategy}");
            assert!(
                !store
                    .decide_in(&1, &b, tb, Op::Check(1), now + 4 * S)
                    .is_allowed()
            );
        }
    }

    #[test]
    fn a_key_handed_over_at_the_end_of_packed_time_keeps_its_state_when_the_clock_steps_back() {
        // Review: a key moved to a general entry at 2^62 ns, asked again after the clock stepped
        // back below that instant, started afresh in its packed table (N more admissions).
        for strategy in [
            Strategy::FixedWindow,
            Strategy::SlidingWindow,
            Strategy::TokenBucket,
            Strategy::LeakyBucket,
        ] {
            for quota in ["5/s", "100/hour"] {
                let rule = Rule::parse(strategy, quota).unwrap();
                let store = MemoryStore::<u64>::new();
                // The same walk 10^4 hours earlier, on packed state throughout (the windows
                // align to whole hours, so the answers are the same).
                let reference = MemoryStore::<u64>::new();
                let shift = 10_000 * 3600 * S;
                let mut now = NOW_LIMIT - S;
                let (mut below, mut above) = (false, false);
                let mut x = 0x9e37_79b9_7f4a_7c15_u64;
                for i in 0..600 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Forward, and back to up to half a second below 2^62 once past it by half
                    // a second: across that instant both ways, again and again.
                    now = if now > NOW_LIMIT + S / 2 && x % 4 == 0 {
                        NOW_LIMIT - x % (S / 2)
                    } else {
                        now + x % (S / 10)
                    };
                    below |= now < NOW_LIMIT && above;
                    above |= now >= NOW_LIMIT;
                    let key = x % 2;
                    let op = if i % 17 == 0 {
                        Op::Peek
                    } else {
                        Op::Check(1 + (x % 3) as u32)
                    };
                    let got = store.decide(&key, &rule, op, now);
                    let want = reference.decide(&key, &rule, op, now - shift);
                    // What is admitted and left; the times may differ while the clock is behind
                    // a state's own time (packed and general states read a past `now` apart).
                    let parts = |d: &Decision| (d.outcome(), d.remaining());
                    assert_eq!(
                        parts(&got),
                        parts(&want),
                        "{strategy} {quota} step {i} at {now}"
                    );
                }
                assert!(
                    below,
                    "{strategy} {quota}: the walk never stepped back below 2^62"
                );
            }
        }
    }

    #[test]
    fn at_the_end_of_packed_time_keys_carry_their_state_over() {
        // Across 2^62 ns packed keys move to general entries with their state: the decisions are
        // the pure arithmetic's on one state throughout (before: N more admissions at that instant).
        for strategy in [
            Strategy::FixedWindow,
            Strategy::SlidingWindow,
            Strategy::TokenBucket,
            Strategy::LeakyBucket,
        ] {
            for quota in ["5/s", "100/hour"] {
                let rule = Rule::parse(strategy, quota).unwrap();
                let store = MemoryStore::<u64>::new();
                let mut reference = [
                    vec![crate::strategy::QuotaState::new(strategy)],
                    vec![crate::strategy::QuotaState::new(strategy)],
                ];
                let mut now = NOW_LIMIT - S;
                let mut x = 0x2545_f491_4f6c_dd1d_u64;
                for i in 0..400 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    now += x % (S / 100);
                    let key = x % 2;
                    let op = if i % 17 == 0 {
                        Op::Peek
                    } else {
                        Op::Check(1 + (x % 3) as u32)
                    };
                    let got = store.decide(&key, &rule, op, now);
                    let states = &mut reference[key as usize];
                    let (index, v) = strategy::apply(states, strategy, rule.nanos(), now, op);
                    assert_eq!(
                        got,
                        to_decision(index, v, now, 1).answering(op),
                        "{strategy} {quota} step {i}"
                    );
                }
                assert!(now > NOW_LIMIT, "{now}");
                assert!(store.len() <= 2);
            }
        }
    }

    #[test]
    fn regression_a_blocked_state_under_a_second_rule_survives_the_first_rule_expiring() {
        // Review: with the first rule's state fresh, a call under a second rule took the first
        // slot with a new state instead of finding its own (blocked) state among the others.
        let a = Rule::parse(Strategy::MovingWindow, "100/s").unwrap();
        let b = Rule::parse(Strategy::MovingWindow, "5/hour").unwrap();
        let store = MemoryStore::<u64>::new();
        // Two limiters (names "a" and "b") on one key.
        let at = |rule: &Rule, name: &str, t: u64| {
            store.decide_in(&1, rule, Scope::new(name, rule).tag(), Op::Check(1), t)
        };
        assert!(at(&a, "a", 100 * S).is_allowed());
        for _ in 0..5 {
            assert!(at(&b, "b", 100 * S).is_allowed());
        }
        assert!(!at(&b, "b", 100 * S).is_allowed());
        // Rule a's state is fresh from 101 s on; rule b's key stays blocked.
        assert!(!at(&b, "b", 102 * S).is_allowed());
        assert!(at(&a, "a", 102 * S).is_allowed());
        assert!(!at(&b, "b", 103 * S).is_allowed());
    }

    #[test]
    fn regression_at_the_cap_a_new_rule_takes_room_from_another_rules_table() {
        // Review: making room looked for a key to evict only in the new key's own (empty) table,
        // then sent every new key of the new rule to the overflow quota for good.
        let busy = Rule::parse(Strategy::FixedWindow, "1000/s").unwrap();
        let login = Rule::parse(Strategy::TokenBucket, "5/minute").unwrap();
        let store = MemoryStore::<u64>::builder().max_keys(100).build();
        let now = 100 * S;
        for round in 0..300u64 {
            for k in 0..100 {
                store.decide(&k, &busy, Op::Check(1), now);
            }
            let d = store.decide(&(1_000 + round), &login, Op::Check(1), now);
            assert_eq!((d.is_allowed(), d.remaining()), (true, 4), "round {round}");
        }
        assert_eq!(store.stats().overflow_hits, 0);
        assert!(store.len() <= 101);
    }

    #[test]
    fn after_the_clock_went_back_a_cached_rejection_answers_for_its_time() {
        // 5/s fixed window: blocked in [100 s, 101 s), a new window at 101 s, then the clock goes
        // back to 100.5 s. The map's state clamps that time to its window (101 s) and would admit;
        // the cache answers for 100.5 s, when the key was blocked. Either order of the two calls is
        // a valid history, and the cache never admits what the state would not.
        let rule = Rule::parse(Strategy::FixedWindow, "5/s").unwrap();
        let store = MemoryStore::<u64>::new();
        for _ in 0..5 {
            assert!(store.decide(&1, &rule, Op::Check(1), 100 * S).is_allowed());
        }
        let blocked = store.decide(&1, &rule, Op::Check(1), 100 * S);
        assert_eq!(
            blocked.retry_after(),
            Some(std::time::Duration::from_secs(1))
        );
        assert!(store.decide(&1, &rule, Op::Check(1), 101 * S).is_allowed());
        let back = store.decide(&1, &rule, Op::Check(1), 100 * S + S / 2);
        assert!(!back.is_allowed());
        assert_eq!(
            back.retry_after(),
            Some(std::time::Duration::from_millis(500))
        );
        // A refund gives room back: nothing cached survives it.
        store.decide(
            &1,
            &rule,
            Op::Settle {
                reserved: 1,
                actual: 0,
                at: 100 * S,
                bound: 0,
            },
            101 * S,
        );
        assert!(
            store
                .decide(&1, &rule, Op::Check(1), 100 * S + S / 2)
                .is_allowed()
        );
    }

    #[test]
    fn traffic_alone_sweeps_idle_keys_within_a_rotation() {
        let store = MemoryStore::<u64>::new();
        let rule = Rule::parse(Strategy::TokenBucket, "10/s").unwrap();
        let mut now = 100 * S;
        for k in 0..5_000 {
            store.decide(&k, &rule, Op::Check(1), now);
        }
        let held = store.len();
        assert!(held > 4_000, "inserts sweep only expired keys: {held}");
        // One hot key's traffic for one rotation (8 s) frees every idle key.
        for _ in 0..2 * SEGMENTS {
            now += SWEEP_STEP_EVERY;
            store.decide(&u64::MAX, &rule, Op::Check(1), now);
        }
        assert_eq!(store.len(), 1);
        // A clock that went back does not stop the sweeping.
        store.decide(&1, &rule, Op::Check(1), now);
        now -= 4 * S;
        for _ in 0..2 * SEGMENTS {
            now += SWEEP_STEP_EVERY;
            store.decide(&u64::MAX, &rule, Op::Check(1), now);
        }
        assert_eq!(store.len(), 1, "key 1 was swept after the step back");
    }

    #[test]
    fn a_hinted_call_decides_as_an_unhinted_one_on_packed_and_general_tables() {
        // Five packable rules on one store: four get packed tables, the fifth general entries.
        // Each rule's hint is learnt on its first call and answers like the matching search.
        let rules: Vec<Rule> = (1..=5)
            .map(|n| Rule::parse(Strategy::FixedWindow, &format!("{n}/s")).unwrap())
            .collect();
        let hinted = MemoryStore::<u64>::new();
        let plain = MemoryStore::<u64>::new();
        let hints: Vec<TableHint> = rules.iter().map(|_| TableHint::default()).collect();
        for step in 0..40u64 {
            for (rule, hint) in rules.iter().zip(&hints) {
                let now = 100 * S + step * (S / 8);
                let key = step % 3;
                let a = hinted.decide_hinted(hint, &key, rule, rule.tag(), Op::Check(1), now);
                let b = plain.decide(&key, rule, Op::Check(1), now);
                assert_eq!(a, b, "{rule:?} step {step}");
            }
        }
        let learnt: Vec<u8> = hints.iter().map(|h| h.0.load(Ordering::Relaxed)).collect();
        assert_eq!(learnt, [1, 2, 3, 4, TableHint::GENERAL]);
    }

    #[test]
    fn peeking_an_unknown_key_holds_nothing() {
        let store = MemoryStore::<u64>::new();
        let rule = Rule::parse(Strategy::TokenBucket, "10/s").unwrap();
        let d = store.decide(&1, &rule, Op::Peek, S);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 10));
        assert!(store.is_empty());
    }

    #[test]
    fn the_cap_never_evicts_a_blocked_key() {
        let store = MemoryStore::<u64>::builder().max_keys(100).build();
        let rule = Rule::parse(Strategy::FixedWindow, "2/hour").unwrap();
        let now = 3600 * S;
        for _ in 0..3 {
            store.decide(&0, &rule, Op::Check(1), now);
        }
        for k in 1..10_000 {
            store.decide(&k, &rule, Op::Check(1), now);
            assert!(store.len() <= 101);
        }
        assert!(
            !store.decide(&0, &rule, Op::Check(1), now).is_allowed(),
            "still blocked"
        );
        assert!(store.stats().evictions > 0);
    }

    #[test]
    fn when_every_key_is_blocked_new_keys_share_the_overflow_quota() {
        let store = MemoryStore::<u64>::builder().max_keys(10).build();
        let rule = Rule::parse(Strategy::FixedWindow, "1/hour").unwrap();
        let now = 3600 * S;
        for k in 0..10 {
            assert!(store.decide(&k, &rule, Op::Check(1), now).is_allowed());
        }
        assert!(
            store.decide(&100, &rule, Op::Check(1), now).is_allowed(),
            "overflow quota's one"
        );
        assert!(!store.decide(&101, &rule, Op::Check(1), now).is_allowed());
        assert_eq!(store.stats().overflow_hits, 2);
        for k in 0..10 {
            assert!(
                !store.decide(&k, &rule, Op::Check(1), now).is_allowed(),
                "key {k} was not reset"
            );
        }
    }

    #[test]
    fn keys_back_after_a_forward_jump_past_seven_eighths_of_a_ring_are_not_locked_out() {
        // Review (r1): a sliding window of 10^7/s (a byte rate, say) stores its bucket on a ring of
        // 2^18 one-second windows (72.8 h), read up to 7/8 behind (63.7 h). After a forward jump of 70 h (a VM
        // resumed, a store idle that long) a saturated key's bucket reads 2.8 h AHEAD: the key is
        // rejected for 2.8 h, not "a window or two". One quota: the packed table (as before this
        // change); two quotas: the general entry's one-word states (new: they were exact).
        let t0 = 1_700_000_000 * S;
        let later = t0 + 70 * 3_600 * S;
        let mut failures = Vec::new();
        for quotas in ["10000000/s", "10000000/s; 20000000/minute"] {
            let rule = Rule::parse(Strategy::SlidingWindow, quotas).unwrap();
            let store = MemoryStore::<u64>::new();
            for key in 0..64 {
                assert!(
                    store
                        .decide(&key, &rule, Op::Check(10_000_000), t0)
                        .is_allowed()
                );
            }
            let locked: Vec<(u64, u64)> = (0..64u64)
                .filter_map(|key| {
                    let d = store.decide(&key, &rule, Op::Check(1), later);
                    (!d.is_allowed()).then(|| (key, d.retry_after_secs().unwrap_or(0)))
                })
                .collect();
            // How long key 0 stays locked out, probed every minute (at the retry time it is told,
            // it is still rejected).
            let minutes = (0..24 * 60u64)
                .find(|m| {
                    store
                        .decide(&0, &rule, Op::Check(1), later + 2 * S + m * 60 * S)
                        .is_allowed()
                })
                .unwrap_or(u64::MAX);
            if !locked.is_empty() {
                failures.push(format!(
                    "{quotas}: {} of 64 keys rejected 70 h later (key, retry after s): {:?}; key \
                     0 admitted again after {minutes} min",
                    locked.len(),
                    &locked[..locked.len().min(4)]
                ));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn an_evicted_key_of_one_word_window_quotas_comes_back_as_spent() {
        // Several window quotas held one word each, forgotten into the sketch at eviction and
        // recalled: never less spent than they left.
        for strategy in [
            Strategy::FixedWindow,
            Strategy::FixedWindowFirstHit,
            Strategy::SlidingWindow,
        ] {
            let rule = Rule::parse(strategy, "10/s; 20/minute").unwrap();
            let store = MemoryStore::<u64>::builder().max_keys(1).build();
            let t = 1_700_000_040 * S;
            // Key 1 keeps room (a blocked key is not evicted): 9 of 10 in the second.
            let at =
                |key: u64, cost: u32, now: u64| store.decide(&key, &rule, Op::Check(cost), now);
            assert!(at(1, 9, t).is_allowed());
            assert!(at(2, 1, t + S / 1000).is_allowed());
            assert!(store.stats().evictions >= 1, "{strategy}");
            let d = at(1, 2, t + 2 * S / 1000);
            assert!(
                !d.is_allowed(),
                "{strategy}: 9 of the second were spent: {d:?}"
            );
            // Three seconds later the second has room (a recalled sliding window may be restored
            // a bucket later: stricter), the minute 11 more: 9 + 9 = 18 of 20.
            assert!(at(2, 1, t + 3 * S).is_allowed());
            let d = at(1, 9, t + 3 * S + 1);
            assert!(d.is_allowed(), "{strategy}: {d:?}");
            assert!(at(2, 1, t + 5 * S).is_allowed());
            let d = at(1, 3, t + 5 * S + 1);
            assert!(
                !d.is_allowed(),
                "{strategy}: 18 of the minute were spent: {d:?}"
            );
        }
    }
}

#[cfg(test)]
mod catch_up_tests {
    //! The catch-up after a gap ([`MemoryStore::catch_up`]) sweeps in the paced steps while other
    //! threads keep deciding; it reads every state as of `due`, the gap's start, including states
    //! those threads wrote at `now`, after `due`.
    use super::*;
    use crate::strategy::Strategy;

    const S: u64 = 1_000_000_000;

    /// The interleaving replayed step by step in one thread: thread A wins the deadline
    /// (`timed_step`'s compare-and-swap) 70 h after the last decision; before A's sweep reaches
    /// the key's segment, thread B (whose `tick` now sees the new deadline and does not step)
    /// spends a key's whole quota at `later`; A's catch-up then reads that state as of `due`.
    #[test]
    fn catch_up_keeps_a_state_written_after_due_by_another_thread() {
        let t0 = 1_700_000_000 * S;
        let later = t0 + 70 * 3_600 * S;
        let mut failures = Vec::new();
        for (strategy, quotas, limit) in [
            (Strategy::SlidingWindow, "10000000/s", 10_000_000),
            (Strategy::FixedWindow, "10000000/s", 10_000_000),
            (Strategy::FixedWindowFirstHit, "4294967295/s", u32::MAX),
        ] {
            let rule = Rule::parse(strategy, quotas).unwrap();
            let store = MemoryStore::<u64>::new();
            // Some traffic at t0 sets the step deadline.
            assert!(store.decide(&1, &rule, Op::Check(1), t0).is_allowed());
            let due = store.pacing.0.next_step_at.load(Ordering::Relaxed);
            assert!(due > t0 && due <= t0 + S);
            // Thread A: `timed_step(due, later)` wins the compare-and-swap ...
            let next = later + SWEEP_STEP_EVERY;
            store
                .pacing
                .0
                .next_step_at
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .unwrap();
            // ... thread B decides meanwhile: its tick sees `next` and does not step.
            assert!(
                store
                    .decide(&7, &rule, Op::Check(limit), later)
                    .is_allowed()
            );
            assert!(!store.decide(&7, &rule, Op::Check(1), later).is_allowed());
            // ... thread A starts the catch-up, which reads key 7 as of `due` on its next
            // decision, and its sweep reaches key 7's segment later.
            store.catch_up(due, later);
            // The key spent its whole quota at `later`: still rejected 1 ms later, and after the
            // sweep.
            for (what, at) in [("decision", 1), ("sweep", 2)] {
                if what == "sweep" {
                    store.sweep_all(later);
                }
                let d = store.decide(&7, &rule, Op::Check(limit), later + at * 1_000_000);
                if d.is_allowed() {
                    failures.push(format!(
                        "{strategy:?} {quotas}: a key spent in full at `later` by another thread \
                         was dropped by the catch-up's {what} and admitted {limit} more {at} ms \
                         later (keys held: {})",
                        store.len()
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// The first decision after a gap sweeps one segment (the paced step), not the store; the
    /// keys of the segments not swept yet are read as of the gap's start (fresh: a whole quota),
    /// and the paced steps finish the catch-up within a rotation.
    #[test]
    fn the_catch_up_runs_in_paced_steps_and_reads_unswept_keys_as_of_the_gap() {
        let t0 = 1_700_000_000 * S;
        let later = t0 + 70 * 3_600 * S;
        let rule = Rule::parse(Strategy::SlidingWindow, "10000000/s").unwrap();
        let store = MemoryStore::<u64>::new();
        for key in 0..10_000u64 {
            assert!(
                store
                    .decide(&key, &rule, Op::Check(10_000_000), t0)
                    .is_allowed()
            );
        }
        assert!(!store.decide(&0, &rule, Op::Check(1), t0).is_allowed());
        assert!(
            store
                .decide(&u64::MAX, &rule, Op::Check(1), later)
                .is_allowed()
        );
        // One segment of 64 swept (about 156 keys), not all of them.
        assert!(store.len() > 10_000 - 400, "keys held: {}", store.len());
        assert_ne!(store.pacing.0.catch_up_from.load(Ordering::Relaxed), 0);
        // Spent in full 70 h ago: a whole quota again, not misread as blocked.
        for key in 0..100u64 {
            assert!(
                store
                    .decide(&key, &rule, Op::Check(10_000_000), later)
                    .is_allowed(),
                "key {key}"
            );
            assert!(!store.decide(&key, &rule, Op::Check(1), later).is_allowed());
        }
        for step in 1..=SEGMENTS as u64 {
            store.decide(
                &u64::MAX,
                &rule,
                Op::Check(1),
                later + step * SWEEP_STEP_EVERY,
            );
        }
        assert_eq!(store.pacing.0.catch_up_from.load(Ordering::Relaxed), 0);
        // Left: the keys decided since the gap (101), none of the others.
        assert!(store.len() <= 101, "keys held: {}", store.len());
    }

    /// At the cap during a catch-up, room-making sweeps a segment the catch-up has not reached
    /// before it looks at its keys: keys spent in full 70 h ago are dropped as fresh (read as of
    /// the gap), not misread as blocked (which would send new keys to the overflow state) nor
    /// evicted as spent.
    #[test]
    fn room_is_made_from_keys_the_catch_up_has_not_reached_yet() {
        let t0 = 1_700_000_000 * S;
        let later = t0 + 70 * 3_600 * S;
        let rule = Rule::parse(Strategy::SlidingWindow, "10000000/s").unwrap();
        let store = MemoryStore::<u64>::builder().max_keys(100).build();
        for key in 0..100u64 {
            assert!(
                store
                    .decide(&key, &rule, Op::Check(10_000_000), t0)
                    .is_allowed()
            );
        }
        for key in 1_000..1_050u64 {
            assert!(
                store.decide(&key, &rule, Op::Check(1), later).is_allowed(),
                "key {key}"
            );
        }
        assert_eq!(store.counters().overflow_hits, 0);
        assert!(store.len() <= 100);
        // None was evicted as spent (which a misread would have recorded): each has its whole
        // quota back.
        for key in 0..100u64 {
            assert!(
                store
                    .decide(&key, &rule, Op::Check(10_000_000), later)
                    .is_allowed(),
                "key {key}"
            );
        }
        assert_eq!(store.counters().overflow_hits, 0);
    }

    /// The same race with real threads: thread A's decision 70 h after the last one runs the
    /// catch-up over 200 000 held keys; thread B, once A moved the deadline, spends the whole
    /// quota of new keys at `later`. Every key B spent must stay rejected afterwards.
    #[test]
    fn catch_up_races_with_decisions_in_other_threads() {
        let t0 = 1_700_000_000 * S;
        let later = t0 + 70 * 3_600 * S;
        let rule = Rule::parse(Strategy::SlidingWindow, "10000000/s").unwrap();
        let store = MemoryStore::<u64>::new();
        for key in 0..200_000u64 {
            store.decide(&key, &rule, Op::Check(1), t0);
        }
        let due = store.pacing.0.next_step_at.load(Ordering::Relaxed);
        let a_done = AtomicBool::new(false);
        let spent = std::thread::scope(|s| {
            let a = s.spawn(|| {
                store.decide(&u64::MAX, &rule, Op::Check(1), later);
                a_done.store(true, Ordering::Release);
            });
            let b = s.spawn(|| {
                while store.pacing.0.next_step_at.load(Ordering::Relaxed) == due {
                    std::hint::spin_loop();
                }
                let mut spent = Vec::new();
                let mut key = 1_000_000u64;
                while !a_done.load(Ordering::Acquire) || spent.len() < 64 {
                    if store
                        .decide(&key, &rule, Op::Check(10_000_000), later)
                        .is_allowed()
                    {
                        spent.push(key);
                    }
                    key += 1;
                    if spent.len() >= 20_000 {
                        break;
                    }
                }
                spent
            });
            a.join().unwrap();
            b.join().unwrap()
        });
        let readmitted: Vec<u64> = spent
            .iter()
            .copied()
            .filter(|k| {
                store
                    .decide(k, &rule, Op::Check(10_000_000), later + 1_000_000)
                    .is_allowed()
            })
            .collect();
        assert!(
            readmitted.is_empty(),
            "{} of {} keys spent in full by thread B at `later` during thread A's catch-up were \
             dropped and admitted another 10^7 1 ms later (first: {:?})",
            readmitted.len(),
            spent.len(),
            &readmitted[..readmitted.len().min(4)]
        );
    }
}
