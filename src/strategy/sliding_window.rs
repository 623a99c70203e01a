//! Sliding window counter: clock-aligned buckets of length `W`, and the weighted count
//! `cur + floor(prev * (W - e) / W)` where `e` is the time elapsed in the current bucket.
//!
//! Two counters per key. On random traffic it stays within a few percent of the exact moving window;
//! an adversary who times two bursts gets up to `2N` through in one trailing window.

use super::{Params, Verdict};

/// The state of one key under one quota: the current bucket's start and the two counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    bucket: u64,
    cur: u32,
    prev: u32,
}

/// `floor(count * (w - e) / w)`: the previous bucket's share at `e` into the current bucket.
#[inline]
fn share(count: u64, w: u64, e: u64) -> u64 {
    let left = w - e.min(w);
    // In 64 bits when the product fits (any real quota): a 128-bit division is a library call.
    match count.checked_mul(left) {
        Some(product) => product / w,
        None => (u128::from(count) * u128::from(left) / u128::from(w)) as u64,
    }
}

/// The earliest offset `e` in a bucket at which `share(count, w, e) <= room`.
#[inline]
fn earliest_offset(count: u64, w: u64, room: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    // share <= room  <=>  count * (w - e) <= (room + 1) * w - 1
    let span = match room.checked_add(1).and_then(|r| r.checked_mul(w)) {
        Some(bound) => ((bound - 1) / count).min(w),
        None => {
            let most = (u128::from(room) + 1) * u128::from(w) - 1;
            (most / u128::from(count)).min(u128::from(w)) as u64
        }
    };
    w - span
}

impl SlidingWindow {
    /// A state from its parts (for stores that pack it).
    pub(crate) const fn from_parts(bucket: u64, cur: u32, prev: u32) -> Self {
        Self { bucket, cur, prev }
    }

    /// The current bucket's start and the current and previous counts.
    pub(crate) const fn parts(&self) -> (u64, u32, u32) {
        (self.bucket, self.cur, self.prev)
    }

    /// Rolls the buckets to `now` and says whether `cost` fits, without consuming it.
    #[inline]
    pub(crate) fn check(&mut self, p: &Params, now: u64, cost: u64) -> Verdict {
        let t = now.max(self.bucket);
        let w = p.window;
        let start = p.window_start_from(now, self.bucket);
        if start != self.bucket {
            self.prev = if start == self.bucket.saturating_add(w) {
                self.cur
            } else {
                0
            };
            self.cur = 0;
            self.bucket = start;
        }
        let e = t - start;
        let (cur, prev) = (u64::from(self.cur), u64::from(self.prev));
        let weighted = cur + share(prev, w, e);
        let remaining = p.limit.saturating_sub(weighted);
        if cost > p.limit {
            return Verdict::exceeds(p.limit, remaining, Self::reset(w, e, cur, prev));
        }
        // Cost 0 is a peek and always admitted: after a clock step back `t` is clamped to the bucket
        // start only, where the previous bucket's share is largest and `weighted` may pass the limit.
        if cost == 0 || weighted + cost <= p.limit {
            return Verdict::allowed(
                p.limit,
                remaining - cost,
                Self::reset(w, e, cur + cost, prev),
            );
        }
        let room = p.limit - cost;
        let wait = if cur <= room && earliest_offset(prev, w, room - cur) < w {
            earliest_offset(prev, w, room - cur) - e
        } else {
            (w - e) + earliest_offset(cur, w, room)
        };
        Verdict::rejected(p.limit, remaining, Self::reset(w, e, cur, prev), wait)
    }

    /// Time until the weighted count reaches 0 if no more requests come.
    #[inline]
    fn reset(w: u64, e: u64, cur: u64, prev: u64) -> u64 {
        if cur > 0 {
            (w - e) + earliest_offset(cur, w, 0)
        } else {
            earliest_offset(prev, w, 0).saturating_sub(e)
        }
    }

    /// Counts `cost` in the current bucket after a successful [`check`](Self::check).
    #[inline]
    pub(crate) fn commit(&mut self, cost: u64) {
        // check() admitted it, so cur + cost <= limit <= u32::MAX.
        self.cur = self
            .cur
            .saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
    }

    /// Settles a reservation of `reserved` made at `at` for `actual`: the bucket it was counted in
    /// (the current one, or the previous one if the buckets rolled once since) moves by
    /// `actual - reserved`; nothing changes if that bucket is older. A charge above the reservation
    /// takes a bucket's count to the limit at most (or leaves it, if above): the debt lasts at most
    /// one horizon.
    pub(crate) fn settle(&mut self, p: &Params, now: u64, at: u64, reserved: u64, actual: u64) {
        let _ = self.check(p, now, 0);
        let limit = u32::try_from(p.limit).unwrap_or(u32::MAX);
        let adjust = |count: &mut u32| {
            if actual <= reserved {
                let give = u32::try_from(reserved - actual).unwrap_or(u32::MAX);
                *count = count.saturating_sub(give);
            } else {
                let take = u32::try_from(actual - reserved).unwrap_or(u32::MAX);
                *count = count.saturating_add(take).min((*count).max(limit));
            }
        };
        if at >= self.bucket {
            adjust(&mut self.cur);
        } else if at >= self.bucket.saturating_sub(p.window) {
            adjust(&mut self.prev);
        }
    }

