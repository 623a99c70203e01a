//! Token bucket as GCRA (generic cell rate algorithm): one timestamp per key, the theoretical
//! arrival time (TAT). Emission interval `T = ceil(W / N)`, burst `B`. A request of cost `c` at `t` is
//! admitted when `max(TAT, t) + c*T - t <= B*T`. The leaky-bucket meter uses the same arithmetic.
//!
//! Bound: in any interval `L`, at most `B + floor(L / T)` units pass (up to `2N - 1` in one period when
//! `B = N`). That is the design of a bucket, not a bug.

use super::{Params, Verdict};

/// The state of one key under one quota: the theoretical arrival time (0 = a new key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Gcra {
    tat: u64,
}

impl Gcra {
    /// A state from its TAT (for stores that pack it).
    pub(crate) const fn from_tat(tat: u64) -> Self {
        Self { tat }
    }

    /// The theoretical arrival time.
    pub(crate) const fn tat(&self) -> u64 {
        self.tat
    }

    /// Says whether `cost` fits at `now`, without consuming it.
    #[inline]
    pub(crate) fn check(&mut self, p: &Params, now: u64, cost: u64) -> Verdict {
        let tau = p.tau();
        // Time never runs backwards for a key: before TAT - tau nothing about the state changes.
        let t = now.max(self.tat.saturating_sub(tau));
        let ahead = self.tat.saturating_sub(t);
        // Computed where it is reported only: the admitted path divides once.
        let remaining_now = move || ((tau - ahead.min(tau)) / p.emission).min(p.burst);
        if cost > p.burst {
            return Verdict::exceeds(p.burst, remaining_now(), ahead);
        }
        let after = ahead.saturating_add(cost.saturating_mul(p.emission));
        if t.checked_add(after).is_none() {
            // The new TAT would pass the end of u64 time (year 2554): saturating it would let the
            // bucket refill for free. Never admit; report the bucket's depth as the wait.
            return Verdict::rejected(p.burst, remaining_now(), ahead, tau);
        }
        if after <= tau {
            let remaining = ((tau - after) / p.emission).min(p.burst);
            return Verdict::allowed(p.burst, remaining, after);
        }
        Verdict::rejected(p.burst, remaining_now(), ahead, after - tau)
    }

    /// Moves TAT after a successful [`check`](Self::check) at the same `now`.
    #[inline]
    pub(crate) fn commit(&mut self, p: &Params, now: u64, cost: u64) {
        let t = now.max(self.tat.saturating_sub(p.tau()));
        self.tat = self
            .tat
            .max(t)
            .saturating_add(cost.saturating_mul(p.emission));
    }

    /// Settles a reservation of `reserved` for `actual`: TAT moves by `(actual - reserved) * T`,
    /// never back below now, and never past `now + B*T` (the debt is capped at one horizon: the
    /// bucket is at most emptied).
    pub(crate) fn settle(&mut self, p: &Params, now: u64, reserved: u64, actual: u64) {
        if actual <= reserved {
            self.tat = self
                .tat
                .saturating_sub((reserved - actual).saturating_mul(p.emission))
                .max(now.min(self.tat));
        } else {
            // The content (TAT - now) grows, but not past the bucket's depth (one horizon) unless
            // already above: a full bucket, never a debt that outlives it.
            let base = self.tat.max(now);
            let cap = now.saturating_add(p.tau()).max(self.tat);
            self.tat = base
                .saturating_add((actual - reserved).saturating_mul(p.emission))
                .min(cap);
        }
    }

    /// Steps the last reservation back: when TAT is still `end` (the reservation's end, so no
    /// reservation came after it), TAT moves back by `cost * T`, never below now. Otherwise the
    /// gap stays.
    pub(crate) fn step_back(&mut self, p: &Params, now: u64, end: u64, cost: u64) {
        if self.tat == end {
            self.tat = self
                .tat
                .saturating_sub(cost.saturating_mul(p.emission))
                .max(now.min(self.tat));
        }
    }

