//! The metrics of a plain `RateLimitLayer` (not a rules file): the `server` example's `/metrics`
//! after requests that are allowed, rejected and without a key.

use http::StatusCode;

use crate::server_cli::Running;
use crate::support::{TestClient, metric as value};

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
