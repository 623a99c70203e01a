//! A fixed number of checks, for instruction counts under callgrind (stable on a noisy machine).
//!
//! ```text
//! cargo build --release -p tollgate-tools --bin bench_callgrind
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/bench_callgrind tollgate/token-bucket/coarse allow_all 1 200000
//! ```
//! Arguments: implementation (`governor/quanta`, `governor/monotonic`, `dashmap` (a bare
//! `DashMap<u64, AtomicU64>`: a look-up and a compare-and-swap, the floor of a map-based limiter;
//! it admits in every allow mode, rejects in `reject_all`), `dashmap+R` (the same after `R`
//! rounds of arithmetic the look-up does not wait for, about 14 instructions a round),
//! `tollgate/<strategy>/<clock>`
//! with clock `coarse`, `system` (precise), `default` (the builder's default: none given) or
//! `manual`), the mode, the number of keys, the number of timed checks, and optionally the number of
//! threads (default 1) that share them (`TOLLGATE_PIN=1`: thread `t` pinned to CPU `t`). Modes:
//! `allow_all` (`4294967295/day`; governor the same
//! rate with burst u32::MAX), `allow_1e9` (`1000000000/s` for every strategy but the moving window,
//! which keeps `allow_all`'s quota; governor `per_second(10^9)`), `reject_all` (`1/day`);
//! `TOLLGATE_QUOTAS="..."` replaces tollgate's quota (several quotas). It
//! prints the wall time per check (aggregate over the threads), used by `scripts/bench_rounds.sh`.
//! Instructions per check = (total at 2n - total at n) / n, which cancels the set-up (see
//! `scripts/bench_callgrind.sh`).

