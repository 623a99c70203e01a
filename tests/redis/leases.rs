//! Quota leasing on the Redis store: two and four stores on one real `redis-server`,
//! on a test clock sent to the scripts, so windows and lease lives are exact. The bounds: never
//! more than the strategy admits, the global state exact once leases are back, under-admission
//! no more than the leases held elsewhere; a dying instance, Redis down during a lease, one fetch
//! for concurrent checks, and `build()` refusing the strategies leasing cannot bound.

use crate::redis_support::RedisServer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::store::Scope;
use tollgate::store::redis::{Leasing, RedisStore};
use tollgate::{ConfigError, ManualClock, RateLimiter, Strategy};

const S: u64 = 1_000_000_000;
/// A whole hour in Unix time, so clock-aligned windows start at whole minutes.
const BASE: u64 = 1_700_002_800 * S;

type Limiter = RateLimiter<String, RedisStore, ManualClock>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A leasing store on the test clock; `cache` keeps the blocked-key cache (off where the test
/// clock jumps: the cache counts on the process's own clock).
async fn store(server: &RedisServer, leasing: Leasing, cache: bool) -> RedisStore {
    RedisStore::builder(server.url())
        .timeout(Duration::from_secs(2))
        .use_client_time(true)
        .block_cache(if cache { 10_000 } else { 0 })
        .leases(leasing)
        .build()
        .await
        .expect("connect")
}

fn limiter(store: RedisStore, strategy: Strategy, quotas: &str, clock: &ManualClock) -> Limiter {
    RateLimiter::builder()
        .name("leased")
        .strategy(strategy)
        .quotas(quotas)
        .expect("quotas")
        .clock(clock.clone())
        .store(store)
        .build()
        .expect("limiter")
}

/// Leases that stay until the test returns them, and are not renewed on the wall clock (the
/// tests of the reset epoch set their renewal themselves).
fn kept() -> Leasing {
    Leasing::default()
        .idle_return(Duration::from_secs(3600))
        .renew_after(Duration::from_secs(3600))
}

/// The fixed window's count in Redis for `key`.
fn redis_count(server: &RedisServer, l: &Limiter, key: &str) -> u64 {
    let name = &l
        .store()
        .redis_keys(&key.to_owned(), Scope::new(l.name(), l.rule()))[0];
    server.cli(&["HGET", name, "n1"]).parse().unwrap_or(0)
}

#[test]
fn two_leasing_stores_never_admit_more_than_the_limit_and_exactly_the_limit_once_leases_are_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let a = limiter(
            store(&server, kept(), true).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        let b = limiter(
            store(&server, kept(), true).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        let admitted = Arc::new(AtomicU64::new(0));
        // 10^5 attempts from 8 tasks over the two instances.
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let l = if t % 2 == 0 { a.clone() } else { b.clone() };
                let admitted = Arc::clone(&admitted);
                tokio::spawn(async move {
                    for _ in 0..12_500 {
                        let d = l.check(&"hot".to_owned(), 1).await.expect("decision");
                        if d.is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        let first = admitted.load(Ordering::Relaxed);
        let held = a.store().lease_counters().units_held + b.store().lease_counters().units_held;
        assert!(first <= 1000, "{first} admitted past a limit of 1000");
        assert_eq!(
            redis_count(&server, &a, "hot"),
            first + held,
            "Redis counts every admitted request and every unit held in a lease"
        );
        assert!(
            first + held >= 1000 - 2 * 50,
            "under-admission beyond the leases' bound: {first} admitted, {held} held"
        );
        let fetches = a.store().lease_counters().fetches + b.store().lease_counters().fetches;
        assert!(
            fetches < first / 5,
            "{fetches} lease calls for {first} admissions: leasing did not lease"
        );

        // Every lease back: the rest of the limit is admitted, and nothing more.
        a.store().return_leases().await.expect("return");
        b.store().return_leases().await.expect("return");
        let mut rejected_rounds = 0;
        let mut total = first;
        while rejected_rounds < 2 {
            let mut any = false;
            for l in [&a, &b] {
                if l.check(&"hot".to_owned(), 1)
                    .await
                    .expect("decision")
                    .is_allowed()
                {
                    total += 1;
                    any = true;
                }
            }
            rejected_rounds = if any { 0 } else { rejected_rounds + 1 };
            assert!(total <= 1000, "{total} admitted past a limit of 1000");
        }
        a.store().return_leases().await.expect("return");
        b.store().return_leases().await.expect("return");
        assert_eq!(total, 1000, "exactly the limit once every lease is back");
        assert_eq!(redis_count(&server, &a, "hot"), 1000);
    });
}

#[test]
fn a_dying_instance_strands_at_most_its_lease_until_the_window_ends() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let a = limiter(
            store(&server, kept(), false).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        let mut by_a = 0;
        for _ in 0..300 {
            if a.check(&"k".to_owned(), 1)
                .await
                .expect("decision")
                .is_allowed()
            {
                by_a += 1;
            }
        }
        let stranded = a.store().lease_counters().units_held;
        assert!(stranded > 0 && stranded <= 50, "{stranded} units held");
        // The instance dies with its lease: nothing gives it back.
        drop(a);
        let b = limiter(
            store(&server, kept(), false).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        let mut by_b = 0;
        for _ in 0..1000 {
            if b.check(&"k".to_owned(), 1)
                .await
                .expect("decision")
                .is_allowed()
            {
                by_b += 1;
            }
        }
        b.store().return_leases().await.expect("return");
        assert_eq!(
            by_a + by_b,
            1000 - stranded,
            "the dead instance's lease is lost, and only it"
        );
        // The window ends, and the lease with it: the limit is whole again.
        clock.advance(Duration::from_secs(60));
        let mut next = 0;
        for _ in 0..1100 {
            if b.check(&"k".to_owned(), 1)
                .await
                .expect("decision")
                .is_allowed()
            {
                next += 1;
            }
        }
        b.store().return_leases().await.expect("return");
        assert_eq!(next, 1000);
    });
}

#[test]
fn with_redis_down_leases_in_hand_admit_until_they_are_spent_or_dead_then_the_failure_policy_applies()
 {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let l = limiter(
            store(&server, kept(), false).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        for key in ["spent", "dies"] {
            for _ in 0..100 {
                assert!(
                    l.check(&key.to_owned(), 1)
                        .await
                        .expect("decision")
                        .is_allowed()
                );
            }
        }
        let held = l.store().lease_counters().units_held;
        assert!(held >= 2, "{held} units held");
        server.kill9();
        // Past the units in hand, a check fails (an error for the failure policy), or is shed if
        // the store still takes a timeout for overload: never admitted.
        let until_error = |key: &'static str| {
            let l = l.clone();
            async move {
                let mut admitted = 0;
                let start = std::time::Instant::now();
                loop {
                    assert!(start.elapsed() < Duration::from_secs(10), "no error");
                    match l.check(&key.to_owned(), 1).await {
                        Ok(d) if d.is_allowed() => admitted += 1,
                        Ok(_) => {}
                        Err(e) => break (admitted, e),
                    }
                }
            }
        };
        let (admitted, error) = until_error("spent").await;
        assert!(admitted >= 1, "the lease in hand kept working");
        assert!(
            admitted <= held,
            "admitted {admitted} past the {held} leased units"
        );
        assert!(!error.message().is_empty());
        // The other key's lease dies with its window: then the failure policy answers.
        assert!(
            l.check(&"dies".to_owned(), 1)
                .await
                .expect("leased")
                .is_allowed()
        );
        clock.advance(Duration::from_secs(60));
        let (after_death, _) = until_error("dies").await;
        assert_eq!(after_death, 0, "a dead lease admits nothing");
        assert!(l.stats().store_errors >= 2);
    });
}

