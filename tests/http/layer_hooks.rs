//! The layer's hooks written as closures without type annotations (the methods' bounds name the
//! `Fn(&Parts)` and `Fn(&Decision)` signatures), on a layer whose type names only its key: the
//! hooks are not part of it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::key::HeaderKey;
use tollgate::layer::RateLimitLayer;
use tollgate::{RateLimiter, Rule, Strategy};
use tower::{Layer, ServiceExt, service_fn};

/// 10 an hour per `x-user` (a token bucket: nothing comes back during the test), 100 with
/// `x-plan: paid`; a POST costs 4, `/health` is exempt, and the 429 is JSON.
fn limit() -> RateLimitLayer<HeaderKey> {
    let limiter = RateLimiter::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("10/hour")
        .unwrap()
        .build()
        .unwrap();
    let paid = Arc::new(Rule::parse(Strategy::TokenBucket, "100/hour").unwrap());
    RateLimitLayer::new(limiter, HeaderKey::new("x-user"))
        .cost(|parts| if parts.method == Method::POST { 4 } else { 1 })
        .skip(|parts| parts.uri.path() == "/health")
        .select_rule(move |parts| {
            let paying = parts.headers.get("x-plan").is_some_and(|v| v == "paid");
            paying.then(|| Arc::clone(&paid))
        })
        .on_rejected(|d| {
            let wait = d.retry_after_secs();
            let body = serde_json::json!({ "retry_in_secs": wait });
            (StatusCode::TOO_MANY_REQUESTS, Json(body))
        })
}

fn request(method: Method, path: &str, user: &str, plan: Option<&str>) -> Request<String> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("x-user", user);
    if let Some(plan) = plan {
        req = req.header("x-plan", plan);
    }
    req.body(String::new()).unwrap()
}

#[tokio::test]
async fn cost_skip_select_rule_and_on_rejected_closures_infer_their_argument_types() {
    let svc = limit().layer(service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new("ok".to_owned()))
    }));
    let send = |req| {
        let svc = svc.clone();
        async move { svc.oneshot(req).await.unwrap() }
    };
    let remaining = |res: &Response<_>| res.headers()["x-ratelimit-remaining"].clone();

    let res = send(request(Method::GET, "/", "a", None)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(remaining(&res), "9", "a GET costs 1");
    let res = send(request(Method::POST, "/", "a", None)).await;
    assert_eq!(remaining(&res), "5", "a POST costs 4");

    let res = send(request(Method::POST, "/health", "a", None)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        res.headers().get("x-ratelimit-remaining").is_none(),
        "an exempt request is not checked"
    );

    let res = send(request(Method::GET, "/", "b", Some("paid"))).await;
    assert_eq!(res.headers()["x-ratelimit-limit"], "100", "the paid rule");
    assert_eq!(remaining(&res), "99");

    let res = send(request(Method::POST, "/", "a", None)).await;
    assert_eq!(remaining(&res), "1", "the exempt POST cost nothing");
    let res = send(request(Method::POST, "/", "a", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/json");
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 0, "{retry}");
    assert_eq!(remaining(&res), "1", "the layer still adds the fields");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["retry_in_secs"], retry, "the closure's body: {body}");
}
