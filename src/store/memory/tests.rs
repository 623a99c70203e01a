use super::sweep::ROTATION;
use super::table::{KEYS_PER_SEGMENT, SEGMENTS, Spread};
use super::*;
use crate::strategy::{self, Strategy};

const S: u64 = 1_000_000_000;

#[test]
fn idle_keys_are_swept_and_memory_returned() {
    let store = MemoryStore::<u64>::new();
    let rule = Rule::parse(Strategy::FixedWindow, "10/s").unwrap();
    for k in 0..10_000 {
        store.decide(&k, &rule, Op::Check(1), 100 * S);
    }
    assert_eq!(store.len(), 10_000);
    store.sweep_all(101 * S - 1);
    assert_eq!(store.len(), 10_000, "still inside the window");
    store.sweep_all(101 * S);
    assert_eq!(store.len(), 0);
    let capacity: usize = store
        .packed
        .iter()
        .filter_map(OnceLock::get)
        .map(Table::capacity)
        .sum();
    assert!(capacity < 64 * 1024, "{capacity}");
}

#[test]
fn regression_a_sweep_at_the_end_of_time_kept_blocked_keys() {
    // Bug (found by the core tests): at now == u64::MAX a state whose fresh_at saturated to
    // u64::MAX was swept as fresh, so `sweep()` reset a blocked key.
    for strategy in [
        Strategy::FixedWindow,
        Strategy::FixedWindowFirstHit,
        Strategy::MovingWindow,
        Strategy::SlidingWindow,
    ] {
        let rule = Rule::parse(strategy, "1/second").unwrap();
        let store = MemoryStore::<u64>::new();
        assert!(
            store.decide(&7, &rule, Op::Check(1), u64::MAX).is_allowed(),
            "{strategy}"
        );
        assert!(
            !store.decide(&7, &rule, Op::Check(1), u64::MAX).is_allowed(),
            "{strategy}"
        );
        store.sweep_all(u64::MAX);
        assert!(
            !store.decide(&7, &rule, Op::Check(1), u64::MAX).is_allowed(),
            "{strategy}"
        );
    }
}

#[test]
fn packed_states_and_the_blocked_cache_decide_as_the_general_path() {
    for strategy in Strategy::ALL {
        let rule = Rule::parse(strategy, "5/s").unwrap();
        let store = MemoryStore::<u64>::new();
        let mut reference = vec![crate::strategy::QuotaState::new(strategy)];
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut now = 1_000 * S;
        for i in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now += x % (S / 4);
            let op = match i % 7 {
                0 if i % 3 == 0 => Op::Settle {
                    reserved: 1,
                    actual: 0,
                    at: now,
                    bound: 0,
                },
                0 if i % 97 == 0 => Op::Reset,
                1 => Op::Peek,
                2 => Op::Check(u32::try_from(x % 7).unwrap()),
                _ => Op::Check(1),
            };
            let got = store.decide(&7, &rule, op, now);
            let (index, v) = strategy::apply(&mut reference, strategy, rule.nanos(), now, op);
            assert_eq!(
                got,
                to_decision(index, v, now, 1).answering(op),
                "{strategy} step {i}"
            );
        }
    }
}

#[test]
fn multi_quota_states_held_as_words_decide_as_the_pure_arithmetic() {
    for strategy in Strategy::ALL {
        let rule = Rule::parse(strategy, "3/s; 7/10s; 20/minute; 100000/hour").unwrap();
        let store = MemoryStore::<u64>::new();
        let mut reference = vec![vec![crate::strategy::QuotaState::new(strategy); 4]; 3];
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut now = 1_000 * S;
        for i in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now += x % (S / 3);
            let op = match i % 9 {
                0 => Op::Settle {
                    reserved: 1,
                    actual: 0,
                    at: now,
                    bound: 0,
                },
                1 => Op::Peek,
                2 => Op::Check(u32::try_from(x % 5).unwrap()),
                3 if i % 7 == 0 => Op::Settle {
                    reserved: 1,
                    actual: 2,
                    at: now - x % S,
                    bound: 0,
                },
                _ => Op::Check(1),
            };
            let key = x % 3;
            let got = store.decide(&key, &rule, op, now);
            let states = &mut reference[key as usize];
            let (index, v) = strategy::apply(states, strategy, rule.nanos(), now, op);
            assert_eq!(
                got,
                to_decision(index, v, now, 1).answering(op),
                "{strategy} step {i}"
            );
        }
    }
}

