//! Settlement from the response over real HTTP connections (memory store): a header (the headers
//! show the settled state), an extension read by every stacked limiter, the body's end (capped per
//! stream, charged for what was sent when the client goes away), the estimate of at least 1.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Query;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use http::request::Parts;
use tollgate::key::GlobalKey;
use tollgate::layer::{RateLimitLayer, SettleFrom, UsedUnits};
use tollgate::store::MemoryStore;
use tollgate::{RateLimiter, Strategy};

use crate::support::{TestClient, TestServer, WithTrailers};

fn limiter(name: &str, quota: &str) -> RateLimiter<(), MemoryStore<()>> {
    RateLimiter::builder()
        .name(name)
        .strategy(Strategy::FixedWindow)
        .quotas(quota)
        .unwrap()
        .build()
        .unwrap()
}

#[derive(serde::Deserialize)]
struct Used {
    used: Option<String>,
}

/// Answers `ok` with `x-used: <used>` when the query has one.
async fn reports(Query(q): Query<Used>) -> Response {
    let mut res = "ok".into_response();
    if let Some(used) = q.used.and_then(|u| u.parse().ok()) {
        res.headers_mut().insert("x-used", used);
    }
    res
}

/// Remaining units of the limiter's global key, without spending.
fn remaining(l: &RateLimiter<(), MemoryStore<()>>) -> u32 {
    l.check_now(&(), 0).remaining()
}

#[tokio::test]
async fn a_header_settles_the_request_and_the_headers_show_the_settled_state() {
    let lim = limiter("tokens", "100/hour");
    let app = Router::new().route("/", get(reports)).layer(
        RateLimitLayer::new(lim.clone(), GlobalKey)
            .cost(|_: &Parts| 10)
            .settle_from(SettleFrom::header(http::HeaderName::from_static("x-used"))),
    );
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let res = client.get(&server.url("/?used=37")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        63,
        "charged 37, not the estimate 10"
    );
    assert_eq!(remaining(&lim), 63);
    let res = client.get(&server.url("/?used=0")).await;
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        63,
        "0 refunds the estimate"
    );
    for bad in ["-3", "x", "4294967296", "1.5"] {
        let res = client.get(&server.url(&format!("/?used={bad}"))).await;
        assert_eq!(res.status, StatusCode::OK);
    }
    let res = client.get(&server.url("/")).await;
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        13,
        "missing and bad values leave the estimate: 63 - 5 x 10"
    );
    // A response over what is left is charged in full: the key goes into debt, and with
    // settlement on a request is admitted on at least 1 unit, so even a cost-0 peek waits.
    client.get(&server.url("/?used=90")).await;
    assert_eq!(remaining(&lim), 0);
    server.stop().await;

    let lim = limiter("peek", "5/hour");
    let app = Router::new().route("/", get(reports)).layer(
        RateLimitLayer::new(lim.clone(), GlobalKey)
            .cost(|_: &Parts| 0)
            .settle_from(SettleFrom::header(http::HeaderName::from_static("x-used"))),
    );
    let server = TestServer::start(app).await;
    let res = client.get(&server.url("/?used=5")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.num("x-ratelimit-remaining"), 0);
    let res = client.get(&server.url("/?used=0")).await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a cost-0 estimate counts as 1 with settlement on"
    );
    server.stop().await;
}

#[tokio::test]
async fn stacked_limiters_each_settle_their_own_reservation_from_one_extension() {
    let inner = limiter("per-route", "50/hour");
    let outer = limiter("per-app", "80/hour");
    let app = Router::new()
        .route(
            "/",
            get(|| async { (axum::Extension(UsedUnits::new(7)), "ok") }),
        )
        .layer(RateLimitLayer::new(inner.clone(), GlobalKey).settle_from(SettleFrom::extension()))
        .layer(RateLimitLayer::new(outer.clone(), GlobalKey).settle_from(SettleFrom::extension()));
    let server = TestServer::start(app).await;
    let res = TestClient::new().get(&server.url("/")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!((remaining(&inner), remaining(&outer)), (43, 73));
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        43,
        "the budget that runs out first"
    );
    assert_eq!(res.num("x-ratelimit-limit"), 50);
    server.stop().await;
}

#[tokio::test]
async fn a_limiter_without_a_source_keeps_its_count_under_one_that_settles() {
    let inner = limiter("settles", "50/hour");
    let outer = limiter("counts", "80/hour");
    let app = Router::new()
        .route(
            "/",
            get(|| async { (axum::Extension(UsedUnits::new(7)), "ok") }),
        )
        .layer(RateLimitLayer::new(inner.clone(), GlobalKey).settle_from(SettleFrom::extension()))
        .layer(RateLimitLayer::new(outer.clone(), GlobalKey));
    let server = TestServer::start(app).await;
    TestClient::new().get(&server.url("/")).await;
    assert_eq!((remaining(&inner), remaining(&outer)), (43, 79));
    server.stop().await;
}

