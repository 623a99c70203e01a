//! Quota leasing on a Redis Cluster (three masters): two leasing stores share keys spread over
//! every master, on a test clock sent to the scripts. Each key is held to its limit while leases
//! are out, and admits exactly its limit once they are back.

use crate::redis_faults::rt;
use crate::redis_support::RedisCluster;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::store::redis::{Leasing, RedisStore};
use tollgate::{ManualClock, RateLimiter, Strategy};

const S: u64 = 1_000_000_000;
/// A whole hour in Unix time, so clock-aligned windows start at whole minutes.
const BASE: u64 = 1_700_002_800 * S;
const LIMIT: u64 = 200;
/// Keys enough that each master holds some (checked at the end).
const KEYS: usize = 12;

type Limiter = RateLimiter<String, RedisStore, ManualClock>;

/// A leasing store on the Cluster whose leases stay until the test returns them.
async fn leasing_limiter(
    cluster: &RedisCluster,
    strategy: Strategy,
    clock: &ManualClock,
) -> Limiter {
    let store = RedisStore::builder(cluster.url())
        .timeout(Duration::from_secs(2))
        .use_client_time(true)
        .leases(Leasing::default().idle_return(Duration::from_secs(3600)))
        .build()
        .await
        .expect("connect to the Cluster");
    RateLimiter::builder()
        .name("leased")
        .strategy(strategy)
        .quotas(&format!("{LIMIT}/minute"))
        .expect("quotas")
        .clock(clock.clone())
        .store(store)
        .build()
        .expect("limiter")
}

/// Floods `KEYS` keys from 8 tasks over `a` and `b`; returns what each key admitted.
async fn flood(a: &Limiter, b: &Limiter, keys: &Arc<Vec<String>>) -> Vec<u64> {
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let l = if t % 2 == 0 { a.clone() } else { b.clone() };
            let (keys, admitted) = (Arc::clone(keys), Arc::clone(&admitted));
            tokio::spawn(async move {
                for round in 0..400 {
                    let i = (round + t) % KEYS;
                    let d = l.check(&keys[i], 1).await.expect("decision");
                    if d.is_allowed() {
                        admitted[i].fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    admitted.iter().map(|n| n.load(Ordering::Relaxed)).collect()
}

/// With every lease returned, checks `key` on both stores until neither admits twice in a row;
/// returns how many they admitted.
async fn drain(a: &Limiter, b: &Limiter, key: &String, before: u64) -> u64 {
    a.store().return_leases().await.expect("return");
    b.store().return_leases().await.expect("return");
    let (mut total, mut rejected_rounds) = (before, 0);
    while rejected_rounds < 2 {
        let mut any = false;
        for l in [a, b] {
            if l.check(key, 1).await.expect("decision").is_allowed() {
                total += 1;
                any = true;
            }
        }
        rejected_rounds = if any { 0 } else { rejected_rounds + 1 };
        assert!(
            total <= LIMIT,
            "{key}: {total} admitted past a limit of {LIMIT}"
        );
    }
    total
}

fn two_leasing_stores_on_a_cluster(strategy: Strategy) {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let a = leasing_limiter(&cluster, strategy, &clock).await;
        let b = leasing_limiter(&cluster, strategy, &clock).await;
        let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("tenant-{i}")).collect());
        let first = flood(&a, &b, &keys).await;
        let held = a.store().lease_counters().units_held + b.store().lease_counters().units_held;
        let admitted: u64 = first.iter().sum();
        for (key, n) in keys.iter().zip(&first) {
            assert!(*n <= LIMIT, "{key}: {n} admitted past a limit of {LIMIT}");
        }
        assert!(
            admitted + held >= KEYS as u64 * LIMIT * 9 / 10,
            "under-admission: {admitted} admitted and {held} held of {} over {KEYS} keys",
            KEYS as u64 * LIMIT
        );
        let fetches = a.store().lease_counters().fetches + b.store().lease_counters().fetches;
        assert!(
            fetches < admitted / 5,
            "{fetches} lease calls for {admitted} admissions: leasing did not lease"
        );
        for (key, n) in keys.iter().zip(&first) {
            let total = drain(&a, &b, key, *n).await;
            assert_eq!(
                total, LIMIT,
                "{key}: exactly the limit once every lease is back"
            );
        }
        // The keys lived on every master: the leases crossed slots and nodes.
        for (i, node) in cluster.nodes.iter().enumerate() {
            let held: u64 = node.cli(&["DBSIZE"]).parse().unwrap_or(0);
            assert!(held > 0, "master {i} held none of the {KEYS} keys");
        }
        let c = a.store().counters();
        assert_eq!((c.shed, c.breaker_opens), (0, 0), "{c:?}");
    });
}

#[test]
fn leased_fixed_windows_on_a_cluster_hold_every_key_to_its_limit_and_exactly_to_it_once_back() {
    two_leasing_stores_on_a_cluster(Strategy::FixedWindow);
}

#[test]
fn leased_token_buckets_on_a_cluster_hold_every_key_to_its_limit_and_exactly_to_it_once_back() {
    two_leasing_stores_on_a_cluster(Strategy::TokenBucket);
}
