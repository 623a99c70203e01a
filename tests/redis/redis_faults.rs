//! Redis faults: kill -9 and restart, a hung server (SIGSTOP,
//! CLIENT PAUSE), SCRIPT FLUSH mid-run, out of memory, a wrong value type, a Cluster master killed
//! and restarted. Run one at a time (a process-wide lock), each on its own server(s), with the
//! store's default 50 ms timeout.

use crate::logs::capturing;
use crate::redis_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_support::{FaultProxy, ProxyMode, RedisCluster, RedisServer};
use tollgate::layer::FailurePolicy;
use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Op, Rule, StoreErrorKind, Strategy};

static SERIAL: Mutex<()> = Mutex::new(());

/// One timing-sensitive Redis test at a time (faults, the flood, degraded mode, the failover).
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A two-worker runtime, as the Redis tests run.
pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A call never takes longer than the timeout plus this much scheduling slack (the catalogue: CI
/// asserts timeout + 1 s).
const SLACK: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Load {
    ok: AtomicU64,
    errors: AtomicU64,
    slowest_us: AtomicU64,
}

/// Four tasks deciding on their own keys about every 2 ms each, until `stop`.
fn spawn_load(
    store: &RedisStore,
    stop: &Arc<AtomicBool>,
) -> (Arc<Load>, Vec<tokio::task::JoinHandle<()>>) {
    let load = Arc::new(Load::default());
    let rule = Rule::parse(Strategy::SlidingWindow, "1000000/hour").unwrap();
    let tasks = (0..4)
        .map(|i| {
            let (store, stop, load, rule) = (
                store.clone(),
                Arc::clone(stop),
                Arc::clone(&load),
                rule.clone(),
            );
            tokio::spawn(async move {
                let key = format!("load-{i}");
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let r = store
                        .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                        .await;
                    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                    load.slowest_us.fetch_max(us, Ordering::Relaxed);
                    match r {
                        Ok(_) => load.ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => load.errors.fetch_add(1, Ordering::Relaxed),
                    };
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    (load, tasks)
}

fn assert_bounded(load: &Load, what: &str) {
    let slowest = Duration::from_micros(load.slowest_us.load(Ordering::Relaxed));
    assert!(
        slowest <= TIMEOUT + SLACK,
        "{what}: a call took {slowest:?}"
    );
}

/// Calls until one decides correctly; returns how long that took.
async fn until_decided(store: &RedisStore, key: &str, within: Duration) -> Duration {
    let rule = Rule::parse(Strategy::FixedWindowFirstHit, "10/hour").unwrap();
    let start = Instant::now();
    loop {
        match store
            .apply(
                &key.to_string(),
                Scope::new("default", &rule),
                Op::Check(1),
                0,
            )
            .await
        {
            Ok(d) => {
                assert!(d.is_allowed(), "a fresh key after the outage: {d:?}");
                return start.elapsed();
            }
            Err(e) => {
                assert!(
                    start.elapsed() < within,
                    "no decision within {within:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

#[test]
fn kill_9_then_restart_recovers_within_a_second() {
    let _g = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (load, tasks) = spawn_load(&store, &stop);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(load.ok.load(Ordering::Relaxed) > 0);
        server.kill9();
        let errors_before = load.errors.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            load.errors.load(Ordering::Relaxed) > errors_before,
            "the outage is seen"
        );
        let stats = <RedisStore as Store<String>>::stats(&store);
        assert!(stats.store_errors > 0);
        let restarted = tokio::task::block_in_place(|| server.restart());
        let took = until_decided(&store, "after-restart", Duration::from_secs(3)).await;
        eprintln!("first correct decision {took:?} after PING answered");
        assert!(took < Duration::from_secs(1), "recovery took {took:?}");
        let _ = restarted;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        assert_bounded(&load, "kill -9");
    });
}

#[test]
fn hung_server_never_holds_a_call_past_the_timeout() {
    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (load, tasks) = spawn_load(&store, &stop);
        tokio::time::sleep(Duration::from_millis(200)).await;
        // SIGSTOP: sockets stay open, nothing answers.
        server.pause();
        let errors_before = load.errors.load(Ordering::Relaxed);
        // Past the store's 2 s of "Redis answered lately" (shed), into the outage (errors).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let during = load.errors.load(Ordering::Relaxed) - errors_before;
        server.resume();
        assert!(during > 0, "calls failed while the server was stopped");
        let took = until_decided(&store, "after-cont", Duration::from_secs(3)).await;
        assert!(took < Duration::from_secs(1), "took {took:?}");
        // No pile of connections from the stall: the store's one, plus redis-cli asking.
        let clients: u32 = server
            .cli(&["INFO", "clients"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("connected_clients:"))
            .and_then(|n| n.parse().ok())
            .unwrap_or(u32::MAX);
        assert!(clients <= 3, "{clients} connections after the stall");
        // CLIENT PAUSE: the server is up but holds every client.
        let paused = server.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
        assert_eq!(paused, "OK");
        let rule = Rule::parse(Strategy::TokenBucket, "10/second").unwrap();
        let start = Instant::now();
        let timed_out = store.counters().timed_out;
        let r = store
            .apply(
                &"paused".to_string(),
                Scope::new("default", &rule),
                Op::Check(1),
                0,
            )
            .await;
        // Redis answered within the last 500 ms: overload, shed (a local rejection); past that,
        // an outage (a timeout error for the failure policy). Never an admission.
        match r {
            Ok(d) => assert!(!d.is_allowed(), "a timed-out call was admitted: {d:?}"),
            Err(e) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
        }
        assert!(
            store.counters().timed_out > timed_out,
            "the timeout is counted"
        );
        assert!(start.elapsed() <= TIMEOUT + SLACK);
        tokio::time::sleep(Duration::from_millis(1600)).await;
        until_decided(&store, "after-pause", Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        assert_bounded(&load, "SIGSTOP");
    });
}

#[test]
fn script_flush_mid_run_is_invisible() {
    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, "1000000/hour").unwrap();
        let key = "flushed".to_string();
        let errors = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (store, rule, key, errors) = (
                store.clone(),
                rule.clone(),
                key.clone(),
                Arc::clone(&errors),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..100 {
                    if store
                        .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                        .await
                        .is_err()
                    {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(errors.load(Ordering::Relaxed), 0);
        let hash = store
            .redis_keys(&key, Scope::new("default", &rule))
            .remove(0);
        assert_eq!(
            server.cli(&["HGET", &hash, "n1"]),
            "6400",
            "one increment per decision"
        );
    });
}

#[test]
fn out_of_memory_and_wrong_types_are_store_errors() {
    let _g = serial();
    let Some(server) =
        RedisServer::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"])
    else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let rule = Rule::parse(Strategy::FixedWindow, "5/second").unwrap();
        // WRONGTYPE: a string where the store keeps a hash, a hash where it keeps a list.
        let key = "typed".to_string();
        let hash = store
            .redis_keys(&key, Scope::new("default", &rule))
            .remove(0);
        server.cli(&["SET", &hash, "not a hash"]);
        let e = store
            .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Server, "{e}");
        assert!(e.message().contains("WRONGTYPE"), "{e}");
        let moving = Rule::parse(Strategy::MovingWindow, "5/second").unwrap();
        let list = store
            .redis_keys(&key, Scope::new("default", &moving))
            .remove(0);
        server.cli(&["HSET", &list, "a", "b"]);
        let e = store
            .apply(&key, Scope::new("default", &moving), Op::Check(1), 0)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Server, "{e}");
        // A non-numeric field reads as 0: still a decision, never a panic.
        let other = "garbled".to_string();
        let h = store
            .redis_keys(&other, Scope::new("default", &rule))
            .remove(0);
        server.cli(&["HSET", &h, "n1", "abc", "s1", "x"]);
        store
            .apply(&other, Scope::new("default", &rule), Op::Check(1), 0)
            .await
            .unwrap();
        // Fill memory, then decide: OOM is a server error.
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let blob = "x".repeat(1024);
        for i in 0..20_000 {
            let r: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("fill{i}"))
                .arg(&blob)
                .query_async(&mut conn)
                .await;
            if r.is_err() {
                break;
            }
        }
        // OOM is checked when a script starts: the first write after the fill may still pass.
        let mut oom = None;
        for i in 0..3 {
            if let Err(e) = store
                .apply(
                    &format!("new-{i}"),
                    Scope::new("default", &rule),
                    Op::Check(1),
                    0,
                )
                .await
            {
                oom = Some(e);
                break;
            }
        }
        let e = oom.expect("an OOM error once memory is full");
        assert_eq!(e.kind(), StoreErrorKind::Server, "{e}");
        assert!(e.message().contains("OOM"), "{e}");
        let stats = <RedisStore as Store<String>>::stats(&store);
        assert_eq!(stats.store_errors, 3);
    });
}

#[test]
fn an_allkeys_eviction_policy_is_warned_about() {
    let _g = serial();
    let Some(server) = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, captured) = capturing(|| {
        rt.block_on(async { RedisStore::connect(&server.url()).await.unwrap() });
    });
    let text = captured.text();
    assert!(text.contains("allkeys-lru"), "{text}");
}

#[test]
fn cluster_master_killed_and_restarted() {
    let _g = serial();
    let Some(mut cluster) = RedisCluster::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::connect(&cluster.url()).await.unwrap();
        let rule = Rule::parse(Strategy::TokenBucket, "100/second").unwrap();
        let keys: Vec<String> = (0..30).map(|i| format!("c{i}")).collect();
        for k in &keys {
            store
                .apply(k, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap();
        }
        tokio::task::block_in_place(|| cluster.nodes[1].kill9());
        // While the node is gone, every call still returns within the timeout.
        let until = Instant::now() + Duration::from_millis(1500);
        let mut failed = 0;
        while Instant::now() < until {
            for k in &keys {
                let start = Instant::now();
                if store
                    .apply(k, Scope::new("default", &rule), Op::Check(1), 0)
                    .await
                    .is_err()
                {
                    failed += 1;
                }
                assert!(
                    start.elapsed() <= TIMEOUT + SLACK,
                    "call took {:?}",
                    start.elapsed()
                );
            }
        }
        assert!(failed > 0, "the dead master's keys fail");
        let restarted = Instant::now();
        tokio::task::block_in_place(|| cluster.nodes[1].restart());
        // Decisions on every key resume within node-timeout (2 s) + 5 s of the restart.
        let deadline = restarted + Duration::from_secs(7);
        for k in &keys {
            loop {
                match store
                    .apply(k, Scope::new("default", &rule), Op::Check(1), 0)
                    .await
                {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "key {k} still failing: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        eprintln!(
            "all keys decided {:?} after the restart",
            restarted.elapsed()
        );
    });
}

#[test]
fn an_indeterminate_failure_is_never_replayed() {
    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, "100/hour").unwrap();
        for mode in [ProxyMode::DropReplies, ProxyMode::ResetAfterForward] {
            let proxy = FaultProxy::start(server.port).await;
            let store = RedisStore::builder(proxy.url())
                .timeout(Duration::from_millis(200))
                .build()
                .await
                .unwrap();
            let key = format!("{mode:?}");
            store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap();
            server.cli(&["CONFIG", "RESETSTAT"]);
            proxy.set(mode);
            let r = store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await;
            if mode == ProxyMode::DropReplies {
                // No reply, Redis answered lately: shed (never admitted), or a timeout.
                match r {
                    Ok(d) => assert!(!d.is_allowed(), "{mode:?}: admitted {d:?}"),
                    Err(e) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{mode:?}: {e}"),
                }
                assert_eq!(store.counters().timed_out, 1);
            } else {
                let e = r.unwrap_err();
                assert_eq!(e.kind(), StoreErrorKind::Connection, "{mode:?}: {e}");
            }
            proxy.set(ProxyMode::Pass);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(
                server.command_calls("evalsha"),
                1,
                "{mode:?}: sent once, never replayed"
            );
            let hash = store
                .redis_keys(&key, Scope::new("default", &rule))
                .remove(0);
            assert_eq!(
                server.cli(&["HGET", &hash, "n1"]),
                "2",
                "{mode:?}: counted once"
            );
            if mode == ProxyMode::ResetAfterForward {
                let took = until_decided(&store, "after-reset", Duration::from_secs(2)).await;
                assert!(took < Duration::from_secs(1), "reconnect took {took:?}");
            }
        }
    });
}