#[test]
fn an_evicted_key_back_under_its_second_rule_is_as_spent_as_it_left() {
    for strategy in [Strategy::MovingWindow, Strategy::FixedWindowFirstHit] {
        let a = Rule::parse(strategy, "10/hour").unwrap();
        let b = Rule::parse(strategy, "10/2hours").unwrap();
        let store = MemoryStore::<u64>::builder().max_keys(1).build();
        // Two limiters (names "a" and "b") on one key.
        let (ta, tb) = (Scope::new("a", &a).tag(), Scope::new("b", &b).tag());
        let now = 3_600 * S;
        assert!(store.decide_in(&1, &a, ta, Op::Check(1), now).is_allowed());
        assert!(store.decide_in(&1, &b, tb, Op::Check(9), now).is_allowed());
        // Key 2 evicts key 1 (the cap is 1), which comes back under rule a, then under b.
        assert!(
            store
                .decide_in(&2, &a, ta, Op::Check(1), now + S)
                .is_allowed()
        );
        assert!(store.stats().evictions >= 1, "{strategy}");
        let d = store.decide_in(&1, &a, ta, Op::Check(1), now + 2 * S);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 8), "{strategy}");
        let d = store.decide_in(&1, &b, tb, Op::Check(1), now + 3 * S);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 0), "{strategy}");
        assert!(
            !store
                .decide_in(&1, &b, tb, Op::Check(1), now + 4 * S)
                .is_allowed()
        );
    }
}

#[test]
fn a_key_handed_over_at_the_end_of_packed_time_keeps_its_state_when_the_clock_steps_back() {
    // Review: a key moved to a general entry at 2^62 ns, asked again after the clock stepped
    // back below that instant, started afresh in its packed table (N more admissions).
    for strategy in [
        Strategy::FixedWindow,
        Strategy::SlidingWindow,
        Strategy::TokenBucket,
        Strategy::LeakyBucket,
    ] {
        for quota in ["5/s", "100/hour"] {
            let rule = Rule::parse(strategy, quota).unwrap();
            let store = MemoryStore::<u64>::new();
            // The same walk 10^4 hours earlier, on packed state throughout (the windows
            // align to whole hours, so the answers are the same).
            let reference = MemoryStore::<u64>::new();
            let shift = 10_000 * 3600 * S;
            let mut now = NOW_LIMIT - S;
            let (mut below, mut above) = (false, false);
            let mut x = 0x9e37_79b9_7f4a_7c15_u64;
            for i in 0..600 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Forward, and back to up to half a second below 2^62 once past it by half
                // a second: across that instant both ways, again and again.
                now = if now > NOW_LIMIT + S / 2 && x % 4 == 0 {
                    NOW_LIMIT - x % (S / 2)
                } else {
                    now + x % (S / 10)
                };
                below |= now < NOW_LIMIT && above;
                above |= now >= NOW_LIMIT;
                let key = x % 2;
                let op = if i % 17 == 0 {
                    Op::Peek
                } else {
                    Op::Check(1 + (x % 3) as u32)
                };
                let got = store.decide(&key, &rule, op, now);
                let want = reference.decide(&key, &rule, op, now - shift);
                // What is admitted and left; the times may differ while the clock is behind
                // a state's own time (packed and general states read a past `now` apart).
                let parts = |d: &Decision| (d.outcome(), d.remaining());
                assert_eq!(
                    parts(&got),
                    parts(&want),
                    "{strategy} {quota} step {i} at {now}"
                );
            }
            assert!(
                below,
                "{strategy} {quota}: the walk never stepped back below 2^62"
            );
        }
    }
}

#[test]
fn at_the_end_of_packed_time_keys_carry_their_state_over() {
    // Across 2^62 ns packed keys move to general entries with their state: the decisions are
    // the pure arithmetic's on one state throughout (before: N more admissions at that instant).
    for strategy in [
        Strategy::FixedWindow,
        Strategy::SlidingWindow,
        Strategy::TokenBucket,
        Strategy::LeakyBucket,
    ] {
        for quota in ["5/s", "100/hour"] {
            let rule = Rule::parse(strategy, quota).unwrap();
            let store = MemoryStore::<u64>::new();
            let mut reference = [
                vec![crate::strategy::QuotaState::new(strategy)],
                vec![crate::strategy::QuotaState::new(strategy)],
            ];
            let mut now = NOW_LIMIT - S;
            let mut x = 0x2545_f491_4f6c_dd1d_u64;
            for i in 0..400 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                now += x % (S / 100);
                let key = x % 2;
                let op = if i % 17 == 0 {
                    Op::Peek
                } else {
                    Op::Check(1 + (x % 3) as u32)
                };
                let got = store.decide(&key, &rule, op, now);
                let states = &mut reference[key as usize];
                let (index, v) = strategy::apply(states, strategy, rule.nanos(), now, op);
                assert_eq!(
                    got,
                    to_decision(index, v, now, 1).answering(op),
                    "{strategy} {quota} step {i}"
                );
            }
            assert!(now > NOW_LIMIT, "{now}");
            assert!(store.len() <= 2);
        }
    }
}

