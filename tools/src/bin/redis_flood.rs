//! A flood on one hot key through the layer and the Redis store, in-process:
//! `TASKS` concurrent callers (default 2000) for `SECS` seconds (default 5) against `1000/hour`,
//! with the defaults (fail-open, 50 ms store timeout), for every strategy, on one instance and on
//! two instances sharing one Redis. Prints what was admitted, any 5xx, the limiter's own wait
//! (from the service's `call` to its answer; the inner service answers at once) at p50/p99/max,
//! and the same flood's p99 through a static service without a limiter (what the machine gives).
//!
//! ```text
//! cargo run --release -p tollgate-tools --features redis --bin redis_flood -- redis://127.0.0.1:6379 [TASKS] [SECS]
//! ```
//!
//! Each run flushes nothing: it uses a fresh key prefix per strategy and run.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use parking_lot::Mutex;
use tollgate::key::GlobalKey;
use tollgate::layer::RateLimitLayer;
use tollgate::store::redis::RedisStore;
use tollgate::{RateLimiter, Strategy};
use tower::{Layer, Service, ServiceExt};

const LIMIT: u64 = 1000;

#[derive(Default)]
struct Tally {
    ok: u64,
    limited: u64,
    server_errors: u64,
    waits_us: Vec<u64>,
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run<S, B>(services: Vec<S>, tasks: usize, secs: u64) -> Tally
where
    B: Send + 'static,
    S: Service<Request<String>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let tally = Arc::new(Mutex::new(Tally::default()));
    let end = Instant::now() + Duration::from_secs(secs);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let svc = services[t % services.len()].clone();
            let tally = Arc::clone(&tally);
            tokio::spawn(async move {
                let mut local = Tally::default();
                while Instant::now() < end {
                    let start = Instant::now();
                    let res = svc.clone().oneshot(Request::new(String::new())).await;
                    local
                        .waits_us
                        .push(u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX));
                    match res.map(|r| r.status()) {
                        Ok(StatusCode::OK) => local.ok += 1,
                        Ok(StatusCode::TOO_MANY_REQUESTS) => local.limited += 1,
                        _ => local.server_errors += 1,
                    }
                    tokio::task::yield_now().await;
                }
                let mut t = tally.lock();
                t.ok += local.ok;
                t.limited += local.limited;
                t.server_errors += local.server_errors;
                t.waits_us.extend(local.waits_us);
            })
        })
        .collect();
    for h in handles {
        let _ = h.await;
    }
    let mut t = std::mem::take(&mut *tally.lock());
    t.waits_us.sort_unstable();
    t
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let tasks: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let secs: u64 = args.next().map_or(Ok(5), |s| s.parse())?;
    let run_id = std::process::id();
    let static_svc = tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let machine = run(vec![static_svc], tasks, secs).await;
    println!(
        "static handler, {tasks} tasks x {secs} s: {} calls, p99 {} us",
        machine.waits_us.len(),
        pct(&machine.waits_us, 0.99)
    );
    for strategy in Strategy::ALL {
        for instances in [1usize, 2] {
            let mut services = Vec::new();
            let mut stores = Vec::new();
            for _ in 0..instances {
                let store = RedisStore::builder(&url)
                    .prefix(format!("flood{run_id}-{strategy}-{instances}:"))
                    .build()
                    .await?;
                let limiter: RateLimiter<(), RedisStore> = RateLimiter::builder()
                    .strategy(strategy)
                    .quotas(&format!("{LIMIT}/hour"))?
                    .store(store.clone())
                    .build()?;
                let inner = tower::service_fn(|_: Request<String>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                });
                services.push(RateLimitLayer::new(limiter, GlobalKey).layer(inner));
                stores.push(store);
            }
            let t = run(services, tasks, secs).await;
            let shed: u64 = stores.iter().map(|s| s.counters().shed).sum();
            let timed_out: u64 = stores.iter().map(|s| s.counters().timed_out).sum();
            println!(
                "{strategy:<22} x{instances}: admitted {} (limit {LIMIT}), 429 {}, 5xx {}, \
                 calls {}, wait p50 {} us p99 {} us max {} us, shed {shed}, timed out {timed_out}",
                t.ok,
                t.limited,
                t.server_errors,
                t.waits_us.len(),
                pct(&t.waits_us, 0.5),
                pct(&t.waits_us, 0.99),
                t.waits_us.last().copied().unwrap_or(0)
            );
        }
    }
    Ok(())
}
