//! The catch-up after a gap ([`MemoryStore::catch_up`]) sweeps in the paced steps while other
//! threads keep deciding; it reads every state as of `due`, the gap's start, including states
//! those threads wrote at `now`, after `due`.
use super::*;
use crate::strategy::Strategy;

const S: u64 = 1_000_000_000;

/// The interleaving replayed step by step in one thread: thread A wins the deadline
/// (`timed_step`'s compare-and-swap) 70 h after the last decision; before A's sweep reaches
/// the key's segment, thread B (whose `tick` now sees the new deadline and does not step)
/// spends a key's whole quota at `later`; A's catch-up then reads that state as of `due`.
#[test]
fn catch_up_keeps_a_state_written_after_due_by_another_thread() {
    let t0 = 1_700_000_000 * S;
    let later = t0 + 70 * 3_600 * S;
    let mut failures = Vec::new();
    for (strategy, quotas, limit) in [
        (Strategy::SlidingWindow, "10000000/s", 10_000_000),
        (Strategy::FixedWindow, "10000000/s", 10_000_000),
        (Strategy::FixedWindowFirstHit, "4294967295/s", u32::MAX),
    ] {
        let rule = Rule::parse(strategy, quotas).unwrap();
        let store = MemoryStore::<u64>::new();
        // Some traffic at t0 sets the step deadline.
        assert!(store.decide(&1, &rule, Op::Check(1), t0).is_allowed());
        let due = store.pacing.0.next_step_at.load(Ordering::Relaxed);
        assert!(due > t0 && due <= t0 + S);
        // Thread A: `timed_step(due, later)` wins the compare-and-swap ...
        let next = later + store.pacing.0.step_every;
        store
            .pacing
            .0
            .next_step_at
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .unwrap();
        // ... thread B decides meanwhile: its tick sees `next` and does not step.
        assert!(
            store
                .decide(&7, &rule, Op::Check(limit), later)
                .is_allowed()
        );
        assert!(!store.decide(&7, &rule, Op::Check(1), later).is_allowed());
        // ... thread A starts the catch-up, which reads key 7 as of `due` on its next
        // decision, and its sweep reaches key 7's segment later.
        store.catch_up(due, later);
        // The key spent its whole quota at `later`: still rejected 1 ms later, and after the
        // sweep.
        for (what, at) in [("decision", 1), ("sweep", 2)] {
            if what == "sweep" {
                store.sweep_all(later);
            }
            let d = store.decide(&7, &rule, Op::Check(limit), later + at * 1_000_000);
            if d.is_allowed() {
                failures.push(format!(
                    "{strategy:?} {quotas}: a key spent in full at `later` by another thread \
                         was dropped by the catch-up's {what} and admitted {limit} more {at} ms \
                         later (keys held: {})",
                    store.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The first decision after a gap sweeps one segment (the paced step), not the store; the
/// keys of the segments not swept yet are read as of the gap's start (fresh: a whole quota),
/// and the paced steps finish the catch-up within a rotation.
#[test]
fn the_catch_up_runs_in_paced_steps_and_reads_unswept_keys_as_of_the_gap() {
    let t0 = 1_700_000_000 * S;
    let later = t0 + 70 * 3_600 * S;
    let rule = Rule::parse(Strategy::SlidingWindow, "10000000/s").unwrap();
    let store = MemoryStore::<u64>::new();
    for key in 0..10_000u64 {
        assert!(
            store
                .decide(&key, &rule, Op::Check(10_000_000), t0)
                .is_allowed()
        );
    }
    assert!(!store.decide(&0, &rule, Op::Check(1), t0).is_allowed());
    assert!(
        store
            .decide(&u64::MAX, &rule, Op::Check(1), later)
            .is_allowed()
    );
    // One segment of 1024 swept (about 10 keys), not all of them.
    assert!(store.len() > 10_000 - 400, "keys held: {}", store.len());
    assert_ne!(store.pacing.0.catch_up_from.load(Ordering::Relaxed), 0);
    // Spent in full 70 h ago: a whole quota again, not misread as blocked.
    for key in 0..100u64 {
        assert!(
            store
                .decide(&key, &rule, Op::Check(10_000_000), later)
                .is_allowed(),
            "key {key}"
        );
        assert!(!store.decide(&key, &rule, Op::Check(1), later).is_allowed());
    }
    for step in 1..=store.spread.count() as u64 {
        store.decide(
            &u64::MAX,
            &rule,
            Op::Check(1),
            later + step * store.pacing.0.step_every,
        );
    }
    assert_eq!(store.pacing.0.catch_up_from.load(Ordering::Relaxed), 0);
    // Left: the keys decided since the gap (101), none of the others.
    assert!(store.len() <= 101, "keys held: {}", store.len());
}

/// At the cap during a catch-up, room-making sweeps a segment the catch-up has not reached
/// before it looks at its keys: keys spent in full 70 h ago are dropped as fresh (read as of
/// the gap), not misread as blocked (which would send new keys to the overflow state) nor
/// evicted as spent.
#[test]
fn room_is_made_from_keys_the_catch_up_has_not_reached_yet() {
    let t0 = 1_700_000_000 * S;
    let later = t0 + 70 * 3_600 * S;
    let rule = Rule::parse(Strategy::SlidingWindow, "10000000/s").unwrap();
    let store = MemoryStore::<u64>::builder().max_keys(100).build();
    for key in 0..100u64 {
        assert!(
            store
                .decide(&key, &rule, Op::Check(10_000_000), t0)
                .is_allowed()
        );
    }
    for key in 1_000..1_050u64 {
        assert!(
            store.decide(&key, &rule, Op::Check(1), later).is_allowed(),
            "key {key}"
        );
    }
    assert_eq!(store.counters().overflow_hits, 0);
    assert!(store.len() <= 100);
    // None was evicted as spent (which a misread would have recorded): each has its whole
    // quota back.
    for key in 0..100u64 {
        assert!(
            store
                .decide(&key, &rule, Op::Check(10_000_000), later)
                .is_allowed(),
            "key {key}"
        );
    }
    assert_eq!(store.counters().overflow_hits, 0);
}

/// The same race with real threads: thread A's decision 70 h after the last one runs the
/// catch-up over 200 000 held keys; thread B, once A moved the deadline, spends the whole
/// quota of new keys at `later`. Every key B spent must stay rejected afterwards.
#[test]
fn catch_up_races_with_decisions_in_other_threads() {
    let t0 = 1_700_000_000 * S;
    let later = t0 + 70 * 3_600 * S;
    let rule = Rule::parse(Strategy::SlidingWindow, "10000000/s").unwrap();
    let store = MemoryStore::<u64>::new();
    for key in 0..200_000u64 {
        store.decide(&key, &rule, Op::Check(1), t0);
    }
    let due = store.pacing.0.next_step_at.load(Ordering::Relaxed);
    let a_done = AtomicBool::new(false);
    let spent = std::thread::scope(|s| {
        let a = s.spawn(|| {
            store.decide(&u64::MAX, &rule, Op::Check(1), later);
            a_done.store(true, Ordering::Release);
        });
        let b = s.spawn(|| {
            while store.pacing.0.next_step_at.load(Ordering::Relaxed) == due {
                std::hint::spin_loop();
            }
            let mut spent = Vec::new();
            let mut key = 1_000_000u64;
            while !a_done.load(Ordering::Acquire) || spent.len() < 64 {
                if store
                    .decide(&key, &rule, Op::Check(10_000_000), later)
                    .is_allowed()
                {
                    spent.push(key);
                }
                key += 1;
                if spent.len() >= 20_000 {
                    break;
                }
            }
            spent
        });
        a.join().unwrap();
        b.join().unwrap()
    });
    let readmitted: Vec<u64> = spent
        .iter()
        .copied()
        .filter(|k| {
            store
                .decide(k, &rule, Op::Check(10_000_000), later + 1_000_000)
                .is_allowed()
        })
        .collect();
    assert!(
        readmitted.is_empty(),
        "{} of {} keys spent in full by thread B at `later` during thread A's catch-up were \
             dropped and admitted another 10^7 1 ms later (first: {:?})",
        readmitted.len(),
        spent.len(),
        &readmitted[..readmitted.len().min(4)]
    );
}
