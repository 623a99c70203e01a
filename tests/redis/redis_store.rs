//! The Redis store on a single node: the same decisions as the memory store, exact totals
//! from two instances, same-instant requests, TTLs, the block cache.
//! Each test starts its own `redis-server` on a free loopback port.

use crate::redis_support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::store::{MemoryStore, Scope, Store};
use tollgate::{Decision, Op, Outcome, Quota, RateLimiter, Rule, Strategy};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
/// A whole hour in Unix time (2023-11-14T23:00:00Z), so aligned windows start at offsets of 0.
const BASE: u64 = 1_700_002_800 * S;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

async fn test_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .use_client_time(true)
        // Exact comparisons on a test clock: the cache answers on the process's own clock.
        .block_cache(0)
        .build()
        .await
        .expect("connect")
}

/// Memory decisions are in nanoseconds, Redis decisions in whole microseconds: a wait the memory
/// store computes as 6 s + 1 ns is 6 s + 1 µs on Redis (the first whole microsecond at which the
/// request passes). Everything else is identical.
fn as_micros(d: Duration) -> Duration {
    Duration::from_micros(u64::try_from(d.as_nanos().div_ceil(1000)).expect("fits"))
}

fn same(memory: &Decision, redis: &Decision) -> bool {
    memory.outcome() == redis.outcome()
        && memory.limit() == redis.limit()
        && memory.remaining() == redis.remaining()
        && memory.quota_index() == redis.quota_index()
        && as_micros(memory.reset_after()) == redis.reset_after()
        && memory.retry_after().map(as_micros) == redis.retry_after()
        && memory.time() == redis.time()
}

/// [`same`], but for a first-hit window the memory store packs with its start rounded up to a
/// grain (under 0.54 s for `u32::MAX` per ten years): its times may be later than Redis's by less
/// than that, never earlier.
fn same_but_rounded_start(memory: &Decision, redis: &Decision) -> bool {
    let later_by_less_than_a_grain = |m: Duration, r: Duration| {
        let m = as_micros(m);
        r <= m && m < r + Duration::from_millis(540)
    };
    memory.outcome() == redis.outcome()
        && memory.limit() == redis.limit()
        && memory.remaining() == redis.remaining()
        && memory.quota_index() == redis.quota_index()
        && later_by_less_than_a_grain(memory.reset_after(), redis.reset_after())
        && match (memory.retry_after(), redis.retry_after()) {
            (Some(m), Some(r)) => later_by_less_than_a_grain(m, r),
            (m, r) => m.is_none() && r.is_none(),
        }
        && memory.time() == redis.time()
}

struct Step {
    at: u64,
    op: Op,
    expect: Option<Outcome>,
}

fn step(at: u64, op: Op, expect: Outcome) -> Step {
    Step {
        at,
        op,
        expect: Some(expect),
    }
}

fn check(at: u64, cost: u32, expect: Outcome) -> Step {
    step(at, Op::Check(cost), expect)
}

