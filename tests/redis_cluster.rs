//! The Redis store on a local 3-master Cluster: keys spread over slots, one slot per logical key,
//! exact counts, no CROSSSLOT, and scripts that work on nodes that never saw them (T-22, T-33,
//! T-34). One Cluster for the whole binary's single test, to keep the suite short.

#[path = "support/redis.rs"]
mod redis_support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_support::RedisCluster;
use tollgate::store::Store;
use tollgate::store::redis::RedisStore;
use tollgate::{Op, RateLimiter, Rule, Strategy};

#[test]
fn cluster_spreads_keys_and_stays_exact() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // T-34: scripts were never loaded; flush them everywhere so the first calls hit NOSCRIPT.
        let store = RedisStore::builder(cluster.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("connect to the cluster");
        for n in &cluster.nodes {
            assert_eq!(n.cli(&["SCRIPT", "FLUSH"]), "OK");
        }
        // T-22 / T-33: keys with braces, separators and long bytes; every strategy (the moving
        // window with two quotas touches two Redis keys: same slot, no CROSSSLOT).
        let mut masters = HashSet::new();
        for (i, strategy) in Strategy::ALL.iter().cycle().take(300).enumerate() {
            let rule = Rule::parse(*strategy, "5/second; 50/minute").unwrap();
            let key = match i % 4 {
                0 => format!("{{user}}:{i}"),
                1 => format!("a:b}}{{{i}"),
                2 => "x".repeat(100 + i),
                _ => format!("{i}"),
            };
            let d = store
                .apply(&key, &rule, Op::Check(1), 0)
                .await
                .unwrap_or_else(|e| panic!("{strategy} key {key:?}: {e}"));
            assert!(d.is_allowed());
            let names = store.redis_keys(&key, *strategy, 2);
            let slots: HashSet<u16> = names.iter().map(|k| cluster.keyslot(k)).collect();
            assert_eq!(slots.len(), 1, "{names:?}");
            if i < 30 {
                let slot = *slots.iter().next().unwrap();
                masters.insert(cluster.node_of_slot(slot));
            }
        }
        assert_eq!(masters.len(), 3, "keys spread over every master");
        let loaded: u64 = cluster
            .nodes
            .iter()
            .map(|n| redis_support::command_calls(&n.cli(&["INFO", "commandstats"]), "eval"))
            .sum();
        assert!(loaded >= 3, "each master reloaded on NOSCRIPT ({loaded})");

        // Exactness: hot keys on different masters hammered by two limiters.
        let mut limiters = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::builder(cluster.url())
                .timeout(Duration::from_secs(2))
                .build()
                .await
                .unwrap();
            limiters.push(
                RateLimiter::builder()
                    .strategy(Strategy::SlidingWindow)
                    .quotas("200/hour")
                    .unwrap()
                    .store(store)
                    .build()
                    .unwrap(),
            );
        }
        let hot: Vec<String> = (0..3).map(|i| format!("hot-{i}")).collect();
        let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
        let errors = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for limiter in &limiters {
            for t in 0..12 {
                let limiter = limiter.clone();
                let hot = hot.clone();
                let (admitted, errors) = (Arc::clone(&admitted), Arc::clone(&errors));
                tasks.push(tokio::spawn(async move {
                    for j in 0..250 {
                        let k = (t + j) % 3;
                        match limiter.check(&hot[k], 1).await {
                            Ok(d) if d.is_allowed() => {
                                admitted[k].fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => {}
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            errors.load(Ordering::Relaxed),
            0,
            "no CROSSSLOT, no redirect surfaced"
        );
        for a in admitted.iter() {
            assert_eq!(a.load(Ordering::Relaxed), 200);
        }
    });
}
