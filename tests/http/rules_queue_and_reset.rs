//! The rules layer's shaping queue and reset, called as a tower service on paused time: a queued
//! request gives back the inner service's readiness while it waits, and a reset right after a
//! reload that changed the quotas is not undone by the state conversion.

use std::convert::Infallible;
use std::future::ready;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tollgate::TokioClock;
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::MemoryStore;
use tower::{Layer, ServiceExt, service_fn};

type Body = Full<Bytes>;

fn rules(text: &str) -> Rules<MemoryStore<Vec<u8>>, TokioClock> {
    Rules::with_clock(
        text,
        RulesOptions::default(),
        MemoryStore::new,
        TokioClock::new(),
    )
    .unwrap()
}

fn request(method: Method, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .body(Body::default())
        .unwrap()
}

/// Regression: the rules layer kept the inner service it had polled ready (here the one permit of
/// a concurrency limit) while a request waited in a `queue_ms` queue, so that a request no queue
/// applies to stalled behind it.
#[tokio::test(start_paused = true)]
async fn a_request_without_a_queue_does_not_wait_behind_a_queued_one_for_the_inner_service() {
    let rules = rules(
        "[[limit]]\nname = \"q\"\npath = \"/q\"\nkey = \"global\"\nstrategy = \"leaky-bucket\"\n\
         quotas = \"1/second\"\nqueue_ms = 2000\n",
    );
    let handler =
        service_fn(|_: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))));
    let svc = rules
        .layer()
        .layer(tower::limit::ConcurrencyLimitLayer::new(1).layer(handler));
    let start = Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(request(Method::GET, "/q")));
    let queued = tokio::spawn(svc.clone().oneshot(request(Method::GET, "/q")));
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    tokio::task::yield_now().await;
    let res = svc
        .clone()
        .oneshot(request(Method::GET, "/other"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        Instant::now(),
        start,
        "answered at once, not after the queued request's departure"
    );
    assert_eq!(queued.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(Instant::now(), start + Duration::from_secs(1));
}

/// Regression: within the conversion horizon after a reload that changed a limit's quotas, a
/// reset cleared only the new rule's state, and the next request converted the old rule's spent
/// count back.
#[tokio::test(start_paused = true)]
async fn a_reset_after_a_quota_change_is_not_undone_by_the_conversion() {
    let file = |quotas: &str| {
        format!(
            "[[limit]]\nname = \"login\"\nkey = \"global\"\nstrategy = \"fixed-window-first-hit\"\n\
             quotas = \"{quotas}\"\n"
        )
    };
    let rules = rules(&file("2/hour"));
    let handler =
        service_fn(|_: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))));
    let svc = rules.layer().layer(handler);
    let status = || async {
        let res = svc.clone().oneshot(request(Method::POST, "/login")).await;
        res.unwrap().status()
    };
    assert_eq!(status().await, StatusCode::OK);
    assert_eq!(status().await, StatusCode::OK);
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    let report = rules.reload_text(&file("3/hour")).unwrap().unwrap();
    assert_eq!(report.converted, ["login"]);
    let (parts, ()) = Request::post("/login").body(()).unwrap().into_parts();
    rules.reset("login", &parts).await.unwrap().unwrap();
    for i in 0..3 {
        assert_eq!(
            status().await,
            StatusCode::OK,
            "request {i} after the reset"
        );
    }
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
}

/// A key evicted at the memory store's cap before a reload that changed its limit's quotas is
/// converted from what it spent (the conversion peeks the old rule's state, and a peek of an
/// evicted key answers from its record): it does not get the whole new limit again.
#[tokio::test(start_paused = true)]
async fn a_key_evicted_before_a_quota_change_keeps_what_it_spent() {
    let file = |quotas: &str| {
        format!(
            "[[limit]]\nname = \"l\"\nkey = \"header:x-k\"\nstrategy = \"fixed-window-first-hit\"\n\
             quotas = \"{quotas}\"\n"
        )
    };
    let rules = Rules::with_clock(
        &file("3/hour"),
        RulesOptions::default(),
        || MemoryStore::<Vec<u8>>::builder().max_keys(1).build(),
        TokioClock::new(),
    )
    .unwrap();
    let handler =
        service_fn(|_: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))));
    let svc = rules.layer().layer(handler);
    let status = |user: &'static str| {
        let svc = svc.clone();
        async move {
            let req = Request::post("/")
                .header("x-k", user)
                .body(Body::default())
                .unwrap();
            svc.oneshot(req).await.unwrap().status()
        }
    };
    assert_eq!(status("a").await, StatusCode::OK);
    assert_eq!(status("a").await, StatusCode::OK);
    // A cap of 1: b's state takes the place of a's (a had room left, so it is evicted).
    assert_eq!(status("b").await, StatusCode::OK);
    let report = rules.reload_text(&file("4/hour")).unwrap().unwrap();
    assert_eq!(report.converted, ["l"]);
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += usize::from(status("a").await == StatusCode::OK);
    }
    assert_eq!(admitted, 2, "a spent 2 of 3, then 4 an hour: 2 left");
}
