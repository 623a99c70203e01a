//! What one clock read costs: the floor under every check.

use criterion::{BenchmarkId, Criterion, Throughput, black_box};
use governor::clock::{Clock as _, DefaultClock};
use tollgate::{Clock, CoarseClock, SystemClock};

pub fn bench_all(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock_read");
    g.throughput(Throughput::Elements(1));
    let system = SystemClock::new();
    g.bench_function(BenchmarkId::new("now", "tollgate/SystemClock"), |b| {
        b.iter(|| black_box(&system).now())
    });
    let coarse = CoarseClock::new();
    g.bench_function(BenchmarkId::new("now", "tollgate/CoarseClock"), |b| {
        b.iter(|| black_box(&coarse).now())
    });
    g.bench_function(BenchmarkId::new("now", "std/Instant"), |b| {
        b.iter(std::time::Instant::now)
    });
    let quanta = DefaultClock::default();
    g.bench_function(BenchmarkId::new("now", "governor/quanta"), |b| {
        b.iter(|| black_box(&quanta).now())
    });
    g.finish();
}
