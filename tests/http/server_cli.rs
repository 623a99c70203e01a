//! The `server` example's command line, run as a user runs it: the binary `cargo test` builds (in
//! `target/debug/examples/`; a filtered run such as `cargo test --all-features --test http` does not
//! rebuild it: `cargo build --all-features --examples` first). `--help`, exit codes, warnings, the
//! single stdout line, host names in `--addr`, no password in a Redis start error (a Redis that
//! refuses the password: `tests/redis/redis_server.rs`), `--cost` and `--delay-ms` over HTTP.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::examples::example;
use crate::support::TestClient;
use http::StatusCode;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

/// The `server` example binary.
fn server_binary() -> std::path::PathBuf {
    example("server")
}

/// Runs the server with `args` to completion (it must exit by itself: a refused configuration).
pub(crate) async fn run(args: &[&str]) -> Output {
    tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(server_binary())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("server {args:?} did not exit"))
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A free loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A running server whose stdout and stderr are kept for the checks after it stops.
pub(crate) struct Running {
    child: Child,
    base: String,
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
}

impl Running {
    /// Starts the server and waits for its `listening on http://ADDR` line.
    pub(crate) async fn start(args: &[&str]) -> Self {
        let mut child = Command::new(server_binary())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let stderr = child.stderr.take().unwrap();
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
            .await
            .expect("the server did not start")
            .unwrap();
        let base = line
            .strip_suffix('\n')
            .and_then(|l| l.strip_prefix("listening on "))
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Running {
            child,
            base,
            stdout,
            stderr,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Stops the server by its PID with SIGTERM; checks exit code 0 and that stdout held nothing
    /// after the first line; returns stderr.
    pub(crate) async fn stop(mut self) -> String {
        let pid = self.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        let code = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("no exit after SIGTERM")
            .unwrap();
        assert_eq!(code.code(), Some(0), "exit code after SIGTERM");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "", "exactly one line on stdout");
        let mut err = String::new();
        self.stderr.read_to_string(&mut err).await.unwrap();
        err
    }
}

/// Every flag of the table in the example's docs, as `--help` must list it.
const FLAGS: [&str; 28] = [
    "--addr",
    "--strategy",
    "--quota",
    "--burst",
    "--key",
    "--on-missing-key",
    "--trust-proxy",
    "--forwarded-header",
    "--store",
    "--fail-mode",
    "--fail-closed",
    "--reset-format",
    "--max-keys",
    "--store-timeout",
    "--redis-ca",
    "--redis-cert",
    "--redis-key",
    "--instances",
    "--redis-lease",
    "--rules",
    "--reload-interval",
    "--settle-header",
    "--cost",
    "--concurrency",
    "--delay-ms",
    "--window-offset",
    "--queue",
    "--help",
];

#[tokio::test]
async fn help_describes_every_flag_on_stdout() {
    let out = run(&["--help"]).await;
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for flag in FLAGS {
        let line = help
            .lines()
            .find(|l| l.trim_start().split([' ', ',']).any(|w| w == flag))
            .unwrap_or_else(|| panic!("--help does not list {flag}:\n{help}"));
        // A description follows the flag and its value name.
        let described = line.split_once(flag).map(|(_, rest)| rest.trim()).unwrap();
        assert!(
            described.split_whitespace().count() >= 2,
            "{flag} has no description: {line:?}"
        );
    }
    assert!(help.contains("[default: 10/minute]"), "{help}");
    assert!(help.contains("Exit codes"), "{help}");
    assert_eq!(text(&out.stderr), "");
}

/// A bad value or a contradiction: exit 2, nothing on stdout, a message naming the problem.
async fn assert_refused(args: &[&str], needle: &str) {
    let out = run(args).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stdout, "", "{args:?}");
    assert!(
        stderr.starts_with("server: ") && stderr.contains(needle),
        "{args:?}: expected {needle:?} in {stderr:?}"
    );
}

