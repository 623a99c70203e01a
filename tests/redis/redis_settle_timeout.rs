//! Calls made after a request was decided (a refund, a concurrency lease's release) that time out
//! while Redis is stalled for a moment: counted as timed out (`RedisCounters::settle_timed_out`),
//! never as `fail_open`, and not an outage for the circuit breaker (which would fail a healthy
//! Redis open).

use crate::redis_faults::{rt, serial};
use crate::redis_support::RedisServer;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tollgate::key::GlobalKey;
use tollgate::layer::{ConcurrencyLayer, ConcurrencyLimit, RateLimitLayer, Settle};
use tollgate::store::redis::RedisStore;
use tollgate::{RateLimiter, Strategy};
use tower::{Layer, ServiceExt};

/// Requests held in their handler at once, so their refunds or releases reach a stalled Redis
/// together: more than the breaker's threshold.
const HELD: usize = 8;

/// A handler that waits for a permit of `go` (counting arrivals), then answers 200 with a refund
/// marker (`Settle::refund()`: the request spends nothing).
fn held_handler(
    arrived: Arc<AtomicUsize>,
    go: Arc<Semaphore>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send {
    tower::service_fn(move |_req: Request<String>| {
        let (arrived, go) = (Arc::clone(&arrived), Arc::clone(&go));
        async move {
            arrived.fetch_add(1, Ordering::SeqCst);
            go.acquire().await.expect("gate open").forget();
            let mut res = Response::new("ok".to_owned());
            res.extensions_mut().insert(Settle::refund());
            Ok(res)
        }
    })
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what} not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The default 50 ms timeout, and a breaker that would stay open for the rest of the test had the
/// timed-out refunds counted as outage failures.
async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .timeout(Duration::from_millis(50))
        .circuit_breaker(5, Duration::from_secs(60))
        .build()
        .await
        .expect("connect")
}

#[test]
fn refunds_that_time_out_on_a_stalled_redis_are_counted_never_failed_open() {
    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = store(&server).await;
        let limiter = RateLimiter::<()>::builder()
            .name("refunds")
            .strategy(Strategy::FixedWindow)
            .quotas("1000/hour")
            .unwrap()
            .store(store.clone())
            .build()
            .unwrap();
        let (arrived, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Semaphore::new(0)));
        let svc = RateLimitLayer::new(limiter.clone(), GlobalKey)
            .layer(held_handler(Arc::clone(&arrived), Arc::clone(&go)));
        let call = || svc.clone().oneshot(Request::new(String::new()));
        let held: Vec<_> = (0..HELD).map(|_| tokio::spawn(call())).collect();
        wait_for("every check admitted", Duration::from_secs(5), || {
            arrived.load(Ordering::SeqCst) == HELD
        })
        .await;
        // Redis hangs for a moment right after answering the checks: every refund times out.
        server.pause();
        go.add_permits(HELD);
        for h in held {
            let res = h.await.unwrap().unwrap();
            assert_eq!(res.status(), StatusCode::OK, "admitted before the stall");
        }
        server.resume();
        let c = store.counters();
        assert_eq!(c.settle_timed_out, HELD as u64, "{c:?}");
        assert_eq!(
            c.breaker_opens, 0,
            "refunds that timed out open nothing: {c:?}"
        );
        // Redis answers again: the next request is decided by it, not by the failure policy.
        go.add_permits(1);
        let res = call().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let stats = limiter.stats();
        assert_eq!(stats.fail_open, 0, "nothing failed open: {stats:?}");
        assert!(stats.allowed > HELD as u64, "{stats:?}");
        let c = store.counters();
        assert!(!c.breaker_open, "{c:?}");
        assert_eq!(c.shed, 0, "{c:?}");
    });
}

#[test]
fn lease_releases_that_time_out_on_a_stalled_redis_are_counted() {
    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = store(&server).await;
        let cap = NonZeroU32::new(HELD as u32).unwrap();
        let limit = ConcurrencyLimit::redis(store.clone(), "uploads", cap).unwrap();
        let (arrived, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Semaphore::new(0)));
        let svc = ConcurrencyLayer::new(limit, GlobalKey)
            .layer(held_handler(Arc::clone(&arrived), Arc::clone(&go)));
        let call = || svc.clone().oneshot(Request::new(String::new()));
        let held: Vec<_> = (0..HELD).map(|_| tokio::spawn(call())).collect();
        wait_for("every lease taken", Duration::from_secs(5), || {
            arrived.load(Ordering::SeqCst) == HELD
        })
        .await;
        server.pause();
        go.add_permits(HELD);
        for h in held {
            // The response (and its body, which holds the lease) dropped: the release is sent.
            let res = h.await.unwrap().unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
        wait_for("every release timed out", Duration::from_secs(2), || {
            store.counters().settle_timed_out == HELD as u64
        })
        .await;
        server.resume();
        let c = store.counters();
        assert_eq!(c.settle_timed_out, HELD as u64, "{c:?}");
        assert_eq!(c.breaker_opens, 0, "{c:?}");
        // The releases Redis applied once it woke: every slot is free again.
        go.add_permits(HELD);
        let again: Vec<_> = (0..HELD).map(|_| tokio::spawn(call())).collect();
        for h in again {
            assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::OK);
        }
    });
}
