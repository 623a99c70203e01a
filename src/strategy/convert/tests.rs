use super::*;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * S;

fn held(strategy: Strategy, limit: u64, window: u64) -> Held {
    Held {
        strategy,
        params: Params::bucket(limit, window, limit),
        state: QuotaState::new(strategy),
    }
}

/// `held` after `n` admitted units at `at`.
fn spent(mut h: Held, n: u64, at: u64) -> Held {
    let v = h.state.check(h.strategy, &h.params, at, n);
    assert_eq!(v.outcome, crate::decision::Outcome::Allowed, "{h:?}");
    h.state.commit(h.strategy, &h.params, at, n);
    h
}

/// How many units of cost 1 the new state admits at `now`.
fn room(strategy: Strategy, p: &Params, state: &QuotaState, now: u64) -> u64 {
    let mut s = state.clone();
    let mut n = 0;
    while s.check(strategy, p, now, 1).outcome == crate::decision::Outcome::Allowed {
        s.commit(strategy, p, now, 1);
        n += 1;
        assert!(n <= 1_000, "unbounded");
    }
    n
}

#[test]
fn every_strategy_pair_carries_the_spend_of_the_same_period() {
    // 7 of 10 spent a second ago under each old strategy; the new quota 20 per the same
    // minute: 13 left (a sliding window's share rounded up, a bucket's deficit drained a bit:
    // between 12 and 13), never the whole 20. (Leaky to leaky keeps its scheduled departures
    // too: see below.)
    for from in Strategy::ALL {
        for to in Strategy::ALL {
            if (from, to) == (Strategy::LeakyBucket, Strategy::LeakyBucket) {
                continue;
            }
            let old = spent(held(from, 10, 60 * S), 7, T0 + 30 * S);
            let p = Params::bucket(20, 60 * S, 20);
            let c = convert(&[old], to, &[p], T0 + 31 * S);
            let left = room(to, &p, &c.states[0], T0 + 31 * S);
            assert!((12..=13).contains(&left), "{from} -> {to}: {left} left");
            assert!(c.ghosts.is_empty());
        }
    }
}

#[test]
fn a_lower_limit_keeps_the_whole_spend() {
    for s in Strategy::ALL {
        let old = spent(held(s, 100, 3_600 * S), 100, T0);
        let half = Params::bucket(50, 3_600 * S, 50);
        let c = convert(&[old], s, &[half], T0 + S);
        assert_eq!(room(s, &half, &c.states[0], T0 + S), 0, "{s}");
        // And back to 100: still nothing left in the hour (a bucket: the 50/hour bucket is
        // full, and the old bucket's 100 units stay in a ghost; one unit drained meanwhile).
        let back = Held {
            strategy: s,
            params: half,
            state: c.states[0].clone(),
        };
        let mut old = vec![back];
        old.extend(c.ghosts);
        let full = Params::bucket(100, 3_600 * S, 100);
        let c = convert(&old, s, &[full], T0 + 2 * S);
        let most = if s.is_bucket() { 1 } else { 0 };
        assert!(
            room(s, &full, &c.states[0], T0 + 2 * S) <= most,
            "{s} {c:?}"
        );
    }
}

#[test]
fn windows_inside_the_new_one_give_their_largest_spend() {
    // 5/second (4 spent) and 20/minute (9 spent) -> 10/second and 20/minute.
    for s in [
        Strategy::FixedWindow,
        Strategy::SlidingWindow,
        Strategy::MovingWindow,
    ] {
        let sec = spent(held(s, 5, S), 4, T0);
        let min = spent(held(s, 20, 60 * S), 9, T0);
        let p = [Params::bucket(10, S, 10), Params::bucket(20, 60 * S, 20)];
        let c = convert(&[sec, min], s, &p, T0);
        assert_eq!(room(s, &p[0], &c.states[0], T0), 6, "{s}");
        assert_eq!(room(s, &p[1], &c.states[1], T0), 11, "{s}");
    }
}

#[test]
fn a_new_period_without_a_shorter_one_takes_the_shortest_containing() {
    // 20/minute and 100/hour with 15 and 40 spent -> 10/10s: the minute's 15 (over the limit).
    let min = spent(held(Strategy::FixedWindow, 20, 60 * S), 15, T0);
    let hour = spent(held(Strategy::FixedWindow, 100, 3_600 * S), 40, T0);
    let p = Params::bucket(10, 10 * S, 10);
    let c = convert(&[min, hour], Strategy::FixedWindow, &[p], T0);
    assert_eq!(
        c.states[0],
        QuotaState::Fixed(FixedWindow::from_parts(T0, 15))
    );
}

#[test]
fn a_removed_period_stays_as_a_ghost_until_its_window_ends() {
    let min = spent(held(Strategy::FixedWindow, 10, 60 * S), 6, T0);
    let hour = spent(held(Strategy::FixedWindow, 100, 3_600 * S), 80, T0);
    let p = Params::bucket(10, 60 * S, 10);
    let c = convert(&[min, hour.clone()], Strategy::FixedWindow, &[p], T0 + S);
    assert_eq!(c.ghosts, vec![hour.clone()]);
    // Converting back reads the ghost, charged meanwhile.
    let mut ghost = c.ghosts[0].clone();
    ghost.charge(T0 + 2 * S, 4);
    let now_min = Held {
        strategy: Strategy::FixedWindow,
        params: p,
        state: c.states[0].clone(),
    };
    let back = [p, Params::bucket(100, 3_600 * S, 100)];
    let c = convert(&[now_min, ghost], Strategy::FixedWindow, &back, T0 + 3 * S);
    assert_eq!(
        room(Strategy::FixedWindow, &back[1], &c.states[1], T0 + 3 * S),
        16
    );
    assert!(c.ghosts.is_empty());
    // A ghost whose window ended is not kept.
    let c = convert(&[hour], Strategy::FixedWindow, &[p], T0 + 3_600 * S);
    assert!(c.ghosts.is_empty());
}