#[test]
fn leased_token_buckets_on_two_stores_stay_within_one_lease_of_the_bucket() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE));
        let leasing = kept().max_share(4);
        // B = 100, T = 10 ms; leases of at most 25 units, each dead 25 x T after it was drawn.
        let (b, t, lease) = (100_u64, 10 * S / 1000, 25_u64);
        let a = limiter(
            store(&server, leasing, false).await,
            Strategy::TokenBucket,
            "100/second",
            &clock,
        );
        let c = limiter(
            store(&server, leasing, false).await,
            Strategy::TokenBucket,
            "100/second",
            &clock,
        );
        let mut times = Vec::new();
        let start = BASE;
        for step in 0..500 {
            // Instance `a` is hot all along; `c` wakes for bursts every 200 ms.
            for _ in 0..3 {
                if a.check(&"k".to_owned(), 1).await.expect("a").is_allowed() {
                    times.push(start + step * 2 * S / 1000);
                }
            }
            if step % 100 < 5 {
                for _ in 0..20 {
                    if c.check(&"k".to_owned(), 1).await.expect("c").is_allowed() {
                        times.push(start + step * 2 * S / 1000);
                    }
                }
            }
            clock.advance(Duration::from_millis(2));
        }
        times.sort_unstable();
        // Every span [t_i, t_j] holds at most B + L + (t_j - t_i) / T admissions.
        for i in 0..times.len() {
            for j in i..times.len() {
                let n = (j - i + 1) as u64;
                let allowed = b + lease + (times[j] - times[i]) / t;
                assert!(
                    n <= allowed,
                    "{n} admitted within {} ns (bound {allowed})",
                    times[j] - times[i]
                );
            }
        }
        // And leasing leaves the rate whole: about B + 1 s / T over one second.
        let n = times.len() as u64;
        assert!(n >= 100 + 100 - 2 * lease, "{n} admitted over 1 s");
    });
}

