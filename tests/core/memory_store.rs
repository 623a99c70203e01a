//! The memory store under floods and idleness (at PR scale), through the public `RateLimiter` API on a `ManualClock`.
//!
//! - A flood of 10^5 distinct keys (PR scale; `TOLLGATE_SCALE=100` gives the 10^7 of the
//!   longer tier) against a store capped at 1000 keys: `len()` never passes the cap plus the number
//!   of inserting threads; a key blocked before the flood is still blocked after it; when every held
//!   key is blocked, new keys share the overflow quota and no held key is reset.
//! - Idle keys vanish after their horizon with only other traffic (no sweep call), and after
//!   `sweep()`; never one nanosecond early.
//! - The moving window's limit is capped (typed error above `MAX_MOVING_WINDOW_LIMIT`); a
//!   70,000/day moving window stays O(1) per request (compared loosely with a 10/day one: no timing
//!   bound of its own).

use crate::oracle;

use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use oracle::{Limiter, S, build, q, scale};
use tollgate::{ConfigError, ManualClock, Quota, RateLimiter, Rule, Strategy};

const MAX_MOVING_WINDOW_LIMIT: u32 = Rule::MAX_MOVING_WINDOW_LIMIT;

const DAY: u64 = 19_675 * 86_400 * S;

fn capped(strategy: Strategy, quota: Quota, max_keys: usize, at: u64) -> (Limiter, ManualClock) {
    let clock = ManualClock::default();
    clock.set_nanos(at);
    let l = RateLimiter::builder()
        .strategy(strategy)
        .quota(quota)
        .max_keys(max_keys)
        .clock(clock.clone())
        .build()
        .expect("valid rule");
    (l, clock)
}

/// Blocks `key`: spends its whole capacity, then checks that one more is rejected.
fn block(l: &Limiter, key: u64) {
    let cap = l.peek_now(&key).limit();
    assert!(l.check_now(&key, cap).is_allowed());
    assert!(!l.check_now(&key, 1).is_allowed());
}

#[test]
fn key_flood_keeps_the_cap_and_never_resets_a_blocked_key() {
    let cap = 1000usize;
    let threads = 2usize;
    for strategy in Strategy::ALL {
        // 10^5 keys for one strategy, 2 x 10^4 for the others (PR scale).
        let flood = if strategy == Strategy::SlidingWindow {
            100_000
        } else {
            20_000
        } * scale() as usize;
        // 10/hour: each flood key spends 1 and keeps room, so it is evictable. (Evicted flood keys
        // are recorded in the sketch; at 20x-100x the cap it saturates and a new key may be counted
        // as having spent what the flood keys spent, 1 of 10: still admitted.)
        let (l, clock) = capped(strategy, q("10/hour"), cap, DAY + 3);
        let victim = u64::MAX;
        block(&l, victim);
        let next = AtomicUsize::new(0);
        let barrier = Barrier::new(threads);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    barrier.wait();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= flood {
                            break;
                        }
                        clock_tick(&clock, k);
                        assert!(l.check_now(&(k as u64), 1).is_allowed());
                        let len = l.store().len();
                        assert!(
                            len <= cap + threads,
                            "{strategy}: {len} keys > cap {cap} + {threads}"
                        );
                    }
                });
            }
        });
        let d = l.check_now(&victim, 1);
        assert!(
            !d.is_allowed(),
            "{strategy}: the blocked key was reset by the flood"
        );
        assert_eq!(l.peek_now(&victim).remaining(), 0);
        assert!(
            l.stats().evictions > 0,
            "{strategy}: room was made by evicting"
        );
        assert!(l.store().len() <= cap + threads);
    }
}

/// The flood spreads over one second so that states differ a little (it stays far inside the hour).
fn clock_tick(clock: &ManualClock, k: usize) {
    if k % 1000 == 0 {
        clock.advance(Duration::from_millis(10));
    }
}

#[test]
fn all_keys_blocked_new_keys_share_the_overflow_quota() {
    for strategy in Strategy::ALL {
        let (l, _clock) = capped(strategy, q("1/hour"), 10, DAY + 11);
        for k in 0..10 {
            block(&l, k);
        }
        assert!(
            l.check_now(&100, 1).is_allowed(),
            "{strategy}: the overflow quota's one"
        );
        for k in 101..200 {
            assert!(
                !l.check_now(&k, 1).is_allowed(),
                "{strategy}: overflow quota spent"
            );
        }
        assert!(l.stats().overflow_hits >= 100);
        for k in 0..10 {
            assert!(
                !l.check_now(&k, 1).is_allowed(),
                "{strategy}: key {k} was not reset"
            );
        }
        assert_eq!(l.store().len(), 10);
    }
}

/// Touches `keys` keys at `t0` (aligned so that every state is fresh exactly at `t0 + horizon`),
/// each with its whole capacity.
fn touch(l: &Limiter, keys: u64) {
    for k in 0..keys {
        let cap = l.peek_now(&k).limit();
        assert!(l.check_now(&k, cap).is_allowed());
    }
}