#[tokio::test]
async fn bad_values_exit_2_with_a_message_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--fail-mode", "sometimes"], "--fail-mode"),
        (&["--reload-interval", "49"], "below 50"),
        (&["--reload-interval", "1"], "below 50"),
        (&["--reload-interval", "soon"], "--reload-interval"),
        (&["--window-offset", "24h"], "under 24 hours"),
        (&["--window-offset", "-24:00"], "under 24 hours"),
        (&["--window-offset", "5x"], "--window-offset"),
        (&["--window-offset", "+5:60"], "--window-offset"),
        (&["--settle-header", "not a header"], "--settle-header"),
        (&["--cost", "-1"], "'-1'"),
        (&["--cost", "4294967296"], "--cost"),
        (&["--concurrency", "0"], "--concurrency"),
        (&["--delay-ms", "600001"], "--delay-ms"),
        (&["--queue", "0"], "--queue"),
        (&["--instances", "0"], "--instances"),
        (&["--redis-lease", "maybe"], "--redis-lease"),
        (&["--addr", "localhost"], "HOST:PORT"),
        (&["--rules", "/nonexistent/tollgate-rules.toml"], "--rules"),
        (&["--rules", "/"], "not a regular file"),
        (&["--strategy", "token-bucket", "--burst", "x"], "--burst"),
    ];
    for (args, needle) in cases {
        assert_refused(args, needle).await;
    }
}

#[tokio::test]
async fn contradictions_exit_2() {
    let rules =
        std::env::temp_dir().join(format!("tollgate-cli-rules-{}.toml", std::process::id()));
    std::fs::write(&rules, "[[limit]]\nname = \"all\"\nquotas = \"5/minute\"\n").unwrap();
    let rules = rules.to_str().unwrap().to_owned();
    let pem = rules.as_str(); // any readable file stands in for a PEM file here
    assert_refused(&["--fail-closed", "--fail-mode", "open"], "contradicts").await;
    assert_refused(&["--fail-mode", "local", "--fail-closed"], "contradicts").await;
    assert_refused(&["--redis-ca", pem], "needs a TLS store").await;
    assert_refused(
        &["--store", "redis://127.0.0.1:1", "--redis-ca", pem],
        "needs a TLS store",
    )
    .await;
    assert_refused(
        &["--store", "rediss://127.0.0.1:1", "--redis-cert", pem],
        "--redis-cert needs --redis-key",
    )
    .await;
    assert_refused(
        &[
            "--store",
            "rediss://127.0.0.1:1",
            "--redis-ca",
            "/nonexistent/ca.pem",
        ],
        "/nonexistent/ca.pem",
    )
    .await;
    let per_limit: [&[&str]; 7] = [
        &["--strategy", "token-bucket"],
        &["--quota", "5/minute"],
        &["--burst", "3"],
        &["--key", "global"],
        &["--cost", "2"],
        &["--window-offset", "8h"],
        &["--queue", "3000"],
    ];
    for flag in per_limit {
        let mut args = vec!["--rules", rules.as_str()];
        args.extend_from_slice(flag);
        assert_refused(
            &args,
            &format!("{} is a per-limit flag: set it in the rules file", flag[0]),
        )
        .await;
    }
    assert_refused(
        &["--rules", rules.as_str(), "--concurrency", "4"],
        "--concurrency cannot apply with --rules: set concurrency in the rules file",
    )
    .await;
    // `--fail-closed` agrees with `--fail-mode closed`: no contradiction (a warning on memory).
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--fail-mode",
        "closed",
        "--fail-closed",
    ])
    .await;
    let stderr = server.stop().await;
    assert!(
        stderr.contains("no effect with the memory store"),
        "{stderr}"
    );
    std::fs::remove_file(&rules).unwrap();
}

