//! One behaviour, two builders: each case runs the same requests through a single limiter's
//! `RateLimitLayer` and through a one-limit rules file (the same layer type, `Rules::layer`),
//! configured alike (response hooks, settlement, an enclosing layer), and expects the same answer
//! from both (status, rate-limit fields, content type and body, what was spent). A table of
//! cases, not two copies of each test.

use std::convert::Infallible;
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use tollgate::key::HeaderKey;
use tollgate::layer::{Pacing, ProblemJson, RateLimitLayer, Settle, SettleFrom};
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::MemoryStore;
use tollgate::{ManualClock, RateLimiter, Strategy};
use tower::util::BoxCloneSyncService;
use tower::{Layer as _, ServiceExt as _};

/// What a case's request asks of the handler.
#[derive(Clone, Copy, Debug)]
enum Ask {
    /// A plain `ok`.
    Ok,
    /// `ok` marked `Settle::refund()`.
    Refund,
    /// `ok` marked `Settle::refund().for_limiter(name)`.
    RefundFor(&'static str),
    /// A request without the key header.
    NoKey,
    /// `ok` reporting `x-used: N` units.
    Used(u32),
}

/// How both builders are configured alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cfg {
    /// The defaults (`settle = "marker"` in the file).
    Plain,
    /// `respond_with(ProblemJson)`.
    Problem,
    /// An `on_rejected` closure building the 429.
    Closure,
    /// Settled from the response header `x-used` (`SettleFrom::header`, `settle = "header:x-used"`).
    SettleHeader,
    /// Inside an enclosing single limiter of 3 per minute on the same key.
    Stacked,
}

static X_USED: HeaderName = HeaderName::from_static("x-used");

/// The fields compared: status, `x-ratelimit-limit`, `-remaining`, `-reset`, `retry-after`.
type Answer = (StatusCode, Vec<Option<String>>);

struct Case {
    name: &'static str,
    cfg: Cfg,
    requests: &'static [Ask],
    /// The statuses expected (the fields must be equal across builders).
    statuses: &'static [u16],
    /// What the key has left afterwards.
    left: u32,
}

const CASES: &[Case] = &[
    Case {
        name: "admits up to the limit, then 429 with Retry-After",
        cfg: Cfg::Plain,
        requests: &[Ask::Ok, Ask::Ok, Ask::Ok],
        statuses: &[200, 200, 429],
        left: 0,
    },
    Case {
        name: "a request without a key is refused 400 and spends nothing",
        cfg: Cfg::Plain,
        requests: &[Ask::NoKey, Ask::Ok],
        statuses: &[400, 200],
        left: 1,
    },
    Case {
        name: "an unnamed marker refunds the request",
        cfg: Cfg::Plain,
        requests: &[Ask::Refund, Ask::Refund, Ask::Refund],
        statuses: &[200, 200, 200],
        left: 2,
    },
    Case {
        name: "a marker named for the limit refunds it",
        cfg: Cfg::Plain,
        requests: &[Ask::RefundFor("l"), Ask::Ok],
        statuses: &[200, 200],
        left: 1,
    },
    Case {
        name: "a marker named for another limit leaves the count",
        cfg: Cfg::Plain,
        requests: &[Ask::RefundFor("other"), Ask::Ok],
        statuses: &[200, 200],
        left: 0,
    },
    Case {
        name: "ProblemJson answers the 429, naming the limit",
        cfg: Cfg::Problem,
        requests: &[Ask::Ok, Ask::Ok, Ask::Ok],
        statuses: &[200, 200, 429],
        left: 0,
    },
    Case {
        name: "ProblemJson answers a request without a key 400",
        cfg: Cfg::Problem,
        requests: &[Ask::NoKey, Ask::Ok],
        statuses: &[400, 200],
        left: 1,
    },
    Case {
        name: "a respond_with closure builds the 429, the layer adds the fields",
        cfg: Cfg::Closure,
        requests: &[Ask::Ok, Ask::Ok, Ask::Ok],
        statuses: &[200, 200, 429],
        left: 0,
    },
    Case {
        name: "a settle header charges what the response reports, before it leaves",
        cfg: Cfg::SettleHeader,
        requests: &[Ask::Used(0), Ask::Used(2), Ask::Ok],
        statuses: &[200, 200, 429],
        left: 0,
    },
    Case {
        name: "a settle header above what was left is charged in full",
        cfg: Cfg::SettleHeader,
        requests: &[Ask::Used(5), Ask::Ok],
        statuses: &[200, 429],
        left: 0,
    },
    Case {
        name: "inside an enclosing limiter the tighter limit's fields are shown and its 429 kept",
        cfg: Cfg::Stacked,
        requests: &[Ask::Ok, Ask::Ok, Ask::Ok],
        statuses: &[200, 200, 429],
        left: 0,
    },
    Case {
        name: "inside an enclosing limiter an unnamed marker settles the inner limit only",
        cfg: Cfg::Stacked,
        requests: &[Ask::Refund, Ask::Refund, Ask::Refund, Ask::Refund],
        statuses: &[200, 200, 200, 429],
        left: 2,
    },
];

