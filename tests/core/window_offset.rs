//! Windows in a user's time zone on the memory store: a `1/day` window with `+8h` resets at
//! 16:00 UTC, with `-5h` at 05:00 UTC, an hourly one with `30m` at half past; the sliding window
//! counter's buckets move alike; Retry-After and the reset point at the shifted edge; the offset
//! is part of the rule's identity; strategies without clock-aligned windows ignore it.

use std::time::Duration;

use tollgate::{ManualClock, Op, RateLimiter, Rule, Strategy, WindowOffset};

/// A UTC midnight.
const MIDNIGHT: u64 = 1_700_006_400;
const HOUR: u64 = 3600;

fn at(secs: u64) -> ManualClock {
    ManualClock::new(Duration::from_secs(secs))
}

fn offset(text: &str) -> WindowOffset {
    text.parse().unwrap()
}

fn limiter(
    strategy: Strategy,
    quota: &str,
    off: &str,
    clock: &ManualClock,
) -> RateLimiter<u32, tollgate::store::MemoryStore<u32>, ManualClock> {
    RateLimiter::builder()
        .strategy(strategy)
        .quotas(quota)
        .unwrap()
        .window_offset(offset(off))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_daily_window_resets_at_midnight_of_the_offset_zone() {
    for (off, edge_utc) in [
        ("8h", 16 * HOUR),
        ("+08:00", 16 * HOUR),
        ("-5h", 5 * HOUR),
        ("0h", 0),
    ] {
        // One second before the shifted midnight.
        let edge = MIDNIGHT + edge_utc + if edge_utc == 0 { 24 * HOUR } else { 0 };
        let clock = at(edge - 1);
        let lim = limiter(Strategy::FixedWindow, "1/day", off, &clock);
        let d = lim.check_now(&1, 1);
        assert!(d.is_allowed(), "{off}");
        assert_eq!(d.reset_secs(), 1, "{off}: the reset is at the shifted edge");
        let d = lim.check_now(&1, 1);
        assert_eq!(
            d.retry_after_secs(),
            Some(1),
            "{off}: Retry-After points at the shifted edge"
        );
        clock.advance(Duration::from_secs(1));
        let d = lim.check_now(&1, 1);
        assert!(d.is_allowed(), "{off}: a new window at the edge");
        assert_eq!(d.reset_secs(), 24 * HOUR, "{off}");
    }
}

#[test]
fn an_hourly_window_with_half_an_hour_resets_at_half_past() {
    let clock = at(MIDNIGHT + 10 * HOUR + 20 * 60);
    let lim = limiter(Strategy::FixedWindow, "2/hour", "30m", &clock);
    assert!(lim.check_now(&7, 2).is_allowed());
    let d = lim.check_now(&7, 1);
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_secs(10 * 60)),
        "10:30 UTC"
    );
    clock.advance(Duration::from_secs(10 * 60));
    assert!(lim.check_now(&7, 2).is_allowed());
    // The top of the hour is no edge under this offset.
    clock.advance(Duration::from_secs(30 * 60));
    assert!(
        !lim.check_now(&7, 1).is_allowed(),
        "11:00 UTC is mid-window"
    );
}

#[test]
fn the_sliding_window_counters_buckets_follow_the_offset() {
    // 10/day filled at 15:00 UTC. At 17:00 UTC, in UTC+8 a new bucket began at 16:00 and the
    // previous one still weighs 23/24 (9 of 10); in UTC the same bucket is still running.
    let clock = at(MIDNIGHT + 15 * HOUR);
    let east = limiter(Strategy::SlidingWindow, "10/day", "8h", &clock);
    let utc = limiter(Strategy::SlidingWindow, "10/day", "0h", &clock);
    assert!(east.check_now(&1, 10).is_allowed());
    assert!(utc.check_now(&1, 10).is_allowed());
    clock.advance(Duration::from_secs(2 * HOUR));
    assert_eq!(east.peek_now(&1).remaining(), 1);
    assert_eq!(utc.peek_now(&1).remaining(), 0);
}

#[test]
fn a_keys_state_follows_it_across_offsets_per_request() {
    // One key under two users' offsets: one state (the limiter's and the key's), converted to
    // each offset's current window, so changing the offset after spending gets no fresh window.
    let clock = at(MIDNIGHT + 14 * HOUR);
    let lim = limiter(Strategy::FixedWindow, "1/day", "0h", &clock);
    let base = lim.rule().clone();
    let tokyo = base.clone().with_window_offset(offset("9h"));
    let lima = base.clone().with_window_offset(offset("-5h"));
    assert_ne!(tokyo, lima);
    let check = |rule: &Rule| lim.apply_now(&1, Some(rule), Op::Check(1));
    assert!(check(&tokyo).is_allowed());
    assert_eq!(
        check(&tokyo).retry_after_secs(),
        Some(HOUR),
        "15:00 UTC is midnight in UTC+9"
    );
    // Under Lima's offset the spent unit is placed in its current day: until 05:00 UTC tomorrow.
    assert_eq!(check(&lima).retry_after_secs(), Some(15 * HOUR));
    let tehran = base.with_window_offset(offset("+03:30"));
    assert!(!check(&tehran).is_allowed(), "no fresh window");
    // Two keys stay apart.
    assert!(lim.apply_now(&2, Some(&lima), Op::Check(1)).is_allowed());
}

#[test]
fn strategies_without_clock_aligned_windows_ignore_the_offset() {
    for strategy in [
        Strategy::FixedWindowFirstHit,
        Strategy::MovingWindow,
        Strategy::TokenBucket,
        Strategy::LeakyBucket,
    ] {
        let rule = Rule::parse(strategy, "1/day")
            .unwrap()
            .with_window_offset(offset("8h"));
        assert_eq!(rule.window_offset(), WindowOffset::UTC, "{strategy}");
        assert_eq!(
            rule,
            Rule::parse(strategy, "1/day").unwrap(),
            "{strategy}: same identity"
        );
    }
    let fixed = Rule::parse(Strategy::FixedWindow, "1/day").unwrap();
    assert_ne!(fixed.clone().with_window_offset(offset("8h")), fixed);
}