#[test]
fn leased_sliding_windows_keep_the_weighted_count_within_the_limit_at_every_admission() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE));
        let leasing = kept().max_share(5);
        let (limit, w) = (200_u64, S);
        let a = limiter(
            store(&server, leasing, false).await,
            Strategy::SlidingWindow,
            "200/second",
            &clock,
        );
        let c = limiter(
            store(&server, leasing, false).await,
            Strategy::SlidingWindow,
            "200/second",
            &clock,
        );
        let mut times = Vec::new();
        for step in 0..300_u64 {
            let now = BASE + step * 10 * S / 1000;
            for l in [&a, &c] {
                for _ in 0..2 {
                    if l.check(&"k".to_owned(), 1)
                        .await
                        .expect("decision")
                        .is_allowed()
                    {
                        times.push(now);
                    }
                }
            }
            clock.advance(Duration::from_millis(10));
        }
        // The counter's own bound, on the admissions themselves: at each one, the requests of its
        // bucket so far plus the previous bucket's weighted by the part of it still in the window.
        for (i, &t) in times.iter().enumerate() {
            let bucket = (t - BASE) / w;
            let cur = times[..=i]
                .iter()
                .filter(|&&x| (x - BASE) / w == bucket)
                .count() as u64;
            let prev = times
                .iter()
                .filter(|&&x| bucket > 0 && (x - BASE) / w == bucket - 1)
                .count() as u64;
            let e = (t - BASE) % w;
            let weighted = cur + prev * (w - e) / w;
            assert!(weighted <= limit, "weighted count {weighted} at {t}");
        }
        assert!(times.len() >= 400, "{} admitted over 3 s", times.len());
    });
}

#[test]
fn concurrent_checks_on_one_key_share_one_lease_fetch() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let l = limiter(
            store(&server, kept(), true).await,
            Strategy::SlidingWindow,
            "100000/minute",
            &clock,
        );
        let checks: Vec<_> = (0..64)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move { l.check(&"herd".to_owned(), 1).await })
            })
            .collect();
        for c in checks {
            assert!(c.await.expect("task").expect("decision").is_allowed());
        }
        let fetches = l.store().lease_counters().fetches;
        assert!(
            fetches <= 6,
            "{fetches} lease calls for 64 concurrent checks"
        );
        assert_eq!(
            server.command_calls("evalsha"),
            fetches,
            "every Redis call was a lease fetch"
        );
        assert!(
            server.command_calls("eval") <= 1,
            "the script body is sent once at most (NOSCRIPT)"
        );
    });
}

#[test]
fn a_leased_reservation_settles_in_the_window_it_was_counted_in() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let l = limiter(
            store(&server, kept(), false).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        let mut reservations = Vec::new();
        for _ in 0..50 {
            let d = l.check(&"k".to_owned(), 2).await.expect("decision");
            reservations.push(d.reservation().expect("admitted"));
        }
        assert!(
            l.store().lease_counters().leased > 0,
            "some checks were leased"
        );
        // Only failures count: half the requests give their units back.
        for r in reservations.iter().step_by(2) {
            l.settle(&"k".to_owned(), *r, 0).await.expect("settled");
        }
        l.store().return_leases().await.expect("return");
        assert_eq!(redis_count(&server, &l, "k"), 50);
    });
}

