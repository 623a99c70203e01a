//! The rules file over real HTTP: limits per path and method, all-or-nothing decisions across keys
//! under races, reloads (under load, invalid, each change case), shadow limits, and the `server`
//! example's `--rules` with its `/metrics`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tollgate::rules::{Rules, RulesOptions};

use crate::server_cli::{Running, run};
use crate::support::{TestClient, TestServer, ip};

/// A server answering `ok` on every path and method, limited by `rules`.
async fn serve(rules: &Rules) -> TestServer {
    TestServer::start(
        Router::new()
            .fallback(|| async { "ok" })
            .layer(rules.layer()),
    )
    .await
}

fn request(method: Method, url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::default()).unwrap()
}

/// A file of this test's own in the temp directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tollgate-rules-{name}-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    /// Replaces the content by writing a sibling and renaming it over the file.
    fn replace(&self, text: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn limits_apply_per_path_and_method() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "login"
        path = "/login"
        methods = ["post"]
        strategy = "fixed-window-first-hit"
        quotas = "1/hour"

        [[limit]]
        name = "api"
        path = "/api/*"
        strategy = "fixed-window-first-hit"
        quotas = "2/hour"

        [[limit]]
        name = "user"
        path = "/users/{id}"
        key = "header:x-user"
        quotas = "1/hour"
        "#,
        RulesOptions::default(),
    )
    .unwrap();
    let server = serve(&rules).await;
    let c = TestClient::new();
    let send = |m: Method, path: &str, h: &[(&str, &str)]| c.send(request(m, &server.url(path), h));
    assert_eq!(
        send(Method::POST, "/login", &[]).await.status,
        StatusCode::OK
    );
    let res = send(Method::POST, "/login", &[]).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(res.header("retry-after").is_some());
    assert_eq!(
        send(Method::GET, "/login", &[]).await.status,
        StatusCode::OK,
        "POST only"
    );
    assert_eq!(
        send(Method::POST, "/login/", &[]).await.status,
        StatusCode::OK,
        "no folding"
    );
    for _ in 0..2 {
        let res = send(Method::GET, "/api/a", &[]).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.body, "ok");
    }
    assert_eq!(
        send(Method::DELETE, "/api/b/c", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(Method::GET, "/api", &[]).await.status,
        StatusCode::OK,
        "/api/* is below /api"
    );
    let res = send(Method::GET, "/users/7", &[]).await;
    assert_eq!(
        res.status,
        StatusCode::BAD_REQUEST,
        "no x-user header: {}",
        res.body
    );
    let alice = [("x-user", "alice")];
    assert_eq!(
        send(Method::GET, "/users/7", &alice).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(Method::GET, "/users/8", &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(Method::GET, "/users/8", &[("x-user", "bob")])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(Method::GET, "/users//x", &alice).await.status,
        StatusCode::OK
    );
    server.stop().await;
}

/// A request's key is read into the buffer an earlier request on the thread gave back: nothing of
/// the earlier key stays in it (a longer key, a rejected request's, one too long to be kept).
#[tokio::test]
async fn a_key_read_into_a_reused_buffer_is_the_same_key_every_time() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "user"
        key = "header:x-user"
        strategy = "fixed-window-first-hit"
        quotas = "2/hour"
        "#,
        RulesOptions::default(),
    )
    .unwrap();
    let server = serve(&rules).await;
    let c = TestClient::new();
    let long = "x".repeat(300);
    let (alice, bob) = ("alice-with-a-longer-name", "bob");
    let sequence = [
        (alice, StatusCode::OK),
        (bob, StatusCode::OK),
        (bob, StatusCode::OK),
        (bob, StatusCode::TOO_MANY_REQUESTS),
        (long.as_str(), StatusCode::OK),
        (bob, StatusCode::TOO_MANY_REQUESTS),
        (alice, StatusCode::OK),
        (alice, StatusCode::TOO_MANY_REQUESTS),
        ("al", StatusCode::OK),
    ];
    for (at, (user, status)) in sequence.into_iter().enumerate() {
        let res = c
            .send(request(Method::GET, &server.url("/"), &[("x-user", user)]))
            .await;
        assert_eq!(
            res.status,
            status,
            "request {at} (x-user of {} bytes)",
            user.len()
        );
    }
}

