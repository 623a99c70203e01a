//! The algorithms: pure state transitions `(state, now, quota, cost) -> (state, decision)`.
//!
//! No I/O and no locks here: stores own the state and its atomicity, strategies own the arithmetic.
//! Time is counted in ticks of the store's unit (nanoseconds in memory, microseconds on Redis).

mod convert;
mod fixed_window;
mod gcra;
mod moving_window;
mod sliding_window;

use std::fmt;
use std::str::FromStr;

use crate::decision::Outcome;
use crate::quota::{ParseError, ParseErrorKind};

pub(crate) use moving_window::MAX_MOVING_WINDOW_LIMIT;

pub(crate) use convert::{Held, convert};
pub(crate) use fixed_window::{
    FIRST_HIT_SPAN, FixedWindow, bits_for, first_hit_grain, first_hit_layout,
};
pub(crate) use gcra::Gcra;
pub(crate) use moving_window::{MovingWindow, SharedLog};
pub(crate) use sliding_window::SlidingWindow;

/// Which algorithm a rule uses. The [guide](crate::guide::strategies) compares them.
///
/// # Drawn: the edge attack
///
/// Five requests 100 ms before a window edge and five at it, twice, under `5/10s` (burst 5): the
/// clock-aligned fixed window admits all ten within 100 ms; every other strategy admits five. Each
/// dot is a request (filled: admitted; cross: rejected), the line the admitted count in the
/// trailing 10 s, grey verticals the windows. Drawn by the `simulate` example
/// (`cargo run --example simulate -- --traffic edge-attack --quota 5/10s --burst 5 --out DIR`;
/// `scripts/plots.sh` regenerates these pictures).
///
#[doc = include_str!("../../docs/img/edge-attack/fixed-window.svg")]
///
#[doc = include_str!("../../docs/img/edge-attack/fixed-window-first-hit.svg")]
///
#[doc = include_str!("../../docs/img/edge-attack/moving-window.svg")]
///
#[doc = include_str!("../../docs/img/edge-attack/sliding-window.svg")]
///
#[doc = include_str!("../../docs/img/edge-attack/token-bucket.svg")]
///
#[doc = include_str!("../../docs/img/edge-attack/leaky-bucket.svg")]
///
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Fixed window aligned to the clock: windows are whole multiples of the period in Unix time.
    /// Cheapest; up to `2N` across a window edge.
    FixedWindow,
    /// Fixed window that opens at a key's first request (and the first one after it ends).
    FixedWindowFirstHit,
    /// Moving window (sliding log): exact, `O(N)` memory per key.
    MovingWindow,
    /// Sliding window counter: two counters per key, close to exact on real traffic (the default).
    #[default]
    SlidingWindow,
    /// Token bucket (GCRA): bursts up to the burst size, then a steady rate.
    TokenBucket,
    /// Leaky bucket as a meter: capacity `B` drained at `N` per period; rejects when full.
    LeakyBucket,
}

impl Strategy {
    /// All strategies, in the order of the CLI names.
    pub const ALL: [Strategy; 6] = [
        Strategy::FixedWindow,
        Strategy::FixedWindowFirstHit,
        Strategy::MovingWindow,
        Strategy::SlidingWindow,
        Strategy::TokenBucket,
        Strategy::LeakyBucket,
    ];

    /// The name used on command lines (`fixed-window`, `sliding-window`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::FixedWindow => "fixed-window",
            Strategy::FixedWindowFirstHit => "fixed-window-first-hit",
            Strategy::MovingWindow => "moving-window",
            Strategy::SlidingWindow => "sliding-window",
            Strategy::TokenBucket => "token-bucket",
            Strategy::LeakyBucket => "leaky-bucket",
        }
    }

    /// `true` for the token and leaky bucket, whose limit is the burst and which need `T >= 1` tick.
    pub const fn is_bucket(self) -> bool {
        matches!(self, Strategy::TokenBucket | Strategy::LeakyBucket)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParseError::new(s, 0, ParseErrorKind::UnknownStrategy))
    }
}

/// A quota in ticks of a store's unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// `N`.
    pub(crate) limit: u64,
    /// `W` in ticks (at least 1).
    pub(crate) window: u64,
    /// `T = ceil(W / N)` in ticks, for the buckets (at least 1).
    pub(crate) emission: u64,
    /// `B`.
    pub(crate) burst: u64,
    /// Where clock-aligned windows start, in `0..window` ticks: at the times `t` with
    /// `(t + offset) % window == 0` (a [`WindowOffset`](crate::WindowOffset); 0 for UTC).
    pub(crate) offset: u64,
}

impl Params {
    /// A window quota: `limit` per `window` ticks.
    #[cfg(test)]
    pub(crate) fn window(limit: u64, window: u64) -> Self {
        Self::bucket(limit, window, limit)
    }

