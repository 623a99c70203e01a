//! What eviction forgets, kept exactly per key: a table of the quota evicted keys had spent.
//!
//! At the key cap a key with room may be evicted to make room for a new one. Without a record, the
//! key would come back as new and get its spent quota again (a flood of new keys would reset it).
//! Before a key's state is dropped, each of its quotas is summarised as `(units, until)`: the units it
//! had spent that still count, and the time from which its state equals a new key's, with its spent
//! share (`rank`). The record goes into one bucket of [`WAYS`] slots, chosen by a hash of the key,
//! its rule and the quota's index; the slot carries 32 more bits of that hash (the fingerprint), so
//! a key finds its own record and no other.
//!
//! - **A key is charged its own record, never another's.** When a key is inserted, only a live slot
//!   with its fingerprint is read, and its new state is built to be at least as spent ([`restore`]).
//!   A key with no record starts as new. Another key's record is read only if its fingerprint
//!   collides within the bucket: probability at most `WAYS / 2^32` (under 2 x 10^-9) per lookup,
//!   and the over-count is then that one record (less than the limit: blocked keys are not
//!   evicted). Since a restored state holds only the key's own spend, what it writes back at its
//!   next eviction is its own spend too: over-counts never compound, whatever the number of
//!   evict-and-return generations or the size of a flood.
//! - **A record is never less than what the key spent.** A key's record is the maximum of its
//!   summaries at each eviction, each including what it was restored with. A record is dropped
//!   only when its time has passed, or to make room in a full bucket, least spent share first (a
//!   more spent share takes the place of the least spent; among equals the record held first
//!   stays): a key comes back as new only when [`WAYS`] other live records at least as spent held
//!   its bucket within its horizon. Why strictness and a bounded over-count cannot both hold
//!   against any flood, and what a flood costs, are in the guide's [stores](crate::guide::stores)
//!   chapter.
//!
//! A slot is 16 bytes: the fingerprint, 24 bits of units (saturated: "the whole limit"), 8 bits
//! of rank, and the time in nanoseconds. A bucket is a small mutex around its slots: records and
//! lookups happen only at eviction and at a new key's insertion, never on a held key's decision.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::strategy::{
    FixedWindow, Gcra, MovingWindow, Params, QuotaState, SlidingWindow, Strategy,
};

/// Slots per bucket.
pub(super) const WAYS: usize = 8;
/// Slots per capped key.
const SLOTS_PER_KEY: usize = 4;
/// The fewest and the most slots.
const MIN_SLOTS: usize = 1 << 14;
const MAX_SLOTS: usize = 1 << 22;
/// Bytes of a slot.
const SLOT_BYTES: usize = std::mem::size_of::<Slot>();
/// Bits of a slot's units; the largest value means "at least this many": the whole limit.
const UNIT_BITS: u32 = 24;
const UNITS_MAX: u64 = (1 << UNIT_BITS) - 1;

/// The largest number of bytes a sketch can take (allocated on the first eviction of a key with
/// spent quota, sized from the key cap).
pub(crate) const MAX_SKETCH_BYTES: usize = MAX_SLOTS * SLOT_BYTES;

/// One evicted quota's record: empty (or free again) once `until` has passed.
#[derive(Clone, Copy, Default)]
struct Slot {
    fingerprint: u32,
    /// Units (low [`UNIT_BITS`]) and rank (high 8 bits).
    units_rank: u32,
    until: u64,
}

impl Slot {
    fn units(self) -> u64 {
        match u64::from(self.units_rank) & UNITS_MAX {
            UNITS_MAX => u64::MAX,
            units => units,
        }
    }

    fn rank(self) -> u8 {
        (self.units_rank >> UNIT_BITS) as u8
    }

    fn new(fingerprint: u32, spent: Spent) -> Self {
        let units = spent.units.min(UNITS_MAX) as u32;
        Self {
            fingerprint,
            units_rank: units | (u32::from(spent.rank) << UNIT_BITS),
            until: spent.until,
        }
    }
}

/// Spent quota of evicted keys (see the module's documentation).
pub(super) struct Sketch {
    buckets: OnceLock<Box<[Mutex<[Slot; WAYS]>]>>,
    /// Buckets, a power of two.
    len: usize,
    /// The latest time any slot is live until (0: nothing recorded): lookups at or after it skip
    /// the table.
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
/// whole limit) and of the time its state becomes a new key's, and how spent a share of its quota
/// that is (`rank`, 0 to 255: the record a full bucket gives up first is the least spent share).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Spent {
    pub(super) units: u64,
    pub(super) until: u64,
    pub(super) rank: u8,
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

/// The fingerprint of `hash`: bits the bucket index (the low bits) does not use.
fn fingerprint(hash: u64) -> u32 {
    (hash >> 32) as u32
}

impl Sketch {
    /// A sketch for a store of at most `max_keys` keys: [`SLOTS_PER_KEY`] slots per key (rounded up
    /// to a power of two, between 2^14 and 2^22), so 64 bytes per capped key, 256 KiB to 64 MiB.
    pub(super) fn new(max_keys: usize) -> Self {
        let slots = max_keys
            .saturating_mul(SLOTS_PER_KEY)
            .clamp(MIN_SLOTS, MAX_SLOTS)
            .next_power_of_two();
        Self {
            buckets: OnceLock::new(),
            len: slots / WAYS,
            live_until: AtomicU64::new(0),
        }
    }