#[test]
fn idle_keys_vanish_with_only_other_traffic() {
    let keys = 100_000 * scale();
    let quota = q("10/minute");
    let t0 = DAY; // a whole number of 2W
    let (l, clock) = build(Strategy::SlidingWindow, &[quota], t0);
    touch(&l, keys);
    assert_eq!(l.store().len() as u64, keys);
    let horizon = u64::try_from(l.rule().horizon().as_nanos()).expect("fits");
    clock.set_nanos(t0 + horizon);
    // Traffic on one other key only, one call per millisecond; no sweep() call, no background
    // thread. The store sweeps one of its segments every 125 ms of traffic (all within 8 s).
    let hot = u64::MAX;
    let mut calls = 0;
    while l.store().len() > 1 && calls < 1_000_000 {
        l.check_now(&hot, 1);
        clock.advance(std::time::Duration::from_millis(1));
        calls += 1;
    }
    assert_eq!(
        l.store().len(),
        1,
        "only the hot key is left after {calls} calls"
    );
    eprintln!("{keys} idle keys gone after {calls} calls on another key");
}

#[test]
fn idle_keys_vanish_at_their_horizon_not_earlier() {
    let keys = 10_000 * scale();
    for strategy in Strategy::ALL {
        let t0 = DAY;
        let (l, clock) = build(strategy, &[q("10/minute")], t0);
        touch(&l, keys);
        let horizon = u64::try_from(l.rule().horizon().as_nanos()).expect("fits");
        clock.set_nanos(t0 + horizon - 1);
        l.sweep();
        assert_eq!(
            l.store().len() as u64,
            keys,
            "{strategy}: nothing is fresh 1 ns early"
        );
        if strategy != Strategy::SlidingWindow {
            // (The counter's previous-bucket share is floor(10 x 1 ns / W) = 0 by now: it admits,
            // although the state is only equivalent to a new key's from the horizon on.)
            for k in 0..10 {
                let d = l.peek_now(&k);
                assert!(
                    d.remaining() < d.limit(),
                    "{strategy}: key {k} still in use"
                );
            }
        }
        clock.set_nanos(t0 + horizon);
        l.sweep();
        assert_eq!(l.store().len(), 0, "{strategy}: all gone after the horizon");
        let d = l.check_now(&3, 1);
        assert!(d.is_allowed(), "{strategy}: a swept key behaves as new");
        assert_eq!(d.remaining(), d.limit() - 1);
    }
}

#[test]
fn sweeping_never_changes_a_decision() {
    // The same random traffic on two limiters, one swept after every request: identical decisions,
    // so whatever a sweep removed was equivalent to a new key.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for strategy in Strategy::ALL {
        let (a, ca) = build(strategy, &[q("3/second"), q("5/10s")], DAY);
        let (b, cb) = build(strategy, &[q("3/second"), q("5/10s")], DAY);
        let mut t = DAY;
        for i in 0..20_000 {
            t += rand() % (S / 2);
            ca.set_nanos(t);
            cb.set_nanos(t);
            let key = rand() % 50;
            let cost = (rand() % 3) as u32;
            let da = a.check_now(&key, cost);
            let db = b.check_now(&key, cost);
            assert_eq!(da, db, "{strategy}: request {i}");
            b.sweep();
        }
    }
}

#[test]
fn moving_window_limit_is_capped() {
    let over = Quota::new(
        std::num::NonZeroU32::new(MAX_MOVING_WINDOW_LIMIT + 1).expect("non-zero"),
        Duration::from_secs(60),
    )
    .expect("period");
    let built = RateLimiter::<u64>::builder()
        .strategy(Strategy::MovingWindow)
        .quota(over)
        .build();
    assert!(matches!(
        built,
        Err(ConfigError::MovingWindowLimitTooLarge(_))
    ));
    let at_max = Quota::new(
        std::num::NonZeroU32::new(MAX_MOVING_WINDOW_LIMIT).expect("non-zero"),
        Duration::from_secs(60),
    )
    .expect("period");
    let (l, _) = build(Strategy::MovingWindow, &[at_max], DAY);
    assert!(l.check_now(&1, MAX_MOVING_WINDOW_LIMIT).is_allowed());
    assert!(!l.check_now(&1, 1).is_allowed());
}

/// Runs the 70,000/day workload: fill the log one request at a time, hammer it full (rejections and
/// peeks), then let it expire and refill. Returns the time taken.
fn day_workload(quota: &str, n: u64) -> Duration {
    let (l, clock) = build(Strategy::MovingWindow, &[q(quota)], DAY);
    let started = Instant::now();
    let mut admitted = 0;
    for i in 0..n {
        clock.set_nanos(DAY + i * 1_000_000);
        admitted += u64::from(l.check_now(&9, 1).is_allowed());
        l.peek_now(&9);
    }
    for _ in 0..n {
        l.check_now(&9, 1);
    }
    clock.set_nanos(DAY + 86_400 * S + n * 1_000_000);
    for _ in 0..n {
        l.check_now(&9, 1);
    }
    let elapsed = started.elapsed();
    let limit = u64::from(q(quota).limit());
    assert_eq!(admitted, n.min(limit));
    elapsed
}

#[test]
fn a_70000_per_day_moving_window_stays_fast() {
    let n = 70_000;
    let big = day_workload("70000/day", n);
    let small = day_workload("10/day", n);
    // O(N) work per request would cost ~70,000 / 2 times more; allow a factor of 10 for noise.
    assert!(
        big <= small * 10 + Duration::from_millis(500),
        "70000/day took {big:?} for {} calls vs {small:?} for 10/day",
        4 * n
    );
    eprintln!(
        "moving window, {} calls: 70000/day {big:?}, 10/day {small:?}",
        4 * n
    );
}
