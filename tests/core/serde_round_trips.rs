//! The configuration types written with serde read back as equal values: `Quota` (with its burst
//! when one was set), `Strategy`, `WindowOffset`, `Rule` (with its window offset) and a rules
//! file's `LimitSpec`, for random values (proptest), through JSON.

use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tollgate::rules::{LimitSpec, RulesFile};
use tollgate::{Quota, Rule, Strategy, WindowOffset};

use crate::oracle::config;

const REGRESSIONS: &str = "tests/core/serde_round_trips.proptest-regressions";

/// `value` written as JSON and read back.
fn round_trip<T: Serialize + DeserializeOwned>(value: &T) -> (String, T) {
    let json = serde_json::to_string(value).expect("serialises");
    let back = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
    (json, back)
}

fn arb_strategy() -> impl proptest::strategy::Strategy<Value = Strategy> {
    proptest::sample::select(Strategy::ALL.to_vec())
}

fn arb_quota() -> impl proptest::strategy::Strategy<Value = Quota> {
    let units = [
        1,
        1_000,
        1_000_000,
        1_000_000_000,
        60_000_000_000,
        3_600_000_000_000,
        86_400_000_000_000u64,
    ];
    (
        prop_oneof![1u32..20, 1u32..=u32::MAX],
        proptest::sample::select(units.to_vec()),
        prop_oneof![Just(1u64), 1u64..1000],
        proptest::option::of(prop_oneof![1u32..20, 1u32..=u32::MAX]),
    )
        .prop_filter_map(
            "a period up to the maximum",
            |(limit, unit, count, burst)| {
                let period = Duration::from_nanos(unit.checked_mul(count)?);
                (period <= Quota::MAX_PERIOD).then_some(())?;
                let q = Quota::new(NonZeroU32::new(limit)?, period).ok()?;
                Some(match burst.and_then(NonZeroU32::new) {
                    Some(b) => q.with_burst(b),
                    None => q,
                })
            },
        )
}

fn arb_offset() -> impl proptest::strategy::Strategy<Value = WindowOffset> {
    (-1439i32..=1439).prop_map(|m| WindowOffset::from_minutes(m).expect("under a day"))
}

fn has_windows(strategy: Strategy) -> bool {
    matches!(strategy, Strategy::FixedWindow | Strategy::SlidingWindow)
}

fn arb_rule() -> impl proptest::strategy::Strategy<Value = Rule> {
    (
        arb_strategy(),
        proptest::collection::vec(arb_quota(), 1..4),
        arb_offset(),
    )
        .prop_filter_map(
            "a rule the strategy can represent",
            |(strategy, quotas, offset)| {
                let rule = Rule::new(strategy, quotas).ok()?;
                Some(if has_windows(strategy) {
                    rule.with_window_offset(offset)
                } else {
                    rule
                })
            },
        )
}

/// A rules file's one limit, written as TOML with random fields and parsed (the values the file
/// refuses are left out).
fn arb_limit() -> impl proptest::strategy::Strategy<Value = LimitSpec> {
    let paths = [
        "/",
        "/login",
        "/api/*",
        "/users/{id}/posts",
        "/caf\u{e9} \"x\"\\y",
    ];
    let keys = ["ip", "global", "header:x-user", "ip+header:x-user"];
    (
        "[a-z][a-z0-9_-]{0,8}",
        proptest::option::of(proptest::sample::select(paths.to_vec())),
        proptest::option::of(proptest::sample::subsequence(
            vec!["GET", "post", "PUT"],
            1..3,
        )),
        proptest::option::of(proptest::sample::select(keys.to_vec())),
        proptest::option::of(proptest::sample::select(vec!["reject", "global"])),
        arb_strategy(),
        proptest::collection::vec(arb_quota(), 1..3),
        (proptest::option::of(1u32..100), 1u32..5, any::<bool>()),
        (arb_offset(), proptest::option::of(1u64..100_000)),
        (
            proptest::option::of(1u32..1000),
            proptest::option::of(proptest::sample::select(vec!["open", "closed", "local"])),
        ),
        (
            proptest::option::of(proptest::sample::select(vec!["marker", "header:x-used"])),
            proptest::option::of(proptest::collection::vec(arb_quota(), 1..3)),
        ),
    )
        .prop_filter_map(
            "a limit the file accepts",
            |(
                name,
                path,
                methods,
                key,
                missing,
                strategy,
                quotas,
                (burst, cost, shadow),
                (offset, queue),
                (concurrency, fail_mode),
                (settle, tiers),
            )| {
                let json = |s: &str| serde_json::to_string(s).expect("a string");
                let mut t = format!(
                    "[[limit]]\nname = {}\nstrategy = {}\n",
                    json(&name),
                    json(strategy.name())
                );
                let text: Vec<String> = quotas.iter().map(Quota::to_string).collect();
                t += &format!(
                    "quotas = {}\ncost = {cost}\nshadow = {shadow}\n",
                    json(&text.join("; "))
                );
                if let Some(p) = path {
                    t += &format!("path = {}\n", json(p));
                }
                if let Some(m) = methods {
                    let m: Vec<String> = m.iter().map(|m| json(m)).collect();
                    t += &format!("methods = [{}]\n", m.join(", "));
                }
                if let Some(k) = key {
                    t += &format!("key = {}\n", json(k));
                }
                if let Some(m) = missing {
                    t += &format!("on_missing_key = {}\n", json(m));
                }
                let queued = strategy == Strategy::LeakyBucket && quotas.len() == 1 && !shadow;
                match (queue, burst) {
                    (Some(q), _) if queued => t += &format!("queue_ms = {q}\n"),
                    (_, Some(b)) if strategy.is_bucket() => t += &format!("burst = {b}\n"),
                    _ => {}
                }
                if has_windows(strategy) {
                    t += &format!("window_offset = {}\n", json(&offset.to_string()));
                }
                if let Some(c) = concurrency.filter(|_| !shadow) {
                    t += &format!("concurrency = {c}\n");
                }
                if let Some(f) = fail_mode {
                    t += &format!("fail_mode = {}\n", json(f));
                }
                if let Some(s) = settle {
                    t += &format!("settle = {}\n", json(s));
                }
                if let Some(tiers) = tiers {
                    let items: Vec<String> = tiers
                        .iter()
                        .enumerate()
                        .map(|(i, q)| format!("t{i} = {}", json(&q.to_string())))
                        .collect();
                    t += &format!(
                        "tier = \"header:x-plan\"\ntiers = {{ {} }}\n",
                        items.join(", ")
                    );
                }
                RulesFile::parse(&t).ok()?.limits.into_iter().next()
            },
        )
}

