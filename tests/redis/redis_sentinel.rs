//! Issue 12, point 3 (Sentinel): `redis+sentinel://HOST:PORT/SERVICE` against a primary, a replica
//! and a sentinel made at test time, including a failover (the primary killed, the replica
//! promoted): the store follows the new primary without a restart, and what was replicated before
//! the failover still counts.

use crate::redis_support;

use std::time::{Duration, Instant};

use redis_support::{RedisSentinel, RedisServer};
use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Op, Rule, Strategy};

const SLACK: Duration = Duration::from_secs(1);

#[test]
fn the_store_follows_a_sentinel_failover_and_keeps_replicated_counts() {
    let _g = crate::redis_faults::serial();
    let Some(mut primary) = RedisServer::start() else {
        return;
    };
    let pport = primary.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &pport])
        .expect("redis-server is available");
    let start = Instant::now();
    while !replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "replica never synced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let sentinel = RedisSentinel::start("tg", primary.port, 500);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("redis+sentinel://127.0.0.1:{}/tg", sentinel.port);
        let store = RedisStore::builder(&url)
            .block_cache(0)
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, "20/hour").unwrap();
        let key = "sentinel".to_string();
        for _ in 0..10 {
            let d = store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap();
            assert!(d.is_allowed());
        }
        // Replicated before the failover (WAIT): these 10 survive it.
        let acked = tokio::task::block_in_place(|| primary.cli(&["WAIT", "1", "2000"]));
        assert_eq!(acked, "1");
        tokio::task::block_in_place(|| primary.kill9());
        let killed = Instant::now();
        // Until the sentinel promotes the replica, calls fail or are shed (each within the
        // timeout + 1 s); then the store decides on the new primary.
        loop {
            let t = Instant::now();
            let r = store
                .apply(
                    &"probe".to_string(),
                    Scope::new("default", &rule),
                    Op::Peek,
                    0,
                )
                .await;
            assert!(t.elapsed() <= Duration::from_millis(50) + SLACK);
            if r.is_ok() && store.counters().connected {
                let promoted = tokio::task::block_in_place(|| sentinel.primary_port("tg"));
                if promoted == Some(replica.port) {
                    break;
                }
            }
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "no decision on the new primary {:?} after the kill",
                killed.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("failover followed {:?} after the kill", killed.elapsed());
        let mut admitted = 0;
        for _ in 0..15 {
            let d = loop {
                match store
                    .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                    .await
                {
                    Ok(d) => break d,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            admitted += u32::from(d.is_allowed());
        }
        assert_eq!(
            admitted, 10,
            "the replicated 10 still count on the new primary"
        );
        assert_eq!(replica.cli(&["ROLE"]).lines().next(), Some("master"));
    });
}
