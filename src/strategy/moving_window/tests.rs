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
        use super::super::{QuotaState, Strategy, apply_settling as apply};
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
    let (_, v, _) = log.apply(&params, now, Op::Peek).unwrap();
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
