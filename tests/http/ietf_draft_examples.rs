//! The examples of draft-ietf-httpapi-ratelimit-headers-11 that a server built on this crate can
//! produce, reproduced through the layer: each test sets up the quota and traffic the example
//! describes and compares the fields item by item.
//!
//! Not applicable, and why: section 4.2's `"default";r=999;pk=..` has no `t` (every quota here has
//! a window); B.2.2, B.2.3 and B.3 lower the advertised values at will under load (a server's
//! choice, not a quota's arithmetic), and B.3 gives a 429 whose `t` differs from `Retry-After`,
//! which this crate never does; section 5.1's two violated policies (one layer reports the quota
//! with the longest wait, see `the_problem_type_is_quota_exceeded_with_the_violated_policy`).

use std::convert::Infallible;
use std::future::ready;
use std::num::NonZeroU32;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::key::{GlobalKey, HeaderKey};
use tollgate::layer::{HeaderStyle, Headers, ProblemJson, RateLimitLayer};
use tollgate::store::MemoryStore;
use tollgate::{ManualClock, RateLimiter, Strategy};
use tower::{Layer, Service, ServiceExt, service_fn};

/// A UTC midnight (a whole number of days, hours, minutes and 10 s since the epoch).
const MIDNIGHT: Duration = Duration::from_secs(1_700_006_400);

type Body = Full<Bytes>;

fn limiter<K: tollgate::store::StoreKey>(
    name: &str,
    strategy: Strategy,
    quotas: &str,
    clock: &ManualClock,
) -> RateLimiter<K, MemoryStore<K>, ManualClock> {
    RateLimiter::builder()
        .name(name)
        .strategy(strategy)
        .quotas(quotas)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn ok()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_req: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))))
}

