//! Per-key concurrency limits in memory over real HTTP connections: the cap holds under 200
//! concurrent requests, keys have their own caps, the 429 names the cap, and a client that goes
//! away (before the response or during its body) gives its slot back.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::key::HeaderKey;
use tollgate::layer::{ConcurrencyLayer, ConcurrencyLimit};

use crate::support::{TestClient, TestServer, metric};

/// Requests in flight in the handler now, and the most seen at once.
#[derive(Clone, Default)]
pub(crate) struct InFlight {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl InFlight {
    /// Runs the handler's work (`hold`) counted in flight.
    pub(crate) async fn hold(&self, hold: Duration) -> &'static str {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(hold).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        "ok"
    }

    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

fn cap(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn app(
    limit: ConcurrencyLimit<tollgate::key::ValueKey>,
    per_key: [InFlight; 2],
    hold: Duration,
) -> Router {
    let [a, b] = per_key;
    Router::new()
        .route("/a", get(move || async move { a.hold(hold).await }))
        .route("/b", get(move || async move { b.hold(hold).await }))
        .layer(ConcurrencyLayer::new(limit, HeaderKey::new("x-api-key")))
}

#[tokio::test]
async fn the_cap_holds_under_200_concurrent_requests_per_key() {
    let (a, b) = (InFlight::default(), InFlight::default());
    let server = TestServer::start(app(
        ConcurrencyLimit::memory(cap(4)),
        [a.clone(), b.clone()],
        Duration::from_millis(300),
    ))
    .await;
    let client = TestClient::new();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (path, key) = if i % 2 == 0 {
            ("/a", "ka")
        } else {
            ("/b", "kb")
        };
        let (client, url) = (client.clone(), server.url(path));
        tasks.push(tokio::spawn(async move {
            client.get_with(&url, &[("x-api-key", key)]).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let res = t.await.unwrap();
        if res.status == StatusCode::OK {
            ok += 1;
            continue;
        }
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.header("x-ratelimit-limit"), Some("4"));
        assert_eq!(res.header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(res.header("retry-after"), Some("1"));
        assert!(
            res.body.contains("at most 4 requests in flight"),
            "{}",
            res.body
        );
    }
    assert!(
        a.max() <= 4 && b.max() <= 4,
        "in flight at once: {} and {}",
        a.max(),
        b.max()
    );
    assert!(
        ok >= 8,
        "each key got its own 4 slots at least once: {ok} admitted"
    );
    assert_eq!(
        (a.max(), b.max()),
        (4, 4),
        "200 requests at once fill both caps"
    );
    // Every slot came back: a full set of 4 passes again at once.
    let mut again = Vec::new();
    for _ in 0..4 {
        let (client, url) = (client.clone(), server.url("/a"));
        again.push(tokio::spawn(async move {
            client.get_with(&url, &[("x-api-key", "ka")]).await.status
        }));
    }
    for t in again {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_request_without_a_key_is_refused() {
    let server = TestServer::start(app(
        ConcurrencyLimit::memory(cap(1)),
        Default::default(),
        Duration::ZERO,
    ))
    .await;
    let res = TestClient::new().get(&server.url("/a")).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

/// Sends a request on a raw connection, waits `after`, and closes the connection.
pub(crate) async fn go_away(addr: std::net::SocketAddr, path: &str, after: Duration) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nx-api-key: k\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(conn);
}

/// Retries `path` with key `k` until it is admitted; how long that took.
pub(crate) async fn admitted_within(url: &str, limit: Duration) -> Duration {
    let client = TestClient::new();
    let started = Instant::now();
    loop {
        let res = client.get_with(url, &[("x-api-key", "k")]).await;
        if res.status == StatusCode::OK {
            return started.elapsed();
        }
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            started.elapsed() < limit,
            "the slot was not given back within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_client_that_goes_away_before_the_response_gives_its_slot_back() {
    let flight = InFlight::default();
    let slow = flight.clone();
    let app = Router::new()
        .route(
            "/slow",
            get(move || async move { slow.hold(Duration::from_secs(30)).await }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(ConcurrencyLayer::new(
            ConcurrencyLimit::memory(cap(1)),
            HeaderKey::new("x-api-key"),
        ));
    let server = TestServer::start(app).await;
    go_away(server.addr, "/slow", Duration::from_millis(200)).await;
    assert_eq!(flight.max(), 1, "the slow request was in flight");
    admitted_within(&server.url("/"), Duration::from_secs(5)).await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_during_the_body_gives_its_slot_back() {
    let app = Router::new()
        .route("/stream", get(|| async { endless_body() }))
        .route("/", get(|| async { "ok" }))
        .layer(ConcurrencyLayer::new(
            ConcurrencyLimit::memory(cap(1)),
            HeaderKey::new("x-api-key"),
        ));
    let server = TestServer::start(app).await;
    a_stream_holds_its_slot_until_its_client_goes_away(&server).await;
    server.stop().await;
}

/// On a server whose `/stream` answers [`endless_body`] and `/` at once, under a cap of 1 per
/// `x-api-key`: a streaming response holds its key's slot, and its client going away gives it back.
pub(crate) async fn a_stream_holds_its_slot_until_its_client_goes_away(server: &TestServer) {
    let mut conn = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(b"GET /stream HTTP/1.1\r\nhost: t\r\nx-api-key: k\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(n > 0, "the head and the first chunk came");
    let res = TestClient::new()
        .get_with(&server.url("/"), &[("x-api-key", "k")])
        .await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the stream holds the slot"
    );
    drop(conn);
    admitted_within(&server.url("/"), Duration::from_secs(5)).await;
}

/// A body that does not end for a minute: one chunk, then nothing.
pub(crate) fn endless_body() -> axum::body::Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
    tokio::spawn(async move {
        let _ = tx.send(bytes::Bytes::from_static(b"first")).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(tx);
    });
    axum::body::Body::new(Chunks(rx))
}

struct Chunks(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }
}

#[tokio::test]
async fn with_pacing_requests_over_the_cap_wait_for_a_slot_then_are_refused_naming_the_wait() {
    let flight = InFlight::default();
    let held = flight.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || async move { held.hold(Duration::from_millis(200)).await }),
        )
        .layer(
            ConcurrencyLayer::new(
                ConcurrencyLimit::memory(cap(1)),
                HeaderKey::new("x-api-key"),
            )
            .wait(Duration::from_secs(5)),
        );
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (client, url) = (client.clone(), server.url("/"));
            tokio::spawn(async move { client.get_with(&url, &[("x-api-key", "k")]).await.status })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK, "each waited for its turn");
    }
    assert_eq!(flight.max(), 1, "one at a time");
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    server.stop().await;

    // A wait shorter than the request in flight: refused after the wait, which the body names.
    let slow = InFlight::default();
    let held = slow.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || async move { held.hold(Duration::from_secs(2)).await }),
        )
        .layer(
            ConcurrencyLayer::new(
                ConcurrencyLimit::memory(cap(1)),
                HeaderKey::new("x-api-key"),
            )
            .wait(Duration::from_millis(150)),
        );
    let server = TestServer::start(app).await;
    let first = {
        let (client, url) = (client.clone(), server.url("/"));
        tokio::spawn(async move { client.get_with(&url, &[("x-api-key", "k")]).await.status })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let res = client
        .get_with(&server.url("/"), &[("x-api-key", "k")])
        .await;
    let took = started.elapsed();
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(res.body.contains("within 150 ms"), "{}", res.body);
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn the_server_reports_the_caps_slots_in_flight_and_counts_its_429s_as_rejected() {
    let server = crate::server_cli::Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--quota",
        "1000/minute",
        "--concurrency",
        "2",
        "--delay-ms",
        "1500",
    ])
    .await;
    let c = TestClient::new();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let (c, url) = (c.clone(), server.url("/"));
            tokio::spawn(async move { c.get(&url).await.status })
        })
        .collect();
    // Both slow requests are in the handler once the gauge says so (or the deadline passes).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut page = String::new();
    while Instant::now() < deadline {
        page = c.get(&server.url("/metrics")).await.body;
        if metric(&page, "tollgate_in_flight{limit=\"default\"}") == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&page, "tollgate_in_flight{limit=\"default\"}"),
        Some(2.0),
        "two requests hold the cap's slots: {page}"
    );
    let over = c.get(&server.url("/")).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    for s in slow {
        assert_eq!(s.await.unwrap(), StatusCode::OK);
    }
    let page = c.get(&server.url("/metrics")).await.body;
    server.stop().await;
    assert_eq!(
        metric(&page, "tollgate_in_flight{limit=\"default\"}"),
        Some(0.0),
        "every slot given back: {page}"
    );
    assert_eq!(
        metric(
            &page,
            "tollgate_requests_total{limit=\"default\",outcome=\"rejected\"}"
        ),
        Some(1.0),
        "the cap's 429 counts as rejected under its name: {page}"
    );
}
