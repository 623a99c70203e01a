//! Departure gaps of the shaping queue: `WAITERS` requests arrive at once at a layer in
//! queue mode (leaky bucket, `RATE`/s, maximum wait `MAX_WAIT` ms); the handler timestamps each
//! departure (the server's side, not the client's), and the program prints the median, p99 and
//! largest gap between consecutive departures, against the interval `T = 1/RATE`, and checks that
//! they left in arrival order.
//!
//! ```text
//! cargo run -p tollgate-tools --bin queue_gaps                       # 100/s, 200 waiters, 3000 ms
//! cargo run -p tollgate-tools --bin queue_gaps -- --rate 100 --waiters 200 --max-wait 3000
//! cargo run -p tollgate-tools --features redis --bin queue_gaps -- --redis redis://127.0.0.1:6379
//! ```
//!
//! Exit code 1 if the order is broken, a request that fits the maximum wait was refused, or a
//! departure came later than its arrival plus the maximum wait (plus 20 ms of timer slack).

use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use tollgate::key::GlobalKey;
use tollgate::layer::{Pacing, RateLimitLayer};
use tollgate::store::Store;
use tollgate::{Clock, RateLimiter, Strategy};
use tower::{Layer, Service, ServiceExt, service_fn};

struct Options {
    rate: u32,
    waiters: usize,
    max_wait: u64,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    redis: Option<String>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        rate: 100,
        waiters: 200,
        max_wait: 3000,
        redis: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag}: bad value {value:?}");
        match flag.as_str() {
            "--rate" => o.rate = value.parse().map_err(bad)?,
            "--waiters" => o.waiters = value.parse().map_err(bad)?,
            "--max-wait" => o.max_wait = value.parse().map_err(bad)?,
            "--redis" => o.redis = Some(value),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(o)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run<St: Store<()>, C: Clock>(limiter: RateLimiter<(), St, C>, o: &Options) -> ExitCode {
    let interval = Duration::from_secs(1) / o.rate;
    let max_wait = Duration::from_millis(o.max_wait);
    let departures = Arc::new(Mutex::new(Vec::with_capacity(o.waiters)));
    let log = Arc::clone(&departures);
    let handler = service_fn(move |req: Request<Body>| {
        let id: usize = req
            .headers()
            .get("x-id")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(usize::MAX);
        log.lock().unwrap().push((id, Instant::now()));
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    });
    let layer = match RateLimitLayer::new(limiter, GlobalKey).pacing(Pacing::Queue(max_wait)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("queue_gaps: {e}");
            return ExitCode::from(2);
        }
    };
    let mut svc = layer.layer(handler);
    let mut tasks = Vec::with_capacity(o.waiters);
    let mut arrivals = Vec::with_capacity(o.waiters);
    for id in 0..o.waiters {
        let req = Request::get("/")
            .header("x-id", id)
            .body(Body::empty())
            .unwrap();
        // Called here, in arrival order (the memory store reserves the departure in `call`; a
        // Redis check is sent when its task is first polled, in spawn order on this one thread).
        let ready = match svc.ready().await {
            Ok(s) => s,
            Err(e) => match e {},
        };
        arrivals.push(Instant::now());
        let fut = ready.call(req);
        tasks.push(tokio::spawn(fut));
    }
    let mut refused = Vec::new();
    for (id, t) in tasks.into_iter().enumerate() {
        let res: Response<_> = t.await.unwrap().unwrap();
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            refused.push(id);
        }
    }
    let log = departures.lock().unwrap().clone();
    let ids: Vec<usize> = log.iter().map(|(id, _)| *id).collect();
    let in_order = ids.windows(2).all(|w| w[0] < w[1]);
    let fits = (max_wait.as_nanos() / interval.as_nanos()) as usize + 1;
    let late = log
        .iter()
        .filter(|(id, at)| *at > arrivals[*id] + max_wait + Duration::from_millis(20))
        .count();
    let mut gaps: Vec<Duration> = log.windows(2).map(|w| w[1].1 - w[0].1).collect();
    gaps.sort();
    if gaps.is_empty() {
        eprintln!("queue_gaps: fewer than two departures");
        return ExitCode::FAILURE;
    }
    println!(
        "rate={}/s T={:?} waiters={} max_wait={}ms departed={} refused={} in_order={in_order} late={late}",
        o.rate,
        interval,
        o.waiters,
        o.max_wait,
        log.len(),
        refused.len()
    );
    println!(
        "gap median={:.3}ms p99={:.3}ms max={:.3}ms min={:.3}ms span={:.1}ms",
        percentile(&gaps, 0.5).as_secs_f64() * 1e3,
        percentile(&gaps, 0.99).as_secs_f64() * 1e3,
        gaps[gaps.len() - 1].as_secs_f64() * 1e3,
        gaps[0].as_secs_f64() * 1e3,
        (log[log.len() - 1].1 - log[0].1).as_secs_f64() * 1e3,
    );
    let expected_refused = o.waiters.saturating_sub(fits);
    if !in_order || late > 0 || refused.len() != expected_refused {
        eprintln!(
            "queue_gaps: FAILED (order {in_order}, late {late}, refused {} of an expected {expected_refused})",
            refused.len()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("queue_gaps: {e}");
            return ExitCode::from(2);
        }
    };
    let quota = format!("{}/second", o.rate);
    #[cfg(not(feature = "redis"))]
    if o.redis.is_some() {
        eprintln!("queue_gaps: --redis needs `--features redis`");
        return ExitCode::from(2);
    }
    #[cfg(feature = "redis")]
    if let Some(url) = &o.redis {
        let store = match tollgate::store::redis::RedisStore::builder(url)
            .prefix(format!("queue-gaps-{}:", std::process::id()))
            .build()
            .await
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("queue_gaps: {e}");
                return ExitCode::FAILURE;
            }
        };
        let limiter = RateLimiter::builder()
            .strategy(Strategy::LeakyBucket)
            .quotas(&quota)
            .unwrap()
            .store(store)
            .build()
            .unwrap();
        return run(limiter, &o).await;
    }
    let limiter = RateLimiter::builder()
        .strategy(Strategy::LeakyBucket)
        .quotas(&quota)
        .unwrap()
        .build()
        .unwrap();
    run(limiter, &o).await
}
