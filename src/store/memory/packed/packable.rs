//! Each packable strategy's state to and from a word, and the compare-and-swap loop that steps it.

use super::layout::{Layout, Ring};
use super::{Cell, PackedRule, USED};
use crate::decision::Outcome;
use crate::rule::MAX_QUOTAS;
use crate::strategy::{self, FixedWindow, Gcra, SlidingWindow, Verdict};

/// The fixed window in `word` (without the second-chance bit), read at `now`.
#[inline(always)]
pub(super) fn unpack_fixed(
    word: u64,
    count_bits: u32,
    ring: Ring,
    w: u64,
    now: u64,
) -> FixedWindow {
    let count = word & ((1 << count_bits) - 1);
    if count == 0 && ring.bits != 0 {
        return FixedWindow::default();
    }
    FixedWindow::from_parts(ring.start(word >> count_bits, w, now), count)
}

/// `s` as a word under a fixed window layout (a count that would not fit saturates).
#[inline(always)]
pub(super) fn pack_fixed(s: &FixedWindow, count_bits: u32, ring: Ring, w: u64) -> u64 {
    let (start, count) = s.parts();
    (ring.store(start, w) << count_bits) | count.min((1 << count_bits) - 1)
}

/// `s` as a word under a sliding window layout (the previous count rounded up, a count that would
/// not fit saturated).
#[inline(always)]
pub(super) fn pack_sliding(
    s: &SlidingWindow,
    count_bits: u32,
    prev_shift: u32,
    ring: Ring,
    w: u64,
) -> u64 {
    let (bucket, cur, prev) = s.parts();
    let max = (1 << count_bits) - 1;
    let prev_bits = count_bits - prev_shift;
    // Rounded up: a saturated field reads back as the largest count.
    let prev = u64::from(prev)
        .div_ceil(1 << prev_shift)
        .min((1 << prev_bits) - 1);
    (ring.store(bucket, w) << (count_bits + prev_bits))
        | (u64::from(cur).min(max) << prev_bits)
        | prev
}

/// The sliding window counter in `word` (without the second-chance bit), read at `now`.
#[inline(always)]
pub(super) fn unpack_sliding(
    word: u64,
    count_bits: u32,
    prev_shift: u32,
    ring: Ring,
    w: u64,
    now: u64,
) -> SlidingWindow {
    let prev_bits = count_bits - prev_shift;
    let prev_max = (1 << prev_bits) - 1;
    let prev = match word & prev_max {
        // A saturated field stands for any count up to what the counts hold.
        field if field == prev_max && prev_shift > 0 => (1 << count_bits) - 1,
        field => field << prev_shift,
    };
    let cur = (word >> prev_bits) & ((1 << count_bits) - 1);
    if cur == 0 && prev == 0 && ring.bits != 0 {
        return SlidingWindow::default();
    }
    let bucket = ring.start(word >> (count_bits + prev_bits), w, now);
    let count = |c: u64| u32::try_from(c).unwrap_or(u32::MAX);
    SlidingWindow::from_parts(bucket, count(cur), count(prev))
}

