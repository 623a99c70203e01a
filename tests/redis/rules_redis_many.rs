//! Several limits in one decision on Redis ([`Store::apply_all`]): one script call per request
//! when the keys share a slot (single node: always), all-or-nothing under races with no false
//! rejection; on a Cluster, keys in different slots (a global key and per-client keys) fall back
//! to the two-phase protocol, which never over-admits nor leaves spend behind, and two limits on
//! the same key still take one call. Every strategy family of the multi-limit script answers as
//! the memory store does.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::rules::{RejectedBy, Rules, RulesOptions};
use tollgate::store::redis::RedisStore;
use tollgate::store::{Item, MemoryStore, Scope, Store};
use tollgate::{ManualClock, Rule, Strategy};
use tower::ServiceExt as _;

use crate::login_rules;

use crate::redis_support::{FaultProxy, ProxyMode, RedisCluster, RedisServer};

const IP_LIMIT: u32 = 3;
const USER_LIMIT: u32 = 4;
const GLOBAL_LIMIT: u32 = 30;

fn login_limits() -> String {
    login_rules::login_limits(IP_LIMIT, "moving-window", USER_LIMIT, GLOBAL_LIMIT)
}

fn request(ip: usize, user: usize) -> Request<()> {
    login_rules::login_request(ip, user)
}

/// Rules on one Redis store deciding on the client's clock, a `ManualClock` standing still.
async fn rules_on(url: String, prefix: &str, text: &str) -> Rules<RedisStore, ManualClock> {
    let store = RedisStore::builder(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .use_client_time(true)
        .build()
        .await
        .expect("connect");
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    Rules::with_clock(text, RulesOptions::default(), move || store.clone(), clock).unwrap()
}

type Svc = tower::util::BoxCloneService<
    Request<()>,
    Response<tollgate::layer::ResponseBody<String>>,
    Infallible,
>;

fn service(rules: &Rules<RedisStore, ManualClock>) -> Svc {
    tower::util::BoxCloneService::new(tower::ServiceBuilder::new().layer(rules.layer()).service(
        tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::from("ok")))
        }),
    ))
}

/// (ip, user, the limit that rejected the request, if any).
type Outcome = (usize, usize, Option<String>);

async fn send(svc: Svc, ip: usize, user: usize) -> Outcome {
    let res = svc.oneshot(request(ip, user)).await.unwrap();
    let by = res
        .extensions()
        .get::<RejectedBy>()
        .map(|r| r.limit.to_string());
    match res.status() {
        StatusCode::OK => assert!(by.is_none()),
        StatusCode::TOO_MANY_REQUESTS => assert!(by.is_some()),
        other => panic!("unexpected {other}"),
    }
    (ip, user, by)
}

async fn left(rules: &Rules<RedisStore, ManualClock>, limit: &str, ip: usize, user: usize) -> u32 {
    let (parts, ()) = request(ip, user).into_parts();
    rules
        .peek(limit, &parts)
        .await
        .unwrap()
        .unwrap()
        .remaining()
}

