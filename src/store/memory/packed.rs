//! Packed per-key state: a one-quota rule of the clock-aligned fixed window, the sliding window
//! counter or the buckets (GCRA) fits in one `u64`, read and updated by compare-and-swap.
//!
//! Why: a key then costs what governor's does (an 8-byte value next to the key), a check needs only
//! the map's read lock (threads on one hot key do not queue on a write lock), and a rejection writes
//! nothing. The arithmetic stays in `crate::strategy`: a word is unpacked into the strategy's state,
//! stepped, and packed again.
//!
//! Layout: bit 63 is the second-chance bit (set on use, cleared by eviction); the rest holds the state.
//! Window starts are stored as window indices (`start / W`, exact because windows are clock-aligned),
//! counts in as many bits as the limit needs. A rule is packed only when every state it can reach at a
//! time below [`NOW_LIMIT`] fits; later times use the general entries.

use std::sync::atomic::{AtomicU64, Ordering};

use super::sketch::{self, Sketch};
use super::table::{Look, nearness};
use crate::decision::Outcome;
use crate::rule::Rule;
use crate::strategy::{
    self, FixedWindow, Gcra, Op, Params, QuotaState, SlidingWindow, Strategy, Verdict,
};

/// The second-chance bit.
pub(crate) const USED: u64 = 1 << 63;
/// Packed state serves times below this (2^62 ns: the year 2116); a GCRA TAT stays below 2^63.
pub(crate) const NOW_LIMIT: u64 = 1 << 62;

/// Where the fields of a packed word are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// `index << count_bits | count`.
    Fixed { count_bits: u32 },
    /// `index << 2 * count_bits | cur << count_bits | prev`.
    Sliding { count_bits: u32 },
    /// The TAT.
    Gcra,
}

/// A one-quota rule whose states fit in a word, and how they are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedRule {
    strategy: Strategy,
    params: Params,
    layout: Layout,
    /// The scope's tag ([`Scope::tag`](crate::store::Scope::tag)): a table holds one scope's
    /// states, and an evicted key's record in the sketch is found by it.
    tag: u64,
}

/// A word that can be loaded and compared-and-swapped: `AtomicU64`, or a model checker's.
pub(crate) trait Cell {
    /// The current word.
    fn load(&self) -> u64;
    /// Replaces `current` by `new`; on failure returns the word found.
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64>;
}

// Relaxed is enough: the word is the whole state, nothing else is published through it, and
// read-modify-writes of one location are totally ordered.
impl Cell for AtomicU64 {
    #[inline]
    fn load(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }

    #[inline]
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed)
    }
}

/// Bits needed for counts up to `limit`.
fn bits_for(limit: u64) -> u32 {
    u64::BITS - limit.leading_zeros()
}

impl PackedRule {
    /// The packed form of `rule`, if it has one quota of a packable strategy and its states fit.
    pub(crate) fn for_rule(rule: &Rule) -> Option<Self> {
        let &[params] = rule.nanos() else {
            return None;
        };
        // Window starts are packed as multiples of W: shifted windows (a window offset) are not.
        if params.offset != 0 {
            return None;
        }
        let strategy = rule.strategy();
        // The largest window index any time below NOW_LIMIT can have must fit in `index_bits`.
        let fits = |index_bits: u32| {
            index_bits >= 1 && ((NOW_LIMIT - 1) / params.window) >> index_bits.min(63) == 0
        };
        let layout = match strategy {
            Strategy::FixedWindow => {
                let count_bits = bits_for(params.limit);
                fits(63 - count_bits).then_some(Layout::Fixed { count_bits })?
            }
            Strategy::SlidingWindow => {
                let count_bits = bits_for(params.limit);
                fits(63u32.checked_sub(2 * count_bits)?)
                    .then_some(Layout::Sliding { count_bits })?
            }
            // TAT <= max(now, TAT) + tau stays below 2^63 while now < 2^62 and tau < 2^62.
            Strategy::TokenBucket | Strategy::LeakyBucket => {
                (params.tau() < NOW_LIMIT).then_some(Layout::Gcra)?
            }
            // First-hit windows start at any nanosecond and moving windows hold a log: too big.
            _ => return None,
        };
        Some(Self {
            strategy,
            params,
            layout,
            tag: rule.tag(),
        })
    }

    /// The count bits of a window layout (0 for the buckets).
    #[inline(always)]
    fn count_bits(&self) -> u32 {
        match self.layout {
            Layout::Fixed { count_bits } | Layout::Sliding { count_bits } => count_bits,
            Layout::Gcra => 0,
        }
    }

