//! What eviction forgets, kept as an upper bound: a sketch of the quota evicted keys had spent.
//!
//! At the key cap a key with room may be evicted to make room for a new one. Without a record, the
//! key would come back as new and get its spent quota again (a flood of new keys would reset it).
//! Before a key's state is dropped, each of its quotas is summarised as `(units, until)`: the units it
//! had spent that still count, and the time from which its state equals a new key's. The summary is
//! folded into [`PROBES`] cells of one array, chosen by a hash of the key, its rule and the quota's
//! index, each cell keeping the *maximum* of the units and of the times folded into it (a count-min
//! sketch with `max` in place of `+`, its rows sharing one array as a Bloom filter's probes: a key is
//! recorded once per eviction and its newer record includes the older, so the maximum is enough and
//! over-counts less than a sum). A cell whose time has passed is empty again.
//!
//! When a key is inserted, the cells of each of its quotas are read: if every probed cell is live,
//! the smallest units and the earliest time over them are an upper bound of what the key had spent
//! and until when, and its new state is built to be at least as spent ([`restore`]). So a returning
//! key is never under-counted; it is over-counted only when every one of its cells also holds another
//! evicted key that spent more or counts longer. With `n` live records in `m` cells that happens with
//! probability about `(1 - e^(-8n/m))^8` (under 10^-5 for `n <= m / 64`), and the over-count is at
//! most the largest of those other keys' records.
//!
//! A cell is one `u64` updated by compare-and-swap: 22 bits of units (saturated: "the whole limit")
//! and 42 bits of time in steps of 2^20 ns (about 1 ms), rounded up, so a restored state may count
//! up to a millisecond longer than the evicted one.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::strategy::{
    FixedWindow, Gcra, MovingWindow, Params, QuotaState, SlidingWindow, Strategy,
};

/// Cells probed per quota: a key is over-counted only when every one of its cells is taken.
pub(super) const PROBES: u64 = 8;
/// The fewest and the most cells.
const MIN_CELLS: usize = 1 << 15;
const MAX_CELLS: usize = 1 << 23;
/// Bits of a cell's units; the largest value means "at least this many": the whole limit.
const UNIT_BITS: u32 = 22;
const UNITS_MAX: u64 = (1 << UNIT_BITS) - 1;
/// A cell's time is kept in steps of `2^TIME_SHIFT` ns, rounded up.
const TIME_SHIFT: u32 = 20;
/// The largest step count: "never fresh".
const STEPS_MAX: u64 = (1 << (64 - UNIT_BITS)) - 1;

/// The largest number of bytes a sketch can take (allocated on the first eviction of a key with
/// spent quota, sized from the key cap).
pub const MAX_SKETCH_BYTES: usize = MAX_CELLS * 8;

/// Spent quota of evicted keys (see the module's documentation).
pub(super) struct Sketch {
    cells: OnceLock<Box<[AtomicU64]>>,
    /// Cells, a power of two.
    len: usize,
    /// The latest time any cell is live until (0: nothing recorded): lookups at or after it skip
    /// the probes.
    live_until: AtomicU64,
}

impl std::fmt::Debug for Sketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sketch")
            .field("bytes", &self.bytes())
            .finish_non_exhaustive()
    }
}

/// What a sketch knows of one quota of a key: an upper bound of its spent units (`u64::MAX`: the
/// whole limit) and of the time its state becomes a new key's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Spent {
    pub(super) units: u64,
    pub(super) until: u64,
}

fn encode(units: u64, until: u64) -> u64 {
    let steps = until.div_ceil(1 << TIME_SHIFT).min(STEPS_MAX);
    (steps << UNIT_BITS) | units.min(UNITS_MAX)
}

fn decode(cell: u64) -> Spent {
    let units = cell & UNITS_MAX;
    let steps = cell >> UNIT_BITS;
    Spent {
        units: if units == UNITS_MAX { u64::MAX } else { units },
        until: if steps == STEPS_MAX {
            u64::MAX
        } else {
            steps << TIME_SHIFT
        },
    }
}

