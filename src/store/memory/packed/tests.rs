use super::*;
use crate::strategy::first_hit_grain;

const S: u64 = 1_000_000_000;

#[test]
fn which_rules_pack() {
    let packs = |s: Strategy, q: &str| PackedRule::for_rule(&Rule::parse(s, q).unwrap());
    assert!(packs(Strategy::FixedWindow, "100/minute").is_some());
    assert!(packs(Strategy::SlidingWindow, "100/minute").is_some());
    assert!(packs(Strategy::TokenBucket, "10/s").is_some());
    assert!(packs(Strategy::LeakyBucket, "10/s").is_some());
    // First-hit windows: every limit and window, their starts whole (exact) up to 2^15 - 1
    // per window of up to 1.6 days and up to 7 per 10 years, rounded up to a grain otherwise.
    let grain = |q: &str| {
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, q).unwrap();
        let Some(PackedRule {
            layout: Layout::FirstHit(hit),
            ..
        }) = PackedRule::for_rule(&rule)
        else {
            panic!("{q} packs as a first-hit window");
        };
        assert_eq!(
            1 << hit.grain_bits,
            first_hit_grain(&rule.nanos()[0]),
            "{q}"
        );
        1u64 << hit.grain_bits
    };
    for q in ["10/s", "1/ms", "32767/day", "1000/39hours", "7/3660days"] {
        assert_eq!(grain(q), 1, "{q}");
    }
    for (q, g) in [
        ("32768/s", 2),
        ("32767/40hours", 2),
        ("8/3660days", 2),
        ("4294967295/ms", 1 << 17),
        ("4294967295/day", 1 << 17),
        ("4294967295/3660days", 1 << 29),
        ("1/3660days", 1),
    ] {
        assert_eq!(grain(q), g, "{q}");
    }
    assert!(packs(Strategy::MovingWindow, "10/s").is_none());
    assert!(packs(Strategy::FixedWindow, "1/s; 10/minute").is_none());
    // Every window limit up to u32::MAX per period, from a millisecond to a day: on a ring of
    // window indices when the whole index does not fit.
    for q in [
        "4294967295/ms",
        "4294967295/s",
        "4294967295/day",
        "100000/s",
        "10000/s",
    ] {
        for s in [Strategy::FixedWindow, Strategy::SlidingWindow] {
            assert!(packs(s, q).is_some(), "{s} {q}");
        }
    }
    let layout = |s: Strategy, q: &str| packs(s, q).unwrap().layout;
    assert_eq!(
        layout(Strategy::SlidingWindow, "10000/s"),
        Layout::Sliding {
            count_bits: 14,
            prev_shift: 0,
            ring: Ring::WHOLE
        }
    );
    // Two days of seconds need an 18-bit ring; 2 x 17 count bits leave it 29.
    assert_eq!(
        layout(Strategy::SlidingWindow, "100000/s"),
        Layout::Sliding {
            count_bits: 17,
            prev_shift: 0,
            ring: Ring::new(29)
        }
    );
    assert_eq!(
        layout(Strategy::SlidingWindow, "4294967295/s"),
        Layout::Sliding {
            count_bits: 32,
            prev_shift: 19,
            ring: Ring::new(18)
        }
    );
    assert_eq!(
        layout(Strategy::FixedWindow, "4294967295/s"),
        Layout::Fixed {
            count_bits: 32,
            ring: Ring::new(31)
        }
    );
}

/// Runs a random trace of checks and refunds through the packed word and the strategy,
/// calling `compare` on both verdicts and both states.
fn differential(
    strategy: Strategy,
    q: &str,
    start: u64,
    mut gap: impl FnMut(u64) -> u64,
    mut compare: impl FnMut(u64, Verdict, Verdict, QuotaState, QuotaState),
) {
    let rule = Rule::parse(strategy, q).unwrap();
    let packed = PackedRule::for_rule(&rule).unwrap();
    let mut reference = vec![QuotaState::new(strategy)];
    let cell = AtomicU64::new(0);
    let mut now = start;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        now = now.saturating_add(gap(x)).min(NOW_LIMIT - 1);
        let op = match x % 13 {
            0 => Op::Settle {
                reserved: 1,
                actual: 0,
                at: now,
                bound: 0,
            },
            1 => Op::Peek,
            c => Op::Check((x >> 40) as u32 % (c as u32 * 1000)),
        };
        let got = packed.apply(&cell, op, now);
        let (_, want) = strategy::apply(&mut reference, strategy, rule.nanos(), now, op);
        let word = cell.load(Ordering::Relaxed);
        compare(i, got, want, packed.unpack(word, now), reference[0].clone());
    }
}

