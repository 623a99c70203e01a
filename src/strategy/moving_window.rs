//! Moving window (sliding log): the times of admitted units; a request is admitted when fewer than
//! `N` units lie in the last `W`. Exact, with `O(N)` memory per key: the log is a ring that grows
//! lazily and never holds more than `N` entries.

use std::collections::VecDeque;

use super::{Op, Params, Verdict};
use crate::decision::Outcome;

/// The largest limit the moving window accepts ([`Rule::MAX_MOVING_WINDOW_LIMIT`](crate::Rule)).
pub(crate) const MAX_MOVING_WINDOW_LIMIT: u32 = 1 << 20;

/// The verdict on `cost` of a quota whose log is `log[from..]` at time `t` (at or after its newest
/// entry), its expired entries dropped.
#[inline(always)]
fn verdict(p: &Params, t: u64, cost: u64, log: &VecDeque<u64>, from: usize) -> Verdict {
    let used = (log.len() - from) as u64;
    // `from <= len`: the newest entry is the quota's whenever it has one.
    let reset = match log.back() {
        Some(&ts) if used > 0 => p.window - (t - ts),
        _ => 0,
    };
    if cost > p.limit {
        return Verdict::exceeds(p.limit, p.limit.saturating_sub(used), reset);
    }
    if used + cost <= p.limit {
        let reset = if cost > 0 { p.window } else { reset };
        return Verdict::allowed(p.limit, p.limit - used - cost, reset);
    }
    // The oldest entry whose expiry leaves room for `cost`.
    let k = (used + cost - p.limit - 1) as usize;
    let wait = log.get(from + k).map_or(0, |&ts| p.window - (t - ts));
    Verdict::rejected(p.limit, p.limit.saturating_sub(used), reset, wait)
}

/// Returns memory as entries expire: a ring at most a quarter full shrinks to twice its entries
/// (at least 4). Amortised O(1): a shrink copies the entries left, and at least as many expired
/// (were admitted, and paid for) since the ring last had this size.
#[inline]
fn shrink(log: &mut VecDeque<u64>) {
    let capacity = log.capacity();
    if capacity > 4 && log.len() <= capacity / 4 {
        shrink_now(log);
    }
}

#[cold]
#[inline(never)]
fn shrink_now(log: &mut VecDeque<u64>) {
    log.shrink_to((2 * log.len()).max(4));
}

/// Appends `cost` entries at `t`, growing the ring geometrically but never past `limit` entries:
/// it stays O(N).
#[inline]
fn push(log: &mut VecDeque<u64>, limit: u64, t: u64, cost: u64) {
    let needed = log.len() + cost as usize;
    if needed > log.capacity() {
        let target = (log.capacity() * 2).max(needed).max(4).min(limit as usize);
        log.reserve_exact(target.saturating_sub(log.len()));
    }
    log.extend(std::iter::repeat_n(t, cost as usize));
}

/// The log of one key under one quota: one timestamp per admitted unit of cost, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MovingWindow {
    log: VecDeque<u64>,
}

impl MovingWindow {
    /// Drops expired entries and says whether `cost` fits, without consuming it.
    #[inline]
    pub(crate) fn check(&mut self, p: &Params, now: u64, cost: u64) -> Verdict {
        let t = self.now(now);
        // Ages, not expiry times: `t >= ts` for every entry (see `now`), and `ts + W` would saturate
        // near the end of `u64` time and expire entries early (over-admission).
        while self.log.front().is_some_and(|&ts| t - ts >= p.window) {
            self.log.pop_front();
        }
        self.shrink();
        verdict(p, t, cost, &self.log, 0)
    }

    /// A log of `count` entries at `at` (for stores that restore a state from a summary of it).
    pub(crate) fn filled(count: u64, at: u64) -> Self {
        Self {
            log: std::iter::repeat_n(at, usize::try_from(count).unwrap_or(usize::MAX)).collect(),
        }
    }

    /// A log of these entries, oldest first (a converted state).
    pub(crate) fn from_log(log: VecDeque<u64>) -> Self {
        Self { log }
    }

    /// The entries, oldest first.
    pub(crate) fn entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.log.iter().copied()
    }

    /// The number of entries (admitted units not yet known to be expired).
    pub(crate) fn len(&self) -> usize {
        self.log.len()
    }

    /// Returns memory as entries expire (see [`shrink`]).
    #[inline]
    fn shrink(&mut self) {
        shrink(&mut self.log);
    }

    /// Appends `cost` entries at `now` after a successful [`check`](Self::check).
    #[inline]
    pub(crate) fn commit(&mut self, p: &Params, now: u64, cost: u64) {
        let t = self.now(now);
        push(&mut self.log, p.limit, t, cost);
    }

    /// Settles a reservation of `reserved` made at `at` for `actual`, at the reservation's own
    /// timestamp: a refund removes entries of time `at` (never another request's newer ones, which
    /// would over-admit when settlements arrive out of order), a charge adds entries at `at`. Nothing
    /// changes once `at` has left the window. The log never holds more than `N` entries: the charge
    /// beyond a full log is dropped, and the number dropped is returned.
    pub(crate) fn settle(
        &mut self,
        p: &Params,
        now: u64,
        at: u64,
        reserved: u64,
        actual: u64,
    ) -> u64 {
        let _ = self.check(p, now, 0);
        let t = self.now(now);
        if at > t || t - at >= p.window {
            return 0;
        }
        // The reservation's entries were written at `at`, or later when the log already held a
        // newer entry (time never runs backwards for a key: concurrent callers read the clock
        // before taking the key's lock, so their times reach the store out of order). A refund
        // removes the oldest entries at or after `at`: never one from before `at`, so it frees no
        // room earlier than giving back the reservation's own entries would (unless the key was
        // reset since and refilled: then at most the reservation's cost is given back).
        let from = self.log.partition_point(|&ts| ts < at);
        if actual <= reserved {
            let mine = self
                .log
                .range(from..)
                .take(usize::try_from(reserved - actual).unwrap_or(usize::MAX))
                .count();
            self.log.drain(from..from + mine);
            self.shrink();
            return 0;
        }
        let extra = actual - reserved;
        let room = p.limit.saturating_sub(self.log.len() as u64);
        let put = extra.min(room);
        if put > 0 {
            let at_end = self.log.partition_point(|&ts| ts <= at);
            let tail: Vec<u64> = self.log.drain(at_end..).collect();
            self.log.reserve_exact(put as usize + tail.len());
            self.log.extend(std::iter::repeat_n(at, put as usize));
            self.log.extend(tail);
        }
        extra - put
    }

    /// When the state becomes equivalent to a new key's.
    #[inline]
    pub(crate) fn fresh_at(&self, p: &Params) -> u64 {
        self.log.back().map_or(0, |&ts| ts.saturating_add(p.window))
    }

    /// Time never runs backwards for a key: a clock step back is treated as time standing still.
    fn now(&self, now: u64) -> u64 {
        self.log.back().map_or(now, |&newest| now.max(newest))
    }
}

