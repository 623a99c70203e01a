//! The configuration types written with serde read back as equal values: `Quota` (with its burst
//! when one was set), `Strategy`, `WindowOffset` and `Rule` (with its window offset), for
//! random values (proptest), through JSON.

use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
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
}