#[test]
fn ring_layouts_agree_with_the_strategy_when_their_counts_are_exact() {
    for (strategy, q) in [
        (Strategy::FixedWindow, "4294967295/s"),
        (Strategy::FixedWindow, "4294967295/day"),
        (Strategy::FixedWindow, "100000/ms"),
        (Strategy::SlidingWindow, "100000/s"),
        (Strategy::SlidingWindow, "300000/minute"),
    ] {
        // Small steps and long idle gaps.
        let w = Rule::parse(strategy, q).unwrap().nanos()[0].window;
        let gap = |x: u64| match x % 7 {
            0 => (x >> 20) % (5 * w),
            _ => (x >> 20) % (w / 50).max(1),
        };
        differential(strategy, q, 1_700_000_000 * S, gap, |i, got, want, a, b| {
            assert_eq!(got, want, "{strategy} {q} step {i}");
            // Zero counts read back as a new key's state, whatever the window.
            if a != b {
                assert_eq!(a.fresh_at(&Params::window(1, 1)), 0, "{strategy} {q} {i}");
            }
        });
    }
}

#[test]
fn a_rounded_previous_count_never_admits_more_than_the_strategy() {
    // The reference follows what the packed word admitted, so both count the same requests;
    // costs up to 2^31 fill the windows.
    let strategy = Strategy::SlidingWindow;
    let rule = Rule::parse(strategy, "4294967295/s").unwrap();
    let packed = PackedRule::for_rule(&rule).unwrap();
    let mut reference = vec![QuotaState::new(strategy)];
    let cell = AtomicU64::new(0);
    let mut now = 1_700_000_000 * S;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let (mut admitted, mut rejected) = (0, 0);
    for i in 0..5000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        now += (x >> 20) % (S / 4);
        let op = match x % 11 {
            0 => Op::Settle {
                reserved: 1 << 20,
                actual: 0,
                at: now,
                bound: 0,
            },
            _ => Op::Check((x >> 33) as u32),
        };
        let got = packed.apply(&cell, op, now);
        let mut trial = reference.clone();
        let (_, want) = strategy::apply(&mut trial, strategy, rule.nanos(), now, op);
        assert!(got.remaining <= want.remaining, "step {i}");
        assert!(want.remaining - got.remaining < 1 << 19, "step {i}");
        match (op, got.outcome) {
            (Op::Settle { .. }, _) => reference = trial,
            (_, Outcome::Allowed) => {
                assert_eq!(want.outcome, Outcome::Allowed, "step {i}: admitted more");
                reference = trial;
                admitted += 1;
            }
            _ => rejected += 1,
        }
    }
    assert!(admitted > 100 && rejected > 100, "{admitted} {rejected}");
}

#[test]
fn a_ring_reads_recent_states_and_clock_steps_back_within_its_span() {
    let rule = Rule::parse(Strategy::FixedWindow, "4294967295/s").unwrap();
    let packed = PackedRule::for_rule(&rule).unwrap();
    let Layout::Fixed { ring, .. } = packed.layout else {
        panic!("a fixed window layout");
    };
    let now = 1_700_000_000 * S;
    let cell = AtomicU64::new(0);
    assert_eq!(
        packed.apply(&cell, Op::Check(5), now).remaining,
        u64::from(u32::MAX) - 5
    );
    let word = cell.load(Ordering::Relaxed);
    // Read back from a clock that went back by six hours: the state is still ahead of it.
    let back = now - 6 * 3600 * S;
    assert_eq!(
        packed.unpack(word, back),
        QuotaState::Fixed(FixedWindow::from_parts(now, 5))
    );
    assert!(ring.ahead(S) >= 6 * 3600 * S);
    // A day later it is an old window, equivalent to a new key's.
    assert!(packed.is_fresh(word, now + 86_400 * S, now + 86_400 * S));
}

