//! Key-cardinality flood against the memory store: floods distinct
//! keys (IPv6 addresses in distinct /56s, as the peer-IP extractor would key them) into a
//! `RateLimiter` whose store is capped, and into an uncapped one for comparison, printing the
//! resident memory (VmRSS from `/proc/self/status`) as it goes. Memory must level off at the cap.
//!
//! ```text
//! cargo run --release -p tollgate-tools --bin key_flood                        # 10^7 keys, cap 10^6, then uncapped
//! cargo run --release -p tollgate-tools --bin key_flood -- --keys 1000000 --cap 100000 --every 100000
//! cargo run --release -p tollgate-tools --bin key_flood -- --cap none          # one run, no cap
//! ```
//!
//! Flags: `--keys N` (default 10,000,000), `--cap N|none` (default: two runs, cap 1,000,000 and
//! none, each in its own child process so that one run's allocator state does not colour the
//! other's), `--every N` (report interval, default 1,000,000 keys), `--threads N` (default 2),
//! `--quota Q` (default 10/minute: a flooded key keeps room, so it may be evicted).
//! Each run prints `keys=… held=… rss_mib=…` lines and a final `summary` line; a capped run exits
//! with code 1 if the store ever held more than the cap plus the number of threads.

use std::net::{IpAddr, Ipv6Addr};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use tollgate::{RateLimiter, Strategy};

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

struct Options {
    keys: u64,
    cap: Option<Option<usize>>,
    every: u64,
    threads: usize,
    quota: String,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        keys: 10_000_000,
        cap: None,
        every: 1_000_000,
        threads: 2,
        quota: "10/minute".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--keys" => o.keys = num(&value)?,
            "--every" => o.every = num(&value)?.max(1),
            "--threads" => o.threads = usize::try_from(num(&value)?.max(1)).unwrap_or(1),
            "--quota" => o.quota = value,
            "--cap" if value == "none" => o.cap = Some(None),
            "--cap" => o.cap = Some(Some(usize::try_from(num(&value)?).unwrap_or(usize::MAX))),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(o)
}

/// The `i`-th flooded key: a pseudo-random IPv6 address, a distinct /56 for every `i`.
fn key(i: u64) -> IpAddr {
    let prefix = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 8; // a bijection on the low 56 bits
    let bits = (u128::from(0x2001_0000_0000_0000 | prefix) << 64) | 0x1;
    IpAddr::V6(Ipv6Addr::from(bits))
}

fn run(o: &Options, cap: Option<usize>) -> ExitCode {
    let mut builder = RateLimiter::<IpAddr>::builder()
        .strategy(Strategy::SlidingWindow)
        .quotas(&o.quota)
        .unwrap_or_else(|e| panic!("--quota {}: {e}", o.quota));
    // No cap: lifted (the store is capped at 8 x 10^6 keys by default).
    builder = builder.max_keys(cap.unwrap_or(usize::MAX));
    let limiter = builder.build().expect("valid rule");
    let label = cap.map_or_else(|| "none".to_owned(), |c| c.to_string());
    let base = rss_mib();
    println!(
        "run cap={label} keys={} threads={} quota={} baseline_rss_mib={base:.1}",
        o.keys, o.threads, o.quota
    );
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let max_held = AtomicUsize::new(0);
    let start = Instant::now();
    let mut peak = base;
    std::thread::scope(|s| {
        for _ in 0..o.threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1024, Ordering::Relaxed);
                    if i >= o.keys {
                        break;
                    }
                    for k in i..(i + 1024).min(o.keys) {
                        limiter.check_now(&key(k), 1);
                    }
                    max_held.fetch_max(limiter.store().len(), Ordering::Relaxed);
                    done.fetch_add((i + 1024).min(o.keys) - i, Ordering::Relaxed);
                }
            });
        }
        let mut threshold = o.every.min(o.keys);
        loop {
            std::thread::sleep(std::time::Duration::from_millis(5));
            let d = done.load(Ordering::Relaxed);
            if d >= threshold {
                threshold = (d / o.every + 1).saturating_mul(o.every).min(o.keys);
                let rss = rss_mib();
                peak = peak.max(rss);
                println!(
                    "keys={d} held={} rss_mib={rss:.1} above_baseline_mib={:.1} elapsed_s={:.2}",
                    limiter.store().len(),
                    rss - base,
                    start.elapsed().as_secs_f64()
                );
                if d >= o.keys {
                    break;
                }
            }
        }
    });
    let rss = rss_mib();
    peak = peak.max(rss);
    let held = max_held.load(Ordering::Relaxed);
    let stats = limiter.stats();
    println!(
        "summary cap={label} keys={} max_held={held} final_rss_mib={rss:.1} peak_rss_mib={peak:.1} \
         above_baseline_mib={:.1} bytes_per_held_key={:.0} evictions={} overflow_hits={} elapsed_s={:.2}",
        o.keys,
        peak - base,
        (peak - base) * 1024.0 * 1024.0 / held.max(1) as f64,
        stats.evictions,
        stats.overflow_hits,
        start.elapsed().as_secs_f64()
    );
    match cap {
        Some(c) if held > c + o.threads => {
            eprintln!(
                "the store held {held} keys, above the cap {c} + {} threads",
                o.threads
            );
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("key_flood: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(cap) = o.cap {
        return run(&o, cap);
    }
    // Both runs, each in a fresh process.
    let exe = std::env::current_exe().expect("own path");
    let mut code = ExitCode::SUCCESS;
    for cap in ["1000000", "none"] {
        let status = Command::new(&exe)
            .args([
                "--keys",
                &o.keys.to_string(),
                "--every",
                &o.every.to_string(),
            ])
            .args(["--threads", &o.threads.to_string(), "--quota", &o.quota])
            .args(["--cap", cap])
            .status()
            .expect("re-run self");
        if !status.success() {
            code = ExitCode::FAILURE;
        }
    }
    code
}
