//! The `login` example, over real HTTP with a `ManualClock`, and its
//! pacing on tokio's paused clock.

use crate::support;

use crate::example_login as login;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use support::{Resp, TestClient, TestServer};
use tollgate::{ManualClock, TokioClock};
use tower::ServiceExt;

const T0: Duration = Duration::from_secs(1_700_000_000);

fn config(max_delay: Duration) -> login::Config {
    login::Config {
        trusted: vec!["127.0.0.1/32".parse().unwrap()],
        account_max_delay: max_delay,
    }
}

struct Login {
    server: TestServer,
    client: TestClient,
}

impl Login {
    async fn start(clock: &ManualClock) -> Self {
        // No waiting on a frozen clock: throttled attempts are answered at once with the wait.
        let app = login::app(clock.clone(), config(Duration::ZERO));
        Self {
            server: TestServer::start(app).await,
            client: TestClient::new(),
        }
    }

    /// A sign-in from `ip` (forwarded by the trusted proxy 127.0.0.1).
    async fn sign_in(&self, ip: &str, user: &str, password: &str) -> Resp {
        self.sign_in_with(ip, user, password, &[]).await
    }

    /// [`Login::sign_in`] with extra request headers.
    async fn sign_in_with(
        &self,
        ip: &str,
        user: &str,
        password: &str,
        headers: &[(&str, &str)],
    ) -> Resp {
        let body = format!("username={user}&password={}", password.replace(' ', "+"));
        let mut req = Request::post(self.server.url("/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-forwarded-for", ip);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        self.client.send(req).await
    }
}

fn ip_n(i: usize) -> String {
    format!("203.0.{}.{}", i / 250, i % 250 + 1)
}

/// 100 IPs, one wrong password each, against one account: throttled after 20 whatever the
/// IPs (≤ 100 consecutive failures, NIST).
#[tokio::test]
async fn the_account_is_throttled_across_ips() {
    let clock = ManualClock::new(T0);
    let app = Login::start(&clock).await;
    let mut statuses = Vec::new();
    for i in 0..100 {
        statuses.push(app.sign_in(&ip_n(i), "alice", "guess").await.status);
    }
    assert!(
        statuses[..20]
            .iter()
            .all(|&s| s == StatusCode::UNAUTHORIZED)
    );
    assert!(
        statuses[20..]
            .iter()
            .all(|&s| s == StatusCode::TOO_MANY_REQUESTS)
    );
    let res = app.sign_in(&ip_n(200), "alice", "guess").await;
    assert!(res.body.contains("for this account"), "{}", res.body);
    assert!(
        res.body.contains("Try again in 180 seconds"),
        "one slot of 20/hour: {}",
        res.body
    );
    assert_eq!(res.num("retry-after"), 180);
    // Another account is untouched.
    assert_eq!(
        app.sign_in(&ip_n(0), "bob", "guess").await.status,
        StatusCode::UNAUTHORIZED
    );
    app.server.stop().await;
}

/// One IP, 200 usernames: blocked after the per-IP daily quota of 100.
#[tokio::test]
async fn password_spraying_from_one_ip_is_blocked() {
    let clock = ManualClock::new(T0);
    let app = Login::start(&clock).await;
    let mut unauthorized = 0;
    let mut limited = 0;
    for u in 0..200 {
        let res = app
            .sign_in("198.51.100.7", &format!("user{u}"), "guess")
            .await;
        match res.status {
            StatusCode::UNAUTHORIZED => unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(res.body.contains("from your network"), "{}", res.body);
                limited += 1;
            }
            s => panic!("{s}"),
        }
    }
    assert_eq!((unauthorized, limited), (100, 100));
    assert_eq!(
        app.sign_in("198.51.100.8", "user0", "guess").await.status,
        StatusCode::UNAUTHORIZED,
        "another IP is not affected"
    );
    app.server.stop().await;
}

/// Successes do not consume the failure quotas, and reset the IP + username counter; the
/// page shows the attempts left.
#[tokio::test]
async fn only_failures_count() {
    let clock = ManualClock::new(T0);
    let app = Login::start(&clock).await;
    let ip = "192.0.2.10";
    for left in [4, 3, 2, 1] {
        let res = app.sign_in(ip, "alice", "wrong").await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED);
        assert!(
            res.body.contains(&format!("{left} attempt")),
            "{left}: {}",
            res.body
        );
    }
    for _ in 0..30 {
        let res = app.sign_in(ip, "Alice", login::PASSWORD).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        assert!(res.body.contains("Welcome"));
    }
    // The counter was reset by the success: 5 fresh attempts, then the hard block.
    for left in [4, 3, 2, 1, 0] {
        let res = app.sign_in(ip, "alice", "wrong").await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED);
        assert!(
            res.body.contains(&format!("{left} attempt")),
            "{}",
            res.body
        );
    }
    let res = app.sign_in(ip, "alice", "wrong").await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        res.body.contains("for this username from your address"),
        "{}",
        res.body
    );
    assert!(
        res.body.contains("Try again in 900 seconds"),
        "{}",
        res.body
    );
    // 30 successes + 9 failures: far below the per-IP 100 and per-account 20: successes were free.
    let res = app.sign_in(ip, "carol", "wrong").await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    app.server.stop().await;
}

