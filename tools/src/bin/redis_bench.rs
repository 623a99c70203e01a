//! Decisions per second through [`RedisStore`] with 64 calls in flight, next to the floor: a plain
//! multiplexed `EVALSHA` loop of the same script with the `redis` crate on the same server.
//!
//! ```text
//! cargo run --release -p tollgate-tools --features redis --bin redis_bench -- redis://127.0.0.1:6379 [seconds]
//! ```
//! `scripts/redis_bench.sh` starts a throw-away server and runs this plus `redis-benchmark -c 64`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::store::Store;
use tollgate::store::redis::RedisStore;
use tollgate::{Op, Rule, Strategy};

const IN_FLIGHT: usize = 64;
const KEYS: u64 = 10_000;

async fn run<F, Fut>(secs: u64, call: F) -> f64
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
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let secs: u64 = args.next().map_or(Ok(5), |s| s.parse())?;

    // Token bucket 1000/second: the GCRA script.
    let rule = Rule::parse(Strategy::TokenBucket, "1000/second")?;
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(1))
        .build()
        .await?;
    let s = store.clone();
    let r = rule.clone();
    let through_store = run(secs, move |k| {
        let f = s.apply(&k, &r, Op::Check(1), 0);
        async move { f.await.is_ok() }
    })
    .await;

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
    let plain = run(secs, move |k| {
        let mut conn = conn.clone();
        let key = store.redis_keys(&k, &rule).remove(0);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha_in).arg(1).arg(key);
        // op, cost, now (0: TIME), ttl ms, aligned, quotas, then limit, window µs, T µs, burst.
        cmd.arg(&[0u64, 1, 0, 2000, 0, 1, 1000, 1_000_000, 1000, 1000]);
        async move { cmd.query_async::<redis::Value>(&mut conn).await.is_ok() }
    })
    .await;
    println!("{IN_FLIGHT} in flight, {KEYS} keys, {secs} s each");
    println!("RedisStore::apply      {through_store:>10.0} decisions/s");
    println!("plain EVALSHA loop     {plain:>10.0} calls/s");
    println!("ratio                  {:>10.2}", through_store / plain);
    println!("sha {sha}");
    Ok(())
}