    /// A bucket quota: `limit` per `window` ticks, burst `burst`.
    pub(crate) fn bucket(limit: u64, window: u64, burst: u64) -> Self {
        Self {
            limit,
            window,
            emission: window.div_ceil(limit).max(1),
            burst,
            offset: 0,
        }
    }

    /// The start of the clock-aligned window that holds `max(now, floor)`, computed from `now`
    /// itself when it is the larger (the usual case): a caller that divides `now` by the window too
    /// (a packed state's ring) then shares the division.
    #[inline]
    pub(crate) fn window_start_from(&self, now: u64, floor: u64) -> u64 {
        if now >= floor {
            self.window_start(now)
        } else {
            self.window_start(floor)
        }
    }

    /// The start of the clock-aligned window that holds `t`.
    #[inline]
    pub(crate) fn window_start(&self, t: u64) -> u64 {
        // UTC-aligned windows (every packed rule): one division instead of two.
        if self.offset == 0 {
            return t - t % self.window;
        }
        // `t % window + offset < 2 * window`: no overflow for any period up to MAX_PERIOD.
        t.saturating_sub((t % self.window + self.offset) % self.window)
    }

    /// `B * T`, the bucket's depth in ticks.
    pub(crate) fn tau(&self) -> u64 {
        self.burst.saturating_mul(self.emission)
    }
}

/// One quota's answer, in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) outcome: Outcome,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after: u64,
    pub(crate) retry_after: u64,
}

impl Verdict {
    pub(crate) fn allowed(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Self {
            outcome: Outcome::Allowed,
            limit,
            remaining,
            reset_after,
            retry_after: 0,
        }
    }

    pub(crate) fn rejected(limit: u64, remaining: u64, reset_after: u64, retry_after: u64) -> Self {
        Self {
            outcome: Outcome::Rejected,
            limit,
            remaining,
            reset_after,
            retry_after,
        }
    }

    pub(crate) fn exceeds(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Self {
            outcome: Outcome::Exceeds,
            limit,
            remaining,
            reset_after,
            retry_after: 0,
        }
    }
}

/// The state of one key under one quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum QuotaState {
    Fixed(FixedWindow),
    Moving(MovingWindow),
    Sliding(SlidingWindow),
    Gcra(Gcra),
}

impl QuotaState {
    /// A new key's state for `strategy`.
    pub(crate) fn new(strategy: Strategy) -> Self {
        match strategy {
            Strategy::FixedWindow | Strategy::FixedWindowFirstHit => {
                QuotaState::Fixed(FixedWindow::default())
            }
            Strategy::MovingWindow => QuotaState::Moving(MovingWindow::default()),
            Strategy::SlidingWindow => QuotaState::Sliding(SlidingWindow::default()),
            Strategy::TokenBucket | Strategy::LeakyBucket => QuotaState::Gcra(Gcra::default()),
        }
    }

    /// Whether this state belongs to `strategy` (a rule may change between calls, e.g. tiers).
    #[inline]
    pub(crate) fn fits(&self, strategy: Strategy) -> bool {
        matches!(
            (self, strategy),
            (
                QuotaState::Fixed(_),
                Strategy::FixedWindow | Strategy::FixedWindowFirstHit
            ) | (QuotaState::Moving(_), Strategy::MovingWindow)
                | (QuotaState::Sliding(_), Strategy::SlidingWindow)
                | (
                    QuotaState::Gcra(_),
                    Strategy::TokenBucket | Strategy::LeakyBucket
                )
        )
    }

    #[inline]
    pub(crate) fn check(&mut self, strategy: Strategy, p: &Params, now: u64, cost: u64) -> Verdict {
        match self {
            QuotaState::Fixed(s) => s.check(p, now, cost, strategy == Strategy::FixedWindow),
            QuotaState::Moving(s) => s.check(p, now, cost),
            QuotaState::Sliding(s) => s.check(p, now, cost),
            QuotaState::Gcra(s) => s.check(p, now, cost),
        }
    }

    #[inline]
    pub(crate) fn commit(&mut self, strategy: Strategy, p: &Params, now: u64, cost: u64) {
        match self {
            QuotaState::Fixed(s) => s.commit(now, cost, strategy == Strategy::FixedWindow),
            QuotaState::Moving(s) => s.commit(p, now, cost),
            QuotaState::Sliding(s) => s.commit(cost),
            QuotaState::Gcra(s) => s.commit(p, now, cost),
        }
    }

