//! The answer to one request: allowed or not, and what the rate-limit headers say.

use std::time::Duration;

use crate::strategy::Verdict;

/// Whether a request was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Admitted; its cost was consumed.
    Allowed,
    /// Not admitted now; [`Decision::retry_after`] says when a request of the same cost will be.
    Rejected,
    /// Never admissible: the cost exceeds what the quota can ever admit (its limit, or its burst
    /// for the bucket strategies). Waiting does not help.
    Exceeds,
}

/// A decision on one request, with the values the `x-ratelimit-*` headers carry.
///
/// The values are those of the *reported* quota: on a rejection the rejecting quota with the
/// longest wait; when allowed the quota with the fewest remaining (ties: the later reset).
/// The [guide](crate::guide::strategies#formulas-per-strategy) defines each value per strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    pub(crate) outcome: Outcome,
    pub(crate) limit: u32,
    pub(crate) remaining: u32,
    /// Nanoseconds (kept as integers: the hot path builds no `Duration`).
    pub(crate) reset_after: u64,
    /// Nanoseconds.
    pub(crate) retry_after: u64,
    /// Nanoseconds since the Unix epoch.
    pub(crate) time: u64,
    pub(crate) quota: u16,
    /// The cost an admitted check reserved (0 otherwise).
    pub(crate) cost: u32,
    /// Taken in this process by a stand-in for the store (the Redis store's local fallback during
    /// an outage), not by the store itself.
    pub(crate) local: bool,
    /// The limiter (name and rule) and key the decision was made for, as a fingerprint set by the
    /// limiter (0: made by a store directly): a reservation settles only against them.
    pub(crate) bound: u64,
    /// Rejected without asking the store, which had no room to ask it in time (the Redis store's
    /// overload shedding).
    pub(crate) shed: bool,
}

/// What an admitted check reserved: its cost, at the store's time of the check, for the limiter and
/// key that made the check. Settle it with [`RateLimiter::settle`](crate::RateLimiter::settle) on
/// that limiter and key, to charge the actual cost (0 gives it all back) in the window or bucket the
/// check counted it in; against another limiter, rule or key it is refused
/// ([`StoreErrorKind::ForeignReservation`](crate::StoreErrorKind::ForeignReservation)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reservation {
    pub(crate) cost: u32,
    /// Nanoseconds since the Unix epoch.
    pub(crate) time: u64,
    /// The limiter and key whose check made it ([`Decision`]'s `bound`).
    pub(crate) bound: u64,
}

impl Reservation {
    /// The cost the check admitted.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The store's time of the check, since the Unix epoch.
    pub fn time(&self) -> Duration {
        Duration::from_nanos(self.time)
    }
}

impl Decision {
    /// Whether the Redis store's local fallback (`RedisStoreBuilder::local_fallback`) took this
    /// decision during an outage (or its blocked-key cache answered for the outage), instead of
    /// Redis. Always `false` for the memory store.
    pub fn decided_locally(&self) -> bool {
        self.local
    }

    /// Whether the check was shed: rejected by the Redis store without an answer from Redis, as it
    /// had no room to ask Redis within its timeout (overload; see `RedisStoreBuilder::max_in_flight`).
    /// The request may be under its limit: retrying after [`retry_after`](Self::retry_after) may
    /// succeed. Always `false` for the memory store.
    pub fn was_shed(&self) -> bool {
        self.shed
    }