#[test]
fn build_refuses_leasing_for_the_strategies_it_cannot_bound_and_says_why() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let s = store(&server, Leasing::default(), false).await;
        for (strategy, why) in [
            (Strategy::MovingWindow, "moving window"),
            (Strategy::FixedWindowFirstHit, "first-hit window"),
            (Strategy::LeakyBucket, "leaky bucket"),
        ] {
            let built = RateLimiter::<String, _>::builder()
                .name(strategy.name())
                .strategy(strategy)
                .quotas("10/minute")
                .expect("quotas")
                .store(s.clone())
                .build();
            match built {
                Err(e @ ConfigError::Unleasable(s)) => {
                    assert_eq!(s, strategy);
                    let m = e.to_string();
                    assert!(m.contains("leasing") && m.contains(why), "{m}")
                }
                other => panic!("{strategy}: {other:?}"),
            }
        }
        for strategy in [
            Strategy::FixedWindow,
            Strategy::SlidingWindow,
            Strategy::TokenBucket,
        ] {
            RateLimiter::<String, _>::builder()
                .name(strategy.name())
                .strategy(strategy)
                .quotas("10/minute")
                .expect("quotas")
                .store(s.clone())
                .build()
                .expect("leasable");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_with_redis_lease_admits_the_limit_on_a_lease_and_refuses_the_moving_window() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--strategy",
        "fixed-window",
        "--quota",
        "40/hour",
        "--key",
        "global",
        "--store-timeout",
        "2000",
        "--redis-lease",
    ];
    let server = crate::examples::start("server", &args).await;
    let client = crate::support::TestClient::new();
    let mut ok = 0;
    for _ in 0..50 {
        if client.get(&server.url("/")).await.status == http::StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(
        ok, 40,
        "one server on its own leases admits the whole limit"
    );
    let evalsha = redis.command_calls("evalsha");
    assert!(
        evalsha < 40,
        "{evalsha} Redis calls for 40 admissions: no leasing"
    );
    server.stop_with("-TERM").await;

    let out = tokio::process::Command::new(crate::examples::example("server"))
        .args(["--addr", "127.0.0.1:0", "--store", url.as_str()])
        .args(["--strategy", "moving-window", "--redis-lease", "on"])
        .output()
        .await
        .expect("run server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("leasing") && stderr.contains("moving window"),
        "{stderr}"
    );
}

#[test]
fn idle_token_bucket_leases_die_before_the_bucket_refills_so_a_burst_stays_within_one_lease() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE));
        // B = 100, T = 10 ms, leases of at most 25 units, each taking all the room it may.
        let leasing = kept().max_share(4).shrink(1);
        let holders = [
            limiter(
                store(&server, leasing, false).await,
                Strategy::TokenBucket,
                "100/second",
                &clock,
            ),
            limiter(
                store(&server, leasing, false).await,
                Strategy::TokenBucket,
                "100/second",
                &clock,
            ),
        ];
        // Each holder spends 21 units on growing leases and ends holding 24 of a 25-unit lease.
        for h in &holders {
            for _ in 0..22 {
                assert!(
                    h.check(&"k".to_owned(), 1)
                        .await
                        .expect("decision")
                        .is_allowed()
                );
            }
        }
        let held: u64 = holders
            .iter()
            .map(|h| h.store().lease_counters().units_held)
            .sum();
        assert_eq!(held, 48, "both holders hold most of a lease");
        // A second later the bucket is full again in Redis: another instance takes all of it.
        clock.advance(Duration::from_secs(1));
        let drain = RateLimiter::builder()
            .name("leased")
            .strategy(Strategy::TokenBucket)
            .quotas("100/second")
            .expect("quotas")
            .clock(clock.clone())
            .store(
                RedisStore::builder(server.url())
                    .timeout(Duration::from_secs(2))
                    .use_client_time(true)
                    .block_cache(0)
                    .build()
                    .await
                    .expect("connect"),
            )
            .build()
            .expect("limiter");
        let mut burst = 0;
        for _ in 0..150 {
            if drain
                .check(&"k".to_owned(), 1)
                .await
                .expect("decision")
                .is_allowed()
            {
                burst += 1;
            }
        }
        assert_eq!(burst, 100, "the bucket refilled");
        // The holders' leases died 25 x T after they were drawn: nothing more in this instant.
        for h in &holders {
            for _ in 0..30 {
                if h.check(&"k".to_owned(), 1)
                    .await
                    .expect("decision")
                    .is_allowed()
                {
                    burst += 1;
                }
            }
        }
        assert!(
            burst <= 100 + 25,
            "{burst} admitted in one instant: more than B + one lease"
        );
    });
}

