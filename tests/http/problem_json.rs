//! One responder for every answer the layer makes on its own: RFC 9457 problem+json for the 429,
//! the 400 without a key and the 503 when failing closed, and for the concurrency cap's 429.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::key::{GlobalKey, HeaderKey};
use tollgate::layer::{
    ConcurrencyLayer, ConcurrencyLimit, FailurePolicy, ProblemJson, RateLimitLayer,
};
use tollgate::store::{Answer, LimiterNames, Scope, Store};
use tollgate::{Decision, ManualClock, Op, RateLimiter, Stats, StoreError, StoreErrorKind};
use tower::{Layer, ServiceExt, service_fn};

type Body = Full<Bytes>;

fn clock() -> ManualClock {
    ManualClock::new(Duration::from_secs(1_700_000_000))
}

fn ok()
-> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone {
    service_fn(|_req: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))))
}

async fn problem<B: http_body::Body>(res: Response<B>) -> (StatusCode, String)
where
    B::Error: std::fmt::Debug,
{
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn rate_limited_and_keyless_requests_get_problem_documents() {
    let limiter = RateLimiter::builder()
        .quotas("1/minute")
        .unwrap()
        .clock(clock())
        .build()
        .unwrap();
    let svc = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key"))
        .respond_with(ProblemJson)
        .layer(ok());
    let keyed = || {
        Request::get("/")
            .header("x-api-key", "k")
            .body(Body::default())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(keyed()).await.unwrap().status(),
        StatusCode::OK
    );
    let (status, body) = problem(svc.clone().oneshot(keyed()).await.unwrap()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body.contains("\"status\":429") && body.contains("\"retry_after\":41"),
        "{body}"
    );
    let res = svc
        .clone()
        .oneshot(Request::get("/").body(Body::default()).unwrap())
        .await
        .unwrap();
    let (status, body) = problem(res).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("\"title\":\"Bad Request\""), "{body}");
}

#[derive(Debug, Default)]
struct DownStore(LimiterNames);

impl Store<()> for DownStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn apply(&self, _: &(), _: Scope<'_>, _: Op, _: u64) -> Answer<Self::Future> {
        Answer::now(Err(StoreError::new(StoreErrorKind::Connection, "down")))
    }

    fn names(&self) -> &LimiterNames {
        &self.0
    }

    fn stats(&self) -> Stats {
        Stats::default()
    }
}

#[tokio::test]
async fn failing_closed_answers_a_problem_document() {
    let limiter = RateLimiter::builder()
        .quotas("1/minute")
        .unwrap()
        .store(DownStore::default())
        .clock(clock())
        .build()
        .unwrap();
    let svc = RateLimitLayer::new(limiter, GlobalKey)
        .failure_policy(FailurePolicy::FailClosed)
        .respond_with(ProblemJson)
        .layer(ok());
    let res = svc
        .oneshot(Request::get("/").body(Body::default()).unwrap())
        .await
        .unwrap();
    let failed = res.extensions().get::<StoreError>().cloned();
    assert_eq!(
        failed.as_ref().and_then(StoreError::limiter),
        Some("default"),
        "the store error names the limiter whose decision failed: {failed:?}"
    );
    let (status, body) = problem(res).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("\"status\":503"), "{body}");
}

#[tokio::test]
async fn the_concurrency_caps_refusals_go_through_the_same_hook() {
    // A handler that holds its request until told: one in flight per key, the next is refused.
    let (release, held) = tokio::sync::oneshot::channel::<()>();
    let held = std::sync::Arc::new(tokio::sync::Mutex::new(Some(held)));
    let entered = std::sync::Arc::new(tokio::sync::Notify::new());
    let inside = std::sync::Arc::clone(&entered);
    let slow = service_fn(move |_req: Request<Body>| {
        let (held, inside) = (std::sync::Arc::clone(&held), std::sync::Arc::clone(&inside));
        async move {
            if let Some(rx) = held.lock().await.take() {
                inside.notify_one();
                let _ = rx.await;
            }
            Ok::<_, Infallible>(Response::new(Body::default()))
        }
    });
    let limit = ConcurrencyLimit::memory(std::num::NonZeroU32::new(1).unwrap());
    let svc = ConcurrencyLayer::new(limit, HeaderKey::new("x-api-key"))
        .respond_with(ProblemJson)
        .layer(slow);
    let keyed = || {
        Request::get("/")
            .header("x-api-key", "k")
            .body(Body::default())
            .unwrap()
    };
    let first = tokio::spawn(svc.clone().oneshot(keyed()));
    // The first request holds the key's only slot while it is in the handler.
    entered.notified().await;
    let res = svc.clone().oneshot(keyed()).await.unwrap();
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    let (status, body) = problem(res).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body.contains("quota-exceeded")
            && body.contains("at most 1 request in flight per client")
            && body.contains("\"retry_after\":1"),
        "{body}"
    );
    let res = svc
        .clone()
        .oneshot(Request::get("/").body(Body::default()).unwrap())
        .await
        .unwrap();
    let (status, body) = problem(res).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
}
