//! The layer at the service level (`oneshot`): hooks, failure policies, pacing, and properties.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tollgate::key::{ExtensionKey, ForwardedIp, GlobalKey, HeaderKey, PeerAddr};
use tollgate::layer::{FailurePolicy, Pacing, RateLimitLayer, Settle};
use tollgate::store::{Answer, LimiterNames, Scope, Store};
use tollgate::{
    Decision, ManualClock, Outcome, RateLimiter, Rule, Stats, StoreError, StoreErrorKind, Strategy,
    TokioClock,
};
use tower::{Layer, Service, ServiceExt, service_fn};

const T0: Duration = Duration::from_secs(1_699_999_980);

type Body = Full<Bytes>;

fn limiter<K: tollgate::store::StoreKey>(
    strategy: Strategy,
    quotas: &str,
    clock: &ManualClock,
) -> RateLimiter<K, tollgate::store::MemoryStore<K>, ManualClock> {
    RateLimiter::builder()
        .strategy(strategy)
        .quotas(quotas)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// An echo service that answers "ok" and counts its calls; it reports the request's decision.
fn echo(
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(move |req: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let left = Decision::from_extensions(req.extensions())
            .map_or("none".to_owned(), |d| d.remaining().to_string());
        ready(Ok::<_, Infallible>(Response::new(Body::from(format!(
            "ok, {left} left"
        )))))
    })
}

/// An allowed response's `x-ratelimit-limit` and `x-ratelimit-remaining`.
fn x_fields<B>(res: &Response<B>) -> (&str, &str) {
    let field = |name| res.headers()[name].to_str().unwrap();
    (field("x-ratelimit-limit"), field("x-ratelimit-remaining"))
}

fn get() -> Request<Body> {
    Request::get("/").body(Body::default()).unwrap()
}

async fn body<B: http_body::Body>(res: Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn the_decision_reaches_handlers_and_rejections() {
    let clock = ManualClock::new(T0);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "2/minute", &clock),
        GlobalKey,
    )
    .layer(echo(calls.clone()));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(body(res).await, "ok, 1 left");
    svc.clone().oneshot(get()).await.unwrap();
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let d = res.extensions().get::<Decision>().copied().unwrap();
    assert_eq!(
        (d.outcome(), d.retry_after_secs()),
        (Outcome::Rejected, Some(60))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Handlers read the admitting decision as an axum extractor (`Decision`, `Option<Decision>`) or
/// with `Decision::from_extensions`; under stacked layers, the innermost one's. The layers add one
/// extension to the request, whatever they carry. Without a layer, `Option<Decision>` is `None`
/// and `Decision` answers 500.
#[tokio::test]
async fn handlers_read_the_innermost_decision_from_one_request_extension() {
    use axum::routing::get;
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "3/minute", &clock),
        GlobalKey,
    );
    let outer = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "10/minute", &clock),
        GlobalKey,
    );
    let app = axum::Router::new()
        .route(
            "/",
            get(|d: Decision, parts: http::request::Parts| async move {
                let extensions = parts.extensions.len();
                let same = Decision::from_extensions(&parts.extensions) == Some(d);
                format!(
                    "{} of {}, {extensions} extension(s), {same}",
                    d.remaining(),
                    d.limit()
                )
            }),
        )
        .route(
            "/optional",
            get(|d: Option<Decision>| async move { format!("{:?}", d.map(|d| d.remaining())) }),
        )
        .layer(inner)
        .layer(outer);
    let req = |path: &str| Request::get(path).body(axum::body::Body::empty()).unwrap();
    let text = |res: Response<axum::body::Body>| async move {
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    };
    let bare = axum::Router::new()
        .route(
            "/",
            get(|d: Decision| async move { d.remaining().to_string() }),
        )
        .route(
            "/optional",
            get(|d: Option<Decision>| async move { format!("{:?}", d.map(|d| d.remaining())) }),
        )
        .route(
            "/count",
            get(|parts: http::request::Parts| async move { parts.extensions.len().to_string() }),
        );
    // The two layers add one marker between them to what axum puts there.
    let axums: usize = text(bare.clone().oneshot(req("/count")).await.unwrap())
        .await
        .parse()
        .unwrap();
    let res = app.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        text(res).await,
        format!("2 of 3, {} extension(s), true", axums + 1)
    );
    let res = app.clone().oneshot(req("/optional")).await.unwrap();
    assert_eq!(text(res).await, "Some(1)");

    let res = bare.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let res = bare.oneshot(req("/optional")).await.unwrap();
    assert_eq!(text(res).await, "None");
}

