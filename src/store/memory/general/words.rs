//! A several-quota rule's states held as words: one packed word per quota where the quota packs
//! as a rule alone, else two words per quota; and the conversions between words and states.

use super::super::packed::{NOW_LIMIT, PackedRule};
use crate::rule::Rule;
use crate::strategy::{FixedWindow, Gcra, Params, QuotaState, SlidingWindow, Strategy};

/// How the memory store holds each quota of a rule of several fixed-window, first-hit or
/// sliding-window quotas in one word ([`States::Packed`]): the layout a packed table would give the
/// quota as a rule alone, or `None` when one quota does not pack (the rule's keys then hold two
/// words per quota). Worked out on the rule's first use and kept with it
/// ([`Rule::store_cache`]): a check looks it up without a lock.
pub(super) struct QuotaWords(Option<Box<[PackedRule]>>);

/// The layouts of `rule`'s quotas, if every quota has one (see [`QuotaWords`]).
#[inline]
pub(super) fn quota_words(rule: &Rule) -> Option<&[PackedRule]> {
    rule.store_cache(|| {
        QuotaWords(
            if !matches!(
                rule.strategy(),
                Strategy::FixedWindow | Strategy::FixedWindowFirstHit | Strategy::SlidingWindow
            ) || rule.nanos().len() < 2
            {
                None
            } else {
                (0..rule.nanos().len())
                    .map(|i| PackedRule::for_quota(rule, i))
                    .collect()
            },
        )
    })?
    .0
    .as_deref()
}

/// Words per quota of `strategy` in [`States::Words`] (0: not held so).
pub(super) const fn words_per_quota(strategy: Strategy) -> usize {
    match strategy {
        Strategy::TokenBucket | Strategy::LeakyBucket => 1,
        Strategy::MovingWindow => 0,
        _ => 2,
    }
}

/// The state of quota `i` in `words`.
// In bounds: `words` holds `words_per_quota` words for each quota of the rule, and `i` is a quota.
#[allow(clippy::indexing_slicing)]
#[inline]
pub(super) fn decode(strategy: Strategy, words: &[u64], i: usize) -> QuotaState {
    match words_per_quota(strategy) {
        1 => QuotaState::Gcra(Gcra::from_tat(words[i])),
        _ => {
            let (a, b) = (words[2 * i], words[2 * i + 1]);
            match strategy {
                Strategy::SlidingWindow => {
                    QuotaState::Sliding(SlidingWindow::from_parts(a, (b >> 32) as u32, b as u32))
                }
                _ => QuotaState::Fixed(FixedWindow::from_parts(a, b)),
            }
        }
    }
}

/// Writes `state` as quota `i` of `words`.
// In bounds: as in `decode`.
#[allow(clippy::indexing_slicing)]
#[inline]
pub(super) fn encode(state: &QuotaState, words: &mut [u64], i: usize) {
    match state {
        QuotaState::Gcra(g) => words[i] = g.tat(),
        QuotaState::Fixed(f) => {
            let (start, count) = f.parts();
            words[2 * i] = start;
            words[2 * i + 1] = count;
        }
        QuotaState::Sliding(w) => {
            let (bucket, cur, prev) = w.parts();
            words[2 * i] = bucket;
            words[2 * i + 1] = (u64::from(cur) << 32) | u64::from(prev);
        }
        // Not held as words.
        QuotaState::Moving(_) => {}
    }
}

/// How quota state `s` (under `p`) is held at `now` in one word under `layout`: the word, and
/// whether it reads back rounded (a sliding window's previous count rounded up), or `None` when it
/// does not read back as it is (nor as a new key's, when it is one).
#[inline]
pub(super) fn to_word(
    layout: &PackedRule,
    s: &QuotaState,
    p: &Params,
    now: u64,
) -> Option<(u64, bool)> {
    let word = layout.pack(s);
    let back = layout.unpack(word, now);
    if back == *s || (is_new(&back, p, now) && is_new(s, p, now)) {
        Some((word, false))
    } else if layout.rounds_counts() && rounded_up(&back, s) {
        Some((word, true))
    } else {
        None
    }
}

/// `states` under `rule` at `now`, one word each ([`States::Packed`]), if the rule's quotas have
/// one-word layouts and every state fits one.
pub(super) fn packed_words(rule: &Rule, states: &[QuotaState], now: u64) -> Option<Box<[u64]>> {
    let layouts = quota_words(rule)?;
    if now >= NOW_LIMIT || layouts.len() != states.len() {
        return None;
    }
    // Allocated at its size (collecting an iterator of options would grow it by reallocations).
    let mut words = vec![0; states.len()].into_boxed_slice();
    for (((s, l), p), w) in states.iter().zip(layouts).zip(rule.nanos()).zip(&mut words) {
        *w = to_word(l, s, p, now)?.0;
    }
    Some(words)
}

/// Writes `states` (under `params`, at `now`, after an operation that `spent` something or not)
/// into `words` under `layouts`; `false` if a state does not fit its word (the caller then holds
/// them otherwise). After a request that spent nothing, a word that would read back rounded is
/// left as it was (what the packed table does: a peek and the check after it answer alike).
///
/// After a `check` (below [`NOW_LIMIT`]) every state fits, as in a packed table, and is not read
/// back: it was read from its word at `now`, and a check moves a window's start only to the window
/// of `now` and admits a cost only within the limit (which the count's bits hold). A state without
/// a count may then read back as a new key's, an equivalent state.
#[inline]
pub(super) fn repack(
    layouts: &[PackedRule],
    words: &mut [u64],
    states: &[QuotaState],
    params: &[Params],
    now: u64,
    (check, spent): (bool, bool),
) -> bool {
    if check {
        for ((s, l), w) in states.iter().zip(layouts).zip(words.iter_mut()) {
            let word = l.pack(s);
            if spent || !l.rounds_counts() || l.unpack(word, now) == *s {
                *w = word;
            }
        }
        return true;
    }
    for (((s, l), p), w) in states.iter().zip(layouts).zip(params).zip(words.iter_mut()) {
        match to_word(l, s, p, now) {
            Some((_, true)) if !spent => {}
            Some((word, _)) => *w = word,
            None => return false,
        }
    }
    true
}

/// The states held in `words` (eviction; a check decodes them on the stack instead).
pub(super) fn unpacked(strategy: Strategy, words: &[u64]) -> Vec<QuotaState> {
    let n = words.len() / words_per_quota(strategy).max(1);
    (0..n).map(|i| decode(strategy, words, i)).collect()
}

/// Whether `s`, under `p`, equals a new key's state at `now`.
#[inline]
pub(super) fn is_new(s: &QuotaState, p: &Params, now: u64) -> bool {
    let fresh_at = s.fresh_at(p);
    fresh_at <= now && fresh_at != u64::MAX
}

/// Whether `back` is `s` with only a sliding window's previous count rounded up (what a packed
/// layout that rounds reads back: stricter, never more lenient).
#[inline]
pub(super) fn rounded_up(back: &QuotaState, s: &QuotaState) -> bool {
    match (back, s) {
        (QuotaState::Sliding(b), QuotaState::Sliding(s)) => {
            let ((bb, bc, bp), (sb, sc, sp)) = (b.parts(), s.parts());
            bb == sb && bc == sc && bp >= sp
        }
        _ => false,
    }
}
