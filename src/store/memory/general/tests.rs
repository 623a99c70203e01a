use super::*;

const S: u64 = 1_000_000_000;
const HOUR: u64 = 3_600 * S;

/// The strategies held as words when a rule has several quotas.
const WORD_STRATEGIES: [Strategy; 5] = [
    Strategy::FixedWindow,
    Strategy::FixedWindowFirstHit,
    Strategy::SlidingWindow,
    Strategy::TokenBucket,
    Strategy::LeakyBucket,
];

/// Whether `entry`'s first state holds one word per window quota.
fn one_word(entry: &Entry) -> bool {
    matches!(entry.state.quotas, States::Packed(..))
}

#[test]
fn window_quotas_take_one_word_each_when_their_layouts_pack() {
    for strategy in [Strategy::FixedWindow, Strategy::SlidingWindow] {
        let rule = Rule::parse(strategy, "10/60s; 20/120s; 30/180s").unwrap();
        let mut entry = Entry::new();
        entry.run(&rule, rule.tag(), Op::Check(1), 1_000 * S);
        let States::Packed(_, words) = &entry.state.quotas else {
            panic!("{strategy}: one word per quota");
        };
        assert_eq!(words.len(), 3, "{strategy}");
    }
    // Times on a ring (read relative to now, at most 1/8 of it ahead: a clock step back of
    // hours would lose them) keep the rule on two words per quota: first-hit starts, and
    // window indices too large to keep whole beside a large count.
    for (strategy, quotas) in [
        (Strategy::FixedWindowFirstHit, "10/s; 40/hour"),
        (Strategy::SlidingWindow, "4294967295/s; 100/minute"),
        (Strategy::FixedWindow, "4294967295/s; 100/minute"),
    ] {
        let rule = Rule::parse(strategy, quotas).unwrap();
        let mut entry = Entry::new();
        entry.run(&rule, rule.tag(), Op::Check(1), 1_000 * S);
        assert!(
            matches!(&entry.state.quotas, States::Words(_, w) if w.len() == 4),
            "{strategy} {quotas}"
        );
    }
    // Buckets keep their one-word TATs.
    let rule = Rule::parse(Strategy::TokenBucket, "10/s; 100/minute").unwrap();
    let mut entry = Entry::new();
    entry.run(&rule, rule.tag(), Op::Check(1), 1_000 * S);
    assert!(matches!(&entry.state.quotas, States::Words(_, w) if w.len() == 2));
}

#[test]
fn past_the_end_of_packed_time_a_key_goes_over_to_two_words_with_its_state() {
    let rule = Rule::parse(Strategy::SlidingWindow, "5/s; 8/10s").unwrap();
    let tag = rule.tag();
    let mut entry = Entry::new();
    let mut reference = vec![QuotaState::new(rule.strategy()); 2];
    let mut now = NOW_LIMIT - 3 * S;
    for i in 0..60 {
        now += S / 10;
        let got = entry.run(&rule, tag, Op::Check(1), now);
        let want = strategy::apply_settling(
            &mut reference,
            rule.strategy(),
            rule.nanos(),
            now,
            Op::Check(1),
        );
        assert_eq!(got, want, "step {i}");
        assert_eq!(one_word(&entry), now < NOW_LIMIT, "step {i}");
    }
    // A clock back below the end keeps the exact form.
    let got = entry.run(&rule, tag, Op::Peek, NOW_LIMIT - S);
    let want = strategy::apply_settling(
        &mut reference,
        rule.strategy(),
        rule.nanos(),
        NOW_LIMIT - S,
        Op::Peek,
    );
    assert_eq!(got, want);
    assert!(!one_word(&entry));
}

#[test]
fn one_word_states_are_looked_at_and_forgotten_as_two_word_ones() {
    let rule = Rule::parse(Strategy::FixedWindow, "3/s; 5/10s; 9/minute").unwrap();
    let tag = rule.tag();
    let rules = Rules::default();
    let sketch = Sketch::new(1_000);
    let mut entry = Entry::recalled(&rules, &sketch, 7, &rule, tag, 1_000 * S);
    let mut reference = vec![QuotaState::new(rule.strategy()); 3];
    let now = 1_000 * S + S / 2;
    entry.run(&rule, tag, Op::Check(2), now);
    strategy::apply_settling(
        &mut reference,
        rule.strategy(),
        rule.nanos(),
        now,
        Op::Check(2),
    );
    assert!(one_word(&entry));
    // The same entry held as two words per quota looks the same to eviction.
    let mut two = Entry::with_states(&rules, &rule, tag, reference.clone(), NOW_LIMIT);
    assert!(matches!(two.state.quotas, States::Words(..)));
    two.used = entry.used;
    assert_eq!(entry.look(&rules, now), two.look(&rules, now));
    assert!(!matches!(entry.look(&rules, now), Look::Fresh));
    // Forgotten and recalled: at least as spent.
    entry.forget(&rules, 7, now, &sketch);
    let mut back = Entry::recalled(&rules, &sketch, 7, &rule, tag, now + 1);
    let (_, v, _) = back.run(&rule, tag, Op::Peek, now + 1);
    assert!(v.remaining <= 1, "{v:?}");
}

