//! One behaviour, two builders: each case runs the same requests through a single limiter's
//! `RateLimitLayer` and through a one-limit rules file, and expects the same answer from both
//! (status, rate-limit fields, what was spent). A table of cases, not two copies of each test.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::key::HeaderKey;
use tollgate::layer::{RateLimitLayer, Settle};
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
}

/// The fields compared: status, `x-ratelimit-limit`, `-remaining`, `-reset`, `retry-after`.
type Answer = (StatusCode, Vec<Option<String>>);

struct Case {
    name: &'static str,
    requests: &'static [Ask],
    /// The statuses expected (the fields must be equal across builders).
    statuses: &'static [u16],
    /// What the key has left afterwards.
    left: u32,
}

const CASES: &[Case] = &[
    Case {
        name: "admits up to the limit, then 429 with Retry-After",
        requests: &[Ask::Ok, Ask::Ok, Ask::Ok],
        statuses: &[200, 200, 429],
        left: 0,
    },
    Case {
        name: "a request without a key is refused 400 and spends nothing",
        requests: &[Ask::NoKey, Ask::Ok],
        statuses: &[400, 200],
        left: 1,
    },
    Case {
        name: "an unnamed marker refunds the request",
        requests: &[Ask::Refund, Ask::Refund, Ask::Refund],
        statuses: &[200, 200, 200],
        left: 2,
    },
    Case {
        name: "a marker named for the limit refunds it",
        requests: &[Ask::RefundFor("l"), Ask::Ok],
        statuses: &[200, 200],
        left: 1,
    },
    Case {
        name: "a marker named for another limit leaves the count",
        requests: &[Ask::RefundFor("other"), Ask::Ok],
        statuses: &[200, 200],
        left: 0,
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
        }
        None => {}
    }
    Ok(res)
}

/// What the key `a` has left, asked without spending.
type Probe = Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = u32> + Send>>>;

/// The two builders of "2 per minute per `x-k`, named `l`", on a manual clock each, and a probe
/// of what the key has left.
fn builders() -> Vec<(&'static str, Svc, Probe)> {
    let start = Duration::from_secs(1_700_000_000);
    let limiter: RateLimiter<_, MemoryStore<_>, _> = RateLimiter::builder()
        .name("l")
        .strategy(Strategy::FixedWindow)
        .quotas("2/minute")
        .unwrap()
        .clock(ManualClock::new(start))
        .build()
        .unwrap();
    let single = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-k"))
        .layer(tower::service_fn(handler))
        .and_then(collect_body);
    let single_left: Probe = Box::new(move || {
        let left = limiter
            .check_now(&tollgate::key::ValueKey::new(b"a"), 0)
            .remaining();
        Box::pin(async move { left })
    });

    let rules = Rules::with_clock(
        "[[limit]]\nname = \"l\"\nkey = \"header:x-k\"\nstrategy = \"fixed-window\"\n\
         quotas = \"2/minute\"\nsettle = \"marker\"\n",
        RulesOptions::default(),
        MemoryStore::default,
        ManualClock::new(start),
    )
    .unwrap();
    let file = rules
        .layer()
        .layer(tower::service_fn(handler))
        .and_then(collect_body);
    let file_left: Probe = Box::new(move || {
        let rules = rules.clone();
        Box::pin(async move {
            let (parts, ()) = request(Ask::Ok).into_parts();
            rules.peek("l", &parts).await.unwrap().unwrap().remaining()
        })
    });
    vec![
        ("one limiter", BoxCloneSyncService::new(single), single_left),
        (
            "a one-limit rules file",
            BoxCloneSyncService::new(file),
            file_left,
        ),
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
        Ask::Ok | Ask::NoKey => "/".to_owned(),
    };
    let mut req = Request::get(uri);
    if !matches!(ask, Ask::NoKey) {
        req = req.header("x-k", "a");
    }
    req.body(()).unwrap()
}

fn answer(res: &Response<String>) -> Answer {
    let fields = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
    ]
    .iter()
    .map(|f| {
        res.headers()
            .get(*f)
            .map(|v| v.to_str().unwrap().to_owned())
    })
    .collect();
    (res.status(), fields)
}

#[tokio::test]
async fn every_case_answers_alike_through_one_limiter_and_a_one_limit_rules_file() {
    for case in CASES {
        let mut answers: Vec<(&str, Vec<Answer>, u32)> = Vec::new();
        for (builder, svc, left) in builders() {
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
