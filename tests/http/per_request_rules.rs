//! Per-request rules (`select_rule`, `apply` with a rule) reach the store only once it accepted
//! them (`Store::validate`, asked once per rule): a rule it cannot honour is refused and counted,
//! never applied and never let through, whatever the failure policy.

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::HeaderKey;
use tollgate::layer::RateLimitLayer;
use tollgate::store::{Answer, LimiterNames, MemoryStore, Scope, Store, StoreKey};
use tollgate::{ConfigError, ManualClock, Op, RateLimiter, Rule, Stats, StoreErrorKind, Strategy};
use tower::{Layer, ServiceExt, service_fn};

type Body = Full<Bytes>;

/// A memory store that, like Redis, cannot honour a bucket whose interval is below a microsecond;
/// it counts the rules it was asked about and the requests it got under a rule it refuses.
#[derive(Debug)]
struct Picky<K> {
    inner: MemoryStore<K>,
    validations: AtomicUsize,
    applied_refused: AtomicUsize,
}

fn too_fine(rule: &Rule) -> bool {
    rule.strategy().is_bucket()
        && rule
            .quotas()
            .iter()
            .any(|q| q.period() < Duration::from_micros(u64::from(q.limit())))
}

impl<K: StoreKey> Default for Picky<K> {
    fn default() -> Self {
        Self {
            inner: MemoryStore::new(),
            validations: AtomicUsize::new(0),
            applied_refused: AtomicUsize::new(0),
        }
    }
}

impl<K: StoreKey> Store<K> for Picky<K> {
    type Future = <MemoryStore<K> as Store<K>>::Future;

    fn apply(&self, key: &K, scope: Scope<'_>, op: Op, now: u64) -> Answer<Self::Future> {
        if too_fine(scope.rule()) {
            self.applied_refused.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.apply(key, scope, op, now)
    }

    fn validate(&self, rule: &Rule) -> Result<(), ConfigError> {
        self.validations.fetch_add(1, Ordering::SeqCst);
        match too_fine(rule) {
            true => Err(Rule::parse(Strategy::TokenBucket, "4294967295/ms").unwrap_err()),
            false => Ok(()),
        }
    }

    fn names(&self) -> &LimiterNames {
        self.inner.names()
    }

    fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

fn picky_limiter<K: StoreKey>() -> RateLimiter<K, Picky<K>, ManualClock> {
    RateLimiter::builder()
        .strategy(Strategy::FixedWindow)
        .quotas("10/minute")
        .unwrap()
        .store(Picky::default())
        .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_per_request_rule_the_store_cannot_honour_is_refused_counted_and_never_applied() {
    let limiter = picky_limiter();
    let fine = Arc::new(Rule::parse(Strategy::TokenBucket, "10000/ms").unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    // The default failure policy is fail-open: still refused.
    let svc = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-user"))
        .select_rule(move |p: &http::request::Parts| {
            (p.headers.get("x-plan").map(|v| v.as_bytes()) == Some(b"fine")).then(|| fine.clone())
        })
        .layer(service_fn(move |_req: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            ready(Ok::<_, Infallible>(Response::new(Body::default())))
        }));
    let req = |plan: &str| {
        Request::get("/")
            .header("x-user", "u")
            .header("x-plan", plan)
            .body(Body::default())
            .unwrap()
    };
    for i in 1..=20u64 {
        let res = svc.clone().oneshot(req("fine")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "request {i}");
        assert_eq!(limiter.stats().invalid_rules, i);
        assert_eq!(limiter.stats().fail_open, 0, "never let through");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "no refused request reached the service"
    );
    assert_eq!(limiter.store().applied_refused.load(Ordering::SeqCst), 0);
    // The limiter's own rule is untouched.
    let res = svc.clone().oneshot(req("basic")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The library entry point says why.
    let bad = Rule::parse(Strategy::LeakyBucket, "5000/ms").unwrap();
    let plain = picky_limiter::<Vec<u8>>();
    let e = plain
        .apply(&b"u".to_vec(), Some(&bad), Op::Check(1))
        .await
        .expect_err("refused");
    assert_eq!(e.kind(), StoreErrorKind::InvalidRule);
    assert!(e.message().contains("cannot honour"), "{e}");
    assert_eq!(plain.stats().invalid_rules, 1);
    assert_eq!(plain.store().applied_refused.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_per_request_rule_is_validated_once_then_remembered() {
    let limiter = picky_limiter::<Vec<u8>>();
    let at_build = limiter.store().validations.load(Ordering::SeqCst);
    assert_eq!(at_build, 1, "the limiter's own rule, at build time");
    let tiers: Vec<Rule> = ["5/minute", "50/minute", "500/minute"]
        .iter()
        .map(|q| Rule::parse(Strategy::SlidingWindow, q).unwrap())
        .collect();
    for i in 0..300 {
        let rule = &tiers[i % 3];
        let d = limiter
            .apply(
                &format!("k{}", i % 7).into_bytes(),
                Some(rule),
                Op::Check(1),
            )
            .await
            .expect("accepted");
        assert!(d.limit() > 0);
    }
    assert_eq!(
        limiter.store().validations.load(Ordering::SeqCst),
        at_build + 3,
        "each rule asked about once"
    );
    // The limiter's own rule never asks.
    for _ in 0..10 {
        limiter.check(&b"own".to_vec(), 1).await.unwrap();
    }
    assert_eq!(
        limiter.store().validations.load(Ordering::SeqCst),
        at_build + 3
    );
    assert_eq!(limiter.stats().invalid_rules, 0);
}

/// The default clock reads a millisecond-step time when the limiter's own rule allows it; a
/// per-request rule finer than a step (a bucket one token deep at 10,000 a second) is decided on
/// the precise time: admissions never closer than 100 µs, and most of them about that far apart
/// (on the coarse time they would be a millisecond apart).
#[test]
fn a_per_request_rule_finer_than_the_default_clocks_steps_is_decided_on_the_precise_time() {
    let limiter = RateLimiter::<u64>::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("100/minute")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(limiter.clock().resolution(), Duration::from_millis(1));
    let quota = tollgate::Quota::per_second(std::num::NonZeroU32::new(10_000).unwrap())
        .with_burst(std::num::NonZeroU32::MIN);
    let fine = Rule::new(Strategy::TokenBucket, vec![quota]).unwrap();
    let start = std::time::Instant::now();
    let mut times = Vec::new();
    while times.len() < 50 && start.elapsed() < Duration::from_secs(5) {
        let d = limiter.apply_now(&1, Some(&fine), Op::Check(1));
        if d.is_allowed() {
            times.push(d.time());
        }
    }
    assert!(times.len() >= 2, "{} admitted in 5 s", times.len());
    let mut gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    assert!(gaps[0] >= Duration::from_micros(100), "{gaps:?}");
    assert!(
        gaps[gaps.len() / 2] < Duration::from_micros(500),
        "{gaps:?}"
    );
}
