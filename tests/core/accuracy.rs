//! Sliding window counter accuracy: how far the counter is from the exact
//! moving window on benign random traffic, and the adversarial two-burst trace that reaches `2N`.
//!
//! (c) Seeded deterministic Poisson traces (generator: SplitMix64 + inverse-CDF exponential gaps,
//! committed here) at 0.8, 1, 1.5 and 3 times the limit (100/minute) for 6 simulated hours each.
//! Scored two ways against the exact moving window:
//! - independent runs: total admitted by each limiter on the same arrivals (must differ by <= 3 %),
//!   and the most the counter admitted in any trailing minute (must be <= 1.25 N);
//! - per request (Cloudflare's metric), as a percentage of all requests, two ways:
//!   "same" (FA/FR same): on the counter's own admitted history, would the exact rule (< N admitted
//!   in the trailing minute) have decided the same? False allow = the counter admitted what the rule
//!   rejects; false reject = the reverse.
//!   "run" (FA/FR run): the counter's decision vs the exact limiter's decision on the same request,
//!   each limiter with its own history.
//!   Near saturation both are large by construction (the trailing count hovers around N, so each
//!   decision is a coin toss on the boundary); the totals and the trailing maximum are the figures
//!   that bound what a client gets.
//!
//! The figures are printed (`cargo test --all-features --test core accuracy -- --nocapture`).
//! Scaling: `TOLLGATE_SCALE` (default 1) runs that many seeds per rate (seed 1 is always first).

use crate::oracle;

use std::collections::VecDeque;

use oracle::{S, build, max_trailing, q, scale};
use tollgate::Strategy;

const DAY: u64 = 19_675 * 86_400 * S;
const N: u64 = 100;
const W: u64 = 60 * S;

/// SplitMix64: a tiny, fixed, portable generator, so the traces never change with a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// Poisson arrivals at `rate` requests per ns for `span` ns from `start`.
fn poisson(seed: u64, rate: f64, start: u64, span: u64) -> Vec<u64> {
    let mut rng = SplitMix64(seed);
    let mut t = start as f64;
    let end = (start + span) as f64;
    let mut out = Vec::new();
    loop {
        t += -rng.unit().ln() / rate;
        if t >= end {
            return out;
        }
        out.push(t as u64);
    }
}

struct Score {
    requests: usize,
    sliding: usize,
    moving: usize,
    max_trailing: u64,
    false_allow: usize,
    false_reject: usize,
    /// Independent runs: the counter admitted, the exact limiter (own history) rejected.
    run_allow: usize,
    /// Independent runs: the counter rejected, the exact limiter admitted.
    run_reject: usize,
}

fn score(arrivals: &[u64]) -> Score {
    let (sliding, sc) = build(Strategy::SlidingWindow, &[q("100/minute")], DAY);
    let (moving, mc) = build(Strategy::MovingWindow, &[q("100/minute")], DAY);
    let mut admitted = Vec::new();
    let mut moving_admitted = 0;
    let mut live: VecDeque<u64> = VecDeque::new(); // the counter's admitted requests in the last W
    let (mut false_allow, mut false_reject) = (0, 0);
    let (mut run_allow, mut run_reject) = (0, 0);
    for &t in arrivals {
        sc.set_nanos(t);
        mc.set_nanos(t);
        while live.front().is_some_and(|&a| t - a >= W) {
            live.pop_front();
        }
        let exact = (live.len() as u64) < N;
        let allowed = sliding.check_now(&0, 1).is_allowed();
        match (allowed, exact) {
            (true, false) => false_allow += 1,
            (false, true) => false_reject += 1,
            _ => {}
        }
        if allowed {
            admitted.push((t, 1));
            live.push_back(t);
        }
        let exact_run = moving.check_now(&0, 1).is_allowed();
        moving_admitted += usize::from(exact_run);
        match (allowed, exact_run) {
            (true, false) => run_allow += 1,
            (false, true) => run_reject += 1,
            _ => {}
        }
    }
    Score {
        requests: arrivals.len(),
        sliding: admitted.len(),
        moving: moving_admitted,
        max_trailing: max_trailing(&admitted, W),
        false_allow,
        false_reject,
        run_allow,
        run_reject,
    }
}