proptest::proptest! {
    /// A first-hit window packs whole: the packed word answers every check, peek, settlement
    /// and reset exactly as the general entry's state, under clock steps back included, and
    /// holds the same state.
    #[test]
    fn a_packed_first_hit_window_answers_as_the_general_entry(
        limit in 1u64..32768,
        window_bits in 0u32..39,
        window_raw in 0u64..=u64::MAX,
        start in 0u64..NOW_LIMIT / 2,
        steps in proptest::collection::vec((0u64..=u64::MAX, 0u8..12, 0u64..=u64::MAX), 1..60),
    ) {
        let strategy = Strategy::FixedWindowFirstHit;
        // Periods from 1 ms to about 8.7 years, spread over their orders of magnitude.
        let window_ms = 1 + window_raw % (1 << window_bits);
        let rule = Rule::parse(strategy, &format!("{limit}/{window_ms}ms")).unwrap();
        let packed = PackedRule::for_rule(&rule).unwrap();
        if first_hit_grain(&rule.nanos()[0]) > 1 {
            // Only windows too long for the limit's count bits round (see the next test).
            proptest::prop_assert!(bits_for(limit) + 64 - (2 * rule.nanos()[0].window - 1).leading_zeros() > 63);
            return Ok(());
        }
        let p = rule.nanos()[0];
        let mut reference = vec![QuotaState::new(strategy)];
        let cell = AtomicU64::new(0);
        let mut now = start;
        let mut latest = start;
        for (i, &(dt, kind, x)) in steps.iter().enumerate() {
            now = match kind {
                // A clock step back, to within the six hours a ring reads ahead of the
                // latest time seen.
                0 => now.saturating_sub(dt % (6 * 3600 * S)).max(latest.saturating_sub(6 * 3600 * S)),
                // Past the window's end, within what the ring reads back (7/8 of it, at
                // least 1.75 W: a state older than that unswept reads as a recent one).
                1 => now + dt % (3 * p.window / 4 + 1),
                _ => now + dt % (p.window / 4 + 1),
            };
            let op = match kind {
                2 => Op::Settle { reserved: (x % 3) as u32 + 1, actual: (x % 2) as u32, at: now.saturating_sub(x % p.window), bound: 0 },
                3 => Op::Peek,
                4 if x % 7 == 0 => Op::Reset,
                _ => Op::Check((x % (limit + 2)) as u32),
            };
            latest = latest.max(now);
            let got = packed.apply(&cell, op, now);
            let (_, want) = strategy::apply(&mut reference, strategy, rule.nanos(), now, op);
            proptest::prop_assert_eq!(got, want, "step {} {:?}", i, op);
            // A state with no count is a new key's, whatever its start (it is dropped like
            // one: the general entry's would be by a sweep).
            if reference[0].fresh_at(&p) == 0 {
                reference[0] = QuotaState::new(strategy);
            }
            let held = packed.unpack(cell.load(Ordering::Relaxed), now);
            proptest::prop_assert_eq!(&held, &reference[0], "step {}", i);
        }
    }
}

/// The grain of a packed first-hit rule.
fn grain_of(packed: &PackedRule) -> u64 {
    match packed.layout {
        Layout::FirstHit(hit) => 1 << hit.grain_bits,
        _ => panic!("a first-hit layout"),
    }
}

