//! Properties of every strategy against brute-force oracles, through the
//! public `RateLimiter` API on a `ManualClock`.
//!
//! - The moving window, the fixed window (both alignments), the sliding window counter,
//!   the token bucket (GCRA), the leaky bucket: every decision (outcome, limit, remaining,
//!   reset_after, retry_after) equals the oracle of `tests/support/oracle.rs`, and the hard bound holds.
//! - Differential: the leaky-bucket meter decides exactly as the token bucket.
//! - GCRA differential against `governor` (see `gcra_equals_governor` for the conventions).
//! - Several quotas are all-or-nothing; remaining / reset_after / retry_after are true,
//!   probed on fresh limiters that replay the trace.
//!
//! Scaling: `PROPTEST_CASES` (default 256) and `TOLLGATE_SCALE` (default 1; multiplies the 200 steps
//! per trace). Longer tier: `PROPTEST_CASES=10000 TOLLGATE_SCALE=10 cargo test --release
//! --all-features --test core strategy_props`. Failures persist to `tests/core/strategy_props.proptest-regressions`.

use crate::oracle;

use std::num::NonZeroU32;
use std::time::Duration;

use oracle::{
    Expect, P, RuleOracle, S, bucket_bound_violation, build, config, max_aligned, max_steps,
    max_trailing,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::Strategy as _;
use tollgate::{Op, Outcome, Quota, Strategy};

const KEY: u64 = 7;
const REGRESSIONS: &str = "tests/core/strategy_props.proptest-regressions";

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// A quota for `strategy`: small and large limits, periods from 1 ns to an hour, bucket bursts.
fn arb_quota(
    strategy: Strategy,
    max_limit: u32,
) -> impl proptest::strategy::Strategy<Value = Quota> {
    let limit = prop_oneof![3 => 1u32..=5, 3 => 1u32..=20.min(max_limit), 1 => 1u32..=max_limit];
    let period = prop_oneof![
        1u64..=1000,
        Just(S),
        Just(60 * S),
        Just(3600 * S),
        1u64..=1_000_000_000_000,
    ];
    let burst = prop_oneof![Just(None), (1u32..=30).prop_map(Some)];
    (limit, period, burst).prop_map(move |(n, w, b)| {
        let w = if strategy.is_bucket() {
            w.max(u64::from(n))
        } else {
            w
        };
        let q = Quota::new(nz(n), Duration::from_nanos(w)).expect("valid period");
        match b {
            Some(b) => q.with_burst(nz(b)),
            None => q,
        }
    })
}

/// Gaps in ns and costs: many equal timestamps, gaps of exactly `W`, `W +- 1`, `T`, random.
fn arb_trace(
    q: &Quota,
    steps: usize,
) -> impl proptest::strategy::Strategy<Value = Vec<(u64, u32)>> + use<> {
    let p = P::of(q);
    let w = p.w;
    let t = p.t;
    let gap = prop_oneof![
        3 => Just(0u64),
        1 => Just(w),
        1 => (w.saturating_sub(1))..=(w + 1),
        1 => Just(t),
        3 => 0..=2 * t,
        2 => 0..=2 * w,
        1 => 0..=(w / 10 + 1),
    ];
    let top = u32::try_from(p.n.max(p.b) + 1).unwrap_or(u32::MAX);
    let cost = prop_oneof![6 => Just(1u32), 2 => 0..=top.min(4), 1 => 0..=top];
    prop::collection::vec((gap, cost), 1..=steps)
}

fn arb_start() -> impl proptest::strategy::Strategy<Value = u64> {
    prop_oneof![0u64..=4_000_000_000_000_000_000, Just(19_675 * 86_400 * S)]
}

/// Absolute times of a trace.
fn times(start: u64, trace: &[(u64, u32)]) -> Vec<(u64, u32)> {
    let mut t = start;
    trace
        .iter()
        .map(|&(gap, c)| {
            t += gap;
            (t, c)
        })
        .collect()
}

/// The admitted requests (time, cost) of a run, and every decision.
type Run = (Vec<(u64, u64)>, Vec<Expect>);

/// Runs `trace` on a limiter and the oracle; every decision must match. Returns the admitted
/// requests (time, cost) and the decisions.
fn run(
    strategy: Strategy,
    quotas: &[Quota],
    start: u64,
    trace: &[(u64, u32)],
) -> Result<Run, TestCaseError> {
    let (l, clock) = build(strategy, quotas, start);
    let mut o = RuleOracle::new(strategy, quotas);
    let mut admitted = Vec::new();
    let mut seen = Vec::new();
    for (i, &(t, cost)) in times(start, trace).iter().enumerate() {
        clock.set_nanos(t);
        let d = l.check_now(&KEY, cost);
        let (index, want) = o.decide(t, u64::from(cost));
        let got = Expect::of(&d);
        prop_assert_eq!(got, want, "step {} at t = {} cost {}", i, t, cost);
        prop_assert_eq!(d.quota_index(), index, "reported quota, step {}", i);
        prop_assert!(d.remaining() <= d.limit());
        if d.is_allowed() && cost > 0 {
            admitted.push((t, u64::from(cost)));
        }
        seen.push(got);
    }
    Ok((admitted, seen))
}

/// The hard bound of `strategy` for quota `q` over the admitted requests.
fn check_bound(
    strategy: Strategy,
    q: &Quota,
    admitted: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let p = P::of(q);
    match strategy {
        Strategy::MovingWindow => {
            prop_assert!(max_trailing(admitted, p.w) <= p.n, "moving window over N");
        }
        Strategy::FixedWindow => {
            prop_assert!(max_aligned(admitted, p.w) <= p.n, "fixed window over N");
            prop_assert!(
                max_trailing(admitted, p.w) <= 2 * p.n,
                "fixed window over 2N"
            );
        }
        Strategy::FixedWindowFirstHit => {
            // Windows from the log: a window opens at the first admission at or after the last end.
            let mut start = None;
            let mut used = 0;
            for &(t, c) in admitted {
                match start {
                    Some(s) if t - s < p.w => used += c,
                    _ => {
                        start = Some(t);
                        used = c;
                    }
                }
                prop_assert!(used <= p.n, "first-hit window over N");
            }
            prop_assert!(max_trailing(admitted, p.w) <= 2 * p.n, "first-hit over 2N");
        }
        Strategy::SlidingWindow => {
            prop_assert!(
                max_trailing(admitted, p.w) <= 2 * p.n,
                "sliding counter over 2N"
            );
        }
        _ => {
            let v = bucket_bound_violation(admitted, p.b, p.t);
            prop_assert!(v.is_none(), "bucket bound B + floor(L/T) broken at {:?}", v);
        }
    }
    Ok(())
}

fn arb_case(
    strategy: Strategy,
    max_limit: u32,
    steps: usize,
) -> impl proptest::strategy::Strategy<Value = (Quota, u64, Vec<(u64, u32)>)> {
    arb_quota(strategy, max_limit)
        .prop_flat_map(move |q| (Just(q), arb_start(), arb_trace(&q, steps)))
}

fn equals_oracle(
    strategy: Strategy,
    q: Quota,
    start: u64,
    trace: &[(u64, u32)],
) -> Result<(), TestCaseError> {
    let (admitted, _) = run(strategy, &[q], start, trace)?;
    check_bound(strategy, &q, &admitted)
}

proptest! {
    #![proptest_config(config(REGRESSIONS))]

    /// Moving window == brute-force sum over the log; <= N in every trailing window.
    #[test]
    fn moving_window_equals_oracle((q, start, trace) in arb_case(Strategy::MovingWindow, 200, max_steps())) {
        equals_oracle(Strategy::MovingWindow, q, start, &trace)?;
    }

    /// Clock-aligned fixed window == oracle; <= N per window, <= 2N per trailing window.
    #[test]
    fn fixed_window_aligned_equals_oracle((q, start, trace) in arb_case(Strategy::FixedWindow, 200, max_steps())) {
        equals_oracle(Strategy::FixedWindow, q, start, &trace)?;
    }

    /// First-hit fixed window == oracle; <= N per window, <= 2N per trailing window.
    #[test]
    fn fixed_window_first_hit_equals_oracle((q, start, trace) in arb_case(Strategy::FixedWindowFirstHit, 200, max_steps())) {
        equals_oracle(Strategy::FixedWindowFirstHit, q, start, &trace)?;
    }

    /// Sliding window counter == the integer formula; <= 2N in every trailing window.
    #[test]
    fn sliding_window_equals_formula((q, start, trace) in arb_case(Strategy::SlidingWindow, 200, max_steps())) {
        equals_oracle(Strategy::SlidingWindow, q, start, &trace)?;
    }

    /// GCRA == the continuous-state bucket; <= B + floor(L/T) in every interval.
    #[test]
    fn token_bucket_equals_oracle((q, start, trace) in arb_case(Strategy::TokenBucket, 200, max_steps())) {
        equals_oracle(Strategy::TokenBucket, q, start, &trace)?;
    }

    /// The leaky-bucket meter == the same oracle, and == the token bucket decision by decision.
    #[test]
    fn leaky_bucket_equals_token_bucket((q, start, trace) in arb_case(Strategy::LeakyBucket, 200, max_steps())) {
        let (admitted, leaky) = run(Strategy::LeakyBucket, &[q], start, &trace)?;
        check_bound(Strategy::LeakyBucket, &q, &admitted)?;
        let (_, token) = run(Strategy::TokenBucket, &[q], start, &trace)?;
        prop_assert_eq!(leaky, token);
    }

    /// After an idle gap >= (B+1)T exactly B unit requests pass (governor #107/#249);
    /// cost B is admissible after a full refill and B+1 never is.
    #[test]
    fn exactly_burst_after_idle_gap(
        b in 1u32..=100,
        n in 1u32..=50,
        t in 1u64..=1_000_000_000,
        extra in 0u64..=2_000_000_000,
        (start, trace) in (arb_start(), prop::collection::vec((0u64..=3_000_000_000, 0u32..=3), 0..=50)),
    ) {
        let q = Quota::new(nz(n), Duration::from_nanos(t * u64::from(n))).expect("period").with_burst(nz(b));
        for strategy in [Strategy::TokenBucket, Strategy::LeakyBucket] {
            let (l, clock) = build(strategy, &[q], start);
            let mut now = start;
            for &(gap, c) in &trace {
                now += gap;
                clock.set_nanos(now);
                l.check_now(&KEY, c);
            }
            now += (u64::from(b) + 1) * t + extra;
            clock.set_nanos(now);
            prop_assert_eq!(l.check_now(&KEY, b + 1).outcome(), Outcome::Exceeds);
            let admitted = (0..2 * b + 1).filter(|_| l.check_now(&KEY, 1).is_allowed()).count();
            prop_assert_eq!(admitted, b as usize, "{}", strategy);
            now += u64::from(b) * t;
            clock.set_nanos(now);
            let d = l.check_now(&KEY, b);
            prop_assert!(d.is_allowed(), "cost == burst after a full refill");
            prop_assert_eq!(d.remaining(), 0);
        }
    }

    /// Several quotas are all-or-nothing: decisions equal "all oracles admit" (each oracle
    /// only records what every quota admitted), the reported quota follows the guide, and each
    /// quota keeps its own bound.
    #[test]
    fn several_quotas_all_or_nothing(
        (strategy, quotas, start, trace) in prop::sample::select(Strategy::ALL.to_vec())
            .prop_flat_map(|s| (Just(s), prop::collection::vec(arb_quota(s, 50), 2..=3)))
            .prop_flat_map(|(s, qs)| {
                let steps = arb_trace(&qs[0], max_steps());
                (Just(s), Just(qs), arb_start(), steps)
            })
    ) {
        let (admitted, _) = run(strategy, &quotas, start, &trace)?;
        for q in &quotas {
            check_bound(strategy, q, &admitted)?;
        }
    }

    /// Several quotas on "5/second; 100/minute" with dense random traffic.
    #[test]
    fn five_per_second_and_hundred_per_minute(
        strategy in prop::sample::select(Strategy::ALL.to_vec()),
        start in arb_start(),
        trace in prop::collection::vec((prop_oneof![Just(0u64), 0..=400_000_000u64], 1u32..=3), 1..=max_steps()),
    ) {
        let quotas = [oracle::q("5/second"), oracle::q("100/minute")];
        run(strategy, &quotas, start, &trace)?;
    }

    /// Remaining, reset_after and retry_after are true statements, probed on fresh limiters
    /// that replay the trace up to the probed decision: exactly `remaining` unit requests pass at the
    /// same instant; at `now + reset_after` remaining == limit and not 1 ns earlier; a rejected cost
    /// passes exactly at `now + retry_after` and not 1 ns earlier (for every strategy).
    #[test]
    fn headers_are_true(
        (strategy, q, start, trace) in prop::sample::select(Strategy::ALL.to_vec())
            .prop_flat_map(|s| (Just(s), arb_quota(s, 30)))
            .prop_flat_map(|(s, q)| (Just(s), Just(q), arb_start(), arb_trace(&q, 60))),
        points in prop::collection::vec(any::<Index>(), 4),
    ) {
        let (_, decisions) = run(strategy, &[q], start, &trace)?;
        let abs = times(start, &trace);
        let replay = |upto: usize| {
            let (l, clock) = build(strategy, &[q], start);
            for &(t, c) in &abs[..=upto] {
                clock.set_nanos(t);
                l.check_now(&KEY, c);
            }
            (l, clock)
        };
        for p in points {
            let i = p.index(abs.len());
            let (t, cost) = abs[i];
            let d = decisions[i];
            let (l, _) = replay(i);
            for k in 0..d.remaining {
                prop_assert!(l.check_now(&KEY, 1).is_allowed(), "step {}: unit {} of remaining {}", i, k, d.remaining);
            }
            prop_assert!(!l.check_now(&KEY, 1).is_allowed(), "step {}: more than remaining {}", i, d.remaining);

            let (l, clock) = replay(i);
            clock.set_nanos(t + d.reset_after);
            prop_assert_eq!(u64::from(l.peek_now(&KEY).remaining()), d.limit, "step {}: at reset", i);
            if d.reset_after > 0 {
                let (l, clock) = replay(i);
                clock.set_nanos(t + d.reset_after - 1);
                prop_assert!(u64::from(l.peek_now(&KEY).remaining()) < d.limit, "step {}: 1 ns before reset", i);
            }
            if d.outcome == Outcome::Rejected {
                let (l, clock) = replay(i);
                clock.set_nanos(t + d.retry_after);
                prop_assert!(l.check_now(&KEY, cost).is_allowed(), "step {}: at retry_after", i);
                prop_assert!(d.retry_after > 0, "a rejection always has a wait");
                let (l, clock) = replay(i);
                clock.set_nanos(t + d.retry_after - 1);
                prop_assert!(!l.check_now(&KEY, cost).is_allowed(), "step {}: 1 ns before retry_after", i);
            }
        }
    }

    /// Settlements and peeks interleaved with checks: a reservation settled out of order, for
    /// less or more than it reserved (GCRA moves TAT by the difference, not below now; the window
    /// strategies adjust the window or bucket the reservation was counted in; the moving window
    /// adds or removes entries at the reservation's own time): every answer equals the oracle's,
    /// and a peek changes nothing.
    #[test]
    fn settlements_and_peeks_equal_oracle(
        (strategy, quotas, start, trace, ops) in prop::sample::select(Strategy::ALL.to_vec())
            .prop_flat_map(|s| (Just(s), prop::collection::vec(arb_quota(s, 30), 1..=2)))
            .prop_flat_map(|(s, qs)| {
                let steps = arb_trace(&qs[0], max_steps());
                (Just(s), Just(qs), arb_start(), steps, prop::collection::vec(0u8..10, max_steps()))
            })
    ) {
        let (l, clock) = build(strategy, &quotas, start);
        let mut o = RuleOracle::new(strategy, &quotas);
        let mut open: Vec<(u64, tollgate::Reservation)> = Vec::new();
        for (i, &(t, cost)) in times(start, &trace).iter().enumerate() {
            clock.set_nanos(t);
            let (what, d, (index, want)) = match ops[i] {
                k @ 0..=2 if !open.is_empty() => {
                    // Any open reservation, not only the newest: settlements arrive out of order.
                    let (at, r) = open.remove(usize::from(k) * 7 % open.len());
                    let reserved = r.cost();
                    let actual = (cost + u32::from(k)) % (2 * reserved + 1);
                    let d = l.apply_now(&KEY, None, Op::settle(r, actual));
                    ("settle", d, o.settle(t, at, u64::from(reserved), u64::from(actual)))
                }
                3 => ("peek", l.peek_now(&KEY), o.decide(t, 0)),
                _ => {
                    let d = l.check_now(&KEY, cost);
                    if let Some(r) = d.reservation() {
                        open.push((t, r));
                    }
                    ("check", d, o.decide(t, u64::from(cost)))
                }
            };
            prop_assert_eq!(Expect::of(&d), want, "step {}: {} at t = {} cost {}", i, what, t, cost);
            prop_assert_eq!(d.quota_index(), index, "step {}: {}", i, what);
        }
    }

    /// GCRA differential against `governor` (dev-dependency), where the semantics coincide:
    /// `governor::Quota::with_period(T).allow_burst(B)` vs our quota `N per N*T` with burst `B`
    /// (so our `T = ceil(W/N)` is exactly governor's replenish interval). Conventions: governor's
    /// `tau` is `(B-1)T` and admits when `t >= TAT - tau`; ours admits when `max(TAT,t) + cT - t <= BT`:
    /// the same condition. Governor has no cost 0 (`NonZeroU32`), reports `cost > B` as
    /// `InsufficientCapacity` (our `Outcome::Exceeds`), and its wait (`NotUntil::wait_time_from`)
    /// equals our `retry_after`. Its clock is relative to the limiter's creation; ours is Unix time.
    #[test]
    fn gcra_equals_governor(
        b in 1u32..=50,
        t in 1u64..=1_000_000_000,
        start in arb_start(),
        trace in prop::collection::vec((prop_oneof![Just(0u64), 0..=3u64, 0..=100_000_000u64, 0..=3_000_000_000u64], prop_oneof![4 => Just(1u32), 1 => 1u32..=52]), 1..=max_steps()),
    ) {
        use governor::clock::{Clock as _, FakeRelativeClock};
        let gq = governor::Quota::with_period(Duration::from_nanos(t)).expect("non-zero").allow_burst(nz(b));
        let gclock = FakeRelativeClock::default();
        let gov = governor::RateLimiter::direct_with_clock(gq, gclock.clone());
        let n = 1000u32;
        let ours = Quota::new(nz(n), Duration::from_nanos(t * u64::from(n))).expect("period").with_burst(nz(b));
        let (l, clock) = build(Strategy::TokenBucket, &[ours], start);
        let mut now = start;
        for (i, &(gap, cost)) in trace.iter().enumerate() {
            now += gap;
            clock.set_nanos(now);
            gclock.advance(Duration::from_nanos(gap));
            let d = l.check_now(&KEY, cost);
            match gov.check_n(nz(cost)) {
                Ok(Ok(())) => prop_assert!(d.is_allowed(), "step {}: governor admits", i),
                Ok(Err(not_until)) => {
                    prop_assert_eq!(d.outcome(), Outcome::Rejected, "step {}", i);
                    prop_assert_eq!(d.retry_after(), Some(not_until.wait_time_from(gclock.now())), "step {}", i);
                }
                Err(_) => prop_assert_eq!(d.outcome(), Outcome::Exceeds, "step {}", i),
            }
        }
    }
}

/// The one convention where governor and tollgate differ: governor's `Quota::per_second(N)` rounds
/// the emission interval down (`1 s / N` in whole ns), ours rounds it up (`T = ceil(W / N)`, the guide's
/// notation), so rounding never lets us over-admit. For 3/second: governor refills
/// one cell every 333,333,333 ns (3 cells in 999,999,999 ns), we every 333,333,334 ns.
#[test]
fn governor_rounds_the_interval_down_we_round_up() {
    use governor::clock::{Clock as _, FakeRelativeClock};
    let gclock = FakeRelativeClock::default();
    let gov = governor::RateLimiter::direct_with_clock(
        governor::Quota::per_second(nz(3)),
        gclock.clone(),
    );
    let (l, _) = build(Strategy::TokenBucket, &[oracle::q("3/second")], 1_000 * S);
    for _ in 0..3 {
        assert!(gov.check().is_ok());
        assert!(l.check_now(&KEY, 1).is_allowed());
    }
    let theirs = gov
        .check()
        .expect_err("burst spent")
        .wait_time_from(gclock.now());
    let ours = l.check_now(&KEY, 1).retry_after().expect("burst spent");
    assert_eq!(theirs, Duration::from_nanos(333_333_333));
    assert_eq!(ours, Duration::from_nanos(333_333_334));
}