    /// The time before which the state in `word` answers as at that time (a clock that went back
    /// is clamped to it): the window or bucket start, or `TAT - B*T`. Checks only move it forward.
    pub(crate) fn time_floor(&self, word: u64) -> u64 {
        match self.unpack(word) {
            QuotaState::Fixed(s) => s.parts().0,
            QuotaState::Sliding(s) => s.parts().0,
            QuotaState::Gcra(s) => s.tat().saturating_sub(self.params.tau()),
            QuotaState::Moving(_) => u64::MAX,
        }
    }

    /// The limit a verdict reports: the burst for the buckets, `N` for the windows.
    #[inline]
    pub(crate) fn reported_limit(&self) -> u64 {
        match self.layout {
            Layout::Gcra => self.params.burst,
            _ => self.params.limit,
        }
    }

    /// This packed rule for the scope of tag `tag`.
    pub(crate) fn scoped(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// Whether `rule` in the scope of tag `tag` is what this was made from.
    #[inline]
    pub(crate) fn matches(&self, rule: &Rule, tag: u64) -> bool {
        self.tag == tag && self.strategy == rule.strategy() && rule.nanos() == [self.params]
    }

    /// The state in `word` (the second-chance bit ignored).
    #[inline]
    fn unpack(&self, word: u64) -> QuotaState {
        let word = word & !USED;
        let w = self.params.window;
        match self.layout {
            Layout::Fixed { count_bits } => {
                let count = word & ((1 << count_bits) - 1);
                QuotaState::Fixed(FixedWindow::from_parts((word >> count_bits) * w, count))
            }
            Layout::Sliding { count_bits } => {
                let mask = (1 << count_bits) - 1;
                let prev = (word & mask) as u32;
                let cur = ((word >> count_bits) & mask) as u32;
                let bucket = (word >> (2 * count_bits)) * w;
                QuotaState::Sliding(SlidingWindow::from_parts(bucket, cur, prev))
            }
            Layout::Gcra => QuotaState::Gcra(Gcra::from_tat(word)),
        }
    }

    /// `state` as a word without the second-chance bit. Every state reachable below [`NOW_LIMIT`]
    /// fits (see [`PackedRule::for_rule`]); a field that would not is saturated, which errs on the
    /// side of rejecting.
    #[inline]
    fn pack(&self, state: &QuotaState) -> u64 {
        let w = self.params.window;
        let word = match (self.layout, state) {
            (Layout::Fixed { count_bits }, QuotaState::Fixed(s)) => {
                let (start, count) = s.parts();
                ((start / w) << count_bits) | count.min((1 << count_bits) - 1)
            }
            (Layout::Sliding { count_bits }, QuotaState::Sliding(s)) => {
                let (bucket, cur, prev) = s.parts();
                let max = (1 << count_bits) - 1;
                ((bucket / w) << (2 * count_bits))
                    | (u64::from(cur).min(max) << count_bits)
                    | u64::from(prev).min(max)
            }
            (Layout::Gcra, QuotaState::Gcra(s)) => s.tat(),
            // Unreachable: `unpack` builds the variant of the layout.
            _ => 0,
        };
        word.min(!USED)
    }

    /// Applies `op` to the state in `cell` at `now` (below [`NOW_LIMIT`]), retrying until its
    /// compare-and-swap wins. Nothing is written when the state did not change (a rejection, a peek
    /// of a key already marked used).
    #[inline]
    pub(crate) fn apply(&self, cell: &impl Cell, op: Op, now: u64) -> Verdict {
        // One loop per layout for checks, so that the hot path does not dispatch on the state's kind.
        match (self.layout, op) {
            (Layout::Gcra, Op::Check(cost)) => self.check_as::<Gcra>(cell, cost, now),
            (Layout::Fixed { .. }, Op::Check(cost)) => {
                self.check_as::<FixedWindow>(cell, cost, now)
            }
            (Layout::Sliding { .. }, Op::Check(cost)) => {
                self.check_as::<SlidingWindow>(cell, cost, now)
            }
            _ => self.update(cell, op, now),
        }
    }

    /// A check of `cost` on a state of kind `S`: check, then commit if admitted.
    #[inline(always)]
    fn check_as<S: Packable>(&self, cell: &impl Cell, cost: u32, now: u64) -> Verdict {
        let cost = u64::from(cost);
        swap_loop(cell, |word| {
            let mut state = S::unpack(self, word);
            let v = state.check(self, now, cost);
            if v.outcome == Outcome::Allowed && cost > 0 {
                state.commit(self, now, cost);
            }
            (state.pack(self), v)
        })
    }

    /// Any other operation, through the general state (rare: peeks, refunds, resets).
    fn update(&self, cell: &impl Cell, op: Op, now: u64) -> Verdict {
        let params = std::slice::from_ref(&self.params);
        swap_loop(cell, |word| {
            let mut state = self.unpack(word);
            let states = std::slice::from_mut(&mut state);
            let verdict = strategy::apply(states, self.strategy, params, now, op).1;
            (self.pack(&state), verdict)
        })
    }

    /// Whether the state in `word` equals a new key's at `now`.
    pub(crate) fn is_fresh(&self, word: u64, now: u64) -> bool {
        let fresh_at = self.unpack(word).fresh_at(&self.params);
        fresh_at <= now && fresh_at != u64::MAX
    }

    /// Until when the key in `word` has no room for a request of cost 1 (0: it has room now).
    #[cfg(any(tollgate_loom, shuttle))]
    pub(crate) fn blocked_until(&self, word: u64, now: u64) -> u64 {
        let mut state = self.unpack(word);
        let v = state.check(self.strategy, &self.params, now, 1);
        if v.outcome == Outcome::Allowed {
            0
        } else {
            now.saturating_add(v.retry_after.max(1))
        }
    }
}

impl PackedRule {
    /// How the key in `word` looks to eviction at `now`.
    pub(super) fn look(&self, word: u64, now: u64) -> Look {
        let mut state = self.unpack(word);
        let fresh_at = state.fresh_at(&self.params);
        if fresh_at <= now && fresh_at != u64::MAX {
            return Look::Fresh;
        }
        let v = state.check(self.strategy, &self.params, now, 1);
        if v.outcome == Outcome::Allowed {
            // `remaining` is after the request of cost 1 the check was for.
            Look::Room(nearness(v.limit, v.remaining + 1, word & USED != 0))
        } else {
            Look::Blocked(now.saturating_add(v.retry_after.max(1)))
        }
    }

