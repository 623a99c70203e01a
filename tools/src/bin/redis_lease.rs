//! Quota leasing on the Redis store, three measurements on one Redis:
//!
//! 1. Decisions per second from one process on one hot key (sliding window, 10^6/minute, 64
//!    checks in flight), leasing against the plain store, alternating, `rounds` times (a fresh key
//!    each; a run stops after `seconds` or 800,000 admissions, before the quota runs out): medians
//!    and their ratio, with the Redis commands each made.
//! 2. Two instances, 10^5 attempts against a limit of 1000 (fixed window): admitted before and
//!    after every lease is returned, and Redis's own count.
//! 3. A cold key spread over 4 instances (one attempt every 10 ms at a random instance, limit
//!    200): how many were admitted when the first rejection came (the under-admission: units
//!    held by the other instances' leases), and the total once idle leases came back.
//!
//! ```text
//! cargo run --release -p tollgate-tools --features redis --bin redis_lease -- redis://127.0.0.1:6379 [seconds] [rounds]
//! ```
//! `scripts/redis_lease.sh` starts a throw-away server and runs this.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::store::redis::{Leasing, RedisStore};
use tollgate::{RateLimiter, Strategy};

const IN_FLIGHT: usize = 64;
/// A hot-key run stops once this much of its 10^6 quota is admitted.
const STOP_AT: u64 = 800_000;

type Limiter = RateLimiter<String, RedisStore>;

async fn store(url: &str, lease: bool) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let b = RedisStore::builder(url).timeout(Duration::from_secs(1));
    let b = if lease {
        b.leases(Leasing::default())
    } else {
        b
    };
    Ok(b.build().await?)
}

fn limiter(
    store: RedisStore,
    name: &str,
    strategy: Strategy,
    quota: &str,
) -> Result<Limiter, Box<dyn std::error::Error>> {
    Ok(RateLimiter::builder()
        .name(name)
        .strategy(strategy)
        .quotas(quota)?
        .store(store)
        .build()?)
}

