//! Bytes per key at 10^6 keys: every tollgate strategy next to governor's keyed store and a plain
//! `DashMap<K, u64>`, for `u64`, `IpAddr` and 24-character `String` keys.
//!
//! `cargo run --release -p tollgate-tools --bin memory_per_key` runs every case in a child process of its own (so
//! that RSS is not blurred by memory the allocator kept from an earlier case) and prints a table:
//! heap bytes per key from a counting global allocator (what is live after the inserts, key bytes
//! on the heap included) and the growth of RSS (`VmRSS` in `/proc/self/status`) per key.
//! `memory_per_key IMPL KEY [N]` runs one case; `TOLLGATE_QUOTAS="10/60s; 20/120s"` gives tollgate
//! a rule of several quotas. `memory_per_key moving-logs` measures the moving window's logs kept
//! alive: 200 keys fill `100000/hour` logs, then each key sends one request an hour; the heap held
//! is printed after the fill and every hour for three hours (manual clock), before and after a
//! forced sweep.

use std::alloc::System;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use dashmap::DashMap;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tollgate::{ManualClock, RateLimiter, Strategy};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const KEY_TYPES: [&str; 3] = ["u64", "IpAddr", "String24"];

fn impls() -> Vec<String> {
    let mut v = vec!["DashMap<K,u64>".to_string(), "governor".to_string()];
    v.extend(Strategy::ALL.iter().map(|s| format!("tollgate/{s}")));
    v
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("moving-logs") {
        moving_logs();
        return;
    }
    if args.len() >= 3 {
        let n = args.get(3).map_or(1_000_000, |s| s.parse().expect("N"));
        let (heap, rss) = match args[2].as_str() {
            "u64" => measure(&args[1], n, |k| k),
            "IpAddr" => measure(&args[1], n, |k| {
                IpAddr::V4(Ipv4Addr::from(u32::try_from(k).expect("k < 2^32")))
            }),
            _ => measure(&args[1], n, |k| format!("{k:024}")),
        };
        println!("{heap:.1} {rss:.1}");
        return;
    }
    let n: u64 = 1_000_000;
    let exe = std::env::current_exe().expect("current_exe");
    println!("bytes per key at {n} keys: heap (counting allocator) / RSS growth");
    print!("{:<36}", "implementation");
    for k in KEY_TYPES {
        print!(" {k:>18}");
    }
    println!();
    for imp in impls() {
        print!("{imp:<36}");
        for key in KEY_TYPES {
            let out = std::process::Command::new(&exe)
                .args([imp.as_str(), key, &n.to_string()])
                .output()
                .expect("child");
            let text = String::from_utf8_lossy(&out.stdout);
            let mut it = text.split_whitespace();
            let heap = it.next().unwrap_or("?");
            let rss = it.next().unwrap_or("?");
            print!(" {:>18}", format!("{heap} / {rss}"));
        }
        println!();
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Builds `n` keys with `key`, then inserts them into `imp`; returns (heap, RSS) bytes per key.
fn measure<K: Hash + Eq + Clone + Send + Sync + 'static>(
    imp: &str,
    n: u64,
    key: impl Fn(u64) -> K,
) -> (f64, f64) {
    // The keys the caller holds (as a server holds request data) are not counted; the copies the
    // store keeps are.
    let keys: Vec<K> = (0..n).map(&key).collect();
    let rss0 = rss_bytes();
    let region = Region::new(GLOBAL);
    let held: Box<dyn std::any::Any> = if imp == "governor" {
        let quota = governor::Quota::per_minute(NonZeroU32::new(10).expect("10"));
        let g = governor::RateLimiter::<K, _, _>::keyed(quota);
        for k in &keys {
            let _ = g.check_key(k);
        }
        Box::new(g)
    } else if let Some(s) = imp.strip_prefix("tollgate/") {
        let strategy: Strategy = s.parse().expect("strategy");
        // 10/minute (or the quotas in `TOLLGATE_QUOTAS`, e.g. "10/60s; 20/120s; ...") with a clock
        // that stands still: nothing expires while the keys go in.
        let quotas = std::env::var("TOLLGATE_QUOTAS").unwrap_or_else(|_| "10/minute".into());
        let l: RateLimiter<K, _, _> = RateLimiter::builder()
            .strategy(strategy)
            .quotas(&quotas)
            .expect("quota")
            .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
            .build()
            .expect("rule");
        for k in &keys {
            l.check_now(k, 1);
        }
        assert_eq!(l.stats().keys, n);
        Box::new(l)
    } else {
        let m: DashMap<K, u64> = DashMap::new();
        for (i, k) in keys.iter().enumerate() {
            m.insert(k.clone(), i as u64);
        }
        Box::new(m)
    };
    let stats = region.change();
    let heap = stats.bytes_allocated as f64 - stats.bytes_deallocated as f64
        + stats.bytes_reallocated as f64;
    let rss = rss_bytes().saturating_sub(rss0) as f64;
    drop(held);
    (heap / n as f64, rss / n as f64)
}

/// 200 keys fill `100000/hour` moving-window logs over a minute, then send one request an hour: the
/// heap held by the store after the fill and after each of three hours.
fn moving_logs() {
    const KEYS: u64 = 200;
    const FILL: u64 = 100_000;
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let region = Region::new(GLOBAL);
    let heap = || {
        let s = region.change();
        (s.bytes_allocated as f64 - s.bytes_deallocated as f64 + s.bytes_reallocated as f64)
            / f64::from(1 << 20)
    };
    let l: RateLimiter<u64, _, _> = RateLimiter::builder()
        .strategy(Strategy::MovingWindow)
        .quotas("100000/hour")
        .expect("quota")
        .clock(clock.clone())
        .build()
        .expect("rule");
    // The fill spreads over one minute.
    let step = Duration::from_nanos(60_000_000_000 / FILL);
    for _ in 0..FILL {
        for k in 0..KEYS {
            l.check_now(&k, 1);
        }
        clock.advance(step);
    }
    println!("after the fill: {:.1} MiB", heap());
    for hour in 1..=3 {
        clock.advance(Duration::from_secs(3600));
        for k in 0..KEYS {
            assert!(l.check_now(&k, 1).is_allowed());
        }
        let after_requests = heap();
        l.sweep();
        println!(
            "hour {hour}: {after_requests:.1} MiB after the requests, {:.1} MiB after a sweep",
            heap()
        );
    }
}