/// A rule of `strategy` from proptest's `(limit, bits, raw)` triples: periods from 1 ms to
/// about 9 hours (`1 + raw mod 2^bits` ms), spread over their orders of magnitude; and its text.
fn random_rule(strategy: Strategy, quotas: &[(u64, u32, u64)]) -> Option<(Rule, String)> {
    let text: Vec<String> = quotas
        .iter()
        .map(|&(limit, bits, raw)| format!("{limit}/{}ms", 1 + raw % (1 << bits)))
        .collect();
    let text = text.join("; ");
    Rule::parse(strategy, &text).ok().map(|rule| (rule, text))
}

proptest::proptest! {
    /// Several window or bucket quotas held one word each (while they fit, below the end of
    /// packed time) answer every check, peek, settlement and reset as the pure arithmetic on
    /// the strategy's states, under clock steps back and across the end of packed time.
    #[test]
    fn one_word_quotas_answer_as_the_pure_arithmetic(
        which in 0usize..5,
        quotas in proptest::collection::vec((1u64..40_000, 0u32..26, 0u64..=u64::MAX), 2..6),
        near_end in proptest::bool::ANY,
        start in 0u64..NOW_LIMIT / 2,
        steps in proptest::collection::vec((0u64..=u64::MAX, 0u8..12, 0u64..=u64::MAX), 1..80),
    ) {
        let strategy = WORD_STRATEGIES[which];
        let Some((rule, _)) = random_rule(strategy, &quotas) else {
            return Ok(());
        };
        let tag = rule.tag();
        let params = rule.nanos();
        let longest = params.iter().map(|p| p.window).max().unwrap_or(1);
        let least = params.iter().map(|p| p.limit).min().unwrap_or(1);
        let mut entry = Entry::new();
        let mut reference = vec![QuotaState::new(strategy); params.len()];
        let mut now = if near_end { NOW_LIMIT - start % (4 * longest) } else { start };
        let mut latest = now;
        for (i, &(dt, kind, x)) in steps.iter().enumerate() {
            now = match kind {
                // Back, to within five hours of the latest time seen (a ring reads six ahead).
                0 => now.saturating_sub(dt % (5 * HOUR)).max(latest.saturating_sub(5 * HOUR)),
                // A long idle gap, within what a ring reads back (7/8 of two days at least).
                1 => now + dt % (30 * HOUR),
                _ => now + dt % (longest / 4 + 1),
            };
            latest = latest.max(now);
            let op = match kind {
                2 => Op::Settle {
                    reserved: (x % 3) as u32 + 1,
                    actual: (x % 3) as u32,
                    at: now.saturating_sub(x % longest), bound: 0,
                },
                3 => Op::Peek,
                4 if x % 7 == 0 => Op::Reset,
                _ => Op::Check((x % (least + 2)) as u32),
            };
            let got = entry.run(&rule, tag, op, now);
            let want = strategy::apply_settling(&mut reference, strategy, params, now, op);
            proptest::prop_assert_eq!(got, want, "step {} {:?} at {}", i, op, now);
            if let States::Packed(_, words) = &entry.state.quotas {
                proptest::prop_assert!(now < NOW_LIMIT);
                // A window with no count may be held as a new key's, whatever its start (as
                // in a packed table): then so is the reference's.
                let layouts = quota_words(&rule).unwrap_or_default();
                for (((s, p), l), w) in reference.iter_mut().zip(params).zip(layouts).zip(words) {
                    if s.fresh_at(p) == 0 {
                        *s = l.unpack(*w, now);
                    }
                }
            }
            proptest::prop_assert_eq!(entry.state.fresh_at, fresh_at_of(&reference, params));
        }
    }

    /// Sliding windows of limits whose one-quota layout rounds the previous count up (and keeps
    /// its window index on a ring) never admit more than the pure arithmetic (the reference
    /// follows what the entry admitted): such quotas keep two words each, exact.
    #[test]
    fn rounded_one_word_quotas_are_never_more_lenient(
        steps in proptest::collection::vec((0u64..=u64::MAX, 0u64..=u64::MAX), 1..200),
    ) {
        let strategy = Strategy::SlidingWindow;
        let rule = Rule::parse(strategy, "4294967295/s; 4294967295/2s; 100/minute").unwrap();
        let tag = rule.tag();
        let mut entry = Entry::new();
        let mut reference = vec![QuotaState::new(strategy); 3];
        let mut now = 1_700_000_000 * S;
        for (i, &(dt, x)) in steps.iter().enumerate() {
            now += dt % (S / 2);
            let op = match x % 11 {
                0 => Op::Settle { reserved: 1 << 20, actual: 0, at: now, bound: 0 },
                1 => Op::Peek,
                2 => Op::Check(1),
                _ => Op::Check((x >> 33) as u32),
            };
            let got = entry.run(&rule, tag, op, now).1;
            let mut trial = reference.clone();
            let (_, want, _) = strategy::apply_settling(&mut trial, strategy, rule.nanos(), now, op);
            proptest::prop_assert!(got.remaining <= want.remaining, "step {}", i);
            match (op, got.outcome) {
                (Op::Settle { .. }, _) => reference = trial,
                (Op::Check(_), Outcome::Allowed) => {
                    proptest::prop_assert_eq!(want.outcome, Outcome::Allowed, "step {}", i);
                    reference = trial;
                }
                _ => {}
            }
            proptest::prop_assert!(!one_word(&entry), "a ring layout keeps two words");
        }
    }
}

