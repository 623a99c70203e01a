//! Settlement from the response on Redis: two instances (two stores, one limiter name) behind
//! real HTTP connections settle concurrent requests from a header and from the body's end, and
//! exactly the budget is spent.

use crate::redis_support::RedisServer;
use crate::support::{TestClient, TestServer};

use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use http::request::Parts;
use tollgate::key::GlobalKey;
use tollgate::layer::{RateLimitLayer, SettleFrom};
use tollgate::store::redis::RedisStore;
use tollgate::{RateLimiter, Strategy};

async fn instance(
    server: &RedisServer,
    source: SettleFrom,
) -> (TestServer, RateLimiter<(), RedisStore>) {
    let store = RedisStore::builder(server.url())
        .prefix("settle:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let limiter = RateLimiter::builder()
        .name("tokens")
        .strategy(Strategy::FixedWindow)
        .quotas("1000/hour")
        .unwrap()
        .store(store)
        .build()
        .unwrap();
    let app = Router::new().route("/", get(answer)).layer(
        RateLimitLayer::new(limiter.clone(), GlobalKey)
            .cost(|_: &Parts| 1)
            .settle_from(source),
    );
    (TestServer::start(app).await, limiter)
}

#[derive(serde::Deserialize)]
struct Used {
    used: usize,
}

/// `x-used: <used>` and a body of `used` bytes.
async fn answer(Query(Used { used }): Query<Used>) -> Response {
    let mut res = "x".repeat(used).into_response();
    res.headers_mut().insert("x-used", used.into());
    res
}

/// Sends 100 requests of 10 units, 50 to each instance at once, then checks that the budget of
/// 1000 is exactly spent: nothing lost, nothing counted twice.
async fn exactly_the_budget(source: impl Fn() -> SettleFrom) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (a, lim) = instance(&server, source()).await;
    let (b, _) = instance(&server, source()).await;
    let client = TestClient::new();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let url = if i % 2 == 0 {
            a.url("/?used=10")
        } else {
            b.url("/?used=10")
        };
        let client = client.clone();
        tasks.push(tokio::spawn(async move { client.get(&url).await.status }));
    }
    for t in tasks {
        assert_eq!(
            t.await.unwrap(),
            StatusCode::OK,
            "each was admitted on its estimate of 1"
        );
    }
    let mut left = u32::MAX;
    for _ in 0..200 {
        left = lim.check(&(), 0).await.unwrap().remaining();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left, 0, "100 x 10 = the whole budget of 1000");
    for s in [&a, &b] {
        let res = client.get(&s.url("/?used=0")).await;
        assert_eq!(
            res.status,
            StatusCode::TOO_MANY_REQUESTS,
            "spent on both instances"
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn two_instances_settling_from_a_header_spend_exactly_the_budget() {
    exactly_the_budget(|| SettleFrom::header(http::HeaderName::from_static("x-used"))).await;
}

#[tokio::test]
async fn two_instances_settling_at_the_body_end_spend_exactly_the_budget() {
    exactly_the_budget(|| SettleFrom::body(|chunk| chunk.len() as u64)).await;
}
