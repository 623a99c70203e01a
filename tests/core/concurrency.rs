//! In-memory concurrency, on a `ManualClock`.
//!
//! - One key, limit 1000, clock frozen, 2 threads and 8 threads hammering it: exactly 1000
//!   admitted for every strategy and for a several-quota rule (and `cost x admitted` consumed).
//!   Huge quotas under 2 threads (governor #203/#207).
//! - A sweeper calling `limiter.sweep()` in a tight loop while 2 threads hammer 1000 keys,
//!   across phases where the clock jumps by one horizon (so half the keys go idle and get evicted
//!   while the others are live): every key admits exactly its limit in every phase it is used (no
//!   live key reset), no deadlock (watchdog), nothing left after the last horizon.
//! - Key A hammered at 100x its limit while key B sends exactly its limit: B admits all.
//!
//! Sizes: by default 2 threads x 50,000 and 8 threads x 12,500 attempts per strategy (a debug build
//! on 2 shared cores). `TOLLGATE_SCALE=10` (or more) runs the full sizes: 2 x 5*10^5 and
//! 8 x 5*10^5 attempts (use `--release`: `TOLLGATE_SCALE=10 cargo test --release --all-features
//! --test core concurrency`). `TOLLGATE_SCALE` also multiplies the phases of the sweeper test.

use crate::oracle;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, mpsc};
use std::time::Duration;

use oracle::{Limiter, S, build, q, scale};
use tollgate::{Quota, Strategy};

const DAY: u64 = 19_675 * 86_400 * S;

fn attempts_per_thread(threads: usize) -> u64 {
    if scale() >= 10 {
        500_000
    } else if threads <= 2 {
        50_000
    } else {
        12_500
    }
}

/// Runs `f` on a thread and fails the test if it has not finished within `limit` (a deadlock).
fn watchdog<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => {
            handle.join().expect("worker thread");
            v
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("watchdog: no progress in {limit:?} (deadlock?)")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The closure panicked: surface its panic.
            match handle.join() {
                Err(p) => std::panic::resume_unwind(p),
                Ok(()) => unreachable!("sent nothing and did not panic"),
            }
        }
    }
}

