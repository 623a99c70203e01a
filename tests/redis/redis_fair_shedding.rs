//! What one key's flood costs falls on that key: a key has at most two checks in flight to Redis
//! per store (its lane), later checks of the key wait behind them and are answered from the
//! blocked-key cache or shed; other keys keep the rest of the store's calls in flight.
//!
//! Deterministic by construction: the store has 4 slots in flight; the flood of one key may hold
//! at most 2 of them, and the other keys are checked 2 at a time, so they always find a slot at
//! once. The timeout (1 s) is far above a round trip on a loaded machine, so no check of another
//! key can be shed for slowness either.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::{RateLimiter, Strategy};

const FLOODERS: usize = 400;
const OTHER_KEYS: usize = 200;

#[test]
fn a_flood_of_one_key_holds_at_most_two_calls_in_flight_and_every_other_key_is_admitted() {
    let _g = crate::redis_faults::serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::builder(server.url())
            .max_in_flight(4)
            .timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        // A limit the flood does not reach: every check of the hot key is a call to Redis.
        let limiter: Arc<RateLimiter<String, RedisStore>> = Arc::new(
            RateLimiter::builder()
                .strategy(Strategy::SlidingWindow)
                .quotas("1000000/hour")
                .unwrap()
                .store(store.clone())
                .build()
                .unwrap(),
        );
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
        // The flood alone: never more than two of its calls in flight.
        let mut most = 0;
        for _ in 0..200 {
            most = most.max(store.counters().in_flight);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(most <= 2, "one key held {most} calls in flight");
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
            assert!(store.counters().in_flight <= 4);
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
