//! The layer over real HTTP (127.0.0.1:0), with the limiter on an injected `ManualClock`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{Resp, TestClient, TestServer, ip};
use tollgate::key::{ForwardedIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
use tollgate::layer::{HeaderStyle, Headers, KeyPolicy, RateLimitLayer, ResetFormat};
use tollgate::{Decision, ManualClock, RateLimiter, Strategy};

/// A whole minute (and ten seconds) since the Unix epoch: clock-aligned windows start here.
const T0: Duration = Duration::from_secs(1_699_999_980);

fn limiter<K: tollgate::store::StoreKey + std::hash::Hash + Eq>(
    strategy: Strategy,
    quotas: &str,
    clock: &ManualClock,
) -> RateLimiter<K, tollgate::store::MemoryStore<K>, ManualClock> {
    RateLimiter::builder()
        .strategy(strategy)
        .quotas(quotas)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// An app whose handler counts its calls.
fn counting_app() -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = Router::new().route(
        "/",
        get(move || {
            c.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    );
    (app, calls)
}

fn assert_headers_match(res: &Resp, d: &Decision, what: &str) {
    assert_eq!(
        res.num("x-ratelimit-limit"),
        u64::from(d.limit()),
        "{what}: limit"
    );
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        u64::from(d.remaining()),
        "{what}: remaining"
    );
    assert_eq!(
        res.num("x-ratelimit-reset"),
        d.reset_secs(),
        "{what}: reset"
    );
    assert_eq!(
        res.header("retry-after").map(|v| v.parse::<u64>().unwrap()),
        d.retry_after_secs(),
        "{what}: retry-after"
    );
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert_eq!(res.count(name), 1, "{what}: {name} once");
    }
}

/// Every strategy, header values on allowed and rejected
/// responses equal the decision of a mirror limiter, the table's values hold for the exact
/// strategies, and advancing the clock by Retry-After gets the next request in.
#[tokio::test]
async fn headers_on_allowed_and_rejected_responses_for_every_strategy() {
    // (remaining, reset) after each of 3 requests at T0, then (reset, retry-after) of the 429:
    // the guide's formulas for 3/minute.
    type Row = (Strategy, Option<[(u64, u64); 3]>, Option<(u64, u64)>);
    let table: &[Row] = &[
        (
            Strategy::FixedWindow,
            Some([(2, 60), (1, 60), (0, 60)]),
            Some((60, 60)),
        ),
        (
            Strategy::FixedWindowFirstHit,
            Some([(2, 60), (1, 60), (0, 60)]),
            Some((60, 60)),
        ),
        (
            Strategy::MovingWindow,
            Some([(2, 60), (1, 60), (0, 60)]),
            Some((60, 60)),
        ),
        (Strategy::SlidingWindow, None, None),
        (
            Strategy::TokenBucket,
            Some([(2, 20), (1, 40), (0, 60)]),
            Some((60, 20)),
        ),
        (
            Strategy::LeakyBucket,
            Some([(2, 20), (1, 40), (0, 60)]),
            Some((60, 20)),
        ),
    ];
    let client = TestClient::new();
    for &(strategy, allowed, rejected) in table {
        let clock = ManualClock::new(T0);
        let mirror_clock = ManualClock::new(T0);
        let mirror = limiter::<()>(strategy, "3/minute", &mirror_clock);
        let (app, calls) = counting_app();
        let app = app.layer(RateLimitLayer::new(
            limiter(strategy, "3/minute", &clock),
            GlobalKey,
        ));
        let server = TestServer::start(app).await;
        let url = server.url("/");
        for i in 0..3 {
            let res = client.get(&url).await;
            assert_eq!(res.status, StatusCode::OK, "{strategy} request {i}");
            assert_eq!(res.body, "ok");
            let d = mirror.check_now(&(), 1);
            assert_headers_match(&res, &d, &format!("{strategy} allowed {i}"));
            assert_eq!(
                res.header("retry-after"),
                None,
                "no Retry-After when allowed"
            );
            assert_eq!(res.num("x-ratelimit-remaining"), 2 - i as u64);
            if let Some(t) = allowed {
                let (rem, reset) = t[i];
                assert_eq!(
                    (
                        res.num("x-ratelimit-remaining"),
                        res.num("x-ratelimit-reset")
                    ),
                    (rem, reset),
                    "{strategy} request {i}: the guide's formulas"
                );
            }
        }
        let res = client.get(&url).await;
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS, "{strategy}");
        assert_eq!(
            res.header("content-type"),
            Some("text/plain; charset=utf-8")
        );
        assert!(res.body.contains("retry in"), "{strategy}: {}", res.body);
        let d = mirror.check_now(&(), 1);
        assert_headers_match(&res, &d, &format!("{strategy} rejected"));
        let retry = res.num("retry-after");
        assert!(retry >= 1);
        assert_eq!(res.num("x-ratelimit-remaining"), 0);
        assert!(
            res.num("x-ratelimit-reset") >= retry,
            "{strategy}: reset >= Retry-After"
        );
        if let Some((reset, retry_after)) = rejected {
            assert_eq!(
                (res.num("x-ratelimit-reset"), retry),
                (reset, retry_after),
                "{strategy}"
            );
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "{strategy}: inner not called on 429"
        );
        // One second short is still rejected (waits of 2 s and more), the wait admits.
        if retry >= 2 {
            clock.advance(Duration::from_secs(retry - 1));
            let res = client.get(&url).await;
            assert_eq!(
                res.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{strategy}: tight"
            );
            clock.advance(Duration::from_secs(1));
        } else {
            clock.advance(Duration::from_secs(retry));
        }
        let res = client.get(&url).await;
        assert_eq!(
            res.status,
            StatusCode::OK,
            "{strategy}: admitted after Retry-After"
        );
        server.stop().await;
    }
}