/// A body of `n` bytes in chunks of 100, one every `gap`.
fn stream(n: usize, gap: Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let mut left = n;
        while left > 0 {
            let k = left.min(100);
            if tx.send(bytes::Bytes::from(vec![b'x'; k])).await.is_err() {
                return;
            }
            left -= k;
            tokio::time::sleep(gap).await;
        }
    });
    Body::new(Chunks(rx)).into_response()
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
async fn the_body_end_settles_what_the_stream_counted_capped_per_stream() {
    let lim = limiter("bytes", "10000/hour");
    let app = Router::new()
        .route(
            "/{n}",
            get(
                |axum::extract::Path(n): axum::extract::Path<usize>| async move {
                    stream(n, Duration::ZERO)
                },
            ),
        )
        .layer(
            RateLimitLayer::new(lim.clone(), GlobalKey)
                .cost(|_: &Parts| 100)
                .settle_from(SettleFrom::body(|chunk| chunk.len() as u64).cap(2000)),
        );
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let res = client.get(&server.url("/1250")).await;
    assert_eq!(res.body.len(), 1250);
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        9900,
        "the head shows the estimate: the count is known at the end"
    );
    settled(&lim, 10000 - 1250).await;
    let res = client.get(&server.url("/5000")).await;
    assert_eq!(res.body.len(), 5000);
    settled(&lim, 10000 - 1250 - 2000).await;
    server.stop().await;
}

/// Waits (briefly) until the settlement at the body's end shows.
async fn settled(lim: &RateLimiter<(), MemoryStore<()>>, want: u32) {
    for _ in 0..200 {
        if remaining(lim) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(remaining(lim), want);
}

#[tokio::test]
async fn a_client_that_goes_away_pays_for_what_it_was_sent() {
    let lim = limiter("gone", "100000/hour");
    let app = Router::new()
        .route(
            "/",
            get(|| async { stream(50_000, Duration::from_millis(20)) }),
        )
        .layer(
            RateLimitLayer::new(lim.clone(), GlobalKey)
                .cost(|_: &Parts| 1)
                .settle_from(SettleFrom::body(|chunk| chunk.len() as u64)),
        );
    let server = TestServer::start(app).await;
    let addr: SocketAddr = server.addr;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = 0;
    while got < 600 {
        got += conn.read(&mut buf).await.unwrap();
    }
    drop(conn);
    // Far fewer than the 50 000 bytes were streamed (a chunk every 20 ms); they were charged.
    let mut left = remaining(&lim);
    for _ in 0..300 {
        if left < 100_000 - 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        left = remaining(&lim);
    }
    let charged = 100_000 - left;
    assert!(
        (100..50_000).contains(&charged),
        "charged {charged}: what was streamed before the client left"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        remaining(&lim),
        left,
        "nothing more once the stream is gone"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_trailer_at_the_body_end_settles_the_request() {
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};

    let lim = limiter("trailers", "100/hour");
    let svc = RateLimitLayer::new(lim.clone(), GlobalKey)
        .cost(|_: &Parts| 10)
        .settle_from(SettleFrom::trailer(http::HeaderName::from_static("x-used")))
        .layer(tower::service_fn(|req: http::Request<()>| async move {
            let used = req.uri().query().unwrap_or("").to_owned();
            let mut trailers = http::HeaderMap::new();
            if !used.is_empty() {
                trailers.insert("x-used", used.parse().unwrap());
            }
            let body = WithTrailers {
                data: Some(bytes::Bytes::from_static(b"answer")),
                trailers: Some(trailers),
            };
            Ok::<_, std::convert::Infallible>(http::Response::new(body))
        }));
    let call = |q: &str| http::Request::get(format!("/?{q}")).body(()).unwrap();
    let res = svc.clone().oneshot(call("3")).await.unwrap();
    assert_eq!(
        res.headers()["x-ratelimit-remaining"],
        "90",
        "the head shows the estimate"
    );
    let collected = res.into_body().collect().await.unwrap();
    assert_eq!(
        collected.trailers().unwrap()["x-used"],
        "3",
        "the trailers reach the client"
    );
    assert_eq!(remaining(&lim), 97, "settled to the trailer's 3");
    for bad in ["", "-1", "many"] {
        let res = svc.clone().oneshot(call(bad)).await.unwrap();
        res.into_body().collect().await.unwrap();
    }
    assert_eq!(
        remaining(&lim),
        67,
        "no usable trailer: the estimate stands"
    );
    // A body dropped before its trailers leaves the estimate too.
    drop(svc.clone().oneshot(call("1")).await.unwrap());
    assert_eq!(remaining(&lim), 57);
}

/// A settle header given twice is not read from its first copy: the estimate stands. Given once,
/// the same value settles.
#[tokio::test]
async fn a_repeated_settle_header_leaves_the_estimate() {
    use tower::ServiceExt as _;
    let lim = limiter("twice", "100/hour");
    let app = Router::new()
        .route(
            "/",
            get(|Query(q): Query<Used>| async move {
                let mut res = "ok".into_response();
                for _ in 0..q.used.map_or(0, |n| n.parse::<usize>().unwrap()) {
                    res.headers_mut().append("x-used", "30".parse().unwrap());
                }
                res
            }),
        )
        .layer(
            RateLimitLayer::new(lim.clone(), GlobalKey)
                .cost(|_: &Parts| 10)
                .settle_from(SettleFrom::header(http::HeaderName::from_static("x-used"))),
        );
    let get = |copies: usize| {
        http::Request::get(format!("/?used={copies}"))
            .body(Body::empty())
            .unwrap()
    };
    let res = app.clone().oneshot(get(2)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(remaining(&lim), 90, "two copies: the estimate of 10 stands");
    let res = app.oneshot(get(1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(remaining(&lim), 60, "one copy: settled to 30");
}
