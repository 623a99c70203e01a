//! One thread against two on a shared map of `AtomicU64` states: the map
//! alone, without a limiter around it, so that what two threads cost each other on its lines shows.
//!
//! ```text
//! cargo build --release -p tollgate-tools --bin map_threads
//! target/release/map_threads [ROUNDS] [N] [KEYS]        (defaults 7 rounds, 2,000,000 checks, 10^4 keys)
//! target/release/map_threads memory [KEYS]              (heap bytes per u64 key of each map, 10^6 keys)
//! ```
//!
//! Each "check" draws a uniform random key (the benches' xorshift), finds its `AtomicU64` and
//! compare-and-swaps it (load, +1), as the memory store's packed path does. Every round runs every
//! map with one thread, then two, interleaved, so that a loaded machine slows all alike; the N
//! checks are split over the threads and the time is the wall time of all. Printed per map: the
//! median wall ns per check (aggregate), the median of the per-round rate ratio two threads / one,
//! the CPU ns per check summed over the threads (`/proc/thread-self/schedstat`), and the overlap:
//! how much of the two-thread run both threads were on a CPU together (CPU time summed / wall - 1;
//! 1 when both ran throughout, 0 when they took turns).
//!
//! The maps (`u64` keys, foldhash routing as the store):
//! - `dashmap-RxS`: the store's layout, R segment maps of S shards each (64x4 is the store's);
//! - `papaya`: `papaya::HashMap`, lock-free reads (a guard pinned per check);
//! - `scc-index`: `scc::HashIndex`, lock-free reads (`peek_with`);
//! - `array`: a plain `[AtomicU64]` indexed by the key: no map, only the state word is shared;
//! - `private-*`: the same, one copy per thread: nothing shared, the ceiling of this machine.
//!
//! `TOLLGATE_PIN=1` pins thread `t` to CPU `t`. Each round first times a cache line's round trip
//! between two threads (CPUs 0 and 1 when pinned): on a VM it tells where the vCPUs ran.

#[path = "../threads.rs"]
mod threads;
use threads::{cpu_nanos, pin};

use std::alloc::System;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A value `scc::HashIndex` accepts (it wants `Clone`): the state word.
#[derive(Debug, Default)]
struct Cell(AtomicU64);