/// The reported quota is the binding one; Unix reset; IETF fields; headers off; an inner
/// service's own x-ratelimit-* fields are replaced, never duplicated.
#[tokio::test]
async fn header_options() {
    let client = TestClient::new();
    let clock = ManualClock::new(T0);
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                (
                    [
                        ("x-ratelimit-limit", "999"),
                        ("x-ratelimit-remaining", "999"),
                    ],
                    "ok",
                )
            }),
        )
        .layer(
            RateLimitLayer::new(
                limiter::<()>(Strategy::FixedWindow, "10/second; 3/minute", &clock),
                GlobalKey,
            )
            .headers(
                Headers::new()
                    .reset_format(ResetFormat::Unix)
                    .style(HeaderStyle::Both)
                    .policy_name("api"),
            ),
        );
    let server = TestServer::start(app).await;
    let res = client.get(&server.url("/")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.count("x-ratelimit-limit"), 1, "inner's field replaced");
    assert_eq!(res.num("x-ratelimit-limit"), 3, "the minute quota binds");
    assert_eq!(res.num("x-ratelimit-remaining"), 2);
    assert_eq!(
        res.num("x-ratelimit-reset"),
        T0.as_secs() + 60,
        "Unix seconds"
    );
    assert_eq!(
        res.header("ratelimit-policy"),
        Some("\"api-0\";q=10;w=1, \"api-1\";q=3;w=60")
    );
    assert_eq!(res.header("ratelimit"), Some("\"api-1\";r=2;t=60"));
    server.stop().await;

    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            limiter::<()>(Strategy::FixedWindow, "1/minute", &clock),
            GlobalKey,
        )
        .headers(Headers::new().on_allowed(false)),
    );
    let server = TestServer::start(app).await;
    let res = client.get(&server.url("/")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        res.header("x-ratelimit-limit"),
        None,
        "headers off on allowed"
    );
    let res = client.get(&server.url("/")).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.num("x-ratelimit-limit"),
        1,
        "rejections always carry them"
    );
    assert_eq!(res.num("retry-after"), 60);
    server.stop().await;
}

/// Keys are isolated: two API keys, two peer IPs.
#[tokio::test]
async fn keys_are_isolated() {
    let clock = ManualClock::new(T0);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            limiter(Strategy::MovingWindow, "2/minute", &clock),
            HeaderKey::new("x-api-key"),
        ));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/");
    for _ in 0..2 {
        assert_eq!(
            client
                .get_with(&url, &[("x-api-key", "alpha")])
                .await
                .status,
            StatusCode::OK
        );
    }
    assert_eq!(
        client
            .get_with(&url, &[("x-api-key", "alpha")])
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let res = client.get_with(&url, &[("x-api-key", "beta")]).await;
    assert_eq!(
        (res.status, res.num("x-ratelimit-remaining")),
        (StatusCode::OK, 1)
    );
    server.stop().await;

    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            limiter(Strategy::MovingWindow, "2/minute", &clock),
            PeerIp::default(),
        ));
    let server = TestServer::start(app).await;
    let url = server.url("/");
    let a = TestClient::from_ip(ip("127.0.0.2"));
    let b = TestClient::from_ip(ip("127.0.0.3"));
    for _ in 0..2 {
        assert_eq!(a.get(&url).await.status, StatusCode::OK);
    }
    assert_eq!(a.get(&url).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        b.get(&url).await.status,
        StatusCode::OK,
        "another IP, another bucket"
    );
    server.stop().await;
}

