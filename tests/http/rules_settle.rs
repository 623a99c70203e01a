//! Settlement in a rules file (`settle`): which limits a handler's `Settle` marker settles (a limit
//! takes one named for it, an unnamed one only with `settle = "marker"`, otherwise the marker is
//! left to the layer around the file), a response header as the actual cost (`settle =
//! "header:NAME"`, debt carried), and shadow limits settling like enforced ones.

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use tollgate::RateLimiter;
use tollgate::key::GlobalKey;
use tollgate::layer::{RateLimitLayer, Settle};
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::MemoryStore;
use tower::{Layer as _, ServiceExt as _};

/// A request of client `k` (the files key by `x-k`) asking the handler for `marker` or a
/// reported `used` value.
fn req(k: &str, query: &str) -> Request<()> {
    Request::get(format!("/?{query}"))
        .header("x-k", k)
        .body(())
        .unwrap()
}

/// Answers `ok`; `?refund` marks the response `Settle::refund()`, `?refund=NAME` one for the
/// limiter `NAME`, `?used=N` reports `x-used: N` (`?used=N&twice`: the header twice).
async fn handler(req: Request<()>) -> Result<Response<String>, Infallible> {
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut res = Response::new(String::from("ok"));
    for pair in query.split('&') {
        match pair.split_once('=') {
            None if pair == "refund" => {
                res.extensions_mut().insert(Settle::refund());
            }
            Some(("refund", name)) => {
                res.extensions_mut()
                    .insert(Settle::refund().for_limiter(name.to_owned()));
            }
            Some(("used", n)) => {
                res.headers_mut().append("x-used", n.parse().unwrap());
                if query.contains("twice") {
                    res.headers_mut().append("x-used", n.parse().unwrap());
                }
            }
            _ => {}
        }
    }
    Ok(res)
}

/// What `limit` has left for client `k`.
async fn left(rules: &Rules, limit: &str, k: &str) -> u32 {
    let (parts, ()) = req(k, "").into_parts();
    rules
        .peek(limit, &parts)
        .await
        .unwrap()
        .unwrap()
        .remaining()
}

fn rules(text: &str) -> Rules {
    Rules::memory(text, RulesOptions::default()).unwrap()
}

#[tokio::test]
async fn an_unnamed_marker_settles_only_the_limits_marked_to_take_it() {
    let rules = rules(
        r#"
        [[limit]]
        name = "takes"
        key = "header:x-k"
        quotas = "10/hour"
        settle = "marker"

        [[limit]]
        name = "global"
        key = "global"
        quotas = "10/hour"
        "#,
    );
    let svc = rules.layer().layer(tower::service_fn(handler));
    for _ in 0..3 {
        let res = svc.clone().oneshot(req("a", "refund")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(
            res.extensions().get::<Settle>().is_none(),
            "taken by the file"
        );
    }
    assert_eq!(left(&rules, "takes", "a").await, 10, "refunded");
    assert_eq!(
        left(&rules, "global", "a").await,
        7,
        "a global limit keeps its count"
    );
    // A marker named for a limit settles it, whatever its `settle`.
    svc.clone()
        .oneshot(req("a", "refund=global"))
        .await
        .unwrap();
    assert_eq!(left(&rules, "global", "a").await, 7);
    assert_eq!(
        left(&rules, "takes", "a").await,
        9,
        "a marker for another limit"
    );
}

#[tokio::test]
async fn a_file_with_no_marker_limit_leaves_an_unnamed_marker_to_the_layer_around_it() {
    let rules =
        rules("[[limit]]\nname = \"per-client\"\nkey = \"header:x-k\"\nquotas = \"10/hour\"\n");
    let app: RateLimiter<(), MemoryStore<()>> = RateLimiter::builder()
        .name("app")
        .quotas("10/hour")
        .unwrap()
        .build()
        .unwrap();
    let svc = RateLimitLayer::new(app.clone(), GlobalKey)
        .layer(rules.layer().layer(tower::service_fn(handler)));
    for _ in 0..2 {
        let res = svc.clone().oneshot(req("a", "refund")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(
        left(&rules, "per-client", "a").await,
        8,
        "the file kept its count"
    );
    assert_eq!(
        app.check_now(&(), 0).remaining(),
        10,
        "the enclosing layer took the marker"
    );
}

#[tokio::test]
async fn a_settle_header_charges_what_the_response_reports_and_its_debt_carries() {
    let rules = rules(
        r#"
        [[limit]]
        name = "tokens"
        key = "header:x-k"
        strategy = "fixed-window"
        quotas = "100/hour"
        cost = 10
        settle = "header:x-used"
        "#,
    );
    let svc = rules.layer().layer(tower::service_fn(handler));
    let res = svc.clone().oneshot(req("a", "used=37")).await.unwrap();
    assert_eq!(
        res.headers()["x-ratelimit-remaining"],
        "63",
        "the settled state"
    );
    svc.clone().oneshot(req("a", "")).await.unwrap();
    assert_eq!(
        left(&rules, "tokens", "a").await,
        53,
        "no header: the estimate"
    );
    svc.clone().oneshot(req("a", "used=5&twice")).await.unwrap();
    assert_eq!(
        left(&rules, "tokens", "a").await,
        43,
        "a repeated header: the estimate"
    );
    svc.clone().oneshot(req("a", "used=500")).await.unwrap();
    assert_eq!(left(&rules, "tokens", "a").await, 0, "charged in full");
    let res = svc.clone().oneshot(req("a", "")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the debt carries"
    );
}

#[tokio::test]
async fn a_shadow_limit_settles_like_an_enforced_one() {
    let rules = rules(
        r#"
        [[limit]]
        name = "failures-next"
        key = "header:x-k"
        quotas = "10/hour"
        shadow = true
        settle = "marker"
        "#,
    );
    let svc = rules.layer().layer(tower::service_fn(handler));
    for _ in 0..3 {
        svc.clone().oneshot(req("a", "refund")).await.unwrap();
    }
    svc.clone().oneshot(req("a", "")).await.unwrap();
    assert_eq!(
        left(&rules, "failures-next", "a").await,
        9,
        "only the unmarked one counts"
    );
}
