//! Fixed window: one counter per window of length `W`.
//!
//! Clock-aligned windows are whole multiples of `W` in Unix time (a `1/hour` window resets at the top
//! of every UTC hour). First-hit windows open at the first request at or after the previous window's
//! end, so windows are not contiguous. Either way up to `2N` can pass across a window edge.

use super::{Params, Verdict};

/// The least time a first-hit window's start, kept modulo a power of two, must span before it
/// wraps: two days (and at least two windows).
pub(crate) const FIRST_HIT_SPAN: u64 = 2 * 86_400 * 1_000_000_000;

/// Bits needed for counts up to `limit`.
pub(crate) fn bits_for(limit: u64) -> u32 {
    u64::BITS - limit.leading_zeros()
}

/// How a first-hit window of `p` fits one 63-bit word: its count bits, and `log2(g)`, the grain
/// (in ns) to which its start is rounded up so that the rest of the word spans
/// [`FIRST_HIT_SPAN`] and two windows (0, the start whole, when it fits).
pub(crate) fn first_hit_layout(p: &Params) -> (u32, u32) {
    let count_bits = bits_for(p.limit).max(1);
    let span = FIRST_HIT_SPAN.max(p.window.saturating_mul(2));
    let span_bits = u64::BITS - (span - 1).leading_zeros();
    let ring_bits = 63u32.saturating_sub(count_bits);
    (count_bits, span_bits.saturating_sub(ring_bits))
}

/// The grain `g` (a power of two, in ns) to which a store keeping a first-hit window in one word
/// (the memory store does) rounds up its start: 1 when the start fits whole, up to `2^17` ns for
/// `u32::MAX` per window of up to a day. The window then ends at most `g - 1` ns later than
/// exact, so the rule's horizon is `W + g - 1`.
pub(crate) fn first_hit_grain(p: &Params) -> u64 {
    1 << first_hit_layout(p).1
}

/// The state of one key under one quota: the window start and the count in it (0 = no open window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    start: u64,
    count: u64,
}

impl FixedWindow {
    /// A state from its parts (for stores that pack it).
    pub(crate) const fn from_parts(start: u64, count: u64) -> Self {
        Self { start, count }
    }

    /// The window start and the count in it.
    pub(crate) const fn parts(&self) -> (u64, u64) {
        (self.start, self.count)
    }

    /// Rolls the window to `now` and says whether `cost` fits, without consuming it.
    #[inline]
    pub(crate) fn check(&mut self, p: &Params, now: u64, cost: u64, aligned: bool) -> Verdict {
        let t = now.max(self.start);
        if aligned {
            let window_start = p.window_start_from(now, self.start);
            if window_start != self.start {
                self.start = window_start;
                self.count = 0;
            }
        } else if self.count > 0 && t - self.start >= p.window {
            self.count = 0;
        }
        let n = self.count;
        // `t - start < W` whenever a window is open: no `start + W`, which saturates near the end of
        // u64 time and reported a wait of 0 there.
        let left_in_window = |start: u64| p.window.saturating_sub(t - start);
        if cost > p.limit {
            let reset = if n > 0 { left_in_window(self.start) } else { 0 };
            return Verdict::exceeds(p.limit, p.limit.saturating_sub(n), reset);
        }
        if n + cost <= p.limit {
            let after = n + cost;
            let reset = match (after, n) {
                (0, _) => 0,
                (_, 0) if !aligned => p.window,
                _ => left_in_window(self.start),
            };
            Verdict::allowed(p.limit, p.limit - after, reset)
        } else {
            let wait = left_in_window(self.start);
            Verdict::rejected(p.limit, p.limit.saturating_sub(n), wait, wait)
        }
    }

    /// Consumes `cost` after a successful [`check`](Self::check) at the same `now`.
    #[inline]
    pub(crate) fn commit(&mut self, now: u64, cost: u64, aligned: bool) {
        if self.count == 0 && !aligned {
            self.start = now.max(self.start);
        }
        self.count += cost;
    }