/// The logs of one key under the quotas of a moving-window rule, held as one: the per-quota log
/// of quota `i` is the entries less than `W_i` old at [`last`](Self::last), the time of the last
/// operation, and the log keeps the entries less than the longest window old (at most the largest
/// limit of them). Answers exactly as per-quota logs; an operation whose effect would differ
/// between the quotas (a clock that went back, a settlement counted by some quotas only while
/// others still hold entries, a charge that fills the quotas unequally) is refused, and the
/// caller runs it on [`split`](Self::split) logs instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SharedLog {
    log: MovingWindow,
    last: u64,
}

impl SharedLog {
    /// Runs `op` on the quotas `params` at `now`, as [`apply_settling`](super::apply_settling) on
    /// per-quota logs would: the reported quota, its verdict and the settled units the log could
    /// not hold; `None` (nothing changed) when the result could differ.
    pub(crate) fn apply(
        &mut self,
        params: &[Params],
        now: u64,
        op: Op,
    ) -> Option<(usize, Verdict, u64)> {
        let longest = params
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| p.window)
            .map(|(i, _)| i)?;
        let long = params.get(longest)?;
        if now < self.last {
            return None;
        }
        let from =
            |log: &VecDeque<u64>, p: &Params| log.partition_point(|&ts| now - ts >= p.window);
        if let Op::Settle {
            reserved,
            actual,
            at,
            ..
        } = op
        {
            let counts = |p: &Params| at <= now && now - at < p.window;
            let len = self.log.log.len();
            // Quotas that do not count the settlement must hold none of the entries it moves,
            // and a charge must put as many entries in every quota that counts it.
            let apart = params
                .iter()
                .any(|p| !counts(p) && from(&self.log.log, p) < len);
            let room = |p: &Params| {
                p.limit
                    .saturating_sub((len - from(&self.log.log, p)) as u64)
            };
            let extra = u64::from(actual.saturating_sub(reserved));
            let mut puts = params
                .iter()
                .filter(|p| counts(p))
                .map(|p| extra.min(room(p)));
            let first = puts.next();
            if first.is_some() && (apart || puts.any(|put| Some(put) != first)) {
                return None;
            }
        }
        // Every entry is at or before `last`: the time of each quota's log is `now`.
        let _ = self.log.check(long, now, 0);
        let mut dropped = 0;
        let cost = match op {
            Op::Check(c) => u64::from(c),
            Op::Peek | Op::StepBack { .. } => 0,
            Op::Reset => {
                self.log = MovingWindow::default();
                0
            }
            Op::Settle {
                reserved,
                actual,
                at,
                ..
            } => {
                // Checked above: the same in every quota that counts it, or counted by none.
                dropped = self
                    .log
                    .settle(long, now, at, reserved.into(), actual.into());
                0
            }
        };
        let log = &self.log.log;
        let mut all_allowed = true;
        let verdicts = params.iter().map(|p| {
            let v = verdict(p, now, cost, log, from(log, p));
            all_allowed &= v.outcome == Outcome::Allowed;
            v
        });
        let reported = super::reported(verdicts).unwrap_or((0, Verdict::allowed(0, 0, 0)));
        if all_allowed && cost > 0 {
            let most = params.iter().map(|p| p.limit).max().unwrap_or(0);
            push(&mut self.log.log, most, now, cost);
        }
        self.last = now;
        Some((reported.0, reported.1, dropped))
    }

    /// The per-quota logs.
    pub(crate) fn split(&self, params: &[Params]) -> Vec<MovingWindow> {
        params
            .iter()
            .map(|p| MovingWindow {
                log: (self.log.log.iter())
                    .filter(|&&ts| self.last - ts < p.window)
                    .copied()
                    .collect(),
            })
            .collect()
    }

    /// When the logs become a new key's.
    pub(crate) fn fresh_at(&self, params: &[Params]) -> u64 {
        let longest = params.iter().map(|p| p.window).max().unwrap_or(0);
        (self.log.log.back()).map_or(0, |&ts| ts.saturating_add(longest))
    }
}

#[cfg(test)]
mod tests;
