//! A Cluster failover under a flood. Three masters with a replica
//! each (node timeout 1 s); a flood of concurrent checks on one hot key and on fresh keys of every
//! slot, with the store's defaults (50 ms timeout) and no block cache (every check of the hot key
//! reaches Redis). The hot key's master fails over twice: first by `CLUSTER FAILOVER` on its
//! replica (coordinated: nothing lost), then by `kill -9` of the promoted node (its replica, the old
//! master, takes over after the node timeout). Asserted only counts and bounds: every call returns
//! within the timeout + 1 s, no panic, no configuration error, the hot key (exhausted and replicated
//! before each failover) never admits past its limit, and decisions on the failed shard resume
//! without a restart of the store. `TOLLGATE_SCALE` multiplies the flood's tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::redis_cluster::slot_of;
use crate::redis_faults_flood::spawn_flood;
use crate::redis_support::RedisCluster;
use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Op, Rule, Strategy};

const TIMEOUT: Duration = Duration::from_millis(50);
const SLACK: Duration = Duration::from_secs(1);
const LIMIT: u64 = 200;

/// Waits (polling `redis-cli` off the runtime's workers) until `what` holds, within `within`.
async fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !tokio::task::block_in_place(&mut cond) {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// Waits until a fresh key in the hot key's slot is decided by Redis (admitted), within `within`.
async fn resumes(store: &RedisStore, rule: &Rule, what: &str, within: Duration) -> Duration {
    let scope = || Scope::new("default", rule);
    let slot = slot_of(&store.redis_keys(&"hot".to_string(), scope())[0]);
    let start = Instant::now();
    let mut i = 0;
    loop {
        let probe = loop {
            let k = format!("resume-{what}-{i}");
            i += 1;
            if slot_of(&store.redis_keys(&k, scope())[0]) == slot {
                break k;
            }
        };
        let r = store.apply(&probe, scope(), Op::Check(1), 0).await;
        if r.as_ref().is_ok_and(|d| d.is_allowed()) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what}: decisions did not resume within {within:?}: last {r:?}, {:?}",
            store.counters()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_cluster_failover_under_a_flood_stays_bounded_and_recovers() {
    let _g = crate::redis_faults::serial();
    let Some(mut cluster) = RedisCluster::start_with_replicas(1000) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let scale = std::env::var("TOLLGATE_SCALE")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    rt.block_on(async {
        let store = RedisStore::builder(cluster.url())
            .block_cache(0)
            .build()
            .await
            .expect("connect to the cluster");
        // First hit: a window of its own, so no clock boundary can reset the count mid-test.
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, &format!("{LIMIT}/hour")).unwrap();
        let hot_name =
            store.redis_keys(&"hot".to_string(), Scope::new("default", &rule))[0].clone();
        let master = cluster.node_of_slot(cluster.keyslot(&hot_name));
        let replica = cluster.replica_of(master);
        let stop = Arc::new(AtomicBool::new(false));
        // Every other call on the hot key, the rest on fresh keys (every slot).
        let (flood, tasks) = spawn_flood(&store, &rule, &stop, 48 * scale, (1, 2));
        until(
            "the hot key reaches its limit",
            Duration::from_secs(10),
            || flood.hot_admitted.load(Ordering::Relaxed) >= LIMIT,
        )
        .await;
        let acked = tokio::task::block_in_place(|| {
            cluster.nodes[master].replicated(Duration::from_secs(10))
        });
        assert!(acked, "the hot key's count reached the replica");

        // A coordinated failover, ordered on the replica.
        let out =
            tokio::task::block_in_place(|| cluster.nodes[replica].cli(&["CLUSTER", "FAILOVER"]));
        assert_eq!(out, "OK");
        let promoted = until("CLUSTER FAILOVER", Duration::from_secs(10), || {
            cluster.is_master(replica)
        })
        .await;
        let first = resumes(&store, &rule, "coordinated", Duration::from_secs(10)).await;
        until(
            "the old master syncs from the new one",
            Duration::from_secs(10),
            || {
                cluster.nodes[master]
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            },
        )
        .await;
        let acked = tokio::task::block_in_place(|| {
            cluster.nodes[replica].replicated(Duration::from_secs(10))
        });
        assert!(acked, "the old master caught up with the promoted one");

        // kill -9 of the promoted node: the old master takes over after the node timeout.
        tokio::task::block_in_place(|| cluster.nodes[replica].kill9());
        let killed = Instant::now();
        until("failover after kill -9", Duration::from_secs(15), || {
            cluster.is_master(master)
        })
        .await;
        let second = resumes(&store, &rule, "kill -9", Duration::from_secs(10)).await;
        let after_kill = killed.elapsed();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let slowest = Duration::from_micros(flood.slowest_us.load(Ordering::Relaxed));
        let admitted = flood.hot_admitted.load(Ordering::Relaxed);
        let c = store.counters();
        eprintln!(
            "cluster failovers under a flood: {} calls, {} errors; coordinated failover took \
             {promoted:?}, decisions resumed {first:?} after it; after kill -9, decisions on the \
             shard resumed {after_kill:?} later ({second:?} after the promotion); hot key admitted \
             {admitted} (limit {LIMIT}); slowest call {slowest:?}; {c:?}",
            flood.calls.load(Ordering::Relaxed),
            flood.errors.load(Ordering::Relaxed),
        );
        assert!(slowest <= TIMEOUT + SLACK, "a call took {slowest:?}");
        assert!(
            !flood.bad_error.load(Ordering::Relaxed),
            "a configuration error surfaced"
        );
        // Replicated before each failover and exhausted: never one more.
        assert_eq!(admitted, LIMIT, "hot key admitted {admitted}");
        let after = store
            .apply(
                &"hot".to_string(),
                Scope::new("default", &rule),
                Op::Check(1),
                0,
            )
            .await
            .expect("the hot key is decided on its new master");
        assert!(!after.is_allowed(), "the count survived both failovers");
        let stats = <RedisStore as Store<String>>::stats(&store);
        assert!(stats.allowed > LIMIT, "fresh keys were decided throughout");
    });
}