proptest! {
    #![proptest_config(config(REGRESSIONS))]

    #[test]
    fn quotas_read_back_equal_with_their_burst(q in arb_quota()) {
        let (json, back) = round_trip(&q);
        prop_assert_eq!(back, q, "{}", json);
        prop_assert_eq!(json.contains("burst"), q.has_explicit_burst(), "{}", json);
    }

    #[test]
    fn strategies_and_window_offsets_read_back_equal(s in arb_strategy(), o in arb_offset()) {
        prop_assert_eq!(round_trip(&s).1, s);
        prop_assert_eq!(round_trip(&o).1, o);
    }

    #[test]
    fn rules_read_back_equal_with_their_window_offset(rule in arb_rule()) {
        let (json, back) = round_trip(&rule);
        prop_assert_eq!(back.window_offset(), rule.window_offset(), "{}", json);
        prop_assert_eq!(back, rule, "{}", json);
    }

    #[test]
    fn rules_file_limits_read_back_equal(limit in arb_limit()) {
        let (json, back) = round_trip(&limit);
        prop_assert_eq!(back, limit, "{}", json);
    }
}

#[test]
fn written_forms_are_the_notations_and_bad_values_are_refused() {
    let q: Quota = "10/minute".parse().unwrap();
    assert_eq!(serde_json::to_string(&q).unwrap(), r#""10/minute""#);
    let burst = q.with_burst(NonZeroU32::new(50).unwrap());
    assert_eq!(
        serde_json::to_string(&burst).unwrap(),
        r#"{"quota":"10/minute","burst":50}"#
    );
    // A burst set equal to the limit is written too: the value reads back equal.
    let same = q.with_burst(NonZeroU32::new(10).unwrap());
    assert_eq!(round_trip(&same).1, same);
    let o: WindowOffset = "-5h30m".parse().unwrap();
    assert_eq!(serde_json::to_string(&o).unwrap(), r#""-05:30""#);
    let rule = Rule::parse(Strategy::FixedWindow, "1/day")
        .unwrap()
        .with_window_offset(o);
    assert_eq!(
        serde_json::to_string(&rule).unwrap(),
        r#"{"strategy":"fixed-window","quotas":"1/day","window_offset":"-05:30"}"#
    );
    let utc = Rule::parse(Strategy::TokenBucket, "5/second; 100/minute").unwrap();
    assert_eq!(
        serde_json::to_string(&utc).unwrap(),
        r#"{"strategy":"token-bucket","quotas":"5/second; 100/minute"}"#
    );
    let refused = [
        (
            r#"{"strategy":"token-bucket","quotas":"1/s","window_offset":"+01:00"}"#,
            "no meaning",
        ),
        (
            r#"{"strategy":"fixed-window","quotas":"1/s","window_offset":"25h"}"#,
            "24 hours",
        ),
        (
            r#"{"strategy":"fixed-window","quotas":[{"quota":"1/s","burst":0}]}"#,
            "nonzero",
        ),
        (r#"{"quotas":"1/s","extra":1}"#, "extra"),
    ];
    for (json, why) in refused {
        let e = serde_json::from_str::<Rule>(json)
            .expect_err(json)
            .to_string();
        assert!(e.contains(why), "{json}: {e}");
    }
    // A limit reads back through the file's validation, and one the file cannot express is not
    // written.
    let e = serde_json::from_str::<LimitSpec>(
        r#"{"name":"a","quotas":"1/s","strategy":"fixed-window","burst":3}"#,
    )
    .expect_err("burst on a window")
    .to_string();
    assert!(e.contains("burst has no meaning"), "{e}");
    let mut limit = RulesFile::parse(
        "[[limit]]\nname = \"a\"\nstrategy = \"token-bucket\"\nquotas = \"1/s; 9/minute\"\n",
    )
    .unwrap()
    .limits
    .remove(0);
    let quotas = [
        "1/s"
            .parse::<Quota>()
            .unwrap()
            .with_burst(NonZeroU32::new(2).unwrap()),
        "9/minute".parse().unwrap(),
    ];
    limit.rule = Rule::new(Strategy::TokenBucket, quotas).unwrap();
    let e = serde_json::to_string(&limit)
        .expect_err("two bursts")
        .to_string();
    assert!(e.contains("one burst"), "{e}");
}