    /// Settles a reservation (see [`Op::Settle`]); returns the charge dropped beyond a full log.
    pub(crate) fn settle(
        &mut self,
        strategy: Strategy,
        p: &Params,
        now: u64,
        at: u64,
        reserved: u64,
        actual: u64,
    ) -> u64 {
        match self {
            QuotaState::Fixed(s) => {
                s.settle(
                    p,
                    now,
                    at,
                    reserved,
                    actual,
                    strategy == Strategy::FixedWindow,
                );
                0
            }
            QuotaState::Moving(s) => s.settle(p, now, at, reserved, actual),
            QuotaState::Sliding(s) => {
                s.settle(p, now, at, reserved, actual);
                0
            }
            QuotaState::Gcra(s) => {
                s.settle(p, now, reserved, actual);
                0
            }
        }
    }

    #[inline]
    pub(crate) fn fresh_at(&self, p: &Params) -> u64 {
        match self {
            QuotaState::Fixed(s) => s.fresh_at(p),
            QuotaState::Moving(s) => s.fresh_at(p),
            QuotaState::Sliding(s) => s.fresh_at(p),
            QuotaState::Gcra(s) => s.fresh_at(),
        }
    }
}

/// What a store is asked to do with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Admit `cost` if every quota has room (all or nothing).
    Check(u32),
    /// Report the state without consuming (a check of cost 0).
    Peek,
    /// Settle a reservation: the check at time `at` (the store's time, as in
    /// [`Decision::time`], in nanoseconds since the Unix epoch) admitted `reserved`; charge `actual`
    /// instead (0: a full refund), in the window or bucket the reservation was counted in.
    ///
    /// Built only from a [`Reservation`](crate::Reservation) a check returned
    /// ([`Op::settle`]): outside this crate the variant can be matched but not constructed, so no
    /// caller can refund an amount or a time no check reserved.
    ///
    /// ```compile_fail
    /// let forged = tollgate::Op::Settle { reserved: 100, actual: 0, at: 0, bound: 0 };
    /// ```
    ///
    /// [`Decision::time`]: crate::Decision::time
    #[non_exhaustive]
    Settle {
        /// The cost the check admitted.
        reserved: u32,
        /// The cost to charge.
        actual: u32,
        /// The check's time, nanoseconds since the Unix epoch.
        at: u64,
        /// The limiter and key whose check made the reservation (a fingerprint; 0: a store's
        /// own): a limiter applies the settlement only when they are its own and the key's.
        bound: u64,
    },
    /// Forget the key's state.
    Reset,
    /// Gives a shaping queue's last reservation back (its waiter left before departure): if the
    /// key's state still ends at `end` (the reservation's end, in nanoseconds since the Unix
    /// epoch: its decision's [`time`](crate::Decision::time) plus
    /// [`reset_after`](crate::Decision::reset_after)), no reservation came after it and the state
    /// steps back by `cost` (never before now). Otherwise nothing changes: the gap stays, and the
    /// later waiters keep their departures. For the bucket strategies only (the window strategies
    /// ignore it); answers like a peek.
    StepBack {
        /// The cost the reservation admitted.
        cost: u32,
        /// The reservation's end, nanoseconds since the Unix epoch.
        end: u64,
    },
}

impl Op {
    /// The settlement of `reservation` for `units` (see [`Op::Settle`]).
    pub fn settle(reservation: crate::decision::Reservation, units: u32) -> Self {
        Op::Settle {
            reserved: reservation.cost,
            actual: units,
            at: reservation.time,
            bound: reservation.bound,
        }
    }

    /// Test hook (feature `test-util`, not part of the API): a settlement of any reservation,
    /// for the crate's oracles that replay settlements against a store directly.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn settle_any(reserved: u32, actual: u32, at: u64) -> Self {
        Op::Settle {
            reserved,
            actual,
            at,
            bound: 0,
        }
    }
}

/// Runs `op` on a key's states (one per quota), all quotas at once: a request rejected by one quota
/// consumes nothing from the others. Returns the index of the reported quota and its verdict.
pub(crate) fn apply(
    states: &mut [QuotaState],
    strategy: Strategy,
    params: &[Params],
    now: u64,
    op: Op,
) -> (usize, Verdict) {
    let (index, v, _) = apply_settling(states, strategy, params, now, op);
    (index, v)
}

