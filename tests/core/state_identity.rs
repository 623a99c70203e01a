//! A key's state is identified by (limiter name, key) in the memory store: a decision under another
//! rule (a quota changed in code, a reload, a tier change) converts the state strictly, never starts
//! it afresh, and removed periods stay as ghosts until their windows end.
//!
//! - The figures of the guide's chapter on changing limits, per strategy.
//! - An oracle (`PROPTEST_CASES`-driven): random traffic with random quota and strategy changes
//!   under one name (per-request rules), an exact log of every admitted unit, and each decision
//!   checked against the bound below, from both sides.

use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use tollgate::store::MemoryStore;
use tollgate::{ManualClock, Op, RateLimiter, Rule, Strategy};

type Limiter<K> = RateLimiter<K, MemoryStore<K>, ManualClock>;

/// An hour boundary: clock-aligned windows of a second, a minute and an hour all start here.
const START: Duration = Duration::from_secs(1_700_002_800);

fn limiter(strategy: Strategy, quotas: &str) -> (Limiter<&'static str>, ManualClock) {
    let clock = ManualClock::new(START);
    let limiter = RateLimiter::builder()
        .strategy(strategy)
        .quotas(quotas)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    (limiter, clock)
}

/// Units of cost 1 admitted for `"k"` under `rule` at the clock's time, trying up to `most`.
fn spend(limiter: &Limiter<&'static str>, rule: &Rule, most: u32) -> u32 {
    (0..most)
        .filter(|_| {
            limiter
                .apply_now(&"k", Some(rule), Op::Check(1))
                .is_allowed()
        })
        .count() as u32
}

fn rule(strategy: Strategy, quotas: &str) -> Rule {
    Rule::parse(strategy, quotas).unwrap()
}

/// The window strategies (the buckets carry a deficit in units, see the bucket cases).
const WINDOWS: [Strategy; 4] = [
    Strategy::FixedWindow,
    Strategy::FixedWindowFirstHit,
    Strategy::MovingWindow,
    Strategy::SlidingWindow,
];

#[test]
fn raising_a_quota_twice_with_the_key_idle_between_admits_the_last_limit() {
    // 100/hour -> 110/hour -> 120/hour, 10 minutes apart: 120 in the hour, not 220.
    for strategy in Strategy::ALL {
        let (limiter, clock) = limiter(strategy, "100/hour");
        let mut admitted = spend(&limiter, limiter.rule(), 200);
        for quotas in ["110/hour", "120/hour"] {
            clock.advance(Duration::from_secs(600));
            admitted += spend(&limiter, &rule(strategy, quotas), 200);
        }
        // A bucket refills by itself meanwhile (its own bound: burst + rate over the 20 minutes).
        let most = if strategy.is_bucket() { 120 + 40 } else { 120 };
        assert!(
            (120..=most).contains(&admitted),
            "{strategy}: {admitted} admitted in the hour"
        );
    }
}

#[test]
fn lowering_then_restoring_a_quota_admits_the_limit_once() {
    // 100/hour -> 50/hour -> 100/hour: 100 in the hour, not 150.
    for strategy in WINDOWS {
        let (limiter, clock) = limiter(strategy, "100/hour");
        let mut admitted = spend(&limiter, limiter.rule(), 200);
        for quotas in ["50/hour", "100/hour"] {
            clock.advance(Duration::from_secs(600));
            admitted += spend(&limiter, &rule(strategy, quotas), 200);
        }
        assert_eq!(admitted, 100, "{strategy}");
    }
    // A bucket carries its deficit in units (100 units of the 50/hour bucket: over-full), and
    // refills by itself meanwhile (its own bound: burst + rate).
    for strategy in [Strategy::TokenBucket, Strategy::LeakyBucket] {
        let (limiter, clock) = limiter(strategy, "100/hour");
        let mut admitted = spend(&limiter, limiter.rule(), 200);
        for quotas in ["50/hour", "100/hour"] {
            clock.advance(Duration::from_secs(600));
            admitted += spend(&limiter, &rule(strategy, quotas), 200);
        }
        assert!((100..=140).contains(&admitted), "{strategy}: {admitted}");
    }
}

