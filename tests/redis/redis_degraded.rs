//! Degraded mode: during an outage the store decides with a local limiter of the
//! same rule, its limit divided by the instances; keys known blocked stay blocked; the circuit
//! breaker opens after consecutive failures, so a dead or hung Redis costs no timeout per call,
//! and probes until Redis is back. Each test on its own server.

use crate::redis_support;

use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Op, Rule, StoreErrorKind, Strategy};

const TIMEOUT: Duration = Duration::from_millis(50);
const SLACK: Duration = Duration::from_secs(1);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Applies a cost-1 check and asserts it returned within the timeout + 1 s.
async fn check(
    store: &RedisStore,
    key: &str,
    rule: &Rule,
) -> Result<tollgate::Decision, tollgate::StoreError> {
    let start = Instant::now();
    let r = store
        .apply(
            &key.to_string(),
            Scope::new("default", rule),
            Op::Check(1),
            0,
        )
        .await;
    assert!(
        start.elapsed() <= TIMEOUT + SLACK,
        "a call took {:?}",
        start.elapsed()
    );
    r
}

#[test]
fn the_local_limiter_admits_its_share_and_blocked_keys_stay_blocked() {
    let _g = crate::redis_faults::serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .local_fallback(2)
            .build()
            .await
            .unwrap();
        for strategy in Strategy::ALL {
            let rule = Rule::parse(strategy, "10/hour").unwrap();
            let hot = format!("hot-{strategy}");
            let admitted = {
                let mut n = 0;
                for _ in 0..12 {
                    n += u32::from(check(&store, &hot, &rule).await.unwrap().is_allowed());
                }
                n
            };
            assert_eq!(admitted, 10, "{strategy}: Redis decides while up");
        }
        server.kill9();
        // Past the cache's 1 s staleness bound: the hot keys are answered by the outage path.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let before = store.counters();
        for strategy in Strategy::ALL {
            let rule = Rule::parse(strategy, "10/hour").unwrap();
            let hot = format!("hot-{strategy}");
            let cold = format!("cold-{strategy}");
            let mut cold_admitted = 0;
            for _ in 0..12 {
                let d = check(&store, &cold, &rule)
                    .await
                    .expect("degraded mode answers, never an error");
                cold_admitted += u32::from(d.is_allowed());
                assert_eq!(
                    d.limit(),
                    5,
                    "{strategy}: the local decision's own limit {d:?} {:?}",
                    store.counters()
                );
                // The outage keeps Redis's wait, past the staleness bound.
                let d = check(&store, &hot, &rule).await.unwrap();
                assert!(
                    !d.is_allowed(),
                    "{strategy}: a key known blocked stays blocked"
                );
                assert!(d.retry_after().is_some());
            }
            assert_eq!(cold_admitted, 5, "{strategy}: 10 / 2 instances");
        }
        let after = store.counters();
        let n = Strategy::ALL.len() as u64;
        assert_eq!(after.local_allowed - before.local_allowed, 5 * n);
        // 7 cold rejections by the local limiter and 12 hot ones from the cache, per strategy.
        assert_eq!(after.local_rejected - before.local_rejected, 19 * n);
        assert!(after.breaker_opens >= 1, "{after:?}");
        let stats = <RedisStore as Store<String>>::stats(&store);
        assert!(stats.store_errors > 0);
        // Redis back: its own count rules again (the probe closes the circuit).
        tokio::task::block_in_place(|| server.restart());
        let rule = Rule::parse(Strategy::FixedWindow, "3/hour").unwrap();
        let up = Instant::now();
        loop {
            let before = store.counters();
            let d = check(&store, "back", &rule).await.unwrap();
            if store.counters().local_allowed == before.local_allowed
                && store.counters().local_rejected == before.local_rejected
            {
                assert!(d.is_allowed());
                break;
            }
            assert!(
                up.elapsed() < Duration::from_secs(3),
                "Redis never decided again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!store.counters().breaker_open);
    });
}