/// A spoofed X-Forwarded-For from an untrusted peer shares the peer's bucket; through the trusted
/// proxy the right-most untrusted address is the client.
#[tokio::test]
async fn forwarded_headers_count_only_through_trusted_proxies() {
    let clock = ManualClock::new(T0);
    let lim = limiter(Strategy::FixedWindow, "2/minute", &clock);
    let key = ForwardedIp::new(["127.0.0.1/32"]).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(lim.clone(), key));
    let server = TestServer::start(app).await;
    let url = server.url("/");
    let attacker = TestClient::from_ip(ip("127.0.0.2"));
    let statuses: Vec<_> = {
        let mut v = Vec::new();
        for spoof in ["1.1.1.1", "2.2.2.2, 3.3.3.3", "127.0.0.1", "garbage"] {
            v.push(
                attacker
                    .get_with(&url, &[("x-forwarded-for", spoof)])
                    .await
                    .status,
            );
        }
        v
    };
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "every spoofed value lands in 127.0.0.2's bucket"
    );
    assert_eq!(lim.peek_now(&ip("127.0.0.2")).remaining(), 0);
    assert_eq!(lim.peek_now(&ip("1.1.1.1")).remaining(), 2, "no new bucket");

    let proxy = TestClient::new();
    let via = |client: &str| format!("6.6.6.6, {client}");
    let res = proxy
        .get_with(&url, &[("x-forwarded-for", &via("203.0.113.7"))])
        .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        lim.peek_now(&ip("203.0.113.7")).remaining(),
        1,
        "the right client"
    );
    assert_eq!(
        lim.peek_now(&ip("6.6.6.6")).remaining(),
        2,
        "not the spoofable left-most"
    );
    assert_eq!(
        lim.peek_now(&ip("127.0.0.1")).remaining(),
        2,
        "not the proxy"
    );
    server.stop().await;
}

/// No usable key gets the configured answer: 400 text/plain by default, or the fallback key.
#[tokio::test]
async fn missing_keys_get_the_configured_answer() {
    let clock = ManualClock::new(T0);
    let (app, calls) = counting_app();
    let app = app.layer(RateLimitLayer::new(
        limiter(Strategy::FixedWindow, "5/minute", &clock),
        HeaderKey::new("x-api-key"),
    ));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/");
    for headers in [
        &[][..],
        &[("x-api-key", "")][..],
        &[("x-api-key", "  ")][..],
    ] {
        let res = client.get_with(&url, headers).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{headers:?}");
        assert_eq!(
            res.header("content-type"),
            Some("text/plain; charset=utf-8")
        );
        assert!(res.body.contains("no rate-limit key"), "{}", res.body);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never a silent pass");
    server.stop().await;

    let lim = limiter(Strategy::FixedWindow, "2/minute", &clock);
    let fallback = HeaderKey::new("x-api-key")
        .extract(
            &http::Request::get("/")
                .header("x-api-key", "anonymous")
                .body(())
                .unwrap()
                .into_parts()
                .0,
        )
        .unwrap();
    let layer = RateLimitLayer::new(lim.clone(), HeaderKey::new("x-api-key"))
        .keys(KeyPolicy::default().fallback(fallback.clone()));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let server = TestServer::start(app).await;
    let url = server.url("/");
    assert_eq!(client.get(&url).await.status, StatusCode::OK);
    assert_eq!(client.get(&url).await.status, StatusCode::OK);
    assert_eq!(
        client.get(&url).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "shared bucket"
    );
    assert_eq!(lim.peek_now(&fallback).remaining(), 0);
    assert_eq!(layer.stats().missing_keys, 3, "counted");
    server.stop().await;
}

/// 200 concurrent requests against a limit of 50 admit exactly 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_requests_admit_exactly_fifty() {
    let clock = ManualClock::new(T0);
    let (app, calls) = counting_app();
    let app = app.layer(RateLimitLayer::new(
        limiter(Strategy::MovingWindow, "50/hour", &clock),
        GlobalKey,
    ));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/");
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).await.status })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            s => panic!("unexpected {s}"),
        }
    }
    assert_eq!((ok, limited), (50, 150));
    assert_eq!(calls.load(Ordering::SeqCst), 50);
    server.stop().await;
}

