//! A key's state on Redis is identified by (limiter name, key) and records the rule it was written
//! under: a decision under another rule (a quota changed in code, a reload, a tier change, another
//! instance of a rolling deploy) converts the state in the script, never starts it afresh.
//!
//! The oracle drives random traffic with random quota and strategy changes under one name on the
//! test clock (the store on client time), keeps an exact log of every admitted unit and checks
//! each decision against the bounds below; the figures of the changing-limits guide are checked
//! exactly next to it.

use crate::redis_support;

use std::time::Duration;

use redis_support::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::store::{Item, Scope, Store};
use tollgate::{Clock, ManualClock, Op, RateLimiter, Rule, Strategy};

type Limiter = RateLimiter<String, RedisStore, ManualClock>;

/// The test clock's start (ns since the epoch; 2023-11).
const BASE: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A store on the test clock, without the blocked-key cache (which counts on the process's clock).
async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .use_client_time(true)
        .block_cache(0)
        .build()
        .await
        .expect("connect")
}

fn limiter(store: RedisStore, name: &str, rule: &Rule, clock: &ManualClock) -> Limiter {
    let mut b = RateLimiter::builder().name(name).strategy(rule.strategy());
    for q in rule.quotas() {
        b = b.quota(*q);
    }
    b.clock(clock.clone())
        .store(store)
        .build()
        .expect("limiter")
}

fn rule(strategy: Strategy, quotas: &str) -> Rule {
    Rule::parse(strategy, quotas).expect("rule")
}

/// The limit a bound counts with: the limit, or the burst of a bucket when larger.
fn depth(rule: &Rule, period: Duration) -> Option<u64> {
    rule.quotas()
        .iter()
        .find(|q| q.period() == period)
        .map(|q| u64::from(q.limit().max(q.burst())))
}

/// The strategy's own bound on a trailing period, in limits: a moving window admits at most the
/// limit; fixed and first-hit windows twice it across an edge; the sliding counter at most twice
/// it; a bucket its burst plus the rate (burst = limit here).
fn own_bound(strategy: Strategy) -> u64 {
    if strategy == Strategy::MovingWindow {
        1
    } else {
        2
    }
}

/// An exact log of admitted units (ns timestamps).
#[derive(Default)]
struct Log(Vec<u64>);