#[test]
fn moving_window_quotas_share_one_log_and_split_when_they_must() {
    // 16 quotas (10i per 60i s): checks and prompt refunds stay on one log, answering as the
    // pure arithmetic on per-quota logs; a clock step back splits the log, and the per-quota
    // logs become one again once empty.
    let text: Vec<String> = (1..=16)
        .map(|i| format!("{}/{}s", 10 * i, 60 * i))
        .collect();
    let rule = Rule::parse(Strategy::MovingWindow, &text.join("; ")).unwrap();
    let tag = rule.tag();
    let mut entry = Entry::new();
    let mut reference = vec![QuotaState::new(Strategy::MovingWindow); 16];
    let mut now = 1_000 * S;
    let mut step = |entry: &mut Entry, now: u64, op: Op| {
        let got = entry.run(&rule, tag, op, now);
        let want = strategy::apply_settling(&mut reference, rule.strategy(), rule.nanos(), now, op);
        assert_eq!(got, want, "{op:?} at {now}");
    };
    for i in 0..600u64 {
        now += 170_000_000;
        let op = match i % 4 {
            0 => Op::Settle {
                reserved: 1,
                actual: 0,
                at: now - 170_000_000,
                bound: 0,
            },
            _ => Op::Check(1),
        };
        step(&mut entry, now, op);
        assert!(matches!(entry.state.quotas, States::Shared(_)), "step {i}");
    }
    step(&mut entry, now - S, Op::Check(1));
    assert!(matches!(entry.state.quotas, States::Many(_)));
    // Every log empty after the longest period: one log again.
    now += 961 * S;
    step(&mut entry, now, Op::Peek);
    step(&mut entry, now + 1, Op::Check(1));
    assert!(matches!(entry.state.quotas, States::Shared(_)));
}

// Review (r1): tests written to probe the one-word quotas.

#[test]
fn one_word_ring_quotas_keep_their_count_when_the_clock_steps_back_ten_hours() {
    // Two sliding-window quotas whose one-word layouts store the bucket on a ring of 2^18
    // (72.8 h) windows, read up to 1/8 ahead (9.1 h). Two words per quota (and the pure
    // arithmetic) keep the full window when the clock steps back 10 h; one word per quota
    // reads the bucket as 62.8 h old and forgets it.
    let strategy = Strategy::SlidingWindow;
    let rule = Rule::parse(strategy, "4294967295/s; 4294967295/2s").unwrap();
    let tag = rule.tag();
    let mut entry = Entry::new();
    let mut reference = vec![QuotaState::new(strategy); 2];
    let t0 = 1_700_000_000 * S;
    for (now, op) in [
        (t0 + 10 * HOUR, Op::Check(u32::MAX)),
        (t0, Op::Check(1)),
        (t0, Op::Check(u32::MAX)),
    ] {
        let got = entry.run(&rule, tag, op, now);
        let want = strategy::apply_settling(&mut reference, strategy, rule.nanos(), now, op);
        assert_eq!(got.1.outcome, want.1.outcome, "{op:?} at {now}");
    }
}