#[test]
fn ghosts_are_bounded_and_keep_the_most_spent() {
    let old: Vec<Held> = (1..=12)
        .map(|i| spent(held(Strategy::FixedWindow, 100, i * 10 * S), i, T0))
        .collect();
    let p = Params::bucket(10, 7 * S, 10);
    let c = convert(&old, Strategy::FixedWindow, &[p], T0);
    assert_eq!(c.ghosts.len(), MAX_GHOSTS);
    assert!(c.ghosts.iter().all(|g| g.params.window >= 50 * S));
}

#[test]
fn first_hit_windows_start_at_the_oldest_old_start() {
    let a = spent(held(Strategy::FixedWindowFirstHit, 10, 60 * S), 3, T0);
    let b = spent(
        held(Strategy::FixedWindowFirstHit, 10, 30 * S),
        2,
        T0 + 10 * S,
    );
    let p = Params::bucket(10, 60 * S, 10);
    let c = convert(&[a, b], Strategy::FixedWindowFirstHit, &[p], T0 + 20 * S);
    assert_eq!(
        c.states[0],
        QuotaState::Fixed(FixedWindow::from_parts(T0, 3))
    );
    // From a state without a start (a bucket): the window opens now.
    let g = spent(held(Strategy::TokenBucket, 10, 60 * S), 4, T0);
    let c = convert(&[g], Strategy::FixedWindowFirstHit, &[p], T0 + 20 * S);
    let QuotaState::Fixed(f) = &c.states[0] else {
        panic!("{c:?}")
    };
    assert_eq!(f.parts().0, T0 + 20 * S);
}

#[test]
fn moving_windows_convert_exactly_from_a_covering_log() {
    let mut old = held(Strategy::MovingWindow, 100, 3_600 * S);
    for i in 0..10 {
        old = spent(old, 1, T0 + i * 60 * S);
    }
    // Entries at T0 .. T0+9min; a 5-minute window at T0+10min holds those after T0+5min: 4.
    let p = Params::bucket(10, 5 * 60 * S, 10);
    let c = convert(
        &[old.clone()],
        Strategy::MovingWindow,
        &[p],
        T0 + 10 * 60 * S,
    );
    assert!(c.exact);
    assert_eq!(
        room(Strategy::MovingWindow, &p, &c.states[0], T0 + 10 * 60 * S),
        6
    );
    // A 2-hour window from a 1-hour log: not covered, topped up to the hour's 10 (all in
    // the log already): exact enough, nothing stamped now.
    let p = Params::bucket(20, 7_200 * S, 20);
    let c = convert(&[old], Strategy::MovingWindow, &[p], T0 + 10 * 60 * S);
    assert_eq!(
        room(Strategy::MovingWindow, &p, &c.states[0], T0 + 10 * 60 * S),
        10
    );
    // From a window state: entries stamped now.
    let f = spent(held(Strategy::FixedWindow, 10, 60 * S), 7, T0);
    let p = Params::bucket(10, 60 * S, 10);
    let c = convert(&[f], Strategy::MovingWindow, &[p], T0 + S);
    assert!(!c.exact);
    assert_eq!(room(Strategy::MovingWindow, &p, &c.states[0], T0 + S), 3);
}

#[test]
fn buckets_carry_the_deficit_capped_at_the_new_depth_and_keep_scheduled_departures() {
    let g = spent(held(Strategy::LeakyBucket, 10, 10 * S), 8, T0);
    // 8 units of 1 s ahead; the new bucket 4/10s (T = 2.5 s), burst 4: 8 units would be 20 s,
    // capped at its depth (10 s); the old bucket stays as a ghost for the cut 4.
    let p = Params::bucket(4, 10 * S, 4);
    let c = convert(std::slice::from_ref(&g), Strategy::LeakyBucket, &[p], T0);
    assert_eq!(c.states[0], QuotaState::Gcra(Gcra::from_tat(T0 + 10 * S)));
    assert_eq!(c.ghosts, vec![g.clone()]);
    // Not cut: 2 units of 1 s at 2.5 s each, no ghost.
    let two = spent(held(Strategy::LeakyBucket, 10, 10 * S), 2, T0);
    let c = convert(&[two], Strategy::LeakyBucket, &[p], T0);
    assert_eq!(c.states[0], QuotaState::Gcra(Gcra::from_tat(T0 + 5 * S)));
    assert!(c.ghosts.is_empty());
    // A faster bucket (100/10s): 8 units of 0.1 s, but the last departure handed out (7 s
    // ahead) stays where it was.
    let p = Params::bucket(100, 10 * S, 100);
    let c = convert(&[g], Strategy::LeakyBucket, &[p], T0);
    assert_eq!(c.states[0], QuotaState::Gcra(Gcra::from_tat(T0 + 7 * S)));
}

#[test]
fn a_fresh_old_state_converts_to_a_fresh_new_one() {
    for from in Strategy::ALL {
        for to in Strategy::ALL {
            let old = held(from, 10, 60 * S);
            let p = Params::bucket(5, 60 * S, 5);
            let c = convert(&[old], to, &[p], T0);
            assert_eq!(c.states[0], QuotaState::new(to), "{from} -> {to}");
            assert!(c.ghosts.is_empty());
        }
    }
}
