//! The `server` example with `--rules` on Redis: a file's `concurrency` holds across two server
//! processes sharing one Redis, and its `fail_mode` per limit (open, closed, local) while Redis is
//! unreachable, `local` refused at its line without `--fail-mode local`.

use crate::redis_server::{server_binary, start_server};
use crate::redis_support::{self, RedisServer};
use crate::support::TestClient;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use http::StatusCode;

/// A rules file in the temp directory, removed when dropped.
struct RulesFile(PathBuf);

impl RulesFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "tollgate-{name}-{}-{}.toml",
            std::process::id(),
            redis_support::free_port()
        ));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for RulesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_concurrency_holds_across_two_servers_on_one_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let file = RulesFile::new(
        "concurrency",
        "[[limit]]\nname = \"gpu\"\nkey = \"header:x-api-key\"\nquotas = \"1000/hour\"\n\
         concurrency = 2\n",
    );
    let url = redis.url();
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--rules",
        file.path(),
        "--store-timeout",
        "2000",
        // Each request holds its slot this long: every request below arrives while the first
        // two hold theirs.
        "--delay-ms",
        "2000",
    ];
    let (mut a, base_a) = start_server(&args).await;
    let (mut b, base_b) = start_server(&args).await;
    let client = TestClient::new();
    let burst = |n: usize| {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let url = format!("{}/", if i % 2 == 0 { &base_a } else { &base_b });
                let client = client.clone();
                tokio::spawn(async move { client.get_with(&url, &[("x-api-key", "k")]).await })
            })
            .collect();
        async move {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        }
    };
    let started = Instant::now();
    let answers = burst(10).await;
    let ok = answers
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    for r in answers.iter().filter(|r| r.status != StatusCode::OK) {
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
        assert_eq!(r.num("retry-after"), 1, "{r:?}");
        assert_eq!(r.num("x-ratelimit-limit"), 2, "{r:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the burst outlasted one request's hold: {:?}",
        started.elapsed()
    );
    // Two across both servers, not two each, and not fewer.
    assert_eq!(ok, 2, "{answers:?}");
    // The slots are given back when the responses end (a lease release each): once Redis holds
    // no lease, two requests fit again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis.cli(&["KEYS", "*c:gpu*"]).is_empty() {
        assert!(Instant::now() < deadline, "the leases were never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = burst(2).await;
    assert!(
        again.iter().all(|r| r.status == StatusCode::OK),
        "{again:?}"
    );
    let _ = a.kill().await;
    let _ = b.kill().await;
}

/// Three limits of 4 an hour on their own paths, one per `fail_mode`.
const THREE_MODES: &str = "\
[[limit]]\nname = \"open\"\npath = \"/open\"\nkey = \"global\"\nquotas = \"4/hour\"\nfail_mode = \"open\"\n\n\
[[limit]]\nname = \"closed\"\npath = \"/closed\"\nkey = \"global\"\nquotas = \"4/hour\"\nfail_mode = \"closed\"\n\n\
[[limit]]\nname = \"local\"\npath = \"/local\"\nkey = \"global\"\nquotas = \"4/hour\"\nfail_mode = \"local\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_fail_modes_apply_per_limit_while_redis_is_unreachable() {
    let file = RulesFile::new("fail-modes", THREE_MODES);
    // No Redis listens here: every decision meets an outage.
    let url = format!("redis://127.0.0.1:{}", redis_support::free_port());
    // Without a local fallback, `local` is refused at its line and column (line 20, after
    // `fail_mode = `).
    let out = tokio::process::Command::new(server_binary())
        .args(["--addr", "127.0.0.1:0", "--store", &url])
        .args(["--rules", file.path()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{stderr}");
    assert!(
        stderr.contains(
            "line 20, column 13: fail_mode = \"local\" needs a store with a local fallback"
        ),
        "{stderr}"
    );
    // With one, each limit fails its own way.
    let (mut server, base) = start_server(&[
        "--addr",
        "127.0.0.1:0",
        "--store",
        &url,
        "--rules",
        file.path(),
        "--fail-mode",
        "local",
        "--instances",
        "2",
    ])
    .await;
    let client = TestClient::new();
    let mut got = Vec::new();
    for path in ["/open", "/open", "/open", "/closed", "/closed"] {
        let res = client.get(&format!("{base}{path}")).await;
        got.push((path, res.status, res.header("x-ratelimit-limit").is_some()));
    }
    assert_eq!(
        got,
        [
            ("/open", StatusCode::OK, false),
            ("/open", StatusCode::OK, false),
            ("/open", StatusCode::OK, false),
            ("/closed", StatusCode::SERVICE_UNAVAILABLE, false),
            ("/closed", StatusCode::SERVICE_UNAVAILABLE, false),
        ]
    );
    let mut local = Vec::new();
    for _ in 0..3 {
        let res = client.get(&format!("{base}/local")).await;
        local.push((res.status, res.num("x-ratelimit-limit")));
    }
    assert_eq!(
        local,
        [
            (StatusCode::OK, 2),
            (StatusCode::OK, 2),
            (StatusCode::TOO_MANY_REQUESTS, 2)
        ],
        "the local limit decides its share (4 / 2 instances)"
    );
    let _ = server.kill().await;
}
