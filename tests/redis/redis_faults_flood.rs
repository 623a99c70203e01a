//! The faults of RELIABILITY.md "Redis: failures and recovery" (script flush, client
//! pause, SIGSTOP, out of memory, a wrong value type, kill -9 and restart) one after another on one
//! server, each under a flood of concurrent checks on one hot key and on many cold keys, with the
//! store's defaults (50 ms timeout). Nothing hangs (every call returns within the timeout + 1 s),
//! nothing panics, Redis never admits the hot key past its limit between restarts, shed checks are
//! never admitted, and limiting resumes after each fault without a restart of the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Op, Rule, StoreErrorKind, Strategy};

const TIMEOUT: Duration = Duration::from_millis(50);
const SLACK: Duration = Duration::from_secs(1);
const LIMIT: u64 = 400;

/// What a flood of checks saw (shared with the Cluster failover test).
#[derive(Default)]
pub(crate) struct Flood {
    pub(crate) hot_admitted: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) slowest_us: AtomicU64,
    pub(crate) bad_error: AtomicBool,
}

/// `tasks` tasks checking until `stop`, one call a millisecond each: `hot` of every `of` calls on
/// the key "hot", the others on fresh keys of their own.
pub(crate) fn spawn_flood(
    store: &RedisStore,
    rule: &Rule,
    stop: &Arc<AtomicBool>,
    tasks: usize,
    (hot, of): (u64, u64),
) -> (Arc<Flood>, Vec<tokio::task::JoinHandle<()>>) {
    let share = (hot, of);
    let flood = Arc::new(Flood::default());
    let handles = (0..tasks)
        .map(|t| {
            let (store, rule, stop, flood) = (
                store.clone(),
                rule.clone(),
                Arc::clone(stop),
                Arc::clone(&flood),
            );
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let hot = n % share.1 < share.0;
                    let key = if hot {
                        "hot".to_string()
                    } else {
                        format!("cold-{t}-{n}")
                    };
                    let start = Instant::now();
                    let r = store
                        .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                        .await;
                    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                    flood.slowest_us.fetch_max(us, Ordering::Relaxed);
                    flood.calls.fetch_add(1, Ordering::Relaxed);
                    match r {
                        Ok(d) if hot && d.is_allowed() => {
                            flood.hot_admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            flood.errors.fetch_add(1, Ordering::Relaxed);
                            if e.kind() == StoreErrorKind::Other {
                                flood.bad_error.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    (flood, handles)
}

/// Waits until a fresh key is decided by Redis (allowed), within `within`.
async fn resumes(store: &RedisStore, rule: &Rule, what: &str, within: Duration) {
    let start = Instant::now();
    let mut i = 0;
    loop {
        let before = store.counters();
        let key = format!("resume-{what}-{i}");
        if let Ok(d) = store
            .apply(&key, Scope::new("default", rule), Op::Check(1), 0)
            .await
        {
            let after = store.counters();
            if d.is_allowed() && after.local_allowed == before.local_allowed {
                return;
            }
        }
        assert!(
            start.elapsed() < within,
            "{what}: limiting did not resume within {within:?}"
        );
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn every_fault_under_a_flood_stays_bounded_and_recovers() {
    let _g = crate::redis_faults::serial();
    let Some(mut server) = RedisServer::start() else {
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
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let rule = Rule::parse(Strategy::SlidingWindow, &format!("{LIMIT}/hour")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (flood, tasks) = spawn_flood(&store, &rule, &stop, 100 * scale, (3, 4));
        let settle = Duration::from_millis(300);
        tokio::time::sleep(settle).await;

        // SCRIPT FLUSH: invisible (NOSCRIPT is answered by EVAL).
        for _ in 0..3 {
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        resumes(&store, &rule, "script flush", Duration::from_secs(2)).await;

        // CLIENT PAUSE: Redis up but holding every client for 800 ms.
        assert_eq!(server.cli(&["CLIENT", "PAUSE", "800", "ALL"]), "OK");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        resumes(&store, &rule, "client pause", Duration::from_secs(2)).await;

        // SIGSTOP for 2.6 s: past the 2 s of overload, an outage; the breaker opens.
        server.pause();
        tokio::time::sleep(Duration::from_millis(2600)).await;
        server.resume();
        resumes(&store, &rule, "SIGSTOP", Duration::from_secs(2)).await;

        // Out of memory: error replies (an outage for the policy), then memory again.
        let used: u64 = server
            .cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("used_memory:"))
            .and_then(|n| n.parse().ok())
            .unwrap();
        server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        server.cli(&["CONFIG", "SET", "maxmemory", &(used / 2).max(1).to_string()]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
        resumes(&store, &rule, "out of memory", Duration::from_secs(2)).await;

        // Before the state of the hot key is destroyed below: never past its limit, through the
        // flush, the pause, the hang and the OOM, all under the flood.
        let before_wrong_type = flood.hot_admitted.load(Ordering::Relaxed);
        assert!(
            before_wrong_type <= LIMIT,
            "hot key admitted {before_wrong_type} > {LIMIT}"
        );
        // A wrong value type on the hot key's Redis key: its calls fail; other keys decide. The
        // key is deleted afterwards (its count is lost: up to LIMIT again).
        let hot_key = store
            .redis_keys(&"hot".to_string(), Scope::new("default", &rule))
            .remove(0);
        server.cli(&["SET", &hot_key, "not a hash"]);
        resumes(&store, &rule, "wrong type", Duration::from_secs(2)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.cli(&["DEL", &hot_key]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let hot_before_restart = flood.hot_admitted.load(Ordering::Relaxed);

        // kill -9 and restart without persistence: counts start again (at most LIMIT more).
        tokio::task::block_in_place(|| server.restart());
        resumes(&store, &rule, "kill -9", Duration::from_secs(3)).await;
        tokio::time::sleep(settle).await;

        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let slowest = Duration::from_micros(flood.slowest_us.load(Ordering::Relaxed));
        let admitted = flood.hot_admitted.load(Ordering::Relaxed);
        let c = store.counters();
        eprintln!(
            "faults under a flood: {} calls, {} errors, hot key admitted {admitted} \
             ({hot_before_restart} before the restart; limit {LIMIT}), slowest {slowest:?}, {c:?}",
            flood.calls.load(Ordering::Relaxed),
            flood.errors.load(Ordering::Relaxed),
        );
        assert!(slowest <= TIMEOUT + SLACK, "a call took {slowest:?}");
        assert!(
            !flood.bad_error.load(Ordering::Relaxed),
            "a configuration error surfaced"
        );
        // The hot key's state was lost twice (deleted after the wrong type, the restart): at most
        // LIMIT admissions per life of that state; shed or failed calls admit nothing.
        assert!(admitted <= 3 * LIMIT, "hot key admitted {admitted}");
        assert!(
            hot_before_restart <= 2 * LIMIT,
            "before the restart: {hot_before_restart}"
        );
        assert!(
            c.breaker_opens >= 1,
            "the SIGSTOP opened the breaker: {c:?}"
        );
        let stats = <RedisStore as Store<String>>::stats(&store);
        assert!(stats.store_errors > 0);
    });
}
