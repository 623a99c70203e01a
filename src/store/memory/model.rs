//! Model checks of the packed per-key cell, built only under
//! `--cfg tollgate_loom` or `--cfg shuttle` (see `scripts/long.sh`; not `--cfg loom`, which tokio
//! reacts to by dropping `tokio::net`, breaking the dev-dependencies):
//!
//! ```text
//! RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom
//! RUSTFLAGS="--cfg shuttle" CARGO_TARGET_DIR=target/shuttle cargo test --release --lib shuttle
//! ```
//!
//! What is checked is linearizability against the sequential semantics: whatever the interleaving,
//! the verdicts the threads got and the final word are those of *some* sequential order of the same
//! operations (each thread's own in program order), replayed from the same initial state through
//! [`PackedRule::apply`] on a plain cell *and* through the pure arithmetic
//! ([`crate::strategy::apply`]), the two agreeing at every step. That covers "admitted equals the
//! model" (the admissions are the replay's) and "no torn state" (the final word is the replay's,
//! bit for bit).
//!
//! - loom explores every interleaving (and every value a relaxed load may return) of 2 threads x 2
//!   checks; the order is found by trying every merge of the threads' operations.
//! - shuttle runs random schedules of a clock-advancing thread and 2 consumers; there the order is
//!   not searched but logged: every access to the cell is recorded in one total order, an
//!   operation takes effect at its last access, and the recorded successful swaps must chain.

#![cfg(test)]

use std::sync::atomic::{AtomicU64, Ordering};

use super::packed::{Cell, PackedRule, USED};
use crate::decision::Outcome;
use crate::rule::Rule;
use crate::strategy::{self, Op, QuotaState, Strategy, Verdict};

const S: u64 = 1_000_000_000;
/// A second-aligned instant well inside the packed range.
const T: u64 = 1_000_000 * S;

/// One step of a sequential history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// `PackedRule::apply(op)` at `now`, inserting a new key first if the entry is absent.
    Apply(u64, Op),
    /// One pass of eviction at `now` under the shard's write lock, as `Table::make_room` does:
    /// remove a fresh key; keep a blocked one; clear the second-chance bit of a used one; remove an
    /// unused one.
    Evict(u64),
    /// The second-chance bit cleared by a lone `fetch_and`, racing with the swaps.
    ClearUsed,
}

/// A rule under test and its sequential semantics.
struct Model {
    strategy: Strategy,
    rule: Rule,
    packed: PackedRule,
}

/// What a sequential replay gives: each `Apply`'s verdict, in order, and the final entry.
#[derive(Debug, PartialEq, Eq)]
struct Replay {
    verdicts: Vec<Verdict>,
    word: Option<u64>,
}

impl Model {
    fn new(strategy: Strategy, quota: &str) -> Self {
        let rule = Rule::parse(strategy, quota).unwrap();
        let packed = PackedRule::for_rule(&rule).expect("a packable rule");
        Self {
            strategy,
            rule,
            packed,
        }
    }

    /// Replays `steps` from the entry `start` (`None`: absent) whose strategy state is `reference`,
    /// through `PackedRule::apply` on a plain cell and through `strategy::apply`, asserting they
    /// agree at every step.
    fn replay_from(
        &self,
        start: Option<u64>,
        mut reference: Vec<QuotaState>,
        steps: impl IntoIterator<Item = Step>,
    ) -> (Replay, Vec<QuotaState>) {
        let mut entry = start.map(AtomicU64::new);
        let mut verdicts = Vec::new();
        for step in steps {
            match step {
                Step::Apply(now, op) => {
                    let cell = entry.get_or_insert_with(|| {
                        reference = vec![QuotaState::new(self.strategy)];
                        AtomicU64::new(0)
                    });
                    let got = self.packed.apply(&*cell, op, now);
                    let (_, want) =
                        strategy::apply(&mut reference, self.strategy, self.rule.nanos(), now, op);
                    assert_eq!(got, want, "packed and pure arithmetic disagree at {step:?}");
                    verdicts.push(got);
                }
                Step::Evict(now) => {
                    if let Some(cell) = &mut entry {
                        let word = *cell.get_mut();
                        if self.evicts(cell, now) {
                            // Only a fresh key or an unused key with room is removed.
                            assert!(
                                self.packed.is_fresh(word, now, now)
                                    || self.packed.blocked_until(word, now) <= now
                            );
                            entry = None;
                        }
                    }
                }
                Step::ClearUsed => {
                    if let Some(cell) = &entry {
                        cell.fetch_and(!USED, Ordering::Relaxed);
                    }
                }
            }
        }
        let word = entry.map(AtomicU64::into_inner);
        (Replay { verdicts, word }, reference)
    }