/// Unknown and known usernames get the same answers (status, body, rate-limit headers) and
/// the same throttling; the owner still gets in from another IP, and after the documented delay
/// even while the account is throttled.
#[tokio::test]
async fn no_enumeration_and_no_victim_lockout() {
    let clock = ManualClock::new(T0);
    let app = Login::start(&clock).await;
    for _ in 0..7 {
        let known = app.sign_in("192.0.2.20", "alice", "wrong").await;
        let unknown = app.sign_in("192.0.2.21", "mallory", "wrong").await;
        assert_eq!(known.status, unknown.status);
        assert_eq!(known.body, unknown.body);
        for h in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
            "content-type",
        ] {
            assert_eq!(known.header(h), unknown.header(h), "{h}");
        }
    }
    // The attacker's address is blocked for alice; the owner from home is not.
    assert_eq!(
        app.sign_in("192.0.2.20", "alice", login::PASSWORD)
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        app.sign_in("192.0.2.99", "alice", login::PASSWORD)
            .await
            .status,
        StatusCode::OK
    );
    // Fill the account's 20 failures from many IPs: the owner is slowed, not locked out.
    for i in 0..40 {
        app.sign_in(&ip_n(i), "alice", "wrong").await;
    }
    let res = app.sign_in("192.0.2.99", "alice", login::PASSWORD).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    let wait = res.num("retry-after");
    assert!(wait <= 180, "at most one slot: {wait}");
    clock.advance(Duration::from_secs(wait));
    assert_eq!(
        app.sign_in("192.0.2.99", "alice", login::PASSWORD)
            .await
            .status,
        StatusCode::OK
    );
    app.server.stop().await;
}

/// The per-IP and per-IP + username limits (the rules file) count only failures: successes
/// spend nothing from the IP's daily 100, the IP's refusal is the network page, and a client
/// cannot pick the username key with the internal header.
#[tokio::test]
async fn the_two_ip_limits_are_all_or_nothing_and_count_only_failures() {
    let clock = ManualClock::new(T0);
    let app = Login::start(&clock).await;
    let ip = "198.51.100.50";
    for u in 0..99 {
        let res = app.sign_in(ip, &format!("user{u}"), "guess").await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    }
    for _ in 0..10 {
        let res = app.sign_in(ip, "bob", login::PASSWORD).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    }
    let res = app.sign_in(ip, "alice", "guess").await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "the 100th failure");
    assert!(res.body.contains("4 attempts left"), "{}", res.body);
    let res = app.sign_in(ip, "alice", "guess").await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(res.body.contains("from your network"), "{}", res.body);
    // On a fresh server: once carol is blocked from this address, she stays blocked whatever
    // username key the client sends itself.
    let other = Login::start(&clock).await;
    for left in [4, 3, 2, 1, 0] {
        let res = other.sign_in(ip, "carol", "guess").await;
        assert!(
            res.body.contains(&format!("{left} attempt")),
            "{}",
            res.body
        );
    }
    let res = other
        .sign_in_with(ip, "carol", "guess", &[("x-login-user", "00")])
        .await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        res.body.contains("for this username from your address"),
        "{}",
        res.body
    );
    app.server.stop().await;
    other.server.stop().await;
}

fn form(ip: &str, user: &str, password: &str) -> Request<axum::body::Body> {
    let mut req = Request::post("/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(axum::body::Body::from(format!(
            "username={user}&password={}",
            password.replace(' ', "+")
        )))
        .unwrap();
    let peer: SocketAddr = format!("{ip}:4000").parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req
}

/// The account limit slows down instead of locking out: on tokio's (paused) clock, the owner's
/// attempt after 20 failures waits for the next slot (3 minutes) and then succeeds.
#[tokio::test(start_paused = true)]
async fn a_throttled_account_is_paced_not_locked() {
    let app = login::app(TokioClock::new(), config(Duration::from_secs(200)));
    for i in 0..20 {
        let res = app
            .clone()
            .oneshot(form(&format!("198.51.100.{i}"), "bob", "wrong"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let start = tokio::time::Instant::now();
    let res = app
        .clone()
        .oneshot(form("192.0.2.1", "bob", login::PASSWORD))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed().as_secs(), 180, "waited one slot");
}