/// A restart of a Redis without persistence (`--save '' --appendonly no`) forgets
/// every counter, so a key may be admitted up to N more times per restart (documented bound), and
/// never more; after the reconnect no call errors.
#[test]
fn restart_without_persistence_over_admits_at_most_n() {
    let _g = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    const N: u32 = 5;
    rt().block_on(async {
        // Without the blocked-key cache: it would answer the blocked key for up to its staleness
        // bound after the restart (fewer admissions), and this test measures the store's bound.
        let store = RedisStore::builder(server.url())
            .block_cache(0)
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::MovingWindow, "5/hour").unwrap();
        let key = "t23".to_string();
        let mut admitted = 0;
        for _ in 0..N + 3 {
            let d = store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap();
            admitted += u32::from(d.is_allowed());
        }
        assert_eq!(admitted, N, "before the restart");
        tokio::task::block_in_place(|| server.restart());
        let pinged = Instant::now();
        // Until the store reconnects, calls may fail (bounded); they count for nothing.
        let first = loop {
            match store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
            {
                Ok(d) => break d,
                Err(e) => {
                    assert!(
                        pinged.elapsed() < Duration::from_secs(3),
                        "no reconnect: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let took = pinged.elapsed();
        let mut after = u32::from(first.is_allowed());
        for i in 0..2 * N {
            let d = store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap_or_else(|e| panic!("call {i} after the reconnect failed: {e}"));
            after += u32::from(d.is_allowed());
        }
        eprintln!(
            "first decision {took:?} after PING; admitted after the restart {after} (N = {N})"
        );
        assert!(after <= N, "over-admission {after} > N after one restart");
        assert_eq!(
            after, N,
            "without persistence the counter restarts from zero (the documented bound is reached)"
        );
        assert!(took < Duration::from_secs(1), "recovery took {took:?}");
    });
}

fn redis_cli_auth(port: u16, password: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["--no-auth-warning", "-a", password])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A wrong or missing password is a store error at connect time, and
/// a password changed under a running store (its connections killed, the reconnect refused) makes
/// every decision a store error (no panic, within the timeout); behind the layer, fail-closed
/// answers 503 and never admits.
#[test]
fn wrong_password_is_a_store_error_and_fail_closed_never_admits() {
    use tollgate::RateLimiter;
    use tollgate::key::GlobalKey;
    use tollgate::layer::RateLimitLayer;
    use tower::{Layer, ServiceExt};

    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    // Set after start: the harness waits for an unauthenticated PING.
    assert_eq!(server.cli(&["CONFIG", "SET", "requirepass", "right"]), "OK");
    let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    rt().block_on(async {
        for url in [
            format!("redis://:wrong@127.0.0.1:{port}"),
            format!("redis://127.0.0.1:{port}"),
        ] {
            let e = match RedisStore::connect(&url).await {
                Err(tollgate::BuildError::Store(e)) => e,
                other => panic!("a refused password is a store error: {other:?}"),
            };
            eprintln!("connect with a bad password: {:?}: {e}", e.kind());
            // Bug fixed: the message used to quote the URL with its password.
            assert!(
                !e.message().contains("wrong"),
                "credentials in the message: {e}"
            );
            // The server's own words, at once (it used to look like a timeout).
            assert_eq!(e.kind(), StoreErrorKind::Server, "{e}");
            assert!(
                e.message().contains("WRONGPASS") || e.message().contains("NOAUTH"),
                "{e}"
            );
        }
        let store = RedisStore::connect(&format!("redis://:right@127.0.0.1:{port}"))
            .await
            .unwrap();
        let lim: RateLimiter<(), RedisStore> = RateLimiter::builder()
            .quotas("1000/hour")
            .unwrap()
            .store(store.clone())
            .build()
            .unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let inner = {
            let calls = Arc::clone(&calls);
            tower::service_fn(move |_: http::Request<String>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
            })
        };
        let closed = RateLimitLayer::new(lim.clone(), GlobalKey)
            .failure_policy(FailurePolicy::FailClosed)
            .layer(inner);
        let get = || http::Request::new(String::new());
        let res = closed.clone().oneshot(get()).await.unwrap();
        assert_eq!(
            res.status(),
            http::StatusCode::OK,
            "the right password works"
        );
        // The password changes and the store's connections are dropped: every reconnect is refused.
        assert_eq!(
            redis_cli_auth(port, "right", &["CONFIG", "SET", "requirepass", "changed"]),
            "OK"
        );
        redis_cli_auth(port, "changed", &["CLIENT", "KILL", "TYPE", "normal"]);
        let before = calls.load(Ordering::SeqCst);
        let mut kinds = Vec::new();
        for _ in 0..20 {
            let start = Instant::now();
            let res = closed.clone().oneshot(get()).await.unwrap();
            assert!(start.elapsed() <= TIMEOUT + SLACK, "{:?}", start.elapsed());
            assert_eq!(res.status(), http::StatusCode::SERVICE_UNAVAILABLE);
            let start = Instant::now();
            let e = store
                .apply(
                    &"k".to_string(),
                    Scope::new(lim.name(), lim.rule()),
                    Op::Check(1),
                    0,
                )
                .await
                .expect_err("a refused reconnect is a store error");
            assert!(start.elapsed() <= TIMEOUT + SLACK, "{:?}", start.elapsed());
            kinds.push(e.kind());
        }
        eprintln!("error kinds after the password change: {:?}", kinds[0]);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            before,
            "fail-closed never reached the inner service"
        );
        assert!(<RedisStore as Store<()>>::stats(&store).store_errors >= 40);
    });
}

/// A real failure over HTTP (5 s at PR scale): Redis is killed
/// for 5 s under ~100 requests/s through two axum apps sharing one Redis-backed limiter (fail-open
/// and fail-closed). Fail-open answers 200 without `x-ratelimit-*` headers, fail-closed 503, every
/// response within the timeout + slack; the store's warning is logged at most once per second; the
/// counters say exactly how many decisions failed and how many were let through. After the restart
/// the first response carrying limiter headers comes within 1 s.
#[test]
fn redis_down_five_seconds_over_http() {
    use axum::Router;
    use axum::routing::get;
    use tollgate::RateLimiter;
    use tollgate::key::GlobalKey;
    use tollgate::layer::RateLimitLayer;

    use crate::support as http_support;
    use http_support::{TestClient, TestServer};

    let _g = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ((open_n, closed_n, stats, took), captured) = capturing(|| {
        rt.block_on(async {
            let store = RedisStore::connect(&server.url()).await.unwrap();
            let lim: RateLimiter<(), RedisStore> = RateLimiter::builder()
                .quotas("1000000/hour")
                .unwrap()
                .store(store)
                .build()
                .unwrap();
            let app = |closed: bool| {
                let layer = RateLimitLayer::new(lim.clone(), GlobalKey);
                let layer = if closed {
                    layer.failure_policy(FailurePolicy::FailClosed)
                } else {
                    layer
                };
                Router::new()
                    .route("/", get(|| async { "ok" }))
                    .layer(layer)
            };
            let open = TestServer::start(app(false)).await;
            let closed = TestServer::start(app(true)).await;
            let client = TestClient::new();
            let (open_url, closed_url) = (open.url("/"), closed.url("/"));
            let res = client.get(&open_url).await;
            assert_eq!(res.status, http::StatusCode::OK);
            assert!(res.header("x-ratelimit-remaining").is_some());
            // A current-thread runtime: these blocking calls take milliseconds.
            server.kill9();
            let down = Instant::now();
            let (mut open_n, mut closed_n) = (0u64, 0u64);
            while down.elapsed() < Duration::from_secs(5) {
                let start = Instant::now();
                let res = client.get(&open_url).await;
                assert!(start.elapsed() <= TIMEOUT + SLACK, "{:?}", start.elapsed());
                assert_eq!(res.status, http::StatusCode::OK, "fail-open");
                for h in [
                    "x-ratelimit-limit",
                    "x-ratelimit-remaining",
                    "x-ratelimit-reset",
                ] {
                    assert!(res.header(h).is_none(), "fail-open claimed {h}");
                }
                open_n += 1;
                let start = Instant::now();
                let res = client.get(&closed_url).await;
                assert!(start.elapsed() <= TIMEOUT + SLACK, "{:?}", start.elapsed());
                assert_eq!(
                    res.status,
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "fail-closed"
                );
                closed_n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let stats = lim.stats();
            server.restart();
            let pinged = Instant::now();
            loop {
                let res = client.get(&open_url).await;
                if res.header("x-ratelimit-remaining").is_some() {
                    break;
                }
                assert!(pinged.elapsed() < Duration::from_secs(3), "no recovery");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let took = pinged.elapsed();
            open.stop().await;
            closed.stop().await;
            (open_n, closed_n, stats, took)
        })
    });
    let text = captured.text();
    let store_warnings = text.matches("rate-limit Redis store failed").count();
    let all_warnings = text.lines().filter(|l| l.contains("WARN")).count();
    let open_warnings = text.matches("failing open").count();
    let closed_warnings = text.matches("failing closed").count();
    eprintln!(
        "Redis down 5 s: {open_n} fail-open + {closed_n} fail-closed responses; \
         store_errors {} fail_open {}; store warnings {store_warnings}, WARN lines {all_warnings}; \
         first limited response {took:?} after PING",
        stats.store_errors, stats.fail_open
    );
    assert!(open_n + closed_n >= 20, "the load ran");
    assert_eq!(
        stats.store_errors,
        open_n + closed_n,
        "one error counted per failed decision"
    );
    assert_eq!(
        stats.fail_open, open_n,
        "one fail-open counted per request let through"
    );
    assert!(
        (1..=7).contains(&store_warnings),
        "{store_warnings} store warnings in 5 s:\n{text}"
    );
    // Three sources (the store, the fail-open layer, the fail-closed layer), each at most ~1/s.
    assert!(
        open_warnings <= 7 && closed_warnings <= 7 && all_warnings <= 21,
        "log storm: {all_warnings} WARN lines:\n{text}"
    );
    assert!(took < Duration::from_secs(1), "recovery took {took:?}");
}
