//! Per-key concurrency limits on Redis: the cap holds across two instances under 200 concurrent
//! requests, a lease outlives its TTL while renewed, and a client that goes away gives its lease
//! back.

use crate::redis_support::RedisServer;
use crate::support::{TestClient, TestServer};

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tollgate::key::HeaderKey;
use tollgate::layer::{ConcurrencyLayer, ConcurrencyLimit};
use tollgate::store::redis::RedisStore;

/// Requests in flight in the handlers of every instance, and the most seen at once.
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl InFlight {
    async fn hold(&self, hold: Duration) -> &'static str {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(hold).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        "ok"
    }
}

async fn instance(
    server: &RedisServer,
    flight: &InFlight,
    cap: u32,
    ttl: Duration,
    hold: Duration,
) -> TestServer {
    let store = RedisStore::builder(server.url())
        .prefix("inflight:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let limit = ConcurrencyLimit::redis(store, "gpu", NonZeroU32::new(cap).unwrap())
        .unwrap()
        .lease_ttl(ttl);
    let flight = flight.clone();
    let app = Router::new()
        .route("/", get(move || async move { flight.hold(hold).await }))
        .route("/fast", get(|| async { "ok" }))
        .layer(ConcurrencyLayer::new(limit, HeaderKey::new("x-api-key")));
    TestServer::start(app).await
}

#[tokio::test]
async fn the_cap_holds_across_two_instances_under_200_concurrent_requests() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let flight = InFlight::default();
    let hold = Duration::from_millis(300);
    let a = instance(&server, &flight, 4, Duration::from_secs(60), hold).await;
    let b = instance(&server, &flight, 4, Duration::from_secs(60), hold).await;
    let client = TestClient::new();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let url = if i % 2 == 0 { a.url("/") } else { b.url("/") };
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client.get_with(&url, &[("x-api-key", "k")]).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let res = t.await.unwrap();
        match res.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(res.header("x-ratelimit-limit"), Some("4"));
                assert_eq!(res.header("retry-after"), Some("1"));
            }
            other => panic!("unexpected {other}"),
        }
    }
    let max = flight.max.load(Ordering::SeqCst);
    assert!(max <= 4, "{max} in flight at once across the instances");
    assert!(ok >= 4, "{ok} admitted");
    // The leases are given back (spawned after each response): the set empties.
    let mut held = String::new();
    for _ in 0..100 {
        held = server.cli(&["ZCARD", &leases_key(&server)]);
        if held.trim() == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held.trim(), "0", "every lease released");
    a.stop().await;
    b.stop().await;
}

/// The one sorted set of leases the tests use (prefix `inflight:`, key `k`, name `gpu`).
fn leases_key(server: &RedisServer) -> String {
    let keys = server.cli(&["KEYS", "inflight:*"]);
    keys.lines()
        .map(str::trim)
        .find(|k| k.ends_with("c:gpu"))
        .map_or_else(|| "inflight:none".to_owned(), str::to_owned)
}

#[tokio::test]
async fn a_lease_is_renewed_while_its_request_runs_past_the_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let flight = InFlight::default();
    let a = instance(
        &server,
        &flight,
        1,
        Duration::from_millis(300),
        Duration::from_millis(1500),
    )
    .await;
    let client = TestClient::new();
    let url = a.url("/");
    let long = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { client.get_with(&url, &[("x-api-key", "k")]).await.status })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Five TTLs later the first request still holds its renewed lease.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1000) {
        let res = client.get_with(&url, &[("x-api-key", "k")]).await;
        assert_eq!(
            res.status,
            StatusCode::TOO_MANY_REQUESTS,
            "at {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(long.await.unwrap(), StatusCode::OK);
    a.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_gives_its_lease_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let flight = InFlight::default();
    let a = instance(
        &server,
        &flight,
        1,
        Duration::from_secs(60),
        Duration::from_secs(30),
    )
    .await;
    let mut conn = tokio::net::TcpStream::connect(a.addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nhost: t\r\nx-api-key: k\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        flight.now.load(Ordering::SeqCst),
        1,
        "the request is in flight"
    );
    drop(conn);
    let client = TestClient::new();
    let started = Instant::now();
    loop {
        let res = client
            .get_with(&a.url("/fast"), &[("x-api-key", "k")])
            .await;
        if res.status == StatusCode::OK {
            break;
        }
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the lease was not released (its TTL is 60 s)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
}
