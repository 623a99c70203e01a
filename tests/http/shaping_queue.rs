//! The shaping queue (leaky bucket in delay mode) on a paused clock: requests leave in arrival
//! order, `T` apart with no initial burst, none waits longer than the maximum wait, those that
//! would are answered 429 at once, headers are computed at departure, and a waiter that goes
//! away keeps its slot unless it held the last reservation.

use std::convert::Infallible;
use std::future::ready;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tollgate::key::GlobalKey;
use tollgate::layer::{FailurePolicy, Pacing, RateLimitLayer};
use tollgate::store::{Answer, LimiterNames, MemoryStore, Scope, Store};
use tollgate::{
    ConfigError, Op, RateLimiter, Stats, StoreError, StoreErrorKind, Strategy, TokioClock,
};
use tower::{Layer, Service, ServiceExt, service_fn};

type Body = Full<Bytes>;

fn limiter(strategy: Strategy, quotas: &str) -> RateLimiter<(), MemoryStore<()>, TokioClock> {
    RateLimiter::builder()
        .strategy(strategy)
        .quotas(quotas)
        .unwrap()
        .clock(TokioClock::new())
        .build()
        .unwrap()
}

/// A service that records `(request id, departure)` when called.
fn recorder(
    log: Arc<Mutex<Vec<(usize, Instant)>>>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(move |req: Request<Body>| {
        let id: usize = req.headers()["x-id"].to_str().unwrap().parse().unwrap();
        log.lock().unwrap().push((id, Instant::now()));
        ready(Ok::<_, Infallible>(Response::new(Body::default())))
    })
}