/// `fail_mode = "local"` in a rules file on the memory store, which never fails: the server runs,
/// the limit limits, and one warning says it has no effect, not repeated by a reload.
#[tokio::test]
async fn a_local_fail_mode_on_the_memory_store_warns_once() {
    let rules = std::env::temp_dir().join(format!(
        "tollgate-cli-local-{}-{}.toml",
        std::process::id(),
        closed_port()
    ));
    let limit = |name: &str| {
        format!(
            "[[limit]]\nname = \"{name}\"\npath = \"/{name}\"\nquotas = \"1/hour\"\n\
             fail_mode = \"local\"\n\n"
        )
    };
    std::fs::write(&rules, limit("a")).unwrap();
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--rules",
        rules.to_str().unwrap(),
        "--reload-interval",
        "50",
    ])
    .await;
    let client = TestClient::new();
    assert_eq!(client.get(&server.url("/a")).await.status, StatusCode::OK);
    assert_eq!(
        client.get(&server.url("/a")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A reload adding another `local` limit: applied (its fields appear), not warned again.
    std::fs::write(&rules, format!("{}{}", limit("a"), limit("b"))).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client
        .get(&server.url("/b"))
        .await
        .header("x-ratelimit-limit")
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload never applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stderr = server.stop().await;
    let warned = "fail_mode = \"local\" has no effect on the memory store (it never fails)";
    assert_eq!(stderr.matches(warned).count(), 1, "{stderr}");
    std::fs::remove_file(&rules).unwrap();
}

#[tokio::test]
async fn flags_without_effect_warn_once_on_stderr_and_the_server_runs() {
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "moving-window",
        "--quota",
        "2/hour",
        "--burst",
        "5",
        "--store-timeout",
        "100",
        "--instances",
        "3",
        "--reload-interval",
        "500",
        "--window-offset",
        "30m",
        "--redis-lease",
        "--queue",
        "2000",
        "--forwarded-header",
        "forwarded",
    ])
    .await;
    let client = TestClient::new();
    for remaining in [1, 0] {
        let res = client.get(&server.url("/")).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.num("x-ratelimit-remaining"), remaining);
    }
    assert_eq!(
        client.get(&server.url("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the burst was ignored: the window admits its limit"
    );
    let stderr = server.stop().await;
    for flag in [
        "--burst",
        "--store-timeout",
        "--instances",
        "--reload-interval",
        "--window-offset",
        "--redis-lease",
        "--queue",
        "--forwarded-header",
    ] {
        let warnings = stderr
            .lines()
            .filter(|l| l.starts_with(&format!("server: warning: {flag} has no effect")))
            .count();
        assert_eq!(warnings, 1, "{flag}: {stderr}");
    }

    // `--max-keys` with a Redis store warns before the store is even reached (an unreachable
    // Redis does not stop the start; without the Redis store in the build, exit 2).
    let redis = format!("redis://127.0.0.1:{}", closed_port());
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--store",
        &redis,
        "--max-keys",
        "10",
    ];
    let stderr = if cfg!(feature = "redis") {
        Running::start(&args).await.stop().await
    } else {
        let out = run(&args).await;
        assert_eq!(out.status.code(), Some(2));
        text(&out.stderr)
    };
    assert_eq!(
        stderr.matches("warning: --max-keys has no effect").count(),
        1,
        "{stderr}"
    );

    // A combination where every flag acts prints nothing on stderr.
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "token-bucket",
        "--burst",
        "2",
        "--max-keys",
        "100",
    ])
    .await;
    assert_eq!(server.stop().await, "");
}