proptest::proptest! {
    /// Under large clock jumps (forward up to 10 days, back up to 5 hours) several one-word
    /// window quotas never admit a check the pure arithmetic (following what the entry
    /// admitted) would reject.
    #[test]
    fn one_word_quotas_are_never_more_lenient_under_large_clock_jumps(
        which in 0usize..3,
        quotas in proptest::collection::vec((1u64..=u64::from(u32::MAX), 0u32..26, 0u64..=u64::MAX), 2..5),
        start in 0u64..NOW_LIMIT / 2,
        steps in proptest::collection::vec((0u64..=u64::MAX, 0u8..10, 0u64..=u64::MAX), 1..60),
    ) {
        let strategy = WORD_STRATEGIES[which];
        let Some((rule, text)) = random_rule(strategy, &quotas) else {
            return Ok(());
        };
        let tag = rule.tag();
        let params = rule.nanos();
        let least = params.iter().map(|p| p.limit).min().unwrap_or(1);
        let mut entry = Entry::new();
        let mut reference = vec![QuotaState::new(strategy); params.len()];
        let mut now = start;
        let mut latest = now;
        for (i, &(dt, kind, x)) in steps.iter().enumerate() {
            now = match kind {
                // Back, to within five hours of the latest time seen (a ring reads 1/8 of
                // itself ahead, six hours at least): further back, see the test above.
                0 => now.saturating_sub(dt % (5 * HOUR)).max(latest.saturating_sub(5 * HOUR)),
                // Forward up to ten days: past 7/8 of the smallest rings.
                1 => now + dt % (240 * HOUR),
                _ => now + dt % (HOUR / 4 + 1),
            };
            latest = latest.max(now);
            let op = Op::Check((x % (least + 2)) as u32);
            let got = entry.run(&rule, tag, op, now).1;
            let mut trial = reference.clone();
            let (_, want, _) = strategy::apply_settling(&mut trial, strategy, params, now, op);
            if got.outcome == Outcome::Allowed {
                proptest::prop_assert_eq!(
                    want.outcome,
                    Outcome::Allowed,
                    "step {} {:?} at {} ({})",
                    i,
                    op,
                    now,
                    text
                );
                reference = trial;
            } else if want.outcome != Outcome::Allowed {
                // Both rejected: the arithmetic's own state after the rejection (a rejected
                // check may still move a window to now's).
                reference = trial;
            }
            // A window with no count may be held as a new key's, whatever its start (as in a
            // packed table, and in the test above): so is the reference's.
            if let States::Packed(_, words) = &entry.state.quotas {
                let layouts = quota_words(&rule).unwrap_or_default();
                for (((s, p), l), w) in reference.iter_mut().zip(params).zip(layouts).zip(words) {
                    if s.fresh_at(p) == 0 {
                        *s = l.unpack(*w, now);
                    }
                }
            }
        }
    }
}