/// The worked examples of the core-engine issue, plus multi-quota, refund, peek and reset cases.
fn scenarios() -> Vec<(&'static str, Rule, Vec<Step>)> {
    use Outcome::{Allowed as A, Exceeds as X, Rejected as R};
    let mut out = Vec::new();
    // Fixed window 10/minute, first hit at 00:00:45.
    let mut steps: Vec<Step> = (0..10).map(|i| check(45 * S + i * MS, 1, A)).collect();
    steps.push(check(60 * S, 1, R));
    steps.push(check(105 * S - MS, 1, R));
    steps.push(check(105 * S, 1, A));
    steps.push(check(106 * S, 11, X));
    out.push((
        "fixed first-hit 10/minute",
        Rule::parse(Strategy::FixedWindowFirstHit, "10/minute").unwrap(),
        steps,
    ));
    // Clock-aligned 5000/hour, first hit at 10:59:30 resets at 11:00:00.
    out.push((
        "fixed aligned 5000/hour",
        Rule::parse(Strategy::FixedWindow, "5000/hour").unwrap(),
        vec![
            check(3570 * S, 5000, A),
            check(3600 * S - MS, 1, R),
            check(3600 * S, 1, A),
            step(3601 * S, refund(1, 3600 * S), A),
            check(3602 * S, 5000, A),
        ],
    ));
    // Moving window 10/minute: 1 at :10, 2 at :20, 4 at :30, 3 at :50; :71 admitted, :72 rejected.
    let mut steps = Vec::new();
    for (t, n) in [(10, 1), (20, 2), (30, 4), (50, 3)] {
        for _ in 0..n {
            steps.push(check(t * S, 1, A));
        }
    }
    steps.push(check(71 * S, 1, A));
    steps.push(check(72 * S, 1, R));
    steps.push(step(73 * S, Op::Peek, A));
    out.push((
        "moving 10/minute",
        Rule::parse(Strategy::MovingWindow, "10/minute").unwrap(),
        steps,
    ));
    // Moving window 3/second: 100, 300, 600 ms admitted; 800 ms rejected (300 ms); 1110 ms admitted.
    out.push((
        "moving 3/second",
        Rule::parse(Strategy::MovingWindow, "3/second").unwrap(),
        vec![
            check(100 * MS, 1, A),
            check(300 * MS, 1, A),
            check(600 * MS, 1, A),
            check(800 * MS, 1, R),
            check(1110 * MS, 1, A),
            step(1200 * MS, refund(1, 1110 * MS), A),
            check(1210 * MS, 1, A),
            check(1220 * MS, 4, X),
        ],
    ));
    // Sliding counter 100/minute: previous 40, current 80; 30 s in rejected, 40 s in admitted (6 left).
    out.push((
        "sliding 100/minute",
        Rule::parse(Strategy::SlidingWindow, "100/minute").unwrap(),
        vec![
            check(0, 40, A),
            check(90 * S, 80, A),
            check(90 * S, 1, R),
            check(100 * S, 1, A),
        ],
    ));
    // Sliding counter 7/minute: previous 5, current 3, at 30 %: admitted (6.5 -> 6), next rejected.
    out.push((
        "sliding 7/minute",
        Rule::parse(Strategy::SlidingWindow, "7/minute").unwrap(),
        vec![
            check(0, 5, A),
            check(72 * S, 3, A),
            check(78 * S, 1, A),
            check(78 * S, 1, R),
            check(84 * S + MS / 1000, 1, A),
            step(85 * S, Op::Reset, A),
            check(85 * S, 7, A),
        ],
    ));
    // Token bucket: capacity 500 refilled at 100/s.
    let mut steps: Vec<Step> = (0..500).map(|_| check(1000 * S, 1, A)).collect();
    steps.push(check(1000 * S, 1, R));
    steps.push(check(1000 * S + 10 * MS, 1, A));
    out.push((
        "token 100/second burst 500",
        Rule::new(
            Strategy::TokenBucket,
            [Quota::per_second(nz(100)).with_burst(nz(500))],
        )
        .unwrap(),
        steps,
    ));
    // Token bucket: capacity 3, one per 4 s.
    out.push((
        "token 1/4s burst 3",
        Rule::new(
            Strategy::TokenBucket,
            ["1/4s".parse::<Quota>().unwrap().with_burst(nz(3))],
        )
        .unwrap(),
        vec![
            check(50 * S, 1, A),
            check(50 * S, 1, A),
            check(50 * S, 1, A),
            check(50 * S, 1, R),
            check(54 * S, 1, A),
            check(54 * S, 4, X),
            step(55 * S, refund(1, 54 * S), A),
        ],
    ));
    // Leaky bucket meter, several quotas: one rejects, the other keeps its units.
    let mut steps: Vec<Step> = (0..5).map(|_| check(10 * S, 1, A)).collect();
    steps.push(check(10 * S, 1, R));
    steps.push(check(11 * S, 1, A));
    out.push((
        "leaky 5/second; 6/minute",
        Rule::parse(Strategy::LeakyBucket, "5/second; 60/minute").unwrap(),
        steps,
    ));
    // The largest limit over the longest period, where `count * (W - e)` passes 2^53 and
    // the scripts' exact integer division must agree with the memory store's u128 arithmetic.
    let day = 86_400 * S;
    let any = |at: u64, op: Op| Step {
        at,
        op,
        expect: None,
    };
    for strategy in [
        Strategy::SlidingWindow,
        Strategy::FixedWindow,
        Strategy::FixedWindowFirstHit,
    ] {
        out.push((
            "huge quota",
            Rule::parse(strategy, "4294967295/3660d").unwrap(),
            vec![
                any(0, Op::Check(4_000_000_000)),
                any(1234 * day + 567_891_234_000, Op::Check(294_967_295)),
                any(3660 * day + 7_000_001_000, Op::Check(3_999_999_999)),
                any(3661 * day + 12_345_678_000, Op::Check(1)),
                any(3662 * day, Op::Check(4_294_967_295)),
                any(5000 * day + 1000, Op::Peek),
                any(5000 * day + 2000, refund(123_456_789, 3662 * day)),
                any(7320 * day + 3000, Op::Check(2_000_000_000)),
                any(7321 * day, Op::Check(2_294_967_296)),
            ],
        ));
    }
    let mut steps: Vec<Step> = (0..5).map(|_| check(100 * S, 1, A)).collect();
    steps.push(check(100 * S, 1, R));
    steps.push(check(101 * S, 1, A));
    steps.push(check(102 * S, 1, R));
    out.push((
        "moving 5/second; 6/minute",
        Rule::parse(Strategy::MovingWindow, "5/second; 6/minute").unwrap(),
        steps,
    ));
    out
}

