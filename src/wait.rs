//! The one rule of waiting for a slot, shared by [`RateLimiter::until_ready`](crate::RateLimiter::until_ready)
//! and the layer's pacing mode: after each decision, go, give up, or sleep for the wait the
//! rejection names (never less than a microsecond, so a clock that does not move cannot make it
//! spin) while the total stays within the maximum.

use std::time::Duration;

use crate::decision::{Decision, Outcome};

/// What a waiter does after a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Admitted: go.
    Go,
    /// Sleep this long, then ask again.
    Sleep(Duration),
    /// The slot comes later than the maximum wait allows.
    TooLong,
    /// The cost can never be admitted: waiting does not help.
    Never,
}

/// How long a request has waited so far.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Waiter {
    waited: Duration,
}

impl Waiter {
    /// The step after `d`, for a wait of at most `max` in total. A sleep it answers counts as
    /// waited.
    pub(crate) fn next(&mut self, d: &Decision, max: Duration) -> Next {
        match d.outcome() {
            Outcome::Allowed => Next::Go,
            Outcome::Exceeds => Next::Never,
            Outcome::Rejected => {
                let wait = Duration::from_nanos(d.retry_after).max(Duration::from_micros(1));
                let total = self.waited.saturating_add(wait);
                if total > max {
                    return Next::TooLong;
                }
                self.waited = total;
                Next::Sleep(wait)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(retry_after: u64) -> Decision {
        Decision {
            outcome: Outcome::Rejected,
            limit: 1,
            remaining: 0,
            reset_after: retry_after,
            retry_after,
            time: 0,
            quota: 0,
            cost: 0,
            local: false,
            bound: 0,
            shed: false,
        }
    }

    #[test]
    fn a_waiter_sleeps_until_the_total_would_pass_the_maximum() {
        let max = Duration::from_secs(3);
        let mut w = Waiter::default();
        let d = rejected(1_000_000_000);
        assert_eq!(w.next(&d, max), Next::Sleep(Duration::from_secs(1)));
        assert_eq!(w.next(&d, max), Next::Sleep(Duration::from_secs(1)));
        assert_eq!(w.next(&d, max), Next::Sleep(Duration::from_secs(1)));
        assert_eq!(w.next(&d, max), Next::TooLong);
    }

    #[test]
    fn a_waiter_never_sleeps_for_nothing_and_never_waits_for_the_impossible() {
        let mut w = Waiter::default();
        assert_eq!(
            w.next(&rejected(0), Duration::from_secs(1)),
            Next::Sleep(Duration::from_micros(1))
        );
        let never = Decision {
            outcome: Outcome::Exceeds,
            ..rejected(0)
        };
        assert_eq!(w.next(&never, Duration::MAX), Next::Never);
        let go = Decision {
            outcome: Outcome::Allowed,
            ..rejected(0)
        };
        assert_eq!(w.next(&go, Duration::ZERO), Next::Go);
    }
}