proptest::proptest! {
    /// Several one-word window quotas are never more lenient than the pure arithmetic (which
    /// follows what the entry admitted) under the operations
    /// `one_word_quotas_answer_as_the_pure_arithmetic` leaves out: charges above a reservation
    /// (`actual > reserved`), settlements of any earlier time, costs up to past the largest
    /// limit, cost 0 (the clock forward only, up to 30 h at once). Exact equality
    /// does not hold: a rounded previous count is stricter, and a word left as it was after a
    /// request that spent nothing may answer a reset time a nanosecond apart.
    #[test]
    fn one_word_quotas_answer_over_charges_and_large_costs_as_the_pure_arithmetic(
        which in 0usize..3,
        quotas in proptest::collection::vec((1u64..=u64::from(u32::MAX), 0u32..26, 0u64..=u64::MAX), 2..5),
        start in 0u64..NOW_LIMIT / 2,
        steps in proptest::collection::vec((0u64..=u64::MAX, 0u8..10, 0u64..=u64::MAX, 0u64..=u64::MAX), 1..60),
    ) {
        let strategy = WORD_STRATEGIES[which];
        let Some((rule, text)) = random_rule(strategy, &quotas) else {
            return Ok(());
        };
        let tag = rule.tag();
        let params = rule.nanos();
        let longest = params.iter().map(|p| p.window).max().unwrap_or(1);
        let most = params.iter().map(|p| p.limit).max().unwrap_or(1);
        let mut entry = Entry::new();
        let mut reference = vec![QuotaState::new(strategy); params.len()];
        let mut now = start;
        for (i, &(dt, kind, x, y)) in steps.iter().enumerate() {
            now = match kind {
                // No step back: behind a state's time the arithmetic clamps to it, which a
                // word left as it was (a rounding layout) does not (answers a unit apart).
                0 => now + dt % 3,
                1 => now + dt % (30 * HOUR),
                _ => now + dt % (longest / 4 + 1),
            };
            let cost = |v: u64| u32::try_from(v % (most + 2)).unwrap_or(u32::MAX);
            let op = match kind {
                2 | 3 => Op::Settle {
                    reserved: cost(x),
                    actual: cost(y),
                    at: now.saturating_sub(y % (2 * longest)), bound: 0,
                },
                4 => Op::Peek,
                5 => Op::Check(0),
                _ => Op::Check(cost(x)),
            };
            let got = entry.run(&rule, tag, op, now).1;
            let mut trial = reference.clone();
            let (_, want, _) = strategy::apply_settling(&mut trial, strategy, params, now, op);
            let what = format!("step {i} {op:?} at {now} ({text}): {got:?} vs {want:?}");
            // (Different reported quotas, after a stricter rejection say, are not compared.)
            if matches!(op, Op::Check(_) | Op::Peek) && got.outcome == want.outcome && got.limit == want.limit {
                proptest::prop_assert!(got.remaining <= want.remaining, "{}", what);
            }
            match op {
                Op::Check(_) if got.outcome == Outcome::Allowed => {
                    proptest::prop_assert_eq!(want.outcome, Outcome::Allowed, "{}", what);
                    reference = trial;
                }
                // Rejected by both: the windows rolled to `now` as in the entry.
                Op::Check(_) if want.outcome != Outcome::Allowed => reference = trial,
                // Rejected by the entry only (stricter): rolled, nothing counted.
                Op::Check(_) => {
                    strategy::apply_settling(&mut reference, strategy, params, now, Op::Check(0));
                }
                _ => reference = trial,
            }
            if let States::Packed(_, words) = &entry.state.quotas {
                let layouts = quota_words(&rule).unwrap_or_default();
                for (((s, p), l), w) in reference.iter_mut().zip(params).zip(layouts).zip(words) {
                    let held = l.unpack(*w, now);
                    // A window with no count may be held as a new key's, whatever its start
                    // (as in a packed table); a word left as it was after a request that spent
                    // nothing (a rounding layout) may hold an older, spent-out window instead.
                    if s.fresh_at(p) == 0 && is_new(&held, p, now) {
                        *s = if held.fresh_at(p) == 0 { held } else { QuotaState::new(strategy) };
                    }
                }
            }
        }
    }
}

#[test]
fn a_clone_with_another_offset_does_not_reuse_the_cached_layouts() {
    // The layouts cached in a rule (`QuotaWords`) are cloned with it: a clone given a window
    // offset must not hold its keys in the UTC-aligned one-word layouts.
    use crate::offset::WindowOffset;
    let rule = Rule::parse(Strategy::FixedWindow, "10/hour; 100/day").unwrap();
    assert!(quota_words(&rule).is_some());
    let shifted = rule
        .clone()
        .with_window_offset(WindowOffset::from_minutes(30).unwrap());
    assert_ne!(rule, shifted);
    assert!(quota_words(&shifted).is_none());
    let mut entry = Entry::new();
    let mut reference = vec![QuotaState::new(shifted.strategy()); 2];
    // Ten at 00:40 fill the hour window 00:30-01:30: rejected at 01:10, admitted at 01:31.
    let day = 20_000 * 24 * HOUR;
    for (now, op) in [
        (day + 40 * 60 * S, Op::Check(10)),
        (day + 70 * 60 * S, Op::Check(1)),
        (day + 91 * 60 * S, Op::Check(1)),
    ] {
        let got = entry.run(&shifted, shifted.tag(), op, now);
        let want =
            strategy::apply_settling(&mut reference, shifted.strategy(), shifted.nanos(), now, op);
        assert_eq!(got, want, "{op:?} at {now}");
    }
    assert!(!one_word(&entry));
    // The clone with the same fields shares the cache and its answers.
    assert_eq!(rule.clone(), rule);
}
