//! The catch-up after an idle gap: after 3 h or more without a decision, the states of tables that
//! keep a time on a ring are read as of the gap's start until every segment has been swept so. How
//! long the decisions after a 4 h gap take with KEYS keys held (all fresh by then), next to an
//! ordinary paced sweep step (one segment of 64, run by one decision every 125 ms of traffic) and
//! an ordinary decision.
//!
//! `cargo run --release -p tollgate-tools --bin catch_up_stall [KEYS]`
//!
//! Printed per rule: the first decision after the gap; the slowest of the next 64 decisions, one
//! every 125 ms (each runs a paced step, which finishes the catch-up within these 8 s); the
//! paced step before the gap; an ordinary decision (mean of 1000); keys held at the end.

use std::time::{Duration, Instant};

use tollgate::{ManualClock, RateLimiter, Strategy};

/// The sweep's pace: one segment of 64 per 125 ms of traffic.
const STEP: Duration = Duration::from_millis(125);

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("KEYS"));
    println!("{n} keys held; then no decision for 4 h; the decisions after the gap, timed (ms)");
    println!(
        "{:<34} {:>9} {:>12} {:>11} {:>12} {:>10}",
        "rule", "first", "slowest 64", "paced step", "ordinary us", "keys after"
    );
    // A sliding window of 10^7/s and first-hit windows keep a time on a ring (the catch-up runs);
    // a sliding window of 10/minute keeps whole window indices (none needed).
    for (strategy, quotas) in [
        (Strategy::SlidingWindow, "10000000/s"),
        (Strategy::FixedWindowFirstHit, "10/minute"),
        (Strategy::SlidingWindow, "10/minute"),
    ] {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let limiter: RateLimiter<u64, _, _> = RateLimiter::builder()
            .strategy(strategy)
            .quotas(quotas)
            .expect("quota")
            .clock(clock.clone())
            .build()
            .expect("rule");
        for k in 0..n {
            limiter.check_now(&k, 1);
        }
        let timed = |key: u64| {
            let t = Instant::now();
            limiter.check_now(&key, 1);
            t.elapsed()
        };
        // Keys already held: no insert (at 8 x 10^6 keys, the default cap, an insert would make
        // room first).
        clock.advance(STEP);
        let step = timed(0);
        clock.advance(Duration::from_secs(4 * 3_600));
        let first = timed(1);
        let mut slowest = Duration::ZERO;
        for i in 0..64 {
            clock.advance(STEP);
            slowest = slowest.max(timed(2 + i));
        }
        let t = Instant::now();
        for k in 0..1000u64 {
            limiter.check_now(&(100 + k), 1);
        }
        let ordinary = t.elapsed() / 1000;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<34} {:>9.2} {:>12.2} {:>11.2} {:>12.3} {:>10}",
            format!("{strategy} {quotas}"),
            ms(first),
            ms(slowest),
            ms(step),
            ordinary.as_secs_f64() * 1e6,
            limiter.stats().keys
        );
    }
}