    /// The entry made by `setup` from a new key, and its strategy state.
    #[cfg(tollgate_loom)]
    fn prepare(&self, setup: &[Step]) -> (Option<u64>, Vec<QuotaState>) {
        let (r, reference) = self.replay_from(
            None,
            vec![QuotaState::new(self.strategy)],
            setup.iter().copied(),
        );
        (r.word, reference)
    }

    /// One eviction pass on a held cell (exclusive access, as under the shard's write lock):
    /// whether the entry is to be removed. Clears the second-chance bit by `fetch_and` when it
    /// keeps a used key.
    fn evicts(&self, cell: &impl EvictableCell, now: u64) -> bool {
        let word = cell.word();
        if self.packed.is_fresh(word, now, now) {
            true
        } else if self.packed.blocked_until(word, now) > now {
            false
        } else {
            cell.clear_used() & USED == 0
        }
    }
}

/// What an eviction pass needs of a cell.
trait EvictableCell {
    fn word(&self) -> u64;
    /// `fetch_and(!USED)`: the previous word.
    fn clear_used(&self) -> u64;
}

impl EvictableCell for AtomicU64 {
    fn word(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }

    fn clear_used(&self) -> u64 {
        self.fetch_and(!USED, Ordering::Relaxed)
    }
}

/// Every order of `threads`' steps that keeps each thread's own order.
fn merges(threads: &[Vec<Step>]) -> Vec<Vec<(usize, Step)>> {
    fn go(
        threads: &[Vec<Step>],
        next: &mut [usize],
        current: &mut Vec<(usize, Step)>,
        out: &mut Vec<Vec<(usize, Step)>>,
    ) {
        let mut done = true;
        for t in 0..threads.len() {
            if let Some(&step) = threads[t].get(next[t]) {
                done = false;
                next[t] += 1;
                current.push((t, step));
                go(threads, next, current, out);
                current.pop();
                next[t] -= 1;
            }
        }
        if done {
            out.push(current.clone());
        }
    }
    let mut out = Vec::new();
    go(
        threads,
        &mut vec![0; threads.len()],
        &mut Vec::new(),
        &mut out,
    );
    out
}

/// The admissions among `verdicts`.
fn admitted<'a>(verdicts: impl IntoIterator<Item = &'a Verdict>) -> usize {
    verdicts
        .into_iter()
        .filter(|v| v.outcome == Outcome::Allowed)
        .count()
}

/// Asserts that some merge of `threads` (each thread's steps in its order), replayed from the entry
/// made by `setup`, gives each thread the verdicts in `observed` (one list per thread, its
/// `Apply`s in order) and leaves the entry `word`.
#[cfg(tollgate_loom)]
fn assert_linearizable(
    model: &Model,
    setup: &[Step],
    threads: &[Vec<Step>],
    observed: &[Vec<Verdict>],
    word: Option<u64>,
) {
    let (start, reference) = model.prepare(setup);
    for order in merges(threads) {
        let (replay, _) = model.replay_from(
            start,
            reference.clone(),
            order.iter().map(|&(_, step)| step),
        );
        if replay.word != word {
            continue;
        }
        let mut per_thread = vec![Vec::new(); threads.len()];
        let applies = order
            .iter()
            .filter(|(_, step)| matches!(step, Step::Apply(..)));
        for ((t, _), v) in applies.zip(&replay.verdicts) {
            per_thread[*t].push(*v);
        }
        if per_thread == observed {
            return;
        }
    }
    panic!(
        "{} {:?}: no sequential order gives verdicts {observed:?} and word {word:#x?} \
         (threads {threads:?}, setup {setup:?})",
        model.strategy,
        model.rule.nanos()
    );
}