    /// Settles a reservation of `reserved` made at `at` for `actual`: the count of the window the
    /// reservation was counted in moves by `actual - reserved`, or nothing changes if that window
    /// has ended. A charge above the reservation may take the count to the limit (or leave it where
    /// it was, if above) but never past it: the debt ends with the window.
    pub(crate) fn settle(
        &mut self,
        p: &Params,
        now: u64,
        at: u64,
        reserved: u64,
        actual: u64,
        aligned: bool,
    ) {
        let _ = self.check(p, now, 0, aligned);
        let t = now.max(self.start);
        if at < self.start || t - self.start >= p.window {
            return;
        }
        if actual <= reserved {
            self.count = self.count.saturating_sub(reserved - actual);
        } else {
            let cap = self.count.max(p.limit);
            self.count = self.count.saturating_add(actual - reserved).min(cap);
        }
    }

    /// When the state becomes equivalent to a new key's.
    #[inline]
    pub(crate) fn fresh_at(&self, p: &Params) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.start.saturating_add(p.window)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;

    fn p(limit: u64, window: u64) -> Params {
        Params::window(limit, window)
    }

    fn hit(w: &mut FixedWindow, p: &Params, t: u64, aligned: bool) -> Verdict {
        let v = w.check(p, t, 1, aligned);
        if v.outcome == Outcome::Allowed {
            w.commit(t, 1, aligned);
        }
        v
    }

    #[test]
    fn first_hit_window_opens_at_the_first_request() {
        // 10/minute, first hit at 00:00:45: window 00:00:45-00:01:45.
        let p = p(10, 60 * S);
        let mut w = FixedWindow::default();
        for i in 0..10 {
            let v = hit(&mut w, &p, 45 * S + i, false);
            assert_eq!(v.outcome, Outcome::Allowed);
            assert_eq!(v.remaining, 9 - i);
        }
        let v = hit(&mut w, &p, 60 * S, false);
        assert_eq!(v.outcome, Outcome::Rejected);
        assert_eq!(v.retry_after, 45 * S);
        assert_eq!(
            hit(&mut w, &p, 105 * S - 1, false).outcome,
            Outcome::Rejected
        );
        let v = hit(&mut w, &p, 105 * S, false);
        assert_eq!(
            (v.outcome, v.remaining, v.reset_after),
            (Outcome::Allowed, 9, 60 * S)
        );
    }

    #[test]
    fn aligned_window_resets_at_the_top_of_the_hour() {
        // 5000/hour: first hit at 10:59:30 still resets at 11:00:00.
        let hour = 3600 * S;
        let p = p(5000, hour);
        let mut w = FixedWindow::default();
        let t0 = 10 * hour + 3570 * S;
        let v = w.check(&p, t0, 5000, true);
        assert_eq!((v.outcome, v.reset_after), (Outcome::Allowed, 30 * S));
        w.commit(t0, 5000, true);
        let v = hit(&mut w, &p, 11 * hour - 1, true);
        assert_eq!((v.outcome, v.retry_after), (Outcome::Rejected, 1));
        let v = hit(&mut w, &p, 11 * hour, true);
        assert_eq!(
            (v.outcome, v.remaining, v.reset_after),
            (Outcome::Allowed, 4999, hour)
        );
    }

    #[test]
    fn regression_end_of_time_saturation_reported_a_zero_wait() {
        // Bug: `(start + W).saturating_sub(t)` saturated near u64::MAX: a rejection said "retry
        // after 0" and reset_after shrank, both false.
        let p = p(2, 10 * S);
        for aligned in [false, true] {
            let mut w = FixedWindow::default();
            let t = u64::MAX - S;
            assert_eq!(w.check(&p, t, 2, aligned).outcome, Outcome::Allowed);
            w.commit(t, 2, aligned);
            let v = w.check(&p, u64::MAX, 1, aligned);
            assert_eq!(v.outcome, Outcome::Rejected);
            let start = if aligned { t - t % (10 * S) } else { t };
            let left = 10 * S - (u64::MAX - start);
            assert_eq!(
                (v.retry_after, v.reset_after),
                (left, left),
                "aligned: {aligned}"
            );
        }
    }

    #[test]
    fn never_admissible_cost_opens_nothing() {
        let p = p(3, S);
        let mut w = FixedWindow::default();
        let v = w.check(&p, 10 * S, 4, false);
        assert_eq!(
            (v.outcome, v.remaining, v.reset_after),
            (Outcome::Exceeds, 3, 0)
        );
        assert_eq!(w.fresh_at(&p), 0);
    }
}