impl Log {
    /// Units admitted in `(from, to]`.
    fn within(&self, from: u64, to: u64) -> u64 {
        self.0.iter().filter(|&&t| t > from && t <= to).count() as u64
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PERIODS: [(u64, &str); 2] = [(10, "10s"), (60, "1m")];

fn random_rule(rng: &mut Rng) -> Rule {
    let strategy = Strategy::ALL[rng.below(6) as usize];
    let which = rng.below(3);
    let mut parts = Vec::new();
    for (i, (_, p)) in PERIODS.iter().enumerate() {
        if which == 2 || which == i as u64 {
            parts.push(format!("{}/{p}", 2 + rng.below(11)));
        }
    }
    rule(strategy, &parts.join("; "))
}

/// The oracle. For a unit admitted at `t` under rule `R`, for every quota of `R` with period `W`:
///
/// `admitted in (t - W, t] <= own(R) * L + (L if the strategy changed in (t - 2W, t])`
///
/// where `L` is the largest limit (or burst) of the period-`W` quotas of every rule in force in
/// `(t - 2W, t]`, checked when each of those rules has a quota of period `W` (a rule without it
/// counts the period only through its ghost: checked by the figures below). And for every
/// rejection at `t` (cost 1): `admitted in (t - 3 Wmax, t] >= min limit of R` (no state rejects
/// from spend it cannot prove: every unit a converted state carries was admitted within three of
/// the longest periods).
#[test]
fn random_quota_and_strategy_changes_under_one_name_keep_the_bounds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let s = store(&server, "oracle:").await;
        let steps = std::env::var("STATE_ORACLE_STEPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400);
        let (mut admitted, mut rejected, mut changes) = (0, 0, 0);
        for seed in 1..=6u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let clock = ManualClock::new(Duration::from_nanos(BASE + seed * 3600 * S));
            let mut current = random_rule(&mut rng);
            let lim = limiter(s.clone(), &format!("oracle-{seed}"), &current, &clock);
            let mut trace: Vec<String> = Vec::new();
            let key = format!("k{seed}");
            // (since, rule) for every rule in force, oldest first.
            let mut history: Vec<(u64, Rule)> = vec![(0, current.clone())];
            let mut log = Log::default();
            for _ in 0..steps {
                let gap = [0, MS, 100 * MS, S, 3 * S, 10 * S, 40 * S][rng.below(7) as usize];
                clock.advance(Duration::from_nanos(gap));
                let now = clock.now();
                if rng.below(10) == 0 {
                    current = random_rule(&mut rng);
                    history.push((now, current.clone()));
                    changes += 1;
                }
                let d = lim
                    .apply(&key, Some(&current), Op::Check(1))
                    .await
                    .expect("decision");
                trace.push(format!(
                    "{} ms {:?} {:?} {}",
                    (now - BASE - seed * 3600 * S) / MS,
                    current.strategy(),
                    current
                        .quotas()
                        .iter()
                        .map(|q| (q.limit(), q.period().as_secs()))
                        .collect::<Vec<_>>(),
                    d.is_allowed()
                ));
                if d.is_allowed() {
                    admitted += 1;
                    log.0.push(now);
                    check_upper(&log, &history, &current, now);
                } else {
                    rejected += 1;
                    let wmax = PERIODS.iter().map(|(p, _)| p * S).max().unwrap_or(S);
                    let least = current
                        .quotas()
                        .iter()
                        .map(|q| u64::from(q.limit().min(q.burst())))
                        .min()
                        .unwrap_or(1);
                    let recent = log.within(now.saturating_sub(3 * wmax), now);
                    assert!(
                        recent >= least,
                        "seed {seed}: rejected under {current:?} with only {recent} admitted in \
                         the last {} s (least limit {least})\n{}",
                        3 * wmax / S,
                        trace[trace.len().saturating_sub(40)..].join("\n")
                    );
                }
            }
        }
        // Both sides were exercised.
        assert!(
            admitted > 500 && rejected > 200 && changes > 100,
            "{admitted} {rejected} {changes}"
        );
    });
}