/// Gives back `cost` admitted by the check at `check_at` (relative to `BASE`).
fn refund(cost: u32, check_at: u64) -> Op {
    Op::settle_any(cost, 0, BASE + check_at)
}

async fn run_both(
    memory: &MemoryStore<String>,
    redis: &RedisStore,
    key: &String,
    rule: &Rule,
    op: Op,
    at: u64,
) -> (Decision, Decision) {
    let m = memory.decide(key, rule, op, at);
    let r = redis
        .apply(key, Scope::new("default", rule), op, at)
        .await
        .expect("redis decision");
    (m, r)
}

#[test]
fn scenario_table_gives_identical_decisions() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let redis = test_store(&server, "t15:").await;
        for (name, rule, steps) in scenarios() {
            let memory = MemoryStore::new();
            let key = format!("scenario {name} {}", rule.strategy());
            for (i, s) in steps.iter().enumerate() {
                let (m, r) = run_both(&memory, &redis, &key, &rule, s.op, BASE + s.at).await;
                let agree =
                    if name == "huge quota" && rule.strategy() == Strategy::FixedWindowFirstHit {
                        same_but_rounded_start(&m, &r)
                    } else {
                        same(&m, &r)
                    };
                assert!(agree, "{name} step {i}: memory {m:?} redis {r:?}");
                if let Some(e) = s.expect {
                    assert_eq!(m.outcome(), e, "{name} step {i}: {m:?}");
                }
            }
        }
        // The sliding counter's wait, where nanoseconds and microseconds differ by rounding.
        let rule = Rule::parse(Strategy::SlidingWindow, "7/minute").unwrap();
        let key = "rounding".to_string();
        for (at, cost) in [(0, 5), (72 * S, 3), (78 * S, 1)] {
            redis
                .apply(
                    &key,
                    Scope::new("default", &rule),
                    Op::Check(cost),
                    BASE + at,
                )
                .await
                .unwrap();
        }
        let d = redis
            .apply(
                &key,
                Scope::new("default", &rule),
                Op::Check(1),
                BASE + 78 * S,
            )
            .await
            .unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_micros(6_000_001)));
    });
}

#[derive(Clone, Debug)]
enum TraceOp {
    Check(u32),
    Peek,
    Refund(u32),
    /// A refund of the check made this many µs ago.
    RefundAt(u32, u64),
    Reset,
}