/// splitmix64's finalizer: spreads a hash over all bits.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The hash of one quota of a key: its routing hash, its rule's tag and the quota's index.
pub(super) fn quota_hash(key_hash: u64, tag: u64, index: usize) -> u64 {
    mix(key_hash ^ tag.rotate_left(29) ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

impl Sketch {
    /// A sketch for a store of at most `max_keys` keys: twice as many cells (rounded up to a power
    /// of two, between 2^15 and 2^23), so 16 bytes per capped key, 256 KiB to 64 MiB.
    pub(super) fn new(max_keys: usize) -> Self {
        let len = max_keys
            .saturating_mul(2)
            .clamp(MIN_CELLS, MAX_CELLS)
            .next_power_of_two();
        Self {
            cells: OnceLock::new(),
            len,
            live_until: AtomicU64::new(0),
        }
    }

    /// Bytes taken by the cells (0 until the first record).
    pub(super) fn bytes(&self) -> usize {
        self.cells.get().map_or(0, |c| c.len() * 8)
    }

    /// The cells probed for `hash` (double hashing).
    #[inline]
    fn probes(&self, hash: u64) -> impl Iterator<Item = usize> + use<> {
        let step = mix(hash ^ 0x9e37_79b9_7f4a_7c15) | 1;
        let mask = self.len as u64 - 1;
        (0..PROBES).map(move |j| (hash.wrapping_add(j.wrapping_mul(step)) & mask) as usize)
    }

    /// Folds `spent` of the quota hashed to `hash` in, at `now`.
    pub(super) fn record(&self, hash: u64, spent: Spent, now: u64) {
        if spent.until <= now {
            return;
        }
        let cells = self
            .cells
            .get_or_init(|| (0..self.len).map(|_| AtomicU64::new(0)).collect());
        let word = encode(spent.units, spent.until);
        let (units, steps) = (word & UNITS_MAX, word >> UNIT_BITS);
        for i in self.probes(hash) {
            let Some(cell) = cells.get(i) else { continue };
            let mut old = cell.load(Ordering::Relaxed);
            loop {
                let new = if decode(old).until <= now {
                    word
                } else {
                    ((old >> UNIT_BITS).max(steps) << UNIT_BITS) | (old & UNITS_MAX).max(units)
                };
                if new == old {
                    break;
                }
                match cell.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(found) => old = found,
                }
            }
        }
        self.live_until
            .fetch_max(decode(word).until, Ordering::Relaxed);
    }

    /// What the quota hashed to `hash` may have spent, if anything still counts at `now`.
    #[inline]
    pub(super) fn lookup(&self, hash: u64, now: u64) -> Option<Spent> {
        if self.live_until.load(Ordering::Relaxed) <= now {
            return None;
        }
        let cells = self.cells.get()?;
        let mut bound = Spent {
            units: u64::MAX,
            until: u64::MAX,
        };
        for i in self.probes(hash) {
            let Some(cell) = cells.get(i) else { continue };
            let s = decode(cell.load(Ordering::Relaxed));
            // A cell past its time: the key's own record (if any) is past too.
            if s.until <= now {
                return None;
            }
            bound.units = bound.units.min(s.units);
            bound.until = bound.until.min(s.until);
        }
        Some(bound)
    }
}

/// What `state` has spent under `p` that still counts, and until when; `None` when it equals a new
/// key's at `now`.
pub(super) fn summary(state: &QuotaState, p: &Params, now: u64) -> Option<Spent> {
    let until = state.fresh_at(p);
    if until <= now || until == 0 {
        return None;
    }
    let units = match state {
        QuotaState::Fixed(s) => s.parts().1,
        QuotaState::Sliding(s) => {
            let (_, cur, prev) = s.parts();
            u64::from(cur) + u64::from(prev)
        }
        QuotaState::Moving(s) => s.len() as u64,
        // The TAT says it all.
        QuotaState::Gcra(_) => 0,
    };
    Some(Spent { units, until })
}

/// A state under `strategy` and `p` at least as spent, at every time from `now` on, as any state
/// whose summary is bounded by `spent`.
pub(super) fn restore(strategy: Strategy, p: &Params, spent: Spent, now: u64) -> QuotaState {
    let w = p.window;
    let units = spent.units.min(p.limit);
    let until = spent.until;
    match strategy {
        // The evicted window started at `until - W` or before (at most a time step before, from the
        // rounding): the window restored starts there or later, so it ends no earlier.
        Strategy::FixedWindow => {
            let from = until.saturating_sub(w);
            QuotaState::Fixed(FixedWindow::from_parts(p.window_start(from), units))
        }
        Strategy::FixedWindowFirstHit => {
            QuotaState::Fixed(FixedWindow::from_parts(until.saturating_sub(w), units))
        }
        // The state is fresh at the end of its last counting bucket. Ending with the bucket of
        // `now`: what is left is a previous bucket's share, at most `units` of it. Ending later:
        // all of it may count now (current bucket), then its share in the next one.
        Strategy::SlidingWindow => {
            let bucket = p.window_start(now);
            let units = u32::try_from(units).unwrap_or(u32::MAX);
            if until <= bucket.saturating_add(w) {
                QuotaState::Sliding(SlidingWindow::from_parts(bucket, 0, units))
            } else {
                QuotaState::Sliding(SlidingWindow::from_parts(bucket, units, 0))
            }
        }
        // Every entry at the latest time one could have: each expires no earlier than the evicted.
        Strategy::MovingWindow => {
            QuotaState::Moving(MovingWindow::filled(units, until.saturating_sub(w)))
        }
        Strategy::TokenBucket | Strategy::LeakyBucket => QuotaState::Gcra(Gcra::from_tat(until)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;

    #[test]
    fn cells_round_up_and_saturate() {
        let s = decode(encode(7, 3 * S + 1));
        assert_eq!(s.units, 7);
        assert!(s.until > 3 * S && s.until < 3 * S + (1 << TIME_SHIFT) + 1);
        assert_eq!(decode(encode(u64::MAX, u64::MAX)).units, u64::MAX);
        assert_eq!(decode(encode(u64::MAX, u64::MAX)).until, u64::MAX);
        assert_eq!(decode(encode(UNITS_MAX, 0)).units, u64::MAX);
    }

    #[test]
    fn a_lookup_bounds_every_record_and_expires() {
        let sketch = Sketch::new(100);
        assert_eq!(sketch.bytes(), 0);
        let now = 1000 * S;
        assert_eq!(sketch.lookup(1, now), None);
        for k in 0..5000u64 {
            let spent = Spent {
                units: k % 10,
                until: now + (k % 7 + 1) * S,
            };
            sketch.record(quota_hash(k, 9, 0), spent, now);
        }
        assert_eq!(sketch.bytes(), MIN_CELLS * 8);
        for k in 0..5000u64 {
            let got = sketch.lookup(quota_hash(k, 9, 0), now).expect("recorded");
            assert!(got.units >= k % 10 && got.until >= now + (k % 7 + 1) * S);
        }
        assert_eq!(sketch.lookup(quota_hash(1, 9, 0), now + 8 * S), None);
        // A record once past its time does not hold a newer one back.
        let later = now + 9 * S;
        let spent = Spent {
            units: 1,
            until: later + S,
        };
        sketch.record(quota_hash(3, 9, 0), spent, later);
        assert_eq!(
            sketch.lookup(quota_hash(3, 9, 0), later).map(|s| s.units),
            Some(1)
        );
    }

    #[test]
    fn a_restored_state_is_never_less_spent_than_the_evicted_one() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for strategy in Strategy::ALL {
            for (limit, window) in [(10, 60 * S), (3, S), (1000, 3_600 * S), (5, S / 1000)] {
                let p = Params::bucket(limit, window, limit);
                for _ in 0..300 {
                    let mut state = QuotaState::new(strategy);
                    let mut now = 10_000 * S + rand() % (10 * window);
                    for _ in 0..rand() % 20 {
                        now += rand() % (window / 3 + 1);
                        let cost = 1 + rand() % 3;
                        if state.check(strategy, &p, now, cost).outcome == Outcome::Allowed {
                            state.commit(strategy, &p, now, cost);
                        }
                    }
                    now += rand() % (window / 2 + 1);
                    let Some(spent) = summary(&state, &p, now) else {
                        continue;
                    };
                    let spent = decode(encode(spent.units, spent.until));
                    let mut restored = restore(strategy, &p, spent, now);
                    // From `now` on, the restored state never admits more than the evicted one.
                    let mut t = now;
                    for _ in 0..40 {
                        let a = state.check(strategy, &p, t, 0).remaining;
                        let b = restored.check(strategy, &p, t, 0).remaining;
                        assert!(b <= a, "{strategy} {limit}/{window}: {b} > {a} at {t}");
                        t += rand() % (window / 4 + 1);
                    }
                }
            }
        }
    }
}