proptest::proptest! {
    /// A first-hit window whose start is rounded up to the grain `g` answers as the exact
    /// strategy whose windows start at the rounded start: the same outcomes, counts and
    /// states, its reset and retry times pointing at the rounded end (`g - 1` ns at most after
    /// the exact end from the opening request). So it is never more lenient than the exact
    /// strategy: every window holds at most `N`, lasts at least `W` from its first admitted
    /// request and at most `W + g - 1`, at most `2N` pass in any trailing `W`, and a window
    /// opens only at or after the previous one's (rounded) end.
    #[test]
    fn a_rounded_first_hit_window_is_the_exact_one_started_up_to_a_grain_later(
        limit in proptest::prop_oneof![32768u64..=4_294_967_295, 1u64..=8, proptest::strategy::Just(4_294_967_295u64)],
        window_bits in 0u32..39,
        window_raw in 0u64..=u64::MAX,
        start in 0u64..NOW_LIMIT / 2,
        steps in proptest::collection::vec((0u64..=u64::MAX, 0u8..12, 0u64..=u64::MAX), 1..80),
    ) {
        let strategy = Strategy::FixedWindowFirstHit;
        let window_ms = 1 + window_raw % (1 << window_bits);
        let rule = Rule::parse(strategy, &format!("{limit}/{window_ms}ms")).unwrap();
        let packed = PackedRule::for_rule(&rule).unwrap();
        let g = grain_of(&packed);
        let p = rule.nanos()[0];
        let round = |s: u64| s.div_ceil(g).saturating_mul(g);
        proptest::prop_assert_eq!(g, first_hit_grain(&p));
        proptest::prop_assert!(rule.horizon().as_nanos() == u128::from(p.window + g - 1));
        // The exact strategy, its start rounded up after every operation.
        let mut reference = FixedWindow::default();
        let cell = AtomicU64::new(0);
        let mut now = start;
        // Admitted (time, cost) and the opening request's time of the current window.
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut opened: Option<u64> = None;
        let mut last_end = 0u64;
        for (i, &(dt, kind, x)) in steps.iter().enumerate() {
            // Time moves forward only (a clock step back is the exact layouts' test's).
            now += match kind {
                1 => dt % (3 * p.window / 4 + 1),
                2 => dt % (g * 2 + 1),
                _ => dt % (p.window / 4 + 1),
            };
            let cost = match kind {
                3 => 0,
                _ => x % (limit.min(1 << 20) + 2),
            };
            let op = Op::Check(cost as u32);
            let got = packed.apply(&cell, op, now);
            let was_open = reference.parts().1 > 0 && now < reference.parts().0 + p.window;
            let mut want = reference.check(&p, now, cost, false);
            if want.outcome == Outcome::Allowed && cost > 0 {
                reference.commit(now, cost, false);
            }
            let (s, n) = reference.parts();
            if n > 0 {
                reference = FixedWindow::from_parts(round(s), n);
                // Times measured from now to the rounded end.
                let late = round(s).saturating_sub(now);
                if want.reset_after > 0 { want.reset_after += late; }
                if want.retry_after > 0 { want.retry_after += late; }
            }
            proptest::prop_assert_eq!(got, want, "step {} {:?}", i, op);
            let held = packed.unpack(cell.load(Ordering::Relaxed), now);
            let expect = if reference.parts().1 == 0 { FixedWindow::default() } else { reference };
            proptest::prop_assert_eq!(held, QuotaState::Fixed(expect), "step {}", i);
            if got.outcome == Outcome::Allowed && cost > 0 {
                let (s, _) = reference.parts();
                if !was_open {
                    // A new window: at or after the previous rounded end, its start rounded
                    // up by less than a grain.
                    proptest::prop_assert!(now >= last_end, "step {}: opened early", i);
                    proptest::prop_assert!(s >= now && s - now < g, "step {}", i);
                    opened = Some(now);
                    last_end = s + p.window;
                }
                let first = opened.unwrap();
                proptest::prop_assert!(now < last_end && last_end - first >= p.window);
                proptest::prop_assert!(last_end - first < p.window + g);
                admitted.push((now, cost));
            }
            if got.outcome == Outcome::Rejected {
                // The wait ends at the rounded end: a request then opens a new window.
                proptest::prop_assert_eq!(now + got.retry_after, last_end, "step {}", i);
                proptest::prop_assert!(got.retry_after < p.window + g);
            }
            if got.reset_after > 0 {
                proptest::prop_assert!(got.reset_after < p.window + g, "step {}", i);
            }
        }
        // At most N per window, 2N per trailing W.
        for &(t, _) in &admitted {
            let trailing: u64 = admitted.iter().filter(|&&(u, _)| u <= t && t - u < p.window).map(|&(_, c)| c).sum();
            proptest::prop_assert!(trailing <= 2 * limit, "over 2N in a trailing window");
        }
    }
}