#[test]
fn a_window_lease_dies_with_its_window_and_admits_nothing_in_the_next() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        for (strategy, name) in [
            (Strategy::FixedWindow, "fixed"),
            (Strategy::SlidingWindow, "sliding"),
        ] {
            // One second before a window (or bucket) ends, `a` grows a lease and keeps some of it.
            let clock = ManualClock::new(Duration::from_nanos(BASE + 59 * S));
            let a = limiter(
                store(&server, kept().max_share(4), false).await,
                strategy,
                "100/minute",
                &clock,
            );
            let key = format!("edge-{name}");
            for _ in 0..10 {
                assert!(a.check(&key, 1).await.expect("decision").is_allowed());
            }
            assert!(a.store().lease_counters().units_held > 0, "{name}");
            // The next window: another instance takes all it may; `a`'s lease is dead.
            clock.advance(Duration::from_secs(1));
            let b = limiter(
                store(&server, kept(), false).await,
                strategy,
                "100/minute",
                &clock,
            );
            let mut by_b = 0;
            for _ in 0..120 {
                if b.check(&key, 1).await.expect("decision").is_allowed() {
                    by_b += 1;
                }
            }
            assert!(by_b > 0, "{name}");
            for _ in 0..30 {
                assert!(
                    !a.check(&key, 1).await.expect("decision").is_allowed(),
                    "{name}: a lease of the last window admitted in the next"
                );
            }
        }
    });
}

/// `granted = leased + returned + expired + units_held`, for every way a lease ends.
fn assert_counters_add_up(l: &Limiter, when: &str) {
    let c = l.store().lease_counters();
    assert_eq!(
        c.granted,
        c.leased + c.returned + c.expired + c.units_held,
        "{when}: {c:?}"
    );
}

#[test]
fn a_dead_token_bucket_lease_gives_its_units_back_and_the_lease_counters_add_up() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE));
        // B = 100, T = 10 ms, leases of at most 25 units, each taking all the room it may.
        let holder = limiter(
            store(&server, kept().max_share(4).shrink(1), false).await,
            Strategy::TokenBucket,
            "100/second",
            &clock,
        );
        let key = "given-back".to_owned();
        // Leases of 1, 4, 16, then 25 units: 46 counted in Redis, 22 used, 24 held.
        for _ in 0..22 {
            assert!(holder.check(&key, 1).await.expect("decision").is_allowed());
        }
        let c = holder.store().lease_counters();
        assert_eq!((c.granted, c.leased, c.units_held), (46, 22, 24), "{c:?}");
        assert_counters_add_up(&holder, "holding a lease");
        // 300 ms later the 25-unit lease (life 25 x T = 250 ms) is dead, and the bucket's TAT
        // still counts its 24 unused units (46 x T = 460 ms from the start). The next check
        // fetches a new lease (1 unit: the key was quiet), and the dead one's units go back.
        clock.advance(Duration::from_millis(300));
        assert!(holder.check(&key, 1).await.expect("decision").is_allowed());
        // The return follows the fetch on its task: wait for it (bounded).
        for _ in 0..200 {
            let c = holder.store().lease_counters();
            if c.returned + c.expired >= 24 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let c = holder.store().lease_counters();
        assert_eq!((c.returned, c.expired), (24, 0), "{c:?}");
        assert_counters_add_up(&holder, "after a dead lease was replaced");
        assert_eq!(holder.store().return_leases().await.expect("return"), 0);
        let c = holder.store().lease_counters();
        assert_eq!(
            (c.granted, c.leased, c.returned, c.held),
            (47, 23, 24, 0),
            "{c:?}"
        );
        assert_counters_add_up(&holder, "after the return");
        // Without the dead lease's return, 17 units would still be counted: 83 of 150 admitted.
        let drain = limiter(
            store(&server, Leasing::default(), false).await,
            Strategy::TokenBucket,
            "100/second",
            &clock,
        );
        let drained = admissions(&drain, &key, 150).await;
        assert_eq!(
            drained, 100,
            "the dead lease's units came back to the bucket"
        );
    });
}

/// How many of `n` checks on `key` through `l` are admitted (its leases returned after).
async fn admissions(l: &Limiter, key: &String, n: usize) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        if l.check(key, 1).await.expect("decision").is_allowed() {
            admitted += 1;
        }
    }
    l.store().return_leases().await.expect("return");
    admitted
}

