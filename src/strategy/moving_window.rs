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
    /// Runs `op` on the quotas `params` at `now`, as [`apply`](super::apply) on per-quota logs
    /// would: the reported quota and its verdict; `None` (nothing changed) when the result could
    /// differ.
    pub(crate) fn apply(
        &mut self,
        params: &[Params],
        now: u64,
        op: Op,
    ) -> Option<(usize, Verdict)> {
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
                let _ = self
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
        Some(reported)
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
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn hit(w: &mut MovingWindow, p: &Params, t: u64, cost: u64) -> Verdict {
        let v = w.check(p, t, cost);
        if v.outcome == Outcome::Allowed {
            w.commit(p, t, cost);
        }
        v
    }

    #[test]
    fn ten_per_minute_worked_example() {
        let p = Params::window(10, 60 * S);
        let mut w = MovingWindow::default();
        for (t, n) in [(10, 1), (20, 2), (30, 4), (50, 3)] {
            for _ in 0..n {
                assert_eq!(hit(&mut w, &p, t * S, 1).outcome, Outcome::Allowed);
            }
        }
        assert_eq!(
            hit(&mut w, &p, 71 * S, 1).outcome,
            Outcome::Allowed,
            ":10 is 61 s old"
        );
        let v = hit(&mut w, &p, 72 * S, 1);
        assert_eq!(v.outcome, Outcome::Rejected, ":20 is 52 s old");
        assert_eq!(v.retry_after, 8 * S);
    }

    #[test]
    fn three_per_second_worked_example() {
        let p = Params::window(3, S);
        let mut w = MovingWindow::default();
        for t in [100, 300, 600] {
            assert_eq!(hit(&mut w, &p, t * MS, 1).outcome, Outcome::Allowed);
        }
        let v = hit(&mut w, &p, 800 * MS, 1);
        assert_eq!((v.outcome, v.retry_after), (Outcome::Rejected, 300 * MS));
        assert_eq!(hit(&mut w, &p, 1110 * MS, 1).outcome, Outcome::Allowed);
    }

    #[test]
    fn regression_end_of_time_saturation_expired_entries_early() {
        // Bug: expiry as `ts.saturating_add(W) <= t` saturated to u64::MAX within W of the end of
        // u64 time, so every entry expired at once and every request was admitted.
        let p = Params::window(2, S);
        for t in [u64::MAX, u64::MAX - 1, u64::MAX - S / 2] {
            let mut w = MovingWindow::default();
            assert_eq!(hit(&mut w, &p, t, 2).outcome, Outcome::Allowed);
            let v = hit(&mut w, &p, t, 1);
            assert_eq!((v.outcome, v.reset_after), (Outcome::Rejected, S));
            assert_eq!(v.retry_after, S);
        }
    }

    #[test]
    fn the_ring_shrinks_as_its_entries_expire() {
        let p = Params::window(100_000, 60 * S);
        let mut w = MovingWindow::default();
        for i in 0..100_000 {
            hit(&mut w, &p, 100 * S + i, 1);
        }
        assert!(w.log.capacity() >= 100_000);
        // One request an hour keeps the key alive; every older entry has expired.
        let mut t = 100 * S;
        for _ in 0..3 {
            t += 3_600 * S;
            hit(&mut w, &p, t, 1);
        }
        assert_eq!(w.log.len(), 1);
        assert!(w.log.capacity() <= 8, "{}", w.log.capacity());
    }

    proptest::proptest! {
        /// One log for all the quotas of a rule answers exactly as per-quota logs, or refuses
        /// (changing nothing) and the per-quota logs split from it carry on exactly.
        #[test]
        fn a_shared_log_answers_exactly_as_per_quota_logs(
            quotas in proptest::collection::vec((1u64..8, 1u64..40), 2..6),
            steps in proptest::collection::vec((0u64..600, 0u8..16, 0u64..1000), 1..200),
        ) {
            use super::super::{QuotaState, Strategy, apply};
            let params: Vec<Params> =
                quotas.iter().map(|&(n, w)| Params::window(n, w * 100 * MS)).collect();
            let mut reference = vec![QuotaState::new(Strategy::MovingWindow); params.len()];
            let mut shared = Some(SharedLog::default());
            let mut split: Vec<QuotaState> = Vec::new();
            let mut now = 10 * S;
            for (i, &(dt, kind, x)) in steps.iter().enumerate() {
                // Mostly forward, sometimes a clock step back.
                now = if kind == 15 { now - (dt * MS).min(now) } else { now + dt * MS };
                let op = match kind {
                    0 => Op::Settle { reserved: 1, actual: 0, at: now - x * MS, bound: 0 },
                    1 => Op::Settle { reserved: 1, actual: 3, at: now - x * MS / 8, bound: 0 },
                    2 => Op::Settle { reserved: 2, actual: 1, at: now.saturating_sub(x), bound: 0 },
                    3 => Op::Peek,
                    4 if x % 9 == 0 => Op::Reset,
                    _ => Op::Check((x % 4) as u32),
                };
                let want = apply(&mut reference, Strategy::MovingWindow, &params, now, op);
                let got = match shared.as_mut() {
                    Some(log) => {
                        let before = log.clone();
                        match log.apply(&params, now, op) {
                            Some(got) => {
                                let logs: Vec<QuotaState> =
                                    log.split(&params).into_iter().map(QuotaState::Moving).collect();
                                proptest::prop_assert_eq!(&logs, &reference, "step {}", i);
                                got
                            }
                            None => {
                                proptest::prop_assert_eq!(&*log, &before);
                                split = log.split(&params).into_iter().map(QuotaState::Moving).collect();
                                shared = None;
                                apply(&mut split, Strategy::MovingWindow, &params, now, op)
                            }
                        }
                    }
                    None => apply(&mut split, Strategy::MovingWindow, &params, now, op),
                };
                proptest::prop_assert_eq!(got, want, "step {} {:?}", i, op);
                // Per-quota logs all empty: one log again (as the store does).
                if shared.is_none()
                    && split.iter().all(|s| matches!(s, QuotaState::Moving(m) if m.len() == 0))
                {
                    shared = Some(SharedLog::default());
                }
            }
        }
    }

    #[test]
    fn checks_and_prompt_settlements_stay_on_one_log() {
        // 16 quotas (10i per 60i s): checks, refunds and charges of recent reservations.
        let params: Vec<Params> = (1..=16)
            .map(|i| Params::window(10 * i, 60 * i * S))
            .collect();
        let mut log = SharedLog::default();
        let mut now = 100 * S;
        for i in 0..2000u64 {
            now += 37 * MS;
            let op = match i % 5 {
                0 => Op::Settle {
                    reserved: 1,
                    actual: 0,
                    at: now - 37 * MS,
                    bound: 0,
                },
                _ => Op::Check(1),
            };
            assert!(log.apply(&params, now, op).is_some(), "step {i}");
        }
        // The longest quota holds what the log holds: at most its limit.
        assert!(log.log.len() <= 160);
        let (_, v) = log.apply(&params, now, Op::Peek).unwrap();
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn log_never_exceeds_the_limit() {
        let p = Params::window(5, S);
        let mut w = MovingWindow::default();
        for i in 0..1000 {
            hit(&mut w, &p, i * 7 * MS, 1 + i % 3);
            assert!(w.log.len() <= 5);
            assert!(w.log.capacity() <= 8);
        }
    }
}