/// Decisions and admissions per second on one key for `secs` (or until `STOP_AT` admissions),
/// `IN_FLIGHT` checks at a time.
async fn hot(l: &Limiter, key: &str, secs: f64) -> (f64, f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (done, allowed, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let start = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (l, key) = (l.clone(), key.to_owned());
            let (stop, done, allowed, errors) = (
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(&allowed),
                Arc::clone(&errors),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match l.check(&key, 1).await {
                        Ok(d) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            if d.is_allowed() {
                                allowed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    // Until `secs` have passed, or most of the quota is spent (the rest would be rejections).
    while start.elapsed().as_secs_f64() < secs && allowed.load(Ordering::Relaxed) < STOP_AT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let el = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / el,
        allowed.load(Ordering::Relaxed) as f64 / el,
        errors.load(Ordering::Relaxed),
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Redis's `total_commands_processed`.
async fn redis_commands(url: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let secs: f64 = args.next().map_or(Ok(2.0), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |s| s.parse())?;
    let run = std::process::id();

    // 1. One hot key, 10^6/minute: plain against leased, alternating rounds, fresh keys.
    let plain = limiter(
        store(&url, false).await?,
        "plain",
        Strategy::SlidingWindow,
        "1000000/minute",
    )?;
    let leased = limiter(
        store(&url, true).await?,
        "leased",
        Strategy::SlidingWindow,
        "1000000/minute",
    )?;
    let (mut p_dec, mut l_dec, mut p_ok, mut l_ok) = (vec![], vec![], vec![], vec![]);
    let (mut p_calls, mut l_calls) = (0u64, 0u64);
    for r in 0..rounds {
        let before = redis_commands(&url).await?;
        let (d, a, e) = hot(&plain, &format!("hot-{run}-{r}"), secs).await;
        let mid = redis_commands(&url).await?;
        let (ld, la, le) = hot(&leased, &format!("hot-{run}-{r}"), secs).await;
        leased.store().return_leases().await?;
        let after = redis_commands(&url).await?;
        p_calls += mid - before;
        l_calls += after - mid;
        println!(
            "round {r}: plain {d:>9.0} decisions/s ({a:>9.0} admitted/s, {e} errors); \
             leased {ld:>9.0} decisions/s ({la:>9.0} admitted/s, {le} errors)"
        );
        p_dec.push(d);
        l_dec.push(ld);
        p_ok.push(a);
        l_ok.push(la);
    }
    let (pd, ld) = (median(&mut p_dec), median(&mut l_dec));
    println!(
        "hot key, sliding window 10^6/minute, {IN_FLIGHT} in flight, {secs} s x {rounds} rounds"
    );
    println!(
        "  plain store   median {pd:>10.0} decisions/s ({:>9.0} admitted/s), {p_calls} Redis commands",
        median(&mut p_ok)
    );
    println!(
        "  leasing store median {ld:>10.0} decisions/s ({:>9.0} admitted/s), {l_calls} Redis commands",
        median(&mut l_ok)
    );
    println!("  ratio {:.1}x", ld / pd);
    let c = leased.store().lease_counters();
    println!(
        "  lease counters: {} fetches, {} units granted, {} checks leased, {} returned",
        c.fetches, c.granted, c.leased, c.returned
    );

    // 2. Two instances, 10^5 attempts against 1000 (fixed window of an hour).
    let a = limiter(
        store(&url, true).await?,
        "exact",
        Strategy::FixedWindow,
        "1000/hour",
    )?;
    let b = limiter(
        store(&url, true).await?,
        "exact",
        Strategy::FixedWindow,
        "1000/hour",
    )?;
    let key = format!("exact-{run}");
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let l = if t % 2 == 0 { a.clone() } else { b.clone() };
            let (key, admitted) = (key.clone(), Arc::clone(&admitted));
            tokio::spawn(async move {
                for _ in 0..12_500 {
                    if l.check(&key, 1).await.is_ok_and(|d| d.is_allowed()) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let took = start.elapsed();
    let first = admitted.load(Ordering::Relaxed);
    let held = a.store().lease_counters().units_held + b.store().lease_counters().units_held;
    a.store().return_leases().await?;
    b.store().return_leases().await?;
    let mut total = first;
    let mut quiet = 0;
    while quiet < 2 {
        let mut any = false;
        for l in [&a, &b] {
            if l.check(&key, 1).await.is_ok_and(|d| d.is_allowed()) {
                total += 1;
                any = true;
            }
        }
        quiet = if any { 0 } else { quiet + 1 };
    }
    a.store().return_leases().await?;
    b.store().return_leases().await?;
    let fetches = a.store().lease_counters().fetches + b.store().lease_counters().fetches;
    println!("two instances, 10^5 attempts against 1000/hour (fixed window), {took:.2?}");
    println!(
        "  admitted {first} with {held} units in leases; after the leases came back: {total} \
         admitted in all; {fetches} lease calls"
    );

    // 3. A cold key spread over 4 instances: one attempt every 10 ms at a random instance.
    let four = [
        limiter(
            store(&url, true).await?,
            "cold",
            Strategy::FixedWindow,
            "200/hour",
        )?,
        limiter(
            store(&url, true).await?,
            "cold",
            Strategy::FixedWindow,
            "200/hour",
        )?,
        limiter(
            store(&url, true).await?,
            "cold",
            Strategy::FixedWindow,
            "200/hour",
        )?,
        limiter(
            store(&url, true).await?,
            "cold",
            Strategy::FixedWindow,
            "200/hour",
        )?,
    ];
    let key = format!("cold-{run}");
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(run);
    let (mut ok, mut at_first_rejection, mut held_then) = (0u64, None, 0u64);
    for _ in 0..300 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = usize::try_from((rng >> 33) % 4).unwrap_or(0);
        let l = four.get(i).unwrap_or(&four[0]);
        match l.check(&key, 1).await {
            Ok(d) if d.is_allowed() => ok += 1,
            Ok(_) if at_first_rejection.is_none() => {
                at_first_rejection = Some(ok);
                held_then = four
                    .iter()
                    .map(|l| l.store().lease_counters().units_held)
                    .sum();
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The idle leases come back by themselves (250 ms without use), cached rejections expire (1 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut after = ok;
    for l in four.iter().cycle().take(400) {
        if l.check(&key, 1).await.is_ok_and(|d| d.is_allowed()) {
            after += 1;
        }
    }
    let first = at_first_rejection.unwrap_or(ok);
    println!("cold key over 4 instances, 200/hour, 300 attempts 10 ms apart");
    println!(
        "  first rejection after {first} admitted: under-admission {} units ({held_then} held in \
         leases then); {ok} admitted over the run; {after} once idle leases came back",
        200 - first.min(200)
    );
    Ok(())
}
