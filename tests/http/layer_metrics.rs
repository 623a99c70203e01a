//! The metrics of the layer: the `server` example's `/metrics` after requests that are allowed,
//! rejected and without a key; settled units, refreshed gauges and untaken settle markers
//! through one limiter and a rules file; a second live limiter or cap of one name.

use std::convert::Infallible;
use std::time::Duration;

use http::StatusCode;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tollgate::RateLimiter;
use tollgate::key::HeaderKey;
use tollgate::layer::{RateLimitLayer, Settle};
use tollgate::rules::{Rules, RulesOptions};
use tower::{Layer as _, ServiceExt as _, service_fn};

use crate::server_cli::Running;
use crate::support::{Logs, TestClient, log_into, metric as value};

#[tokio::test]
async fn the_layer_counts_its_outcomes_under_its_limiters_name_never_the_key() {
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "fixed-window",
        "--quota",
        "2/hour",
        "--key",
        "header:x-user",
        "--cost",
        "2",
    ])
    .await;
    let c = TestClient::new();
    let request = |user: Option<&str>| {
        let mut b = http::Request::get(server.url("/"));
        if let Some(user) = user {
            b = b.header("x-user", user);
        }
        b.body(http_body_util::Full::<bytes::Bytes>::default())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for user in ["secret-alice", "secret-alice", "secret-bob"] {
        statuses.push(c.send(request(Some(user))).await.status);
    }
    statuses.push(c.send(request(None)).await.status);
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK,
            StatusCode::BAD_REQUEST
        ]
    );
    let page = c.get(&server.url("/metrics")).await.body;
    server.stop().await;
    let outcome = |o: &str| {
        value(
            &page,
            &format!("tollgate_requests_total{{limit=\"default\",outcome=\"{o}\"}}"),
        )
    };
    assert_eq!(outcome("allowed"), Some(2.0), "{page}");
    assert_eq!(outcome("rejected"), Some(1.0), "{page}");
    assert_eq!(outcome("no_key"), Some(1.0), "{page}");
    assert_eq!(outcome("fail_open"), Some(0.0), "{page}");
    assert_eq!(
        value(&page, "tollgate_units_total{limit=\"default\"}"),
        Some(4.0),
        "two requests of cost 2: {page}"
    );
    assert_eq!(
        value(&page, "tollgate_keys{limit=\"default\"}"),
        Some(2.0),
        "{page}"
    );
    assert_eq!(
        value(&page, "tollgate_breaker_open{limit=\"default\"}"),
        Some(0.0),
        "{page}"
    );
    assert!(
        !page.contains("secret-"),
        "the key is never a label: {page}"
    );
}