fn check_upper(log: &Log, history: &[(u64, Rule)], current: &Rule, now: u64) {
    for q in current.quotas() {
        let w = u64::try_from(q.period().as_nanos()).unwrap_or(u64::MAX);
        let from = now.saturating_sub(2 * w);
        // The rules in force in (now - 2W, now]: the last one before it, and every later one.
        let start = history
            .iter()
            .rposition(|(since, _)| *since <= from)
            .unwrap_or(0);
        let in_force = &history[start..];
        let Some(limits) = in_force
            .iter()
            .map(|(_, r)| depth(r, q.period()))
            .collect::<Option<Vec<u64>>>()
        else {
            continue;
        };
        let l = limits.into_iter().max().unwrap_or(0);
        let strategies_changed = in_force
            .windows(2)
            .any(|p| p[0].1.strategy() != p[1].1.strategy());
        let bound = own_bound(current.strategy()).max(
            in_force
                .iter()
                .map(|(_, r)| own_bound(r.strategy()))
                .max()
                .unwrap_or(1),
        ) * l
            + if strategies_changed { l } else { 0 };
        let got = log.within(now.saturating_sub(w), now);
        assert!(
            got <= bound,
            "{got} admitted in the last {:?} under {current:?} (bound {bound}; rules in force: {})",
            q.period(),
            in_force
                .iter()
                .map(|(since, r)| format!("{r:?} since {}", since.saturating_sub(BASE) / MS))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// Sends one request every `step` from the clock's time for `span`, under `rule`; returns the
/// admitted units.
async fn drive(
    lim: &Limiter,
    clock: &ManualClock,
    rule: &Rule,
    span: Duration,
    step: Duration,
) -> u64 {
    let key = "user".to_owned();
    let mut admitted = 0;
    let mut t = Duration::ZERO;
    while t < span {
        if lim
            .apply(&key, Some(rule), Op::Check(1))
            .await
            .expect("decision")
            .is_allowed()
        {
            admitted += 1;
        }
        clock.advance(step);
        t += step;
    }
    admitted
}

/// The guide's figures, every strategy: each change converts the key's state, so the hour (or
/// minute) holds what the stricter reading of the rules allows, and not less.
#[test]
fn the_guides_figures_hold_for_every_strategy() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let s = store(&server, "figures:").await;
        let ms = Duration::from_millis;
        for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
            let buckets = matches!(strategy, Strategy::TokenBucket | Strategy::LeakyBucket);
            // Each scenario from the start of a clock hour, so that the hour of a clock-aligned
            // window holds it whole.
            let hour = 3600 * S;
            let at = |n: u64| {
                Duration::from_nanos(BASE - BASE % hour + (i as u64 * 100 + n) * 86_400 * S)
            };
            let r = |q: &str| rule(strategy, q);

            // 100/hour -> 110/hour -> 120/hour, the key idle between: 120 in the hour.
            let clock = ManualClock::new(at(1));
            let lim = limiter(s.clone(), &format!("fig-{i}-2"), &r("100/hour"), &clock);
            let mut got = drive(&lim, &clock, &r("100/hour"), ms(200), ms(1)).await;
            clock.advance(Duration::from_secs(60));
            got += drive(&lim, &clock, &r("110/hour"), ms(50), ms(1)).await;
            clock.advance(Duration::from_secs(60));
            got += drive(&lim, &clock, &r("120/hour"), ms(50), ms(1)).await;
            // A bucket also refills at the rate while the key is idle: 2 minutes at 120/hour.
            let refill = if buckets { 4 } else { 0 };
            assert!(
                (120..=120 + refill).contains(&got),
                "{strategy}: 100 -> 110 -> 120/hour admitted {got}"
            );

            // 100/hour -> 50/hour -> 100/hour: 100 in the hour.
            let clock = ManualClock::new(at(2));
            let lim = limiter(s.clone(), &format!("fig-{i}-3"), &r("100/hour"), &clock);
            let mut got = drive(&lim, &clock, &r("100/hour"), ms(100), ms(1)).await;
            clock.advance(Duration::from_secs(60));
            got += drive(&lim, &clock, &r("50/hour"), ms(50), ms(1)).await;
            clock.advance(Duration::from_secs(60));
            got += drive(&lim, &clock, &r("100/hour"), ms(100), ms(1)).await;
            // A bucket's deficit is capped at the new burst (50): back on 100/hour, the 50 units
            // above it are room again, plus the refill.
            let most = if buckets { 150 + refill } else { 100 };
            assert!(
                (100..=most).contains(&got),
                "{strategy}: 100 -> 50 -> 100/hour admitted {got}"
            );

            // 5/second; 20/minute -> 10/second; 20/minute: 20 in the minute.
            let clock = ManualClock::new(at(3));
            let (a, b) = (r("5/second; 20/minute"), r("10/second; 20/minute"));
            let lim = limiter(s.clone(), &format!("fig-{i}-4"), &a, &clock);
            let mut got = drive(&lim, &clock, &a, ms(2500), ms(50)).await;
            got += drive(&lim, &clock, &b, ms(50_000), ms(50)).await;
            if buckets {
                // A bucket refills at the minute's rate: the burst plus 20 per minute.
                assert!(
                    (20..=40).contains(&got),
                    "{strategy}: {got} (20 burst + rate)"
                );
            } else {
                assert!(
                    (20..=20 * own_bound(strategy)).contains(&got),
                    "{strategy}: 5/s; 20/min -> 10/s; 20/min admitted {got} in 52.5 s"
                );
            }

            // 10/minute; 100/hour -> 20/minute; 100/hour: 100 in the hour, and raising the
            // minute counts (it admits while the hour has room).
            let clock = ManualClock::new(at(4));
            let (a, b) = (r("10/minute; 100/hour"), r("20/minute; 100/hour"));
            let lim = limiter(s.clone(), &format!("fig-{i}-5"), &a, &clock);
            let before = drive(&lim, &clock, &a, Duration::from_secs(5 * 60), ms(5_000)).await;
            let got =
                before + drive(&lim, &clock, &b, Duration::from_secs(50 * 60), ms(2_000)).await;
            if buckets {
                assert!(
                    (100..=200).contains(&got),
                    "{strategy}: {got} (burst + rate)"
                );
            } else {
                assert_eq!(
                    (before, got),
                    (50, 100),
                    "{strategy}: 10/min; 100/h -> 20/min; 100/h"
                );
            }

            // A removed period stays as a ghost, charged while the other version decides:
            // 10/minute; 100/hour (5 minutes) -> 10/minute (5 minutes) -> 10/minute; 100/hour:
            // back on the hour, the key has spent what both versions admitted.
            let clock = ManualClock::new(at(5));
            let (a, b) = (r("10/minute; 100/hour"), r("10/minute"));
            let lim = limiter(s.clone(), &format!("fig-{i}-6"), &a, &clock);
            let five = Duration::from_secs(5 * 60);
            let first = drive(&lim, &clock, &a, five, ms(5_000)).await;
            let middle = drive(&lim, &clock, &b, five, ms(5_000)).await;
            let last = drive(&lim, &clock, &a, Duration::from_secs(40 * 60), ms(5_000)).await;
            if buckets {
                let got = first + middle + last;
                assert!(
                    (100..=200).contains(&got),
                    "{strategy}: {got} (burst + rate)"
                );
            } else {
                assert_eq!(
                    (first, middle, last),
                    (50, 50, 0),
                    "{strategy}: the hour's ghost"
                );
            }
        }
    });
}