/// A layer alone in its process adds nothing to an allowed response's extensions (no layer can
/// enclose it: the report for one is skipped) and no `Decision` (a rejection's), and its headers
/// come. Once another layer lives, it reports (it cannot tell whether that one encloses it: a
/// middleware between the two may rebuild the request), and under an enclosing layer on another
/// limiter the fields are the budget that runs out first. In a process of its own: the count of
/// live layers is the process's.
#[tokio::test]
async fn a_lone_layer_reports_for_an_enclosing_one_on_an_allowed_response() {
    if !crate::logs::alone(
        "layer_service::a_lone_layer_reports_for_an_enclosing_one_on_an_allowed_response",
    ) {
        return;
    }
    let clock = ManualClock::new(T0);
    let calls = Arc::new(AtomicUsize::new(0));
    let inner_limiter = limiter::<()>(Strategy::FixedWindow, "3/minute", &clock);
    let svc = RateLimitLayer::new(inner_limiter.clone(), GlobalKey).layer(echo(calls.clone()));
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().len(), 0, "{:?}", res.extensions());
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    let outer_layer = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "5/minute", &clock),
        GlobalKey,
    );
    // Another layer lives: the lone one reports what it wrote, and still no `Decision`.
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.extensions().len(), 1, "{:?}", res.extensions());
    assert!(res.extensions().get::<Decision>().is_none());
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    let outer = outer_layer.layer(svc);
    let res = outer.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        x_fields(&res),
        ("3", "0"),
        "the inner limiter has fewer left"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A clone of a layer with a rule of its own, nested in the layer it was cloned from: one origin,
/// so the count of live layers is one, yet the inner one is enclosed (the outer one's count marker
/// says so) and reports: the client sees the budget that runs out first. In a process of its own.
#[tokio::test]
async fn a_clone_with_a_rule_of_its_own_reports_to_the_layer_around_it() {
    if !crate::logs::alone(
        "layer_service::a_clone_with_a_rule_of_its_own_reports_to_the_layer_around_it",
    ) {
        return;
    }
    let clock = ManualClock::new(T0);
    let calls = Arc::new(AtomicUsize::new(0));
    let base = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "100/minute", &clock),
        GlobalKey,
    );
    let strict = Arc::new(tollgate::Rule::parse(Strategy::FixedWindow, "3/minute").unwrap());
    let inner = base
        .clone()
        .select_rule(move |_: &http::request::Parts| Some(strict.clone()));
    let app = base.layer(inner.layer(echo(calls.clone())));
    drop(base);
    // Both rules count on the limiter's one state for the key (the marker counts a request once
    // per limiter and rule): 2 of the strict rule's 3 are spent after one request.
    let res = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(x_fields(&res), ("3", "1"), "the inner rule has fewer left");
    let res = app.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A cost above what the quota can ever admit: 429, the quota's fields, no Retry-After, a body
