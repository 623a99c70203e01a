//! Limiter identity on Redis: two limiters of different names on one store never share counters,
//! limiters of one name in two processes (two stores) do, settlement works through the scripts, and
//! a rule finer than Redis's microsecond is refused when the limiter is built.

use crate::redis_support;

use std::time::Duration;

use redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::{ConfigError, RateLimiter, Strategy};

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix("names:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect")
}

fn limiter(name: &str, store: &RedisStore) -> RateLimiter<String, RedisStore> {
    RateLimiter::builder()
        .name(name)
        .strategy(Strategy::FixedWindow)
        .quotas("2/hour")
        .unwrap()
        .store(store.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn limiters_of_different_names_on_one_redis_store_keep_their_counters_apart() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let s = store(&server).await;
    let (a, b) = (limiter("a", &s), limiter("b", &s));
    let key = "k".to_string();
    assert!(a.check(&key, 2).await.unwrap().is_allowed());
    assert!(!a.check(&key, 1).await.unwrap().is_allowed());
    assert!(
        b.check(&key, 2).await.unwrap().is_allowed(),
        "same rule, other name"
    );
    let e = RateLimiter::<String, _>::builder()
        .name("a")
        .quotas("2/hour")
        .unwrap()
        .store(s.clone())
        .build()
        .unwrap_err();
    assert_eq!(e, ConfigError::DuplicateName("a".into()));
    // Another process (another store on the same Redis) with the same name shares the limit.
    let other = store(&server).await;
    let a2 = limiter("a", &other);
    assert!(
        !a2.check(&key, 1).await.unwrap().is_allowed(),
        "one name, one limit"
    );
}

#[tokio::test]
async fn settlement_on_redis_refunds_and_charges_the_reservation() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let s = store(&server).await;
    for strategy in Strategy::ALL {
        let l = RateLimiter::<String, _>::builder()
            .name(format!("settle-{strategy}"))
            .strategy(strategy)
            .quotas("4/hour")
            .unwrap()
            .store(s.clone())
            .build()
            .unwrap();
        let key = "k".to_string();
        let first = l.check(&key, 2).await.unwrap();
        assert_eq!(first.remaining(), 2, "{strategy}");
        let refunded = l
            .settle(&key, first.reservation().unwrap(), 0)
            .await
            .unwrap();
        assert_eq!(refunded.remaining(), 4, "{strategy}: refunded");
        let second = l.check(&key, 1).await.unwrap();
        let charged = l
            .settle(&key, second.reservation().unwrap(), 3)
            .await
            .unwrap();
        assert_eq!(charged.remaining(), 1, "{strategy}: charged the difference");
    }
}

#[tokio::test]
async fn a_bucket_finer_than_a_microsecond_is_refused_at_build() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let s = store(&server).await;
    let e = RateLimiter::<String, _>::builder()
        .strategy(Strategy::TokenBucket)
        .quotas("2000000/second")
        .unwrap()
        .store(s)
        .build()
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::IntervalBelowResolution { .. }),
        "{e}"
    );
}