#[test]
fn raising_the_short_period_keeps_the_unchanged_long_one() {
    // `5/second; 20/minute` -> `10/second; 20/minute`: at most 20 in the minute.
    for strategy in Strategy::ALL {
        let (limiter, clock) = limiter(strategy, "5/second; 20/minute");
        let new = rule(strategy, "10/second; 20/minute");
        let mut admitted = 0;
        for s in 0..60 {
            let r = if s < 2 {
                limiter.rule().clone()
            } else {
                new.clone()
            };
            admitted += spend(&limiter, &r, 20);
            clock.advance(Duration::from_secs(1));
        }
        // The minute quota holds: 20, plus what a bucket refills in the minute.
        let most = if strategy.is_bucket() { 40 } else { 20 };
        assert!(
            (20..=most).contains(&admitted),
            "{strategy}: {admitted} in the minute"
        );
    }
}

/// `10/minute; 100/hour` with the minute raised to 20 after 30 minutes, a request every 10 s:
/// (admitted before, after) the change in the hour.
fn raise_the_minute(strategy: Strategy) -> (u32, u32) {
    let (limiter, clock) = limiter(strategy, "10/minute; 100/hour");
    let new = rule(strategy, "20/minute; 100/hour");
    let (mut before, mut after) = (0, 0);
    for step in 0..360 {
        if step < 180 {
            before += spend(&limiter, limiter.rule(), 1);
        } else {
            after += spend(&limiter, &new, 1);
        }
        clock.advance(Duration::from_secs(10));
    }
    (before, after)
}

#[test]
fn raising_one_period_of_two_keeps_the_hour() {
    // Every 10 s for an hour, the minute quota raised after 30 minutes: the hour's 100 holds.
    for strategy in Strategy::ALL {
        let (before, after) = raise_the_minute(strategy);
        eprintln!("{strategy}: `10/minute; 100/hour` -> `20/minute; 100/hour`: {before} + {after}");
        // A bucket's own bound in the hour: burst + rate (200).
        let most = if strategy.is_bucket() { 200 } else { 100 };
        assert!(
            (90..=most).contains(&(before + after)),
            "{strategy}: {before} + {after} in the hour"
        );
    }
}

#[test]
fn a_removed_period_is_kept_as_a_ghost_and_read_back() {
    // `10/minute; 100/hour` -> `10/minute` -> back: the hour's spend while the hour was removed
    // still counts (two rule versions alternating count the key once).
    for strategy in WINDOWS {
        let (limiter, clock) = limiter(strategy, "10/minute; 100/hour");
        let minute = rule(strategy, "10/minute");
        let (mut before, mut after) = (0, 0);
        for m in 0..60 {
            if (10..40).contains(&m) {
                before += spend(&limiter, &minute, 10);
            } else if m < 10 {
                before += spend(&limiter, limiter.rule(), 10);
            } else {
                after += spend(&limiter, limiter.rule(), 10);
            }
            clock.advance(Duration::from_secs(60));
        }
        // Minutes 0-39: over 100 (the minute rule alone after minute 10); back under the hour at
        // minute 40: nothing, the ghost counted every unit.
        assert!(before > 100, "{strategy}: {before}");
        assert_eq!(after, 0, "{strategy}");
    }
}