#[test]
fn a_reset_drops_this_instances_lease_and_the_counters_still_add_up() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let a = limiter(
            store(&server, kept().max_share(4), false).await,
            Strategy::FixedWindow,
            "100/minute",
            &clock,
        );
        let key = "reset".to_owned();
        for _ in 0..10 {
            assert!(a.check(&key, 1).await.expect("decision").is_allowed());
        }
        let before = a.store().lease_counters();
        assert!(before.units_held > 0, "{before:?}");
        a.reset(&key).await.expect("reset");
        let after = a.store().lease_counters();
        assert_eq!(after.held, 0, "the reset dropped the lease: {after:?}");
        assert_eq!(after.expired, before.expired + before.units_held);
        assert_counters_add_up(&a, "after a reset");
        assert_eq!(redis_count(&server, &a, &key), 0, "Redis forgot the key");
        // The key leases again from the reset count.
        for _ in 0..100 {
            assert!(a.check(&key, 1).await.expect("decision").is_allowed());
        }
        a.store().return_leases().await.expect("return");
        assert!(!a.check(&key, 1).await.expect("decision").is_allowed());
        assert_eq!(redis_count(&server, &a, &key), 100);
        assert_counters_add_up(&a, "after the window was spent");
    });
}

#[test]
fn a_window_lease_dies_on_the_monotonic_clock_when_the_limiters_clock_stands_still() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        // Redis's own clock, and a limiter clock that never moves.
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let frozen = limiter(
            RedisStore::builder(server.url())
                .timeout(Duration::from_secs(2))
                .block_cache(0)
                .leases(kept())
                .build()
                .await
                .expect("connect"),
            Strategy::FixedWindow,
            "1000/200ms",
            &clock,
        );
        let key = "frozen".to_owned();
        for _ in 0..10 {
            assert!(frozen.check(&key, 1).await.expect("decision").is_allowed());
        }
        let before = frozen.store().lease_counters();
        assert!(before.units_held > 0, "{before:?}");
        // Redis's window (200 ms, clock-aligned) has rolled: the lease drawn in it is dead.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(frozen.check(&key, 1).await.expect("decision").is_allowed());
        let after = frozen.store().lease_counters();
        // At least one new fetch: on a loaded machine a call may take longer than a window, and
        // the lease drawn for it dies in turn (a second fetch), which is the same property.
        assert!(
            after.fetches > before.fetches,
            "a lease outlived Redis's window on a frozen limiter clock: {after:?}"
        );
        assert!(after.leased > before.leased, "a new lease admitted it");
    });
}

#[test]
fn return_leases_gives_back_a_lease_whose_key_has_a_fetch_in_flight() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let a = limiter(
            store(&server, kept(), false).await,
            Strategy::FixedWindow,
            "1000/minute",
            &clock,
        );
        let key = "in-flight".to_owned();
        // Leases of 1, 4, then 16 units: 15 left in hand.
        for _ in 0..6 {
            assert!(a.check(&key, 1).await.expect("decision").is_allowed());
        }
        let c = a.store().lease_counters();
        assert_eq!((c.fetches, c.units_held), (3, 15), "{c:?}");
        // Redis paused: a check of 16 units starts a fetch that stays in flight.
        server.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
        let checker = a.clone();
        let k = key.clone();
        let check = tokio::spawn(async move { checker.check(&k, 16).await });
        while a.store().lease_counters().fetches < 4 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The lease in hand goes back (its return waits for Redis like the fetch).
        assert_eq!(a.store().return_leases().await.expect("return"), 15);
        assert!(check.await.expect("task").expect("decision").is_allowed());
        a.store().return_leases().await.expect("return");
        let c = a.store().lease_counters();
        assert_eq!(c.held, 0, "{c:?}");
        assert_counters_add_up(&a, "after both returns");
        assert_eq!(redis_count(&server, &a, &key), 6 + 16);
    });
}

/// Two instances leasing one key (fixed window 1000/minute, leases of at most 100 units, renewed
/// every 10 s of the test clock: a renewal happens only when the test moves the clock).
async fn two_instances(server: &RedisServer, clock: &ManualClock) -> (Limiter, Limiter) {
    let leasing = kept().max_share(10).renew_after(Duration::from_secs(10));
    let a = limiter(
        store(server, leasing, false).await,
        Strategy::FixedWindow,
        "1000/minute",
        clock,
    );
    let b = limiter(
        store(server, leasing, false).await,
        Strategy::FixedWindow,
        "1000/minute",
        clock,
    );
    (a, b)
}