    /// The strategy state in `word` (handed over to a general entry at the end of packed time).
    pub(super) fn state_of(&self, word: u64) -> QuotaState {
        self.unpack(word)
    }

    /// Folds what the key in `word` has spent into `sketch` (it is being evicted).
    pub(super) fn forget(&self, word: u64, key_hash: u64, now: u64, sketch: &Sketch) {
        if let Some(spent) = sketch::summary(&self.unpack(word), &self.params, now) {
            sketch.record(sketch::quota_hash(key_hash, self.tag, 0), spent, now);
        }
    }

    /// The word a new key starts with at `now` (below [`NOW_LIMIT`]): a new key's, or at least as
    /// spent as what `sketch` recalls of it.
    #[inline]
    pub(super) fn recall(&self, sketch: &Sketch, key_hash: u64, now: u64) -> u64 {
        match sketch.lookup(sketch::quota_hash(key_hash, self.tag, 0), now) {
            None => 0,
            Some(mut spent) => {
                // A saturated record ("for good") within what a word holds: a TAT below 2^63, a
                // window starting below NOW_LIMIT. Still no earlier than any state reachable now.
                spent.until = spent.until.min(match self.layout {
                    Layout::Gcra => !USED,
                    _ => (NOW_LIMIT - 1).saturating_add(self.params.window),
                });
                let state = sketch::restore(self.strategy, &self.params, spent, now);
                self.pack(&state) | USED
            }
        }
    }
}

/// Runs `step` on the word in `cell` (it returns the new state without the second-chance bit, and
/// the verdict) until its compare-and-swap wins; writes nothing when the word would not change.
#[inline(always)]
fn swap_loop(cell: &impl Cell, mut step: impl FnMut(u64) -> (u64, Verdict)) -> Verdict {
    let mut word = cell.load();
    loop {
        let (state, verdict) = step(word);
        let new = state.min(!USED) | USED;
        if new == word {
            return verdict;
        }
        match cell.compare_exchange(word, new) {
            Ok(_) => return verdict,
            Err(found) => word = found,
        }
    }
}

/// A strategy state that packs into a word under a [`PackedRule`], with its check and commit.
trait Packable: Sized {
    fn unpack(rule: &PackedRule, word: u64) -> Self;
    /// The word without the second-chance bit (the caller saturates it below that bit).
    fn pack(&self, rule: &PackedRule) -> u64;
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict;
    fn commit(&mut self, rule: &PackedRule, now: u64, cost: u64);
}

impl Packable for Gcra {
    #[inline(always)]
    fn unpack(_: &PackedRule, word: u64) -> Self {
        Gcra::from_tat(word & !USED)
    }