/// Runs `step` on the word in `cell` (it returns the new state without the second-chance bit, and
/// the verdict) until its compare-and-swap wins; writes nothing when the word would not change.
#[inline(always)]
pub(super) fn swap_loop(cell: &impl Cell, mut step: impl FnMut(u64) -> (u64, Verdict)) -> Verdict {
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
pub(super) trait Packable: Sized + PartialEq {
    fn unpack(rule: &PackedRule, word: u64, now: u64) -> Self;
    /// The word without the second-chance bit (the caller saturates it below that bit).
    fn pack(&self, rule: &PackedRule) -> u64;
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict;
    fn commit(&mut self, rule: &PackedRule, now: u64, cost: u64);
    /// When the state becomes a new key's.
    fn fresh_at(&self, rule: &PackedRule) -> u64;
    /// `v` answered on this state at `now`, its times pointing where the packed state really
    /// ends (a rounded first-hit window's end).
    #[inline(always)]
    fn honest(&self, _: &PackedRule, v: Verdict, _: u64) -> Verdict {
        v
    }
}

impl Packable for Gcra {
    #[inline(always)]
    fn unpack(_: &PackedRule, word: u64, _: u64) -> Self {
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

    #[inline(always)]
    fn fresh_at(&self, _: &PackedRule) -> u64 {
        Gcra::fresh_at(self)
    }
}

impl Packable for FixedWindow {
    #[inline(always)]
    fn unpack(rule: &PackedRule, word: u64, now: u64) -> Self {
        match rule.layout {
            Layout::Fixed { count_bits, ring } => {
                unpack_fixed(word & !USED, count_bits, ring, rule.params.window, now)
            }
            _ => FixedWindow::default(),
        }
    }

    #[inline(always)]
    fn pack(&self, rule: &PackedRule) -> u64 {
        match rule.layout {
            Layout::Fixed { count_bits, ring } => {
                pack_fixed(self, count_bits, ring, rule.params.window)
            }
            _ => 0,
        }
    }

    #[inline(always)]
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict {
        FixedWindow::check(self, &rule.params, now, cost, true)
    }

    #[inline(always)]
    fn commit(&mut self, _: &PackedRule, now: u64, cost: u64) {
        FixedWindow::commit(self, now, cost, true);
    }

    #[inline(always)]
    fn fresh_at(&self, rule: &PackedRule) -> u64 {
        FixedWindow::fresh_at(self, &rule.params)
    }
}

/// A first-hit window, packed apart from the clock-aligned one (its own layout and arithmetic).
///
/// A first-hit window starts at any nanosecond: its start is stored on a ring of `2^(63 - c)`
/// units of `g = 2^k` ns (`c` the count's bits) spanning two days and two windows at least, read
/// back as window indices are. `g` is the smallest power of two that makes the ring fit: 1 ns (the
/// start whole, exact) for limits up to `2^15 - 1` per window of up to 1.6 days
/// (`c + log2(2 W) <= 63`). Every other first-hit rule (any limit up to `u32::MAX`, any window up
/// to the maximum) stores its start rounded UP to a multiple of `g`: the window then ends up to
/// `g - 1` ns later than the exact strategy's (stricter by at most `g`, never more lenient); the
/// count is never rounded (a count rounded up on every increment compounds). `g` for `u32::MAX`
/// per window of up to a day is `2^17` ns (131 us); for a 10-year window `2^29` ns (0.54 s).
/// The rounded end is honest everywhere: a verdict's reset and retry times point at it (not at
/// `now + W`), the state stays held until it ([`FixedWindow::fresh_at`](crate::strategy::FixedWindow::fresh_at) of the rounded start),
/// and the rule's horizon ([`Rule::horizon`](crate::Rule::horizon)) is `W + g - 1` (see [`first_hit_grain`](crate::strategy::first_hit_grain)). A
/// refund (settlement) of a reservation made in the window's first `g` ns, before its rounded
/// start, is dropped (as one made in an earlier window is): stricter, never more lenient; a charge
/// above such a reservation is counted in the window (and so is one above a reservation made in
/// the previous window's last grain, which the state cannot tell apart: stricter).
#[derive(PartialEq)]
pub(super) struct FirstHit(FixedWindow);

impl Packable for FirstHit {
    #[inline(always)]
    fn unpack(rule: &PackedRule, word: u64, now: u64) -> Self {
        FirstHit(match rule.layout {
            Layout::FirstHit(hit) => hit.unpack(word & !USED, now),
            _ => FixedWindow::default(),
        })
    }

    #[inline(always)]
    fn pack(&self, rule: &PackedRule) -> u64 {
        match rule.layout {
            Layout::FirstHit(hit) => hit.pack(&self.0),
            _ => 0,
        }
    }

    #[inline(always)]
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict {
        self.0.check(&rule.params, now, cost, false)
    }

    #[inline(always)]
    fn commit(&mut self, _: &PackedRule, now: u64, cost: u64) {
        self.0.commit(now, cost, false);
    }

    #[inline(always)]
    fn fresh_at(&self, rule: &PackedRule) -> u64 {
        self.0.fresh_at(&rule.params)
    }

    #[inline(always)]
    fn honest(&self, rule: &PackedRule, v: Verdict, now: u64) -> Verdict {
        match rule.layout {
            Layout::FirstHit(hit) => hit.honest(v, &self.0, now),
            _ => v,
        }
    }
}

impl Packable for SlidingWindow {
    #[inline(always)]
    fn unpack(rule: &PackedRule, word: u64, now: u64) -> Self {
        match rule.layout {
            Layout::Sliding {
                count_bits,
                prev_shift,
                ring,
            } => unpack_sliding(
                word & !USED,
                count_bits,
                prev_shift,
                ring,
                rule.params.window,
                now,
            ),
            _ => SlidingWindow::default(),
        }
    }

    #[inline(always)]
    fn pack(&self, rule: &PackedRule) -> u64 {
        match rule.layout {
            Layout::Sliding {
                count_bits,
                prev_shift,
                ring,
            } => pack_sliding(self, count_bits, prev_shift, ring, rule.params.window),
            _ => 0,
        }
    }

    #[inline(always)]
    fn check(&mut self, rule: &PackedRule, now: u64, cost: u64) -> Verdict {
        SlidingWindow::check(self, &rule.params, now, cost)
    }

    #[inline(always)]
    fn commit(&mut self, _: &PackedRule, _now: u64, cost: u64) {
        SlidingWindow::commit(self, cost);
    }

    #[inline(always)]
    fn fresh_at(&self, rule: &PackedRule) -> u64 {
        SlidingWindow::fresh_at(self, &rule.params)
    }
}

/// A check of `cost` on the quotas of a several-quota rule held one word each under `layouts` (a
/// general entry's one-word states), below [`NOW_LIMIT`]: what `strategy::apply` does (every quota
/// checked, then all committed if all admit) on each layout's own state type instead of the general
/// one, and the words rewritten in place as `repack` does after a check. The reported quota, its
/// verdict, and when the states become a new key's; `None` for layouts without such a loop (the
/// caller runs the general one).
#[inline]
pub(in crate::store::memory) fn check_words(
    layouts: &[PackedRule],
    words: &mut [u64],
    now: u64,
    cost: u32,
) -> Option<(usize, Verdict, u64)> {
    match layouts.first()?.layout {
        Layout::Fixed { .. } => Some(check_words_as::<FixedWindow>(layouts, words, now, cost)),
        Layout::Sliding { .. } => Some(check_words_as::<SlidingWindow>(layouts, words, now, cost)),
        Layout::FirstHit(_) | Layout::Gcra => None,
    }
}

#[inline(always)]
pub(super) fn check_words_as<S: Packable + Copy + Default>(
    layouts: &[PackedRule],
    words: &mut [u64],
    now: u64,
    cost: u32,
) -> (usize, Verdict, u64) {
    let cost = u64::from(cost);
    // On the stack: no allocation per check.
    let mut buf = [S::default(); MAX_QUOTAS];
    let mut n = 0;
    for ((s, l), w) in buf.iter_mut().zip(layouts).zip(words.iter()) {
        *s = S::unpack(l, *w, now);
        n += 1;
    }
    let states = buf.get_mut(..n).unwrap_or_default();
    let mut reported: Option<(usize, Verdict)> = None;
    let mut all_allowed = true;
    for (i, (s, l)) in states.iter_mut().zip(layouts).enumerate() {
        let v = s.check(l, now, cost);
        all_allowed &= v.outcome == Outcome::Allowed;
        if reported.is_none_or(|(_, r)| strategy::reports_over(&v, &r)) {
            reported = Some((i, v));
        }
    }
    let spent = all_allowed && cost > 0;
    let mut fresh_at = 0;
    for ((s, l), w) in states.iter_mut().zip(layouts).zip(words.iter_mut()) {
        if spent {
            s.commit(l, now, cost);
        }
        let word = s.pack(l).min(!USED);
        // A word that would read back rounded after a request that spent nothing is left as it
        // was (as in the packed table).
        if spent || !l.rounds_counts() || S::unpack(l, word, now) == *s {
            *w = word;
        }
        fresh_at = fresh_at.max(s.fresh_at(l));
    }
    let (index, v) = reported.unwrap_or((0, Verdict::allowed(0, 0, 0)));
    (index, v, fresh_at)
}