impl Clone for Cell {
    fn clone(&self) -> Self {
        Self(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

/// Load, add one, compare-and-swap: the shape of a packed state's update.
#[inline]
fn bump(cell: &AtomicU64) -> u64 {
    let mut v = cell.load(Ordering::Acquire);
    loop {
        match cell.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return v,
            Err(seen) => v = seen,
        }
    }
}

trait Map: Sync {
    fn check(&self, key: u64) -> u64;
}

struct Segmented {
    maps: Vec<DashMap<u64, AtomicU64, RandomState>>,
    route: RandomState,
}

impl Segmented {
    fn new(segments: usize, shards: usize, keys: u64) -> Self {
        let maps = (0..segments)
            .map(|_| DashMap::with_hasher_and_shard_amount(RandomState::default(), shards))
            .collect();
        let s = Self {
            maps,
            route: RandomState::default(),
        };
        for k in 0..keys {
            s.segment(k).insert(k, AtomicU64::new(0));
        }
        s
    }

    fn segment(&self, key: u64) -> &DashMap<u64, AtomicU64, RandomState> {
        let i = self.route.hash_one(key) as usize % self.maps.len();
        &self.maps[i]
    }
}

impl Map for Segmented {
    fn check(&self, key: u64) -> u64 {
        self.segment(key).get(&key).map_or(0, |c| bump(&c))
    }
}

struct Papaya(papaya::HashMap<u64, AtomicU64, RandomState>);

impl Papaya {
    fn new(keys: u64) -> Self {
        let m = papaya::HashMap::with_hasher(RandomState::default());
        {
            let g = m.pin();
            for k in 0..keys {
                g.insert(k, AtomicU64::new(0));
            }
        }
        Self(m)
    }
}

impl Map for Papaya {
    fn check(&self, key: u64) -> u64 {
        self.0.pin().get(&key).map_or(0, bump)
    }
}

struct SccIndex(scc::HashIndex<u64, Cell, RandomState>);

impl SccIndex {
    fn new(keys: u64) -> Self {
        let m = scc::HashIndex::with_hasher(RandomState::default());
        for k in 0..keys {
            let _ = m.insert(k, Cell::default());
        }
        Self(m)
    }
}

impl Map for SccIndex {
    fn check(&self, key: u64) -> u64 {
        self.0.peek_with(&key, |_, c| bump(&c.0)).unwrap_or(0)
    }
}

struct Array(Vec<AtomicU64>);

impl Map for Array {
    fn check(&self, key: u64) -> u64 {
        self.0.get(key as usize).map_or(0, bump)
    }
}

fn build(name: &str, keys: u64) -> Box<dyn Map> {
    match name {
        "papaya" => Box::new(Papaya::new(keys)),
        "scc-index" => Box::new(SccIndex::new(keys)),
        "array" => Box::new(Array((0..keys).map(|_| AtomicU64::new(0)).collect())),
        _ => {
            let (r, s) = name
                .strip_prefix("dashmap-")
                .and_then(|rs| rs.split_once('x'))
                .expect("dashmap-RxS");
            Box::new(Segmented::new(
                r.parse().expect("R"),
                s.parse().expect("S"),
                keys,
            ))
        }
    }
}

/// Runs `n` checks over `maps.len()` threads (thread `t` on `maps[t]`): wall ns and CPU ns summed.
fn run(maps: &[&dyn Map], keys: u64, n: u64) -> (f64, f64) {
    let threads = maps.len() as u64;
    let per_thread = n / threads;
    let barrier = std::sync::Barrier::new(maps.len());
    let runs: Vec<(Instant, Instant, u64)> = std::thread::scope(|s| {
        let workers: Vec<_> = maps
            .iter()
            .enumerate()
            .map(|(t, &m)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut x =
                        0x9E37_79B9_7F4A_7C15_u64 ^ (t as u64).wrapping_mul(0xA076_1D64_78BD_642F);
                    pin(t);
                    barrier.wait();
                    let cpu = cpu_nanos();
                    let start = Instant::now();
                    for _ in 0..per_thread {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = ((u128::from(x) * u128::from(keys)) >> 64) as u64;
                        black_box(m.check(black_box(k)));
                    }
                    (start, Instant::now(), cpu_nanos().saturating_sub(cpu))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let first = runs.iter().map(|r| r.0).min().expect("a thread");
    let last = runs.iter().map(|r| r.1).max().expect("a thread");
    let cpu: u64 = runs.iter().map(|r| r.2).sum();
    ((last - first).as_nanos() as f64, cpu as f64)
}

/// The round trip of one cache line between two threads (pinned to CPUs 0 and 1 with
/// `TOLLGATE_PIN=1`), in ns: each thread waits for the other's write, then writes back. What the
/// two-thread rows pay per line the other thread wrote last; on a VM it changes with where the
/// hypervisor runs the two vCPUs at the time.
fn ping_pong(trips: u64) -> f64 {
    /// Waits until `line` holds `v` (yielding now and then, in case both threads share a CPU).
    fn wait_for(line: &AtomicU64, v: u64) {
        let mut spins = 0u32;
        while line.load(Ordering::Acquire) != v {
            spins += 1;
            if spins % 1024 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    let line = AtomicU64::new(0);
    let barrier = std::sync::Barrier::new(2);
    let times: Vec<f64> = std::thread::scope(|s| {
        let sides: Vec<_> = [0u64, 1]
            .into_iter()
            .map(|side| {
                let (line, barrier) = (&line, &barrier);
                s.spawn(move || {
                    pin(side as usize);
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..trips {
                        // Side 0 writes the odd values, side 1 the even ones.
                        wait_for(line, 2 * i + side);
                        line.store(2 * i + side + 1, Ordering::Release);
                    }
                    start.elapsed().as_nanos() as f64
                })
            })
            .collect();
        sides.into_iter().map(|h| h.join().expect("side")).collect()
    });
    times[0] / trips as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const NAMES: [&str; 7] = [
    "dashmap-64x4",
    "dashmap-64x2",
    "dashmap-64x16",
    "dashmap-1x8",
    "papaya",
    "scc-index",
    "array",
];

fn memory(keys: u64) {
    println!("{:<16} {:>12}", "map", "heap B/key");
    for name in NAMES {
        let region = Region::new(GLOBAL);
        let m = build(name, keys);
        let s = region.change();
        let bytes =
            s.bytes_allocated as f64 - s.bytes_deallocated as f64 + s.bytes_reallocated as f64;
        println!("{name:<16} {:>12.1}", bytes / keys as f64);
        drop(m);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("memory") {
        let keys = args.get(1).map_or(1_000_000, |k| k.parse().expect("KEYS"));
        memory(keys);
        return;
    }
    let rounds: usize = args.first().map_or(7, |r| r.parse().expect("ROUNDS"));
    let n: u64 = args.get(1).map_or(2_000_000, |r| r.parse().expect("N"));
    let keys: u64 = args.get(2).map_or(10_000, |r| r.parse().expect("KEYS"));
    // Shared maps, then the private copies (one per thread) of the store's layout and the array.
    let mut cases: Vec<(String, Vec<Box<dyn Map>>)> = NAMES
        .iter()
        .map(|&name| (name.to_string(), vec![build(name, keys)]))
        .collect();
    for name in ["dashmap-64x4", "array"] {
        cases.push((
            format!("private-{name}"),
            vec![build(name, keys), build(name, keys)],
        ));
    }
    let mut wall1 = vec![Vec::new(); cases.len()];
    let mut wall2 = vec![Vec::new(); cases.len()];
    let mut cpu1 = vec![Vec::new(); cases.len()];
    let mut cpu2 = vec![Vec::new(); cases.len()];
    let mut ratio = vec![Vec::new(); cases.len()];
    let mut overlap = vec![Vec::new(); cases.len()];
    let mut trips = Vec::new();
    for r in 0..rounds {
        trips.push(ping_pong(200_000));
        for (i, (_, maps)) in cases.iter().enumerate() {
            let one = [&*maps[0]];
            let two = [&*maps[0], &**maps.last().expect("a map")];
            let (w1, c1) = run(&one, keys, n);
            let (w2, c2) = run(&two, keys, n);
            wall1[i].push(w1 / n as f64);
            wall2[i].push(w2 / n as f64);
            cpu1[i].push(c1 / n as f64);
            cpu2[i].push(c2 / n as f64);
            ratio[i].push(w1 / w2);
            overlap[i].push(c2 / w2 - 1.0);
        }
        eprintln!("round {} done", r + 1);
    }
    let rounds: Vec<String> = trips.iter().map(|x| format!("{x:.0}")).collect();
    println!(
        "cache line round trip between the two threads: median {:.0} ns, per round {}",
        median(&mut trips.clone()),
        rounds.join(" ")
    );
    println!(
        "{:<22} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  rate ratio 2/1 per round",
        "map", "wall 1T", "wall 2T", "2T/1T", "cpu 1T", "cpu 2T", "overlap"
    );
    for (i, (name, _)) in cases.iter().enumerate() {
        let rounds: Vec<String> = ratio[i].iter().map(|x| format!("{x:.2}")).collect();
        println!(
            "{name:<22} {:>8.1} {:>8.1} {:>7.2}x {:>8.1} {:>8.1} {:>8.2}  {}",
            median(&mut wall1[i]),
            median(&mut wall2[i]),
            median(&mut ratio[i]),
            median(&mut cpu1[i]),
            median(&mut cpu2[i]),
            median(&mut overlap[i]),
            rounds.join(" ")
        );
    }
}
