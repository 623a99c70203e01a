#![allow(missing_docs, unreachable_pub)]

//! Decision cost of tollgate's memory store next to governor's keyed limiter, in the same groups.
//!
//! `cargo bench --bench decision -- --warm-up-time 1 --measurement-time 2 --sample-size 10`
//! (add a filter such as `hot_key` to run one scenario). See BENCHMARKS.md for the workloads.

mod clocks;
mod keys;
mod threads;
mod workload;

use criterion::{criterion_group, criterion_main};

criterion_group!(
    benches,
    clocks::bench_all,
    keys::bench_all,
    threads::bench_all
);
criterion_main!(benches);