/// Two stacked layers on one limiter (route and router level) count a request once; a
/// request rejected by the outer layer consumes nothing in an inner one.
#[tokio::test]
async fn stacked_layers_never_count_one_request_twice() {
    let clock = ManualClock::new(T0);
    let shared = limiter::<()>(Strategy::FixedWindow, "4/minute", &clock);
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).route_layer(RateLimitLayer::new(shared.clone(), GlobalKey)),
        )
        .layer(RateLimitLayer::new(shared.clone(), GlobalKey));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/");
    let res = client.get(&url).await;
    assert_eq!(
        (res.status, res.num("x-ratelimit-remaining")),
        (StatusCode::OK, 3)
    );
    assert_eq!(shared.peek_now(&()).remaining(), 3, "counted once");
    server.stop().await;

    // Outer limit 1, inner limit 5 (separate limiters): the outer rejects the second request,
    // which the inner never counts.
    let outer = limiter::<()>(Strategy::FixedWindow, "1/minute", &clock);
    let inner = limiter::<()>(Strategy::FixedWindow, "5/minute", &clock);
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).route_layer(RateLimitLayer::new(inner.clone(), GlobalKey)),
        )
        .layer(RateLimitLayer::new(outer.clone(), GlobalKey));
    let server = TestServer::start(app).await;
    let url = server.url("/");
    assert_eq!(client.get(&url).await.status, StatusCode::OK);
    assert_eq!(client.get(&url).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        inner.peek_now(&()).remaining(),
        4,
        "inner counted only the admitted one"
    );
    server.stop().await;
}

/// Every request is limited, 404s too, and per-route layers keep separate limits.
#[tokio::test]
async fn per_route_limits_and_unknown_routes() {
    let clock = ManualClock::new(T0);
    let app = Router::new()
        .route(
            "/strict",
            get(|| async { "strict" }).route_layer(RateLimitLayer::new(
                limiter::<()>(Strategy::FixedWindow, "1/minute", &clock),
                GlobalKey,
            )),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            limiter::<()>(Strategy::FixedWindow, "3/minute", &clock),
            GlobalKey,
        ));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let res = client.get(&server.url("/nowhere")).await;
    assert_eq!(
        (res.status, res.num("x-ratelimit-remaining")),
        (StatusCode::NOT_FOUND, 2)
    );
    let res = client.get(&server.url("/strict")).await;
    assert_eq!(
        (res.status, res.num("x-ratelimit-remaining")),
        (StatusCode::OK, 0),
        "the limiter with the fewest left reports (the route's), not the outermost"
    );
    let res = client.get(&server.url("/strict")).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    let res = client.get(&server.url("/")).await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the router-wide 3/minute is spent"
    );
    server.stop().await;
}

/// Regression (review): the stacked-layer de-duplication ignored the rule, so a route layer with its
/// own, stricter rule (`select_rule`) was never checked. A key's state belongs to the limiter's name
/// and the key (another rule converts it), so limits meant to count apart take a limiter each: the
/// route's own limiter counts the requests it sees.
#[tokio::test]
async fn a_route_layer_with_its_own_rule_still_applies_under_a_router_layer() {
    let clock = ManualClock::new(T0);
    let shared = limiter::<()>(Strategy::FixedWindow, "100/minute", &clock);
    let route = limiter::<()>(Strategy::FixedWindow, "100/minute", &clock);
    let strict =
        std::sync::Arc::new(tollgate::Rule::parse(Strategy::FixedWindow, "2/minute").unwrap());
    let route_layer = RateLimitLayer::new(route, GlobalKey)
        .select_rule(move |_: &http::request::Parts| Some(strict.clone()));
    let app = Router::new()
        .route("/login", get(|| async { "ok" }).route_layer(route_layer))
        .layer(RateLimitLayer::new(shared.clone(), GlobalKey));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/login");
    for _ in 0..2 {
        let res = client.get(&url).await;
        assert_eq!(res.status, StatusCode::OK, "{res:?}");
    }
    let third = client.get(&url).await;
    assert_eq!(
        (third.status, third.num("x-ratelimit-limit")),
        (StatusCode::TOO_MANY_REQUESTS, 2),
        "the strict rule applies"
    );
    server.stop().await;
}
