//! Headers across stacked limiters: on an allowed response the `x-ratelimit-*` fields are the
//! limiter's with the fewest remaining (ties: the later reset), and every limiter adds its items
//! to the IETF fields; a 429 carries the rejecting limiter's fields. The same with a rules layer
//! among the plain ones, and with a middleware between two layers that rebuilds the request.

use std::convert::Infallible;
use std::future::ready;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::GlobalKey;
use tollgate::layer::{HeaderStyle, Headers, RateLimitLayer, ResetFormat};
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::MemoryStore;
use tollgate::{ManualClock, RateLimiter, Strategy};
use tower::{Layer, ServiceExt, service_fn};

const T0: Duration = Duration::from_secs(1_699_999_980);

type Body = Full<Bytes>;

fn limiter(
    name: &str,
    quotas: &str,
    clock: &ManualClock,
) -> RateLimiter<(), tollgate::store::MemoryStore<()>, ManualClock> {
    RateLimiter::builder()
        .name(name)
        .strategy(Strategy::FixedWindow)
        .quotas(quotas)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn ok()
-> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone {
    service_fn(|_req: Request<Body>| ready(Ok::<_, Infallible>(Response::new(Body::default()))))
}

fn get() -> Request<Body> {
    Request::get("/").body(Body::default()).unwrap()
}

#[tokio::test]
async fn an_allowed_response_shows_the_budget_that_runs_out_first() {
    // Per IP 100/minute outside, the plan's 3/minute inside: the client must see the plan's.
    let clock = ManualClock::new(T0);
    let plan = RateLimitLayer::new(limiter("plan", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    let ip = RateLimitLayer::new(limiter("ip", "100/minute; 1000/hour", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    let svc = ip.layer(plan.layer(ok()));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-limit"], "3");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"plan\";q=3;w=60, \"ip-0\";q=100;w=60, \"ip-1\";q=1000;w=3600"
    );
    assert_eq!(
        res.headers()["ratelimit"],
        "\"plan\";r=2;t=60, \"ip-0\";r=99;t=60"
    );
    svc.clone().oneshot(get()).await.unwrap();
    svc.clone().oneshot(get()).await.unwrap();
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["x-ratelimit-limit"],
        "3",
        "the rejecting limiter's fields"
    );
    assert_eq!(res.headers()["retry-after"], "60");
}

#[tokio::test]
async fn the_outer_limiter_reports_when_it_has_fewer_left() {
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(limiter("inner", "50/minute", &clock), GlobalKey);
    let outer = RateLimitLayer::new(limiter("outer", "2/minute", &clock), GlobalKey);
    let svc = outer.layer(inner.layer(ok()));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
}

#[tokio::test]
async fn stacked_limiters_sharing_a_name_get_unique_item_names() {
    // Three limiters named "api" (each on its own store): the inner one keeps the name, the
    // others take the first free suffix; a `qu` holding a comma does not confuse the names.
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(limiter("api", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Ietf));
    let middle = RateLimitLayer::new(limiter("api", "100/minute", &clock), GlobalKey).headers(
        Headers::new()
            .style(HeaderStyle::Ietf)
            .quota_unit("a, \"b\""),
    );
    let outer = RateLimitLayer::new(
        limiter("api", "10/second; 1000/hour; 5000/day", &clock),
        GlobalKey,
    )
    .headers(Headers::new().style(HeaderStyle::Ietf));
    let svc = outer.layer(middle.layer(inner.layer(ok())));
    for _ in 0..2 {
        // The same names on every response.
        let res = svc.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()["ratelimit-policy"],
            "\"api\";q=3;w=60, \"api-2\";q=100;qu=\"a, \\\"b\\\"\";w=60, \
             \"api-2-0\";q=10;w=1, \"api-2-1\";q=1000;w=3600, \"api-2-2\";q=5000;w=86400"
        );
        let rate = res.headers()["ratelimit"].to_str().unwrap().to_owned();
        let names: Vec<&str> = rate
            .split(", ")
            .map(|item| item.split(';').next().unwrap())
            .collect();
        assert_eq!(names, ["\"api\"", "\"api-2\"", "\"api-2-0\""]);
    }
}

/// Regression: an inner layer reported what it wrote only when the request arrived marked by an
/// enclosing layer, so a middleware between the two that rebuilt the request (dropping its
/// extensions) let the outer layer overwrite the inner's tighter fields.
#[tokio::test]
async fn a_middleware_rebuilding_the_request_between_layers_keeps_the_tighter_fields() {
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(limiter("inner", "2/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    let outer = RateLimitLayer::new(limiter("outer", "5/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    // A fresh request: method, URI and headers only, as a retry policy's `clone_request` makes.
    let rebuild = tower::util::MapRequestLayer::new(|req: Request<Body>| {
        let mut fresh = Request::builder()
            .method(req.method().clone())
            .uri(req.uri().clone())
            .body(Body::default())
            .unwrap();
        *fresh.headers_mut() = req.headers().clone();
        fresh
    });
    let svc = outer.layer(rebuild.layer(inner.layer(ok())));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    assert_eq!(
        res.headers()["ratelimit"],
        "\"inner\";r=1;t=60, \"outer\";r=4;t=60"
    );
}

fn rules(text: &str, clock: &ManualClock) -> Rules<MemoryStore<Vec<u8>>, ManualClock> {
    let options = RulesOptions {
        header_style: HeaderStyle::Both,
        ..RulesOptions::default()
    };
    Rules::with_clock(text, options, MemoryStore::new, clock.clone()).unwrap()
}

const RULES_100: &str = "[[limit]]\nname = \"rules\"\nkey = \"global\"\n\
                         strategy = \"fixed-window\"\nquotas = \"100/minute\"\n";

/// Regression: a rules layer around a plain layer wrote its own fields over the inner layer's
/// (never reading what it reported), dropping the inner IETF items.
#[tokio::test]
async fn a_rules_layer_around_a_plain_layer_keeps_the_tighter_fields_and_the_inner_items() {
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(limiter("inner", "2/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    let svc = rules(RULES_100, &clock).layer().layer(inner.layer(ok()));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"inner\";q=2;w=60, \"rules\";q=100;w=60"
    );
    assert_eq!(
        res.headers()["ratelimit"],
        "\"inner\";r=1;t=60, \"rules\";r=99;t=60"
    );
}

/// Regression: with a rules layer between two plain layers, the rules layer wrote its fields over
/// the inner layer's and left the inner's report in place, so the outer layer compared itself with
/// the inner's numbers while the response showed the rules layer's; a rejection by the inner layer
/// keeps its own fields through both.
#[tokio::test]
async fn a_rules_layer_between_plain_layers_passes_on_the_tightest_fields() {
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(limiter("inner", "2/minute", &clock), GlobalKey);
    let outer = RateLimitLayer::new(limiter("outer", "50/minute", &clock), GlobalKey);
    let svc = outer.layer(rules(RULES_100, &clock).layer().layer(inner.layer(ok())));
    for left in ["1", "0"] {
        let res = svc.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-limit"], "2");
        assert_eq!(res.headers()["x-ratelimit-remaining"], left);
    }
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["x-ratelimit-limit"],
        "2",
        "the inner 429's fields"
    );
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(res.headers()["retry-after"], "60");
}

/// Regression: a plain layer around a rules layer wrote its own fields over the rules layer's `429`
/// (which carried no [`Decision`](tollgate::Decision), only its `RejectedBy`).
#[tokio::test]
async fn a_rules_layers_rejection_keeps_its_fields_under_a_plain_layer() {
    let clock = ManualClock::new(T0);
    let outer = RateLimitLayer::new(limiter("outer", "50/minute", &clock), GlobalKey);
    let one = "[[limit]]\nname = \"rules\"\nkey = \"global\"\n\
               strategy = \"fixed-window\"\nquotas = \"1/minute\"\n";
    let svc = outer.layer(rules(one, &clock).layer().layer(ok()));
    assert_eq!(
        svc.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["x-ratelimit-limit"],
        "1",
        "the rules layer's 429"
    );
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(res.headers()["retry-after"], "60");
}

/// What an inner service wrote in the rate-limit fields itself (a proxied upstream's, an app's own)
/// is replaced, even when it shows fewer remaining than the layer: only what a tollgate layer inside
/// reported (the `Reported` extension) is merged. This is why the fields cannot stand in for that
/// extension: an enclosing layer reading `x-ratelimit-remaining: 0` cannot tell an inner limiter's
/// from the application's (BENCHMARKS.md, "HTTP").
#[tokio::test]
async fn an_inner_services_own_fields_are_replaced_even_when_tighter() {
    let clock = ManualClock::new(T0);
    let layer = RateLimitLayer::new(limiter("api", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    let app = service_fn(|_req: Request<Body>| {
        let res = Response::builder()
            .header("x-ratelimit-limit", "1")
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-reset", "5")
            .header("ratelimit-policy", "\"upstream\";q=1;w=5")
            .header("ratelimit", "\"upstream\";r=0;t=5")
            .body(Body::default())
            .unwrap();
        ready(Ok::<_, Infallible>(res))
    });
    let res = layer.layer(app).oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let one = |name: &str| {
        let all: Vec<_> = res.headers().get_all(name).iter().collect();
        assert_eq!(
            all.len(),
            1,
            "{name}: one field, not the inner service's too"
        );
        all[0].to_str().unwrap().to_owned()
    };
    assert_eq!(one("x-ratelimit-limit"), "3");
    assert_eq!(one("x-ratelimit-remaining"), "2");
    assert_eq!(one("x-ratelimit-reset"), "60");
    assert_eq!(one("ratelimit-policy"), "\"api\";q=3;w=60");
    assert_eq!(one("ratelimit"), "\"api\";r=2;t=60");
}

#[tokio::test]
async fn an_ietf_only_inner_limiter_that_runs_out_first_fills_the_outer_x_ratelimit_fields() {
    // The inner plan writes the IETF fields only; the outer per-IP layer asks for `x-ratelimit-*`
    // too. Before, the tighter inner limiter won and nobody wrote `x-ratelimit-*`: none at all.
    let clock = ManualClock::new(T0);
    let plan = RateLimitLayer::new(limiter("plan", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Ietf));
    let ip = RateLimitLayer::new(limiter("ip", "100/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Both));
    let svc = ip.layer(plan.layer(ok()));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-limit"], "3");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    assert_eq!(res.headers()["x-ratelimit-reset"], "60");
    assert_eq!(
        res.headers()["ratelimit"],
        "\"plan\";r=2;t=60, \"ip\";r=99;t=60"
    );
    // The outer limiter wins once it has fewer left: its own fields.
    let ip = RateLimitLayer::new(limiter("ip2", "1/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::XRateLimit));
    let plan = RateLimitLayer::new(limiter("plan2", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Ietf));
    let res = ip.layer(plan.layer(ok())).oneshot(get()).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
}

#[tokio::test]
async fn an_ietf_only_limiter_between_two_x_ratelimit_ones_that_runs_out_first_fills_them() {
    // Review r3: three layers. The innermost writes `x-ratelimit-*` (50 a minute), the middle one
    // the IETF fields only (3 a minute, the tightest), the outer one `x-ratelimit-*` (100 a
    // minute). The module's rule: the `x-ratelimit-*` fields are the limiter's with the fewest
    // remaining, here the middle one's (2 left). The fix for an IETF-only inner limiter only
    // writes them when the response has none; here the innermost limiter's fields are there.
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(limiter("inner", "50/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::XRateLimit));
    let plan = RateLimitLayer::new(limiter("plan", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Ietf));
    let ip = RateLimitLayer::new(limiter("ip", "100/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::XRateLimit));
    let svc = ip.layer(plan.layer(inner.layer(ok())));
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"plan\";r=2;t=60");
    assert_eq!(
        (
            res.headers()["x-ratelimit-limit"].to_str().unwrap(),
            res.headers()["x-ratelimit-remaining"].to_str().unwrap()
        ),
        ("3", "2"),
        "the x-ratelimit-* fields are the tightest limiter's (plan: 2 left)"
    );
}

#[tokio::test]
async fn an_ietf_only_inner_report_in_unix_reset_format() {
    // Review r3 (passes): the outer layer writes the tighter IETF-only inner limiter's reset as a
    // Unix time, as of its own decision (one clock here): the inner window's end, T0 + 60 s.
    let clock = ManualClock::new(T0);
    clock.advance(Duration::from_millis(12_345));
    let plan = RateLimitLayer::new(limiter("plan", "3/minute", &clock), GlobalKey)
        .headers(Headers::new().style(HeaderStyle::Ietf));
    let ip = RateLimitLayer::new(limiter("ip", "100/hour", &clock), GlobalKey).headers(
        Headers::new()
            .style(HeaderStyle::XRateLimit)
            .reset_format(ResetFormat::Unix),
    );
    let res = ip.layer(plan.layer(ok())).oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    assert_eq!(
        res.headers()["x-ratelimit-reset"],
        (T0.as_secs() + 60).to_string().as_str()
    );
}
