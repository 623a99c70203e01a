//! Packed per-key state: a one-quota rule of the fixed windows (clock-aligned or first-hit), the
//! sliding window counter or the buckets (GCRA) fits in one `u64`, read and updated by
//! compare-and-swap.
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
//!
//! Windows whose absolute index and counts do not fit (large limits, short windows) store the index
//! on a ring ([`Ring`](layout::Ring): how far behind and ahead it reads, and what the sweep does
//! after a gap); a first-hit window's start is stored rounded up to a grain
//! ([`FirstHit`](packable::FirstHit)). Both are stricter than the exact strategy, never more
//! lenient; the guide's [stores](crate::guide::stores) chapter gives the bounds users see.

use std::sync::atomic::{AtomicU64, Ordering};

use super::sketch::{self, Sketch};
use super::table::{Look, nearness};
use crate::decision::Outcome;
use crate::rule::Rule;
use crate::strategy::{
    self, FIRST_HIT_SPAN, FixedWindow, Gcra, Op, Params, QuotaState, SlidingWindow, Strategy,
    Verdict, bits_for,
};

mod layout;
mod packable;

use layout::{Hit, Layout, Ring};
pub(super) use packable::check_words;
use packable::{
    FirstHit, Packable, pack_fixed, pack_sliding, swap_loop, unpack_fixed, unpack_sliding,
};

