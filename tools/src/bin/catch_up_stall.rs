//! The catch-up sweep's stall (review r3): after 3 h or more without a decision, the first
//! decision sweeps every segment of the store before it answers. How long that decision takes with
//! KEYS keys held, next to an ordinary decision: all keys fresh by then (each is removed), and all
//! keys still held (a day's window: each is only read).
//!
//! `cargo run --release -p tollgate-tools --bin catch_up_stall [KEYS]`

use std::time::{Duration, Instant};

use tollgate::{ManualClock, RateLimiter, Strategy};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("KEYS"));
    println!("{n} keys held; then no decision for 4 h; the first decision after the gap, timed");
    for (strategy, quotas) in [
        (Strategy::SlidingWindow, "10/minute"),
        (Strategy::FixedWindow, "10/minute"),
        (Strategy::SlidingWindow, "10/day"),
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
        clock.advance(Duration::from_secs(4 * 3_600));
        let t = Instant::now();
        limiter.check_now(&u64::MAX, 1);
        let first = t.elapsed();
        let t = Instant::now();
        for k in 0..1000u64 {
            limiter.check_now(&(u64::MAX - 1 - k), 1);
        }
        let ordinary = t.elapsed() / 1000;
        println!(
            "{strategy} {quotas:<10} first decision {:>9.2} ms  ordinary {:>7.3} us  keys after {}",
            first.as_secs_f64() * 1e3,
            ordinary.as_secs_f64() * 1e6,
            limiter.stats().keys
        );
    }
}