#[test]
fn sliding_counter_is_close_to_the_exact_log_on_poisson_traffic() {
    let span = 6 * 3600 * S;
    eprintln!("sliding window counter vs exact moving window, 100/minute, 6 h of Poisson traffic");
    eprintln!(
        "{:>5} {:>5} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "rate",
        "seed",
        "requests",
        "counter",
        "exact",
        "diff %",
        "max/N",
        "FA same%",
        "FR same%",
        "FA run%",
        "FR run%"
    );
    for (i, mult) in [0.8f64, 1.0, 1.5, 3.0].into_iter().enumerate() {
        for seed in 1..=scale() {
            let rate = mult * N as f64 / W as f64;
            let arrivals = poisson(seed * 1000 + i as u64, rate, DAY + 7 * S, span);
            let s = score(&arrivals);
            let diff = (s.sliding as f64 - s.moving as f64) / s.moving as f64 * 100.0;
            let pct = |x: usize| x as f64 / s.requests as f64 * 100.0;
            eprintln!(
                "{:>4}x {:>5} {:>8} {:>8} {:>8} {:>+8.3} {:>6.2} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                mult,
                seed,
                s.requests,
                s.sliding,
                s.moving,
                diff,
                s.max_trailing as f64 / N as f64,
                pct(s.false_allow),
                pct(s.false_reject),
                pct(s.run_allow),
                pct(s.run_reject)
            );
            assert!(
                diff.abs() <= 3.0,
                "{mult}x seed {seed}: total admitted differs by {diff:.3} %"
            );
            assert!(
                s.max_trailing * 100 <= 125 * N,
                "{mult}x seed {seed}: {} in one trailing minute > 1.25 N",
                s.max_trailing
            );
        }
    }
}

/// An attacker who times two bursts gets `2N` through in one trailing window: 100 at the
/// last nanosecond of a bucket, then a burst `f * W` into the next. The hard bound is `2N`, reached as
/// `f -> 1`; the exact moving window lets only `N` through on the same trace.
#[test]
fn two_bursts_reach_but_never_pass_2n() {
    let bucket = DAY + 10 * W; // a bucket boundary (clock-aligned)
    let mut reached = Vec::new();
    for (f_num, f_den, want) in [
        (1u64, 2u64, 150u64),
        (9, 10, 190),
        (99, 100, 199),
        (W - 2, W, 200),
    ] {
        for strategy in [Strategy::SlidingWindow, Strategy::MovingWindow] {
            let (l, clock) = build(strategy, &[q("100/minute")], bucket - 1);
            let first = (0..300).filter(|_| l.check_now(&0, 1).is_allowed()).count() as u64;
            let second_at = bucket + (u128::from(W) * u128::from(f_num) / u128::from(f_den)) as u64;
            clock.set_nanos(second_at);
            let second = (0..300).filter(|_| l.check_now(&0, 1).is_allowed()).count() as u64;
            let log: Vec<(u64, u64)> = std::iter::repeat_n((bucket - 1, 1), first as usize)
                .chain(std::iter::repeat_n((second_at, 1), second as usize))
                .collect();
            let trailing = max_trailing(&log, W);
            if strategy == Strategy::SlidingWindow {
                assert_eq!(trailing, want, "f = {f_num}/{f_den}");
                assert!(trailing <= 2 * N, "the hard bound");
                reached.push(trailing);
            } else {
                assert_eq!(trailing, N, "the exact log admits N");
            }
        }
    }
    eprintln!("two bursts at f = 0.5, 0.9, 0.99, 1 - 2 ns/W: {reached:?} in one trailing minute");
}