fn get(id: usize) -> Request<Body> {
    Request::get("/")
        .header("x-id", id)
        .body(Body::default())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn waiters_leave_in_arrival_order_at_the_constant_rate_within_the_maximum_wait() {
    // 10/s: T = 100 ms. Maximum wait 1 s: departures at 0, 100, ..., 1000 ms; 11 of 20 pass.
    let log = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(limiter(Strategy::LeakyBucket, "10/second"), GlobalKey)
        .pacing(Pacing::Queue(Duration::from_secs(1)))
        .unwrap();
    let svc = layer.layer(recorder(Arc::clone(&log)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..20 {
        // Each request is checked in `call`, in this order, before the next is made.
        let fut = svc.clone().oneshot(get(id));
        tasks.push(tokio::spawn(async move {
            let res = fut.await.unwrap();
            (id, res.status(), Instant::now(), res.headers().clone())
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    for (id, status, at, headers) in &answers {
        if *id <= 10 {
            assert_eq!(*status, StatusCode::OK, "{id}");
        } else {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{id}");
            assert_eq!(*at, start, "{id}: a 429 at once, not after a wait");
            assert!(headers.contains_key("retry-after"));
        }
    }
    let log = log.lock().unwrap().clone();
    let ids: Vec<usize> = log.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (0..=10).collect::<Vec<_>>(), "FIFO");
    for (i, (_, at)) in log.iter().enumerate() {
        let waited = *at - start;
        assert_eq!(
            waited,
            Duration::from_millis(100) * u32::try_from(i).unwrap(),
            "departure {i}: T apart from the first, no initial burst"
        );
        assert!(waited <= Duration::from_secs(1), "within the maximum wait");
    }
    // Headers at departure: the last one left with the queue empty behind it.
    let (_, _, _, last) = answers.iter().find(|a| a.0 == 10).unwrap();
    assert_eq!(last["x-ratelimit-limit"], "11", "the queue's depth");
    assert_eq!(last["x-ratelimit-remaining"], "10");
    // The first left at once, with ten waiters queued behind it.
    let (_, _, _, first) = answers.iter().find(|a| a.0 == 0).unwrap();
    assert_eq!(
        first["x-ratelimit-remaining"], "10",
        "checked alone, before the others came"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_a_gap_and_the_others_keep_their_departures() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(limiter(Strategy::LeakyBucket, "10/second"), GlobalKey)
        .pacing(Pacing::Queue(Duration::from_secs(1)))
        .unwrap();
    let svc = layer.clone().layer(recorder(Arc::clone(&log)));
    let start = Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(get(0)));
    let gone = tokio::spawn(svc.clone().oneshot(get(1)));
    let third = tokio::spawn(svc.clone().oneshot(get(2)));
    tokio::task::yield_now().await;
    assert_eq!(layer.stats().waiting, 2);
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    first.await.unwrap().unwrap();
    third.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0], (0, start));
    assert_eq!(
        log[1],
        (2, start + Duration::from_millis(200)),
        "the gap stays"
    );
    assert_eq!(layer.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_last_waiter_gives_its_slot_to_the_next_arrival() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(limiter(Strategy::LeakyBucket, "10/second"), GlobalKey)
        .pacing(Pacing::Queue(Duration::from_secs(1)))
        .unwrap();
    let svc = layer.clone().layer(recorder(Arc::clone(&log)));
    let start = Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(get(0)));
    let second = tokio::spawn(svc.clone().oneshot(get(1)));
    let gone = tokio::spawn(svc.clone().oneshot(get(2)));
    tokio::task::yield_now().await;
    assert_eq!(layer.stats().waiting, 2);
    // The last reservation (departure at 200 ms) goes away: its slot is free again.
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    assert_eq!(layer.stats().waiting, 1);
    let next = tokio::spawn(svc.clone().oneshot(get(3)));
    for t in [first, second, next] {
        assert_eq!(t.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            (0, start),
            (1, start + Duration::from_millis(100)),
            (3, start + Duration::from_millis(200)),
        ],
        "the next arrival takes the departure the cancelled waiter gave back"
    );
    assert_eq!(layer.stats().waiting, 0);
}

#[test]
fn a_queue_needs_one_leaky_bucket_quota_and_a_wait_of_at_least_one_interval() {
    let e = RateLimitLayer::new(limiter(Strategy::TokenBucket, "10/second"), GlobalKey)
        .pacing(Pacing::Queue(Duration::from_secs(1)))
        .unwrap_err();
    assert_eq!(
        e,
        ConfigError::QueueNeedsLeakyBucket(Strategy::TokenBucket),
        "{e}"
    );
    let e = RateLimitLayer::new(
        limiter(Strategy::LeakyBucket, "10/second; 100/minute"),
        GlobalKey,
    )
    .pacing(Pacing::Queue(Duration::from_secs(1)))
    .unwrap_err();
    assert_eq!(e, ConfigError::QueueNeedsOneQuota(2), "{e}");
    assert!(e.to_string().contains("exactly one"), "{e}");
    let e = RateLimitLayer::new(limiter(Strategy::LeakyBucket, "10/second"), GlobalKey)
        .pacing(Pacing::Queue(Duration::from_millis(99)))
        .unwrap_err();
    let interval = Duration::from_millis(100);
    let max_wait = Duration::from_millis(99);
    assert_eq!(
        e,
        ConfigError::QueueWaitTooShort { max_wait, interval },
        "{e}"
    );
    assert!(e.to_string().contains("shorter than one interval"), "{e}");
}

/// A memory store whose peeks fail (a store that breaks while a request waits for its departure).
#[derive(Debug, Default)]
struct PeekFails(MemoryStore<()>);

impl Store<()> for PeekFails {
    type Future = <MemoryStore<()> as Store<()>>::Future;

    fn apply(&self, key: &(), scope: Scope<'_>, op: Op, now: u64) -> Answer<Self::Future> {
        if op == Op::Peek {
            return Answer::now(Err(StoreError::new(StoreErrorKind::Connection, "down")));
        }
        self.0.apply(key, scope, op, now)
    }

    fn names(&self) -> &LimiterNames {
        Store::<()>::names(&self.0)
    }

    fn stats(&self) -> Stats {
        Store::<()>::stats(&self.0)
    }
}

/// Regression: a queued request whose departure peek failed was answered 503 under fail-closed,
/// though it held its slot (which was then wasted).
#[tokio::test(start_paused = true)]
async fn a_queued_request_leaves_with_its_reservation_when_the_departure_peek_fails() {
    let lim: RateLimiter<(), PeekFails, TokioClock> = RateLimiter::builder()
        .strategy(Strategy::LeakyBucket)
        .quotas("10/second")
        .unwrap()
        .store(PeekFails::default())
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(lim, GlobalKey)
        .failure_policy(FailurePolicy::FailClosed)
        .pacing(Pacing::Queue(Duration::from_secs(1)))
        .unwrap();
    let svc = layer.clone().layer(recorder(Arc::clone(&log)));
    let start = Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(get(0)));
    let second = tokio::spawn(svc.clone().oneshot(get(1)));
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK, "it held its slot");
    // The reservation's decision: one place taken behind the first's.
    assert_eq!(second.headers()["x-ratelimit-limit"], "11");
    assert_eq!(second.headers()["x-ratelimit-remaining"], "9");
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![(0, start), (1, start + Duration::from_millis(100))]
    );
    assert_eq!(layer.stats().waiting, 0);
}
