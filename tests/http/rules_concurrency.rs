//! A rules file's `concurrency` over real HTTP: the cap holds per key under more concurrent slow
//! requests than it admits (and is reached), its 429 says `Retry-After: 1` and spends no quota, a
//! slot is held until the response body ends and given back when the client goes away, and bad
//! values are refused at their line and column.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tollgate::layer::ProblemJson;
use tollgate::rules::{Rules, RulesOptions};

use crate::concurrency_limit::{
    InFlight, a_stream_holds_its_slot_until_its_client_goes_away, endless_body,
};
use crate::support::{TestClient, TestServer};

/// One limit keyed by `x-api-key` with these quotas and `concurrency = cap`.
fn rules(quotas: &str, cap: u32) -> Rules {
    Rules::memory(
        &format!(
            "[[limit]]\nname = \"api\"\nkey = \"header:x-api-key\"\n\
             strategy = \"fixed-window-first-hit\"\nquotas = \"{quotas}\"\nconcurrency = {cap}\n"
        ),
        RulesOptions::default(),
    )
    .unwrap()
}

/// `n` requests at once on `path` with `key`: their statuses and `Retry-After` values.
async fn at_once(
    server: &TestServer,
    path: &str,
    key: &str,
    n: usize,
) -> Vec<(StatusCode, String)> {
    let client = TestClient::new();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (client, url, key) = (client.clone(), server.url(path), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let res = client.get_with(&url, &[("x-api-key", &key)]).await;
            let retry = res.header("retry-after").unwrap_or_default().to_owned();
            (res.status, retry)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_files_concurrency_cap_holds_per_key_under_more_concurrent_slow_requests_than_it_admits()
{
    let (a, b) = (InFlight::default(), InFlight::default());
    let hold = Duration::from_millis(400);
    let (ha, hb) = (a.clone(), b.clone());
    let app = Router::new()
        .route("/a", get(move || async move { ha.hold(hold).await }))
        .route("/b", get(move || async move { hb.hold(hold).await }))
        .layer(rules("1000/hour", 3).layer());
    let server = TestServer::start(app).await;
    let (ra, rb) = tokio::join!(
        at_once(&server, "/a", "ka", 12),
        at_once(&server, "/b", "kb", 12)
    );
    for (answers, key) in [(&ra, "ka"), (&rb, "kb")] {
        let ok = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count();
        assert!((3..12).contains(&ok), "{key}: {ok} admitted of 12");
        for (status, retry) in answers.iter().filter(|(s, _)| *s != StatusCode::OK) {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{key}");
            assert_eq!(retry, "1", "{key}: a cap's 429 says Retry-After: 1");
        }
    }
    // Both sides of the bound: never more than 3 in flight per key, and 3 reached.
    assert_eq!((a.max(), b.max()), (3, 3), "in flight at once per key");
    // Every slot came back: 3 pass again at once.
    let again = at_once(&server, "/a", "ka", 3).await;
    assert!(again.iter().all(|(s, _)| *s == StatusCode::OK), "{again:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_caps_429_spends_no_quota() {
    let flight = InFlight::default();
    let slow = flight.clone();
    let app = Router::new()
        .route(
            "/slow",
            get(move || async move { slow.hold(Duration::from_millis(500)).await }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(rules("3/hour", 1).layer());
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/slow");
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.get_with(&url, &[("x-api-key", "k")]).await.status }
    });
    while flight.max() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..5 {
        let res = client
            .get_with(&server.url("/"), &[("x-api-key", "k")])
            .await;
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS, "the cap is full");
        assert_eq!(res.header("retry-after"), Some("1"));
    }
    assert_eq!(held.await.unwrap(), StatusCode::OK);
    // The quota of 3 spent 1 (the slow request): the cap's five 429s spent nothing.
    let res = client
        .get_with(&server.url("/"), &[("x-api-key", "k")])
        .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.header("x-ratelimit-remaining"), Some("1"));
    let res = client
        .get_with(&server.url("/"), &[("x-api-key", "k")])
        .await;
    assert_eq!(res.status, StatusCode::OK);
    let res = client
        .get_with(&server.url("/"), &[("x-api-key", "k")])
        .await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the quota is spent"
    );
    assert_ne!(
        res.header("retry-after"),
        Some("1"),
        "the quota's 429, not the cap's"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_caps_429_goes_through_the_layers_rejection_hook() {
    let flight = InFlight::default();
    let slow = flight.clone();
    let app = Router::new()
        .route(
            "/slow",
            get(move || async move { slow.hold(Duration::from_millis(400)).await }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(rules("1000/hour", 1).layer().respond_with(ProblemJson));
    let server = TestServer::start(app).await;
    let client = TestClient::new();
    let url = server.url("/slow");
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.get_with(&url, &[("x-api-key", "k")]).await.status }
    });
    while flight.max() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let res = client
        .get_with(&server.url("/"), &[("x-api-key", "k")])
        .await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.header("content-type"), Some("application/problem+json"));
    assert_eq!(res.header("retry-after"), Some("1"));
    assert!(
        res.body.contains("\"api\""),
        "names the limit: {}",
        res.body
    );
    assert_eq!(held.await.unwrap(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn a_files_concurrency_slot_is_held_until_the_body_ends_and_given_back_when_the_client_goes_away()
 {
    let app = Router::new()
        .route("/stream", get(|| async { endless_body() }))
        .route("/", get(|| async { "ok" }))
        .layer(rules("1000/hour", 1).layer());
    let server = TestServer::start(app).await;
    a_stream_holds_its_slot_until_its_client_goes_away(&server).await;
    // A body that ended gave its slot back: the next request passes at once, and the next too.
    for _ in 0..2 {
        let res = TestClient::new()
            .get_with(&server.url("/"), &[("x-api-key", "k")])
            .await;
        assert_eq!(res.status, StatusCode::OK);
    }
    server.stop().await;
}

#[test]
fn bad_concurrency_values_are_refused_at_their_line_and_column() {
    for (value, needle) in [
        ("0", "from 1"),
        ("-1", "from 1"),
        ("4294967296", "from 1"),
        ("\"4\"", "invalid type"),
    ] {
        let text =
            format!("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nconcurrency = {value}\n");
        let e = Rules::memory(&text, RulesOptions::default()).unwrap_err();
        assert_eq!(e.position(), Some((4, 15)), "{value}: {e}");
        assert!(e.message().contains(needle), "{value}: {e}");
    }
    let text = "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nshadow = true\nconcurrency = 2\n";
    let e = Rules::memory(text, RulesOptions::default()).unwrap_err();
    assert_eq!(e.position(), Some((5, 15)), "{e}");
    assert!(e.message().contains("shadow"), "{e}");
    // The bound's other side: 1 and u32::MAX load.
    for value in ["1", "4294967295"] {
        let text =
            format!("[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nconcurrency = {value}\n");
        Rules::memory(&text, RulesOptions::default()).unwrap();
    }
}