/// that says so. Cost 0 is a peek.
#[tokio::test]
async fn costs_from_the_request() {
    let clock = ManualClock::new(T0);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = RateLimitLayer::new(
        limiter::<()>(Strategy::TokenBucket, "10/minute", &clock),
        GlobalKey,
    )
    .cost(|p: &http::request::Parts| {
        p.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
    .layer(echo(calls.clone()));
    let with_cost = |c: &str| {
        Request::get("/")
            .header("x-cost", c)
            .body(Body::default())
            .unwrap()
    };
    let res = svc.clone().oneshot(with_cost("4")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "6");
    let res = svc.clone().oneshot(with_cost("0")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "6");
    let res = svc.clone().oneshot(with_cost("11")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers().get("retry-after"), None);
    assert_eq!(res.headers()["x-ratelimit-limit"], "10");
    assert_eq!(
        res.extensions().get::<Decision>().unwrap().outcome(),
        Outcome::Exceeds
    );
    assert!(body(res).await.contains("exceeds the rate limit"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn skipped_requests_pass_without_a_check() {
    let clock = ManualClock::new(T0);
    let lim = limiter::<()>(Strategy::FixedWindow, "1/minute", &clock);
    let svc = RateLimitLayer::new(lim.clone(), GlobalKey)
        .skip(|p: &http::request::Parts| {
            p.uri.path() == "/health" || p.method == http::Method::OPTIONS
        })
        .layer(echo(Arc::default()));
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(Request::get("/health").body(Body::default()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers().get("x-ratelimit-limit"), None);
    }
    assert_eq!(lim.peek_now(&()).remaining(), 1, "nothing counted");
}

/// Tiers: the rule comes from the request.
#[tokio::test]
async fn rules_chosen_per_request() {
    let clock = ManualClock::new(T0);
    let pro = Arc::new(Rule::parse(Strategy::FixedWindow, "5/minute").unwrap());
    let svc = RateLimitLayer::new(
        limiter(Strategy::FixedWindow, "1/minute", &clock),
        HeaderKey::new("x-user"),
    )
    .select_rule(move |p: &http::request::Parts| {
        (p.headers.get("x-plan").map(|v| v.as_bytes()) == Some(b"pro")).then(|| pro.clone())
    })
    .layer(echo(Arc::default()));
    let req = |user: &str, plan: &str| {
        Request::get("/")
            .header("x-user", user)
            .header("x-plan", plan)
            .body(Body::default())
            .unwrap()
    };
    let res = svc.clone().oneshot(req("a", "pro")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "5");
    let res = svc.clone().oneshot(req("b", "free")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    assert_eq!(
        svc.clone()
            .oneshot(req("b", "free"))
            .await
            .unwrap()
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        svc.clone().oneshot(req("a", "pro")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn custom_rejections_get_the_headers_too() {
    let clock = ManualClock::new(T0);
    let svc = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "1/minute", &clock),
        GlobalKey,
    )
    .on_rejected(|d: &Decision| {
        let mut res = Response::new(Body::from(format!(
            "{{\"wait\":{}}}",
            d.retry_after_secs().unwrap_or(0)
        )));
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        res.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        res
    })
    .layer(echo(Arc::default()));
    svc.clone().oneshot(get()).await.unwrap();
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(body(res).await, "{\"wait\":60}");
}

/// Settlement hook: a response marked with `Settle::refund()` gives its cost back; headers show it.
#[tokio::test]
async fn marked_responses_are_refunded() {
    let clock = ManualClock::new(T0);
    let lim = limiter::<()>(Strategy::FixedWindow, "3/minute", &clock);
    let inner = service_fn(|req: Request<Body>| {
        let ok = req.uri().path() == "/ok";
        ready(Ok::<_, Infallible>({
            let mut res = Response::new(Body::default());
            if ok {
                res.extensions_mut().insert(Settle::refund());
            }
            res
        }))
    });
    let svc = RateLimitLayer::new(lim.clone(), GlobalKey).layer(inner);
    for _ in 0..5 {
        let res = svc
            .clone()
            .oneshot(Request::get("/ok").body(Body::default()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-remaining"], "3");
    }
    let res = svc
        .clone()
        .oneshot(Request::get("/fail").body(Body::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    assert_eq!(lim.peek_now(&()).remaining(), 2);
}

/// Regression (found by the login tests): an outer layer's allowed-path header writing removed
/// the Retry-After of an inner layer's 429 and replaced its fields.
#[tokio::test]
async fn an_inner_rejection_keeps_its_fields_under_an_outer_layer() {
    let clock = ManualClock::new(T0);
    let inner = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "1/minute", &clock),
        GlobalKey,
    );
    let outer = RateLimitLayer::new(
        limiter::<()>(Strategy::FixedWindow, "100/day", &clock),
        GlobalKey,
    );
    let svc = outer.layer(inner.layer(echo(Arc::default())));
    svc.clone().oneshot(get()).await.unwrap();
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
}

/// A store that always fails.
#[derive(Debug, Default)]
struct DownStore(LimiterNames);

impl<K> Store<K> for DownStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn apply(&self, _: &K, _: Scope<'_>, _: tollgate::Op, _: u64) -> Answer<Self::Future> {
        Answer::now(Err(StoreError::new(StoreErrorKind::Connection, "down")))
    }

    fn names(&self) -> &LimiterNames {
        &self.0
    }

    fn stats(&self) -> Stats {
        Stats::default()
    }
}

/// Fail-open passes carry no rate-limit headers and are counted; fail-closed answers 503
/// without calling the inner service.
#[tokio::test]
async fn store_failures_follow_the_policy() {
    let lim: RateLimiter<(), DownStore, ManualClock> = RateLimiter::builder()
        .quotas("1/minute")
        .unwrap()
        .store(DownStore::default())
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let open = RateLimitLayer::new(lim.clone(), GlobalKey).layer(echo(calls.clone()));
    for _ in 0..3 {
        let res = open.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers().get("x-ratelimit-remaining"), None);
        assert_eq!(res.headers().get("retry-after"), None);
        assert_eq!(
            body(res).await,
            "ok, none left",
            "no Decision for the handler"
        );
    }
    assert_eq!(lim.stats().fail_open, 3);
    let closed = RateLimitLayer::new(lim.clone(), GlobalKey)
        .failure_policy(FailurePolicy::FailClosed)
        .layer(echo(calls.clone()));
    let res = closed.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.extensions().get::<StoreError>().is_some());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "fail-closed never reaches the inner service"
    );
}

/// Pacing mode waits up to the maximum delay for a slot, then rejects; waiters are counted and
/// released.
#[tokio::test(start_paused = true)]
async fn pacing_mode_waits_for_a_slot_then_rejects() {
    let lim = RateLimiter::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("1/second")
        .unwrap()
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(lim, GlobalKey)
        .pacing(Pacing::Delay(Duration::from_secs(2)))
        .unwrap();
    let svc = layer.clone().layer(echo(Arc::default()));
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let res = svc.oneshot(get()).await.unwrap();
                (res.status(), start.elapsed())
            })
        })
        .collect();
    tokio::task::yield_now().await;
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out.sort_by_key(|(s, e)| (*e, s.as_u16()));
    let statuses: Vec<_> = out.iter().map(|(s, _)| s.as_u16()).collect();
    let ok_times: Vec<_> = out
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .map(|(_, e)| e.as_secs())
        .collect();
    assert_eq!(ok_times, [0, 1, 2], "one slot per second: {out:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 1);
    assert!(
        out.iter().all(|(_, e)| *e <= Duration::from_secs(2)),
        "no wait beyond the max"
    );
    assert_eq!(layer.stats().waiting, 0);
}

/// 10^4 waiting requests, half cancelled: waits stay within the maximum, cancelled waiters
/// free their slot, and no waiter is left behind.
#[tokio::test(start_paused = true)]
async fn cancelled_waiters_give_their_place_back() {
    let lim = RateLimiter::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("10/second")
        .unwrap()
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(lim, GlobalKey)
        .pacing(Pacing::Delay(Duration::from_secs(2)))
        .unwrap();
    let svc = layer.clone().layer(echo(Arc::default()));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10_000 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let res = svc.oneshot(get()).await.unwrap();
            (res.status(), start.elapsed())
        }));
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        layer.stats().waiting,
        10_000 - 10,
        "all but the first 10 wait"
    );
    for t in tasks.iter().skip(1).step_by(2) {
        t.abort();
    }
    let mut ok = 0;
    let mut rejected = 0;
    let mut cancelled = 0;
    for t in tasks {
        match t.await {
            Ok((StatusCode::OK, e)) => {
                assert!(e <= Duration::from_secs(2));
                ok += 1;
            }
            Ok((StatusCode::TOO_MANY_REQUESTS, e)) => {
                assert!(e <= Duration::from_secs(2));
                rejected += 1;
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                assert!(e.is_cancelled());
                cancelled += 1;
            }
        }
    }
    // 10 at once (5 of them had finished before the abort), then 10/s for 2 s: the cancelled
    // waiters took none of those slots.
    assert_eq!(cancelled, 5_000 - 5);
    assert_eq!(ok, 30, "admitted");
    assert_eq!(ok + rejected + cancelled, 10_000);
    assert_eq!(layer.stats().waiting, 0, "no waiter left");
}