#[test]
fn regression_a_blocked_state_under_a_second_rule_survives_the_first_rule_expiring() {
    // Review: with the first rule's state fresh, a call under a second rule took the first
    // slot with a new state instead of finding its own (blocked) state among the others.
    let a = Rule::parse(Strategy::MovingWindow, "100/s").unwrap();
    let b = Rule::parse(Strategy::MovingWindow, "5/hour").unwrap();
    let store = MemoryStore::<u64>::new();
    // Two limiters (names "a" and "b") on one key.
    let at = |rule: &Rule, name: &str, t: u64| {
        store.decide_in(&1, rule, Scope::new(name, rule).tag(), Op::Check(1), t)
    };
    assert!(at(&a, "a", 100 * S).is_allowed());
    for _ in 0..5 {
        assert!(at(&b, "b", 100 * S).is_allowed());
    }
    assert!(!at(&b, "b", 100 * S).is_allowed());
    // Rule a's state is fresh from 101 s on; rule b's key stays blocked.
    assert!(!at(&b, "b", 102 * S).is_allowed());
    assert!(at(&a, "a", 102 * S).is_allowed());
    assert!(!at(&b, "b", 103 * S).is_allowed());
}

#[test]
fn regression_at_the_cap_a_new_rule_takes_room_from_another_rules_table() {
    // Review: making room looked for a key to evict only in the new key's own (empty) table,
    // then sent every new key of the new rule to the overflow quota for good.
    let busy = Rule::parse(Strategy::FixedWindow, "1000/s").unwrap();
    let login = Rule::parse(Strategy::TokenBucket, "5/minute").unwrap();
    let store = MemoryStore::<u64>::builder().max_keys(100).build();
    let now = 100 * S;
    for round in 0..300u64 {
        for k in 0..100 {
            store.decide(&k, &busy, Op::Check(1), now);
        }
        let d = store.decide(&(1_000 + round), &login, Op::Check(1), now);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 4), "round {round}");
    }
    assert_eq!(store.stats().overflow_hits, 0);
    assert!(store.len() <= 101);
}

#[test]
fn after_the_clock_went_back_a_cached_rejection_answers_for_its_time() {
    // 5/s fixed window: blocked in [100 s, 101 s), a new window at 101 s, then the clock goes
    // back to 100.5 s. The map's state clamps that time to its window (101 s) and would admit;
    // the cache answers for 100.5 s, when the key was blocked. Either order of the two calls is
    // a valid history, and the cache never admits what the state would not.
    let rule = Rule::parse(Strategy::FixedWindow, "5/s").unwrap();
    let store = MemoryStore::<u64>::new();
    for _ in 0..5 {
        assert!(store.decide(&1, &rule, Op::Check(1), 100 * S).is_allowed());
    }
    let blocked = store.decide(&1, &rule, Op::Check(1), 100 * S);
    assert_eq!(
        blocked.retry_after(),
        Some(std::time::Duration::from_secs(1))
    );
    assert!(store.decide(&1, &rule, Op::Check(1), 101 * S).is_allowed());
    let back = store.decide(&1, &rule, Op::Check(1), 100 * S + S / 2);
    assert!(!back.is_allowed());
    assert_eq!(
        back.retry_after(),
        Some(std::time::Duration::from_millis(500))
    );
    // A refund gives room back: nothing cached survives it.
    store.decide(
        &1,
        &rule,
        Op::Settle {
            reserved: 1,
            actual: 0,
            at: 100 * S,
            bound: 0,
        },
        101 * S,
    );
    assert!(
        store
            .decide(&1, &rule, Op::Check(1), 100 * S + S / 2)
            .is_allowed()
    );
}