#[tokio::test]
async fn addr_accepts_a_host_name_and_stdout_is_one_listening_line() {
    let server = Running::start(&["--addr", "localhost:0", "--quota", "1/hour"]).await;
    let port = server.base.rsplit_once(':').map(|(_, p)| p).unwrap();
    assert!(
        (server.base.starts_with("http://127.0.0.1:") || server.base.starts_with("http://[::1]:"))
            && port.parse::<u16>().is_ok_and(|p| p != 0),
        "{}",
        server.base
    );
    let client = TestClient::new();
    let res = client.get(&server.url("/")).await;
    assert_eq!((res.status, res.body.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(
        client.get(&server.url("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(server.stop().await, "");
}

#[tokio::test]
async fn a_taken_port_is_a_runtime_failure_with_exit_code_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(&["--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains("cannot listen"));
}

#[tokio::test]
async fn a_redis_start_error_never_prints_the_password() {
    let port = closed_port();
    let urls = [
        format!("redis://alice:hunter2-secret@127.0.0.1:{port}"),
        format!("redis://:hunter2-secret@127.0.0.1:{port}/0"),
        format!("redis+cluster://alice:hunter2-secret@127.0.0.1:{port},127.0.0.1:{port}"),
        format!("ftp://alice:hunter2-secret@127.0.0.1:{port}"),
    ];
    // An unreachable Redis is not a start-up error (the server starts, answers by its
    // failure policy and connects in the background): what it prints must not carry the password
    // either. Without the Redis store in the build, a configuration error (2).
    for url in &urls {
        let redis = url.starts_with("redis");
        let stderr = if redis && cfg!(feature = "redis") {
            let server = Running::start(&["--addr", "127.0.0.1:0", "--store", url]).await;
            server.stop().await
        } else {
            let out = run(&["--addr", "127.0.0.1:0", "--store", url]).await;
            assert_eq!(out.status.code(), Some(2), "{url}");
            assert_eq!(text(&out.stdout), "", "{url}");
            text(&out.stderr)
        };
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
        assert!(
            redis || stderr.contains("--store") || stderr.contains("Redis"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn cost_charges_each_request_its_units_over_http() {
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "fixed-window",
        "--quota",
        "10/hour",
        "--cost",
        "3",
    ])
    .await;
    let client = TestClient::new();
    for remaining in [7, 4, 1] {
        let res = client.get(&server.url("/")).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.num("x-ratelimit-remaining"), remaining);
    }
    let res = client.get(&server.url("/")).await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "3 units do not fit in 1"
    );
    assert_eq!(res.num("x-ratelimit-remaining"), 1);
    server.stop().await;

    // Cost 0 is a peek: it never spends.
    let server =
        Running::start(&["--addr", "127.0.0.1:0", "--quota", "2/hour", "--cost", "0"]).await;
    for _ in 0..4 {
        let res = client.get(&server.url("/")).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.num("x-ratelimit-remaining"), 2);
    }
    server.stop().await;
}

#[tokio::test]
async fn delay_ms_makes_the_handler_take_that_long() {
    let server = Running::start(&["--addr", "127.0.0.1:0", "--delay-ms", "400"]).await;
    let client = TestClient::new();
    let started = Instant::now();
    let res = client.get(&server.url("/")).await;
    let took = started.elapsed();
    assert_eq!((res.status, res.body.as_str()), (StatusCode::OK, "ok"));
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        9,
        "the delayed request was counted"
    );
    server.stop().await;
}

#[tokio::test]
async fn settle_header_charges_what_the_handler_reports() {
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "fixed-window",
        "--quota",
        "20/hour",
        "--cost",
        "4",
        "--settle-header",
        "x-used",
    ])
    .await;
    let client = TestClient::new();
    let res = client.get(&server.url("/?used=1")).await;
    assert_eq!(res.header("x-used"), Some("1"), "the handler echoes `used`");
    assert_eq!(res.num("x-ratelimit-remaining"), 19, "the settled state");
    let res = client.get(&server.url("/")).await;
    assert_eq!(res.header("x-used"), Some("4"), "no `used`: the estimate");
    assert_eq!(res.num("x-ratelimit-remaining"), 15);
    for bad in ["-1", "abc", "4294967296"] {
        let res = client.get(&server.url(&format!("/?used={bad}"))).await;
        assert_eq!(res.header("x-used"), Some(bad), "verbatim");
        assert_eq!(res.status, StatusCode::OK);
    }
    // Each bad value left the estimate (4) charged: 15 - 3 x 4 = 3 left, less than an estimate.
    let res = client.get(&server.url("/?used=0")).await;
    assert_eq!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS,
        "3 units left < estimate 4"
    );
    let stderr = server.stop().await;
    assert_eq!(
        stderr.matches("the estimate stands").count(),
        1,
        "one warning for the bad values: {stderr}"
    );
}

#[tokio::test]
async fn concurrency_caps_requests_in_flight_per_key() {
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--quota",
        "100/minute",
        "--concurrency",
        "2",
        "--delay-ms",
        "500",
    ])
    .await;
    let client = TestClient::new();
    let url = server.url("/");
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let res = t.await.unwrap();
        if res.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(res.header("x-ratelimit-limit"), Some("2"));
            assert_eq!(res.header("x-ratelimit-remaining"), Some("0"));
            assert_eq!(res.header("retry-after"), Some("1"));
            assert!(
                res.body.contains("at most 2 requests in flight"),
                "{}",
                res.body
            );
        }
        statuses.push(res.status);
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "two in flight, the third refused at once"
    );
    assert_eq!(
        client.get(&url).await.status,
        StatusCode::OK,
        "the slots came back"
    );
    server.stop().await;
}

