//! Settlement: a reservation is settled by the limiter that made it, never by an enclosing one;
//! the moving window settles at the reservation's own time; limiter names are unique per store
//! and keep states apart; a custom store's synchronous answer keeps the layer's fast path.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::GlobalKey;
use tollgate::layer::{RateLimitLayer, Settle};
use tollgate::store::{Answer, LimiterNames, MemoryStore, Scope, Store};
use tollgate::{
    ConfigError, Decision, ManualClock, Op, RateLimiter, Rule, Stats, StoreError, Strategy,
};
use tower::{Layer, Service, ServiceExt, service_fn};

const T0: Duration = Duration::from_secs(1_699_999_980);

type Body = Full<Bytes>;

fn limiter(
    name: &str,
    quotas: &str,
    clock: &ManualClock,
) -> RateLimiter<(), MemoryStore<()>, ManualClock> {
    RateLimiter::builder()
        .name(name)
        .strategy(Strategy::FixedWindow)
        .quotas(quotas)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A handler that marks its response with `marker`.
fn marking(
    marker: Option<Settle>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(move |_req: Request<Body>| {
        let mut res = Response::new(Body::default());
        if let Some(m) = marker.clone() {
            res.extensions_mut().insert(m);
        }
        ready(Ok::<_, Infallible>(res))
    })
}

fn get() -> Request<Body> {
    Request::get("/login").body(Body::default()).unwrap()
}

#[tokio::test]
async fn a_refund_is_settled_by_the_innermost_limiter_only() {
    // The route refunds every request; the router-wide limit must still count each one (before,
    // every enclosing layer applied the refund: a silent bypass of the global limit).
    let clock = ManualClock::new(T0);
    let global = limiter("global", "3/minute", &clock);
    let login = limiter("login", "5/minute", &clock);
    let route =
        RateLimitLayer::new(login.clone(), GlobalKey).layer(marking(Some(Settle::refund())));
    let svc = RateLimitLayer::new(global.clone(), GlobalKey).layer(route);
    for i in 0..3 {
        let res = svc.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert!(
            res.extensions().get::<Settle>().is_none(),
            "the marker is taken"
        );
    }
    assert_eq!(
        login.peek_now(&()).remaining(),
        5,
        "the route's own limit is refunded"
    );
    assert_eq!(
        global.peek_now(&()).remaining(),
        0,
        "the global limit counted all three"
    );
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_marker_naming_a_limiter_is_settled_by_that_limiter() {
    let clock = ManualClock::new(T0);
    let global = limiter("global", "3/minute", &clock);
    let login = limiter("login", "5/minute", &clock);
    let marker = Settle::units(0).for_limiter("global");
    let route = RateLimitLayer::new(login.clone(), GlobalKey).layer(marking(Some(marker)));
    let svc = RateLimitLayer::new(global.clone(), GlobalKey).layer(route);
    for _ in 0..4 {
        assert_eq!(
            svc.clone().oneshot(get()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        global.peek_now(&()).remaining(),
        3,
        "the named limiter refunded"
    );
    assert_eq!(login.peek_now(&()).remaining(), 1, "the other one counted");
}

#[tokio::test]
async fn a_marker_can_charge_more_than_the_request_reserved() {
    let clock = ManualClock::new(T0);
    let api = limiter("api", "10/minute", &clock);
    let svc = RateLimitLayer::new(api.clone(), GlobalKey).layer(marking(Some(Settle::units(4))));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(
        res.headers()["x-ratelimit-remaining"],
        "6",
        "headers show the settled state"
    );
    assert_eq!(api.peek_now(&()).remaining(), 6);
}

#[test]
fn a_rejected_check_reserves_nothing() {
    let clock = ManualClock::new(T0);
    let l = limiter("default", "1/minute", &clock);
    assert!(l.check_now(&(), 1).reservation().is_some());
    let rejected = l.check_now(&(), 1);
    assert!(!rejected.is_allowed());
    assert_eq!(rejected.reservation(), None);
    assert_eq!(
        l.check_now(&(), 0).reservation(),
        None,
        "a peek reserves nothing"
    );
}

#[test]
fn moving_window_settlements_out_of_order_never_over_admit() {
    // N = 2 per second. A admitted at 0, B at 0.5 s; A's refund arrives after B was admitted. The
    // old refund dropped the newest entry (B's), so C at 0.7 s and D at 1.0 s were admitted: B, C
    // and D in the second from 0.5 s, three in one period. Settling at A's own time removes A.
    let clock = ManualClock::new(T0);
    let l = RateLimiter::builder()
        .strategy(Strategy::MovingWindow)
        .quotas("2/second")
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut admitted = Vec::new();
    let a = l.check_now(&"k", 1);
    admitted.push(tollgate::Clock::now(&clock));
    clock.advance(Duration::from_millis(500));
    assert!(l.check_now(&"k", 1).is_allowed());
    admitted.push(tollgate::Clock::now(&clock));
    clock.advance(Duration::from_millis(100));
    l.settle_now(&"k", a.reservation().unwrap(), 0);
    admitted.remove(0);
    // Offer a request every 10 ms for 3 s: in no window of one second may more than 2 be admitted.
    for _ in 0..300 {
        clock.advance(Duration::from_millis(10));
        if l.check_now(&"k", 1).is_allowed() {
            admitted.push(tollgate::Clock::now(&clock));
        }
    }
    for (i, &t) in admitted.iter().enumerate() {
        let in_window = admitted[i..]
            .iter()
            .filter(|&&u| u - t < 1_000_000_000)
            .count();
        assert!(
            in_window <= 2,
            "{in_window} admitted in the second from {t}"
        );
    }
    assert!(
        admitted.len() >= 6,
        "the limit is still reached: {}",
        admitted.len()
    );
}

#[test]
fn moving_window_overage_beyond_a_full_log_is_dropped() {
    let clock = ManualClock::new(T0);
    let l = RateLimiter::builder()
        .strategy(Strategy::MovingWindow)
        .quotas("3/minute")
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let d = l.check_now(&"k", 1);
    let after = l.settle_now(&"k", d.reservation().unwrap(), 10);
    assert_eq!(
        after.remaining(),
        0,
        "charged up to the limit, the rest dropped"
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(l.peek_now(&"k").remaining(), 3, "no debt past the window");
}

#[test]
fn a_settlement_after_the_window_ended_changes_nothing() {
    let clock = ManualClock::new(T0);
    let l = limiter("default", "2/minute", &clock);
    let d = l.check_now(&(), 1);
    clock.advance(Duration::from_secs(60));
    assert!(l.check_now(&(), 1).is_allowed());
    let after = l.settle_now(&(), d.reservation().unwrap(), 0);
    assert_eq!(after.remaining(), 1, "the new window keeps its count");
}

#[test]
fn gcra_charges_are_capped_at_one_bucket_depth() {
    let clock = ManualClock::new(T0);
    let l = RateLimiter::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("10/second")
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let d = l.check_now(&"k", 1);
    let after = l.settle_now(&"k", d.reservation().unwrap(), 1000);
    assert_eq!(after.remaining(), 0);
    assert!(
        after.reset_after() <= Duration::from_secs(1),
        "{:?}",
        after.reset_after()
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        l.peek_now(&"k").remaining(),
        10,
        "the debt ends with one horizon"
    );
}

#[test]
fn limiter_names_are_validated_and_unique_per_store() {
    for bad in ["", "with space", "x".repeat(65).as_str(), "é"] {
        let e = RateLimiter::<()>::builder()
            .name(bad)
            .quotas("1/s")
            .unwrap()
            .build()
            .unwrap_err();
        assert_eq!(e, ConfigError::InvalidName(bad.to_owned()));
    }
    let store = Shared::default();
    let a = RateLimiter::<()>::builder()
        .name("api.v1_x-2")
        .quotas("1/s")
        .unwrap()
        .store(store.clone())
        .build()
        .unwrap();
    let e = RateLimiter::<()>::builder()
        .name("api.v1_x-2")
        .quotas("5/s")
        .unwrap()
        .store(store.clone())
        .build()
        .unwrap_err();
    assert_eq!(e, ConfigError::DuplicateName("api.v1_x-2".to_owned()));
    assert!(e.to_string().contains("already exists"));
    drop(a);
    RateLimiter::<()>::builder()
        .name("api.v1_x-2")
        .quotas("5/s")
        .unwrap()
        .store(store)
        .build()
        .expect("the name is free again once its limiter is dropped");
}

#[test]
fn two_limiters_on_one_store_keep_their_counters_apart() {
    let store = Shared::default();
    let build = |name: &str| {
        RateLimiter::<&str, _, _>::builder()
            .name(name)
            .quotas("2/minute")
            .unwrap()
            .store(store.clone())
            .clock(ManualClock::new(T0))
            .build()
            .unwrap()
    };
    let (a, b) = (build("a"), build("b"));
    let now = |l: &RateLimiter<&str, Shared, ManualClock>, cost| {
        l.apply(&"k", None, Op::Check(cost))
            .into_now()
            .ok()
            .unwrap()
            .unwrap()
    };
    assert!(now(&a, 2).is_allowed());
    assert!(!now(&a, 1).is_allowed());
    assert!(now(&b, 2).is_allowed(), "b has its own counter");
}

/// A custom store sharing one memory store, answering synchronously: the layer's fast path.
#[derive(Clone, Default)]
struct Shared {
    memory: Arc<MemoryStore<&'static str>>,
    unit: Arc<MemoryStore<()>>,
    names: LimiterNames,
    calls: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

macro_rules! shared_store {
    ($k:ty, $field:ident) => {
        impl Store<$k> for Shared {
            type Future = Ready<Result<Decision, StoreError>>;

            fn apply(&self, key: &$k, scope: Scope<'_>, op: Op, now: u64) -> Answer<Self::Future> {
                self.calls.fetch_add(1, Ordering::SeqCst);
                Store::apply(&*self.$field, key, scope, op, now)
            }

            fn names(&self) -> &LimiterNames {
                &self.names
            }

            fn stats(&self) -> Stats {
                Store::<$k>::stats(&*self.$field)
            }
        }
    };
}
shared_store!(&'static str, memory);
shared_store!((), unit);

#[tokio::test]
async fn a_custom_store_answering_at_once_is_decided_during_call() {
    let store = Shared::default();
    let l = RateLimiter::<(), _, _>::builder()
        .quotas("1/minute")
        .unwrap()
        .store(store.clone())
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let forwarded = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&forwarded);
    let inner = service_fn(move |_req: Request<Body>| {
        seen.fetch_add(1, Ordering::SeqCst);
        ready(Ok::<_, Infallible>(Response::new(Body::default())))
    });
    let mut svc = RateLimitLayer::new(l, GlobalKey).layer(inner);
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let fut = svc.call(get());
    // Decided and forwarded inside `call`, before the response future is polled.
    assert_eq!(store.calls.load(Ordering::SeqCst), 1);
    assert_eq!(forwarded.load(Ordering::SeqCst), 1, "forwarded during call");
    assert_eq!(fut.await.unwrap().status(), StatusCode::OK);
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let res = svc.call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn a_rule_the_store_cannot_represent_is_refused_at_build_with_the_stores_own_error() {
    #[derive(Debug, Default)]
    struct Picky(LimiterNames);
    /// The store's own reason.
    #[derive(Debug)]
    struct NoBuckets;
    impl std::fmt::Display for NoBuckets {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("no buckets here")
        }
    }
    impl std::error::Error for NoBuckets {}
    impl Store<()> for Picky {
        type Future = Ready<Result<Decision, StoreError>>;
        fn apply(&self, _: &(), _: Scope<'_>, _: Op, _: u64) -> Answer<Self::Future> {
            Answer::now(Err(StoreError::new(
                tollgate::StoreErrorKind::Other,
                "never called",
            )))
        }
        fn validate(&self, rule: &Rule) -> Result<(), ConfigError> {
            match rule.strategy() {
                Strategy::TokenBucket => Err(ConfigError::store(NoBuckets)),
                _ => Ok(()),
            }
        }
        fn names(&self) -> &LimiterNames {
            &self.0
        }
        fn stats(&self) -> Stats {
            Stats::default()
        }
    }
    let e = RateLimiter::<()>::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("1/s")
        .unwrap()
        .store(Picky::default())
        .build()
        .unwrap_err();
    match &e {
        ConfigError::Store(cause) => assert!(cause.downcast_ref::<NoBuckets>().is_some()),
        other => panic!("{other:?}"),
    }
    assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<NoBuckets>()));
    assert_eq!(e.to_string(), "store configuration: no buckets here");
    assert_eq!(e, ConfigError::store(NoBuckets));
}

/// A store whose settlements fail (Redis gone between the check and the response), counting them.
#[derive(Debug, Default)]
struct SettleFails {
    memory: MemoryStore<()>,
    settles: AtomicUsize,
}

impl Store<()> for SettleFails {
    type Future = <MemoryStore<()> as Store<()>>::Future;

    fn apply(&self, key: &(), scope: Scope<'_>, op: Op, now: u64) -> Answer<Self::Future> {
        if matches!(op, Op::Settle { .. }) {
            self.settles.fetch_add(1, Ordering::SeqCst);
            return Answer::now(Err(tollgate::StoreError::new(
                tollgate::StoreErrorKind::Connection,
                "down",
            )));
        }
        self.memory.apply(key, scope, op, now)
    }

    fn names(&self) -> &LimiterNames {
        Store::<()>::names(&self.memory)
    }

    fn stats(&self) -> Stats {
        Store::<()>::stats(&self.memory)
    }
}

/// Regression: a marker's settlement that failed left the reservation to the body's end, which
/// settled it a second time (and counted its units twice).
#[tokio::test]
async fn a_failed_settlement_is_not_tried_again_at_the_bodys_end() {
    use http_body_util::BodyExt;
    let lim: RateLimiter<(), SettleFails> = RateLimiter::builder()
        .quotas("10/minute")
        .unwrap()
        .store(SettleFails::default())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(lim.clone(), GlobalKey).settle_from(
        tollgate::layer::SettleFrom::body(|chunk| chunk.len() as u64),
    );
    let svc = layer.layer(service_fn(|_req: Request<()>| async {
        let mut res = Response::new(Full::new(Bytes::from_static(b"abcd")));
        res.extensions_mut().insert(Settle::units(3));
        Ok::<_, Infallible>(res)
    }));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.unwrap();
    assert_eq!(
        lim.store().settles.load(Ordering::SeqCst),
        1,
        "settled once"
    );
    assert_eq!(
        lim.peek(&()).await.unwrap().remaining(),
        9,
        "the estimate stands"
    );
}