/// A strategy change under one name finds the old state: each of the six strategies in turn, one
/// second apart, on `5/hour` spent in full by the first: nothing more is admitted.
#[test]
fn a_strategy_change_finds_the_old_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let s = store(&server, "strategies:").await;
        let clock = ManualClock::new(Duration::from_nanos(BASE));
        let first = rule(Strategy::MovingWindow, "5/hour");
        let lim = limiter(s, "strategies", &first, &clock);
        let key = "user".to_owned();
        for _ in 0..5 {
            assert!(lim.check(&key, 1).await.unwrap().is_allowed());
        }
        for _ in 0..3 {
            for strategy in Strategy::ALL {
                clock.advance(Duration::from_secs(1));
                let r = rule(strategy, "5/hour");
                let d = lim.apply(&key, Some(&r), Op::Check(1)).await.unwrap();
                assert!(!d.is_allowed(), "{strategy} found the spent hour");
                assert_eq!(d.remaining(), 0, "{strategy}");
            }
        }
        // A fresh key through the same changes: each strategy admits one while the hour has
        // room (five), and the sixth finds it spent.
        let other = "other".to_owned();
        for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
            let r = rule(strategy, "5/hour");
            let d = lim.apply(&other, Some(&r), Op::Check(1)).await.unwrap();
            assert_eq!(d.is_allowed(), i < 5, "{strategy}");
        }
    });
}

/// The multi-limit script converts each item's state too, all-or-nothing: a call that does not
/// admit still writes the converted states back (never a reset for free).
#[test]
fn the_multi_limit_script_converts_each_items_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = store(&server, "multi:").await;
        let t0 = BASE;
        let key = "user".to_owned();
        let (a1, b1) = (
            rule(Strategy::FixedWindow, "3/hour"),
            rule(Strategy::MovingWindow, "5/hour"),
        );
        for i in 0..3 {
            assert_eq!(
                decide(&store, &key, [&a1, &b1], t0 + i * S).await,
                [true, true]
            );
        }
        // New rules for both: a has 1 of 4 left, b 2 of 5 (converted from the log).
        let (a2, b2) = (
            rule(Strategy::SlidingWindow, "4/hour"),
            rule(Strategy::TokenBucket, "5/hour"),
        );
        assert_eq!(
            decide(&store, &key, [&a2, &b2], t0 + 10 * S).await,
            [true, true]
        );
        assert_eq!(decide(&store, &key, [&a2, &b2], t0 + 11 * S).await, [false]);
        // b's converted state was written although the call did not admit: one more, then none.
        let b = |now: u64| store.apply(&key, Scope::new("m-b", &b2), Op::Check(1), now);
        assert!(b(t0 + 12 * S).await.unwrap().is_allowed());
        assert!(!b(t0 + 13 * S).await.unwrap().is_allowed());
    });
}