/// The rules modelled: the five packed layouts at 3 per second (a bucket of 3).
fn rules_3_per(period: &str) -> Vec<Model> {
    [
        Strategy::TokenBucket,
        Strategy::LeakyBucket,
        Strategy::FixedWindow,
        Strategy::FixedWindowFirstHit,
        Strategy::SlidingWindow,
    ]
    .into_iter()
    .map(|s| Model::new(s, &format!("3/{period}")))
    .collect()
}

#[test]
fn merges_are_every_interleaving() {
    let a = vec![Step::ClearUsed, Step::ClearUsed];
    let b = vec![Step::Evict(0), Step::Evict(1)];
    let all = merges(&[a, b]);
    assert_eq!(all.len(), 6);
    assert!(all.iter().all(|m| m.len() == 4));
    // Distinct as sequences of thread indices (which thread moves at each step).
    let mut distinct: Vec<Vec<usize>> = all
        .iter()
        .map(|m| m.iter().map(|&(t, _)| t).collect())
        .collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 6);
}

#[test]
fn the_reference_admits_three_of_four_at_one_instant() {
    for model in rules_3_per("s") {
        let (replay, _) = model.replay_from(
            None,
            vec![QuotaState::new(model.strategy)],
            [Step::Apply(T, Op::Check(1)); 4],
        );
        assert_eq!(admitted(&replay.verdicts), 3, "{}", model.strategy);
        assert!(replay.word.unwrap() & USED != 0);
    }
}

#[cfg(tollgate_loom)]
mod loom_models {
    //! Exhaustive: every interleaving of the load / compare-and-swap loops, and every value a
    //! relaxed load may return (loom's model of the C++ memory model), of 2 threads x 2 checks.

    use loom::sync::atomic::AtomicU64;
    use loom::sync::{Arc, RwLock};
    use std::sync::atomic::Ordering;

    /// The rule is immutable: shared with a plain `Arc` across models (loom's own must be made
    /// inside one).
    type Shared<T> = std::sync::Arc<T>;

    use super::*;

    // As the store's `AtomicU64` impl: relaxed, weak compare-and-swap.
    impl Cell for AtomicU64 {
        fn load(&self) -> u64 {
            AtomicU64::load(self, Ordering::Relaxed)
        }

        fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
            self.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed)
        }
    }

    impl EvictableCell for AtomicU64 {
        fn word(&self) -> u64 {
            self.load(Ordering::Relaxed)
        }

        fn clear_used(&self) -> u64 {
            self.fetch_and(!USED, Ordering::Relaxed)
        }
    }

    /// `loom::model(f)`, asserting that it explored more than one execution; prints how many.
    fn explore(test: &str, model: &Model, f: impl Fn() + Sync + Send + 'static) {
        let runs = Shared::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let started = std::time::Instant::now();
        loom::model(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            f();
        });
        let runs = runs.load(Ordering::Relaxed);
        eprintln!(
            "{test} {}: {runs} executions in {:.1?}",
            model.strategy,
            started.elapsed()
        );
        assert!(runs > 1, "loom explored a single execution");
    }

    /// Runs 2 threads, each applying its steps (all `Apply`) to one cell starting from the word
    /// `setup` makes, and returns their verdicts and the final word.
    fn run_two(
        model: &Shared<Model>,
        setup: &[Step],
        threads: &[Vec<Step>; 2],
    ) -> (Vec<Vec<Verdict>>, u64) {
        let start = model.prepare(setup).0.unwrap_or(0);
        let cell = Arc::new(AtomicU64::new(start));
        let handles: Vec<_> = threads
            .iter()
            .map(|steps| {
                let (model, cell, steps) = (model.clone(), cell.clone(), steps.clone());
                loom::thread::spawn(move || {
                    steps
                        .iter()
                        .map(|step| match *step {
                            Step::Apply(now, op) => model.packed.apply(&*cell, op, now),
                            _ => unreachable!("consumers only apply"),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let observed = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (observed, Cell::load(&*cell))
    }

    /// 2 threads x 2 checks of cost 1, all at one instant, on a new key: exactly 3 admitted (the
    /// limit) in every interleaving, and the verdicts and the final word are a sequential order's.
    #[test]
    fn loom_two_threads_two_checks_at_one_instant() {
        for model in rules_3_per("s") {
            let model = Shared::new(model);
            let threads = [
                vec![Step::Apply(T, Op::Check(1)); 2],
                vec![Step::Apply(T, Op::Check(1)); 2],
            ];
            explore("loom_two_threads_two_checks_at_one_instant", &model, {
                let model = model.clone();
                move || {
                    let (observed, word) = run_two(&model, &[], &threads);
                    assert_eq!(admitted(observed.iter().flatten()), 3, "{}", model.strategy);
                    assert_linearizable(&model, &[], &threads, &observed, Some(word));
                }
            });
        }
    }

    /// 2 threads x 2 checks at their own times, across a window edge and a bucket's refill, on a
    /// key that already has history: the verdicts and the final word are a sequential order's
    /// (the times differing, how many are admitted depends on the order).
    #[test]
    fn loom_two_threads_two_checks_at_their_own_times() {
        let setup = [
            Step::Apply(T - S / 2, Op::Check(1)),
            Step::Apply(T - S / 10, Op::Check(1)),
        ];
        for model in rules_3_per("s") {
            let model = Shared::new(model);
            let threads = [
                vec![
                    Step::Apply(T - S / 20, Op::Check(1)),
                    Step::Apply(T + S / 10, Op::Check(1)),
                ],
                vec![
                    Step::Apply(T - S / 50, Op::Check(1)),
                    Step::Apply(T + S / 3, Op::Check(1)),
                ],
            ];
            explore("loom_two_threads_two_checks_at_their_own_times", &model, {
                let model = model.clone();
                move || {
                    let (observed, word) = run_two(&model, &setup, &threads);
                    assert_linearizable(&model, &setup, &threads, &observed, Some(word));
                }
            });
        }
    }

    /// 2 threads x 2 checks at one instant while a third clears the second-chance bit with a lone
    /// `fetch_and` (no lock: stronger than eviction, which holds the shard's write lock): the
    /// clearing read-modify-write never makes a swap lose an admission.
    #[test]
    fn loom_second_chance_bit_cleared_during_checks() {
        for model in rules_3_per("s") {
            let model = Shared::new(model);
            explore("loom_second_chance_bit_cleared_during_checks", &model, {
                let model = model.clone();
                move || {
                    let cell = Arc::new(AtomicU64::new(0));
                    let consumers: Vec<_> = (0..2)
                        .map(|_| {
                            let (model, cell) = (model.clone(), cell.clone());
                            loom::thread::spawn(move || {
                                (0..2)
                                    .map(|_| model.packed.apply(&*cell, Op::Check(1), T))
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    cell.fetch_and(!USED, Ordering::Relaxed);
                    let observed: Vec<_> =
                        consumers.into_iter().map(|h| h.join().unwrap()).collect();
                    let word = Cell::load(&*cell);
                    assert_eq!(admitted(observed.iter().flatten()), 3, "{}", model.strategy);
                    let threads = [
                        vec![Step::Apply(T, Op::Check(1)); 2],
                        vec![Step::Apply(T, Op::Check(1)); 2],
                        vec![Step::ClearUsed],
                    ];
                    let mut with_evictor = observed;
                    with_evictor.push(Vec::new());
                    assert_linearizable(&model, &[], &threads, &with_evictor, Some(word));
                }
            });
        }
    }

    /// The store's arrangement: the entry sits in a map whose read lock keeps it in place while 2
    /// threads x 2 checks swap its word (inserting it under the write lock when absent), and an
    /// eviction pass under the write lock removes it when fresh or unused, or clears its
    /// second-chance bit. The key starts with old, expired history (fresh at `T`). Every admission
    /// is accounted for: the verdicts and the final entry are a sequential order's, eviction
    /// included (a removal only ever drops a state equivalent to a new key's here).
    #[test]
    fn loom_eviction_under_the_write_lock_loses_no_admission() {
        let setup = [Step::Apply(T - 10 * S, Op::Check(1))];
        for model in rules_3_per("s") {
            let model = Shared::new(model);
            explore(
                "loom_eviction_under_the_write_lock_loses_no_admission",
                &model,
                {
                    let model = model.clone();
                    move || {
                        let start = model.prepare(&setup).0;
                        let entry = Arc::new(RwLock::new(start.map(AtomicU64::new)));
                        let consumers: Vec<_> = (0..2)
                            .map(|_| {
                                let (model, entry) = (model.clone(), entry.clone());
                                loom::thread::spawn(move || {
                                    (0..2)
                                        .map(|_| {
                                            // As `MemoryStore::decide_packed`: apply under
                                            // the read lock if present, else insert under
                                            // the write lock and apply under it.
                                            if let Some(cell) = &*entry.read().unwrap() {
                                                return model.packed.apply(cell, Op::Check(1), T);
                                            }
                                            let mut held = entry.write().unwrap();
                                            let cell =
                                                held.get_or_insert_with(|| AtomicU64::new(0));
                                            model.packed.apply(&*cell, Op::Check(1), T)
                                        })
                                        .collect::<Vec<_>>()
                                })
                            })
                            .collect();
                        {
                            let mut held = entry.write().unwrap();
                            if held.as_ref().is_some_and(|cell| model.evicts(cell, T)) {
                                *held = None;
                            }
                        }
                        let observed: Vec<_> =
                            consumers.into_iter().map(|h| h.join().unwrap()).collect();
                        let word = entry.read().unwrap().as_ref().map(Cell::load);
                        assert_eq!(admitted(observed.iter().flatten()), 3, "{}", model.strategy);
                        let threads = [
                            vec![Step::Apply(T, Op::Check(1)); 2],
                            vec![Step::Apply(T, Op::Check(1)); 2],
                            vec![Step::Evict(T)],
                        ];
                        let mut with_evictor = observed;
                        with_evictor.push(Vec::new());
                        assert_linearizable(&model, &setup, &threads, &with_evictor, word);
                    }
                },
            );
        }
    }
}

#[cfg(shuttle)]
mod shuttle_models {
    //! Random schedules (1000 per rule) of a thread advancing a fake clock by 100 µs steps and 2
    //! consumers reading it and checking, as the token-bucket crate adopted by Agave tests itself
    //! (`shuttle_test_token_bucket_race`).
    //!
    //! The exact check: the cell under test logs every access (load, successful or failed
    //! compare-and-swap) in one total order, each access and its log entry taken together under a
    //! lock. Shuttle's schedules are sequentially consistent, where one atomic access is already
    //! indivisible, so the lock removes no outcome; it is never held from `apply`'s load to its
    //! swap, so their race is untouched. From the log:
    //! - the successful swaps chain (each replaces the word the previous one wrote, the first the
    //!   initial word, the last leaves the final word), and every load or failed swap saw the word
    //!   of the latest swap before it: no lost update, no torn word;
    //! - an operation takes effect at its last access (the swap that won, or the load or failed
    //!   swap whose word it returned on unchanged); replaying the operations in that order, each at
    //!   the time its thread read from the clock, through the pure arithmetic gives exactly the
    //!   verdicts the threads got, so the admissions are the model's for the observed clock
    //!   schedule;
    //! - admissions stay under bounds computed from the clock alone (a token bucket: `B + elapsed /
    //!   T`; a fixed window: the limit per window seen).

    use shuttle::sync::atomic::AtomicU64 as ShuttleU64;
    use shuttle::sync::{Arc, Mutex};
    use std::sync::atomic::Ordering::SeqCst;

    use super::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;
    const ITERATIONS: usize = 1000;
    const STEP: u64 = 100 * US;
    const CLOCK_STEPS: u64 = 12;
    const CHECKS_PER_CONSUMER: usize = 5;
    /// The clock starts half a millisecond into a millisecond: windows of 1 ms turn over mid-run.
    const START: u64 = T + MS / 2;

    #[derive(Clone, Copy, Debug)]
    enum Access {
        Load(u64),
        Swapped(u64, u64),
        Failed(u64),
    }

    /// The cell under test, with its log of (operation, access).
    struct Logged {
        word: ShuttleU64,
        log: Mutex<Vec<(usize, Access)>>,
    }

    /// The cell as seen by operation `op`.
    struct Tagged<'a> {
        cell: &'a Logged,
        op: usize,
    }

    impl Cell for Tagged<'_> {
        fn load(&self) -> u64 {
            let mut log = self.cell.log.lock().unwrap();
            let word = self.cell.word.load(SeqCst);
            log.push((self.op, Access::Load(word)));
            word
        }

        fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
            let mut log = self.cell.log.lock().unwrap();
            let result = self
                .cell
                .word
                .compare_exchange(current, new, SeqCst, SeqCst);
            log.push((
                self.op,
                match result {
                    Ok(old) => Access::Swapped(old, new),
                    Err(found) => Access::Failed(found),
                },
            ));
            result
        }
    }

    /// What one schedule left: each operation's (time read, verdict), indexed by its id; the log
    /// of (operation id, access); the final word.
    type Run = (Vec<(u64, Verdict)>, Vec<(usize, Access)>, u64);

    /// One schedule.
    fn run_once(model: &std::sync::Arc<Model>) -> Run {
        let clock = Arc::new(ShuttleU64::new(START));
        let cell = Arc::new(Logged {
            word: ShuttleU64::new(0),
            log: Mutex::new(Vec::new()),
        });
        let advancer = {
            let clock = clock.clone();
            shuttle::thread::spawn(move || {
                for _ in 0..CLOCK_STEPS {
                    clock.fetch_add(STEP, SeqCst);
                }
            })
        };
        let consumers: Vec<_> = (0..2)
            .map(|c| {
                let (model, clock, cell) = (model.clone(), clock.clone(), cell.clone());
                shuttle::thread::spawn(move || {
                    (0..CHECKS_PER_CONSUMER)
                        .map(|k| {
                            let now = clock.load(SeqCst);
                            let op = c * CHECKS_PER_CONSUMER + k;
                            let v =
                                model
                                    .packed
                                    .apply(&Tagged { cell: &cell, op }, Op::Check(1), now);
                            (now, v)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        advancer.join().unwrap();
        let ops = consumers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let log = std::mem::take(&mut *cell.log.lock().unwrap());
        (ops, log, cell.word.load(SeqCst))
    }

    /// The checks described in the module's documentation, on one schedule.
    fn check_schedule(model: &Model, ops: &[(u64, Verdict)], log: &[(usize, Access)], word: u64) {
        // The swaps chain and every read saw the latest word.
        let mut current = 0;
        let mut last_access = vec![None; ops.len()];
        for (i, &(op, access)) in log.iter().enumerate() {
            match access {
                Access::Load(seen) | Access::Failed(seen) => assert_eq!(seen, current),
                Access::Swapped(old, new) => {
                    assert_eq!(
                        old, current,
                        "a swap replaced a word that was not the latest"
                    );
                    assert_ne!(old, new);
                    current = new;
                }
            }
            last_access[op] = Some(i);
        }
        assert_eq!(word, current, "the final word is not the last swap's");
        // Replay in the order the operations took effect, at the times they read.
        let mut order: Vec<usize> = (0..ops.len()).collect();
        order.sort_by_key(|&op| last_access[op].expect("every operation touched the cell"));
        let steps = order.iter().map(|&op| Step::Apply(ops[op].0, Op::Check(1)));
        let (replay, _) = model.replay_from(Some(0), vec![QuotaState::new(model.strategy)], steps);
        let got: Vec<Verdict> = order.iter().map(|&op| ops[op].1).collect();
        assert_eq!(
            got, replay.verdicts,
            "verdicts differ from the replay in effect order"
        );
        assert_eq!(Some(word), replay.word);
        // Bounds from the clock alone.
        let admitted = admitted(&got);
        let last = ops.iter().map(|&(now, _)| now).max().unwrap();
        let p = model.rule.nanos()[0];
        match model.strategy {
            Strategy::TokenBucket | Strategy::LeakyBucket => {
                let bound = p.burst + (last - START) / p.emission;
                assert!(admitted as u64 <= bound, "{admitted} > {bound}");
            }
            Strategy::FixedWindow => {
                let mut windows: Vec<u64> = ops.iter().map(|&(now, _)| now / p.window).collect();
                windows.dedup();
                assert!(admitted as u64 <= p.limit * windows.len() as u64);
            }
            _ => {}
        }
    }

    /// Runs `explorer` (a shuttle scheduler taking the test and its iteration count) on each rule,
    /// checking every schedule; asserts the schedules did not all admit the same number.
    fn explore(test: &str, explorer: impl Fn(Box<dyn Fn() + Send + Sync>, usize)) {
        for model in rules_3_per("ms") {
            let model = std::sync::Arc::new(model);
            let admissions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let started = std::time::Instant::now();
            explorer(
                Box::new({
                    let (model, admissions) = (model.clone(), admissions.clone());
                    move || {
                        let (ops, log, word) = run_once(&model);
                        check_schedule(&model, &ops, &log, word);
                        admissions
                            .lock()
                            .unwrap()
                            .push(admitted(ops.iter().map(|(_, v)| v)));
                    }
                }),
                ITERATIONS,
            );
            let admissions = admissions.lock().unwrap();
            assert_eq!(admissions.len(), ITERATIONS);
            // The schedules differed in what they admitted (the clock raced the consumers).
            let (min, max) = (
                admissions.iter().min().unwrap(),
                admissions.iter().max().unwrap(),
            );
            eprintln!(
                "{test} {}: {ITERATIONS} schedules in {:.1?}, admitted {min} to {max} of {}",
                model.strategy,
                started.elapsed(),
                2 * CHECKS_PER_CONSUMER
            );
            assert!(
                min < max,
                "{}: every schedule admitted {min}",
                model.strategy
            );
        }
    }

    /// Uniformly random scheduling (`check_random`), 1000 schedules per rule.
    #[test]
    fn shuttle_clock_advancer_and_two_consumers() {
        explore("shuttle_clock_advancer_and_two_consumers", |f, n| {
            shuttle::check_random(f, n);
        });
    }

    /// The same under PCT (probabilistic concurrency testing, bug depth 3), which favours the few
    /// well-placed preemptions uniform scheduling rarely draws, 1000 schedules per rule.
    #[test]
    fn shuttle_pct_clock_advancer_and_two_consumers() {
        explore("shuttle_pct_clock_advancer_and_two_consumers", |f, n| {
            shuttle::check_pct(f, n, 3);
        });
    }
}
