//! Eviction of 10^6 idle keys: how long a sweep takes, how much memory it returns, and the longest
//! time a concurrent check waits while it runs; governor's manual `retain_recent` +
//! `shrink_to_fit` next to it.
//!
//! `cargo run --release -p tollgate-tools --bin bench_eviction [KEYS]`

use std::alloc::System;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tollgate::{ManualClock, RateLimiter, Strategy};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live_heap() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64 + s.bytes_reallocated as i64
}

/// Runs `sweep` on this thread while another thread checks live keys with `check`; returns the
/// sweep's duration and the check latencies seen meanwhile (sorted, in ns).
fn during(sweep: impl FnOnce(), check: impl Fn(u64) + Sync) -> (Duration, Vec<u64>) {
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    std::thread::scope(|s| {
        let checker = s.spawn(|| {
            let mut lat = Vec::new();
            let mut k = 0u64;
            started.store(true, Ordering::Release);
            while !stop.load(Ordering::Acquire) {
                k = (k + 1) % 1000;
                let t = Instant::now();
                check(k);
                lat.push(t.elapsed().as_nanos() as u64);
            }
            lat
        });
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        std::thread::sleep(Duration::from_millis(5));
        let t = Instant::now();
        sweep();
        let took = t.elapsed();
        std::thread::sleep(Duration::from_millis(5));
        stop.store(true, Ordering::Release);
        let mut lat = checker.join().expect("checker");
        lat.sort_unstable();
        lat.shrink_to_fit();
        (took, lat)
    })
}

fn pct(lat: &[u64], p: f64) -> f64 {
    if lat.is_empty() {
        return 0.0;
    }
    let i = ((lat.len() - 1) as f64 * p).round() as usize;
    lat[i] as f64 / 1000.0
}

/// `heap_after` is taken while `lat` is alive: its own buffer is left out.
fn report(name: &str, took: Duration, lat: &[u64], heap_before: i64, heap_after: i64) {
    let heap_after = heap_after - (lat.len() * 8) as i64;
    let over_1ms = lat.iter().filter(|&&l| l > 1_000_000).count();
    println!(
        "{name:<44} {:>9.2} ms {:>9.1} MB -> {:>6.1} MB  checks {:>8}  p99 {:>7.1} us  p99.99 {:>7.1} us  max {:>8.1} us  >1ms {over_1ms}",
        took.as_secs_f64() * 1e3,
        heap_before as f64 / 1e6,
        heap_after as f64 / 1e6,
        lat.len(),
        pct(lat, 0.99),
        pct(lat, 0.9999),
        lat.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("KEYS"));
    println!("{n} idle keys; a second thread checks 1000 live keys during the sweep");
    println!(
        "{:<44} {:>12} {:>22}  latency of the concurrent checks",
        "sweep", "time", "heap before -> after"
    );
    for strategy in [
        Strategy::FixedWindow,
        Strategy::TokenBucket,
        Strategy::SlidingWindow,
    ] {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let limiter: RateLimiter<u64, _, _> = RateLimiter::builder()
            .strategy(strategy)
            .quotas("10/minute")
            .expect("quota")
            .clock(clock.clone())
            .build()
            .expect("rule");
        let base = live_heap();
        for k in 1000..1000 + n {
            limiter.check_now(&k, 1);
        }
        clock.advance(Duration::from_secs(300));
        for k in 0..1000 {
            limiter.check_now(&k, 1);
        }
        let before = live_heap() - base;
        let (took, lat) = during(
            || limiter.sweep(),
            |k| {
                limiter.check_now(&k, 1);
            },
        );
        assert_eq!(
            limiter.stats().keys,
            1000,
            "idle keys swept, live ones kept"
        );
        report(
            &format!("tollgate {strategy} sweep()"),
            took,
            &lat,
            before,
            live_heap() - base,
        );
    }

    // The automatic path: while checks come in, one segment (1/64) is swept every 125 ms.
    {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let limiter: RateLimiter<u64, _, _> = RateLimiter::builder()
            .strategy(Strategy::FixedWindow)
            .quotas("10/minute")
            .expect("quota")
            .clock(clock.clone())
            .build()
            .expect("rule");
        let base = live_heap();
        for k in 1000..1000 + n {
            limiter.check_now(&k, 1);
        }
        clock.advance(Duration::from_secs(300));
        let before = live_heap() - base;
        let mut lat = Vec::new();
        let t = Instant::now();
        let mut checks = 0u64;
        while limiter.stats().keys > 1000 && checks < 10_000_000 {
            // 10 µs of (manual) time per check: the timed steps sweep the store every 8 s.
            clock.advance(Duration::from_micros(10));
            let c = Instant::now();
            limiter.check_now(&(checks % 1000), 1);
            lat.push(c.elapsed().as_nanos() as u64);
            checks += 1;
        }
        let took = t.elapsed();
        lat.sort_unstable();
        lat.shrink_to_fit();
        report(
            &format!("tollgate automatic ({checks} checks)"),
            took,
            &lat,
            before,
            live_heap() - base,
        );
    }

    {
        let quota = governor::Quota::per_minute(NonZeroU32::new(10).expect("10"));
        let clock = governor::clock::FakeRelativeClock::default();
        let g = governor::RateLimiter::dashmap_with_clock(quota, clock.clone());
        let base = live_heap();
        for k in 1000..1000 + n {
            let _ = g.check_key(&k);
        }
        clock.advance(Duration::from_secs(300));
        for k in 0..1000u64 {
            let _ = g.check_key(&k);
        }
        let before = live_heap() - base;
        let (took, lat) = during(
            || g.retain_recent(),
            |k| {
                let _ = g.check_key(&k);
            },
        );
        report(
            "governor retain_recent()",
            took,
            &lat,
            before,
            live_heap() - base,
        );
        let before = live_heap() - base;
        let (took, lat) = during(
            || g.shrink_to_fit(),
            |k| {
                let _ = g.check_key(&k);
            },
        );
        report(
            "governor shrink_to_fit()",
            took,
            &lat,
            before,
            live_heap() - base,
        );
    }
}