/// [`apply`], with the units of a settlement that could not be recorded: a charge beyond a full
/// moving-window log (the most any quota dropped; 0 for every other operation and strategy).
pub(crate) fn apply_settling(
    states: &mut [QuotaState],
    strategy: Strategy,
    params: &[Params],
    now: u64,
    op: Op,
) -> (usize, Verdict, u64) {
    let mut dropped = 0;
    let cost = match op {
        Op::Check(c) => u64::from(c),
        Op::Peek => 0,
        Op::Settle {
            reserved,
            actual,
            at,
            ..
        } => {
            for (s, p) in states.iter_mut().zip(params) {
                let lost = s.settle(strategy, p, now, at, u64::from(reserved), u64::from(actual));
                dropped = dropped.max(lost);
            }
            0
        }
        Op::Reset => {
            for s in states.iter_mut() {
                *s = QuotaState::new(strategy);
            }
            0
        }
        Op::StepBack { cost, end } => {
            for (s, p) in states.iter_mut().zip(params) {
                if let QuotaState::Gcra(g) = s {
                    g.step_back(p, now, end, u64::from(cost));
                }
            }
            0
        }
    };
    let mut reported: Option<(usize, Verdict)> = None;
    let mut all_allowed = true;
    for (i, (s, p)) in states.iter_mut().zip(params).enumerate() {
        let v = s.check(strategy, p, now, cost);
        all_allowed &= v.outcome == Outcome::Allowed;
        if reported.is_none_or(|(_, r)| reports_over(&v, &r)) {
            reported = Some((i, v));
        }
    }
    if all_allowed && cost > 0 {
        for (s, p) in states.iter_mut().zip(params) {
            s.commit(strategy, p, now, cost);
        }
    }
    let (index, v) = reported.unwrap_or((0, Verdict::allowed(0, 0, 0)));
    (index, v, dropped)
}

/// The reported quota among per-quota verdicts (index, verdict), by the same rule as [`apply`]: for
/// stores that compute the verdicts elsewhere (the Redis scripts). `None` for no verdict.
pub(crate) fn reported(verdicts: impl IntoIterator<Item = Verdict>) -> Option<(usize, Verdict)> {
    let mut reported: Option<(usize, Verdict)> = None;
    for (i, v) in verdicts.into_iter().enumerate() {
        if reported.is_none_or(|(_, r)| reports_over(&v, &r)) {
            reported = Some((i, v));
        }
    }
    reported
}

/// Whether `a` should be reported instead of `b`: a "never" over a rejection over an allowance; among
/// rejections the longest wait; among allowances the fewest remaining, then the later reset.
pub(crate) fn reports_over(a: &Verdict, b: &Verdict) -> bool {
    let rank = |o: Outcome| match o {
        Outcome::Allowed => 0,
        Outcome::Rejected => 1,
        Outcome::Exceeds => 2,
    };
    match rank(a.outcome).cmp(&rank(b.outcome)) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => match a.outcome {
            Outcome::Rejected => a.retry_after > b.retry_after,
            _ => {
                (a.remaining, std::cmp::Reverse(a.reset_after))
                    < (b.remaining, std::cmp::Reverse(b.reset_after))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn rejection_by_one_quota_consumes_nothing_from_the_others() {
        let params = [Params::window(5, S), Params::window(6, 60 * S)];
        let mut states = vec![QuotaState::new(Strategy::MovingWindow); 2];
        let t = 100 * S;
        for _ in 0..5 {
            assert_eq!(
                apply(
                    &mut states,
                    Strategy::MovingWindow,
                    &params,
                    t,
                    Op::Check(1)
                )
                .1
                .outcome,
                Outcome::Allowed
            );
        }
        let (i, v) = apply(
            &mut states,
            Strategy::MovingWindow,
            &params,
            t,
            Op::Check(1),
        );
        assert_eq!((i, v.outcome), (0, Outcome::Rejected));
        let (i, v) = apply(
            &mut states,
            Strategy::MovingWindow,
            &params,
            t + S,
            Op::Check(1),
        );
        assert_eq!(
            (i, v.outcome, v.remaining),
            (1, Outcome::Allowed, 0),
            "the minute quota had 1 left"
        );
        let (i, v) = apply(
            &mut states,
            Strategy::MovingWindow,
            &params,
            t + 2 * S,
            Op::Check(1),
        );
        assert_eq!(
            (i, v.outcome, v.retry_after),
            (1, Outcome::Rejected, 58 * S)
        );
    }

    #[test]
    fn per_key_state_stays_a_few_words() {
        // Per quota: fixed window 16 B (start, count), sliding counter 16 B (bucket, cur, prev),
        // GCRA 8 B (TAT), moving window 32 B (a VecDeque header; its ring is on the heap, at most
        // N x 8 B). The enum is as large as its largest variant.
        use std::mem::size_of;
        assert_eq!(size_of::<FixedWindow>(), 16);
        assert_eq!(size_of::<SlidingWindow>(), 16);
        assert_eq!(size_of::<Gcra>(), 8);
        assert_eq!(size_of::<MovingWindow>(), 32);
        assert!(size_of::<QuotaState>() <= 32);
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>().unwrap(), s);
        }
        assert!(
            "fastest"
                .parse::<Strategy>()
                .unwrap_err()
                .to_string()
                .contains("sliding-window")
        );
    }
}