#[tokio::test]
async fn two_matching_limits_report_the_one_with_fewest_left() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "wide"
        strategy = "fixed-window-first-hit"
        quotas = "10/hour"

        [[limit]]
        name = "narrow"
        path = "/x"
        strategy = "fixed-window-first-hit"
        quotas = "3/hour"
        "#,
        RulesOptions {
            header_style: tollgate::layer::HeaderStyle::Both,
            ..RulesOptions::default()
        },
    )
    .unwrap();
    let server = serve(&rules).await;
    let c = TestClient::new();
    let res = c.get(&server.url("/x")).await;
    assert_eq!(res.num("x-ratelimit-limit"), 3);
    assert_eq!(res.num("x-ratelimit-remaining"), 2);
    let policy = res.header("ratelimit-policy").unwrap();
    assert!(
        policy.contains("\"wide\";q=10") && policy.contains("\"narrow\";q=3"),
        "{policy}"
    );
    let res = c.get(&server.url("/y")).await;
    assert_eq!(res.num("x-ratelimit-remaining"), 8);
    server.stop().await;
}

/// Global `G` (checked first) and per-IP `P` limits under concurrent requests from several IPs:
/// neither over-admits, and what rejected requests reserved in the global limit is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rejected_request_spends_nothing_in_the_other_limits_under_races() {
    const G: usize = 20;
    const P: usize = 2;
    let rules = Rules::memory(
        &format!(
            r#"
            [[limit]]
            name = "global"
            key = "global"
            strategy = "moving-window"
            quotas = "{G}/hour"

            [[limit]]
            name = "per-ip"
            strategy = "moving-window"
            quotas = "{P}/hour"
            "#
        ),
        RulesOptions::default(),
    )
    .unwrap();
    let server = Arc::new(serve(&rules).await);
    let ips = 6;
    let mut tasks = Vec::new();
    for i in 0..ips {
        for _ in 0..8 {
            let url = server.url("/");
            let client = TestClient::from_ip(ip(&format!("127.0.0.{}", i + 2)));
            tasks.push(tokio::spawn(
                async move { (i, client.get(&url).await.status) },
            ));
        }
    }
    let mut admitted = vec![0; ips];
    for t in tasks {
        let (i, status) = t.await.unwrap();
        match status {
            StatusCode::OK => admitted[i] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    let total: usize = admitted.iter().sum();
    assert!(
        admitted.iter().all(|&a| a <= P),
        "per-ip over-admitted: {admitted:?}"
    );
    assert!(total <= G, "global over-admitted: {total}");
    assert!(total > 0);
    // The per-IP rejections were rolled back in the global limit: exactly G - total are left,
    // which fresh IPs (each with room for P) find one by one.
    let mut later = 0;
    'probe: for i in 0..(G / P + 1) {
        let client = TestClient::from_ip(ip(&format!("127.0.1.{}", i + 2)));
        for _ in 0..P {
            let res = client.get(&server.url("/")).await;
            if res.status != StatusCode::OK {
                break 'probe;
            }
            later += 1;
        }
    }
    assert_eq!(later, G - total, "leftover spend in the global limit");
    Arc::try_unwrap(server).ok().unwrap().stop().await;
}