/// Checks `key` on `a`, then on `b`, until each rejects, and returns both instances' leases:
/// the admissions.
async fn drain(a: &Limiter, b: &Limiter, key: &String) -> u64 {
    admissions(a, key, 1100).await + admissions(b, key, 1100).await
}

#[test]
fn a_reset_on_one_instance_stops_another_instances_lease_at_its_next_renewal() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let (a, b) = two_instances(&server, &clock).await;
        let key = "reset-elsewhere".to_owned();
        for _ in 0..10 {
            assert!(a.check(&key, 1).await.expect("decision").is_allowed());
        }
        // B's leases grow 1, 4, 16, 64: 85 units drawn, 55 still in hand.
        for _ in 0..30 {
            assert!(b.check(&key, 1).await.expect("decision").is_allowed());
        }
        let at_reset = b.store().lease_counters();
        assert_eq!(
            (at_reset.granted, at_reset.units_held),
            (85, 55),
            "{at_reset:?}"
        );

        a.reset(&key).await.expect("reset");
        assert_eq!(redis_count(&server, &a, &key), 0, "Redis forgot the key");
        // Until its renewal, B's lease admits on its own: Redis is not asked, so B cannot know.
        for _ in 0..5 {
            assert!(b.check(&key, 1).await.expect("decision").is_allowed());
        }
        let before_renewal = b.store().lease_counters();
        assert_eq!(
            before_renewal.fetches, at_reset.fetches,
            "{before_renewal:?}"
        );

        // The renewal is due (10 s after the reply that granted the lease: the clock moves past
        // it): B's next check asks Redis, learns of the reset, and drops the rest of its old
        // lease (50 units): not admitted, and not merged with the new grant.
        clock.advance(Duration::from_secs(11));
        assert!(b.check(&key, 1).await.expect("decision").is_allowed());
        let renewed = b.store().lease_counters();
        assert_eq!(renewed.fetches, at_reset.fetches + 1, "{renewed:?}");
        assert_eq!(
            renewed.expired,
            at_reset.expired + 50,
            "the old lease's rest was dropped: {renewed:?}"
        );
        assert_counters_add_up(&b, "after the renewal");
        let new_grant = renewed.granted - at_reset.granted;
        assert_eq!(renewed.units_held, new_grant - 1, "{renewed:?}");
        assert_eq!(
            redis_count(&server, &b, &key),
            new_grant,
            "Redis counts the new lease only"
        );
        // From now on B admits only from leases Redis counted since the reset.
        b.store().return_leases().await.expect("return");
        assert_eq!(
            redis_count(&server, &b, &key),
            1,
            "the check since the renewal"
        );

        // Both sides of the bound: after the reset the two instances admit the whole limit
        // afresh, plus the 5 units B's old lease admitted before its renewal, and no more. That
        // is within the stated bound: the units B held at the reset (55).
        let after_reset = 5 + 1 + drain(&a, &b, &key).await;
        assert_eq!(after_reset, 1000 + 5, "{:?}", b.store().lease_counters());
        assert!(after_reset <= 1000 + at_reset.units_held);
        assert_eq!(redis_count(&server, &a, &key), 1000);
        assert_counters_add_up(&a, "after the window was spent");
        assert_counters_add_up(&b, "after the window was spent");
    });
}

#[test]
fn a_lease_drawn_before_a_reset_elsewhere_gives_nothing_back_to_the_fresh_count() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let (a, b) = two_instances(&server, &clock).await;
        let key = "returned-after-reset".to_owned();
        for _ in 0..30 {
            assert!(b.check(&key, 1).await.expect("decision").is_allowed());
        }
        let held = b.store().lease_counters().units_held;
        assert_eq!(held, 55);
        a.reset(&key).await.expect("reset");
        for _ in 0..40 {
            assert!(a.check(&key, 1).await.expect("decision").is_allowed());
        }
        let counted = redis_count(&server, &a, &key);
        assert!(counted >= 40, "{counted}");
        // B gives back 55 units drawn before the reset: Redis ignores them (subtracting them from
        // the fresh count would let 55 more than the limit through).
        assert_eq!(b.store().return_leases().await.expect("return"), 55);
        assert_eq!(redis_count(&server, &a, &key), counted);
        // A return within the key's current epoch still counts.
        a.store().return_leases().await.expect("return");
        assert_eq!(redis_count(&server, &a, &key), 40);
        assert_eq!(40 + drain(&a, &b, &key).await, 1000);
    });
}