/// `threads` threads x `per_thread` attempts of `cost` on one key, started together. Returns the
/// number admitted.
fn hammer(l: &Limiter, key: u64, threads: usize, per_thread: u64, cost: u32) -> u64 {
    let barrier = Barrier::new(threads);
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                let mut mine = 0;
                for _ in 0..per_thread {
                    mine += u64::from(l.check_now(&key, cost).is_allowed());
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    admitted.into_inner()
}

fn rules() -> Vec<(Strategy, Vec<Quota>)> {
    let mut all: Vec<(Strategy, Vec<Quota>)> = Strategy::ALL
        .iter()
        .map(|&s| (s, vec![q("1000/hour")]))
        .collect();
    for s in Strategy::ALL {
        all.push((s, vec![q("1000/hour"), q("1500/day"), q("5000/7d")]));
    }
    all
}

fn exact_count(threads: usize) {
    let per_thread = attempts_per_thread(threads);
    for (strategy, quotas) in rules() {
        let (l, _clock) = build(strategy, &quotas, DAY + 1234);
        let admitted = hammer(&l, 42, threads, per_thread, 1);
        assert_eq!(
            admitted, 1000,
            "{strategy} {quotas:?}: {threads} threads x {per_thread} attempts"
        );
        let d = l.peek_now(&42);
        assert_eq!(d.remaining(), 0, "{strategy}: consumed == admitted x cost");
        let stats = l.stats();
        assert_eq!(stats.allowed, 1000);
        assert_eq!(stats.rejected, threads as u64 * per_thread - 1000);
    }
}

#[test]
fn two_threads_one_key_exactly_the_limit() {
    exact_count(2);
}

#[test]
fn eight_threads_one_key_exactly_the_limit() {
    exact_count(8);
}

#[test]
fn cost_three_consumes_admitted_times_cost() {
    for strategy in Strategy::ALL {
        let (l, _clock) = build(strategy, &[q("1000/hour")], DAY + 99);
        let admitted = hammer(&l, 7, 2, 20_000, 3);
        assert_eq!(admitted, 333, "{strategy}");
        assert_eq!(l.peek_now(&7).remaining(), 1, "{strategy}: 1000 - 3 x 333");
    }
}

#[test]
fn huge_quotas_under_two_threads() {
    // governor #203/#207: huge quotas failed in parallel.
    let per_thread = 10_000;
    for (strategy, text) in [
        (Strategy::FixedWindow, "4294967295/hour"),
        (Strategy::FixedWindowFirstHit, "4294967295/hour"),
        (Strategy::SlidingWindow, "4294967295/hour"),
        (Strategy::MovingWindow, "1048576/hour"),
        (Strategy::TokenBucket, "4294967295/hour"),
        (Strategy::LeakyBucket, "1000000000/second"),
    ] {
        let quota = q(text);
        let (l, _clock) = build(strategy, &[quota], DAY + 5);
        let admitted = hammer(&l, 1, 2, per_thread, 1);
        assert_eq!(admitted, 2 * per_thread, "{strategy} {text}: all admitted");
        let d = l.peek_now(&1);
        assert_eq!(
            u64::from(d.remaining()),
            u64::from(quota.limit()) - 2 * per_thread,
            "{strategy} {text}"
        );
    }
}

/// See the module docs. Keys `0..1000`; even keys are hammered in every phase, odd keys only
/// in even phases, so in odd phases the odd keys are idle and the sweeper evicts them while the
/// even keys are live and hammered.
#[test]
fn eviction_racing_with_traffic() {
    let phases = 6 * scale();
    for strategy in Strategy::ALL {
        let quota = q("5/second");
        let n = if strategy.is_bucket() {
            u64::from(quota.burst())
        } else {
            u64::from(quota.limit())
        };
        watchdog(Duration::from_secs(60), move || {
            let (l, clock) = build(strategy, &[quota], DAY);
            let horizon = u64::try_from(l.rule().horizon().as_nanos()).expect("fits");
            let keys = 1000u64;
            let admitted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
            let done = AtomicBool::new(false);
            let barrier = Barrier::new(3);
            let sweeps = AtomicU64::new(0);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !done.load(Ordering::Relaxed) {
                        l.sweep();
                        sweeps.fetch_add(1, Ordering::Relaxed);
                    }
                });
                for worker in 0..2u64 {
                    let (l, admitted, barrier) = (&l, &admitted, &barrier);
                    s.spawn(move || {
                        for phase in 0..phases {
                            barrier.wait(); // the clock is set
                            for round in 0..n {
                                for i in 0..keys {
                                    // The two workers walk the keys in opposite orders.
                                    let key = if worker == 0 { i } else { keys - 1 - i };
                                    if key % 2 == 1 && phase % 2 == 1 {
                                        continue;
                                    }
                                    let _ = round;
                                    if l.check_now(&key, 1).is_allowed() {
                                        admitted[key as usize].fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            barrier.wait(); // phase done
                        }
                    });
                }
                for phase in 0..phases {
                    clock.set_nanos(DAY + phase * horizon);
                    barrier.wait();
                    barrier.wait();
                    // Workers wait; let the sweeper finish two more passes: in odd phases the idle
                    // odd keys are gone and every even (live) key is still held.
                    let seen = sweeps.load(Ordering::Relaxed);
                    while sweeps.load(Ordering::Relaxed) < seen + 2 {
                        std::thread::yield_now();
                    }
                    let held = if phase % 2 == 1 { keys / 2 } else { keys };
                    assert_eq!(l.store().len() as u64, held, "{strategy}: phase {phase}");
                }
                done.store(true, Ordering::Relaxed);
            });
            for (key, a) in admitted.iter().enumerate() {
                let used_phases = if key % 2 == 0 {
                    phases
                } else {
                    phases.div_ceil(2)
                };
                assert_eq!(
                    a.load(Ordering::Relaxed),
                    n * used_phases,
                    "{strategy}: key {key} admitted more or less than its limit per phase"
                );
            }
            assert!(sweeps.load(Ordering::Relaxed) > 0);
            clock.set_nanos(DAY + phases * horizon);
            l.sweep();
            assert_eq!(
                l.store().len(),
                0,
                "{strategy}: every key idle past its horizon"
            );
        });
    }
}

#[test]
fn key_isolation() {
    for strategy in Strategy::ALL {
        let (l, _clock) = build(strategy, &[q("100/hour")], DAY + 17);
        let barrier = Barrier::new(2);
        let (a_admitted, b_admitted) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                barrier.wait();
                (0..100 * 100)
                    .filter(|_| l.check_now(&1, 1).is_allowed())
                    .count()
            });
            let b = s.spawn(|| {
                barrier.wait();
                (0..100).filter(|_| l.check_now(&2, 1).is_allowed()).count()
            });
            (a.join().expect("a"), b.join().expect("b"))
        });
        assert_eq!(a_admitted, 100, "{strategy}: A gets its limit");
        assert_eq!(
            b_admitted, 100,
            "{strategy}: B admits exactly its limit, untouched by A"
        );
        assert_eq!(l.peek_now(&2).remaining(), 0);
    }
}