#[test]
fn traffic_alone_sweeps_idle_keys_within_a_rotation() {
    let store = MemoryStore::<u64>::new();
    let rule = Rule::parse(Strategy::TokenBucket, "10/s").unwrap();
    let mut now = 100 * S;
    for k in 0..5_000 {
        store.decide(&k, &rule, Op::Check(1), now);
    }
    let held = store.len();
    assert!(held > 4_000, "inserts sweep only expired keys: {held}");
    // One hot key's traffic for one rotation (8 s) frees every idle key.
    let segments = store.spread.count();
    let step_every = store.pacing.0.step_every;
    assert_eq!(segments as u64 * step_every, ROTATION);
    for _ in 0..2 * segments {
        now += step_every;
        store.decide(&u64::MAX, &rule, Op::Check(1), now);
    }
    assert_eq!(store.len(), 1);
    // A clock that went back does not stop the sweeping.
    store.decide(&1, &rule, Op::Check(1), now);
    now -= 4 * S;
    for _ in 0..2 * segments {
        now += step_every;
        store.decide(&u64::MAX, &rule, Op::Check(1), now);
    }
    assert_eq!(store.len(), 1, "key 1 was swept after the step back");
}

#[test]
fn a_hinted_call_decides_as_an_unhinted_one_on_packed_and_general_tables() {
    // Five packable rules on one store: four get packed tables, the fifth general entries.
    // Each rule's hint is learnt on its first call and answers like the matching search.
    let rules: Vec<Rule> = (1..=5)
        .map(|n| Rule::parse(Strategy::FixedWindow, &format!("{n}/s")).unwrap())
        .collect();
    let hinted = MemoryStore::<u64>::new();
    let plain = MemoryStore::<u64>::new();
    let hints: Vec<TableHint> = rules.iter().map(|_| TableHint::default()).collect();
    for step in 0..40u64 {
        for (rule, hint) in rules.iter().zip(&hints) {
            let now = 100 * S + step * (S / 8);
            let key = step % 3;
            let a = hinted.decide_hinted(hint, &key, rule, rule.tag(), Op::Check(1), now);
            let b = plain.decide(&key, rule, Op::Check(1), now);
            assert_eq!(a, b, "{rule:?} step {step}");
        }
    }
    let learnt: Vec<u8> = hints.iter().map(|h| h.0.load(Ordering::Relaxed)).collect();
    assert_eq!(learnt, [1, 2, 3, 4, TableHint::GENERAL]);
}

#[test]
fn peeking_an_unknown_key_holds_nothing() {
    let store = MemoryStore::<u64>::new();
    let rule = Rule::parse(Strategy::TokenBucket, "10/s").unwrap();
    let d = store.decide(&1, &rule, Op::Peek, S);
    assert_eq!((d.is_allowed(), d.remaining()), (true, 10));
    assert!(store.is_empty());
}

#[test]
fn the_cap_never_evicts_a_blocked_key() {
    let store = MemoryStore::<u64>::builder().max_keys(100).build();
    let rule = Rule::parse(Strategy::FixedWindow, "2/hour").unwrap();
    let now = 3600 * S;
    for _ in 0..3 {
        store.decide(&0, &rule, Op::Check(1), now);
    }
    for k in 1..10_000 {
        store.decide(&k, &rule, Op::Check(1), now);
        assert!(store.len() <= 101);
    }
    assert!(
        !store.decide(&0, &rule, Op::Check(1), now).is_allowed(),
        "still blocked"
    );
    assert!(store.stats().evictions > 0);
}

#[test]
fn when_every_key_is_blocked_new_keys_share_the_overflow_quota() {
    let store = MemoryStore::<u64>::builder().max_keys(10).build();
    let rule = Rule::parse(Strategy::FixedWindow, "1/hour").unwrap();
    let now = 3600 * S;
    for k in 0..10 {
        assert!(store.decide(&k, &rule, Op::Check(1), now).is_allowed());
    }
    assert!(
        store.decide(&100, &rule, Op::Check(1), now).is_allowed(),
        "overflow quota's one"
    );
    assert!(!store.decide(&101, &rule, Op::Check(1), now).is_allowed());
    assert_eq!(store.stats().overflow_hits, 2);
    for k in 0..10 {
        assert!(
            !store.decide(&k, &rule, Op::Check(1), now).is_allowed(),
            "key {k} was not reset"
        );
    }
}