fn trace_op() -> impl proptest::strategy::Strategy<Value = TraceOp> {
    prop_oneof![
        8 => (0u32..5).prop_map(TraceOp::Check),
        1 => Just(TraceOp::Peek),
        1 => (1u32..4).prop_map(TraceOp::Refund),
        1 => (1u32..4, 0u64..3_000_000).prop_map(|(c, back)| TraceOp::RefundAt(c, back)),
        1 => Just(TraceOp::Reset),
    ]
}

fn quota_text() -> impl proptest::strategy::Strategy<Value = String> {
    // Periods in whole seconds and limits dividing 10^6, so the bucket interval T is a whole number
    // of microseconds (the Redis unit) and both stores use the same T.
    (
        prop::sample::select(vec![1u32, 2, 4, 5, 8, 10]),
        prop::sample::select(vec!["1s", "2s", "3s", "10s", "1m"]),
    )
        .prop_map(|(n, p)| format!("{n}/{p}"))
}

static CASE: AtomicU64 = AtomicU64::new(0);

#[test]
fn random_traces_give_identical_decisions() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = rt();
    let redis = rt.block_on(test_store(&server, "t15p:"));
    let config = ProptestConfig {
        cases: 192,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let strategies = prop::sample::select(Strategy::ALL.to_vec());
    let quotas = prop::collection::vec(quota_text(), 1..3);
    let trace = prop::collection::vec((0u64..2_500_000, trace_op()), 1..40);
    proptest!(config, |(strategy in strategies, quotas in quotas, trace in trace, start in 0u64..7_200_000_000)| {
        let rule = Rule::parse(strategy, &quotas.join("; ")).unwrap();
        let memory = MemoryStore::new();
        let key = format!("case {}", CASE.fetch_add(1, Ordering::Relaxed));
        let mut t = BASE + start * 1000;
        for (i, (gap_us, op)) in trace.iter().enumerate() {
            t += gap_us * 1000;
            let op = match *op {
                TraceOp::Check(c) => Op::Check(c),
                TraceOp::Peek => Op::Peek,
                TraceOp::Refund(c) => Op::settle_any(c, 0, t),
                TraceOp::RefundAt(c, back) => Op::settle_any(c, 0, t.saturating_sub(back * 1000)),
                TraceOp::Reset => Op::Reset,
            };
            let (m, r) = rt.block_on(run_both(&memory, &redis, &key, &rule, op, t));
            prop_assert!(same(&m, &r), "{} {:?} step {}: memory {:?} redis {:?}", strategy, quotas, i, m, r);
        }
    });
}