type Svc = BoxCloneSyncService<Request<()>, Response<String>, Infallible>;

async fn handler(req: Request<()>) -> Result<Response<String>, Infallible> {
    let mut res = Response::new(String::from("ok"));
    match req.uri().query() {
        Some("refund") => {
            res.extensions_mut().insert(Settle::refund());
        }
        Some(q) => {
            if let Some(name) = q.strip_prefix("refund=") {
                res.extensions_mut()
                    .insert(Settle::refund().for_limiter(name.to_owned()));
            }
            if let Some(used) = q.strip_prefix("used=") {
                res.headers_mut()
                    .insert(X_USED.clone(), used.parse().unwrap());
            }
        }
        None => {}
    }
    Ok(res)
}

/// `$layer` configured as `$cfg` says around the handler, its body read into a `String`: the
/// same code for both builders (they are one layer type, of different limits).
macro_rules! finish {
    ($layer:expr, $cfg:expr, $start:expr) => {{
        let inner = tower::service_fn(handler);
        match $cfg {
            Cfg::Problem => boxed($layer.respond_with(ProblemJson).layer(inner)),
            Cfg::Closure => boxed(
                $layer
                    .on_rejected(|d: &tollgate::Decision| {
                        let wait = d.retry_after_secs().unwrap_or(0);
                        (
                            StatusCode::TOO_MANY_REQUESTS,
                            format!("slow down for {wait} s"),
                        )
                    })
                    .layer(inner),
            ),
            Cfg::Stacked => {
                let outer: RateLimiter<_, MemoryStore<_>, _> = RateLimiter::builder()
                    .name("outer")
                    .strategy(Strategy::FixedWindow)
                    .quotas("3/minute")
                    .unwrap()
                    .clock(ManualClock::new($start))
                    .build()
                    .unwrap();
                boxed(RateLimitLayer::new(outer, HeaderKey::new("x-k")).layer($layer.layer(inner)))
            }
            Cfg::Plain | Cfg::SettleHeader => boxed($layer.layer(inner)),
        }
    }};
}

fn boxed<S, B>(svc: S) -> Svc
where
    S: tower::Service<Request<()>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    BoxCloneSyncService::new(svc.and_then(collect_body))
}

/// What the key `a` has left, asked without spending.
type Probe = Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = u32> + Send>>>;