#[test]
fn keys_back_after_a_forward_jump_past_seven_eighths_of_a_ring_are_not_locked_out() {
    // Review (r1): a sliding window of 10^7/s (a byte rate, say) stores its bucket on a ring of
    // 2^18 one-second windows (72.8 h), read up to 7/8 behind (63.7 h). After a forward jump of 70 h (a VM
    // resumed, a store idle that long) a saturated key's bucket reads 2.8 h AHEAD: the key is
    // rejected for 2.8 h, not "a window or two". One quota: the packed table (as before this
    // change); two quotas: the general entry's one-word states (new: they were exact).
    let t0 = 1_700_000_000 * S;
    let later = t0 + 70 * 3_600 * S;
    let mut failures = Vec::new();
    for quotas in ["10000000/s", "10000000/s; 20000000/minute"] {
        let rule = Rule::parse(Strategy::SlidingWindow, quotas).unwrap();
        let store = MemoryStore::<u64>::new();
        for key in 0..64 {
            assert!(
                store
                    .decide(&key, &rule, Op::Check(10_000_000), t0)
                    .is_allowed()
            );
        }
        let locked: Vec<(u64, u64)> = (0..64u64)
            .filter_map(|key| {
                let d = store.decide(&key, &rule, Op::Check(1), later);
                (!d.is_allowed()).then(|| (key, d.retry_after_secs().unwrap_or(0)))
            })
            .collect();
        // How long key 0 stays locked out, probed every minute (at the retry time it is told,
        // it is still rejected).
        let minutes = (0..24 * 60u64)
            .find(|m| {
                store
                    .decide(&0, &rule, Op::Check(1), later + 2 * S + m * 60 * S)
                    .is_allowed()
            })
            .unwrap_or(u64::MAX);
        if !locked.is_empty() {
            failures.push(format!(
                "{quotas}: {} of 64 keys rejected 70 h later (key, retry after s): {:?}; key \
                     0 admitted again after {minutes} min",
                locked.len(),
                &locked[..locked.len().min(4)]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn an_evicted_key_of_one_word_window_quotas_comes_back_as_spent() {
    // Several window quotas held one word each, forgotten into the sketch at eviction and
    // recalled: never less spent than they left.
    for strategy in [
        Strategy::FixedWindow,
        Strategy::FixedWindowFirstHit,
        Strategy::SlidingWindow,
    ] {
        let rule = Rule::parse(strategy, "10/s; 20/minute").unwrap();
        let store = MemoryStore::<u64>::builder().max_keys(1).build();
        let t = 1_700_000_040 * S;
        // Key 1 keeps room (a blocked key is not evicted): 9 of 10 in the second.
        let at = |key: u64, cost: u32, now: u64| store.decide(&key, &rule, Op::Check(cost), now);
        assert!(at(1, 9, t).is_allowed());
        assert!(at(2, 1, t + S / 1000).is_allowed());
        assert!(store.stats().evictions >= 1, "{strategy}");
        let d = at(1, 2, t + 2 * S / 1000);
        assert!(
            !d.is_allowed(),
            "{strategy}: 9 of the second were spent: {d:?}"
        );
        // Three seconds later the second has room (a recalled sliding window may be restored
        // a bucket later: stricter), the minute 11 more: 9 + 9 = 18 of 20.
        assert!(at(2, 1, t + 3 * S).is_allowed());
        let d = at(1, 9, t + 3 * S + 1);
        assert!(d.is_allowed(), "{strategy}: {d:?}");
        assert!(at(2, 1, t + 5 * S).is_allowed());
        let d = at(1, 3, t + 5 * S + 1);
        assert!(
            !d.is_allowed(),
            "{strategy}: 18 of the minute were spent: {d:?}"
        );
    }
}

#[test]
fn a_segment_holds_at_most_8_k_keys_on_average_at_the_cap_up_to_a_cap_of_33_million() {
    let most = (SEGMENTS << 6) * KEYS_PER_SEGMENT;
    for cap in [
        0,
        1,
        100,
        SEGMENTS * KEYS_PER_SEGMENT,
        SEGMENTS * KEYS_PER_SEGMENT + 1,
        DEFAULT_MAX_KEYS,
        10_000_000,
        most,
    ] {
        let count = Spread::for_cap(cap).count();
        assert_eq!(count % 64, 0, "cap {cap}: whole words of catch-up bits");
        assert!(
            count * KEYS_PER_SEGMENT >= cap,
            "cap {cap}: {count} segments"
        );
        // No more segments than needed: their maps cost memory whatever the keys held.
        assert!(
            count == SEGMENTS || (count / 2) * KEYS_PER_SEGMENT < cap,
            "cap {cap}: {count} segments"
        );
    }
    // A store of up to 2^19 keys keeps its 64 segments; the default cap gets 1024.
    assert_eq!(Spread::for_cap(SEGMENTS * KEYS_PER_SEGMENT).count(), 64);
    assert_eq!(Spread::for_cap(DEFAULT_MAX_KEYS).count(), 1024);
    // Past that cap, or none: the most segments, a share of the keys held each.
    assert_eq!(Spread::for_cap(most + 1).count(), SEGMENTS << 6);
    assert_eq!(Spread::for_cap(usize::MAX).count(), SEGMENTS << 6);
}

/// A store built for a large cap makes a segment's map with the first key it holds: a rules file
/// of many limits (a store each) holds no maps for keys it has not seen.
#[test]
fn a_segment_map_is_made_by_its_first_key() {
    let store = MemoryStore::<u64>::new();
    let count = store.spread.count();
    assert_eq!(count, 1024);
    let made = |store: &MemoryStore<u64>| {
        (0..count)
            .filter(|&i| store.general.held(i).is_some())
            .count()
    };
    assert_eq!(made(&store), 0);
    // A moving window keeps general entries: one key, one segment map.
    let rule = Rule::parse(Strategy::MovingWindow, "10/s").unwrap();
    assert!(store.decide(&7, &rule, Op::Check(1), 100 * S).is_allowed());
    assert_eq!(made(&store), 1);
    // Reads, removals and sweeps of the others make none.
    assert!(store.decide(&7, &rule, Op::Peek, 100 * S).is_allowed());
    store.sweep_step(200 * S);
    assert_eq!(made(&store), 1);
}

/// The work of a paced step, in entries visited: the keys of one segment; of a decision after a
/// pause, the steps due up to the keys of a segment at the cap, whatever the keys held.
#[test]
fn a_paced_step_visits_one_segment_and_a_decision_at_most_a_segment_at_the_cap_s_keys() {
    let store = MemoryStore::<u64>::new();
    let rule = Rule::parse(Strategy::TokenBucket, "10/s").unwrap();
    let keys = 50_000u64;
    let mut now = 100 * S;
    for k in 0..keys {
        store.decide(&k, &rule, Op::Check(1), now);
    }
    let table = store.packed[0].get().unwrap();
    let count = store.spread.count();
    let lens: Vec<usize> = (0..count)
        .map(|i| table.held(i).map_or(0, dashmap::DashMap::len))
        .collect();
    let held: usize = lens.iter().sum();
    assert_eq!(held as u64, keys);
    // Every key idle long enough to be fresh; the next timed step sweeps the next segment.
    now += 10 * S;
    for _ in 0..3 {
        let i = store.cursor.load(Ordering::Relaxed) % count;
        let before = store.len();
        store.sweep_step(now);
        let visited = before - store.len();
        // Every key it held was fresh: the step dropped exactly that segment's keys.
        assert_eq!(visited, lens[i], "segment {i}");
        assert!(
            visited <= 3 * held / count,
            "segment {i}: {visited} of {held} keys in {count} segments"
        );
    }
    // The last timed step was during the inserts, 10 s ago: a decision now runs the steps due
    // while they have looked at fewer keys than a segment at the cap holds (a peek inserts
    // nothing): more than one step, far fewer than all.
    let before = store.len();
    store.decide(&u64::MAX, &rule, Op::Peek, now);
    let dropped = before - store.len();
    assert!(
        (KEYS_PER_SEGMENT..=KEYS_PER_SEGMENT + 3 * held / count).contains(&dropped),
        "{dropped} keys dropped"
    );
    // The next step is due one interval later: a decision then runs one step, one segment.
    let before = store.len();
    now += store.pacing.0.step_every;
    store.decide(&u64::MAX, &rule, Op::Peek, now);
    let dropped = before - store.len();
    assert!(
        (1..=3 * held / count).contains(&dropped),
        "{dropped} keys dropped"
    );
}

/// With few keys, rare decisions still sweep every segment within a rotation: a decision runs
/// every step due since the last one (a store far below its cap has small segments).
#[test]
fn rare_decisions_sweep_a_small_store_within_a_rotation() {
    let store = MemoryStore::<u64>::new();
    let rule = Rule::parse(Strategy::TokenBucket, "10/s").unwrap();
    let mut now = 100 * S;
    for k in 0..1_000 {
        store.decide(&k, &rule, Op::Check(1), now);
    }
    assert_eq!(store.len(), 1_000);
    // One decision a second (1024 segments: a step is due every 7.8 ms).
    for _ in 0..8 {
        now += S;
        store.decide(&u64::MAX, &rule, Op::Peek, now);
    }
    assert_eq!(store.len(), 0);
}
