//! The shaping queue on Redis: departures reserved in the script leave in arrival order, one
//! interval apart, a request beyond the maximum wait gets 429 at once, and only the last
//! reservation steps back when its waiter goes away.

use crate::redis_support;

use std::convert::Infallible;
use std::future::ready;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redis_support::RedisServer;
use tollgate::key::GlobalKey;
use tollgate::layer::{Pacing, RateLimitLayer};
use tollgate::store::redis::RedisStore;
use tollgate::{RateLimiter, Strategy};
use tower::{Layer, Service, ServiceExt, service_fn};

type Body = Full<Bytes>;

#[tokio::test]
async fn waiters_leave_in_order_one_interval_apart_and_the_rest_are_refused_at_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::builder(server.url())
        .prefix("queue:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let limiter: RateLimiter<(), RedisStore> = RateLimiter::builder()
        .strategy(Strategy::LeakyBucket)
        .quotas("2/second")
        .unwrap()
        .store(store)
        .build()
        .unwrap();
    // T = 500 ms, maximum wait 2 s: departures at 0, 0.5, 1, 1.5, 2 s; 3 of 8 refused. T is long
    // so that a loaded machine, which may take tens of milliseconds per request, cannot let the
    // queue drain a place before the eighth request arrives.
    let log = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&log);
    let handler = service_fn(move |req: Request<Body>| {
        let id: usize = req.headers()["x-id"].to_str().unwrap().parse().unwrap();
        record.lock().unwrap().push((id, Instant::now()));
        ready(Ok::<_, Infallible>(Response::new(Body::default())))
    });
    let mut svc = RateLimitLayer::new(limiter, GlobalKey)
        .pacing(Pacing::Queue(Duration::from_millis(2000)))
        .unwrap()
        .layer(handler);
    let start = Instant::now();
    let mut answers = Vec::new();
    for id in 0..8usize {
        let req = Request::get("/")
            .header("x-id", id)
            .body(Body::default())
            .unwrap();
        let fut = svc.ready().await.unwrap().call(req);
        // Each check reaches Redis before the next request is made.
        answers.push(tokio::spawn(async move {
            let res = fut.await.unwrap();
            (res.status(), start.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut refused = 0;
    for a in answers {
        let (status, at) = a.await.unwrap();
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
            // At once: well before the first queued departure (500 ms).
            assert!(at < Duration::from_millis(450), "a 429 at once: {at:?}");
        }
    }
    assert_eq!(refused, 3);
    let log = log.lock().unwrap().clone();
    let ids: Vec<usize> = log.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4], "FIFO");
    // A timer never fires early: departure i is at least i intervals after the first check (less
    // a millisecond for the two clocks' resolutions). Late firing (a loaded machine) is bounded
    // generously only.
    for (i, (_, at)) in log.iter().enumerate() {
        let floor = Duration::from_millis(500 * i as u64).saturating_sub(Duration::from_millis(1));
        assert!(*at - start >= floor, "departure {i} at {:?}", *at - start);
    }
    assert!(
        log[4].1 - start <= Duration::from_millis(2000 + 1000),
        "within the maximum wait"
    );
}

/// Three reservations of a queue of five places, one a minute (T = 60 s: the test's own run time
/// cannot move a count), on `store`: the three checks.
async fn three_reservations<S: tollgate::store::Store<()>>(
    limiter: &RateLimiter<(), S>,
) -> Vec<tollgate::Decision> {
    let mut checks = Vec::new();
    for _ in 0..3 {
        let d = limiter.check(&(), 1).await.unwrap();
        assert!(d.is_allowed());
        checks.push(d);
    }
    checks
}

/// The step back of `reserved`'s reservation.
fn step_back(reserved: &tollgate::Decision) -> tollgate::Op {
    tollgate::Op::StepBack {
        cost: 1,
        end: u64::try_from((reserved.time() + reserved.reset_after()).as_nanos()).unwrap(),
    }
}

#[tokio::test]
async fn only_the_last_reservation_steps_back_in_the_script_as_in_memory() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::builder(server.url())
        .prefix("stepback:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let redis: RateLimiter<(), RedisStore> = RateLimiter::builder()
        .strategy(Strategy::LeakyBucket)
        .quotas("1/minute")
        .unwrap()
        .burst(std::num::NonZeroU32::new(5).unwrap())
        .store(store)
        .build()
        .unwrap();
    let memory: RateLimiter<()> = RateLimiter::builder()
        .strategy(Strategy::LeakyBucket)
        .quotas("1/minute")
        .unwrap()
        .burst(std::num::NonZeroU32::new(5).unwrap())
        .build()
        .unwrap();
    let on_redis = three_reservations(&redis).await;
    let in_memory = three_reservations(&memory).await;
    // Redis: the middle reservation is not the last one: nothing moves.
    let d = redis
        .apply(&(), None, step_back(&on_redis[1]))
        .await
        .unwrap();
    assert_eq!(d.remaining(), 2, "redis: the gap stays");
    // The last one steps back, once.
    let d = redis
        .apply(&(), None, step_back(&on_redis[2]))
        .await
        .unwrap();
    assert_eq!(d.remaining(), 3, "redis: the last slot is free again");
    let d = redis
        .apply(&(), None, step_back(&on_redis[2]))
        .await
        .unwrap();
    assert_eq!(d.remaining(), 3, "redis: a step back happens once");
    // The next reservation takes the freed departure: two intervals away, as the third had.
    let next = redis.check(&(), 1).await.unwrap();
    assert_eq!(
        next.time() + next.reset_after(),
        on_redis[2].time() + on_redis[2].reset_after(),
        "redis: the next arrival's slot is the one the cancelled waiter gave back"
    );
    // The memory store answers the same.
    let m = memory.apply_now(&(), None, step_back(&in_memory[1]));
    assert_eq!(m.remaining(), 2);
    let m = memory.apply_now(&(), None, step_back(&in_memory[2]));
    assert_eq!(m.remaining(), 3);
}

/// A Redis store that counts the peeks it is asked for.
struct CountingPeeks {
    redis: RedisStore,
    peeks: Arc<std::sync::atomic::AtomicUsize>,
}

impl tollgate::store::Store<()> for CountingPeeks {
    type Future = <RedisStore as tollgate::store::Store<()>>::Future;

    fn apply(
        &self,
        key: &(),
        scope: tollgate::store::Scope<'_>,
        op: tollgate::Op,
        now: u64,
    ) -> tollgate::store::Answer<Self::Future> {
        if op == tollgate::Op::Peek {
            self.peeks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.redis.apply(key, scope, op, now)
    }

    fn validate(&self, rule: &tollgate::Rule) -> Result<(), tollgate::ConfigError> {
        tollgate::store::Store::<()>::validate(&self.redis, rule)
    }

    fn tick(&self) -> Duration {
        tollgate::store::Store::<()>::tick(&self.redis)
    }

    fn names(&self) -> &tollgate::store::LimiterNames {
        tollgate::store::Store::<()>::names(&self.redis)
    }

    fn stats(&self) -> tollgate::Stats {
        tollgate::store::Store::<()>::stats(&self.redis)
    }
}

/// Regression: the layer's interval (`ceil(period / limit)` in nanoseconds) was below Redis's
/// (whole microseconds), so that even a request on an empty queue was paced for the difference
/// and read the state again at departure.
#[tokio::test]
async fn a_request_on_an_empty_redis_queue_leaves_at_once_without_a_second_round_trip() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStore::builder(server.url())
        .prefix("emptyqueue:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let peeks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store = CountingPeeks {
        redis,
        peeks: Arc::clone(&peeks),
    };
    let limiter: RateLimiter<(), CountingPeeks> = RateLimiter::builder()
        .strategy(Strategy::LeakyBucket)
        .quotas("3/second")
        .unwrap()
        .store(store)
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, GlobalKey)
        .pacing(Pacing::Queue(Duration::from_secs(1)))
        .unwrap();
    let handler =
        service_fn(|_: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))));
    let svc = layer.clone().layer(handler);
    let res = svc
        .oneshot(Request::get("/").body(Body::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    assert_eq!(
        peeks.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "not paced: no peek at a departure"
    );
    assert_eq!(layer.stats().waiting, 0);
}