/// Limits `m-a` and `m-b` on `key` under `rules`, all-or-nothing: each decided item's verdict.
async fn decide(store: &RedisStore, key: &String, rules: [&Rule; 2], now: u64) -> Vec<bool> {
    let items = [("m-a", rules[0]), ("m-b", rules[1])].map(|(name, rule)| Item {
        store,
        key,
        scope: Scope::new(name, rule),
        cost: 1,
    });
    store
        .apply_all(&items, now)
        .await
        .into_iter()
        .map(|(_, d)| d.expect("decided").is_allowed())
        .collect()
}

/// A quota lease drawn under the old rule was charged to Redis when granted: an instance on the
/// new rule sees those units spent, so the lease cannot add to the new quota.
#[test]
fn a_lease_under_the_old_rule_counts_in_the_new_one() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let clock = ManualClock::new(Duration::from_nanos(BASE));
        let leasing =
            tollgate::store::redis::Leasing::default().idle_return(Duration::from_secs(3600));
        let leased = RedisStore::builder(server.url())
            .prefix("lease:")
            .timeout(Duration::from_secs(2))
            .use_client_time(true)
            .block_cache(0)
            .leases(leasing)
            .build()
            .await
            .expect("connect");
        let plain = store(&server, "lease:").await;
        let old = rule(Strategy::SlidingWindow, "100/minute");
        let new = rule(Strategy::SlidingWindow, "20/minute");
        let a = limiter(leased.clone(), "leased", &old, &clock);
        let b = limiter(plain, "leased", &new, &clock);
        let key = "user".to_owned();
        for _ in 0..5 {
            assert!(a.check(&key, 1).await.unwrap().is_allowed());
        }
        let granted = leased.lease_counters().granted;
        assert!(granted >= 5, "a lease was drawn: {granted}");
        let mut admitted = 0;
        for _ in 0..30 {
            if b.check(&key, 1).await.unwrap().is_allowed() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 20u64.saturating_sub(granted), "granted {granted}");
    });
}

/// A conversion that has to estimate (a fixed window's count becomes a moving window's log, its
/// entries stamped now) is logged once per limit, naming it, by the single-key and the multi-limit
/// scripts alike; an exact one is not.
#[test]
fn an_estimated_conversion_is_logged_once_per_limit_by_name() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = rt();
    let ((), logs) = crate::logs::capturing(|| {
        rt.block_on(async {
            let store = store(&server, "estimate:").await;
            let clock = ManualClock::new(Duration::from_nanos(BASE));
            let fixed = rule(Strategy::FixedWindow, "10/hour");
            let moving = rule(Strategy::MovingWindow, "10/hour");
            let paced = limiter(store.clone(), "paced", &fixed, &clock);
            let exact = limiter(store.clone(), "exact", &moving, &clock);
            for key in ["a", "b"].map(String::from) {
                for _ in 0..7 {
                    assert!(paced.check(&key, 1).await.unwrap().is_allowed());
                    assert!(exact.check(&key, 1).await.unwrap().is_allowed());
                }
                let d = paced.apply(&key, Some(&moving), Op::Check(1)).await;
                assert_eq!(d.unwrap().remaining(), 2, "{key}");
                // The log covers the new period: exact.
                let longer = rule(Strategy::MovingWindow, "12/hour");
                let d = exact.apply(&key, Some(&longer), Op::Peek).await;
                assert_eq!(d.unwrap().remaining(), 5, "{key}");
            }
            // The multi-limit script: limiters m-a and m-b on this store.
            let (_a, _b) = (
                limiter(store.clone(), "m-a", &fixed, &clock),
                limiter(store.clone(), "m-b", &fixed, &clock),
            );
            let key = "c".to_owned();
            for i in 0..3 {
                assert_eq!(
                    decide(&store, &key, [&fixed, &fixed], BASE + i * S).await,
                    [true, true]
                );
            }
            let tokens = rule(Strategy::TokenBucket, "10/hour");
            assert_eq!(
                decide(&store, &key, [&moving, &tokens], BASE + 5 * S).await,
                [true, true]
            );
        });
    });
    let text = logs.text();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("by an estimate"))
        .collect();
    assert_eq!(warned.len(), 2, "{text}");
    assert!(warned[0].contains("paced"), "{text}");
    assert!(warned[1].contains("m-a"), "{text}");
}