#[path = "../threads.rs"]
mod threads;
use threads::{cpu_nanos, pin};

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::Quota;
use governor::clock::MonotonicClock;
use tollgate::{Clock, CoarseClock, ManualClock, RateLimiter, Strategy, SystemClock};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (imp, mode, keys, n, threads) = match &args[..] {
        [_, imp, mode, keys, n] => (imp, mode, keys, n, 1),
        [_, imp, mode, keys, n, t] => (imp, mode, keys, n, t.parse().expect("THREADS")),
        _ => {
            eprintln!(
                "usage: bench_callgrind IMPL allow_all|allow_1e9|reject_all KEYS N [THREADS]"
            );
            std::process::exit(2);
        }
    };
    let allow = mode != "reject_all";
    let per_second = mode == "allow_1e9";
    let keys: u64 = keys.parse().expect("KEYS");
    let n: u64 = n.parse().expect("N");
    let check: Box<dyn Fn(u64) -> bool + Sync> = if let Some(rest) = imp.strip_prefix("tollgate/") {
        let (strategy, clock) = rest.rsplit_once('/').expect("tollgate/<strategy>/<clock>");
        let strategy: Strategy = strategy.parse().expect("strategy");
        let quota = match (allow, strategy) {
            (false, _) => "1/day",
            (true, Strategy::MovingWindow) if keys == 1 => "1048576/20ms",
            (true, Strategy::MovingWindow) => "1048576/day",
            (true, _) if per_second => "1000000000/s",
            (true, _) => "4294967295/day",
        };
        // `TOLLGATE_QUOTAS` replaces the mode's quota (e.g. several: "10000000/1s; 20000000/2s").
        let quotas = std::env::var("TOLLGATE_QUOTAS").ok();
        let quota = quotas.as_deref().unwrap_or(quota);
        // A bucket key is populated half full, so that it stays held (not fresh) through the run.
        let cost = match (allow, strategy.is_bucket()) {
            (true, true) if per_second => 1 << 29,
            (true, true) => 1 << 31,
            _ => 1,
        };
        match clock {
            "coarse" => tollgate(strategy, quota, CoarseClock::new(), keys, cost),
            "system" => tollgate(strategy, quota, SystemClock::new(), keys, cost),
            "default" => {
                let l: RateLimiter<u64> = RateLimiter::builder()
                    .strategy(strategy)
                    .quotas(quota)
                    .expect("quota")
                    .build()
                    .expect("rule");
                populated(l, keys, cost)
            }
            _ => tollgate(
                strategy,
                quota,
                ManualClock::new(Duration::from_secs(1_700_000_000)),
                keys,
                cost,
            ),
        }
    } else if let Some(work) = imp.strip_prefix("dashmap") {
        // The floor of any limiter that keeps a key's state in a DashMap: a look-up of the key and
        // one compare-and-swap of its word, nothing else (no clock, no rule; it rejects only in
        // `reject_all`). `dashmap+R`: R rounds of arithmetic on the key first, which the look-up
        // does not wait for (a stand-in for a limiter's own work: it shows how long a check may
        // be before a table larger than the cache costs a whole memory latency per check).
        let rounds: u32 = match work {
            "" => 0,
            _ => work
                .strip_prefix('+')
                .and_then(|r| r.parse().ok())
                .expect("dashmap or dashmap+ROUNDS"),
        };
        let map = dashmap::DashMap::<u64, AtomicU64, foldhash::fast::RandomState>::default();
        populate_with(keys, |k| map.insert(k, AtomicU64::new(0)).is_none());
        let add = move |k: u64, delta: u64| {
            let swapped = map.get(&k).is_some_and(|v| {
                let old = v.load(Ordering::Relaxed);
                v.compare_exchange(
                    old,
                    old.wrapping_add(delta),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            });
            swapped && allow
        };
        // Two closures: the bare floor carries no test of `rounds`.
        if rounds == 0 {
            Box::new(move |k| add(k, 1))
        } else {
            Box::new(move |k| add(k, 1 + (busy(k, rounds) & 1)))
        }
    } else {
        let quota = if per_second {
            Quota::per_second(NonZeroU32::new(1_000_000_000).expect("rate"))
        } else if allow {
            Quota::with_period(Duration::from_nanos(
                86_400_000_000_000 / u64::from(u32::MAX),
            ))
            .expect("period")
            .allow_burst(NonZeroU32::MAX)
        } else {
            Quota::with_period(Duration::from_secs(86_400)).expect("period")
        };
        if imp == "governor/monotonic" {
            let g = governor::RateLimiter::dashmap_with_clock(quota, MonotonicClock);
            populate_with(keys, |k| g.check_key(&k).is_ok());
            Box::new(move |k| g.check_key(&k).is_ok())
        } else {
            let g = governor::RateLimiter::<u64, _, _>::keyed(quota);
            populate_with(keys, |k| g.check_key(&k).is_ok());
            Box::new(move |k| g.check_key(&k).is_ok())
        }
    };
    // Every thread runs n / threads checks; the time is the wall time of all (aggregate rate).
    let per_thread = n / threads;
    let barrier = std::sync::Barrier::new(threads as usize);
    let check = &*check;
    let (elapsed, admitted, cpu) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ t.wrapping_mul(0xA076_1D64_78BD_642F);
                    pin(t as usize);
                    let mut admitted = 0u64;
                    barrier.wait();
                    let cpu_start = cpu_nanos();
                    let start = std::time::Instant::now();
                    for _ in 0..per_thread {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = if keys == 1 {
                            0
                        } else {
                            ((u128::from(x) * u128::from(keys)) >> 64) as u64
                        };
                        admitted += u64::from(check(black_box(k)));
                    }
                    let end = std::time::Instant::now();
                    (start, end, admitted, cpu_nanos().saturating_sub(cpu_start))
                })
            })
            .collect();
        let runs: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect();
        let first = runs.iter().map(|r| r.0).min().expect("a thread");
        let last = runs.iter().map(|r| r.1).max().expect("a thread");
        let cpu = runs.iter().map(|r| r.3).sum::<u64>();
        (last - first, runs.iter().map(|r| r.2).sum::<u64>(), cpu)
    });
    let total = per_thread * threads;
    if allow {
        assert_eq!(admitted, total, "workload broken");
    } else {
        assert_eq!(admitted, 0, "workload broken");
    }
    // Wall time too, for side-by-side rounds outside valgrind (scripts/bench_rounds.sh), and the
    // time the threads spent on a CPU (summed), which a machine shared with other work inflates
    // less (no time spent descheduled).
    println!(
        "{:.2} ns/check (wall), {:.2} ns/check on CPU",
        elapsed.as_nanos() as f64 / total as f64,
        cpu as f64 / total as f64
    );
}

/// `rounds` rounds of multiply-rotate on `k`, four chains side by side (about 14 instructions a
/// round): work whose result only the final compare-and-swap uses.
fn busy(k: u64, rounds: u32) -> u64 {
    let mut lanes = [k, k ^ 1, k ^ 2, k ^ 3];
    for r in 0..black_box(rounds) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = (*lane ^ u64::from(r))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15 + 2 * i as u64)
                .rotate_left(23);
        }
    }
    lanes.iter().fold(0, |a, l| a ^ l)
}

fn populate_with(keys: u64, f: impl Fn(u64) -> bool) {
    for k in 0..keys {
        f(k);
    }
}

fn tollgate<C: Clock>(
    strategy: Strategy,
    quota: &str,
    clock: C,
    keys: u64,
    cost: u32,
) -> Box<dyn Fn(u64) -> bool + Sync> {
    let l: RateLimiter<u64, _, C> = RateLimiter::builder()
        .strategy(strategy)
        .quotas(quota)
        .expect("quota")
        .clock(clock)
        .build()
        .expect("rule");
    populated(l, keys, cost)
}

fn populated<C: Clock>(
    l: RateLimiter<u64, tollgate::store::MemoryStore<u64>, C>,
    keys: u64,
    cost: u32,
) -> Box<dyn Fn(u64) -> bool + Sync> {
    for k in 0..keys {
        l.check_now(&k, cost);
    }
    Box::new(move |k| l.check_now(&k, 1).is_allowed())
}