/// The response body may be any type `From<String>`: axum's `Body` too.
#[tokio::test]
async fn axum_body_works() {
    let clock = ManualClock::new(T0);
    let svc = RateLimitLayer::new(
        limiter::<u64>(Strategy::FixedWindow, "1/minute", &clock),
        ExtensionKey::<u64>::new(),
    )
    .layer(service_fn(|_req: Request<axum::body::Body>| async {
        Ok::<_, Infallible>(Response::new(axum::body::Body::from("ok")))
    }));
    let req = || {
        let mut r = Request::get("/").body(axum::body::Body::empty()).unwrap();
        r.extensions_mut().insert(7u64);
        r
    };
    assert_eq!(
        svc.clone().oneshot(req()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(req()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let missing = Request::get("/").body(axum::body::Body::empty()).unwrap();
    assert_eq!(
        svc.oneshot(missing).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// For every strategy and costs up to the limit, after some traffic: waiting exactly
    /// Retry-After admits a request of the same cost; one second less does not (waits >= 2 s).
    #[test]
    fn retry_after_is_sufficient_and_tight(
        strategy in prop::sample::select(Strategy::ALL.to_vec()),
        limit in 1u32..8,
        period in prop::sample::select(vec![1u64, 7, 60, 3600]),
        offset_ms in 0u64..60_000,
        pre in prop::collection::vec((0u64..5_000, 1u32..4), 0..12),
        cost_pick in 1u32..8,
    ) {
        let cost = cost_pick.min(limit);
        let clock = ManualClock::new(T0 + Duration::from_millis(offset_ms));
        let lim = limiter::<()>(strategy, &format!("{limit}/{period}s"), &clock);
        let svc = RateLimitLayer::new(lim, GlobalKey)
            .cost(move |p: &http::request::Parts| p.headers.get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(cost))
            .layer(echo(Arc::default()));
        run(async {
            for (gap, c) in pre {
                clock.advance(Duration::from_millis(gap));
                let req = Request::get("/").header("x-cost", c.min(limit).to_string()).body(Body::default()).unwrap();
                svc.clone().oneshot(req).await.unwrap();
            }
            let mut res = svc.clone().oneshot(get()).await.unwrap();
            let mut guard = 0;
            while res.status() == StatusCode::OK {
                res = svc.clone().oneshot(get()).await.unwrap();
                guard += 1;
                prop_assert!(guard < 100);
            }
            prop_assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            let retry: u64 = res.headers()["retry-after"].to_str().unwrap().parse().unwrap();
            prop_assert!(retry >= 1);
            let reset: u64 = res.headers()["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
            prop_assert!(reset >= retry, "reset {} < retry {}", reset, retry);
            if retry >= 2 {
                clock.advance(Duration::from_secs(retry - 1));
                let early = svc.clone().oneshot(get()).await.unwrap();
                prop_assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS, "{} admitted 1 s early", strategy);
                clock.advance(Duration::from_secs(1));
            } else {
                clock.advance(Duration::from_secs(retry));
            }
            let later = svc.clone().oneshot(get()).await.unwrap();
            prop_assert_eq!(later.status(), StatusCode::OK, "{} not admitted after Retry-After", strategy);
            Ok(())
        })?;
    }

    /// Arbitrary requests (methods, paths, header names and bytes, peers) never
    /// make the layer panic; every answer is 200, 400 or 429.
    #[test]
    fn arbitrary_requests_never_panic(
        method in "[A-Z]{1,8}",
        path in "/[a-zA-Z0-9%/._~-]{0,40}",
        headers in prop::collection::vec((
            prop::sample::select(vec!["x-forwarded-for", "forwarded", "x-real-ip", "x-api-key", "x-other"]),
            prop::collection::vec(any::<u8>(), 0..80),
        ), 0..8),
        peer in prop::option::of(any::<(u8, u8, u16)>()),
    ) {
        let clock = ManualClock::new(T0);
        let key = (ForwardedIp::new(["10.0.0.0/8", "fd00::/8"]).unwrap(), HeaderKey::new("x-api-key"));
        let svc = RateLimitLayer::new(limiter(Strategy::SlidingWindow, "2/s", &clock), key)
            .layer(echo(Arc::default()));
        let mut b = Request::builder().method(method.as_str()).uri(path.as_str());
        for (name, value) in &headers {
            if let Ok(v) = http::HeaderValue::from_bytes(value) {
                b = b.header(*name, v);
            }
        }
        let mut req = b.body(Body::default()).unwrap();
        if let Some((a, b, port)) = peer {
            let addr = SocketAddr::from(([10, a, b, 1], port));
            req.extensions_mut().insert(PeerAddr::new(addr));
        }
        let status = run(svc.oneshot(req)).unwrap().status();
        prop_assert!([200u16, 400, 429].contains(&status.as_u16()), "{}", status);
    }
}

/// Regression (review): a paced request kept the inner service it had polled ready while it slept,
/// so capacity reserved by `poll_ready` (here a concurrency permit) was held for the whole wait and
/// other keys' requests queued behind it.
#[tokio::test(start_paused = true)]
async fn a_paced_request_holds_no_inner_capacity_while_it_waits() {
    let lim = RateLimiter::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("1/second")
        .unwrap()
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(lim, HeaderKey::new("x-user"))
        .pacing(Pacing::Delay(Duration::from_secs(5)))
        .unwrap();
    let inner = tower::limit::ConcurrencyLimitLayer::new(1).layer(echo(Arc::default()));
    let svc = layer.layer(inner);
    let as_user = |u: &str| {
        Request::get("/")
            .header("x-user", u)
            .body(Body::default())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(as_user("a")).await.unwrap().status(),
        StatusCode::OK
    );
    // A second request of user a waits a second for its slot...
    let waiting = tokio::spawn(svc.clone().oneshot(as_user("a")));
    tokio::task::yield_now().await;
    // ...while user b, with room, gets through at once.
    let b = tokio::time::timeout(
        Duration::from_millis(100),
        svc.clone().oneshot(as_user("b")),
    )
    .await
    .expect("user b waited for user a's pacing")
    .unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// An echo service that counts its clones.
#[derive(Debug)]
struct CountClones(Arc<AtomicUsize>);

impl Clone for CountClones {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(&self.0))
    }
}

impl Service<Request<Body>> for CountClones {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        ready(Ok(Response::new(Body::from("ok"))))
    }
}

/// The memory store answers during `call`: an allowed request goes to the inner service that was
/// polled ready, without the ready-clone (a clone per request costs an allocation behind axum's
/// boxed routes). Guards the fast path against a change of the memory store's future type.
#[tokio::test]
async fn the_memory_store_path_never_clones_the_inner_service() {
    let clock = ManualClock::new(T0);
    let clones = Arc::new(AtomicUsize::new(0));
    let mut svc = RateLimitLayer::new(
        limiter(Strategy::TokenBucket, "2/minute", &clock),
        GlobalKey,
    )
    .layer(CountClones(clones.clone()));
    for _ in 0..2 {
        let res = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    }
    assert_eq!(clones.load(Ordering::SeqCst), 0);
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // With pacing, an answer at once that may need a wait still goes through the state machine.
    let mut paced = RateLimitLayer::new(
        limiter(Strategy::TokenBucket, "1/minute", &clock),
        GlobalKey,
    )
    .pacing(Pacing::Delay(Duration::from_secs(1)))
    .unwrap()
    .layer(CountClones(clones.clone()));
    let res = paced.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = paced.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a minute is past the bound"
    );
    assert_eq!(res.headers()["retry-after"], "60");
}

/// A rejected request gives back what the inner service's `poll_ready` reserved: another clone of
/// the service gets the only concurrency permit at once, though the rejected one is kept.
#[tokio::test(start_paused = true)]
async fn a_rejected_request_holds_no_inner_capacity() {
    let clock = ManualClock::new(T0);
    let inner = tower::limit::ConcurrencyLimitLayer::new(1).layer(echo(Arc::default()));
    let mut a = RateLimitLayer::new(
        limiter(Strategy::FixedWindow, "1/minute", &clock),
        GlobalKey,
    )
    .layer(inner);
    let mut b = a.clone();
    let res = a.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = a.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    tokio::time::timeout(Duration::from_secs(1), b.ready())
        .await
        .expect("the rejected request's service kept the permit")
        .unwrap();
}

/// Regression: a request without a key (400) kept what the inner service's `poll_ready` reserved.
#[tokio::test(start_paused = true)]
async fn a_request_without_a_key_holds_no_inner_capacity() {
    let clock = ManualClock::new(T0);
    let inner = tower::limit::ConcurrencyLimitLayer::new(1).layer(echo(Arc::default()));
    let mut a = RateLimitLayer::new(
        limiter(Strategy::FixedWindow, "1/minute", &clock),
        HeaderKey::new("x-api-key"),
    )
    .layer(inner);
    let mut b = a.clone();
    let res = a.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    tokio::time::timeout(Duration::from_secs(1), b.ready())
        .await
        .expect("the keyless request's service kept the permit")
        .unwrap();
}