#[tokio::test]
async fn units_settled_beyond_a_full_moving_window_are_counted_under_the_limiters_name() {
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "moving-window",
        "--quota",
        "5/minute",
        "--key",
        "global",
        "--cost",
        "3",
        "--settle-header",
        "x-used",
    ])
    .await;
    let c = TestClient::new();
    // Reserved 3, used 9: the log has room for 2 more, 4 are dropped; then a request within its
    // reservation drops nothing (and is rejected: the log is full).
    assert_eq!(c.get(&server.url("/?used=9")).await.status, StatusCode::OK);
    assert_eq!(
        c.get(&server.url("/?used=1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let page = c.get(&server.url("/metrics")).await.body;
    server.stop().await;
    assert_eq!(
        value(
            &page,
            "tollgate_settle_dropped_units_total{limit=\"default\"}"
        ),
        Some(4.0),
        "{page}"
    );
}

/// A handler that answers `ok`, settling as the query says: `units=N` (`Settle::units`),
/// `refund` (unnamed), `for=NAME` (a refund named for `NAME`).
async fn settling(req: http::Request<()>) -> Result<http::Response<String>, Infallible> {
    let mut res = http::Response::new(String::from("ok"));
    let query = req.uri().query().unwrap_or("");
    let marker = if let Some(n) = query.strip_prefix("units=") {
        Some(Settle::units(n.parse().unwrap()))
    } else if let Some(name) = query.strip_prefix("for=") {
        Some(Settle::refund().for_limiter(name.to_owned()))
    } else {
        (query == "refund").then(Settle::refund)
    };
    if let Some(marker) = marker {
        res.extensions_mut().insert(marker);
    }
    Ok(res)
}

fn keyed(query: &str, key: &str) -> http::Request<()> {
    http::Request::get(format!("/?{query}"))
        .header("x-k", key)
        .body(())
        .unwrap()
}

/// One limiter named `name` (10 a minute per `x-k`) and a one-limit rules file of `name` alike
/// (`settle = "marker"` unless `file_settles` is false), their handles resolved with `recorder`.
fn both(
    recorder: &PrometheusRecorder,
    name: &str,
    file_settles: bool,
) -> (RateLimitLayer<HeaderKey>, Rules) {
    metrics::with_local_recorder(recorder, || {
        let limiter = RateLimiter::builder()
            .name(format!("{name}-one"))
            .quotas("10/minute")
            .unwrap()
            .build()
            .unwrap();
        let settle = if file_settles {
            "settle = \"marker\"\n"
        } else {
            ""
        };
        let rules = Rules::memory(
            &format!(
                "[[limit]]\nname = \"{name}-file\"\nkey = \"header:x-k\"\nquotas = \"10/minute\"\n{settle}"
            ),
            RulesOptions::default(),
        )
        .unwrap();
        (RateLimitLayer::new(limiter, HeaderKey::new("x-k")), rules)
    })
}

#[tokio::test]
async fn units_count_what_was_settled_not_the_estimate_in_both() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let (single, rules) = both(&recorder, "units", true);
    let one = single.layer(service_fn(settling));
    let file = rules.layer().layer(service_fn(settling));
    for query in ["refund", "", "units=3", "units=0"] {
        assert_eq!(
            one.clone()
                .oneshot(keyed(query, "a"))
                .await
                .unwrap()
                .status(),
            200
        );
        assert_eq!(
            file.clone()
                .oneshot(keyed(query, "a"))
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let page = recorder.handle().render();
    for builder in ["units-one", "units-file"] {
        assert_eq!(
            value(
                &page,
                &format!("tollgate_units_total{{limit=\"{builder}\"}}")
            ),
            Some(4.0),
            "{builder}: 0 + 1 + 3 + 0 units settled, not 4 estimates of 1: {page}"
        );
        assert_eq!(
            value(
                &page,
                &format!("tollgate_requests_total{{limit=\"{builder}\",outcome=\"allowed\"}}")
            ),
            Some(4.0),
            "{builder}: {page}"
        );
    }
}

#[tokio::test]
async fn the_gauges_are_refreshed_every_second_without_publish_stats_in_both() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let (single, rules) = both(&recorder, "gauges", true);
    let one = single.layer(service_fn(settling));
    let file = rules.layer().layer(service_fn(settling));
    for key in ["a", "b", "c"] {
        one.clone().oneshot(keyed("", key)).await.unwrap();
        file.clone().oneshot(keyed("", key)).await.unwrap();
    }
    let sent = std::time::Instant::now();
    let handle = recorder.handle();
    loop {
        let page = handle.render();
        let keys = |b: &str| value(&page, &format!("tollgate_keys{{limit=\"{b}\"}}"));
        let up = |b: &str| value(&page, &format!("tollgate_store_up{{limit=\"{b}\"}}"));
        if keys("gauges-one") == Some(3.0)
            && keys("gauges-file") == Some(3.0)
            && up("gauges-one") == Some(1.0)
            && up("gauges-file") == Some(1.0)
        {
            break;
        }
        // Refreshed every second by the metrics thread, with no call from the test: a loaded
        // machine may delay a tick, so the test waits for one far longer than a tick, and fails
        // only when none comes (no refresh at all).
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "the gauges were not refreshed without publish_stats: {page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_marker_nobody_takes_is_counted_once_by_the_outermost_layer_and_logged_once() {
    // Installed before any marker is counted.
    let page = || crate::support::global_metrics().render();
    page();
    let unmatched = |page: &str, name: &str| {
        value(
            page,
            &format!("tollgate_settle_unmatched_total{{limit=\"{name}\"}}"),
        )
    };
    let logs = Logs::default();
    let _logging = tracing::subscriber::set_default(log_into(&logs, tracing::Level::WARN));
    let recorder = PrometheusBuilder::new().build_recorder();
    let (single, rules) = both(&recorder, "marker", false);
    let one = single.layer(service_fn(settling));
    for _ in 0..3 {
        one.clone()
            .oneshot(keyed("for=um-nobody", "a"))
            .await
            .unwrap();
    }
    assert_eq!(unmatched(&page(), "um-nobody"), Some(3.0), "{}", page());
    assert_eq!(
        logs.count("limit=\"um-nobody\""),
        1,
        "logged once per name: {}",
        logs.text()
    );

    // Stacked: the enclosing layer's limiter takes a marker named for it; a marker nobody takes
    // is counted once (by the outermost layer), not once per layer.
    let outer = RateLimiter::builder()
        .name("um-outer")
        .quotas("10/minute")
        .unwrap()
        .build()
        .unwrap();
    let (inner, _) = both(&recorder, "marker-inner", false);
    let stacked =
        RateLimitLayer::new(outer, HeaderKey::new("x-k")).layer(inner.layer(service_fn(settling)));
    stacked
        .clone()
        .oneshot(keyed("for=um-outer", "a"))
        .await
        .unwrap();
    stacked
        .clone()
        .oneshot(keyed("for=um-stacked", "a"))
        .await
        .unwrap();
    let now = page();
    assert_eq!(
        unmatched(&now, "um-outer"),
        None,
        "taken by the outer layer: {now}"
    );
    assert_eq!(unmatched(&now, "um-stacked"), Some(1.0), "{now}");

    // A rules file without `settle = "marker"` leaves an unnamed marker: counted under "" (other
    // tests of this binary may count there too, never fewer).
    let before = unmatched(&page(), "").unwrap_or(0.0);
    let file = rules.layer().layer(service_fn(settling));
    file.clone().oneshot(keyed("refund", "a")).await.unwrap();
    file.clone().oneshot(keyed("refund", "a")).await.unwrap();
    let after = unmatched(&page(), "").unwrap_or(0.0);
    assert!(after >= before + 2.0, "{before} -> {after}");
    // Inside a plain layer the same marker is taken by it, not counted.
    let around = RateLimitLayer::new(
        RateLimiter::builder()
            .name("um-around")
            .quotas("10/minute")
            .unwrap()
            .build()
            .unwrap(),
        HeaderKey::new("x-k"),
    )
    .layer(rules.layer().layer(service_fn(settling)));
    let res = around.oneshot(keyed("for=um-around", "a")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(unmatched(&page(), "um-around"), None, "{}", page());
}

#[test]
fn a_second_live_limiter_or_cap_of_one_name_warns_once_when_built() {
    let logs = Logs::default();
    let _logging = tracing::subscriber::set_default(log_into(&logs, tracing::Level::WARN));
    let named = |name: &str| {
        RateLimiter::builder()
            .name(name)
            .quotas("10/minute")
            .unwrap()
            .build()
            .unwrap()
    };
    let warned = || logs.count("a second rate limiter named \"dup-l\"");
    let first = named("dup-l");
    let a = RateLimitLayer::new(first.clone(), HeaderKey::new("x-k"));
    let a_again = RateLimitLayer::new(first.clone(), HeaderKey::new("x-k"));
    assert_eq!(
        warned(),
        0,
        "two layers on one limiter share it: {}",
        logs.text()
    );
    let b = RateLimitLayer::new(named("dup-l"), HeaderKey::new("x-k"));
    assert_eq!(warned(), 1, "{}", logs.text());
    drop((a, a_again, b, first));
    let c = RateLimitLayer::new(named("dup-l"), HeaderKey::new("x-k"));
    assert_eq!(warned(), 1, "the others were dropped: {}", logs.text());

    // A cap's label is held from when its layer is built.
    let cap = |name: &str| {
        let limit = tollgate::layer::ConcurrencyLimit::memory(std::num::NonZeroU32::MIN)
            .named(name)
            .unwrap();
        tollgate::layer::ConcurrencyLayer::new(limit, HeaderKey::new("x-k"))
    };
    let cap_warned = || logs.count("a second concurrency cap named \"dup-c\"");
    let c1 = cap("dup-c");
    let c1_clone = c1.clone();
    assert_eq!(cap_warned(), 0, "{}", logs.text());
    let _c2 = cap("dup-c");
    assert_eq!(cap_warned(), 1, "{}", logs.text());
    // A cap named like a limiter is its pair, and a rules file's capped limit is both.
    let _paired = cap("dup-l");
    let _file = Rules::memory(
        "[[limit]]\nname = \"dup-r\"\nquotas = \"10/minute\"\nconcurrency = 2\n",
        RulesOptions::default(),
    )
    .unwrap();
    assert_eq!(logs.count("a second"), 2, "{}", logs.text());
    drop((c, c1, c1_clone));
}

#[tokio::test]
async fn markers_of_ever_new_names_share_one_series_past_256() {
    let page = || crate::support::global_metrics().render();
    page();
    let recorder = PrometheusBuilder::new().build_recorder();
    let (single, _) = both(&recorder, "many-names", false);
    let one = single.layer(service_fn(settling));
    for i in 0..300 {
        let query = format!("for=um-many-{i}");
        one.clone()
            .oneshot(keyed(&query, &format!("k{i}")))
            .await
            .unwrap();
    }
    let now = page();
    let series = now
        .lines()
        .filter(|l| l.starts_with("tollgate_settle_unmatched_total{"))
        .count();
    assert!(series <= 257, "{series} series: {now}");
    // At most 256 names have a series of their own (other tests of this binary name some).
    let other = value(&now, "tollgate_settle_unmatched_total{limit=\"(other)\"}");
    assert!(other.is_some_and(|n| n >= 44.0), "{other:?}: {now}");
}
