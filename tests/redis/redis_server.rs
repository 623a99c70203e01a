//! The `server` example on the Redis store: two processes share one Redis, so together they admit
//! exactly the limit.

use crate::redis_support;
use crate::support as http_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use http::StatusCode;
use http_support::TestClient;
use redis_support::RedisServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) fn server_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = dir.join("examples").join("server");
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds it",
        path.display()
    );
    path
}

/// Starts `server` with `args` and returns it with its base URL.
pub(crate) async fn start_server(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(server_binary())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut line))
        .await
        .expect("server did not start")
        .unwrap();
    let base = line
        .trim_end()
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();
    (child, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_share_one_limit_through_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--strategy",
        "moving-window",
        "--quota",
        "25/hour",
        "--key",
        "global",
        "--fail-closed",
        // Fail-closed makes a timeout a 503: give a loaded CI machine room (the default is 50 ms).
        "--store-timeout",
        "2000",
    ];
    let (mut a, base_a) = start_server(&args).await;
    let (mut b, base_b) = start_server(&args).await;

    let client = TestClient::new();
    let mut tasks = Vec::new();
    for i in 0..120 {
        let client = client.clone();
        let base = if i % 2 == 0 {
            base_a.clone()
        } else {
            base_b.clone()
        };
        tasks.push(tokio::spawn(async move {
            client.get(&format!("{base}/")).await
        }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        let res = t.await.unwrap();
        match res.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(res.num("retry-after") >= 1);
                limited += 1;
            }
            other => panic!("unexpected {other} (a store error under fail-closed?): {res:?}"),
        }
    }
    assert_eq!((ok, limited), (25, 95), "the two processes share one limit");
    let res = client.get(&format!("{base_b}/")).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.num("x-ratelimit-remaining"), 0);
    let _ = a.kill().await;
    let _ = b.kill().await;
}

/// Start-up: a server whose Redis is down starts anyway, answers by its failure policy
/// (503 when fail-closed), and limits normally within 2 s of Redis accepting connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_starts_without_redis_and_limits_once_redis_is_up() {
    if !redis_support::available() {
        return;
    }
    let port = redis_support::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let (mut server, base) = start_server(&[
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--quota",
        "3/hour",
        "--key",
        "global",
        "--fail-closed",
        "--store-timeout",
        "2000",
    ])
    .await;
    let client = TestClient::new();
    let res = client.get(&format!("{base}/")).await;
    assert_eq!(
        res.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "no Redis yet: fail-closed answers 503"
    );
    let redis = tokio::task::spawn_blocking(move || RedisServer::start_on_port(port, &[]))
        .await
        .unwrap()
        .expect("redis-server is available");
    let up = std::time::Instant::now();
    let mut statuses = Vec::new();
    loop {
        let res = client.get(&format!("{base}/")).await;
        if res.status != StatusCode::SERVICE_UNAVAILABLE {
            statuses.push(res.status);
            break;
        }
        // Timing is asserted with a second of slack for a loaded machine (the bound is 2 s).
        assert!(
            up.elapsed() < Duration::from_secs(3),
            "no limiting {:?} after Redis came up",
            up.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "limiting resumed {:?} after Redis answered PING",
        up.elapsed()
    );
    for _ in 0..5 {
        statuses.push(client.get(&format!("{base}/")).await.status);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 3, "exactly the limit once Redis is up: {statuses:?}");
    assert!(
        statuses[3..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let _ = server.kill().await;
    drop(redis);
}

/// A Redis that answers and refuses the password: exit 1 (a failure at run time), and neither the
/// password given nor the server's is printed.
#[tokio::test]
async fn server_with_a_wrong_redis_password_exits_1_without_printing_it() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // Set after the start (the harness waits for an unauthenticated PING).
    redis.cli(&["CONFIG", "SET", "requirepass", "the-right-one"]);
    let url = format!("redis://:hunter2-wrong@127.0.0.1:{}", redis.port);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(server_binary())
            .args(["--addr", "127.0.0.1:0", "--store", &url])
            .args(["--store-timeout", "2000"])
            .output(),
    )
    .await
    .expect("the server did not exit")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains(":***@"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(!stderr.contains("the-right-one"), "{stderr}");
    // The server's own words, at once (it used to look like a connect timeout).
    assert!(stderr.contains("WRONGPASS"), "{stderr}");
}

/// Degraded mode through the server: `--fail-mode local --instances 2` with Redis down
/// answers from the local limiter (half the limit, with its headers), never 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fail_mode_local_limits_with_its_share_while_redis_is_down() {
    if !redis_support::available() {
        return;
    }
    let url = format!("redis://127.0.0.1:{}", redis_support::free_port());
    let (mut server, base) = start_server(&[
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--quota",
        "10/hour",
        "--key",
        "global",
        "--fail-mode",
        "local",
        "--instances",
        "2",
    ])
    .await;
    let client = TestClient::new();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let res = client.get(&format!("{base}/")).await;
        assert_eq!(res.num("x-ratelimit-limit"), 5, "{res:?}");
        statuses.push(res.status);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 5, "{statuses:?}");
    assert!(
        statuses[5..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    // The metrics tell the local decisions apart.
    let page = client.get(&format!("{base}/metrics")).await.body;
    let value = |series: &str| {
        page.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse::<f64>().unwrap())
    };
    let outcome = |o: &str| {
        value(&format!(
            "tollgate_requests_total{{limit=\"default\",outcome=\"{o}\"}}"
        ))
    };
    assert_eq!(outcome("local_allowed"), Some(5.0), "{page}");
    assert_eq!(outcome("local_rejected"), Some(3.0), "{page}");
    assert_eq!(outcome("allowed").unwrap_or(0.0), 0.0, "{page}");
    assert_eq!(
        value("tollgate_breaker_open{limit=\"default\"}"),
        Some(0.0),
        "never connected: no outage counted, the breaker stays closed: {page}"
    );
    let _ = server.kill().await;
}

/// `--redis-ca` with a file that is not PEM: a configuration error (exit 2) naming the file.
#[tokio::test]
async fn server_refuses_a_ca_bundle_that_is_not_pem() {
    let file = std::env::temp_dir().join(format!("tollgate-not-pem-{}", std::process::id()));
    std::fs::write(&file, "not a certificate\n").unwrap();
    let out = Command::new(server_binary())
        .args(["--addr", "127.0.0.1:0", "--store", "rediss://127.0.0.1:1"])
        .arg("--redis-ca")
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a PEM file"), "{stderr}");
    std::fs::remove_file(&file).unwrap();
}

/// A host name that does not resolve is not a Redis still booting: the server starts (deciding by
/// the failure policy), says at error level that the name does not resolve, and
/// `tollgate_store_up` is 0.
#[tokio::test]
async fn a_redis_host_name_that_does_not_resolve_is_an_error_and_store_up_is_0() {
    let mut child = Command::new(server_binary())
        .args(["--addr", "127.0.0.1:0"])
        .args(["--store", "redis://tollgate-no-such-host.invalid:6379"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut line))
        .await
        .expect("server did not start")
        .unwrap();
    let base = line
        .trim_end()
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();
    let c = TestClient::new();
    let page = c.get(&format!("{base}/metrics")).await.body;
    assert!(
        page.contains("tollgate_store_up{limit=\"default\"} 0"),
        "{page}"
    );
    child.kill().await.unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(stderr.contains("ERROR"), "{stderr}");
    assert!(
        stderr.contains("tollgate-no-such-host.invalid does not resolve"),
        "{stderr}"
    );
}