#[test]
fn rounded_first_hit_windows_at_the_edges() {
    for (q, start) in [
        ("32768/s", 1_700_000_000 * S + 1),
        ("4294967295/s", 1_700_000_000 * S + 12_345),
        ("4294967295/ms", 1_700_000_000 * S + 7),
        ("4294967295/day", 1_700_000_000 * S + 1),
        ("4294967295/3660days", 1_700_000_000 * S + 1),
        ("4294967295/3660days", NOW_LIMIT - 2),
        ("4294967295/ms", NOW_LIMIT - 2),
    ] {
        let rule = Rule::parse(Strategy::FixedWindowFirstHit, q).unwrap();
        let p = rule.nanos()[0];
        let packed = PackedRule::for_rule(&rule).unwrap();
        let g = grain_of(&packed);
        assert!(g > 1, "{q}");
        let end = start.div_ceil(g) * g + p.window;
        let cell = AtomicU64::new(0);
        // The opening request: its reset points at the rounded end.
        let v = packed.apply(&cell, Op::Check(1), start);
        assert_eq!(v.outcome, Outcome::Allowed, "{q}");
        assert_eq!(start + v.reset_after, end, "{q}");
        assert!(
            v.reset_after < p.window + g && v.reset_after >= p.window,
            "{q}"
        );
        // The rest of the limit, then a rejection whose retry points at the rounded end.
        let v = packed.apply(&cell, Op::Check((p.limit - 1) as u32), start + 1);
        assert_eq!((v.outcome, v.remaining), (Outcome::Allowed, 0), "{q}");
        for at in [start + 1, end - g, end - 1]
            .into_iter()
            .filter(|&at| at < NOW_LIMIT)
        {
            let v = packed.apply(&cell, Op::Check(1), at);
            assert_eq!(v.outcome, Outcome::Rejected, "{q} at {at}");
            assert_eq!(at + v.retry_after, end, "{q} at {at}");
            assert_eq!(at + v.reset_after, end, "{q} at {at}");
            // What eviction sees: blocked until the rounded end, not fresh before it.
            assert_eq!(
                packed.look(cell.load(Ordering::Relaxed), at),
                Look::Blocked(end)
            );
            assert!(
                !packed.is_fresh(cell.load(Ordering::Relaxed), at, at),
                "{q}"
            );
            // A peek agrees.
            let peek = packed.apply(&cell, Op::Peek, at);
            assert_eq!(at + peek.reset_after, end, "{q} peek at {at}");
        }
        assert!(
            packed.is_fresh(cell.load(Ordering::Relaxed), end, end),
            "{q}"
        );
        if end < NOW_LIMIT {
            // At the rounded end a new window opens.
            let v = packed.apply(&cell, Op::Check(1), end);
            assert_eq!(v.outcome, Outcome::Allowed, "{q}");
            assert_eq!(v.remaining, p.limit - 1, "{q}");
        }
    }
}

#[test]
fn words_round_trip_every_reachable_state() {
    for (strategy, q) in [
        (Strategy::FixedWindow, "3/s"),
        (Strategy::SlidingWindow, "3/s"),
        (Strategy::TokenBucket, "3/s"),
        (Strategy::FixedWindow, "65535/day"),
    ] {
        let rule = Rule::parse(strategy, q).unwrap();
        let packed = PackedRule::for_rule(&rule).unwrap();
        let mut reference = vec![QuotaState::new(strategy)];
        let cell = AtomicU64::new(0);
        let mut now = NOW_LIMIT - 50 * S;
        for i in 0..2000u64 {
            now += (i * 7919) % (S / 3);
            let op = if i % 11 == 0 {
                Op::Settle {
                    reserved: 1,
                    actual: 0,
                    at: now,
                    bound: 0,
                }
            } else {
                Op::Check(1)
            };
            let got = packed.apply(&cell, op, now);
            let (_, want) = strategy::apply(&mut reference, strategy, rule.nanos(), now, op);
            assert_eq!(got, want, "{strategy} {q} step {i}");
            assert_eq!(
                packed.unpack(cell.load(Ordering::Relaxed), now),
                reference[0]
            );
        }
    }
}