/// `server --rules F --redis-lease`: the limits leasing can bound lease, the others are checked by
/// a Redis call each and named in one warning at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_with_rules_and_redis_lease_leases_the_limits_it_can_and_names_the_others() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = std::env::temp_dir().join(format!("tollgate-lease-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    let limit = |name: &str, strategy: &str, quotas: &str| {
        format!(
            "[[limit]]\nname = \"{name}\"\npath = \"/{name}\"\nkey = \"global\"\n\
             strategy = \"{strategy}\"\nquotas = \"{quotas}\"\n\n"
        )
    };
    let rules = [
        limit("leased", "fixed-window", "2000/hour"),
        limit("moving", "moving-window", "10/hour"),
        limit("dripping", "leaky-bucket", "10/hour"),
    ]
    .concat();
    std::fs::write(&file, rules).unwrap();
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--store",
        url.as_str(),
        "--rules",
        file.to_str().unwrap(),
        "--store-timeout",
        "2000",
        "--redis-lease",
    ];
    let server = crate::examples::start_keeping_stderr("server", &args).await;
    let client = crate::support::TestClient::new();
    let admitted = |path: &'static str, n: usize| {
        let (client, url) = (&client, server.url(path));
        async move {
            let mut ok = 0;
            for _ in 0..n {
                if client.get(&url).await.status == http::StatusCode::OK {
                    ok += 1;
                }
            }
            ok
        }
    };
    // The leased limit: 100 admissions on leases of 1, 4, 16, 64 and 100 units, and a renewal
    // at most every 250 ms (the default `renew_after`) while they last.
    let calls = redis.command_calls("evalsha");
    let started = std::time::Instant::now();
    assert_eq!(admitted("/leased", 100).await, 100);
    let leased_calls = redis.command_calls("evalsha") - calls;
    let renewals = started.elapsed().as_millis() / 250 + 1;
    assert!(
        leased_calls <= 10 + renewals as u64,
        "{leased_calls} Redis calls for 100 leased admissions ({renewals} renewals at most)"
    );
    // The others: exactly their limits, a call per admission (no lease; the blocked-key cache
    // answers the rejections after the first), none refused at start.
    for path in ["/moving", "/dripping"] {
        let calls = redis.command_calls("evalsha");
        assert_eq!(admitted(path, 15).await, 10, "{path}");
        let calls = redis.command_calls("evalsha") - calls;
        assert!((10..=15).contains(&calls), "{path}: {calls} calls");
    }
    let stderr = server.stop_with("-TERM").await;
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("server: warning: --redis-lease"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("\"moving\" (moving-window)")
            && warnings[0].contains("\"dripping\" (leaky-bucket)")
            && !warnings[0].contains("\"leased\""),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A renewal that finds the key's quota spent (by another instance) keeps the lease in hand
/// admitting: its units were counted in Redis all along, so the window admits exactly its limit,
/// never less.
#[test]
fn a_renewal_that_finds_no_room_keeps_the_lease_in_hand_admitting() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE + 5 * S));
        let (a, b) = two_instances(&server, &clock).await;
        let key = "full-at-renewal".to_owned();
        // B's leases grow 1, 4, 16, 64: 85 units drawn, 55 still in hand.
        for _ in 0..30 {
            assert!(b.check(&key, 1).await.expect("decision").is_allowed());
        }
        assert_eq!(b.store().lease_counters().units_held, 55);
        // A spends the rest of the window, lease by lease, until Redis has no room.
        let by_a = admissions(&a, &key, 1000).await;
        assert_eq!(by_a, 1000 - 85);
        // B's renewal is due: Redis has no room to grant, but the reply says the key was not
        // reset, so B's 55 units admit on.
        clock.advance(Duration::from_secs(11));
        let mut admitted = 0;
        for _ in 0..60 {
            if b.check(&key, 1).await.expect("decision").is_allowed() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 55, "{:?}", b.store().lease_counters());
        assert_eq!(
            30 + by_a + admitted,
            1000,
            "exactly the limit in the window"
        );
        assert_eq!(redis_count(&server, &a, &key), 1000);
        assert_counters_add_up(&b, "after the renewal without room");
    });
}
