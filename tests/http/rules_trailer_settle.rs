//! A rules-file limit settled from a response trailer (`settle = "trailer:NAME"`): charged what
//! the trailer says once the body has ended; the estimate stands without a usable one.

use http_body_util::BodyExt;
use tollgate::rules::{Rules, RulesOptions};
use tower::{Layer, ServiceExt};

/// A body of one data frame, then trailers.
struct WithTrailers {
    data: Option<bytes::Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let frame = match self.data.take() {
            Some(d) => Some(http_body::Frame::data(d)),
            None => self.trailers.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }
}

#[tokio::test]
async fn a_trailer_at_the_body_end_settles_a_file_limit() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "tokens"
        key = "global"
        strategy = "fixed-window"
        quotas = "100/hour"
        cost = 10
        settle = "trailer:x-used"
        "#,
        RulesOptions::default(),
    )
    .unwrap();
    let svc = rules
        .layer()
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
    let remaining = || async {
        let parts = http::Request::get("/").body(()).unwrap().into_parts().0;
        rules
            .peek("tokens", &parts)
            .await
            .unwrap()
            .unwrap()
            .remaining()
    };
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
    assert_eq!(remaining().await, 97, "settled to the trailer's 3");
    // Above the budget: charged in full, the debt carries.
    svc.clone()
        .oneshot(call("500"))
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    assert_eq!(remaining().await, 0);
    let res = svc.clone().oneshot(call("1")).await.unwrap();
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn without_a_usable_trailer_the_estimate_stands() {
    let rules = Rules::memory(
        "[[limit]]\nname = \"t\"\nkey = \"global\"\nstrategy = \"fixed-window\"\nquotas = \"100/hour\"\ncost = 10\nsettle = \"trailer:x-used\"\n",
        RulesOptions::default(),
    )
    .unwrap();
    let svc = rules
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
        }));
    for bad in ["", "-1", "many"] {
        let res = svc
            .clone()
            .oneshot(http::Request::get(format!("/?{bad}")).body(()).unwrap())
            .await
            .unwrap();
        res.into_body().collect().await.unwrap();
    }
    // A body dropped before its trailers leaves the estimate too.
    drop(
        svc.clone()
            .oneshot(http::Request::get("/?1").body(()).unwrap())
            .await
            .unwrap(),
    );
    let parts = http::Request::get("/").body(()).unwrap().into_parts().0;
    let left = rules.peek("t", &parts).await.unwrap().unwrap().remaining();
    assert_eq!(left, 60, "four estimates of 10");
}