/// The two builders of "2 per minute per `x-k`, named `l`", on a manual clock each, configured as
/// `cfg` says, and a probe of what the key has left.
fn builders(cfg: Cfg) -> Vec<(&'static str, Svc, Probe)> {
    let start = Duration::from_secs(1_700_000_000);
    let limiter: RateLimiter<_, MemoryStore<_>, _> = RateLimiter::builder()
        .name("l")
        .strategy(Strategy::FixedWindow)
        .quotas("2/minute")
        .unwrap()
        .clock(ManualClock::new(start))
        .build()
        .unwrap();
    let mut layer = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-k"));
    if cfg == Cfg::SettleHeader {
        layer = layer.settle_from(SettleFrom::header(X_USED.clone()));
    }
    let single = finish!(layer, cfg, start);
    let single_left: Probe = Box::new(move || {
        let left = limiter
            .check_now(&tollgate::key::ValueKey::new(b"a"), 0)
            .remaining();
        Box::pin(async move { left })
    });

    let settle = match cfg {
        Cfg::SettleHeader => "header:x-used",
        _ => "marker",
    };
    let rules = Rules::with_clock(
        &format!(
            "[[limit]]\nname = \"l\"\nkey = \"header:x-k\"\nstrategy = \"fixed-window\"\n\
             quotas = \"2/minute\"\nsettle = \"{settle}\"\n"
        ),
        RulesOptions::default(),
        MemoryStore::default,
        ManualClock::new(start),
    )
    .unwrap();
    let file = finish!(rules.layer(), cfg, start);
    let file_left: Probe = Box::new(move || {
        let rules = rules.clone();
        Box::pin(async move {
            let (parts, ()) = request(Ask::Ok).into_parts();
            rules.peek("l", &parts).await.unwrap().unwrap().remaining()
        })
    });
    vec![
        ("one limiter", single, single_left),
        ("a one-limit rules file", file, file_left),
    ]
}

/// The response with its body read into a `String`.
async fn collect_body<B>(res: Response<B>) -> Result<Response<String>, Infallible>
where
    B: http_body::Body,
{
    let (parts, body) = res.into_parts();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Ok(Response::from_parts(
        parts,
        String::from_utf8_lossy(&bytes).into_owned(),
    ))
}

fn request(ask: Ask) -> Request<()> {
    let uri = match ask {
        Ask::Refund => "/?refund".to_owned(),
        Ask::RefundFor(name) => format!("/?refund={name}"),
        Ask::Used(n) => format!("/?used={n}"),
        Ask::Ok | Ask::NoKey => "/".to_owned(),
    };
    let mut req = Request::get(uri);
    if !matches!(ask, Ask::NoKey) {
        req = req.header("x-k", "a");
    }
    req.body(()).unwrap()
}

fn answer(res: &Response<String>) -> Answer {
    let mut fields: Vec<Option<String>> = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
        "content-type",
    ]
    .iter()
    .map(|f| {
        res.headers()
            .get(*f)
            .map(|v| v.to_str().unwrap().to_owned())
    })
    .collect();
    fields.push(Some(res.body().clone()));
    (res.status(), fields)
}

#[tokio::test]
async fn every_case_answers_alike_through_one_limiter_and_a_one_limit_rules_file() {
    for case in CASES {
        let mut answers: Vec<(&str, Vec<Answer>, u32)> = Vec::new();
        for (builder, svc, left) in builders(case.cfg) {
            let mut got = Vec::new();
            for ask in case.requests {
                let res = svc.clone().oneshot(request(*ask)).await.unwrap();
                got.push(answer(&res));
            }
            let statuses: Vec<u16> = got.iter().map(|(s, _)| s.as_u16()).collect();
            assert_eq!(statuses, case.statuses, "{}: {builder}", case.name);
            answers.push((builder, got, left().await));
        }
        let (first, rest) = answers.split_first().unwrap();
        for other in rest {
            assert_eq!(
                first.1, other.1,
                "{}: {} and {} answer differently",
                case.name, first.0, other.0
            );
        }
        for (builder, _, left) in &answers {
            assert_eq!(*left, case.left, "{}: {builder} left", case.name);
        }
    }
}

