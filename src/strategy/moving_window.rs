//! Moving window (sliding log): the times of admitted units; a request is admitted when fewer than
//! `N` units lie in the last `W`. Exact, with `O(N)` memory per key: the log is a ring that grows
//! lazily and never holds more than `N` entries.

use std::collections::VecDeque;

use super::{Params, Verdict};

/// The largest limit the moving window accepts: each admitted unit costs 8 bytes of log, so one key
/// can hold at most 8 MiB.
pub const MAX_MOVING_WINDOW_LIMIT: u32 = 1 << 20;

/// The log of one key under one quota: one timestamp per admitted unit of cost, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MovingWindow {
    log: VecDeque<u64>,
}

impl MovingWindow {
    /// Drops expired entries and says whether `cost` fits, without consuming it.
    #[inline]
    pub(crate) fn check(&mut self, p: &Params, now: u64, cost: u64) -> Verdict {
        let t = self.now(now);
        // Ages, not expiry times: `t >= ts` for every entry (see `now`), and `ts + W` would saturate
        // near the end of `u64` time and expire entries early (over-admission).
        while self.log.front().is_some_and(|&ts| t - ts >= p.window) {
            self.log.pop_front();
        }
        self.shrink();
        let used = self.log.len() as u64;
        let reset = self.log.back().map_or(0, |&ts| p.window - (t - ts));
        if cost > p.limit {
            return Verdict::exceeds(p.limit, p.limit.saturating_sub(used), reset);
        }
        if used + cost <= p.limit {
            let reset = if cost > 0 { p.window } else { reset };
            return Verdict::allowed(p.limit, p.limit - used - cost, reset);
        }
        // The oldest entry whose expiry leaves room for `cost`.
        let k = (used + cost - p.limit - 1) as usize;
        let wait = self.log.get(k).map_or(0, |&ts| p.window - (t - ts));
        Verdict::rejected(p.limit, p.limit.saturating_sub(used), reset, wait)
    }

    /// A log of `count` entries at `at` (for stores that restore a state from a summary of it).
    pub(crate) fn filled(count: u64, at: u64) -> Self {
        Self {
            log: std::iter::repeat_n(at, usize::try_from(count).unwrap_or(usize::MAX)).collect(),
        }
    }

    /// The number of entries (admitted units not yet known to be expired).
    pub(crate) fn len(&self) -> usize {
        self.log.len()
    }

