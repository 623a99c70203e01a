//! A front cache of keys known to be blocked, so that a flood against a blocked key is answered
//! without touching the map: no hash of the key beyond the one that routes it, no shard lock, no
//! write to memory another thread reads (two threads rejecting one hot key do not fight over a cache
//! line, and a rejection costs no more than an admission).
//!
//! Each slot holds a key's fingerprint (its routing hash, keyed by a random seed, mixed with its
//! table), the time the rejection was seen, and the absolute times the rejection's `reset_after`
//! and `retry_after` point at. Until `retry_at` every request of cost 1 is rejected with those
//! times: checks only ever consume, so the state can only move further from room. What gives room
//! back early (a refund, a reset) bumps a generation that every slot carries; a slot from an older
//! generation is a miss. Slots are written under a sequence number (a seqlock), so a reader never
//! sees half of one write.
//!
//! A bitmap of the slots that may hold a live rejection (512 bytes, one bit per slot) is read first:
//! when nothing is blocked, as under allow-heavy traffic, a lookup touches those eight cache lines
//! instead of a random line of the 192 KiB of slots. A bit is set after its slot is written, and
//! every bit is cleared when the generation moves (every slot is then stale); a bit lost to a race
//! only costs a miss (the map answers), never a wrong answer. (Bits are not cleared when a slot's
//! rejection is over: after a clock step back it still answers for its time.)

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use crate::strategy::Verdict;

/// Slots in the cache (a power of two).
const SLOTS: usize = 4096;

/// One cached rejection (48 bytes: 192 KiB for the cache).
#[derive(Debug, Default)]
struct Slot {
    /// Odd while a writer fills the slot.
    seq: AtomicU64,
    fingerprint: AtomicU64,
    generation: AtomicU64,
    since: AtomicU64,
    retry_at: AtomicU64,
    reset_at: AtomicU64,
}

/// The cache of blocked keys of one store.
#[derive(Debug)]
pub(super) struct BlockedCache {
    /// Allocated by the first rejection cached: a store that never rejects (most limits of a
    /// large rules file, at first) does not hold 192 KiB of empty slots.
    slots: OnceLock<Box<[Slot]>>,
    /// One bit per slot: set when it may hold a live rejection (in the struct: no pointer to
    /// follow, no bounds to check).
    live: [AtomicU64; SLOTS / 64],
    /// Whether any bit of `live` may be set (a refund on every request then clears nothing).
    any_live: AtomicBool,
    generation: AtomicU64,
}

/// A miss, and what a later [`BlockedCache::insert`] needs from the moment it happened.
#[derive(Clone, Copy, Debug)]
pub(super) struct Miss {
    generation: u64,
}

impl Default for BlockedCache {
    fn default() -> Self {
        Self {
            slots: OnceLock::new(),
            live: std::array::from_fn(|_| AtomicU64::new(0)),
            any_live: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        }
    }
}

impl BlockedCache {
    #[inline]
    fn slot(slots: &[Slot], fingerprint: u64) -> Option<&Slot> {
        // The low bits route the key to its segment; the high bits pick the slot.
        slots.get((fingerprint >> 48) as usize & (SLOTS - 1))
    }