#[test]
fn an_open_breaker_answers_a_dead_redis_without_a_timeout_per_call() {
    let _g = crate::redis_faults::serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .circuit_breaker(5, Duration::from_secs(30))
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::SlidingWindow, "100/minute").unwrap();
        assert!(check(&store, "k", &rule).await.unwrap().is_allowed());
        // Hung: the sockets stay open, nothing answers.
        server.pause();
        // Overload first (Redis answered within 500 ms: shed, never admitted), then outages.
        let mut shed = 0;
        let mut errors = 0;
        while !store.counters().breaker_open {
            match check(&store, "k", &rule).await {
                Ok(d) => {
                    assert!(!d.is_allowed(), "a timeout is never an admission");
                    shed += 1;
                }
                Err(e) => {
                    assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}");
                    errors += 1;
                }
            }
            assert!(
                errors <= 5,
                "the breaker opens after 5 consecutive failures"
            );
        }
        assert_eq!(errors, 5);
        let timed_out = store.counters().timed_out;
        for _ in 0..200 {
            let e = check(&store, "k", &rule)
                .await
                .expect_err("open: the failure policy decides");
            assert_eq!(e.kind(), StoreErrorKind::Connection, "{e}");
        }
        assert_eq!(
            store.counters().timed_out,
            timed_out,
            "no call reached the hung server while the circuit was open"
        );
        eprintln!("hung: {shed} shed, then {errors} timeouts opened the breaker");
        server.resume();
    });
}

/// The layer's metrics during an outage: the local fallback's decisions under their own outcomes,
/// and `tollgate_breaker_open` 1 once the breaker opened (published by `metrics::publish_stats`).
#[test]
fn the_layer_counts_local_decisions_and_publishes_the_open_breaker() {
    use tollgate::RateLimiter;
    use tollgate::key::GlobalKey;
    use tollgate::layer::RateLimitLayer;
    use tower::{Layer, ServiceExt};

    let _g = crate::redis_faults::serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .local_fallback(1)
            .circuit_breaker(2, Duration::from_secs(60))
            .timeout(TIMEOUT)
            .build()
            .await
            .unwrap();
        let limiter = RateLimiter::<()>::builder()
            .name("api")
            .quotas("3/hour")
            .unwrap()
            .store(store.clone())
            .build()
            .unwrap();
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let page = recorder.handle();
        // The handles are resolved when the layer is built: with this test's own recorder.
        let layer =
            metrics::with_local_recorder(&recorder, || RateLimitLayer::new(limiter, GlobalKey));
        let svc = layer
            .clone()
            .layer(tower::service_fn(|_req: http::Request<String>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }));
        let call = || svc.clone().oneshot(http::Request::new(String::new()));
        assert_eq!(call().await.unwrap().status(), http::StatusCode::OK);
        server.kill9();
        let mut during = 0;
        while !store.counters().breaker_open {
            call().await.unwrap();
            during += 1;
            assert!(
                during < 100,
                "the breaker never opened: {:?}",
                store.counters()
            );
        }
        tollgate::metrics::publish_stats();
        let page = page.render();
        let value = |series: &str| {
            page.lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit(' ').next())
                .map_or(0.0, |v| v.parse::<f64>().unwrap())
        };
        let outcome = |o: &str| {
            value(&format!(
                "tollgate_requests_total{{limit=\"api\",outcome=\"{o}\"}}"
            ))
        };
        assert_eq!(outcome("allowed"), 1.0, "Redis decided while up: {page}");
        assert_eq!(
            outcome("local_allowed") + outcome("local_rejected"),
            f64::from(during),
            "every decision during the outage was local: {page}"
        );
        assert!(outcome("local_allowed") >= 1.0, "{page}");
        assert_eq!(outcome("fail_open"), 0.0, "{page}");
        assert_eq!(value("tollgate_breaker_open{limit=\"api\"}"), 1.0, "{page}");
    });
}
