//! Decisions per second through [`RedisStore`] with 64 calls in flight, next to the floor: a plain
//! multiplexed `EVALSHA` loop of the same script with the `redis` crate on the same server, in
//! interleaved rounds (the first of each pair alternating), with the median of each and of the
//! rounds' ratios. Then
//! a request of three limits (IP, user, global keys) decided with [`Store::apply_all`] (one
//! script call) and with the two-phase protocol ([`AllAnswer::in_turn`], one call per limit), with
//! the script calls per decision counted in `INFO commandstats`.
//!
//! ```text
//! cargo run --release -p tollgate-tools --features redis --bin redis_bench -- redis://127.0.0.1:6379 [seconds] [rounds]
//! ```
//! `scripts/redis_bench.sh` starts a throw-away server and runs this plus `redis-benchmark -c 64`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::store::redis::RedisStore;
use tollgate::store::{AllAnswer, Item, Scope, Store};
use tollgate::{Op, Rule, Strategy};

const IN_FLIGHT: usize = 64;
const KEYS: u64 = 10_000;

/// Calls `call` from 64 tasks for `secs` seconds over random keys: calls per second and the
/// number of calls that succeeded.
async fn run_counted<F, Fut>(secs: u64, call: F) -> (f64, u64)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT as u64)
        .map(|t| {
            let (stop, done, failed, call) = (
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(&failed),
                call.clone(),
            );
            tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if call((i >> 33) % KEYS).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        eprintln!("  ({failed} calls failed)");
    }
    let done = done.load(Ordering::Relaxed);
    (done as f64 / start.elapsed().as_secs_f64(), done)
}

/// The median of `v` (the upper one of an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// [`run_counted`], with this process's CPU time (user and system) per successful call, in
/// microseconds: the client's own cost of a call, which other processes' load changes far less
/// than the calls per second.
async fn run_cpu<F, Fut>(secs: u64, call: F) -> (f64, f64)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let before = cpu_ticks();
    let (rate, done) = run_counted(secs, call).await;
    let ticks = cpu_ticks().saturating_sub(before);
    // `/proc` counts in clock ticks of 10 ms (`getconf CLK_TCK`: 100).
    (rate, ticks as f64 * 10_000.0 / done.max(1) as f64)
}

/// This process's user plus system CPU time so far, in clock ticks (`/proc/self/stat` fields 14
/// and 15); 0 where `/proc` is missing.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Script calls (`EVALSHA` and `EVAL`) the server has served so far.
async fn script_calls(conn: &redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn.clone())
        .await
        .unwrap_or_default();
    ["evalsha", "eval"]
        .iter()
        .map(|name| {
            let tag = format!("cmdstat_{name}:calls=");
            info.lines()
                .find_map(|l| l.trim().strip_prefix(&tag))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let secs: u64 = args.next().map_or(Ok(5), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |s| s.parse())?;

    // Token bucket 1000/second: the GCRA script.
    let rule = Rule::parse(Strategy::TokenBucket, "1000/second")?;
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(1))
        .build()
        .await?;
    let (s, r) = (store.clone(), rule.clone());
    let through_store = move |k: u64| {
        let f = s.apply(&k, Scope::new("default", &r), Op::Check(1), 0);
        async move { f.await.is_ok() }
    };

    // The floor: the same script, same arguments, straight EVALSHA on one multiplexed connection.
    let client = redis::Client::open(url.as_str())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let src = RedisStore::script_source(Strategy::TokenBucket);
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(&src)
        .query_async(&mut conn.clone())
        .await?;
    let sha_in = sha.clone();
    let (conn_kept, store_kept) = (conn.clone(), store.clone());
    let plain = move |k: u64| {
        let mut conn = conn.clone();
        let key = store.redis_keys(&k, Scope::new("default", &rule)).remove(0);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha_in).arg(1).arg(key);
        // op, cost, now (0: TIME), ttl ms, aligned, quotas, then limit, window µs, T µs, burst.
        cmd.arg(&[0u64, 1, 0, 2000, 0, 1, 1000, 1_000_000, 1000, 1000]);
        async move { cmd.query_async::<redis::Value>(&mut conn).await.is_ok() }
    };
    println!("{IN_FLIGHT} in flight, {KEYS} keys, {secs} s each, {rounds} interleaved rounds");
    let (mut stores, mut plains, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut store_cpu, mut plain_cpu) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Each goes first in every other round: neither always meets the warmer server.
        let ((a, a_cpu), (b, b_cpu)) = if round % 2 == 0 {
            let a = run_cpu(secs, through_store.clone()).await;
            (a, run_cpu(secs, plain.clone()).await)
        } else {
            let b = run_cpu(secs, plain.clone()).await;
            (run_cpu(secs, through_store.clone()).await, b)
        };
        println!(
            "round {}: RedisStore::apply {a:>8.0} decisions/s ({a_cpu:.1} µs CPU each), plain EVALSHA {b:>8.0} calls/s ({b_cpu:.1} µs), ratio {:.2}",
            round + 1,
            a / b
        );
        stores.push(a);
        plains.push(b);
        ratios.push(a / b);
        store_cpu.push(a_cpu);
        plain_cpu.push(b_cpu);
    }
    println!(
        "median RedisStore::apply {:>10.0} decisions/s",
        median(&mut stores)
    );
    println!(
        "median plain EVALSHA     {:>10.0} calls/s",
        median(&mut plains)
    );
    println!("median ratio             {:>10.2}", median(&mut ratios));
    println!(
        "median client CPU per call: RedisStore::apply {:.1} µs, plain EVALSHA {:.1} µs",
        median(&mut store_cpu),
        median(&mut plain_cpu)
    );
    // Three limits per request, every one admitting: IP (token bucket), user (fixed window, 1000
    // users), global (sliding window, one key).
    let three = Arc::new([
        Rule::parse(Strategy::TokenBucket, "1000/second")?,
        Rule::parse(Strategy::FixedWindow, "1000000/hour")?,
        Rule::parse(Strategy::SlidingWindow, "1000000000/hour")?,
    ]);
    let mut multi = Vec::new();
    for one_call in [false, true] {
        let (conn, store) = (&conn_kept, &store_kept);
        let before = script_calls(conn).await;
        let (s, r) = (store.clone(), Arc::clone(&three));
        let (rate, done) = run_counted(secs, move |k| {
            let (s, r) = (s.clone(), Arc::clone(&r));
            async move {
                let keys = [k, 1_000_000 + k % 1000, 2_000_000];
                let names = ["ip", "user", "global"];
                let items: Vec<Item<'_, u64, RedisStore>> = (0..3)
                    .map(|i| Item {
                        store: &s,
                        key: &keys[i],
                        scope: Scope::new(names[i], &r[i]),
                        cost: 1,
                    })
                    .collect();
                let answers = if one_call {
                    s.apply_all(&items, 0).await
                } else {
                    AllAnswer::in_turn(&items, 0).await
                };
                answers.len() == 3
                    && answers
                        .iter()
                        .all(|(_, a)| a.as_ref().is_ok_and(|d| d.is_allowed()))
            }
        })
        .await;
        let calls = script_calls(conn).await.saturating_sub(before);
        multi.push((rate, calls as f64 / done.max(1) as f64));
    }
    for ((rate, calls), label) in multi
        .iter()
        .zip(["two-phase, 3 limits", "apply_all, 3 limits"])
    {
        println!("{label:<22} {rate:>10.0} decisions/s, {calls:.2} script calls per decision");
    }
    println!("sha {sha}");
    Ok(())
}
