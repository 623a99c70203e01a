//! The catch-up after an idle gap: after 3 h or more without a decision, the states of tables that
//! keep a time on a ring are read as of the gap's start until every segment has been swept so. How
//! long the decisions after a 4 h gap take with KEYS keys held (all fresh by then), next to an
//! ordinary paced sweep step (one segment, of 64 up to a cap of 2^19 keys and of 1024 at the
//! default cap of 8 x 10^6, run by one decision every 8 s / segments of traffic) and an ordinary
//! decision.
//!
//! `cargo run --release -p tollgate-tools --bin catch_up_stall [KEYS]`
//!
//! Printed per rule: the first decision after the gap; the slowest of the next 10^4 decisions, one
//! every millisecond (one in 8 at the default cap, one in 125 with 64 segments, runs a paced
//! step: these 10 s finish the catch-up and sweep every segment); how many of them took over 1 ms;
//! the paced step before the gap (a decision 125 ms after the fill: one step with 64 segments; with
//! more, the steps due in 125 ms, up to 8 k keys looked at); an ordinary decision (mean of 1000);
//! keys held at the end.

use std::time::{Duration, Instant};

use tollgate::{ManualClock, RateLimiter, Strategy};

/// A decision 125 ms after another runs a paced step (one is due every 125 ms or less).
const STEP: Duration = Duration::from_millis(125);
/// The traffic after the gap: a decision every millisecond for 10 s (a whole rotation of the
/// sweep takes 8 s).
const AFTER_EVERY: Duration = Duration::from_millis(1);
const AFTER: u64 = 10_000;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("KEYS"));
    println!("{n} keys held; then no decision for 4 h; the decisions after the gap, timed (ms)");
    println!(
        "{:<34} {:>9} {:>12} {:>9} {:>11} {:>12} {:>10}",
        "rule", "first", "slowest 10^4", "over 1 ms", "paced step", "ordinary us", "keys after"
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
        let mut over_1_ms = 0;
        for i in 0..AFTER {
            clock.advance(AFTER_EVERY);
            let took = timed(2 + i);
            slowest = slowest.max(took);
            over_1_ms += u32::from(took > Duration::from_millis(1));
        }
        let t = Instant::now();
        for k in 0..1000u64 {
            limiter.check_now(&(AFTER + 100 + k), 1);
        }
        let ordinary = t.elapsed() / 1000;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<34} {:>9.2} {:>12.2} {:>9} {:>11.2} {:>12.3} {:>10}",
            format!("{strategy} {quotas}"),
            ms(first),
            ms(slowest),
            over_1_ms,
            ms(step),
            ordinary.as_secs_f64() * 1e6,
            limiter.stats().keys
        );
    }
}