#[test]
fn a_tier_change_converts() {
    // A per-request rule (a `select_rule` tier): pro (1000/hour) -> free (100/hour) -> pro.
    let (api, _clock) = limiter(Strategy::SlidingWindow, "1000/hour");
    assert!(api.check_now(&"k", 500).is_allowed());
    // 500 spent: nothing left under free.
    let free = rule(Strategy::SlidingWindow, "100/hour");
    let d = api.apply_now(&"k", Some(&free), Op::Check(1));
    assert!(!d.is_allowed(), "{d:?}");
    // Back to pro: 500 left, not 1000.
    let d = api.check_now(&"k", 1);
    assert_eq!((d.is_allowed(), d.remaining()), (true, 499));
    // Another key is untouched.
    assert_eq!(api.check_now(&"j", 1).remaining(), 999);
}

#[test]
fn a_key_evicted_under_one_rule_comes_back_under_another_at_least_as_spent() {
    for strategy in Strategy::ALL {
        let clock = ManualClock::new(START);
        let limiter = RateLimiter::builder()
            .strategy(strategy)
            .quotas("10/minute")
            .unwrap()
            .max_keys(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        let other = rule(strategy, "12/minute");
        // The name has seen two rules: its keys convert.
        assert!(
            limiter
                .apply_now(&99, Some(&other), Op::Check(1))
                .is_allowed()
        );
        assert!(limiter.check_now(&1, 8).is_allowed());
        // Key 2 evicts key 1 (the cap is 1).
        clock.advance(Duration::from_millis(1));
        assert!(limiter.check_now(&2, 1).is_allowed());
        assert!(limiter.store().len() <= 2);
        assert!(limiter.stats().evictions > 0, "{strategy}");
        // Key 1 back under the other rule: 8 of 12 spent, at most 4 left.
        let admitted = (0..12)
            .filter(|_| {
                limiter
                    .apply_now(&1, Some(&other), Op::Check(1))
                    .is_allowed()
            })
            .count();
        assert!(admitted <= 4, "{strategy}: {admitted}");
    }
}

// The oracle.

/// Periods the random rules draw from (seconds).
const PERIODS: [u64; 3] = [1, 4, 10];

/// A rule drawn at random: a strategy and (period index, limit) quotas.
type RuleSpec = (Strategy, Vec<(usize, u32)>);

#[derive(Clone, Debug)]
struct Step {
    /// Milliseconds since the previous step.
    gap_ms: u64,
    cost: u32,
    /// A new rule from this step on: a strategy and (period index, limit) quotas.
    change: Option<RuleSpec>,
}

fn arb_rule() -> impl proptest::strategy::Strategy<Value = RuleSpec> {
    (
        proptest::sample::select(Strategy::ALL.to_vec()),
        proptest::collection::btree_map(0..PERIODS.len(), 1u32..12, 1..=2),
    )
        .prop_map(|(s, q)| (s, q.into_iter().collect()))
}

fn arb_step() -> impl proptest::strategy::Strategy<Value = Step> {
    (
        prop_oneof![3 => 0u64..400, 1 => 400u64..4_000],
        1u32..3,
        proptest::option::weighted(0.06, arb_rule()),
    )
        .prop_map(|(gap_ms, cost, change)| Step {
            gap_ms,
            cost,
            change,
        })
}

fn first_text((_, quotas): &RuleSpec) -> String {
    let text: Vec<String> = quotas
        .iter()
        .map(|&(p, l)| format!("{l}/{}s", PERIODS[p]))
        .collect();
    text.join("; ")
}

fn to_rule(r: &RuleSpec) -> Rule {
    rule(r.0, &first_text(r))
}

/// The most units a rule of `strategy` admits by itself in a trailing window of its quota
/// `limit` per `period`: `2L` across a fixed-window edge or for the sliding counter's worst
/// case, `B + L` for a bucket (burst = limit), `L` for the moving window.
fn own_bound(strategy: Strategy, limit: u64) -> u64 {
    match strategy {
        Strategy::MovingWindow => limit,
        _ => 2 * limit,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Bound checked at every admitted decision at time `t` under rule `R`, per quota `(L', W')`
    /// of `R`: the units admitted in `(t - W', t]` are at most
    /// `max over the rules r active in that window of own_bound(r)` plus `L'`, where `own_bound(r)`
    /// is that rule's own bound for its quota of period `W'` (a rule without one: for its
    /// shortest quota of a period above `W'`, or, when it has none, its largest quota of a shorter
    /// period times the periods of it that `W'` holds, rounded up). The conversion adds at most one
    /// new quota's limit on top of what the old rules could admit by themselves. With a single
    /// strategy of exact windows (the moving window) and quotas of the same period in every rule,
    /// the bound is exact: `max L`.
    ///
    /// From the other side: once the key has been idle for twice the longest period of every rule
    /// seen since its last admission and the last rule change before this request (a conversion
    /// places the spend it proves in the current window), plus, when a bucket was involved, the
    /// largest limit seen times the longest period (an over-full bucket drains its carried units
    /// at its own rate), every state and ghost is fresh: a request of cost 1 is admitted.
    #[test]
    fn conversions_never_admit_past_the_bound(
        first in arb_rule(),
        steps in proptest::collection::vec(arb_step(), 1..250),
    ) {
        let clock = ManualClock::new(START);
        let first_rule = to_rule(&first);
        let limiter = RateLimiter::builder()
            .strategy(first_rule.strategy())
            .quotas(&first_text(&first))
            .unwrap()
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut current = first.clone();
        let mut rule_now = first_rule;
        // (from ms, rule) epochs, and (ms, units) admitted.
        let mut epochs: Vec<(u64, RuleSpec)> = vec![(0, first)];
        let mut log: Vec<(u64, u64)> = Vec::new();
        let mut t = 0u64;
        let mut last_admit = 0u64;
        for step in &steps {
            t += step.gap_ms;
            clock.advance(Duration::from_millis(step.gap_ms));
            if let Some(change) = &step.change {
                current = change.clone();
                rule_now = to_rule(change);
                epochs.push((t, change.clone()));
            }
            let d = limiter.apply_now(&1, Some(&rule_now), Op::Check(step.cost));
            // Idle long enough since the last admission and the last conversion (which places
            // the spend it proves in the current window): every old state and ghost is fresh.
            let longest = epochs.iter().flat_map(|(_, r)| r.1.iter().map(|q| PERIODS[q.0])).max().unwrap_or(0);
            let before_this = if step.change.is_some() { 2 } else { 1 };
            let changed = epochs.len().checked_sub(before_this).and_then(|i| epochs.get(i)).map_or(0, |e| e.0);
            let quiet = t - last_admit.max(changed);
            // A bucket may start over-full (its carried units are not capped at a smaller burst):
            // it drains at most the largest limit seen, one unit per longest period.
            let most = epochs.iter().flat_map(|(_, r)| r.1.iter().map(|q| u64::from(q.1))).max().unwrap_or(0);
            let drained = if epochs.iter().any(|(_, r)| r.0.is_bucket()) { most * longest } else { 0 };
            if quiet > (2 * longest + drained) * 1_000 && !log.is_empty() && step.cost == 1 {
                prop_assert!(d.is_allowed(), "idle {quiet} ms, still rejected: {d:?}");
            }
            if !d.is_allowed() {
                continue;
            }
            last_admit = t;
            log.push((t, u64::from(step.cost)));
            for &(p, limit) in &current.1 {
                let w = PERIODS[p] * 1_000;
                let from = t.saturating_sub(w - 1);
                let admitted: u64 = log.iter().filter(|(at, _)| *at >= from).map(|(_, c)| c).sum();
                // The rules active in (t - W', t].
                let active: Vec<&RuleSpec> = epochs
                    .iter()
                    .enumerate()
                    .filter(|(i, (since, _))| {
                        let until = epochs.get(i + 1).map_or(u64::MAX, |e| e.0);
                        *since <= t && until > from
                    })
                    .map(|(_, (_, r))| r)
                    .collect();
                let same_period_moving = active.iter().all(|r| {
                    r.0 == Strategy::MovingWindow && r.1.iter().any(|q| q.0 == p)
                });
                let bound = if same_period_moving {
                    active
                        .iter()
                        .flat_map(|r| r.1.iter().filter(|q| q.0 == p).map(|q| u64::from(q.1)))
                        .max()
                        .unwrap_or(0)
                } else {
                    let own = active
                        .iter()
                        .map(|r| {
                            let limit_in = r.1.iter().find(|q| q.0 == p).map(|q| u64::from(q.1))
                                .or_else(|| r.1.iter().filter(|q| q.0 > p).min_by_key(|q| q.0).map(|q| u64::from(q.1)))
                                .or_else(|| r.1.iter().filter(|q| q.0 < p).map(|q| {
                                    u64::from(q.1) * (PERIODS[p].div_ceil(PERIODS[q.0]) + 1)
                                }).max())
                                .unwrap_or(0);
                            own_bound(r.0, limit_in)
                        })
                        .max()
                        .unwrap_or(0);
                    own + u64::from(limit)
                };
                prop_assert!(
                    admitted <= bound,
                    "at {t} ms under {current:?}: {admitted} admitted in the last {w} ms, bound \
                     {bound}; epochs {epochs:?}"
                );
            }
        }
    }
}

#[test]
fn threads_alternating_two_rules_on_one_key_count_it_once() {
    // Four threads, each switching between 10/hour and 12/hour on one key (the first rule packs
    // in memory, so its keys move to general entries while other threads still decide there):
    // never more than 12 admitted in the hour, and the whole 12.
    for strategy in Strategy::ALL {
        for round in 0..20 {
            let (limiter, _clock) = limiter(strategy, "10/hour");
            let other = rule(strategy, "12/hour");
            let admitted: u32 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|t| {
                        let (limiter, other) = (&limiter, &other);
                        s.spawn(move || {
                            (0..40u32)
                                .filter(|i| {
                                    let r = if (i + t) % 3 == 0 { None } else { Some(other) };
                                    limiter.apply_now(&"k", r, Op::Check(1)).is_allowed()
                                })
                                .count() as u32
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert!(
                (10..=12).contains(&admitted),
                "{strategy} round {round}: {admitted} admitted"
            );
        }
    }
}

/// A conversion that has to estimate (a fixed window's count becomes a moving window's log: the
/// entries are stamped now) is logged once per limit, naming it; an exact one is not logged.
#[test]
fn an_estimated_conversion_is_logged_once_per_limit_by_name() {
    let clock = ManualClock::new(START);
    let named = |name: &str, strategy: Strategy, quotas: &str| {
        RateLimiter::builder()
            .name(name)
            .strategy(strategy)
            .quotas(quotas)
            .unwrap()
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (paced, exact) = (
        named("paced", Strategy::FixedWindow, "10/hour"),
        named("exact", Strategy::MovingWindow, "5/minute"),
    );
    let (_, logs) = crate::logs::capturing(|| {
        let moving = Rule::parse(Strategy::MovingWindow, "10/hour").unwrap();
        for key in ["a", "b"] {
            for i in 0..7 {
                assert!(paced.check_now(&key, 1).is_allowed());
                assert_eq!(exact.check_now(&key, 1).is_allowed(), i < 5);
            }
            // 7 of 10 spent, proved by the count: the log starts with 7 entries stamped now.
            let d = paced.apply_now(&key, Some(&moving), Op::Check(1));
            assert_eq!(d.remaining(), 2, "{key}");
            // The minute's log covers the hour's spend: exact.
            assert_eq!(
                exact.apply_now(&key, Some(&moving), Op::Peek).remaining(),
                5
            );
        }
    });
    let text = logs.text();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("by an estimate"))
        .collect();
    assert_eq!(warned.len(), 1, "{text}");
    assert!(
        warned[0].contains("limit=\"paced\"") || warned[0].contains("limit=paced"),
        "{text}"
    );
}