    /// Bytes taken by the slots (0 until the first record).
    pub(super) fn bytes(&self) -> usize {
        self.buckets
            .get()
            .map_or(0, |b| b.len() * WAYS * SLOT_BYTES)
    }

    fn bucket(&self, hash: u64) -> usize {
        (hash & (self.len as u64 - 1)) as usize
    }

    /// Records `spent` of the quota hashed to `hash`, at `now`.
    pub(super) fn record(&self, hash: u64, spent: Spent, now: u64) {
        if spent.until <= now {
            return;
        }
        let buckets = self.buckets.get_or_init(|| {
            (0..self.len)
                .map(|_| Mutex::new([Slot::default(); WAYS]))
                .collect()
        });
        let Some(bucket) = buckets.get(self.bucket(hash)) else {
            return;
        };
        let fp = fingerprint(hash);
        let mut slots = bucket.lock();
        if let Some(own) = slots
            .iter_mut()
            .find(|s| s.until > now && s.fingerprint == fp)
        {
            // The key's own record, live when the key came back: its state was restored from it,
            // so a summary that counts as long includes it. Kept as a maximum otherwise (never
            // less), but not across windows: a record that outlived its window would charge the
            // key's old window's spend to every later one.
            *own = if spent.until >= own.until {
                Slot::new(fp, spent)
            } else {
                Slot::new(
                    fp,
                    Spent {
                        units: own.units().max(spent.units),
                        until: own.until,
                        rank: own.rank().max(spent.rank),
                    },
                )
            };
        } else {
            // A free slot, else the least spent share (the earliest to expire among equals), if
            // the new record is more spent: among equals the record held first stays, so a flood
            // as spent as a key cannot push it out either.
            let Some(victim) = slots.iter_mut().min_by_key(|s| {
                if s.until <= now {
                    (0, 0)
                } else {
                    (u16::from(s.rank()) + 1, s.until)
                }
            }) else {
                return;
            };
            if victim.until > now && victim.rank() >= spent.rank {
                return;
            }
            *victim = Slot::new(fp, spent);
        }
        drop(slots);
        self.live_until.fetch_max(spent.until, Ordering::Relaxed);
    }

    /// Drops the record of the quota hashed to `hash` (the key was reset: its next request is a new
    /// key's, whether it is held or not).
    pub(super) fn clear(&self, hash: u64, now: u64) {
        if self.live_until.load(Ordering::Relaxed) <= now {
            return;
        }
        let Some(bucket) = self.buckets.get().and_then(|b| b.get(self.bucket(hash))) else {
            return;
        };
        let fp = fingerprint(hash);
        for slot in bucket.lock().iter_mut() {
            if slot.fingerprint == fp {
                *slot = Slot::default();
            }
        }
    }

    /// What the quota hashed to `hash` spent, if its record still counts at `now`.
    #[inline]
    pub(super) fn lookup(&self, hash: u64, now: u64) -> Option<Spent> {
        if self.live_until.load(Ordering::Relaxed) <= now {
            return None;
        }
        let bucket = self.buckets.get()?.get(self.bucket(hash))?;
        let fp = fingerprint(hash);
        let slots = bucket.lock();
        slots
            .iter()
            .find(|s| s.until > now && s.fingerprint == fp)
            .map(|s| Spent {
                units: s.units(),
                until: s.until,
                rank: s.rank(),
            })
    }
}

/// How spent a share of its quota `units` (or a bucket's time until fresh) is, 0 to 255.
fn rank(state: &QuotaState, p: &Params, units: u64, until: u64, now: u64) -> u8 {
    let (part, whole) = match state {
        QuotaState::Gcra(_) => (
            until - now,
            p.emission.saturating_mul(p.burst.max(1)).max(1),
        ),
        _ => (units, p.limit.max(1)),
    };
    let share = u128::from(part) * 255 / u128::from(whole);
    u8::try_from(share).unwrap_or(u8::MAX)
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
    Some(Spent {
        units,
        until,
        rank: rank(state, p, units, until, now),
    })
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
mod tests;