    /// Returns memory as entries expire: a ring at most a quarter full shrinks to twice its entries
    /// (at least 4). Amortised O(1): a shrink copies the entries left, and at least as many expired
    /// (were admitted, and paid for) since the ring last had this size.
    #[inline]
    fn shrink(&mut self) {
        let capacity = self.log.capacity();
        if capacity > 4 && self.log.len() <= capacity / 4 {
            self.shrink_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn shrink_now(&mut self) {
        self.log.shrink_to((2 * self.log.len()).max(4));
    }

    /// Appends `cost` entries at `now` after a successful [`check`](Self::check).
    #[inline]
    pub(crate) fn commit(&mut self, p: &Params, now: u64, cost: u64) {
        let t = self.now(now);
        let needed = self.log.len() + cost as usize;
        if needed > self.log.capacity() {
            // Grow geometrically but never past the limit: the ring stays O(N).
            let target = (self.log.capacity() * 2)
                .max(needed)
                .max(4)
                .min(p.limit as usize);
            self.log
                .reserve_exact(target.saturating_sub(self.log.len()));
        }
        self.log.extend(std::iter::repeat_n(t, cost as usize));
    }

    /// Settles a reservation of `reserved` made at `at` for `actual`, at the reservation's own
    /// timestamp: a refund removes entries of time `at` (never another request's newer ones, which
    /// would over-admit when settlements arrive out of order), a charge adds entries at `at`. Nothing
    /// changes once `at` has left the window. The log never holds more than `N` entries: the charge
    /// beyond a full log is dropped, and the number dropped is returned.
    pub(crate) fn settle(
        &mut self,
        p: &Params,
        now: u64,
        at: u64,
        reserved: u64,
        actual: u64,
    ) -> u64 {
        let _ = self.check(p, now, 0);
        let t = self.now(now);
        if at > t || t - at >= p.window {
            return 0;
        }
        // The reservation's entries were written at `at`, or later when the log already held a
        // newer entry (time never runs backwards for a key: concurrent callers read the clock
        // before taking the key's lock, so their times reach the store out of order). A refund
        // removes the oldest entries at or after `at`: never one from before `at`, so it frees no
        // room earlier than giving back the reservation's own entries would (unless the key was
        // reset since and refilled: then at most the reservation's cost is given back).
        let from = self.log.partition_point(|&ts| ts < at);
        if actual <= reserved {
            let mine = self
                .log
                .range(from..)
                .take(usize::try_from(reserved - actual).unwrap_or(usize::MAX))
                .count();
            self.log.drain(from..from + mine);
            self.shrink();
            return 0;
        }
        let extra = actual - reserved;
        let room = p.limit.saturating_sub(self.log.len() as u64);
        let put = extra.min(room);
        if put > 0 {
            let at_end = self.log.partition_point(|&ts| ts <= at);
            let tail: Vec<u64> = self.log.drain(at_end..).collect();
            self.log.reserve_exact(put as usize + tail.len());
            self.log.extend(std::iter::repeat_n(at, put as usize));
            self.log.extend(tail);
        }
        extra - put
    }

    /// When the state becomes equivalent to a new key's.
    #[inline]
    pub(crate) fn fresh_at(&self, p: &Params) -> u64 {
        self.log.back().map_or(0, |&ts| ts.saturating_add(p.window))
    }

    /// Time never runs backwards for a key: a clock step back is treated as time standing still.
    fn now(&self, now: u64) -> u64 {
        self.log.back().map_or(now, |&newest| now.max(newest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn hit(w: &mut MovingWindow, p: &Params, t: u64, cost: u64) -> Verdict {
        let v = w.check(p, t, cost);
        if v.outcome == Outcome::Allowed {
            w.commit(p, t, cost);
        }
        v
    }

    #[test]
    fn ten_per_minute_worked_example() {
        let p = Params::window(10, 60 * S);
        let mut w = MovingWindow::default();
        for (t, n) in [(10, 1), (20, 2), (30, 4), (50, 3)] {
            for _ in 0..n {
                assert_eq!(hit(&mut w, &p, t * S, 1).outcome, Outcome::Allowed);
            }
        }
        assert_eq!(
            hit(&mut w, &p, 71 * S, 1).outcome,
            Outcome::Allowed,
            ":10 is 61 s old"
        );
        let v = hit(&mut w, &p, 72 * S, 1);
        assert_eq!(v.outcome, Outcome::Rejected, ":20 is 52 s old");
        assert_eq!(v.retry_after, 8 * S);
    }

    #[test]
    fn three_per_second_worked_example() {
        let p = Params::window(3, S);
        let mut w = MovingWindow::default();
        for t in [100, 300, 600] {
            assert_eq!(hit(&mut w, &p, t * MS, 1).outcome, Outcome::Allowed);
        }
        let v = hit(&mut w, &p, 800 * MS, 1);
        assert_eq!((v.outcome, v.retry_after), (Outcome::Rejected, 300 * MS));
        assert_eq!(hit(&mut w, &p, 1110 * MS, 1).outcome, Outcome::Allowed);
    }

    #[test]
    fn regression_end_of_time_saturation_expired_entries_early() {
        // Bug: expiry as `ts.saturating_add(W) <= t` saturated to u64::MAX within W of the end of
        // u64 time, so every entry expired at once and every request was admitted.
        let p = Params::window(2, S);
        for t in [u64::MAX, u64::MAX - 1, u64::MAX - S / 2] {
            let mut w = MovingWindow::default();
            assert_eq!(hit(&mut w, &p, t, 2).outcome, Outcome::Allowed);
            let v = hit(&mut w, &p, t, 1);
            assert_eq!((v.outcome, v.reset_after), (Outcome::Rejected, S));
            assert_eq!(v.retry_after, S);
        }
    }

    #[test]
    fn the_ring_shrinks_as_its_entries_expire() {
        let p = Params::window(100_000, 60 * S);
        let mut w = MovingWindow::default();
        for i in 0..100_000 {
            hit(&mut w, &p, 100 * S + i, 1);
        }
        assert!(w.log.capacity() >= 100_000);
        // One request an hour keeps the key alive; every older entry has expired.
        let mut t = 100 * S;
        for _ in 0..3 {
            t += 3_600 * S;
            hit(&mut w, &p, t, 1);
        }
        assert_eq!(w.log.len(), 1);
        assert!(w.log.capacity() <= 8, "{}", w.log.capacity());
    }

    #[test]
    fn log_never_exceeds_the_limit() {
        let p = Params::window(5, S);
        let mut w = MovingWindow::default();
        for i in 0..1000 {
            hit(&mut w, &p, i * 7 * MS, 1 + i % 3);
            assert!(w.log.len() <= 5);
            assert!(w.log.capacity() <= 8);
        }
    }
}
