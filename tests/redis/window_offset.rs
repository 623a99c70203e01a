//! Windows in a user's time zone on Redis: the scripts put the fixed window's and the sliding
//! window counter's edges at the shifted times (checked against the Redis server's own clock, which
//! each decision reports), and an offset change converts a key's state.

use crate::redis_support;

use std::time::Duration;

use redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::{Op, RateLimiter, Strategy, WindowOffset};

const DAY_US: u64 = 86_400_000_000;

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("offset:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect")
}

/// Where in a `1/day` window shifted by `offset` the time `t` (µs since the epoch) falls.
fn into_window(t: u64, offset: &str) -> u64 {
    let off = offset.parse::<WindowOffset>().unwrap().seconds();
    let off = u64::try_from((off * 1_000_000).rem_euclid(DAY_US as i64)).unwrap();
    (t % DAY_US + off) % DAY_US
}

#[tokio::test]
async fn the_fixed_and_sliding_windows_reset_at_the_shifted_edge_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let s = store(&server).await;
    for (i, off) in ["8h", "-5h", "+05:30", "0h"].into_iter().enumerate() {
        for strategy in [Strategy::FixedWindow, Strategy::SlidingWindow] {
            let lim: RateLimiter<String, RedisStore> = RateLimiter::builder()
                .name(format!("{}-{i}", strategy.name()))
                .strategy(strategy)
                .quotas("1/day")
                .unwrap()
                .window_offset(off.parse().unwrap())
                .store(s.clone())
                .build()
                .unwrap();
            let key = "user".to_string();
            let d = lim.check(&key, 1).await.unwrap();
            assert!(d.is_allowed());
            let t = u64::try_from(d.time().as_micros()).unwrap();
            let left = DAY_US - into_window(t, off);
            // The sliding counter's request stops weighing one µs into the next bucket.
            let extra = u64::from(strategy == Strategy::SlidingWindow);
            let expected = left + extra;
            assert_eq!(
                u64::try_from(d.reset_after().as_micros()).unwrap(),
                expected,
                "{strategy} {off}"
            );
            let d = lim.check(&key, 1).await.unwrap();
            let t = u64::try_from(d.time().as_micros()).unwrap();
            assert_eq!(
                u64::try_from(d.retry_after().unwrap().as_micros()).unwrap(),
                DAY_US - into_window(t, off) + extra,
                "{strategy} {off}: Retry-After at the shifted edge"
            );
        }
    }
}

/// A key's state is its limiter name's: a rule under another offset converts it (the day's spent
/// unit carries), and only another name counts apart.
#[tokio::test]
async fn an_offset_change_converts_the_keys_state_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let s = store(&server).await;
    let limiter = |name: &str| -> RateLimiter<String, RedisStore> {
        RateLimiter::builder()
            .name(name)
            .strategy(Strategy::FixedWindow)
            .quotas("1/day")
            .unwrap()
            .store(s.clone())
            .build()
            .unwrap()
    };
    let lim = limiter("tz");
    let key = "user".to_string();
    let east = lim.rule().clone().with_window_offset("9h".parse().unwrap());
    let west = lim
        .rule()
        .clone()
        .with_window_offset("-7h".parse().unwrap());
    let check = |rule| lim.apply(&key, Some(rule), Op::Check(1));
    assert!(check(&east).await.unwrap().is_allowed());
    assert!(
        !check(&west).await.unwrap().is_allowed(),
        "another offset converts the state: the unit stays spent"
    );
    assert!(!check(&east).await.unwrap().is_allowed());
    assert!(!lim.check(&key, 1).await.unwrap().is_allowed(), "UTC too");
    assert!(
        limiter("tz-apart")
            .check(&key, 1)
            .await
            .unwrap()
            .is_allowed(),
        "another name counts apart"
    );
}
