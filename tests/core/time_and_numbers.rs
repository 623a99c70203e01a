//! Time anomalies and number extremes, through the
//! public `RateLimiter` API on a `ManualClock`.
//!
//! - Degenerate and extreme quotas (1/366d, 10^9/second, u32::MAX/ms: a typed error for the
//!   buckets), costs 0, 1, == capacity, > capacity.
//! - Time standing still, stepping back (never more admissions than holding time still;
//!   retry_after and reset_after never beyond the horizon), jumping forward by years and to the end
//!   of `u64` nanoseconds (year 2554).
//! - Full-range `u64` times, `u32` limits, costs and bursts, periods up to `MAX_PERIOD`: no
//!   panic. The test profile has `overflow-checks = true`, so a debug run without panic proves that no
//!   arithmetic wrapped on these inputs, hence a release build computes the same results. Also run:
//!   `cargo test --release --all-features --test core time_and_numbers`.
//!
//! Scaling: `PROPTEST_CASES` (default 256; the 10^4 in the longer tier) and `TOLLGATE_SCALE`.
//! Longer tier: `PROPTEST_CASES=10000 TOLLGATE_SCALE=10 cargo test --release --all-features
//! --test core time_and_numbers`. Failures persist to `tests/core/time_and_numbers.proptest-regressions`.

use crate::oracle;

use std::num::NonZeroU32;
use std::time::Duration;

