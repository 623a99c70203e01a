//! Strict conversion of a key's state from one rule to another: each new quota starts at no less
//! than what the old state proves was spent in its window or bucket, so a change may reject for a
//! period but never hands back spent quota.
//!
//! The old state is a list of [`Held`] quotas (the old rule's quotas and the ghosts of periods
//! removed earlier). Per old quota its proven spend at `now` ([`spend_of`]); per new quota:
//! - windows (fixed, sliding, first-hit): the largest spend among old quotas whose period lies
//!   inside the new one, or else the spend of the shortest old quota that contains it, placed in
//!   the current window (a first-hit window starts at the oldest old start still inside it);
//! - moving window: the entries of the old log that covers the new period (exact), topped up to
//!   the window figure above with entries stamped `now`;
//! - buckets: the deficit at the new interval (a unit's fraction too, so that two versions
//!   alternating round nothing up), capped at the new depth (a key is never shut for longer than
//!   the new bucket holds), and never before the old queue's last scheduled departure.
//!
//! Window counts are not capped at a lower new limit: `100/hour -> 50/hour -> 100/hour` must not
//! forget the 100 spent (an over-full window only rejects until it ends). Old quotas whose period
//! is not in the new rule stay as ghosts until their state would be fresh, charged every admitted
//! unit; so does an old bucket whose deficit the new depth cut, so that converting back finds it.

use std::collections::VecDeque;

use super::{FixedWindow, Gcra, MovingWindow, Params, QuotaState, SlidingWindow, Strategy};

/// The most ghosts one state keeps; beyond that the least spent goes.
pub(crate) const MAX_GHOSTS: usize = 8;

/// One quota of a held state: its strategy, its quota in ticks and its state. The quotas of a rule,
/// and the ghosts of removed periods, are each one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) strategy: Strategy,
    pub(crate) params: Params,
    pub(crate) state: QuotaState,
}

impl Held {
    /// Charges `cost` admitted units without checking (a ghost: the current rule decided).
    pub(crate) fn charge(&mut self, now: u64, cost: u64) {
        // Rolled to `now` first: a window counts from its start, a first-hit window opens now.
        let _ = self.state.check(self.strategy, &self.params, now, 0);
        self.state.commit(self.strategy, &self.params, now, cost);
    }

    /// Whether the state equals a new key's at `now` (a ghost then goes).
    pub(crate) fn is_fresh(&self, now: u64) -> bool {
        let at = self.state.fresh_at(&self.params);
        at <= now && at != u64::MAX
    }
}

/// What one old quota proves was spent, read at `now`.
#[derive(Clone, Debug)]
struct Spend {
    period: u64,
    units: u64,
    /// A first-hit window's start.
    start: Option<u64>,
    /// A moving window's entries within its period.
    log: Option<VecDeque<u64>>,
    /// A bucket's last scheduled departure (its TAT minus one emission interval).
    departure: Option<u64>,
    /// A bucket's deficit: how far its TAT is ahead of `now`, and its emission interval.
    ahead: Option<(u64, u64)>,
}

/// The spend `held` proves at `now`.
fn spend_of(held: &Held, now: u64) -> Spend {
    let p = &held.params;
    let mut state = held.state.clone();
    let mut spend = Spend {
        period: p.window,
        units: 0,
        start: None,
        log: None,
        departure: None,
        ahead: None,
    };
    match &mut state {
        QuotaState::Fixed(f) => {
            let aligned = held.strategy == Strategy::FixedWindow;
            let _ = f.check(p, now, 0, aligned);
            let (start, count) = f.parts();
            spend.units = count;
            if !aligned && count > 0 {
                spend.start = Some(start);
            }
        }
        QuotaState::Sliding(s) => {
            let _ = s.check(p, now, 0);
            let (bucket, cur, prev) = s.parts();
            let e = now.max(bucket) - bucket;
            let left = p.window - e.min(p.window);
            // The previous bucket's share, rounded up (stricter than the strategy's own floor).
            let share = (u128::from(prev) * u128::from(left)).div_ceil(u128::from(p.window));
            spend.units = u64::from(cur) + u64::try_from(share).unwrap_or(u64::MAX);
        }
        QuotaState::Moving(m) => {
            let _ = m.check(p, now, 0);
            let log: VecDeque<u64> = m.entries().collect();
            spend.units = log.len() as u64;
            spend.log = Some(log);
        }
        QuotaState::Gcra(g) => {
            let tat = g.tat();
            if tat > now {
                spend.units = (tat - now).div_ceil(p.emission);
                spend.ahead = Some((tat - now, p.emission));
                if held.strategy == Strategy::LeakyBucket {
                    spend.departure = Some(tat.saturating_sub(p.emission));
                }
            }
        }
    }
    spend
}

