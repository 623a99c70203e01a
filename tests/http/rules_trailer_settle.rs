//! A rules-file limit settled from a response trailer (`settle = "trailer:NAME"`): charged what
//! the trailer says once the body has ended; the estimate stands without a usable one.

use http_body_util::BodyExt;
use tollgate::rules::{Rules, RulesOptions};
use tower::{Layer, Service, ServiceExt};

use crate::support::WithTrailers;

/// One global limit of 100 an hour, cost 10, settled from the trailer `x-used`.
fn rules(name: &str) -> Rules {
    Rules::memory(
        &format!(
            "[[limit]]\nname = \"{name}\"\nkey = \"global\"\nstrategy = \"fixed-window\"\n\
             quotas = \"100/hour\"\ncost = 10\nsettle = \"trailer:x-used\"\n"
        ),
        RulesOptions::default(),
    )
    .unwrap()
}

/// `rules` around a handler whose body ends with the trailer `x-used` set to the request's
/// query (none when the query is empty).
fn service(
    rules: &Rules,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<tollgate::layer::ResponseBody<WithTrailers>>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone {
    rules
        .layer()
        .layer(tower::service_fn(|req: http::Request<()>| async move {
            let used = req.uri().query().unwrap_or("").to_owned();
            let mut trailers = http::HeaderMap::new();
            if !used.is_empty() {
                trailers.insert("x-used", used.parse().unwrap());
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(WithTrailers {
                data: Some(bytes::Bytes::from_static(b"answer")),
                trailers: Some(trailers),
            }))
        }))
}

fn call(query: &str) -> http::Request<()> {
    http::Request::get(format!("/?{query}")).body(()).unwrap()
}

/// What the limit `name` has left for the global key.
async fn remaining(rules: &Rules, name: &str) -> u32 {
    let parts = http::Request::get("/").body(()).unwrap().into_parts().0;
    rules.peek(name, &parts).await.unwrap().unwrap().remaining()
}

#[tokio::test]
async fn a_trailer_at_the_body_end_settles_a_file_limit() {
    let rules = rules("tokens");
    let svc = service(&rules);
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
    assert_eq!(
        remaining(&rules, "tokens").await,
        97,
        "settled to the trailer's 3"
    );
    // Above the budget: charged in full, the debt carries.
    let res = svc.clone().oneshot(call("500")).await.unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(remaining(&rules, "tokens").await, 0);
    let res = svc.clone().oneshot(call("1")).await.unwrap();
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn without_a_usable_trailer_the_estimate_stands() {
    let rules = rules("t");
    let svc = service(&rules);
    for bad in ["", "-1", "many"] {
        let res = svc.clone().oneshot(call(bad)).await.unwrap();
        res.into_body().collect().await.unwrap();
    }
    // A body dropped before its trailers leaves the estimate too.
    drop(svc.clone().oneshot(call("1")).await.unwrap());
    assert_eq!(remaining(&rules, "t").await, 60, "four estimates of 10");
}