    /// When the state becomes equivalent to a new key's.
    #[inline]
    pub(crate) fn fresh_at(&self) -> u64 {
        self.tat
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn hit(g: &mut Gcra, p: &Params, t: u64, cost: u64) -> Verdict {
        let v = g.check(p, t, cost);
        if v.outcome == Outcome::Allowed {
            g.commit(p, t, cost);
        }
        v
    }

    #[test]
    fn burst_of_500_refilled_at_100_per_second() {
        let p = Params::bucket(100, S, 500);
        let mut g = Gcra::default();
        let t = 1000 * S;
        for i in 0..500 {
            let v = hit(&mut g, &p, t, 1);
            assert_eq!((v.outcome, v.remaining), (Outcome::Allowed, 499 - i));
        }
        let v = hit(&mut g, &p, t, 1);
        assert_eq!((v.outcome, v.retry_after), (Outcome::Rejected, 10 * MS));
        assert_eq!(hit(&mut g, &p, t + 10 * MS, 1).outcome, Outcome::Allowed);
    }

    #[test]
    fn capacity_three_refilled_every_four_seconds() {
        let p = Params::bucket(1, 4 * S, 3);
        let mut g = Gcra::default();
        for _ in 0..3 {
            assert_eq!(hit(&mut g, &p, 50 * S, 1).outcome, Outcome::Allowed);
        }
        let v = hit(&mut g, &p, 50 * S, 1);
        assert_eq!(
            (v.outcome, v.retry_after, v.remaining),
            (Outcome::Rejected, 4 * S, 0)
        );
        assert_eq!(hit(&mut g, &p, 54 * S, 1).outcome, Outcome::Allowed);
    }

    #[test]
    fn cost_equal_to_burst_is_admissible_and_above_it_never() {
        let p = Params::bucket(5, S, 5);
        let mut g = Gcra::default();
        assert_eq!(hit(&mut g, &p, 10 * S, 6).outcome, Outcome::Exceeds);
        assert_eq!(hit(&mut g, &p, 10 * S, 5).outcome, Outcome::Allowed);
    }

    #[test]
    fn regression_end_of_time_saturated_tat_refilled_the_bucket() {
        // Bug: near u64::MAX, TAT + c*T saturated to u64::MAX, so `TAT - t` shrank and the bucket
        // refilled for free: every request at t = u64::MAX was admitted.
        let p = Params::bucket(1, S, 3);
        for t in [u64::MAX, u64::MAX - 1, u64::MAX - 2 * S] {
            let mut g = Gcra::default();
            let admitted = (0..10)
                .filter(|_| hit(&mut g, &p, t, 1).outcome == Outcome::Allowed)
                .count();
            assert!(admitted <= 3, "{admitted} admitted at {t}");
            let v = hit(&mut g, &p, t, 1);
            assert_eq!(v.outcome, Outcome::Rejected);
            assert!(v.retry_after > 0 && v.retry_after <= p.tau());
        }
    }

    #[test]
    fn only_the_last_reservation_steps_back() {
        // A queue: 1 per second, 5 places; three reservations at t leave at t, t+1 s, t+2 s.
        let p = Params::bucket(1, S, 5);
        let t = 100 * S;
        let mut g = Gcra::default();
        let ends: Vec<u64> = (0..3)
            .map(|_| t + hit(&mut g, &p, t, 1).reset_after)
            .collect();
        assert_eq!(ends, [t + S, t + 2 * S, t + 3 * S]);
        // The middle one is not the last: nothing moves.
        g.step_back(&p, t, ends[1], 1);
        assert_eq!(g.tat(), t + 3 * S);
        // The last one gives its slot back; the one before it is the last now.
        g.step_back(&p, t, ends[2], 1);
        assert_eq!(g.tat(), t + 2 * S);
        g.step_back(&p, t, ends[2], 1);
        assert_eq!(g.tat(), t + 2 * S, "a step back happens once");
        // The next arrival takes the freed slot.
        assert_eq!(hit(&mut g, &p, t, 1).reset_after, 3 * S);
    }

    #[test]
    fn a_step_back_never_goes_before_now() {
        let p = Params::bucket(1, S, 5);
        let mut g = Gcra::default();
        let end = 100 * S + hit(&mut g, &p, 100 * S, 3).reset_after;
        g.step_back(&p, 102 * S, end, 3);
        assert_eq!(g.tat(), 102 * S);
    }

    #[test]
    fn exactly_burst_after_a_long_idle_gap() {
        let p = Params::bucket(10, S, 10);
        let mut g = Gcra::default();
        hit(&mut g, &p, 10 * S, 10);
        let t = 10 * S + 11 * p.emission;
        let admitted = (0..20)
            .filter(|_| hit(&mut g, &p, t, 1).outcome == Outcome::Allowed)
            .count();
        assert_eq!(admitted, 10);
    }
}