/// The window figure for a new quota of period `period`: the largest spend among old quotas of
/// a period inside it, or else the spend of the shortest old quota containing it.
fn window_units(spends: &[Spend], period: u64) -> u64 {
    window_value(spends, period, |s| s.units)
}

/// [`window_units`] measured by `value`.
fn window_value(spends: &[Spend], period: u64, value: impl Fn(&Spend) -> u64) -> u64 {
    let inside = spends
        .iter()
        .filter(|s| s.period <= period)
        .map(&value)
        .max();
    inside.unwrap_or_else(|| {
        spends
            .iter()
            .filter(|s| s.period > period)
            .min_by_key(|s| s.period)
            .map_or(0, &value)
    })
}

/// A spend as a bucket deficit in time at emission interval `t`: a bucket's exactly (a unit's
/// fraction too, so that two versions alternating round nothing up), a window's in whole units.
fn deficit_at(s: &Spend, t: u64) -> u64 {
    match s.ahead {
        Some((ahead, old)) => {
            let scaled = u128::from(ahead) * u128::from(t);
            u64::try_from(scaled.div_ceil(u128::from(old.max(1)))).unwrap_or(u64::MAX)
        }
        None => s.units.saturating_mul(t),
    }
}

/// Whether a bucket spend carried into the bucket quota `p` is cut by its depth: the old bucket
/// then stays as a ghost, so that converting back does not hand the cut units back.
fn cut_by(s: &Spend, p: &Params) -> bool {
    s.ahead.is_some() && s.period == p.window && deficit_at(s, p.emission) > p.tau()
}

/// The result of a conversion: the new rule's per-quota states, the ghosts to keep, and whether
/// it was exact (a moving window topped up with entries stamped `now` is not).
#[derive(Debug)]
pub(crate) struct Converted {
    pub(crate) states: Vec<QuotaState>,
    pub(crate) ghosts: Vec<Held>,
    pub(crate) exact: bool,
}

/// Converts `old` (the old rule's quotas and its ghosts) to a rule of `strategy` with quotas
/// `params`, at `now`.
pub(crate) fn convert(old: &[Held], strategy: Strategy, params: &[Params], now: u64) -> Converted {
    let spends: Vec<Spend> = old.iter().map(|h| spend_of(h, now)).collect();
    let mut exact = true;
    let states = params
        .iter()
        .map(|p| {
            let units = window_units(&spends, p.window);
            let (state, was_exact) = new_state(&spends, strategy, p, units, now);
            exact &= was_exact;
            state
        })
        .collect();
    let mut ghosts: Vec<(u64, Held)> = old
        .iter()
        .zip(&spends)
        .filter(|(h, s)| {
            let cut = strategy.is_bucket() && params.iter().any(|p| cut_by(s, p));
            (cut || !params.iter().any(|p| p.window == s.period)) && s.units > 0 && !h.is_fresh(now)
        })
        .map(|(h, s)| (s.units, h.clone()))
        .collect();
    if ghosts.len() > MAX_GHOSTS {
        ghosts.sort_by_key(|g| std::cmp::Reverse(g.0));
        tracing::debug!(
            dropped = ghosts.len() - MAX_GHOSTS,
            "a key's state keeps the {MAX_GHOSTS} most spent removed periods"
        );
        ghosts.truncate(MAX_GHOSTS);
    }
    Converted {
        states,
        ghosts: ghosts.into_iter().map(|(_, h)| h).collect(),
        exact,
    }
}

