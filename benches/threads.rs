//! Two threads (aggregate): one hot key, and uniform random keys over 10^4 and 10^6 keys.
//! Each sample runs `iters` checks split over the threads; the time is the wall time of all.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, black_box};

use crate::workload::{Limiter, Mode, Rng, all, populate};

const THREADS: u64 = 2;

fn run(l: &dyn Limiter, keys: u64, iters: u64) -> Duration {
    let per_thread = iters.div_ceil(THREADS);
    let barrier = Barrier::new(THREADS as usize + 1);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let barrier = &barrier;
            s.spawn(move || {
                let mut rng =
                    Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0xA076_1D64_78BD_642F));
                barrier.wait();
                for _ in 0..per_thread {
                    let k = if keys == 1 { 0 } else { rng.below(keys) };
                    black_box(l.check(black_box(k)));
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins the threads before returning.
        start
    })
    .elapsed()
}

pub fn bench_all(c: &mut Criterion) {
    for mode in [Mode::AllowAll, Mode::RejectAll] {
        for keys in [1u64, 10_000, 1_000_000] {
            let scenario = match keys {
                1 => "hot_key",
                10_000 => "keys_1e4",
                _ => "keys_1e6",
            };
            let mut g = c.benchmark_group("2_threads");
            g.throughput(Throughput::Elements(1));
            for (name, make) in all(mode, keys == 1) {
                let id = BenchmarkId::new(format!("{scenario}/{}", mode.name()), &name);
                let mut limiter = None;
                g.bench_function(id, |b| {
                    let l = limiter.get_or_insert_with(|| {
                        let l = make();
                        populate(&*l, keys);
                        l
                    });
                    b.iter_custom(|iters| run(&**l, keys, iters));
                    let expect = mode == Mode::AllowAll;
                    assert_eq!(l.check(0), expect, "{name}: workload broken");
                });
            }
            g.finish();
        }
    }
}
