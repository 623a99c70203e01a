//! The rules file on Redis: every limit on one shared store, all-or-nothing decisions under races
//! (the two-phase reserve, then settle to 0), and a reload that keeps each unchanged limit's state.

use crate::redis_support::RedisServer;
use crate::support::{TestClient, TestServer, ip};

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::redis::RedisStore;

async fn rules_on(server: &RedisServer, text: &str) -> Rules<RedisStore> {
    let store = RedisStore::builder(server.url())
        .prefix("rules:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    Rules::new(text, RulesOptions::default(), move || store.clone()).unwrap()
}

async fn serve(rules: &Rules<RedisStore>) -> TestServer {
    TestServer::start(
        Router::new()
            .fallback(|| async { "ok" })
            .layer(rules.layer()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rejected_request_spends_nothing_on_redis_under_races() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    const G: usize = 20;
    const P: usize = 2;
    let rules = rules_on(
        &redis,
        &format!(
            "[[limit]]\nname = \"global\"\nkey = \"global\"\nstrategy = \"moving-window\"\nquotas = \"{G}/hour\"\n\n\
             [[limit]]\nname = \"per-ip\"\nstrategy = \"fixed-window-first-hit\"\nquotas = \"{P}/hour\"\n"
        ),
    )
    .await;
    let server = Arc::new(serve(&rules).await);
    let ips = 6;
    let mut tasks = Vec::new();
    for i in 0..ips {
        for _ in 0..8 {
            let url = server.url("/");
            let client = TestClient::from_ip(ip(&format!("127.0.0.{}", i + 2)));
            tasks.push(tokio::spawn(
                async move { (i, client.get(&url).await.status) },
            ));
        }
    }
    let mut admitted = vec![0; ips];
    for t in tasks {
        let (i, status) = t.await.unwrap();
        match status {
            StatusCode::OK => admitted[i] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    let total: usize = admitted.iter().sum();
    assert!(
        admitted.iter().all(|&a| a <= P),
        "per-ip over-admitted: {admitted:?}"
    );
    assert!(total > 0 && total <= G, "global: {total}");
    // A rejection of the global key during the race may reach the blocked-key cache after a
    // rollback freed units (the cache answers for at most its staleness bound, 1 s by default):
    // probe Redis's state once that bound has passed.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut later = 0;
    'probe: for i in 0..(G / P + 1) {
        let client = TestClient::from_ip(ip(&format!("127.0.1.{}", i + 2)));
        for _ in 0..P {
            if client.get(&server.url("/")).await.status != StatusCode::OK {
                break 'probe;
            }
            later += 1;
        }
    }
    assert_eq!(
        later,
        G - total,
        "leftover spend in the global limit on Redis"
    );
    Arc::try_unwrap(server).ok().unwrap().stop().await;
}

#[tokio::test]
async fn a_reload_on_redis_keeps_unchanged_limits_and_converts_changed_quotas() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let text = |quotas: &str, path: &str| {
        format!(
            "[[limit]]\nname = \"l\"\npath = \"{path}\"\nstrategy = \"fixed-window-first-hit\"\nquotas = \"{quotas}\"\n"
        )
    };
    let rules = rules_on(&redis, &text("1/hour", "/*")).await;
    let server = serve(&rules).await;
    let c = TestClient::new();
    assert_eq!(c.get(&server.url("/a")).await.status, StatusCode::OK);
    assert_eq!(
        c.get(&server.url("/a")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = rules.reload_text(&text("1/hour", "/a")).unwrap().unwrap();
    assert_eq!(r.changed, ["l"]);
    assert_eq!(
        c.get(&server.url("/a")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "kept"
    );
    // A quota change on a shared store: the same limiter (its name stays taken), the spent unit
    // converted to the new quota on access.
    let r = rules.reload_text(&text("3/hour", "/a")).unwrap().unwrap();
    assert_eq!(r.converted, ["l"]);
    assert_eq!(c.get(&server.url("/a")).await.status, StatusCode::OK);
    assert_eq!(c.get(&server.url("/a")).await.status, StatusCode::OK);
    assert_eq!(
        c.get(&server.url("/a")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A strategy change: the key's state is the limit name's on the store, converted by the
    // store on access: the hour's three spent units carry into the moving window's log.
    let moving = text("4/hour", "/a").replace("fixed-window-first-hit", "moving-window");
    rules.reload_text(&moving).unwrap().unwrap();
    assert_eq!(c.get(&server.url("/a")).await.status, StatusCode::OK);
    assert_eq!(
        c.get(&server.url("/a")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "3 spent + 1 of 4/hour"
    );
    server.stop().await;
}

/// Bug: on one Redis store shared by every limit, a reload that added back a limit removed by an
/// earlier reload failed with `DuplicateName` while a request on the older rules was in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_removed_and_added_back_on_redis_reloads_and_frees_its_name() {
    use tollgate::store::Store;

    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::builder(redis.url())
        .prefix("rules-names:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let a = "[[limit]]\nname = \"a\"\nkey = \"global\"\nquotas = \"5/hour\"\n";
    let b = "[[limit]]\nname = \"b\"\nkey = \"global\"\nquotas = \"5/hour\"\n";
    let shared = store.clone();
    let rules = Rules::new(a, RulesOptions::default(), move || shared.clone()).unwrap();
    let (gate, entered) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let slow = {
        let (gate, entered) = (Arc::clone(&gate), Arc::clone(&entered));
        move || async move {
            entered.notify_one();
            gate.notified().await;
            "slow"
        }
    };
    let server = TestServer::start(
        Router::new()
            .route("/slow", axum::routing::get(slow))
            .fallback(|| async { "ok" })
            .layer(rules.layer()),
    )
    .await;
    let c = TestClient::new();
    let in_flight = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/slow"));
        async move { c.get(&url).await }
    });
    entered.notified().await;
    rules.reload_text(b).expect("a removed");
    rules
        .reload_text(a)
        .expect("a added back on the shared store");
    let res = c.get(&server.url("/fast")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        res.num("x-ratelimit-remaining"),
        3,
        "the same state on Redis"
    );
    rules.reload_text(b).expect("a removed again");
    gate.notify_one();
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    let taken = |name: &str| Store::<Vec<u8>>::names(&store).contains(name);
    for _ in 0..100 {
        if !taken("a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!taken("a"), "the removed limit's name is released");
    server.stop().await;
}
