//! The IETF fields against the crate's own arithmetic: a 429's `t` is its `Retry-After` under
//! every strategy, bucket policies advertise `q=B;w=ceil(B x T)`, and jitter only ever adds to the
//! `t` of an allowed response.

use std::convert::Infallible;
use std::future::ready;
use std::num::NonZeroU32;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::GlobalKey;
use tollgate::layer::{HeaderStyle, Headers, RateLimitLayer};
use tollgate::{ManualClock, RateLimiter, Strategy};
use tower::{Layer, Service, ServiceExt, service_fn};

type Body = Full<Bytes>;

fn ok()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_req: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))))
}

fn get() -> Request<Body> {
    Request::get("/").body(Body::default()).unwrap()
}

/// The `t` parameter of a `RateLimit` value with one item.
fn t_of(value: &str) -> u64 {
    let at = value.find(";t=").expect("t") + 3;
    value[at..]
        .split(';')
        .next()
        .unwrap()
        .parse()
        .expect("t is an integer")
}

#[tokio::test]
async fn a_rejections_t_is_its_retry_after_under_every_strategy() {
    for strategy in Strategy::ALL {
        // Requests 0.7 s apart under 5/10s with burst 5: every strategy rejects some, at
        // various points of its windows or bucket.
        let clock = ManualClock::new(Duration::from_millis(1_700_000_003_300));
        let lim = RateLimiter::builder()
            .strategy(strategy)
            .quotas("5/10s")
            .unwrap()
            .burst(NonZeroU32::new(5).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut svc = RateLimitLayer::new(lim, GlobalKey)
            .headers(Headers::new().style(HeaderStyle::Both))
            .layer(ok());
        let mut rejected = 0;
        for _ in 0..60 {
            let res = svc.ready().await.unwrap().call(get()).await.unwrap();
            let t = t_of(res.headers()["ratelimit"].to_str().unwrap());
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                rejected += 1;
                let retry: u64 = res.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(t, retry, "{strategy}: t of a 429 is Retry-After");
            } else {
                let reset: u64 = res.headers()["x-ratelimit-reset"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(t, reset, "{strategy}: t of a 200 is the reset");
            }
            clock.advance(Duration::from_millis(700));
        }
        assert!(rejected > 5, "{strategy}: {rejected} rejections");
    }
}

#[tokio::test]
async fn bucket_policies_advertise_the_burst_over_the_time_it_takes_to_refill() {
    // 10/s with burst 50: 50 per 5 s, not 50 per second. 7/minute with burst 3: T = 60/7 s,
    // B x T = 25.7 s, written 26.
    for (strategy, quota, burst, policy) in [
        (
            Strategy::TokenBucket,
            "10/second",
            50,
            "\"default\";q=50;w=5",
        ),
        (
            Strategy::LeakyBucket,
            "10/second",
            50,
            "\"default\";q=50;w=5",
        ),
        (Strategy::TokenBucket, "7/minute", 3, "\"default\";q=3;w=26"),
        (
            Strategy::LeakyBucket,
            "1000/second",
            1,
            "\"default\";q=1;w=1",
        ),
    ] {
        let lim = RateLimiter::builder()
            .strategy(strategy)
            .quotas(quota)
            .unwrap()
            .burst(NonZeroU32::new(burst).unwrap())
            .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
            .build()
            .unwrap();
        let svc = RateLimitLayer::new(lim, GlobalKey)
            .headers(Headers::new().style(HeaderStyle::Ietf))
            .layer(ok());
        let res = svc.oneshot(get()).await.unwrap();
        assert_eq!(
            res.headers()["ratelimit-policy"],
            policy,
            "{strategy} {quota}"
        );
    }
}

#[tokio::test]
async fn jitter_adds_up_to_its_maximum_to_t_of_allowed_responses_only() {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let lim = RateLimiter::builder()
        .strategy(Strategy::FixedWindow)
        .quotas("100/minute")
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut svc = RateLimitLayer::new(lim, GlobalKey)
        .headers(
            Headers::new()
                .style(HeaderStyle::Both)
                .jitter(Duration::from_secs(5)),
        )
        .layer(ok());
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..100 {
        let res = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-reset"], "40", "not jittered");
        let t = t_of(res.headers()["ratelimit"].to_str().unwrap());
        assert!((40..=45).contains(&t), "t = {t}");
        seen.insert(t);
    }
    assert!(seen.len() >= 4, "t varies: {seen:?}");
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(t_of(res.headers()["ratelimit"].to_str().unwrap()), 40);
    assert_eq!(res.headers()["retry-after"], "40");
}