#[test]
fn two_limiters_admit_exactly_the_limit_with_one_evalsha_each() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let mut limiters = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::builder(server.url())
                .timeout(Duration::from_secs(2))
                // One EVALSHA per decision is what this test counts.
                .block_cache(0)
                .build()
                .await
                .expect("connect");
            let limiter = RateLimiter::builder()
                .strategy(Strategy::MovingWindow)
                .quotas("1000/hour")
                .unwrap()
                .store(store)
                .build()
                .unwrap();
            limiters.push(limiter);
        }
        server.cli(&["CONFIG", "RESETSTAT"]);
        let admitted = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        // 10^5 attempts per CI run; the long tier (`TOLLGATE_SCALE=10`) makes them 10^6.
        let scale = std::env::var("TOLLGATE_SCALE")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1)
            .clamp(1, 100);
        let per_task = 100_000 * scale / 64;
        let mut tasks = Vec::new();
        for limiter in &limiters {
            for _ in 0..32 {
                let limiter = limiter.clone();
                let (admitted, errors) = (Arc::clone(&admitted), Arc::clone(&errors));
                tasks.push(tokio::spawn(async move {
                    let key = "hot".to_string();
                    for _ in 0..per_task {
                        match limiter.check(&key, 1).await {
                            Ok(d) if d.is_allowed() => {
                                admitted.fetch_add(1, Ordering::Relaxed);
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
            "fail-closed run: no store error"
        );
        assert_eq!(admitted.load(Ordering::Relaxed), 1000);
        let decisions = per_task * 64;
        assert_eq!(
            server.command_calls("evalsha"),
            decisions,
            "one EVALSHA per decision"
        );
        assert_eq!(server.command_calls("eval"), 0);
        let stats: Vec<_> = limiters.iter().map(|l| l.stats()).collect();
        assert_eq!(stats.iter().map(|s| s.allowed).sum::<u64>(), 1000);
        assert_eq!(
            stats.iter().map(|s| s.allowed + s.rejected).sum::<u64>(),
            decisions
        );
    });
}

#[test]
fn same_instant_requests_are_all_counted() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::MovingWindow, "1500/minute").unwrap();
        let key = "instant".to_string();
        // The hash (the rule the state was written under), then the quota's list.
        let list = store
            .redis_keys(&key, Scope::new("default", &rule))
            .remove(1);
        // 1000 in flight at once on one connection: many share one server microsecond.
        let calls: Vec<_> = (0..1000)
            .map(|_| store.apply(&key, Scope::new("default", &rule), Op::Check(1), 0))
            .collect();
        let decisions = futures_join(calls).await;
        assert!(decisions.iter().all(|d| d.is_allowed()));
        assert_eq!(server.cli(&["LLEN", &list]), "1000");
        // The same instant from the test clock: 500 more fit, then none; the log stays at N.
        let clocked = test_store(&server, "tollgate:").await;
        let now = server.cli(&["TIME"]);
        let secs: u64 = now.lines().next().unwrap().parse().unwrap();
        let at = secs * S;
        let mut admitted = 0;
        for _ in 0..700 {
            if clocked
                .apply(&key, Scope::new("default", &rule), Op::Check(1), at)
                .await
                .unwrap()
                .is_allowed()
            {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 500);
        assert_eq!(server.cli(&["LLEN", &list]), "1500");
    });
}

async fn futures_join(
    calls: Vec<tollgate::store::Answer<<RedisStore as Store<String>>::Future>>,
) -> Vec<Decision> {
    let handles: Vec<_> = calls.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().unwrap());
    }
    out
}

fn ttl_ms(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).parse().unwrap()
}

