//! The worked examples of the core-engine issue, exactly, through the public
//! `RateLimiter` API on a `ManualClock`.
//!
//! "Previous" and "current" bucket counts are set up by driving real requests into earlier buckets.
//! Run: `cargo test --all-features --test core strategy_examples` (no scaling: fixed examples).

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::{ManualClock, Outcome, Quota, RateLimiter, Strategy};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
/// 2023-11-14 00:00:00 UTC: a midnight, so "00:00:45" is `DAY + 45 s`.
const DAY: u64 = 19_675 * 86_400 * S;
const KEY: &str = "203.0.113.9";

fn limiter(
    strategy: Strategy,
    quota: Quota,
    at: u64,
) -> (
    RateLimiter<&'static str, tollgate::store::MemoryStore<&'static str>, ManualClock>,
    ManualClock,
) {
    let clock = ManualClock::default();
    clock.set_nanos(at);
    let l = RateLimiter::builder()
        .strategy(strategy)
        .quota(quota)
        .clock(clock.clone())
        .build()
        .expect("valid rule");
    (l, clock)
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

fn q(text: &str) -> Quota {
    text.parse().expect("valid quota")
}

#[test]
fn fixed_window_first_hit_10_per_minute_from_00_00_45() {
    let (l, clock) = limiter(Strategy::FixedWindowFirstHit, q("10/minute"), DAY + 45 * S);
    for i in 0..10u32 {
        clock.set_nanos(DAY + 45 * S + u64::from(i) * 5 * S);
        let d = l.check_now(&KEY, 1);
        assert!(d.is_allowed(), "request {i}");
        assert_eq!(d.remaining(), 9 - i);
        assert_eq!(
            d.reset_after(),
            Duration::from_nanos(60 * S - u64::from(i) * 5 * S),
            "the window ends at 00:01:45"
        );
    }
    for t in [DAY + 95 * S, DAY + 100 * S, DAY + 105 * S - 1] {
        clock.set_nanos(t);
        let d = l.check_now(&KEY, 1);
        assert_eq!(d.outcome(), Outcome::Rejected);
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_nanos(DAY + 105 * S - t))
        );
    }
    clock.set_nanos(DAY + 105 * S);
    let d = l.check_now(&KEY, 1);
    assert!(d.is_allowed(), "a new window opens at 00:01:45");
    assert_eq!(
        (d.remaining(), d.reset_after()),
        (9, Duration::from_secs(60))
    );
}

#[test]
fn moving_window_10_per_minute() {
    let (l, clock) = limiter(Strategy::MovingWindow, q("10/minute"), DAY);
    for (secs, n) in [(10, 1), (20, 2), (30, 4), (50, 3)] {
        clock.set_nanos(DAY + secs * S);
        for _ in 0..n {
            assert!(l.check_now(&KEY, 1).is_allowed(), "at :{secs}");
        }
    }
    clock.set_nanos(DAY + 71 * S);
    let d = l.check_now(&KEY, 1);
    assert!(d.is_allowed(), "at 00:01:11 the oldest (:10) is 61 s old");
    assert_eq!(d.remaining(), 0);
    clock.set_nanos(DAY + 72 * S);
    let d = l.check_now(&KEY, 1);
    assert_eq!(
        d.outcome(),
        Outcome::Rejected,
        "at 00:01:12 the oldest (:20) is 52 s old"
    );
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_secs(8)),
        ":20 expires at 00:01:20"
    );
}

#[test]
fn moving_window_3_per_second() {
    let (l, clock) = limiter(Strategy::MovingWindow, q("3/second"), DAY);
    for ms in [100, 300, 600] {
        clock.set_nanos(DAY + ms * MS);
        assert!(l.check_now(&KEY, 1).is_allowed(), "at {ms} ms");
    }
    clock.set_nanos(DAY + 800 * MS);
    let d = l.check_now(&KEY, 1);
    assert_eq!(d.outcome(), Outcome::Rejected);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(300)));
    clock.set_nanos(DAY + 1100 * MS - 1);
    assert!(
        !l.check_now(&KEY, 1).is_allowed(),
        "1 ns before the wait ends"
    );
    clock.set_nanos(DAY + 1110 * MS);
    assert!(l.check_now(&KEY, 1).is_allowed(), "at 1110 ms");
}

#[test]
fn sliding_window_100_per_minute_cur_80_prev_40() {
    // Previous bucket [DAY, DAY+60s): 40 requests. Current bucket from DAY+60s.
    let (l, clock) = limiter(Strategy::SlidingWindow, q("100/minute"), DAY + 5 * S);
    for _ in 0..40 {
        assert!(l.check_now(&KEY, 1).is_allowed());
    }
    // 80 in the current bucket, 30 s in: 20 + k <= 99 for each of them.
    clock.set_nanos(DAY + 90 * S);
    for i in 0..80 {
        assert!(l.check_now(&KEY, 1).is_allowed(), "current request {i}");
    }
    let d = l.peek_now(&KEY);
    assert_eq!(d.remaining(), 0, "30 s in: 80 + 40 x 0.5 = 100");
    let d = l.check_now(&KEY, 1);
    assert_eq!(
        d.outcome(),
        Outcome::Rejected,
        "weighted count 100 is the limit"
    );
    clock.set_nanos(DAY + 100 * S);
    let d = l.peek_now(&KEY);
    assert_eq!(d.remaining(), 7, "40 s in: 80 + floor(40 x 20/60) = 93");
    let d = l.check_now(&KEY, 1);
    assert!(d.is_allowed(), "93 < 100");
    assert_eq!(d.remaining(), 6);
}