/// The flag table of the example's docs and of the guide's `server` chapter.
fn flag_table(text: &str, line_prefix: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix(line_prefix))
        .skip_while(|l| !l.starts_with("| Flag |"))
        .take_while(|l| l.starts_with('|'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_guide_and_the_example_docs_show_the_same_flag_table() {
    let root = env!("CARGO_MANIFEST_DIR");
    let docs = std::fs::read_to_string(format!("{root}/examples/server.rs")).unwrap();
    let guide = std::fs::read_to_string(format!("{root}/src/guide/server.rs")).unwrap();
    let table = flag_table(&docs, "//! ");
    assert!(!table.is_empty(), "examples/server.rs has no flag table");
    assert_eq!(
        table,
        flag_table(&guide, "//! "),
        "src/guide/server.rs and examples/server.rs differ"
    );
    for flag in FLAGS.iter().filter(|f| **f != "--help") {
        assert!(
            table
                .iter()
                .any(|row| row.starts_with(&format!("| `{flag}"))
                    || row.contains(&format!(", `{flag} "))),
            "{flag} has no row in the flag table"
        );
    }
}

#[tokio::test]
async fn window_offset_moves_the_daily_reset_to_the_zones_midnight() {
    for (offset, east_secs) in [("8h", 8 * 3600), ("-05:00", 19 * 3600)] {
        let server = Running::start(&[
            "--addr",
            "127.0.0.1:0",
            "--strategy",
            "fixed-window",
            "--quota",
            "1/day",
            "--window-offset",
            offset,
        ])
        .await;
        let client = TestClient::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        // Seconds to the next midnight of the zone (16:00 UTC for +8h, 05:00 UTC for -5h).
        let expected = 86_400 - (now + east_secs) % 86_400;
        let res = client.get(&server.url("/")).await;
        assert_eq!(res.status, StatusCode::OK);
        let reset = res.num("x-ratelimit-reset");
        assert!(
            reset.abs_diff(expected) <= 1,
            "{offset}: {reset} vs {expected}"
        );
        let res = client.get(&server.url("/")).await;
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(res.num("retry-after").abs_diff(expected) <= 1, "{offset}");
        assert_eq!(server.stop().await, "", "{offset}: no warning");
    }
}

#[tokio::test]
async fn queue_delays_requests_to_the_rate_and_refuses_beyond_the_maximum_wait() {
    // 10/s (T = 100 ms), MAX_WAIT 300 ms: of six requests at once, four leave 0, 100, 200 and
    // 300 ms after the first; two get 429 at once.
    let server = Running::start(&[
        "--addr",
        "127.0.0.1:0",
        "--strategy",
        "leaky-bucket",
        "--quota",
        "10/second",
        "--queue",
        "300",
        "--key",
        "global",
    ])
    .await;
    let client = TestClient::new();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let (client, url) = (client.clone(), server.url("/"));
        tasks.push(tokio::spawn(async move {
            // Staggered by 5 ms so that they arrive in this order.
            tokio::time::sleep(Duration::from_millis(5 * i)).await;
            let res = client.get(&url).await;
            (res.status, start.elapsed())
        }));
    }
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for t in tasks {
        let (status, at) = t.await.unwrap();
        match status {
            StatusCode::OK => ok.push(at),
            StatusCode::TOO_MANY_REQUESTS => refused.push(at),
            s => panic!("unexpected {s}"),
        }
    }
    assert_eq!((ok.len(), refused.len()), (4, 2), "{ok:?} {refused:?}");
    // Refused ones would have left at 400 ms or later: they are answered well before.
    for at in &refused {
        assert!(*at < Duration::from_millis(350), "a 429 at once: {at:?}");
    }
    // A timer never fires early: the k-th answer comes at least k intervals after the start.
    ok.sort();
    for (k, at) in ok.iter().enumerate() {
        assert!(
            *at >= Duration::from_millis(100 * k as u64),
            "departures T apart: {ok:?}"
        );
    }
    assert!(ok[3] <= Duration::from_millis(300 + 500), "{ok:?}");
    assert_eq!(server.stop().await, "", "no warning");
}