#[test]
fn every_key_expires() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            // Room for all 500 calls of a batch at once: none is shed on a loaded machine.
            .max_in_flight(1024)
            .build()
            .await
            .unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        // Checked after each strategy's batch: on a loaded machine the earlier batches' keys may
        // already have expired (their horizon is 2 to 4 s), which is what the test wants anyway.
        for strategy in Strategy::ALL {
            let rule = Rule::parse(strategy, "2/second; 3/2s").unwrap();
            let calls: Vec<_> = (0..500)
                .map(|i| {
                    store.apply(
                        &format!("{strategy}-{i}"),
                        Scope::new("default", &rule),
                        Op::Check(1),
                        0,
                    )
                })
                .collect();
            let decisions = futures_join(calls).await;
            // A fresh key's first check is admitted: every call reached Redis (none was shed).
            assert!(decisions.iter().all(Decision::is_allowed), "{strategy}");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(keys.len() >= 500, "{strategy}: {} keys", keys.len());
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("PTTL").arg(k);
            }
            let ttls: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
            for (k, ttl) in keys.iter().zip(ttls) {
                // Horizons: 2 s (windows), 4 s (sliding counter), B*T = 2 s (buckets); plus 1 s.
                // -2: expired since KEYS ran; -1 (no TTL) never.
                // Every strategy keeps one hash per (name, key): the key's hex names it.
                let sliding = k.contains("736c6964696e672d77696e646f77"); // "sliding-window"
                let horizon = if sliding { 4000 } else { 2000 };
                assert!(
                    (ttl > 0 || ttl == -2) && ttl <= horizon + 1000,
                    "{k}: PTTL {ttl}"
                );
            }
        }
        // A key left without a TTL (a crash, an older version) gets one on its next write.
        let rule = Rule::parse(Strategy::FixedWindow, "5/second").unwrap();
        let key = "no-ttl".to_string();
        let hash = store
            .redis_keys(&key, Scope::new("default", &rule))
            .remove(0);
        server.cli(&["HSET", &hash, "s1", "0", "n1", "0"]);
        assert_eq!(ttl_ms(&server, &hash), -1);
        store
            .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
            .await
            .unwrap();
        assert!(ttl_ms(&server, &hash) > 0);
        let rule = Rule::parse(Strategy::MovingWindow, "5/second").unwrap();
        let key = "no-ttl-list".to_string();
        let list = store
            .redis_keys(&key, Scope::new("default", &rule))
            .remove(1);
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        let now_us = (secs * 1_000_000 + micros).to_string();
        server.cli(&["RPUSH", &list, &now_us]);
        assert_eq!(ttl_ms(&server, &list), -1);
        store
            .apply(&key, Scope::new("default", &rule), Op::Peek, 0)
            .await
            .unwrap();
        assert!(ttl_ms(&server, &list) > 0);
        // Once traffic stops, everything is gone within the horizon + 2 s.
        let start = std::time::Instant::now();
        while server.cli(&["DBSIZE"]) != "0" {
            assert!(
                start.elapsed() < Duration::from_secs(7),
                "keys left: {}",
                server.cli(&["DBSIZE"])
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[test]
fn peek_refund_reset_and_stats() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = RateLimiter::builder()
            .strategy(Strategy::TokenBucket)
            .quotas("2/second")
            .unwrap()
            .store(store.clone())
            .build()
            .unwrap();
        let key = 42u64;
        assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 2);
        assert_eq!(
            server.cli(&["DBSIZE"]),
            "0",
            "peeking at a new key writes nothing"
        );
        let admitted = limiter.check(&key, 2).await.unwrap();
        assert!(admitted.is_allowed());
        let d = limiter.check(&key, 1).await.unwrap();
        assert_eq!(d.outcome(), Outcome::Rejected);
        assert!(d.retry_after().unwrap() <= Duration::from_millis(500));
        assert_eq!(
            limiter.check(&key, 3).await.unwrap().outcome(),
            Outcome::Exceeds
        );
        limiter
            .settle(&key, admitted.reservation().unwrap(), 1)
            .await
            .unwrap();
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        limiter.reset(&key).await.unwrap();
        assert_eq!(server.cli(&["DBSIZE"]), "0");
        assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 2);
        let s = limiter.stats();
        assert_eq!((s.allowed, s.rejected, s.store_errors), (2, 2, 0));
        // The decision's time is the server's.
        let server_secs: u64 = server
            .cli(&["TIME"])
            .lines()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let t = limiter.peek(&key).await.unwrap().time().as_secs();
        assert!(t.abs_diff(server_secs) <= 1);
    });
}

#[test]
fn a_charge_beyond_a_full_moving_window_log_is_dropped_and_counted() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let cases = [("5/minute", 4), ("5/minute; 10/hour", 4), ("20/minute", 0)];
        for (i, (quotas, dropped)) in cases.into_iter().enumerate() {
            let limiter = RateLimiter::builder()
                .name(format!("case{i}"))
                .strategy(Strategy::MovingWindow)
                .quotas(quotas)
                .unwrap()
                .store(test_store(&server, "dropped").await)
                .build()
                .unwrap();
            let r = limiter.check(&7u64, 3).await.unwrap().reservation();
            // Reserved 3, used 9: the minute's log has room for 2 more, the rest is counted.
            let d = limiter
                .settle(&7u64, r.expect("admitted"), 9)
                .await
                .unwrap();
            let full = quotas.starts_with("5/");
            assert_eq!(d.remaining(), if full { 0 } else { 11 }, "{quotas}");
            assert_eq!(limiter.stats().settle_dropped_units, dropped, "{quotas}");
            let r = limiter.check(&8u64, 2).await.unwrap().reservation();
            limiter
                .settle(&8u64, r.expect("admitted"), 1)
                .await
                .unwrap();
            assert_eq!(limiter.stats().settle_dropped_units, dropped, "{quotas}");
        }
    });
}