#[tokio::test]
async fn an_invalid_reload_keeps_the_old_rules_and_each_change_case_keeps_or_resets_state() {
    let base = |path: &str, quotas: &str, key: &str| {
        format!(
            "[[limit]]\nname = \"l\"\npath = \"{path}\"\nkey = \"{key}\"\nstrategy = \"fixed-window-first-hit\"\nquotas = \"{quotas}\"\n"
        )
    };
    let rules = Rules::memory(&base("/*", "2/hour", "ip"), RulesOptions::default()).unwrap();
    let server = serve(&rules).await;
    let c = TestClient::new();
    let url = server.url("/a");
    let get = || c.get_with(&url, &[("x-k", "1")]);
    assert_eq!(get().await.status, StatusCode::OK);
    assert_eq!(get().await.status, StatusCode::OK);
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);

    // Unchanged content: nothing to do.
    assert_eq!(
        rules.reload_text(&base("/*", "2/hour", "ip")).unwrap(),
        None
    );
    // Invalid: refused with its position, the old rules keep limiting.
    let e = rules
        .reload_text(&base("/*", "2/fortnight", "ip"))
        .unwrap_err();
    assert!(e.to_string().starts_with("line 6, column 10"), "{e}");
    assert_eq!(rules.names(), ["l"]);
    let e = rules.reload_text(" \n").unwrap_err();
    assert!(e.message().contains("empty"), "{e}");
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);

    // Path changed, quotas and key kept: state kept.
    let r = rules
        .reload_text(&base("/a", "2/hour", "ip"))
        .unwrap()
        .unwrap();
    assert_eq!(r.changed, ["l"]);
    assert!(r.fresh.is_empty() && r.added.is_empty() && r.removed.is_empty());
    assert_eq!(
        get().await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "state kept"
    );

    // Quotas changed: the 2 units spent are kept against the new limit of 1 (capped there).
    let r = rules
        .reload_text(&base("/a", "1/hour", "ip"))
        .unwrap()
        .unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(
        get().await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "never a free reset"
    );
    // Raised to 3: the 2 units spent are kept (a count is not capped at a lower limit, so a
    // lowered and raised quota admits its limit once), 1 is left.
    let r = rules
        .reload_text(&base("/a", "3/hour", "ip"))
        .unwrap()
        .unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(get().await.status, StatusCode::OK);
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);
    // Another period: the minute starts at the spend of the shortest old period containing it
    // (the hour's 3), and the hour stays as a ghost until its window ends.
    let r = rules
        .reload_text(&base("/a", "1/minute", "ip"))
        .unwrap()
        .unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);
    // A quota list: each new period from the old periods inside it (the minute's 3; the day's:
    // the minute and the hour's ghost, 3).
    let r = rules
        .reload_text(&base("/a", "5/minute; 4/day", "ip"))
        .unwrap()
        .unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(get().await.status, StatusCode::OK);
    assert_eq!(
        get().await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the day's 4"
    );
    // Strategy changed: converted too (the moving window's log stamped now).
    let moving =
        base("/a", "5/minute; 4/day", "ip").replace("fixed-window-first-hit", "moving-window");
    let r = rules.reload_text(&moving).unwrap().unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);
    let r = rules
        .reload_text(&base("/a", "6/hour", "ip"))
        .unwrap()
        .unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(get().await.status, StatusCode::OK, "4 of 6 in the hour");
    assert_eq!(get().await.status, StatusCode::OK);
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);

    // Key changed: fresh.
    let r = rules
        .reload_text(&base("/a", "1/hour", "header:x-k"))
        .unwrap()
        .unwrap();
    assert_eq!(r.fresh, ["l"]);
    assert_eq!(get().await.status, StatusCode::OK);
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);

    // A rename is a new limit.
    let renamed = base("/a", "1/hour", "header:x-k").replace("\"l\"", "\"m\"");
    let r = rules.reload_text(&renamed).unwrap().unwrap();
    assert_eq!(
        (r.added.as_slice(), r.removed.as_slice()),
        (&["m".to_owned()][..], &["l".to_owned()][..])
    );
    assert_eq!(get().await.status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_under_load_drops_no_request_and_resets_no_key() {
    let text = |extra: usize| {
        let mut t = String::from(
            "[[limit]]\nname = \"keep\"\npath = \"/keep\"\nstrategy = \"fixed-window-first-hit\"\nquotas = \"3/hour\"\n\n[[limit]]\nname = \"all\"\nquotas = \"1000000/hour\"\n",
        );
        for i in 0..extra {
            t.push_str(&format!(
                "\n[[limit]]\nname = \"x{i}\"\npath = \"/x{i}\"\nquotas = \"5/minute\"\n"
            ));
        }
        t
    };
    let file = TempFile::new("load", &text(0));
    let rules = Rules::from_path(file.0.as_path(), RulesOptions::default(), || {
        tollgate::store::MemoryStoreBuilder::default().build()
    })
    .unwrap();
    let watcher = rules.watch(file.0.clone(), Duration::from_millis(50));
    let server = Arc::new(serve(&rules).await);
    let c = TestClient::new();
    for _ in 0..3 {
        assert_eq!(c.get(&server.url("/keep")).await.status, StatusCode::OK);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (server, stop, sent) = (Arc::clone(&server), Arc::clone(&stop), Arc::clone(&sent));
        load.push(tokio::spawn(async move {
            let c = TestClient::new();
            while !stop.load(Ordering::Relaxed) {
                let res = c.get(&server.url("/load")).await;
                assert_eq!(res.status, StatusCode::OK, "{}", res.body);
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for round in 1..=6 {
        if round % 2 == 0 {
            file.replace(&text(round));
        } else {
            // An in-place write: a reader may see it half-written, which must be refused or
            // loaded whole, never leave a moment without rules.
            std::fs::write(&file.0, text(round)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            c.get(&server.url("/keep")).await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "the key of an unchanged limit is not reset by reload {round}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    assert!(sent.load(Ordering::Relaxed) > 0);
    assert_eq!(rules.names().len(), 2 + 6, "the last file is loaded");
    // The file vanishes: the rules stay.
    std::fs::remove_file(&file.0).unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(rules.names().len(), 8);
    assert_eq!(
        c.get(&server.url("/keep")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    watcher.abort();
    Arc::try_unwrap(server).ok().unwrap().stop().await;
}

#[tokio::test]
async fn a_shadow_limit_counts_without_rejecting() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "enforced"
        strategy = "fixed-window-first-hit"
        quotas = "3/hour"

        [[limit]]
        name = "next"
        strategy = "fixed-window-first-hit"
        quotas = "1/hour"
        shadow = true
        "#,
        RulesOptions {
            shadow_headers: true,
            ..RulesOptions::default()
        },
    )
    .unwrap();
    let server = serve(&rules).await;
    let c = TestClient::new();
    let first = c.get(&server.url("/")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.num("x-ratelimit-remaining"),
        2,
        "the shadow limit never sets x-ratelimit-*"
    );
    assert_eq!(first.num("x-ratelimit-shadow-remaining"), 0);
    for left in [1, 0] {
        let res = c.get(&server.url("/")).await;
        assert_eq!(
            res.status,
            StatusCode::OK,
            "a shadow rejection lets the request through"
        );
        assert_eq!(res.num("x-ratelimit-remaining"), left);
    }
    assert_eq!(
        c.get(&server.url("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    server.stop().await;
}

/// `(limit, outcome) -> value` of `tollgate_requests_total` in a Prometheus text page.
fn requests_total(page: &str, limit: &str, outcome: &str) -> u64 {
    page.lines()
        .filter(|l| l.starts_with("tollgate_requests_total{"))
        .find(|l| {
            l.contains(&format!("limit=\"{limit}\""))
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn the_server_serves_a_rules_file_and_its_metrics() {
    let file = TempFile::new(
        "server",
        r#"
[[limit]]
name = "login"
path = "/login"
methods = ["POST"]
strategy = "fixed-window-first-hit"
quotas = "2/hour"

[[limit]]
name = "shadow"
quotas = "1/hour"
shadow = true
"#,
    );
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--rules",
        file.path(),
        "--reload-interval",
        "50",
    ])
    .await;
    let c = TestClient::new();
    let post = || c.send(request(Method::POST, &server.url("/login"), &[]));
    assert_eq!(post().await.status, StatusCode::OK);
    assert_eq!(post().await.status, StatusCode::OK);
    assert_eq!(post().await.status, StatusCode::TOO_MANY_REQUESTS);
    let res = c
        .send(request(Method::PUT, &server.url("/any/where"), &[]))
        .await;
    assert_eq!((res.status, res.body.as_str()), (StatusCode::OK, "ok"));
    for _ in 0..3 {
        let m = c.get(&server.url("/metrics")).await;
        assert_eq!(m.status, StatusCode::OK, "/metrics is never limited");
    }
    let page = c.get(&server.url("/metrics")).await.body;
    assert_eq!(requests_total(&page, "login", "allowed"), 2, "{page}");
    assert_eq!(requests_total(&page, "login", "rejected"), 1, "{page}");
    assert_eq!(requests_total(&page, "shadow", "allowed"), 1, "{page}");
    assert_eq!(
        requests_total(&page, "shadow", "shadow_rejected"),
        2,
        "{page}"
    );
    assert!(!page.contains("127.0.0.1"), "the key is never a label");
    assert!(page.contains("tollgate_keys{limit=\"login\"} 1"), "{page}");
    assert!(
        page.contains("tollgate_units_total{limit=\"login\"} 2"),
        "{page}"
    );

    // A reload that does not parse is refused and counted; the old rules keep serving.
    file.replace("[[limit]]\nname = \"login\"\nquotas = \"2/fortnight\"\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post().await.status, StatusCode::TOO_MANY_REQUESTS);
    let page = c.get(&server.url("/metrics")).await.body;
    assert!(
        page.contains("tollgate_rules_reloads_total{result=\"error\"} 1"),
        "{page}"
    );
    let stderr = server.stop().await;
    assert!(stderr.contains("line 3, column 10"), "{stderr}");
}

#[tokio::test]
async fn a_rules_file_that_cannot_be_used_exits_2_with_its_line_and_column() {
    let file = TempFile::new(
        "bad",
        "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nstrategy = \"fast\"\n",
    );
    let out = run(&["--rules", file.path()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("line 4, column 12") && stderr.contains("unknown strategy"),
        "{stderr}"
    );
    let out = run(&["--rules", file.path(), "--quota", "1/second"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("set it in the rules file"));
    let out = run(&["--rules", file.path(), "--reload-interval", "10"]).await;
    assert_eq!(out.status.code(), Some(2));
}

/// A login form limited by IP and by username in one decision, where only failures count: the
/// handler's `Settle::refund()` gives a success back to both limits (`settle = "marker"`).
#[tokio::test]
async fn a_login_limited_by_ip_and_username_counts_only_failures() {
    use axum::Extension;
    use axum::response::IntoResponse;
    use tollgate::layer::Settle;

    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "login-ip"
        path = "/login"
        methods = ["POST"]
        strategy = "moving-window"
        quotas = "5/hour"
        settle = "marker"

        [[limit]]
        name = "login-user"
        path = "/login"
        methods = ["POST"]
        key = "header:x-user"
        strategy = "moving-window"
        quotas = "2/hour"
        settle = "marker"
        "#,
        RulesOptions::default(),
    )
    .unwrap();
    let app = Router::new()
        .route(
            "/login",
            axum::routing::post(|headers: http::HeaderMap| async move {
                if headers.get("x-pass").is_some_and(|p| p == "right") {
                    (Extension(Settle::refund()), "welcome").into_response()
                } else {
                    (StatusCode::UNAUTHORIZED, "wrong password").into_response()
                }
            }),
        )
        .layer(rules.layer());
    let server = TestServer::start(app).await;
    let c = TestClient::new();
    let login = |user: &'static str, pass: &'static str| {
        c.send(request(
            Method::POST,
            &server.url("/login"),
            &[("x-user", user), ("x-pass", pass)],
        ))
    };
    for _ in 0..4 {
        let res = login("alice", "right").await;
        assert_eq!(res.status, StatusCode::OK, "successes never count");
        assert_eq!(
            res.num("x-ratelimit-remaining"),
            2,
            "the settled state is reported"
        );
    }
    assert_eq!(
        login("alice", "wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        login("alice", "wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
    let res = login("alice", "right").await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "alice's 2 failures are spent"
    );
    // The rejection spent nothing from the IP limit: of its 5, the 2 failures are spent.
    assert_eq!(login("bob", "wrong").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(login("bob", "wrong").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        login("carol", "wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
    let res = login("dave", "wrong").await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the IP's 5 failures are spent"
    );
    assert_eq!(
        res.num("x-ratelimit-limit"),
        5,
        "the rejecting limit's headers"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_example_rules_file_loads_and_limits_logins_by_ip_and_username() {
    let rules = Rules::memory(
        include_str!("../../examples/rules.toml"),
        RulesOptions::default(),
    )
    .unwrap();
    assert_eq!(
        rules.names(),
        [
            "per-ip",
            "login-ip",
            "login-user",
            "api-global",
            "api-tokens",
            "api-user-next",
            "api-plans"
        ]
    );
    let server = serve(&rules).await;
    let c = TestClient::new();
    let login = |user: &'static str| {
        c.send(request(
            Method::POST,
            &server.url("/login"),
            &[("x-username", user)],
        ))
    };
    let res = c
        .send(request(Method::POST, &server.url("/login"), &[]))
        .await;
    assert_eq!(
        res.status,
        StatusCode::BAD_REQUEST,
        "no username: {}",
        res.body
    );
    for _ in 0..5 {
        assert_eq!(login("alice").await.status, StatusCode::OK);
    }
    assert_eq!(
        login("bob").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "5 per minute per IP"
    );
    let res = c.get_with(&server.url("/api/x"), &[("x-user", "u")]).await;
    assert_eq!(res.status, StatusCode::OK);
    assert!(
        res.header("x-ratelimit-shadow-remaining").is_none(),
        "shadow: no headers by default"
    );
    server.stop().await;
}

/// Seconds from Unix time `now` to the end of its day in the time zone `offset` seconds east of
/// UTC.
fn to_day_end(now: Duration, offset: i64) -> u64 {
    let local = (now.as_secs() as i64 + offset).rem_euclid(86_400);
    (86_400 - local) as u64
}

fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
}

#[tokio::test]
async fn the_server_applies_a_rules_files_window_offsets_and_shaping_queue() {
    let file = TempFile::new(
        "offset-queue",
        r#"
[[limit]]
name = "east"
path = "/east"
strategy = "fixed-window"
quotas = "1/day"
window_offset = "8h"

[[limit]]
name = "west"
path = "/west"
strategy = "sliding-window"
quotas = "1/day"
window_offset = "-05:00"

[[limit]]
name = "queue"
path = "/queue"
key = "global"
strategy = "leaky-bucket"
quotas = "1/second"
queue_ms = 1000
"#,
    );
    let server = Running::start(&["--addr", "127.0.0.1:0", "--rules", file.path()]).await;
    let c = TestClient::new();
    // A day's window ends at midnight in the limit's time zone, not at midnight UTC.
    for (path, offset) in [("/east", 8 * 3600), ("/west", -5 * 3600)] {
        let before = unix_now();
        let res = c.get(&server.url(path)).await;
        let after = unix_now();
        assert_eq!(res.status, StatusCode::OK, "{path}");
        let reset = res.num("x-ratelimit-reset");
        assert!(
            to_day_end(after, offset).saturating_sub(1) <= reset
                && reset <= to_day_end(before, offset) + 1,
            "{path}: reset in {reset} s, the day ends at offset {offset} s in {} s",
            to_day_end(before, offset)
        );
        let res = c.get(&server.url(path)).await;
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
    // The queue: 1 per second, at most 1 s of wait: the first leaves at once, the second a
    // second later, the others are refused at once.
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (c, url) = (c.clone(), server.url("/queue"));
        tasks.push(tokio::spawn(async move { c.get(&url).await }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let res = t.await.unwrap();
        if res.status == StatusCode::OK {
            assert_eq!(res.num("x-ratelimit-limit"), 2, "the queue's depth");
        }
        statuses.push(res.status);
    }
    let ok = statuses.iter().filter(|&&s| s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|&&s| s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((ok, refused), (2, 2), "{statuses:?}");
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "the second request waited for its departure: {:?}",
        start.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_bad_window_offset_or_queue_in_a_rules_file_exits_2_with_its_line_and_column() {
    for (text, at, needle) in [
        (
            "[[limit]]\nname = \"a\"\nquotas = \"1/day\"\nwindow_offset = \"+25:00\"\n",
            "line 4, column 17",
            "window offset",
        ),
        (
            "[[limit]]\nname = \"a\"\nquotas = \"1/second\"\nqueue_ms = 500\n",
            "line 4, column 12",
            "leaky-bucket",
        ),
    ] {
        let file = TempFile::new("bad-offset-queue", text);
        let out = run(&["--rules", file.path()]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(at) && stderr.contains(needle), "{stderr}");
    }
}

/// Bug: a reload that added back a limit removed by an earlier one failed with `DuplicateName`
/// while a request started on the older rules was still in flight (it holds the removed
/// limiter, whose name stays taken on a shared store).
#[tokio::test]
async fn a_limit_removed_and_added_back_while_requests_are_in_flight_reloads_and_frees_its_name() {
    use tollgate::store::{Answer, LimiterNames, MemoryStore, Scope, Store};

    /// One memory store shared by every limit, as one Redis store is.
    #[derive(Clone, Default)]
    struct SharedMemory(Arc<MemoryStore<Vec<u8>>>);

    impl Store<Vec<u8>> for SharedMemory {
        type Future = <MemoryStore<Vec<u8>> as Store<Vec<u8>>>::Future;

        fn apply(
            &self,
            key: &Vec<u8>,
            scope: Scope<'_>,
            op: tollgate::Op,
            now: u64,
        ) -> Answer<Self::Future> {
            self.0.apply(key, scope, op, now)
        }

        fn names(&self) -> &LimiterNames {
            Store::<Vec<u8>>::names(&*self.0)
        }

        fn stats(&self) -> tollgate::Stats {
            Store::<Vec<u8>>::stats(&*self.0)
        }
    }

    let store = SharedMemory::default();
    let shared = store.clone();
    let a = "[[limit]]\nname = \"a\"\nkey = \"global\"\nquotas = \"5/hour\"\n";
    let b = "[[limit]]\nname = \"b\"\nkey = \"global\"\nquotas = \"5/hour\"\n";
    let rules = Rules::new(a, RulesOptions::default(), move || shared.clone()).unwrap();
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let app = Router::new()
        .route(
            "/slow",
            axum::routing::get({
                let (gate, entered) = (Arc::clone(&gate), Arc::clone(&entered));
                move || async move {
                    entered.notify_one();
                    gate.notified().await;
                    "slow"
                }
            }),
        )
        .fallback(|| async { "ok" })
        .layer(rules.layer());
    let server = TestServer::start(app).await;
    let c = TestClient::new();
    let slow = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/slow"));
        async move { c.get(&url).await }
    });
    entered.notified().await;
    // The request in flight holds the rules with "a": renamed away, then back, then away again.
    rules.reload_text(b).expect("a removed");
    let report = rules.reload_text(a).expect("a added back").unwrap();
    assert_eq!(report.added, ["a"]);
    assert_eq!(
        c.get(&server.url("/fast")).await.status,
        StatusCode::OK,
        "the added-back limit decides"
    );
    rules
        .reload_text(&format!("{b}\n# a renamed away again\n"))
        .expect("a removed again");
    assert!(store.names().contains("a"), "the slow request holds it");
    gate.notify_one();
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    // Once no request holds the older rules, the name is free on the store.
    for _ in 0..100 {
        if !store.names().contains("a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !store.names().contains("a"),
        "the removed limit's name is released"
    );
    assert!(store.names().contains("b"));
    server.stop().await;
}