/// Races `n` requests over `ips` x `users`; asserts no over-admission and no leftover spend and
/// answers the false rejections (a rejection whose limit has room left at the end).
async fn race_and_check(
    rules: &Rules<RedisStore, ManualClock>,
    ips: usize,
    users: usize,
    n: usize,
) -> usize {
    let svc = service(rules);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move { send(svc, i % ips, (i * 7 / 3) % users).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let mut by_ip: HashMap<usize, u32> = HashMap::new();
    let mut by_user: HashMap<usize, u32> = HashMap::new();
    let mut total = 0;
    for (ip, user, by) in &outcomes {
        if by.is_none() {
            *by_ip.entry(*ip).or_default() += 1;
            *by_user.entry(*user).or_default() += 1;
            total += 1;
        }
    }
    assert!(total > 0 && total < n as u32, "admitted {total} of {n}");
    assert!(total <= GLOBAL_LIMIT, "global over-admitted: {total}");
    for ip in 0..ips {
        let a = by_ip.get(&ip).copied().unwrap_or(0);
        assert!(a <= IP_LIMIT, "ip {ip} over-admitted: {a}");
        assert_eq!(
            left(rules, "per-ip", ip, 0).await,
            IP_LIMIT - a,
            "ip {ip}: leftover spend"
        );
    }
    for user in 0..users {
        let a = by_user.get(&user).copied().unwrap_or(0);
        assert!(a <= USER_LIMIT, "user {user} over-admitted: {a}");
        assert_eq!(
            left(rules, "per-user", 0, user).await,
            USER_LIMIT - a,
            "user {user}: leftover spend"
        );
    }
    assert_eq!(
        left(rules, "global", 0, 0).await,
        GLOBAL_LIMIT - total,
        "global: leftover spend"
    );
    let mut false_rejections = 0;
    for (ip, user, by) in &outcomes {
        if let Some(l) = by {
            if left(rules, l, *ip, *user).await > 0 {
                false_rejections += 1;
            }
        }
    }
    false_rejections
}

/// Script calls (EVALSHA and EVAL) served by `nodes` so far.
fn script_calls(nodes: &[&RedisServer]) -> u64 {
    nodes
        .iter()
        .map(|n| n.command_calls("evalsha") + n.command_calls("eval"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_limits_on_one_redis_take_one_script_call_per_request_all_or_nothing() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules_on(redis.url(), "calls:", &login_limits()).await;
    let svc = service(&rules);
    // The first call loads the script (EVALSHA answered NOSCRIPT, then EVAL).
    send(svc.clone(), 100, 100).await;
    let before = script_calls(&[&redis]);
    let mut rejected = 0;
    for i in 0..12 {
        // IP 101 runs out after 3 (per-ip rejects, nothing else spent); user 101 after 4.
        if send(svc.clone(), 101 + i % 2, 101).await.2.is_some() {
            rejected += 1;
        }
    }
    let calls = script_calls(&[&redis]) - before;
    assert!(rejected >= 8, "rejected {rejected}");
    // A rejected key goes into the blocked-key cache (answered without a call) only after a
    // rejection of its own; every other request took exactly one call.
    assert!(
        calls <= 12 && calls > 12 - rejected,
        "{calls} script calls for 12 requests of 3 limits (two-phase: up to 3 + rollbacks each)"
    );
    assert_eq!(
        left(&rules, "per-ip", 102, 0).await,
        1,
        "IP 102 spent what was admitted only"
    );
    let rules = rules_on(redis.url(), "race:", &login_limits()).await;
    let false_rejections = race_and_check(&rules, 6, 5, 120).await;
    assert_eq!(
        false_rejections, 0,
        "one script call per request: no transient reservation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_keys_in_different_slots_use_the_two_phase_and_one_key_one_call() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    // The global key and the per-client keys keep their own tags: two-phase, never over-admits,
    // nothing left spent (false rejections possible, not counted here).
    let rules = rules_on(cluster.url(), "race:", &login_limits()).await;
    let _ = race_and_check(&rules, 6, 5, 120).await;

    // Two limits on the same key share its tag, hence one slot: one call per request.
    let rules = rules_on(
        cluster.url(),
        "same:",
        "[[limit]]\nname = \"ip-hour\"\nkey = \"header:x-ip\"\nstrategy = \"sliding-window\"\nquotas = \"5/hour\"\n\n\
         [[limit]]\nname = \"ip-day\"\nkey = \"header:x-ip\"\nstrategy = \"leaky-bucket\"\nquotas = \"8/day\"\n",
    )
    .await;
    let svc = service(&rules);
    send(svc.clone(), 1, 0).await;
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    let before = script_calls(&nodes);
    let mut admitted = 0;
    for _ in 0..5 {
        if send(svc.clone(), 1, 0).await.2.is_none() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4, "5 per hour, one spent before");
    assert_eq!(
        script_calls(&nodes) - before,
        5,
        "one script call per request"
    );
    assert_eq!(
        left(&rules, "ip-day", 1, 0).await,
        3,
        "the day limit spent 5 of 8"
    );
}

/// The Redis multi-limit script and the memory store answer alike, step by step (up to the first
/// rejection, where the script stops), for every strategy family (each paired with another family on the same key, and a key of its own).
#[tokio::test]
async fn every_family_in_the_multi_limit_script_answers_as_the_memory_store() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::builder(redis.url())
        .prefix("oracle:")
        .use_client_time(true)
        .block_cache(0)
        .build()
        .await
        .expect("connect");
    let memory = MemoryStore::<String>::new();
    let strategies = [
        Strategy::FixedWindow,
        Strategy::FixedWindowFirstHit,
        Strategy::SlidingWindow,
        Strategy::MovingWindow,
        Strategy::TokenBucket,
        Strategy::LeakyBucket,
    ];
    let t0: u64 = 1_750_000_000_000_000_000;
    for (s, strategy) in strategies.into_iter().enumerate() {
        let partner = strategies[(s + 3) % strategies.len()];
        let a = Rule::parse(strategy, "4/second; 10/10s").unwrap();
        let b = Rule::parse(partner, "8/2s").unwrap();
        let c = Rule::parse(strategy, "5/second").unwrap();
        let (na, nb, nc) = (format!("a{s}"), format!("b{s}"), format!("c{s}"));
        let (ka, kb) = (format!("key{s}"), format!("other{s}"));
        let mut steps = 0;
        let mut rejections = 0;
        for step in 0..80u64 {
            let now = t0 + step * 97_000_000 + u64::from(step % 3 == 0) * 13_000_000;
            let cost = 1 + u32::from(step % 5 == 0);
            let limits = [
                (&ka, Scope::new(&na, &a), cost),
                (&ka, Scope::new(&nb, &b), 1),
                (&kb, Scope::new(&nc, &c), 1),
            ];
            let on_redis: Vec<Item<'_, String, RedisStore>> = limits
                .iter()
                .map(|&(key, scope, cost)| Item {
                    store: &store,
                    key,
                    scope,
                    cost,
                })
                .collect();
            let in_memory: Vec<Item<'_, String, MemoryStore<String>>> = limits
                .iter()
                .map(|&(key, scope, cost)| Item {
                    store: &memory,
                    key,
                    scope,
                    cost,
                })
                .collect();
            let r = store.apply_all(&on_redis, now).await;
            let m = memory.apply_all(&in_memory, now).await;
            let view = |answers: &[(usize, Result<tollgate::Decision, tollgate::StoreError>)]| {
                answers
                    .iter()
                    .map(|(i, a)| {
                        let d = a.as_ref().expect("decided");
                        // Redis counts in microseconds: its waits are the memory store's
                        // rounded up to one.
                        let us = |t: std::time::Duration| t.as_nanos().div_ceil(1000);
                        let retry = d.retry_after().map(us);
                        let reset = us(d.reset_after());
                        (*i, d.outcome(), d.limit(), d.remaining(), reset, retry)
                    })
                    .collect::<Vec<_>>()
            };
            // The script ends at the first rejection; the memory store answers every item (the
            // later ones given back, so the 429 can name the longest wait): alike up to there,
            // and the states stay alike (the next steps compare them).
            let mut expected = view(&m);
            if let Some(at) = expected
                .iter()
                .position(|a| a.1 != tollgate::Outcome::Allowed)
            {
                expected.truncate(at + 1);
                rejections += 1;
            }
            assert_eq!(
                view(&r),
                expected,
                "{strategy:?} + {partner:?}, step {step}"
            );
            steps += 1;
        }
        assert_eq!(steps, 80);
        assert!(
            rejections > 0 && rejections < 80,
            "{strategy:?}: {rejections} rejections"
        );
    }
}

/// Redis runs a multi-limit call and the connection drops before its reply: with a local
/// fallback each limit decides locally at once. Nothing is sent again (the call may have
/// counted): Redis ran the request once, not once more per limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_outage_decides_each_limit_locally_without_resending() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let proxy = FaultProxy::start(redis.port).await;
    let store = RedisStore::builder(proxy.url())
        .prefix("outage:")
        .timeout(Duration::from_secs(2))
        .use_client_time(true)
        .local_fallback(1)
        .build()
        .await
        .expect("connect");
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let handle = store.clone();
    let rules = Rules::with_clock(
        &login_limits(),
        RulesOptions::default(),
        move || store.clone(),
        clock,
    )
    .unwrap();
    let svc = service(&rules);
    // The first call loads the script.
    assert_eq!(send(svc.clone(), 1, 1).await.2, None);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    proxy.set(ProxyMode::ResetAfterForward);
    assert_eq!(send(svc.clone(), 1, 1).await.2, None);
    let counters = handle.counters();
    assert_eq!(counters.local_allowed, 3, "every limit decided locally");
    assert_eq!(counters.timed_out, 0, "a limit was sent again and waited");
    let calls = script_calls(&[&redis]);
    assert!(calls <= 1, "Redis ran {calls} script calls for one request");
}
