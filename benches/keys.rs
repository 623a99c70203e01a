//! One thread: one hot key, and uniform random keys over 10^4 and 10^6 pre-populated keys.

use criterion::{BenchmarkId, Criterion, Throughput, black_box};

use crate::workload::{Mode, Rng, all, populate};

pub fn bench_all(c: &mut Criterion) {
    for mode in [Mode::AllowAll, Mode::RejectAll] {
        for keys in [1u64, 10_000, 1_000_000] {
            let scenario = match keys {
                1 => "hot_key".to_string(),
                10_000 => "keys_1e4".to_string(),
                _ => "keys_1e6".to_string(),
            };
            let mut g = c.benchmark_group("1_thread");
            g.throughput(Throughput::Elements(1));
            for (name, make) in all(mode, keys == 1) {
                let id = BenchmarkId::new(format!("{scenario}/{}", mode.name()), &name);
                // Build (and populate 10^6 keys) only for benchmarks that the filter selects.
                let mut limiter = None;
                g.bench_function(id, |b| {
                    let l = limiter.get_or_insert_with(|| {
                        let l = make();
                        populate(&*l, keys);
                        l
                    });
                    let expect = mode == crate::workload::Mode::AllowAll;
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
                    b.iter(|| {
                        let k = if keys == 1 { 0 } else { rng.below(keys) };
                        let ok = l.check(black_box(k));
                        debug_assert_eq!(ok, expect);
                        ok
                    });
                    assert_eq!(l.check(0), expect, "{name}: workload broken");
                });
            }
            g.finish();
        }
    }
}
