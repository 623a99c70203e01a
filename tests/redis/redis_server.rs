//! The `server` example on the Redis store: two processes share one Redis, so together they admit
//! exactly the limit (issue 4: "two server processes sharing one Redis").

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

fn server_binary() -> PathBuf {
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
async fn start_server(args: &[&str]) -> (Child, String) {
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

#[tokio::test]
async fn server_with_an_unreachable_redis_exits_with_an_error() {
    let port = redis_support::free_port();
    let out = Command::new(server_binary())
        .args([
            "--addr",
            "127.0.0.1:0",
            "--store",
            &format!("redis://127.0.0.1:{port}"),
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis"));
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
}