#[test]
fn sliding_window_7_per_minute_prev_5_cur_3_at_30_percent() {
    let (l, clock) = limiter(Strategy::SlidingWindow, q("7/minute"), DAY + S);
    for _ in 0..5 {
        assert!(l.check_now(&KEY, 1).is_allowed());
    }
    clock.set_nanos(DAY + 72 * S); // 12 s into the current bucket: share floor(5 x 48/60) = 4
    for _ in 0..3 {
        assert!(l.check_now(&KEY, 1).is_allowed());
    }
    clock.set_nanos(DAY + 78 * S); // 30 % of the bucket
    assert_eq!(l.peek_now(&KEY).remaining(), 1, "3 + 5 x 0.7 = 6.5 -> 6");
    let d = l.check_now(&KEY, 1);
    assert!(d.is_allowed(), "6 < 7");
    assert_eq!(d.remaining(), 0);
    let d = l.check_now(&KEY, 1);
    assert_eq!(d.outcome(), Outcome::Rejected, "the next one is rejected");
    // The previous bucket's share drops from 3 to 2 once 5 x (60 - e) / 60 < 3, i.e. e > 24 s.
    let wait = d.retry_after().expect("rejected");
    assert_eq!(wait, Duration::from_nanos(6 * S + 1));
    clock.set_nanos(DAY + 84 * S);
    assert!(!l.check_now(&KEY, 1).is_allowed(), "1 ns early");
    clock.set_nanos(DAY + 84 * S + 1);
    assert!(l.check_now(&KEY, 1).is_allowed(), "exactly at retry-after");
}

#[test]
fn token_bucket_500_refilled_at_100_per_second() {
    for strategy in [Strategy::TokenBucket, Strategy::LeakyBucket] {
        let quota = q("100/second").with_burst(nz(500));
        let (l, clock) = limiter(strategy, quota, DAY + 7 * S);
        for i in 0..500 {
            let d = l.check_now(&KEY, 1);
            assert!(d.is_allowed(), "{strategy}: burst request {i}");
            assert_eq!((d.limit(), d.remaining()), (500, 499 - i));
        }
        let d = l.check_now(&KEY, 1);
        assert_eq!(d.outcome(), Outcome::Rejected, "{strategy}: the 501st");
        assert_eq!(d.retry_after(), Some(Duration::from_millis(10)));
        clock.advance(Duration::from_millis(10) - Duration::from_nanos(1));
        assert!(!l.check_now(&KEY, 1).is_allowed(), "{strategy}: 1 ns early");
        clock.advance(Duration::from_nanos(1));
        assert!(l.check_now(&KEY, 1).is_allowed(), "{strategy}: 10 ms later");
        assert!(
            !l.check_now(&KEY, 1).is_allowed(),
            "{strategy}: only one refilled"
        );
    }
}

#[test]
fn token_bucket_3_refilled_one_per_4_seconds() {
    for strategy in [Strategy::TokenBucket, Strategy::LeakyBucket] {
        let quota = q("1/4s").with_burst(nz(3));
        let (l, clock) = limiter(strategy, quota, DAY + 50 * S);
        for _ in 0..3 {
            assert!(l.check_now(&KEY, 1).is_allowed(), "{strategy}");
        }
        let d = l.check_now(&KEY, 1);
        assert_eq!(d.outcome(), Outcome::Rejected);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(4)));
        assert_eq!(
            (d.retry_after_secs(), d.remaining(), d.limit()),
            (Some(4), 0, 3)
        );
        clock.advance(Duration::from_secs(4));
        assert!(l.check_now(&KEY, 1).is_allowed(), "{strategy}: after 4 s");
    }
}

#[test]
fn clock_aligned_fixed_window_5000_per_hour_resets_at_the_top_of_the_hour() {
    let hour = 3600 * S;
    for first_hit in [10 * hour + 3570 * S, 10 * hour + S, 10 * hour] {
        let (l, clock) = limiter(Strategy::FixedWindow, q("5000/hour"), DAY + first_hit);
        let d = l.check_now(&KEY, 5000);
        assert!(d.is_allowed());
        assert_eq!(
            d.reset_after(),
            Duration::from_nanos(11 * hour - first_hit),
            "resets at 11:00:00 whenever the first hit came"
        );
        clock.set_nanos(DAY + 11 * hour - 1);
        let d = l.check_now(&KEY, 1);
        assert_eq!(d.outcome(), Outcome::Rejected);
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
        clock.set_nanos(DAY + 11 * hour);
        let d = l.check_now(&KEY, 1);
        assert!(d.is_allowed(), "a new window at the top of the hour");
        assert_eq!(
            (d.remaining(), d.reset_after()),
            (4999, Duration::from_secs(3600))
        );
    }
}

#[test]
fn never_admissible_costs_say_so() {
    for strategy in Strategy::ALL {
        let (l, _clock) = limiter(strategy, q("10/minute"), DAY);
        let d = l.check_now(&KEY, 11);
        assert_eq!(d.outcome(), Outcome::Exceeds, "{strategy}");
        assert_eq!(
            d.retry_after(),
            None,
            "{strategy}: no misleading Retry-After"
        );
        assert_eq!(d.retry_after_secs(), None);
        let d = l.check_now(&KEY, 10);
        assert!(d.is_allowed(), "{strategy}: cost == limit is admissible");
        let d = l.check_now(&KEY, 0);
        assert!(d.is_allowed(), "{strategy}: cost 0 is a peek");
        assert_eq!(d.remaining(), 0);
    }
}