    #[inline(always)]
    fn pack(&self, _: &PackedRule) -> u64 {
        self.tat()
    }

    #[inline(always)]
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict {
        Gcra::check(self, &rule.params, now, cost)
    }

    #[inline(always)]
    fn commit(&mut self, rule: &PackedRule, now: u64, cost: u64) {
        Gcra::commit(self, &rule.params, now, cost);
    }
}

impl Packable for FixedWindow {
    #[inline(always)]
    fn unpack(rule: &PackedRule, word: u64) -> Self {
        let count_bits = rule.count_bits();
        let word = word & !USED;
        let count = word & ((1 << count_bits) - 1);
        FixedWindow::from_parts((word >> count_bits) * rule.params.window, count)
    }

    #[inline(always)]
    fn pack(&self, rule: &PackedRule) -> u64 {
        rule.pack(&QuotaState::Fixed(*self))
    }

    #[inline(always)]
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict {
        FixedWindow::check(self, &rule.params, now, cost, true)
    }

    #[inline(always)]
    fn commit(&mut self, _: &PackedRule, now: u64, cost: u64) {
        FixedWindow::commit(self, now, cost, true);
    }
}

impl Packable for SlidingWindow {
    #[inline(always)]
    fn unpack(rule: &PackedRule, word: u64) -> Self {
        match rule.unpack(word) {
            QuotaState::Sliding(s) => s,
            _ => SlidingWindow::default(),
        }
    }

    #[inline(always)]
    fn pack(&self, rule: &PackedRule) -> u64 {
        rule.pack(&QuotaState::Sliding(*self))
    }

    #[inline(always)]
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict {
        SlidingWindow::check(self, &rule.params, now, cost)
    }

    #[inline(always)]
    fn commit(&mut self, _: &PackedRule, _now: u64, cost: u64) {
        SlidingWindow::commit(self, cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn which_rules_pack() {
        let packs = |s: Strategy, q: &str| PackedRule::for_rule(&Rule::parse(s, q).unwrap());
        assert!(packs(Strategy::FixedWindow, "100/minute").is_some());
        assert!(packs(Strategy::SlidingWindow, "100/minute").is_some());
        assert!(packs(Strategy::TokenBucket, "10/s").is_some());
        assert!(packs(Strategy::LeakyBucket, "10/s").is_some());
        assert!(packs(Strategy::FixedWindowFirstHit, "10/s").is_none());
        assert!(packs(Strategy::MovingWindow, "10/s").is_none());
        assert!(packs(Strategy::FixedWindow, "1/s; 10/minute").is_none());
        // 2^32 - 1 per millisecond: 32 count bits leave 31 index bits, too few for 2^62 ns / 1 ms.
        assert!(packs(Strategy::FixedWindow, "4294967295/ms").is_none());
        assert!(packs(Strategy::SlidingWindow, "100000/s").is_none());
        assert!(packs(Strategy::SlidingWindow, "10000/s").is_some());
    }

    #[test]
    fn words_round_trip_every_reachable_state() {
        for (strategy, q) in [
            (Strategy::FixedWindow, "3/s"),
            (Strategy::SlidingWindow, "3/s"),
            (Strategy::TokenBucket, "3/s"),
            (Strategy::FixedWindow, "65535/day"),
        ] {
            let rule = Rule::parse(strategy, q).unwrap();
            let packed = PackedRule::for_rule(&rule).unwrap();
            let mut reference = vec![QuotaState::new(strategy)];
            let cell = AtomicU64::new(0);
            let mut now = NOW_LIMIT - 50 * S;
            for i in 0..2000u64 {
                now += (i * 7919) % (S / 3);
                let op = if i % 11 == 0 {
                    Op::Settle {
                        reserved: 1,
                        actual: 0,
                        at: now,
                    }
                } else {
                    Op::Check(1)
                };
                let got = packed.apply(&cell, op, now);
                let (_, want) = strategy::apply(&mut reference, strategy, rule.nanos(), now, op);
                assert_eq!(got, want, "{strategy} {q} step {i}");
                assert_eq!(packed.unpack(cell.load(Ordering::Relaxed)), reference[0]);
            }
        }
    }
}