    /// The rejection of a request of cost 1 at `now` if the key is known to be blocked, with
    /// `limit()` as the reported limit (asked on a hit only); otherwise a miss to insert with.
    #[inline]
    pub(super) fn lookup(
        &self,
        fingerprint: u64,
        now: u64,
        limit: impl FnOnce() -> u64,
    ) -> Result<Verdict, Miss> {
        // Read the generation before the state is read (by the caller, after a miss): a refund
        // that lands after this read bumps it, so an insert from this miss is never a hit.
        let generation = self.generation.load(Ordering::Acquire);
        let miss = Err(Miss { generation });
        let (word, bit) = self.live_bit(fingerprint);
        if word.is_none_or(|w| w.load(Ordering::Relaxed) & bit == 0) {
            return miss;
        }
        // A live bit is set only after the slots were allocated.
        let Some(slot) = self.slots.get().and_then(|s| Self::slot(s, fingerprint)) else {
            return miss;
        };
        let seq = slot.seq.load(Ordering::Acquire);
        if slot.fingerprint.load(Ordering::Relaxed) != fingerprint {
            return miss;
        }
        let slot_generation = slot.generation.load(Ordering::Relaxed);
        let since = slot.since.load(Ordering::Relaxed);
        let retry_at = slot.retry_at.load(Ordering::Relaxed);
        let reset_at = slot.reset_at.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let torn = seq & 1 == 1 || slot.seq.load(Ordering::Relaxed) != seq;
        // Before `since` the clock went back: the times would not be the state's answer.
        if torn || slot_generation != generation || now < since || now >= retry_at {
            return miss;
        }
        Ok(Verdict::rejected(
            limit(),
            0,
            reset_at.saturating_sub(now),
            retry_at - now,
        ))
    }

    /// Records the rejection `v` of a request of cost 1 at `now`, seen after `miss`.
    pub(super) fn insert(&self, fingerprint: u64, miss: Miss, now: u64, v: &Verdict) {
        let slots = self
            .slots
            .get_or_init(|| (0..SLOTS).map(|_| Slot::default()).collect());
        let Some(slot) = Self::slot(slots, fingerprint) else {
            return;
        };
        let seq = slot.seq.load(Ordering::Relaxed);
        // Another writer holds the slot, or took it since: skip (a cache, not a record).
        if seq & 1 == 1
            || slot
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        slot.fingerprint.store(fingerprint, Ordering::Relaxed);
        slot.generation.store(miss.generation, Ordering::Relaxed);
        slot.since.store(now, Ordering::Relaxed);
        slot.retry_at
            .store(now.saturating_add(v.retry_after), Ordering::Relaxed);
        slot.reset_at
            .store(now.saturating_add(v.reset_after), Ordering::Relaxed);
        slot.seq.store(seq + 2, Ordering::Release);
        let (word, bit) = self.live_bit(fingerprint);
        if let Some(w) = word {
            w.fetch_or(bit, Ordering::Relaxed);
        }
        if !self.any_live.load(Ordering::Relaxed) {
            self.any_live.store(true, Ordering::Relaxed);
        }
    }

    /// The bitmap word and bit of the slot of `fingerprint`.
    #[inline]
    fn live_bit(&self, fingerprint: u64) -> (Option<&AtomicU64>, u64) {
        let i = (fingerprint >> 48) as usize & (SLOTS - 1);
        (self.live.get(i / 64), 1 << (i % 64))
    }

    /// Forgets every cached rejection: some key got room back before its time.
    pub(super) fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::Release);
        // Nothing to clear unless a rejection was cached since; then written only where set.
        if !self.any_live.load(Ordering::Relaxed) || !self.any_live.swap(false, Ordering::Relaxed) {
            return;
        }
        for w in &self.live {
            if w.load(Ordering::Relaxed) != 0 {
                w.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_rejection_is_found_until_an_invalidation_and_again_after_a_new_insert() {
        let cache = BlockedCache::default();
        assert!(
            cache.slots.get().is_none(),
            "no slots before a rejection is cached"
        );
        let v = Verdict::rejected(5, 0, 10, 10);
        let key = 0xabcd_0000_0000_0001;
        let miss = cache.lookup(key, 100, || 5).unwrap_err();
        cache.insert(key, miss, 100, &v);
        assert_eq!(cache.lookup(key, 105, || 5).unwrap().retry_after, 5);
        // A key whose slot bit is clear misses without reading its slot.
        assert!(cache.lookup(0x1234_0000_0000_0001, 105, || 5).is_err());
        cache.invalidate();
        assert!(cache.live.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        let miss = cache.lookup(key, 105, || 5).unwrap_err();
        cache.insert(key, miss, 105, &v);
        assert_eq!(cache.lookup(key, 106, || 5).unwrap().retry_after, 9);
        // Over at its retry time.
        assert!(cache.lookup(key, 115, || 5).is_err());
    }
}