    /// When the state becomes equivalent to a new key's.
    #[inline]
    pub(crate) fn fresh_at(&self, p: &Params) -> u64 {
        match (self.cur, self.prev) {
            (0, 0) => 0,
            (0, _) => self.bucket.saturating_add(p.window),
            _ => self.bucket.saturating_add(p.window.saturating_mul(2)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_64_bit_shortcuts_agree_with_128_bit_arithmetic() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |bits: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> (64 - bits)
        };
        for i in 0..100_000 {
            let w = next(1 + i % 63).max(1);
            let count = next(1 + (i / 63) % 32);
            let e = next(64) % (w + 1);
            let room = next(1 + i % 32);
            let want_share = (u128::from(count) * u128::from(w - e) / u128::from(w)) as u64;
            assert_eq!(share(count, w, e), want_share, "{count} {w} {e}");
            if count > 0 {
                let most = (u128::from(room) + 1) * u128::from(w) - 1;
                let want = w - (most / u128::from(count)).min(u128::from(w)) as u64;
                assert_eq!(earliest_offset(count, w, room), want, "{count} {w} {room}");
            }
        }
    }
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;

    fn state(bucket: u64, cur: u32, prev: u32) -> SlidingWindow {
        SlidingWindow { bucket, cur, prev }
    }

    #[test]
    fn hundred_per_minute_worked_example() {
        let p = Params::window(100, 60 * S);
        let b = 600 * S;
        let v = state(b, 80, 40).check(&p, b + 30 * S, 1);
        assert_eq!(
            (v.outcome, v.remaining),
            (Outcome::Rejected, 0),
            "weighted count 100"
        );
        let v = state(b, 80, 40).check(&p, b + 40 * S, 1);
        assert_eq!(
            (v.outcome, v.remaining),
            (Outcome::Allowed, 6),
            "weighted count 93"
        );
    }

    #[test]
    fn seven_per_minute_worked_example() {
        let p = Params::window(7, 60 * S);
        let b = 600 * S;
        let t = b + 18 * S; // 30 % into the bucket
        let mut s = state(b, 3, 5);
        let v = s.check(&p, t, 1);
        assert_eq!(
            (v.outcome, v.remaining),
            (Outcome::Allowed, 0),
            "3 + 5 x 0.7 = 6.5 -> 6"
        );
        s.commit(1);
        let v = s.check(&p, t, 1);
        assert_eq!(v.outcome, Outcome::Rejected);
        // The previous bucket's share must drop from 3 to 2: 5 * (60 - e) / 60 < 3 once e > 24 s.
        assert_eq!(v.retry_after, 6 * S + 1);
        assert_eq!(
            s.check(&p, t + v.retry_after - 1, 1).outcome,
            Outcome::Rejected
        );
        assert_eq!(s.check(&p, t + v.retry_after, 1).outcome, Outcome::Allowed);
    }

    #[test]
    fn regression_cost_zero_rejected_after_a_clock_step_back() {
        // Bug (found by time_and_numbers::t10 at 10^4 cases): a step back inside the bucket is
        // clamped to the bucket start, where `cur + prev` may pass the limit; a cost-0 peek was
        // then Rejected, though cost 0 must always be admitted and change nothing.
        let p = Params::window(10, 60 * S);
        let b = 600 * S;
        let mut s = SlidingWindow::default();
        assert_eq!(s.check(&p, b - S, 6).outcome, Outcome::Allowed);
        s.commit(6);
        let t = b + 30 * S; // share floor(6 x 0.5) = 3
        assert_eq!(s.check(&p, t, 7).outcome, Outcome::Allowed);
        s.commit(7);
        let v = s.check(&p, b + S, 0); // back to 1 s into the bucket: 7 + floor(6 x 59/60) = 12
        assert_eq!((v.outcome, v.remaining), (Outcome::Allowed, 0));
        let v = s.check(&p, 0, 0); // before the bucket: clamped to its start, 7 + 6 = 13
        assert_eq!((v.outcome, v.remaining), (Outcome::Allowed, 0));
        assert_eq!(s.check(&p, 0, 1).outcome, Outcome::Rejected);
    }

    #[test]
    fn limit_one_admits() {
        let p = Params::window(1, S);
        let mut s = SlidingWindow::default();
        assert_eq!(s.check(&p, 5 * S, 1).outcome, Outcome::Allowed);
    }
}