/// One limiter and a one-limit rules file of 1 per second (token bucket) on tokio's clock, paced
/// up to `max`.
fn paced_builders(max: Duration) -> Vec<(&'static str, Svc)> {
    let limiter: RateLimiter<_, MemoryStore<_>, _> = RateLimiter::builder()
        .name("l")
        .strategy(Strategy::TokenBucket)
        .quotas("1/second")
        .unwrap()
        .clock(tollgate::TokioClock::new())
        .build()
        .unwrap();
    let single = RateLimitLayer::new(limiter, HeaderKey::new("x-k"))
        .pacing(Pacing::Delay(max))
        .unwrap();
    let rules = Rules::with_clock(
        "[[limit]]\nname = \"l\"\nkey = \"header:x-k\"\nstrategy = \"token-bucket\"\n\
         quotas = \"1/second\"\n",
        RulesOptions::default(),
        MemoryStore::default,
        tollgate::TokioClock::new(),
    )
    .unwrap();
    let file = rules.layer().pacing(Pacing::Delay(max)).unwrap();
    vec![
        (
            "one limiter",
            boxed(single.layer(tower::service_fn(handler))),
        ),
        (
            "a one-limit rules file",
            boxed(file.layer(tower::service_fn(handler))),
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn pacing_waits_for_the_slot_within_the_maximum_and_refuses_beyond_it_in_both() {
    for (builder, svc) in paced_builders(Duration::from_millis(1500)) {
        assert_eq!(
            svc.clone()
                .oneshot(request(Ask::Ok))
                .await
                .unwrap()
                .status(),
            200
        );
        let start = tokio::time::Instant::now();
        let res = svc.clone().oneshot(request(Ask::Ok)).await.unwrap();
        let waited = start.elapsed();
        assert_eq!(
            res.status(),
            200,
            "{builder}: the second request waits for its slot"
        );
        assert!(
            waited >= Duration::from_millis(999) && waited <= Duration::from_millis(1100),
            "{builder}: waited {waited:?} for a slot 1 s away"
        );
    }
    for (builder, svc) in paced_builders(Duration::from_millis(500)) {
        assert_eq!(
            svc.clone()
                .oneshot(request(Ask::Ok))
                .await
                .unwrap()
                .status(),
            200
        );
        let start = tokio::time::Instant::now();
        let res = svc.clone().oneshot(request(Ask::Ok)).await.unwrap();
        assert_eq!(
            res.status(),
            429,
            "{builder}: a slot 1 s away is beyond a 500 ms maximum"
        );
        assert!(
            start.elapsed() < Duration::from_millis(600),
            "{builder}: refused within the maximum, not after a full wait ({:?})",
            start.elapsed()
        );
    }
}

/// One limiter and a one-limit rules file, each a shaping queue of 1 per second (leaky bucket)
/// with at most 2 s of wait, on tokio's clock.
fn queued_builders() -> Vec<(&'static str, Svc)> {
    let limiter: RateLimiter<_, MemoryStore<_>, _> = RateLimiter::builder()
        .name("l")
        .strategy(Strategy::LeakyBucket)
        .quotas("1/second")
        .unwrap()
        .clock(tollgate::TokioClock::new())
        .build()
        .unwrap();
    let single = RateLimitLayer::new(limiter, HeaderKey::new("x-k"))
        .pacing(Pacing::Queue(Duration::from_secs(2)))
        .unwrap();
    let rules = Rules::with_clock(
        "[[limit]]\nname = \"l\"\nkey = \"header:x-k\"\nstrategy = \"leaky-bucket\"\n\
         quotas = \"1/second\"\nqueue_ms = 2000\n",
        RulesOptions::default(),
        MemoryStore::default,
        tollgate::TokioClock::new(),
    )
    .unwrap();
    vec![
        (
            "one limiter",
            boxed(single.layer(tower::service_fn(handler))),
        ),
        (
            "a one-limit rules file",
            boxed(rules.layer().layer(tower::service_fn(handler))),
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn a_shaping_queue_spaces_departures_and_refuses_past_its_wait_in_both() {
    for (builder, svc) in queued_builders() {
        let start = tokio::time::Instant::now();
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let res = svc.oneshot(request(Ask::Ok)).await.unwrap();
                    (res.status().as_u16(), start.elapsed())
                })
            })
            .collect();
        let mut got = Vec::new();
        for call in calls {
            got.push(call.await.unwrap());
        }
        got.sort();
        let statuses: Vec<u16> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            statuses,
            [200, 200, 200, 429],
            "{builder}: three places (0, 1 and 2 s away), the fourth refused"
        );
        let mut left: Vec<Duration> = got.iter().take(3).map(|(_, t)| *t).collect();
        left.sort();
        for (i, t) in left.iter().enumerate() {
            let due = Duration::from_secs(i as u64);
            assert!(
                *t >= due && *t <= due + Duration::from_millis(100),
                "{builder}: departure {i} at {t:?}, due at {due:?}"
            );
        }
        assert!(
            got[3].1 < Duration::from_millis(100),
            "{builder}: the refusal comes at once ({:?})",
            got[3].1
        );
    }
}

/// The text logged at `level` while the requests `asks` go through `svc`.
fn logged(svc: &Svc, level: tracing::Level, asks: &[Ask]) -> String {
    let logs = crate::support::Logs::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(crate::support::log_into(&logs, level), || {
        rt.block_on(async {
            for ask in asks {
                svc.clone().oneshot(request(*ask)).await.unwrap();
            }
        });
    });
    logs.text()
}

#[test]
fn log_lines_name_the_limiter_and_a_decision_has_a_span_only_when_trace_is_on_in_both() {
    // Whether a span is built follows tracing's process-wide level, which other tests' subscribers
    // move while this one runs.
    if !crate::logs::alone(
        "pipeline_matrix::log_lines_name_the_limiter_and_a_decision_has_a_span_only_when_trace_is_on_in_both",
    ) {
        return;
    }
    let asks = [Ask::Ok, Ask::Ok, Ask::Ok, Ask::NoKey];
    for (builder, svc, _) in builders(Cfg::Plain) {
        let debug = logged(&svc, tracing::Level::DEBUG, &asks);
        assert_eq!(
            debug.matches("rate limited").count(),
            1,
            "{builder}: {debug}"
        );
        for line in debug.lines().filter(|l| l.contains("tollgate")) {
            assert!(
                line.contains("limit=\"l\""),
                "{builder}: a line without the limiter: {line}"
            );
        }
        assert!(
            !debug.contains("tollgate.decide"),
            "{builder}: no span below trace: {debug}"
        );
    }
    for (builder, svc, _) in builders(Cfg::Plain) {
        let trace = logged(&svc, tracing::Level::TRACE, &asks);
        let rejected = trace.lines().find(|l| l.contains("rate limited"));
        let layer = if builder == "one limiter" {
            "l"
        } else {
            "rules"
        };
        assert!(
            rejected.is_some_and(
                |l| l.contains(&format!("tollgate.decide{{layer=\"{layer}\" cost=1}}"))
            ),
            "{builder}: the rejection is logged inside its decision's span: {trace}"
        );
    }
}

#[tokio::test]
async fn problem_json_names_the_limiter_that_rejected_in_violated_policies_in_both() {
    for (builder, svc, _) in builders(Cfg::Problem) {
        let mut last = None;
        for _ in 0..3 {
            last = Some(svc.clone().oneshot(request(Ask::Ok)).await.unwrap());
        }
        let res = last.unwrap();
        assert_eq!(res.status(), 429, "{builder}");
        assert!(
            res.body().contains("\"violated-policies\":[\"l\"]"),
            "{builder}: {}",
            res.body()
        );
    }
}