/// The cost a request asks for in `x-cost` (1 without).
fn cost(parts: &Parts) -> u32 {
    parts
        .headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

fn get(cost: u32) -> Request<Body> {
    Request::get("/items/123")
        .header("x-cost", cost)
        .header("x-user", "user-42")
        .body(Body::default())
        .unwrap()
}

/// The items of a structured-field list, whitespace around them dropped (`a, b` and `a,b` alike).
fn items(headers: &HeaderMap, name: &str) -> Vec<String> {
    let value = headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap();
    value.split(',').map(|i| i.trim().to_owned()).collect()
}

fn item(example: &str) -> Vec<String> {
    example.split(',').map(|i| i.trim().to_owned()).collect()
}

/// `pk=:BASE64:` with 16 base64 characters, replaced by `pk=:..:` for comparison.
fn masked_pk(item: &str) -> String {
    let Some(at) = item.find(";pk=:") else {
        return item.to_owned();
    };
    let value = &item[at + 5..];
    let end = value.find(':').expect("pk is a byte sequence");
    let b64 = &value[..end];
    assert_eq!(b64.len(), 16, "{item}");
    assert!(
        b64.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/'),
        "{item}"
    );
    format!("{};pk=:..:{}", &item[..at], &value[end + 1..])
}

#[tokio::test]
async fn policy_with_a_time_window() {
    // 3.2: RateLimit-Policy: "default";q=100;w=10
    let clock = ManualClock::new(MIDNIGHT);
    let svc = RateLimitLayer::new(
        limiter("default", Strategy::FixedWindow, "100/10s", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Ietf))
    .layer(ok());
    let res = svc.oneshot(get(1)).await.unwrap();
    assert_eq!(
        items(res.headers(), "ratelimit-policy"),
        item(r#""default";q=100;w=10"#)
    );
}

#[tokio::test]
async fn multiple_policies() {
    // 3.2: RateLimit-Policy: "permin";q=50;w=60,"perhr";q=1000;w=3600 (two stacked limiters).
    let clock = ManualClock::new(MIDNIGHT);
    let perhr = RateLimitLayer::new(
        limiter("perhr", Strategy::SlidingWindow, "1000/hour", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Ietf));
    let permin = RateLimitLayer::new(
        limiter("permin", Strategy::SlidingWindow, "50/minute", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Ietf));
    let svc = perhr.layer(permin.layer(ok()));
    let res = svc.oneshot(get(1)).await.unwrap();
    assert_eq!(
        items(res.headers(), "ratelimit-policy"),
        item(r#""permin";q=50;w=60,"perhr";q=1000;w=3600"#)
    );
}

#[tokio::test]
async fn policy_with_a_partition_key_and_a_quota_unit() {
    // 3.2: "peruser";q=100;w=60;pk=:cHsdsRa894==: and
    //      "peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:
    let clock = ManualClock::new(MIDNIGHT);
    let svc = RateLimitLayer::new(
        limiter("peruser", Strategy::FixedWindow, "100/minute", &clock),
        HeaderKey::new("x-user"),
    )
    .headers(
        Headers::new()
            .style(HeaderStyle::Ietf)
            .partition_key("shared secret"),
    )
    .layer(ok());
    let res = svc.oneshot(get(1)).await.unwrap();
    let policy = items(res.headers(), "ratelimit-policy");
    assert_eq!(policy.len(), 1);
    assert_eq!(masked_pk(&policy[0]), r#""peruser";q=100;w=60;pk=:..:"#);
    assert!(!policy[0].contains("user-42"), "never the key itself");

    let svc = RateLimitLayer::new(
        limiter("peruser", Strategy::FixedWindow, "65535/10s", &clock),
        HeaderKey::new("x-user"),
    )
    .headers(
        Headers::new()
            .style(HeaderStyle::Ietf)
            .partition_key("shared secret")
            .quota_unit("content-bytes"),
    )
    .cost(cost)
    .layer(ok());
    let res = svc.oneshot(get(1000)).await.unwrap();
    let bytes_policy = items(res.headers(), "ratelimit-policy");
    assert_eq!(
        masked_pk(&bytes_policy[0]),
        r#""peruser";q=65535;qu="content-bytes";w=10;pk=:..:"#
    );
    let pk = |item: &str| item[item.find(";pk=").unwrap()..].to_owned();
    assert_eq!(
        pk(&policy[0]),
        pk(&bytes_policy[0]),
        "one key, one secret: one partition key"
    );
    let current = items(res.headers(), "ratelimit");
    assert_eq!(masked_pk(&current[0]), r#""peruser";r=64535;t=10;pk=:..:"#);
}

#[tokio::test]
async fn ratelimit_field_examples() {
    // 4.2: "default";r=50;t=30 — 100/minute, 50 used, 30 s into the window.
    let clock = ManualClock::new(MIDNIGHT + Duration::from_secs(30));
    let svc = RateLimitLayer::new(
        limiter("default", Strategy::FixedWindow, "100/minute", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Ietf))
    .cost(cost)
    .layer(ok());
    let res = svc.oneshot(get(50)).await.unwrap();
    assert_eq!(
        items(res.headers(), "ratelimit"),
        item(r#""default";r=50;t=30"#)
    );

    // 4.2: "default";r=300000000;t=60;pk=:QXBwLTk5OQ==: — 300 MB left for the next 60 seconds.
    let clock = ManualClock::new(MIDNIGHT);
    let svc = RateLimitLayer::new(
        limiter("default", Strategy::FixedWindow, "300001000/minute", &clock),
        HeaderKey::new("x-user"),
    )
    .headers(
        Headers::new()
            .style(HeaderStyle::Ietf)
            .quota_unit("content-bytes")
            .partition_key("shared secret"),
    )
    .cost(cost)
    .layer(ok());
    let res = svc.oneshot(get(1000)).await.unwrap();
    let current = items(res.headers(), "ratelimit");
    assert_eq!(
        masked_pk(&current[0]),
        r#""default";r=300000000;t=60;pk=:..:"#
    );
}

#[tokio::test]
async fn throttling_information_then_a_429_whose_t_is_retry_after() {
    // B.1.1: 200 with "default";r=0;t=50. The draft's server then serves r=0;t=48 anyway; this one
    // rejects, and the 429's `t` is its Retry-After (48).
    let clock = ManualClock::new(MIDNIGHT + Duration::from_secs(10));
    let mut svc = RateLimitLayer::new(
        limiter("default", Strategy::FixedWindow, "10/minute", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Ietf))
    .cost(cost)
    .layer(ok());
    let res = svc.ready().await.unwrap().call(get(10)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        items(res.headers(), "ratelimit"),
        item(r#""default";r=0;t=50"#)
    );
    clock.advance(Duration::from_secs(2));
    let res = svc.ready().await.unwrap().call(get(1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        items(res.headers(), "ratelimit"),
        item(r#""default";r=0;t=48"#)
    );
    assert_eq!(res.headers()["retry-after"], "48");
}

#[tokio::test]
async fn multiple_windows_report_the_closest_limit() {
    // B.1.2 and B.3.1: 1000/hour and 5000/day, 4900 used in the first 14 hours:
    // RateLimit-Policy: "hour";q=1000;w=3600, "day";q=5000;w=86400
    // RateLimit: "day";r=100;t=36000
    let clock = ManualClock::new(MIDNIGHT);
    let day = RateLimitLayer::new(
        limiter("day", Strategy::FixedWindow, "5000/day", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Both))
    .cost(cost);
    let hour = RateLimitLayer::new(
        limiter("hour", Strategy::FixedWindow, "1000/hour", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Both))
    .cost(cost);
    let mut svc = day.layer(hour.layer(ok()));
    for _ in 0..14 {
        let res = svc.ready().await.unwrap().call(get(350)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        clock.advance(Duration::from_secs(3600));
    }
    let res = svc.ready().await.unwrap().call(get(0)).await.unwrap();
    assert_eq!(
        items(res.headers(), "ratelimit-policy"),
        item(r#""hour";q=1000;w=3600, "day";q=5000;w=86400"#)
    );
    let current = items(res.headers(), "ratelimit");
    assert!(
        current.contains(&r#""day";r=100;t=36000"#.to_owned()),
        "{current:?}"
    );
    assert_eq!(
        res.headers()["x-ratelimit-remaining"],
        "100",
        "the closest limit"
    );
}

#[tokio::test]
async fn policy_and_current_limit_after_two_seconds() {
    // B.1.3: after 2 s the client used 40 of 100 per minute:
    // RateLimit-Policy: "basic";q=100;w=60 and RateLimit: "basic";r=60;t=58
    // B.2.1: "fixedwindow";q=100;w=60 and "fixedwindow";r=99;t=50
    for (name, at, used, expected) in [
        ("basic", 2, 40, r#""basic";r=60;t=58"#),
        ("fixedwindow", 10, 1, r#""fixedwindow";r=99;t=50"#),
    ] {
        let clock = ManualClock::new(MIDNIGHT + Duration::from_secs(at));
        let svc = RateLimitLayer::new(
            limiter(name, Strategy::FixedWindow, "100/minute", &clock),
            GlobalKey,
        )
        .headers(Headers::new().style(HeaderStyle::Ietf))
        .cost(cost)
        .layer(ok());
        let res = svc.oneshot(get(used)).await.unwrap();
        assert_eq!(
            items(res.headers(), "ratelimit-policy"),
            item(&format!("\"{name}\";q=100;w=60"))
        );
        assert_eq!(items(res.headers(), "ratelimit"), item(expected));
    }
}

#[tokio::test]
async fn the_problem_type_is_quota_exceeded_with_the_violated_policy() {
    // B.1.4 with a token bucket (12/minute, burst 5, so T = 5 s): after the burst the 429 says
    // Retry-After 5 and RateLimit "default";r=0;t=5 (the same moment), and the body is the
    // quota-exceeded problem with violated-policies ["default"] (5.1).
    let clock = ManualClock::new(MIDNIGHT);
    let lim = RateLimiter::builder()
        .name("default")
        .strategy(Strategy::TokenBucket)
        .quotas("12/minute")
        .unwrap()
        .burst(NonZeroU32::new(5).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut svc = RateLimitLayer::new(lim, GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Ietf))
        .respond_with(ProblemJson)
        .layer(ok());
    for _ in 0..5 {
        let res = svc.ready().await.unwrap().call(get(1)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let res = svc.ready().await.unwrap().call(get(1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "5");
    assert_eq!(
        items(res.headers(), "ratelimit"),
        item(r#""default";r=0;t=5"#)
    );
    assert_eq!(
        items(res.headers(), "ratelimit-policy"),
        item(r#""default";q=5;w=25"#),
        "5 at once, then one per 5 s: 5 per 25 s"
    );
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["default"]));
    assert_eq!(body["retry_after"], 5);
}