    /// Allowed, rejected, or never admissible.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// `true` when the request was admitted.
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// The largest value `remaining` can take: `N` for the window strategies, the burst `B` for the
    /// token and leaky bucket (`x-ratelimit-limit`).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// How much more cost is admitted right now (`x-ratelimit-remaining`), after this request.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// How long until `remaining` is back at `limit` if no more requests come (zero when it is
    /// already there). `x-ratelimit-reset` is this, rounded up to whole seconds.
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// For a rejected request: how long until a request of the same cost is admitted, if no other
    /// request comes first. `None` when allowed, and when the cost can never be admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        (self.outcome == Outcome::Rejected).then(|| Duration::from_nanos(self.retry_after))
    }

    /// The store's time when the decision was taken, since the Unix epoch (the Redis server's time
    /// for the Redis store). With [`reset_after`](Self::reset_after) it gives the reset as Unix time.
    pub fn time(&self) -> Duration {
        Duration::from_nanos(self.time)
    }

    /// The index of the reported quota among the rule's quotas.
    pub fn quota_index(&self) -> usize {
        usize::from(self.quota)
    }

    /// What the check reserved, if it admitted a cost above 0: settle it with
    /// [`RateLimiter::settle`](crate::RateLimiter::settle). A rejection reserves nothing, nor does a
    /// peek or a settlement.
    pub fn reservation(&self) -> Option<Reservation> {
        (self.outcome == Outcome::Allowed && self.cost > 0).then_some(Reservation {
            cost: self.cost,
            time: self.time,
            bound: self.bound,
        })
    }

    /// This decision as the answer to `op`: a check's admitted cost is its reservation.
    #[inline]
    #[cfg(any(feature = "redis", test))]
    pub(crate) fn answering(mut self, op: crate::strategy::Op) -> Self {
        if let crate::strategy::Op::Check(cost) = op {
            if self.outcome == Outcome::Allowed {
                self.cost = cost;
            }
        }
        self
    }

    /// This decision with its reservation spent: a settlement was tried, so nothing settles it
    /// again (its estimate stands).
    pub(crate) fn settled(mut self) -> Self {
        self.cost = 0;
        self
    }

    /// `reset_after` in whole seconds, rounded up (the `x-ratelimit-reset` delta value).
    pub fn reset_secs(&self) -> u64 {
        ceil_nanos_to_secs(self.reset_after)
    }

    /// The reset as Unix time in whole seconds, rounded up.
    pub fn reset_unix_secs(&self) -> u64 {
        ceil_nanos_to_secs(self.time.saturating_add(self.reset_after))
    }

    /// The `Retry-After` value in whole seconds: the wait rounded up, and at least 1. `None` when
    /// allowed or never admissible.
    pub fn retry_after_secs(&self) -> Option<u64> {
        (self.outcome == Outcome::Rejected).then(|| ceil_nanos_to_secs(self.retry_after).max(1))
    }
}

/// Whole seconds, rounded up, from nanoseconds.
pub(crate) fn ceil_nanos_to_secs(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000_000)
}

/// A verdict in ticks of `tick_nanos` as a [`Decision`].
#[inline]
pub(crate) fn to_decision(index: usize, v: Verdict, now_ticks: u64, tick_nanos: u64) -> Decision {
    let limit = u32::try_from(v.limit).unwrap_or(u32::MAX);
    Decision {
        outcome: v.outcome,
        limit,
        remaining: u32::try_from(v.remaining).unwrap_or(u32::MAX).min(limit),
        reset_after: v.reset_after.saturating_mul(tick_nanos),
        retry_after: v.retry_after.saturating_mul(tick_nanos),
        time: now_ticks.saturating_mul(tick_nanos),
        quota: u16::try_from(index).unwrap_or(u16::MAX),
        cost: 0,
        local: false,
        bound: 0,
        shed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(outcome: Outcome, reset: Duration, retry: Duration) -> Decision {
        Decision {
            outcome,
            limit: 10,
            remaining: 0,
            reset_after: reset.as_nanos() as u64,
            retry_after: retry.as_nanos() as u64,
            time: 1_000_000_000,
            quota: 0,
            cost: 0,
            local: false,
            bound: 0,
            shed: false,
        }
    }

    #[test]
    fn header_values_round_up() {
        let d = decision(
            Outcome::Rejected,
            Duration::from_millis(1500),
            Duration::from_millis(300),
        );
        assert_eq!(d.reset_secs(), 2);
        assert_eq!(d.retry_after_secs(), Some(1));
        assert_eq!(d.reset_unix_secs(), 3);
        let d = decision(Outcome::Rejected, Duration::ZERO, Duration::ZERO);
        assert_eq!(d.retry_after_secs(), Some(1), "never 0");
        assert_eq!(
            decision(Outcome::Allowed, Duration::ZERO, Duration::ZERO).retry_after(),
            None
        );
        assert_eq!(
            decision(Outcome::Exceeds, Duration::ZERO, Duration::ZERO).retry_after(),
            None
        );
    }
}
