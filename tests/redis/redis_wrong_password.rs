//! A wrong password on Cluster and behind Sentinel: the `server` example exits 1 within 3 s with
//! Redis's own words (`WRONGPASS`), and neither the password given nor the right one is printed,
//! as for a single node (`redis_server.rs`).

use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::redis_server::server_binary;
use crate::redis_support::{RedisCluster, RedisSentinel, RedisServer};

/// Runs the server on `url` and checks how it ends.
async fn exits_1_with_wrongpass(url: &str) {
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new(server_binary())
            .args(["--addr", "127.0.0.1:0", "--store", url])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the server did not exit")
    .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(took < Duration::from_secs(3), "took {took:?}: {stderr}");
    assert!(stderr.contains("WRONGPASS"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(!stderr.contains("the-right-one"), "{stderr}");
}

#[tokio::test]
async fn a_wrong_password_on_cluster_exits_1_within_3_s_with_redis_words() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    // Set after the start (the harness talks to the nodes without a password).
    for n in &cluster.nodes {
        n.cli(&["CONFIG", "SET", "requirepass", "the-right-one"]);
    }
    let hosts: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    exits_1_with_wrongpass(&format!(
        "redis+cluster://:hunter2-wrong@{}",
        hosts.join(",")
    ))
    .await;
}

#[tokio::test]
async fn a_wrong_password_behind_sentinel_exits_1_within_3_s_with_redis_words() {
    let Some(primary) = RedisServer::start() else {
        return;
    };
    let sentinel = RedisSentinel::start("pw", primary.port, 5000);
    primary.cli(&["CONFIG", "SET", "requirepass", "the-right-one"]);
    exits_1_with_wrongpass(&format!(
        "redis+sentinel://:hunter2-wrong@127.0.0.1:{}/pw",
        sentinel.port
    ))
    .await;
}
