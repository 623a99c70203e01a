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
mod tests;
