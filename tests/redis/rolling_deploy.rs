//! A rolling deploy on one Redis: two real `server` processes under the default limiter name with
//! different quotas count one client once (the state is the name's, converted between the two
//! rules on every request), and a restart with a changed rules file carries the key's spend.

use crate::redis_server::start_server;
use crate::redis_support::RedisServer;
use crate::support::TestClient;

use std::time::{Duration, Instant};

use http::StatusCode;

/// The server's flags for one instance: plain mode, one global key, fail-closed (a store error
/// is a 503, never an admission), with room for a loaded machine.
fn plain_args<'a>(url: &'a str, quota: &'a str) -> Vec<&'a str> {
    vec![
        "--addr",
        "127.0.0.1:0",
        "--store",
        url,
        "--quota",
        quota,
        "--key",
        "global",
        "--fail-closed",
        "--store-timeout",
        "2000",
    ]
}

/// Counts 200s among `n` requests, alternating between the bases; any other status fails.
async fn alternate(client: &TestClient, bases: &[&str], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let base = bases[i % bases.len()];
        let res = client.get(&format!("{base}/")).await;
        match res.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other} from {base}: {res:?}"),
        }
    }
    ok
}

/// 10/minute and 20/minute on one Redis, requests alternating: exactly 20 in the minute (the
/// larger quota, never the sum), however the deploy interleaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_different_quotas_admit_the_larger_quota_once() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let (mut old, base_old) = start_server(&plain_args(&url, "10/minute")).await;
    let (mut new, base_new) = start_server(&plain_args(&url, "20/minute")).await;
    let client = TestClient::new();
    let started = Instant::now();
    let ok = alternate(&client, &[&base_old, &base_new], 80).await;
    let spent = started.elapsed();
    // The bound is over a minute: every request must fit in one for the count to be exact.
    assert!(spent < Duration::from_secs(50), "took {spent:?}");
    assert_eq!(ok, 20, "10/minute and 20/minute instances on one Redis");
    // Both instances see the key spent.
    for base in [&base_old, &base_new] {
        let res = client.get(&format!("{base}/")).await;
        assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS, "{base}");
    }
    let _ = old.kill().await;
    let _ = new.kill().await;
}

/// A restart with a changed rules file (`100/hour` -> `110/hour`): the key keeps its 100 and
/// gets 10 more, not 110.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_a_raised_quota_in_the_rules_file_admits_the_difference() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = std::env::temp_dir().join(format!("tollgate-rolling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    let rules = |quotas: &str| {
        format!(
            "[[limit]]\nname = \"all\"\nkey = \"global\"\nstrategy = \"sliding-window\"\nquotas = \"{quotas}\"\n"
        )
    };
    let path = file.to_str().unwrap();
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--rules",
        path,
        "--fail-closed",
        "--store-timeout",
        "2000",
    ];
    let client = TestClient::new();
    std::fs::write(&file, rules("100/hour")).unwrap();
    let (mut first, base) = start_server(&args).await;
    assert_eq!(alternate(&client, &[&base], 105).await, 100);
    let _ = first.kill().await;
    std::fs::write(&file, rules("110/hour")).unwrap();
    let (mut second, base) = start_server(&args).await;
    assert_eq!(
        alternate(&client, &[&base], 20).await,
        10,
        "100/hour -> 110/hour across a restart"
    );
    let _ = second.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
