//! What one key's flood costs falls on that key, and a hot key alone may use the store: a key
//! always has two checks in flight to Redis per store (its lane), and more only from the free
//! slots past a reserve of a quarter of the store's; later checks of the key wait behind them and
//! are answered from the blocked-key cache or shed; other keys keep the reserve.
//!
//! The flood test is deterministic by construction: the store has 8 slots in flight; the flood of
//! one key may hold at most 6 of them (never the last 2), and the other keys are checked 2 at a
//! time, so they always find a slot at once. The timeout (1 s) is far above a round trip on a
//! loaded machine, so no check of another key can be shed for slowness either.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::{RateLimiter, Strategy};

const FLOODERS: usize = 400;
const OTHER_KEYS: usize = 200;
const HOT_TASKS: usize = 200;
/// The store's calls in flight, and the quarter a key's calls past its first two leave free.
const SLOTS: u64 = 8;
const RESERVE: u64 = SLOTS / 4;

#[test]
fn a_flood_of_one_key_never_takes_the_last_quarter_of_the_calls_in_flight_and_every_other_key_is_admitted()
 {
    let _g = crate::redis_faults::serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    crate::redis_faults::rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .max_in_flight(SLOTS as usize)
            .timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        // A limit the flood does not reach: every check of the hot key is a call to Redis.
        let limiter = unreached_limiter(&store);
        let stop = Arc::new(AtomicBool::new(false));
        let hot_checks = Arc::new(AtomicU64::new(0));
        let flood: Vec<_> = (0..FLOODERS)
            .map(|_| {
                let (limiter, stop, hot_checks) = (
                    Arc::clone(&limiter),
                    Arc::clone(&stop),
                    Arc::clone(&hot_checks),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let d = limiter.check(&"hot".to_owned(), 1).await.unwrap();
                        assert!(d.is_allowed() || d.was_shed(), "{d:?}");
                        hot_checks.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // The flood alone: more than its first two calls in flight, never the last quarter.
        let mut most = 0;
        for _ in 0..200 {
            most = most.max(store.counters().in_flight);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            most <= SLOTS - RESERVE,
            "one key held {most} calls in flight"
        );
        assert!(most > 2, "the key alone used only {most} calls in flight");
        assert!(hot_checks.load(Ordering::Relaxed) > 0, "the flood ran");
        // Other keys during the flood, two at a time: every one admitted, none shed.
        for pair in 0..OTHER_KEYS / 2 {
            let checks = (0..2).map(|i| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    let key = format!("client-{}", pair * 2 + i);
                    limiter.check(&key, 1).await.unwrap()
                })
            });
            for c in checks.collect::<Vec<_>>() {
                let d = c.await.unwrap();
                assert!(d.is_allowed() && !d.was_shed(), "another key: {d:?}");
            }
            let c = store.counters();
            assert!(
                c.in_flight <= SLOTS && c.key_in_flight_peak <= SLOTS - RESERVE,
                "{c:?}"
            );
        }
        stop.store(true, Ordering::Relaxed);
        for f in flood {
            f.await.unwrap();
        }
        let c = store.counters();
        eprintln!("hot checks {}; {c:?}", hot_checks.load(Ordering::Relaxed));
        assert_eq!(c.shed_no_room, 0, "no check found the store full: {c:?}");
        assert_eq!(c.shed, c.shed_own_key + c.shed_slow, "{c:?}");
    });
}

#[test]
fn a_hot_key_under_its_limit_alone_uses_many_calls_in_flight_and_no_check_is_shed() {
    let _g = crate::redis_faults::serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    crate::redis_faults::rt().block_on(async {
        // 256 calls in flight (the default). The timeout is two seconds: at 200 checks in flight
        // a debug build on a loaded machine (other tests, other processes) can take longer than
        // the default 50 ms, or even a quarter second, to read its replies, which sheds them for
        // slowness (`shed_slow`): the store's answer to a slow process, not what this test is
        // about (no check shed for its key).
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let limiter = unreached_limiter(&store);
        let stop = Arc::new(AtomicBool::new(false));
        let checks = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..HOT_TASKS)
            .map(|_| {
                let (limiter, stop, checks) =
                    (Arc::clone(&limiter), Arc::clone(&stop), Arc::clone(&checks));
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let d = limiter.check(&"global".to_owned(), 1).await.unwrap();
                        if d.is_allowed() {
                            checks.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let c = store.counters();
        eprintln!("checks {}; {c:?}", checks.load(Ordering::Relaxed));
        let most = c.key_in_flight_peak;
        assert!(most > 2, "the hot key had at most {most} calls in flight");
        assert!(most <= 256 - 64, "the hot key took the reserve: {most}");
        assert_eq!(c.shed, 0, "{c:?}");
        assert_eq!(tollgate::store::Store::<String>::stats(&store).rejected, 0);
        assert!(checks.load(Ordering::Relaxed) > 0);
    });
}

/// A limit the checks do not reach: every check of a key is a call to Redis.
fn unreached_limiter(store: &RedisStore) -> Arc<RateLimiter<String, RedisStore>> {
    Arc::new(
        RateLimiter::builder()
            .strategy(Strategy::SlidingWindow)
            .quotas("1000000/hour")
            .unwrap()
            .store(store.clone())
            .build()
            .unwrap(),
    )
}