/// The second-chance bit.
pub(crate) const USED: u64 = 1 << 63;
/// Packed state serves times below this (2^62 ns: the year 2116); a GCRA TAT stays below 2^63.
pub(crate) const NOW_LIMIT: u64 = 1 << 62;
/// The least time a ring of window indices spans: two days (so 6 hours ahead, 42 hours behind).
pub(crate) const RING_SPAN: u64 = FIRST_HIT_SPAN;
/// The fewest bits of a ring.
const MIN_RING_BITS: u32 = 8;

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
        let ring = Ring::for_window(params.window);
        let layout = match strategy {
            Strategy::FixedWindow => {
                let count_bits = bits_for(params.limit);
                let index_bits = 63u32.checked_sub(count_bits)?;
                // The ring takes every index bit: the larger it is, the older a state it reads right.
                let ring = if fits(index_bits) {
                    Ring::WHOLE
                } else {
                    (index_bits >= ring.bits).then_some(Ring::new(index_bits))?
                };
                Layout::Fixed { count_bits, ring }
            }
            Strategy::SlidingWindow => {
                let count_bits = bits_for(params.limit);
                match 63u32.checked_sub(2 * count_bits) {
                    Some(index_bits) if fits(index_bits) => Layout::Sliding {
                        count_bits,
                        prev_shift: 0,
                        ring: Ring::WHOLE,
                    },
                    // The ring, and the previous count rounded up if still needed (keeping it one
                    // bit at least).
                    _ => {
                        let prev_shift = (2 * count_bits + ring.bits).saturating_sub(63);
                        (prev_shift < count_bits).then_some(Layout::Sliding {
                            count_bits,
                            prev_shift,
                            ring: Ring::new(63 - (2 * count_bits - prev_shift)),
                        })?
                    }
                }
            }
            // TAT <= max(now, TAT) + tau stays below 2^63 while now < 2^62 and tau < 2^62.
            Strategy::TokenBucket | Strategy::LeakyBucket => {
                (params.tau() < NOW_LIMIT).then_some(Layout::Gcra)?
            }
            // A first-hit window starts at any nanosecond: see `Hit`.
            Strategy::FixedWindowFirstHit => Layout::FirstHit(Hit::new(&params)?),
            // Moving windows hold a log: too big.
            _ => return None,
        };
        Some(Self {
            strategy,
            params,
            layout,
            tag: rule.tag(),
        })
    }

    /// The time before which the state in `word` answers as at that time (a clock that went back
    /// is clamped to it): the window or bucket start, or `TAT - B*T`. Checks only move it forward.
    pub(crate) fn time_floor(&self, word: u64, now: u64) -> u64 {
        match self.unpack(word, now) {
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

    /// The scope's tag.
    pub(super) fn tag(&self) -> u64 {
        self.tag
    }

    /// The rule's one quota as held: its strategy, quota and the state in `word` at `now`.
    pub(super) fn held(&self, word: u64, now: u64) -> crate::strategy::Held {
        crate::strategy::Held {
            strategy: self.strategy,
            params: self.params,
            state: self.unpack(word, now),
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

    /// The state in `word` (the second-chance bit ignored), read at `now`.
    #[inline]
    pub(super) fn unpack(&self, word: u64, now: u64) -> QuotaState {
        let word = word & !USED;
        let w = self.params.window;
        match self.layout {
            Layout::Fixed { count_bits, ring } => {
                QuotaState::Fixed(unpack_fixed(word, count_bits, ring, w, now))
            }
            Layout::Sliding {
                count_bits,
                prev_shift,
                ring,
            } => QuotaState::Sliding(unpack_sliding(word, count_bits, prev_shift, ring, w, now)),
            Layout::FirstHit(hit) => QuotaState::Fixed(hit.unpack(word, now)),
            Layout::Gcra => QuotaState::Gcra(Gcra::from_tat(word)),
        }
    }

    /// `state` as a word without the second-chance bit. Every state reachable below [`NOW_LIMIT`]
    /// fits (see [`PackedRule::for_rule`]); a field that would not is saturated, which errs on the
    /// side of rejecting.
    #[inline]
    pub(super) fn pack(&self, state: &QuotaState) -> u64 {
        let w = self.params.window;
        let word = match (self.layout, state) {
            (Layout::Fixed { count_bits, ring }, QuotaState::Fixed(s)) => {
                pack_fixed(s, count_bits, ring, w)
            }
            (
                Layout::Sliding {
                    count_bits,
                    prev_shift,
                    ring,
                },
                QuotaState::Sliding(s),
            ) => pack_sliding(s, count_bits, prev_shift, ring, w),
            (Layout::FirstHit(hit), QuotaState::Fixed(s)) => hit.pack(s),
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
            (Layout::FirstHit(_), Op::Check(cost)) => self.check_as::<FirstHit>(cell, cost, now),
            _ => self.update(cell, op, now),
        }
    }

    /// A check of `cost` on a state of kind `S`: check, then commit if admitted.
    #[inline(always)]
    fn check_as<S: Packable>(&self, cell: &impl Cell, cost: u32, now: u64) -> Verdict {
        let cost = u64::from(cost);
        swap_loop(cell, |word| {
            let mut state = S::unpack(self, word, now);
            let v = state.check(self, now, cost);
            if v.outcome == Outcome::Allowed && cost > 0 {
                state.commit(self, now, cost);
                return (state.pack(self), state.honest(self, v, now));
            }
            let v = state.honest(self, v, now);
            let new = state.pack(self);
            let rounds = self.rounds_counts() && S::unpack(self, new, now) != state;
            (self.unspent(word, new, rounds), v)
        })
    }

    /// Any other operation, through the general state (rare: peeks, refunds, resets).
    fn update(&self, cell: &impl Cell, op: Op, now: u64) -> Verdict {
        let params = std::slice::from_ref(&self.params);
        swap_loop(cell, |word| {
            let mut state = self.unpack(word, now);
            let op = self.charge_in_rounded_window(op, &state);
            let states = std::slice::from_mut(&mut state);
            let verdict = strategy::apply(states, self.strategy, params, now, op).1;
            let verdict = self.honest(verdict, &state, now);
            let new = self.pack(&state);
            if matches!(op, Op::Peek) {
                let rounds = self.rounds_counts() && self.unpack(new, now) != state;
                return (self.unspent(word, new, rounds), verdict);
            }
            (new, verdict)
        })
    }

    /// A settlement that charges more than was reserved, on a first-hit window held with its start
    /// rounded up (`state`): a reservation made in the window's first grain, before the start as
    /// held, is charged to the window (its charge was dropped as if from the window before: more
    /// lenient). A refund keeps its time: dropped there, it only stays spent.
    #[inline]
    fn charge_in_rounded_window(&self, op: Op, state: &QuotaState) -> Op {
        match (self.layout, op, state) {
            (
                Layout::FirstHit(hit),
                Op::Settle {
                    reserved,
                    actual,
                    at,
                    bound,
                },
                QuotaState::Fixed(w),
            ) if hit.grain_bits > 0 && actual > reserved => {
                let (start, _) = w.parts();
                let grain = 1u64 << hit.grain_bits;
                let at = if at < start && start - at < grain {
                    start
                } else {
                    at
                };
                Op::Settle {
                    reserved,
                    actual,
                    at,
                    bound,
                }
            }
            _ => op,
        }
    }

    /// The word to keep after an operation that spent nothing (a peek, a rejection, a check of
    /// cost 0): `new`, the state rolled to `now`, unless writing it `rounds` a count (a sliding
    /// window's previous count is held rounded up): then `word` as it was, so that a peek and the
    /// check after it answer alike and a request that spent nothing changes nothing.
    #[inline]
    fn unspent(&self, word: u64, new: u64, rounds: bool) -> u64 {
        if rounds { word & !USED } else { new }
    }

    /// Whether the layout holds a count rounded (a sliding window's previous count): only then
    /// can re-packing a state change what it answers.
    #[inline(always)]
    pub(super) fn rounds_counts(&self) -> bool {
        matches!(self.layout, Layout::Sliding { prev_shift, .. } if prev_shift > 0)
    }

    /// `v`, answered on `state` at `now`, with its times pointing at a rounded first-hit window's
    /// end (see [`Hit::honest`]); other layouts: `v`.
    #[inline]
    fn honest(&self, v: Verdict, state: &QuotaState, now: u64) -> Verdict {
        match (self.layout, state) {
            (Layout::FirstHit(hit), QuotaState::Fixed(s)) => hit.honest(v, s, now),
            _ => v,
        }
    }

    /// Whether the layout keeps a time on a ring (read relative to now): a first-hit start, or a
    /// window index too large to keep whole.
    pub(super) fn keeps_a_ring(&self) -> bool {
        match self.layout {
            Layout::Fixed { ring, .. } | Layout::Sliding { ring, .. } => ring.bits != 0,
            Layout::FirstHit(_) => true,
            Layout::Gcra => false,
        }
    }

    /// Whether the state in `word` equals a new key's at `now`. With `read_at` before `now` (the
    /// catch-up sweep after a gap, `read_at` the last step before it): the word may have been
    /// written before the gap (read right as of `read_at`) or by a decision since (read right as of
    /// `now`); it is dropped only when it is fresh read as of `read_at` and, read as of `now`,
    /// fresh too or starting well after `now` (a ring time older than 7/8 of its ring). A state
    /// written since reads as of `now` as a recent one, neither: kept.
    pub(crate) fn is_fresh(&self, word: u64, read_at: u64, now: u64) -> bool {
        let fresh = |s: &QuotaState| {
            let at = s.fresh_at(&self.params);
            at <= now && at != u64::MAX
        };
        let then = self.unpack(word, read_at);
        if read_at >= now || !fresh(&then) {
            return fresh(&then);
        }
        // A state written since starts at most a rounded first-hit grain (< 1 s) after `now`, or
        // a little more from a thread whose clock reads ahead of this one's: a minute of slack.
        const SINCE: u64 = 60_000_000_000;
        let current = self.unpack(word, now);
        let starts = match current {
            QuotaState::Fixed(w) => w.parts().0,
            QuotaState::Sliding(w) => w.parts().0,
            QuotaState::Gcra(_) | QuotaState::Moving(_) => 0,
        };
        fresh(&current) || starts > now.saturating_add(SINCE)
    }

    /// Until when the key in `word` has no room for a request of cost 1 (0: it has room now).
    #[cfg(any(tollgate_loom, shuttle))]
    pub(crate) fn blocked_until(&self, word: u64, now: u64) -> u64 {
        let mut state = self.unpack(word, now);
        let v = state.check(self.strategy, &self.params, now, 1);
        let v = self.honest(v, &state, now);
        if v.outcome == Outcome::Allowed {
            0
        } else {
            now.saturating_add(v.retry_after.max(1))
        }
    }
}

impl PackedRule {
    /// The layout a packed table would give quota `i` of `rule` if it were a rule alone (a general
    /// entry holds each quota of a several-quota rule in such a word): `None` if that one-quota
    /// rule does not pack, or packs a time on a ring (a first-hit start, or a window index too
    /// large to keep whole): a several-quota rule's words stay exact under any clock step, where a
    /// ring is read relative to now (at most 1/8 of it ahead), so such a quota keeps two words.
    pub(super) fn for_quota(rule: &Rule, i: usize) -> Option<Self> {
        let quota = *rule.quotas().get(i)?;
        let one = Rule::new(rule.strategy(), [quota])
            .ok()?
            .with_window_offset(rule.window_offset());
        // The quota's own parameters, as `rule` has them.
        if one.nanos() != [*rule.nanos().get(i)?] {
            return None;
        }
        Self::for_rule(&one).filter(|p| !p.keeps_a_ring())
    }

    /// How the key in `word` looks to eviction at `now`.
    pub(super) fn look(&self, word: u64, now: u64) -> Look {
        let mut state = self.unpack(word, now);
        let fresh_at = state.fresh_at(&self.params);
        if fresh_at <= now && fresh_at != u64::MAX {
            return Look::Fresh;
        }
        let v = state.check(self.strategy, &self.params, now, 1);
        let v = self.honest(v, &state, now);
        if v.outcome == Outcome::Allowed {
            // `remaining` is after the request of cost 1 the check was for.
            Look::Room(nearness(v.limit, v.remaining + 1, word & USED != 0))
        } else {
            Look::Blocked(now.saturating_add(v.retry_after.max(1)))
        }
    }

    /// The strategy state in `word` (handed over to a general entry at the end of packed time).
    pub(super) fn state_of(&self, word: u64, now: u64) -> QuotaState {
        self.unpack(word, now)
    }

    /// Folds what the key in `word` has spent into `sketch` (it is being evicted).
    pub(super) fn forget(&self, word: u64, key_hash: u64, now: u64, sketch: &Sketch) {
        if let Some(spent) = sketch::summary(&self.unpack(word, now), &self.params, now) {
            sketch.record(sketch::quota_hash(key_hash, self.tag, 0), spent, now);
        }
    }

    /// Drops what `sketch` recalls of the key routed by `key_hash` (a reset).
    pub(super) fn clear_record(&self, sketch: &Sketch, key_hash: u64, now: u64) {
        sketch.clear(sketch::quota_hash(key_hash, self.tag, 0), now);
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
                    Layout::Fixed { ring, .. } | Layout::Sliding { ring, .. } => (NOW_LIMIT - 1)
                        .saturating_add(self.params.window)
                        .min(now.saturating_add(ring.ahead(self.params.window))),
                    // The start restored (`until - W`) within what the ring reads ahead.
                    Layout::FirstHit(hit) => {
                        (NOW_LIMIT - 1).saturating_add(self.params.window).min(
                            now.saturating_add(hit.ring.ahead(1 << hit.grain_bits))
                                .saturating_add(self.params.window),
                        )
                    }
                });
                let state = sketch::restore(self.strategy, &self.params, spent, now);
                self.pack(&state) | USED
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod rounded_first_hit_recall {
    //! Review of the first-hit grain: an evicted rounded first-hit key comes back at least as
    //! spent (sketch `forget` / `recall`).
    use super::*;

    const S: u64 = 1_000_000_000;

    proptest::proptest! {
        /// A rounded first-hit key evicted at `evict` (its word folded into the sketch) and
        /// recalled at `back` never has more room than the evicted word at any time from `back`
        /// on, nor a window ending earlier.
        #[test]
        fn a_recalled_rounded_first_hit_key_is_at_least_as_spent(
            q in proptest::sample::select(vec!["32768/s", "4294967295/ms", "4294967295/s", "4294967295/day", "70000/40hours", "4294967295/3660days"]),
            start in 0u64..NOW_LIMIT - 4 * 86_400 * S,
            used in 1u64..=4_294_967_295,
            evict_after in 0u64..=u64::MAX,
            back_after in 0u64..=u64::MAX,
            probes in proptest::collection::vec(0u64..=u64::MAX, 1..20),
        ) {
            let rule = Rule::parse(Strategy::FixedWindowFirstHit, q).unwrap();
            let packed = PackedRule::for_rule(&rule).unwrap();
            let p = rule.nanos()[0];
            let cell = AtomicU64::new(0);
            let cost = (used % p.limit).max(1).min(u64::from(u32::MAX)) as u32;
            proptest::prop_assert_eq!(packed.apply(&cell, Op::Check(cost), start).outcome, Outcome::Allowed);
            let word = cell.load(Ordering::Relaxed);
            let evict = start + evict_after % p.window.min(1 << 50);
            let back = evict + back_after % p.window.min(1 << 50);
            let sketch = Sketch::new(1000);
            packed.forget(word, 42, evict, &sketch);
            let restored = packed.recall(&sketch, 42, back);
            let orig_end = packed.unpack(word, back).fresh_at(&p);
            let new_end = packed.unpack(restored, back).fresh_at(&p);
            proptest::prop_assert!(
                new_end >= orig_end || orig_end <= back,
                "{}: restored window ends at {} before the evicted one's {}", q, new_end, orig_end
            );
            for &x in &probes {
                let t = back + x % (p.window.saturating_add(1 << 20));
                // Past 7/8 of the ring (at least 42 h and 1.75 windows) the evicted word itself
                // reads wrongly; the store never holds one that long (its sweeps drop it when fresh).
                let readable = (RING_SPAN / 8 * 7).max(p.window / 4 * 7);
                if t >= NOW_LIMIT || t - start >= readable { continue; }
                let a = packed.apply(&AtomicU64::new(word), Op::Peek, t);
                let b = packed.apply(&AtomicU64::new(restored), Op::Peek, t);
                proptest::prop_assert!(b.remaining <= a.remaining, "{} at {}: restored {} > evicted {}", q, t, b.remaining, a.remaining);
                proptest::prop_assert!(b.outcome != Outcome::Allowed || a.outcome == Outcome::Allowed);
            }
        }
    }
}