use oracle::{
    P, S, bucket_bound_violation, build, config, max_aligned, max_steps, max_trailing, q,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use tollgate::{ConfigError, Outcome, Quota, QuotaError, RateLimiter, Rule, Strategy};

const KEY: u64 = 1;
const REGRESSIONS: &str = "tests/core/time_and_numbers.proptest-regressions";
const YEAR: u64 = 365 * 86_400 * S;
const HOUR: u64 = 3600 * S;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// The most a quota admits at one instant: `N` for the windows, `B` for the buckets.
fn capacity(strategy: Strategy, quota: &Quota) -> u64 {
    if strategy.is_bucket() {
        u64::from(quota.burst())
    } else {
        u64::from(quota.limit())
    }
}

fn bound_holds(strategy: Strategy, quota: &Quota, admitted: &[(u64, u64)]) -> Result<(), String> {
    let p = P::of(quota);
    let ok = match strategy {
        Strategy::MovingWindow => max_trailing(admitted, p.w) <= p.n,
        Strategy::FixedWindow => max_aligned(admitted, p.w) <= p.n,
        Strategy::FixedWindowFirstHit | Strategy::SlidingWindow => {
            max_trailing(admitted, p.w) <= 2 * p.n
        }
        _ => bucket_bound_violation(admitted, p.b, p.t).is_none(),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{strategy} {quota}: bound broken by {admitted:?}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Degenerate and extreme quotas.

#[test]
fn one_per_366_days() {
    let quota = q("1/366d");
    let period = 366 * 86_400 * S;
    for strategy in Strategy::ALL {
        let start = 55 * YEAR + 12_345;
        let (l, clock) = build(strategy, &[quota], start);
        let d = l.check_now(&KEY, 1);
        assert!(d.is_allowed(), "{strategy}");
        assert_eq!(d.remaining(), 0);
        let d = l.check_now(&KEY, 1);
        assert_eq!(d.outcome(), Outcome::Rejected, "{strategy}");
        let wait = u64::try_from(d.retry_after().expect("rejected").as_nanos()).expect("fits");
        assert!(wait > 0 && wait <= 2 * period, "{strategy}: wait {wait}");
        clock.set_nanos(start + wait - 1);
        assert!(!l.check_now(&KEY, 1).is_allowed(), "{strategy}: 1 ns early");
        clock.set_nanos(start + wait);
        assert!(
            l.check_now(&KEY, 1).is_allowed(),
            "{strategy}: at retry_after"
        );
        assert_eq!(
            l.check_now(&KEY, 2).outcome(),
            Outcome::Exceeds,
            "{strategy}"
        );
    }
}

#[test]
fn a_billion_per_second() {
    let quota = q("1000000000/second");
    for strategy in Strategy::ALL {
        let built = RateLimiter::<u64>::builder()
            .strategy(strategy)
            .quota(quota)
            .build();
        if strategy == Strategy::MovingWindow {
            assert!(
                matches!(built, Err(ConfigError::MovingWindowLimitTooLarge(_))),
                "the moving window's ring is capped: a typed error"
            );
            continue;
        }
        assert!(
            built.is_ok(),
            "{strategy}: the memory store accepts 10^9/second (T = 1 ns)"
        );
        let (l, clock) = build(strategy, &[quota], 40 * YEAR);
        let d = l.check_now(&KEY, 1_000_000_000);
        assert!(d.is_allowed(), "{strategy}: the whole capacity at once");
        assert_eq!((d.remaining(), d.limit()), (0, 1_000_000_000));
        let d = l.check_now(&KEY, 1);
        assert_eq!(d.outcome(), Outcome::Rejected, "{strategy}");
        let wait = d.retry_after().expect("rejected");
        if strategy.is_bucket() {
            assert_eq!(wait, Duration::from_nanos(1), "{strategy}: T = 1 ns");
        }
        clock.advance(wait);
        assert!(l.check_now(&KEY, 1).is_allowed(), "{strategy}");
        assert_eq!(l.check_now(&KEY, 1_000_000_001).outcome(), Outcome::Exceeds);
    }
}

#[test]
fn u32_max_per_millisecond() {
    let quota = q("4294967295/ms");
    for strategy in Strategy::ALL {
        let built = RateLimiter::<u64>::builder()
            .strategy(strategy)
            .quota(quota)
            .build();
        match strategy {
            Strategy::TokenBucket | Strategy::LeakyBucket => assert!(
                matches!(built, Err(ConfigError::IntervalBelowResolution { .. })),
                "{strategy}: T below 1 ns is a typed error, got {built:?}"
            ),
            Strategy::MovingWindow => assert!(matches!(
                built,
                Err(ConfigError::MovingWindowLimitTooLarge(_))
            )),
            _ => {
                let (l, clock) = build(strategy, &[quota], 40 * YEAR + 3);
                assert!(l.check_now(&KEY, u32::MAX).is_allowed(), "{strategy}");
                let d = l.check_now(&KEY, 1);
                assert_eq!((d.outcome(), d.remaining()), (Outcome::Rejected, 0));
                clock.advance(d.retry_after().expect("rejected"));
                assert!(l.check_now(&KEY, 1).is_allowed(), "{strategy}");
                assert_eq!(d.limit(), u32::MAX);
            }
        }
    }
}

#[test]
fn constructors_reject_what_cannot_be_represented() {
    assert_eq!(
        Quota::new(nz(1), Duration::ZERO),
        Err(QuotaError::ZeroPeriod)
    );
    assert_eq!(
        Quota::new(nz(1), Quota::MAX_PERIOD + Duration::from_nanos(1)),
        Err(QuotaError::PeriodTooLong)
    );
    assert!(Quota::new(nz(u32::MAX), Quota::MAX_PERIOD).is_ok());
    assert!("0/s".parse::<Quota>().is_err());
    assert!("4294967296/s".parse::<Quota>().is_err());
    assert!("1/0s".parse::<Quota>().is_err());
    // A bucket deeper than Quota::MAX_PERIOD (B*T) is refused; the widest one that fits is accepted.
    let deep = q("1/366d").with_burst(nz(u32::MAX));
    for strategy in [Strategy::TokenBucket, Strategy::LeakyBucket] {
        assert!(matches!(
            Rule::new(strategy, [deep]),
            Err(ConfigError::BurstTooLarge(_))
        ));
        // T = ceil(Quota::MAX_PERIOD / u32::MAX) is rounded up, so B = u32::MAX is just too deep.
        let rounded = Quota::new(nz(u32::MAX), Quota::MAX_PERIOD).expect("period");
        assert!(matches!(
            Rule::new(strategy, [rounded]),
            Err(ConfigError::BurstTooLarge(_))
        ));
        let wide = q("1/366d").with_burst(nz(9));
        let (l, _) = build(strategy, &[wide], u64::MAX / 2);
        assert!(l.check_now(&KEY, 9).is_allowed(), "{strategy}");
        assert!(!l.check_now(&KEY, 1).is_allowed(), "{strategy}");
        let wide = Quota::new(nz(u32::MAX), Quota::MAX_PERIOD / 2)
            .expect("period")
            .with_burst(nz(u32::MAX));
        let (l, _) = build(strategy, &[wide], u64::MAX / 2);
        assert!(l.check_now(&KEY, u32::MAX).is_allowed(), "{strategy}");
        assert!(!l.check_now(&KEY, 1).is_allowed(), "{strategy}");
    }
    for strategy in Strategy::ALL {
        assert!(Rule::new(strategy, [deep]).is_ok() || strategy.is_bucket());
    }
}

#[test]
fn limit_one_admits() {
    // upstash #39: limit 1 always rejected.
    for strategy in Strategy::ALL {
        for text in ["1/ns", "1/ms", "1/s", "1/hour", "1/3660d"] {
            if strategy.is_bucket() && text == "1/3660d" {
                continue; // B*T = 10 years is allowed, but keep the time sums small below
            }
            let (l, _) = build(strategy, &[q(text)], 1_700_000_000 * S);
            assert!(l.check_now(&KEY, 1).is_allowed(), "{strategy} {text}");
        }
    }
}

/// Extreme quotas: limits 1, 2, u32::MAX and random; periods from 1 ns to Quota::MAX_PERIOD.
fn arb_extreme_quota() -> impl proptest::strategy::Strategy<Value = Quota> {
    let max_period = u64::try_from(Quota::MAX_PERIOD.as_nanos()).expect("fits");
    let limit = prop_oneof![
        Just(1u32),
        Just(2),
        Just(u32::MAX),
        any::<u32>(),
        1u32..=100
    ];
    let period = prop_oneof![
        Just(1u64),
        Just(1_000_000),
        Just(S),
        Just(YEAR),
        Just(100 * YEAR),
        Just(max_period),
        1..=max_period,
    ];
    let burst = prop_oneof![
        Just(None),
        Just(Some(u32::MAX)),
        any::<u32>().prop_map(Some)
    ];
    (limit, period, burst).prop_filter_map("valid quota", |(n, w, b)| {
        let q = Quota::new(NonZeroU32::new(n)?, Duration::from_nanos(w)).ok()?;
        Some(match b.and_then(NonZeroU32::new) {
            Some(b) => q.with_burst(b),
            None => q,
        })
    })
}

fn arb_cost(cap: u64) -> impl proptest::strategy::Strategy<Value = u32> {
    let cap = u32::try_from(cap).unwrap_or(u32::MAX);
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(cap),
        Just(cap.saturating_add(1)),
        Just(u32::MAX),
        any::<u32>()
    ]
}

proptest! {
    #![proptest_config(config(REGRESSIONS))]

    /// Any quota the constructors accept, costs 0, 1, == capacity, > capacity, u32::MAX,
    /// at full-range times in any order: no panic, or a typed error at build time; cost 0 is free;
    /// a cost above the capacity is `Exceeds`; what is admitted fits the capacity; remaining <= limit;
    /// waits never beyond the horizon.
    #[test]
    fn full_range_inputs_never_panic(
        strategy in prop::sample::select(Strategy::ALL.to_vec()),
        quota in arb_extreme_quota(),
        steps in prop::collection::vec((any::<u64>(), any::<u32>(), any::<bool>()), 1..=40),
        costs in prop::collection::vec(arb_cost(u64::from(u32::MAX)), 40),
    ) {
        let Ok(rule) = Rule::new(strategy, [quota]) else {
            // A typed error; only for these cases.
            let p = P::of(&quota);
            prop_assert!(
                strategy == Strategy::MovingWindow
                    || (strategy.is_bucket() && (p.w < p.n || u128::from(p.b) * u128::from(p.t) > Quota::MAX_PERIOD.as_nanos()))
            );
            return Ok(());
        };
        let horizon = rule.horizon();
        let cap = capacity(strategy, &quota);
        let (l, clock) = build(strategy, &[quota], 0);
        for (i, &(now, raw_cost, pick)) in steps.iter().enumerate() {
            clock.set_nanos(now);
            // Half the costs from the interesting set, half raw.
            let cost = if pick { costs[i] } else { raw_cost };
            let before = l.peek_now(&KEY);
            let d = l.check_now(&KEY, cost);
            prop_assert!(d.remaining() <= d.limit());
            prop_assert_eq!(u64::from(d.limit()), cap);
            prop_assert!(d.reset_after() <= horizon, "reset {:?} > horizon {:?}", d.reset_after(), horizon);
            if let Some(w) = d.retry_after() {
                prop_assert!(w <= horizon, "retry {:?} > horizon {:?}", w, horizon);
            }
            if u64::from(cost) > cap {
                prop_assert_eq!(d.outcome(), Outcome::Exceeds);
                prop_assert_eq!(l.peek_now(&KEY), before, "a never-admissible cost changes nothing");
            }
            if cost == 0 {
                prop_assert!(d.is_allowed());
                prop_assert_eq!(d, before, "cost 0 is a peek");
            }
            if d.is_allowed() {
                prop_assert!(u64::from(cost) <= u64::from(before.remaining()), "admitted beyond remaining");
            }
        }
    }

    /// The quota notation on arbitrary text (as a proptest): no panic, a typed error
    /// with a position inside the input; several quotas likewise.
    #[test]
    fn quota_parser_never_panics(text in "\\PC{0,40}|[0-9 ]{0,12}(/| per )[0-9 ]{0,6}[a-zµ ]{0,9}") {
        match text.parse::<Quota>() {
            Ok(quota) => {
                prop_assert!(quota.period() > Duration::ZERO && quota.period() <= Quota::MAX_PERIOD);
                prop_assert_eq!(quota.to_string().parse::<Quota>(), Ok(quota));
            }
            Err(e) => prop_assert!(e.position() <= text.len(), "{}", e),
        }
        if let Err(e) = tollgate::parse_quotas(&text) {
            prop_assert!(e.position() <= text.len(), "{}", e);
        }
    }

    /// Display -> parse round-trips for every representable quota (limit 1..=u32::MAX, period 1 ns
    /// ..= Quota::MAX_PERIOD).
    #[test]
    fn quota_display_round_trips(quota in arb_extreme_quota()) {
        let text = quota.to_string();
        let back: Quota = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!((back.limit(), back.period()), (quota.limit(), quota.period()));
    }

    /// Time standing still: exactly the capacity passes at one instant, whatever the instant.
    #[test]
    fn time_standing_still(
        strategy in prop::sample::select(Strategy::ALL.to_vec()),
        n in 1u32..=64,
        w in 64u64..=100 * HOUR,
        at in any::<u64>(),
    ) {
        let quota = Quota::new(nz(n), Duration::from_nanos(w)).expect("period");
        let (l, _) = build(strategy, &[quota], at);
        let admitted = (0..2 * n + 3).filter(|_| l.check_now(&KEY, 1).is_allowed()).count();
        prop_assert_eq!(admitted as u64, capacity(strategy, &quota), "{} at {}", strategy, at);
    }

    /// Steps back by 1 ns, 1 ms, 1 s, 1 h (or more) in the middle of traces never admit more
    /// than the same trace with time held still at its maximum (unit costs), and waits stay within
    /// the horizon (JSONbored/loopover #5855 reported minutes after a 0.5 s step back).
    #[test]
    fn steps_back_never_admit_more(
        strategy in prop::sample::select(Strategy::ALL.to_vec()),
        n in 1u32..=20,
        w in prop_oneof![Just(S), Just(60 * S), 20u64..=10_000, 1u64..=HOUR],
        burst in 1u32..=20,
        start in HOUR * 10..=u64::MAX / 2,
        trace in prop::collection::vec(
            prop_oneof![
                4 => (0u64..=2 * S).prop_map(|d| (d, false)),
                1 => prop::sample::select(vec![1, 1_000_000, S, HOUR]).prop_map(|d| (d, true)),
                1 => (0u64..=2 * HOUR).prop_map(|d| (d, true)),
            ],
            1..=max_steps(),
        ),
    ) {
        let w = if strategy.is_bucket() { w.max(u64::from(n)) } else { w };
        let quota = Quota::new(nz(n), Duration::from_nanos(w)).expect("period").with_burst(nz(burst));
        let (a, clock_a) = build(strategy, &[quota], start);
        let (b, clock_b) = build(strategy, &[quota], start);
        let horizon = a.rule().horizon();
        // Held still at the latest time the limiter has seen (not the unseen start).
        let (mut t, mut held) = (start, 0);
        let (mut admitted_a, mut admitted_b) = (0u32, 0u32);
        for &(delta, back) in &trace {
            t = if back { t - delta.min(t - HOUR * 5) } else { t + delta };
            held = held.max(t);
            clock_a.set_nanos(t);
            clock_b.set_nanos(held);
            let d = a.check_now(&KEY, 1);
            admitted_a += u32::from(d.is_allowed());
            admitted_b += u32::from(b.check_now(&KEY, 1).is_allowed());
            prop_assert!(d.reset_after() <= horizon, "reset {:?} beyond horizon {:?}", d.reset_after(), horizon);
            if let Some(r) = d.retry_after() {
                prop_assert!(r <= horizon, "retry {:?} beyond horizon {:?}", r, horizon);
            }
        }
        prop_assert!(admitted_a <= admitted_b, "{}: stepping back admitted {} > held {}", strategy, admitted_a, admitted_b);
    }

    /// Near the end of `u64` nanoseconds (year 2554) every bound still holds: no saturation
    /// that expires entries early or lets a bucket refill for free.
    #[test]
    fn end_of_time_keeps_the_bounds(
        strategy in prop::sample::select(Strategy::ALL.to_vec()),
        n in 1u32..=20,
        w in prop_oneof![Just(S), Just(HOUR), 20u64..=10_000],
        before_end in prop_oneof![Just(1u64), Just(2), 1..=3 * HOUR],
        gaps in prop::collection::vec(prop_oneof![Just(0u64), 0..=S, 0..=HOUR], 1..=100),
    ) {
        let w = if strategy.is_bucket() { w.max(u64::from(n)) } else { w };
        let quota = Quota::new(nz(n), Duration::from_nanos(w)).expect("period");
        let mut t = u64::MAX - before_end;
        let (l, clock) = build(strategy, &[quota], t);
        let mut admitted = Vec::new();
        for &g in &gaps {
            // u64::MAX itself is left out: see `end_of_time_exactly` for why.
            t = t.saturating_add(g).min(u64::MAX - 1);
            clock.set_nanos(t);
            let d = l.check_now(&KEY, 1);
            if d.is_allowed() {
                admitted.push((t, 1));
            }
            prop_assert!(d.remaining() <= d.limit());
        }
        let r = bound_holds(strategy, &quota, &admitted);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
fn jumps_forward_by_years_and_to_the_end_of_time() {
    for strategy in Strategy::ALL {
        for quota in [q("10/second"), q("5/hour"), q("3/366d")] {
            let start = 1_700_000_000 * S;
            let (l, clock) = build(strategy, &[quota], start);
            for _ in 0..12 {
                l.check_now(&KEY, 1);
            }
            for jump in [3 * YEAR, 100 * YEAR, 200 * YEAR] {
                clock.advance(Duration::from_nanos(jump));
                let d = l.peek_now(&KEY);
                assert_eq!(
                    d.remaining(),
                    d.limit(),
                    "{strategy} {quota}: fresh after {jump} ns"
                );
                assert_eq!(d.reset_after(), Duration::ZERO);
                let cap = capacity(strategy, &quota);
                let admitted = (0..cap + 2)
                    .filter(|_| l.check_now(&KEY, 1).is_allowed())
                    .count();
                assert_eq!(admitted as u64, cap, "{strategy} {quota} after a jump");
            }
            for end in [u64::MAX - 2 * S, u64::MAX - 1] {
                clock.set_nanos(end);
                let cap = capacity(strategy, &quota);
                let admitted = (0..cap + 2)
                    .filter(|_| l.check_now(&KEY, 1).is_allowed())
                    .count() as u64;
                assert!(
                    admitted <= cap,
                    "{strategy} {quota} at {end}: {admitted} > {cap}"
                );
                let d = l.check_now(&KEY, 1);
                assert!(
                    !d.is_allowed(),
                    "{strategy} {quota}: nothing more at the end of time"
                );
                assert!(d.retry_after().expect("rejected") <= l.rule().horizon());
            }
        }
    }
}

/// At exactly `u64::MAX` ns: no panic and sane figures. (Bounds are asserted up to `u64::MAX - 1`;
/// a sweep at `now == u64::MAX` is checked by the memory store's unit test
/// `regression_a_sweep_at_the_end_of_time_kept_blocked_keys`.)
/// The token and leaky bucket admit nothing within `c*T` of the end: the new TAT would not fit.
#[test]
fn end_of_time_exactly() {
    for strategy in Strategy::ALL {
        let (l, _) = build(strategy, &[q("3/second")], u64::MAX);
        for cost in [0, 1, 3, 4] {
            let d = l.check_now(&KEY, cost);
            assert!(d.remaining() <= d.limit(), "{strategy}");
            assert!(d.reset_after() <= l.rule().horizon(), "{strategy}");
            assert!(
                d.retry_after()
                    .is_none_or(|r| r > Duration::ZERO && r <= l.rule().horizon())
            );
            if strategy.is_bucket() && cost > 0 {
                assert!(!d.is_allowed(), "{strategy}: TAT cannot pass u64::MAX");
            }
        }
    }
}

/// Found by `full_range_inputs_never_panic`: a sliding window of `3552461049` per 365 days (its
/// previous count held rounded up), past the end of packed time (2^62 ns) and back: a check of
/// cost 0 answers what the peek before it answered (the peek used to write the rounded state).
#[test]
fn a_peek_and_a_zero_check_agree_across_the_end_of_packed_time_and_back() {
    let quota = Quota::new(nz(3_552_461_049), Duration::from_secs(31_536_000)).expect("a quota");
    let (l, clock) = build(Strategy::SlidingWindow, &[quota], 0);
    let steps: [(u64, u32); 11] = [
        (0, 0),
        (0, 18_287),
        (1_980_024, 7),
        (0, 25_235_890),
        (311_784_762_137_492, 102_676),
        (13_128_116_948_513_996, 0),
        (4_611_699_484_828_671_155, 1),
        (1_072_224_000_000_000_000, 1),
        (63_072_000_000_000_000, 0),
        (31_536_000_000_000_000, 0),
        (932_087_671_581_142, 1_045_292_426),
    ];
    for (now, cost) in steps {
        clock.set_nanos(now);
        let before = l.peek_now(&KEY);
        let d = l.check_now(&KEY, cost);
        if cost == 0 {
            assert_eq!(d, before, "cost 0 is a peek at {now}");
        }
    }
}