/// One new quota's state holding `units` (the window figure) at `now`; `false` when it is an
/// estimate (a moving window's entries stamped `now`).
fn new_state(
    spends: &[Spend],
    strategy: Strategy,
    p: &Params,
    units: u64,
    now: u64,
) -> (QuotaState, bool) {
    match strategy {
        Strategy::FixedWindow => (
            QuotaState::Fixed(if units > 0 {
                FixedWindow::from_parts(p.window_start(now), units)
            } else {
                FixedWindow::default()
            }),
            true,
        ),
        Strategy::FixedWindowFirstHit => {
            let start = spends
                .iter()
                .filter_map(|s| s.start)
                .filter(|&s| s <= now && now - s < p.window)
                .min()
                .unwrap_or(now);
            (
                QuotaState::Fixed(if units > 0 {
                    FixedWindow::from_parts(start, units)
                } else {
                    FixedWindow::default()
                }),
                true,
            )
        }
        Strategy::SlidingWindow => {
            let cur = u32::try_from(units).unwrap_or(u32::MAX);
            (
                QuotaState::Sliding(if units > 0 {
                    SlidingWindow::from_parts(p.window_start(now), cur, 0)
                } else {
                    SlidingWindow::default()
                }),
                true,
            )
        }
        Strategy::MovingWindow => {
            // The log of the shortest old moving window covering the new period, else the longest.
            let logs = || spends.iter().filter(|s| s.log.is_some());
            let source = logs()
                .filter(|s| s.period >= p.window)
                .min_by_key(|s| s.period)
                .or_else(|| logs().max_by_key(|s| s.period));
            let mut log: VecDeque<u64> = source
                .and_then(|s| s.log.as_ref())
                .map(|l| l.iter().copied().filter(|&ts| now - ts.min(now) < p.window))
                .into_iter()
                .flatten()
                .collect();
            let covered = source.is_some_and(|s| s.period >= p.window);
            // A covering log is exact: only windows inside the new one can prove more.
            let units = if covered {
                (spends.iter().filter(|s| s.period <= p.window))
                    .map(|s| s.units)
                    .max()
                    .unwrap_or(0)
            } else {
                units
            };
            let missing = units.saturating_sub(log.len() as u64);
            let cap = u64::from(super::MAX_MOVING_WINDOW_LIMIT).max(p.limit);
            let missing = missing.min(cap.saturating_sub(log.len() as u64));
            log.extend(std::iter::repeat_n(now, missing as usize));
            (
                QuotaState::Moving(MovingWindow::from_log(log)),
                covered || missing == 0,
            )
        }
        Strategy::TokenBucket | Strategy::LeakyBucket => {
            let tau = p.tau();
            // The deficit carries at the new interval, capped at the new depth (a key is never
            // shut for longer than the new bucket holds); what the cap cuts stays counted in a
            // ghost of the old bucket, so two versions alternating hand nothing back.
            let ahead = window_value(spends, p.window, |s| deficit_at(s, p.emission));
            let carried = now.saturating_add(ahead.min(tau));
            // A leaky bucket's queue keeps the departures it already handed out.
            let scheduled = spends
                .iter()
                .filter(|_| strategy == Strategy::LeakyBucket)
                .filter_map(|s| s.departure)
                .max()
                .map_or(0, |d| d.min(now.saturating_add(tau)));
            let tat = if ahead == 0 && scheduled <= now {
                0
            } else {
                carried.max(scheduled)
            };
            (QuotaState::Gcra(Gcra::from_tat(tat)), true)
        }
    }
}

#[cfg(test)]
mod tests {
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
}