#[test]
fn block_cache_answers_locally_until_the_reported_wait() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .block_cache(2)
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, "2/300ms").unwrap();
        let key = "hot".to_string();
        assert!(
            store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap()
                .is_allowed()
        );
        let first = store
            .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
            .await
            .unwrap();
        assert_eq!(first.outcome(), Outcome::Rejected);
        let before = server.command_calls("evalsha");
        let mut last = first.retry_after().unwrap();
        for _ in 0..100 {
            let d = store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap();
            assert_eq!(d.outcome(), Outcome::Rejected);
            assert!(d.retry_after().unwrap() <= last);
            last = d.retry_after().unwrap();
        }
        assert_eq!(server.command_calls("evalsha"), before, "answered locally");
        tokio::time::sleep(first.retry_after().unwrap()).await;
        assert!(
            store
                .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                .await
                .unwrap()
                .is_allowed()
        );
        assert_eq!(server.command_calls("evalsha"), before + 1);
        // Bounded: many blocked keys never hold more than the capacity.
        for i in 0..20 {
            let k = format!("k{i}");
            for _ in 0..3 {
                store
                    .apply(&k, Scope::new("default", &rule), Op::Check(1), 0)
                    .await
                    .unwrap();
            }
        }
        assert!(store.cached_keys() <= 2);
    });
}

#[test]
fn skewed_app_clocks_do_not_matter() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let mut limiters = Vec::new();
        for skew in [
            real - Duration::from_secs(3600),
            real + Duration::from_secs(30),
        ] {
            let store = RedisStore::connect(&server.url()).await.unwrap();
            limiters.push(
                RateLimiter::builder()
                    .strategy(Strategy::TokenBucket)
                    .quotas("4/hour")
                    .unwrap()
                    .clock(tollgate::ManualClock::new(skew))
                    .store(store)
                    .build()
                    .unwrap(),
            );
        }
        let key = "skewed".to_string();
        let mut admitted = 0;
        let mut rejections = Vec::new();
        for i in 0..20 {
            let d = limiters[i % 2].check(&key, 1).await.unwrap();
            if d.is_allowed() {
                admitted += 1;
            } else {
                rejections.push(d);
            }
        }
        assert_eq!(
            admitted, 4,
            "burst 4 admits exactly 4 whatever the app clocks say"
        );
        let waits: Vec<u64> = rejections
            .iter()
            .map(|d| d.retry_after_secs().unwrap())
            .collect();
        let (lo, hi) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(
            hi - lo <= 1,
            "Retry-After from the two instances: {lo}..{hi}"
        );
    });
}

#[test]
fn sliding_counter_on_server_time_across_bucket_edges() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let rule = Rule::parse(Strategy::SlidingWindow, "20/500ms").unwrap();
        let key = "edges".to_string();
        let deadline = std::time::Instant::now() + Duration::from_millis(2600);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (store, rule, key) = (store.clone(), rule.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let mut times = Vec::new();
                while std::time::Instant::now() < deadline {
                    let d = store
                        .apply(&key, Scope::new("default", &rule), Op::Check(1), 0)
                        .await
                        .unwrap();
                    if d.is_allowed() {
                        times.push(d.time());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                times
            }));
        }
        let mut times = Vec::new();
        for t in tasks {
            times.extend(t.await.unwrap());
        }
        times.sort();
        let w = Duration::from_millis(500);
        let buckets: std::collections::BTreeMap<u128, usize> =
            times.iter().fold(Default::default(), |mut m, t| {
                *m.entry(t.as_nanos() / w.as_nanos()).or_default() += 1;
                m
            });
        assert!(buckets.len() >= 5, "crossed {} buckets", buckets.len());
        assert!(buckets.values().all(|&n| n <= 20), "{buckets:?}");
        for (i, t) in times.iter().enumerate() {
            let in_window = times[..=i].iter().filter(|&&s| *t - s < w).count();
            assert!(
                in_window <= 40,
                "{in_window} admitted in one trailing window"
            );
        }
        let hash = store
            .redis_keys(&key, Scope::new("default", &rule))
            .remove(0);
        assert!(ttl_ms(&server, &hash) > 0);
    });
}
