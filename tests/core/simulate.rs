//! The `simulate` example, run as a user would: the worked examples of every strategy (the ones
//! `strategy_examples.rs` checks through the API) replayed from trace files, read back through
//! `decisions.csv`; the generated edge attack; and bad input (exit 2 with `line N: ...`).
//!
//! Run: `cargo build --all-features --examples && cargo test --all-features --test core simulate::`
//! (a plain `cargo test` builds the examples itself; `--test NAME` alone does not).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The example binary, next to this test's binary (`cargo test` builds examples first).
fn simulate_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let path = dir.join("examples").join("simulate");
    assert!(
        path.exists(),
        "{} is missing: run `cargo test` (which builds the examples) or `cargo build --examples`",
        path.display()
    );
    path
}

/// A fresh directory under the target directory for one case.
fn scratch(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("simulate-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn run(args: &[&str]) -> Output {
    Command::new(simulate_bin())
        .args(args)
        .output()
        .expect("simulate runs")
}

/// Writes `trace` to a fresh directory and runs the simulator on it with `args` and
/// `--out DIR/out`; returns what it did and the output directory.
fn run_trace(name: &str, trace: &str, args: &[&str]) -> (Output, PathBuf) {
    let dir = scratch(name);
    let file = dir.join("trace.csv");
    std::fs::write(&file, trace).expect("write trace");
    let out = dir.join("out");
    let mut all = vec![
        "--trace",
        file.to_str().expect("utf-8 path"),
        "--out",
        out.to_str().expect("utf-8 path"),
    ];
    all.extend_from_slice(args);
    (run(&all), out)
}

/// Runs the simulator on `trace` with `args`, expecting success; returns the output directory.
fn simulate(name: &str, trace: &str, args: &[&str]) -> PathBuf {
    let (o, out) = run_trace(name, trace, args);
    assert!(
        o.status.success(),
        "simulate {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// One row of `decisions.csv`.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    strategy: String,
    t_ms: u64,
    key: String,
    cost: u32,
    allowed: bool,
}

fn rows(out: &Path) -> Vec<Row> {
    let csv = std::fs::read_to_string(out.join("decisions.csv")).expect("decisions.csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("strategy,t_ms,key,cost,allowed"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 5, "row {l:?}");
            Row {
                strategy: f[0].to_owned(),
                t_ms: f[1].parse().expect("t_ms"),
                key: f[2].to_owned(),
                cost: f[3].parse().expect("cost"),
                allowed: match f[4] {
                    "true" => true,
                    "false" => false,
                    other => panic!("allowed is {other:?}"),
                },
            }
        })
        .collect()
}

/// A trace and the expected decisions from `(t_ms, count, allowed)` groups of cost-1 requests.
fn groups(spec: &[(u64, usize, bool)]) -> (String, Vec<(u64, bool)>) {
    let mut trace = String::from("# t_ms\n");
    let mut want = Vec::new();
    for &(t, n, ok) in spec {
        for _ in 0..n {
            trace.push_str(&format!("{t}\n"));
            want.push((t, ok));
        }
    }
    (trace, want)
}

/// Runs `spec` under `strategy` and `quota` and checks every row.
fn check(
    name: &str,
    strategy: &str,
    quota: &str,
    burst: Option<&str>,
    spec: &[(u64, usize, bool)],
) {
    let (trace, want) = groups(spec);
    let mut args = vec!["--quota", quota, "--strategy", strategy];
    if let Some(b) = burst {
        args.extend(["--burst", b]);
    }
    let out = simulate(name, &trace, &args);
    let got = rows(&out);
    assert_eq!(got.len(), want.len(), "{name}: one row per request");
    for (i, (row, (t, ok))) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            (row.strategy.as_str(), row.t_ms, row.key.as_str(), row.cost),
            (strategy, *t, "", 1),
            "{name}: row {i}"
        );
        assert_eq!(row.allowed, *ok, "{name}: request {i} at {t} ms");
    }
}

#[test]
fn fixed_window_first_hit_worked_example_opens_at_the_first_request() {
    // 10/minute from 00:00:45, one every 5 s: the window ends at 00:01:45.
    let mut spec: Vec<(u64, usize, bool)> =
        (0..10).map(|i| (45_000 + i * 5_000, 1, true)).collect();
    spec.extend([
        (95_000, 1, false),
        (100_000, 1, false),
        (104_999, 1, false),
        (105_000, 1, true),
    ]);
    check(
        "first-hit",
        "fixed-window-first-hit",
        "10/minute",
        None,
        &spec,
    );
}

#[test]
fn moving_window_worked_examples_expire_each_request_after_the_period() {
    check(
        "moving-10-per-minute",
        "moving-window",
        "10/minute",
        None,
        &[
            (10_000, 1, true),
            (20_000, 2, true),
            (30_000, 4, true),
            (50_000, 3, true),
            (71_000, 1, true),
            (72_000, 1, false),
        ],
    );
    check(
        "moving-3-per-second",
        "moving-window",
        "3/second",
        None,
        &[
            (100, 1, true),
            (300, 1, true),
            (600, 1, true),
            (800, 1, false),
            (1_099, 1, false),
            (1_110, 1, true),
        ],
    );
}

#[test]
fn sliding_window_worked_examples_weigh_the_previous_window() {
    // 40 in [0, 60 s); 30 s into the next window 80 fit (80 + 40 x 0.5 = 100), the next does not;
    // 40 s in, 80 + floor(40 x 20/60) = 93: seven more fit.
    check(
        "sliding-100-per-minute",
        "sliding-window",
        "100/minute",
        None,
        &[
            (5_000, 40, true),
            (90_000, 80, true),
            (90_000, 1, false),
            (100_000, 7, true),
            (100_000, 1, false),
        ],
    );
    // 5 in the previous window, 3 in the current; at 30 % one more fits (3 + 5 x 0.7 = 6.5 -> 6),
    // then none until the previous share drops to 2 (just after 24 s in).
    check(
        "sliding-7-per-minute",
        "sliding-window",
        "7/minute",
        None,
        &[
            (1_000, 5, true),
            (72_000, 3, true),
            (78_000, 1, true),
            (78_000, 1, false),
            (84_000, 1, false),
            (84_001, 1, true),
        ],
    );
}

#[test]
fn bucket_worked_examples_burst_then_refill_at_the_rate() {
    for strategy in ["token-bucket", "leaky-bucket"] {
        check(
            &format!("{strategy}-500"),
            strategy,
            "100/second",
            Some("500"),
            &[
                (7_000, 500, true),
                (7_000, 1, false),
                (7_009, 1, false),
                (7_010, 1, true),
                (7_010, 1, false),
            ],
        );
        check(
            &format!("{strategy}-3"),
            strategy,
            "1/4s",
            Some("3"),
            &[(50_000, 3, true), (50_000, 1, false), (54_000, 1, true)],
        );
    }
}

#[test]
fn clock_aligned_fixed_window_worked_example_resets_at_the_top_of_the_hour() {
    let hour = 3_600_000;
    let trace = format!(
        "{t0},,5000\n{t1}\n{t2}\n",
        t0 = 10 * hour + 3_570_000,
        t1 = 11 * hour - 1,
        t2 = 11 * hour
    );
    let out = simulate(
        "fixed-5000-per-hour",
        &trace,
        &["--quota", "5000/hour", "--strategy", "fixed-window"],
    );
    let got: Vec<(u32, bool)> = rows(&out).iter().map(|r| (r.cost, r.allowed)).collect();
    assert_eq!(got, [(5000, true), (1, false), (1, true)]);
}

#[test]
fn costs_no_quota_can_admit_are_rejected_rows_for_every_strategy() {
    let out = simulate("exceeds", "0,,11\n0,,10\n", &["--quota", "10/minute"]);
    let got = rows(&out);
    let names = [
        "fixed-window",
        "fixed-window-first-hit",
        "moving-window",
        "sliding-window",
        "token-bucket",
        "leaky-bucket",
    ];
    assert_eq!(
        got.len(),
        2 * names.len(),
        "every strategy, grouped in CLI order"
    );
    for (i, name) in names.iter().enumerate() {
        assert_eq!(
            (got[2 * i].strategy.as_str(), got[2 * i].allowed),
            (*name, false)
        );
        assert_eq!(
            (got[2 * i + 1].strategy.as_str(), got[2 * i + 1].allowed),
            (*name, true)
        );
        assert!(out.join(format!("{name}.svg")).exists(), "{name}.svg");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.contains("| moving-window | 1 | 1 |"), "{summary}");
    assert!(summary.contains("false allows"), "{summary}");
}

#[test]
fn trace_format_accepts_keys_comments_blank_lines_and_crlf() {
    let trace = "# a comment\r\n\r\n0,alice\r\n0,bob,1\r\n  \r\n500,alice\r\n500,,2\n";
    let out = simulate(
        "format",
        trace,
        &[
            "--quota",
            "1/second",
            "--strategy",
            "moving-window",
            "--strategy",
            "fixed-window",
        ],
    );
    let got: Vec<(String, u64, String, u32, bool)> = rows(&out)
        .into_iter()
        .map(|r| (r.strategy, r.t_ms, r.key, r.cost, r.allowed))
        .collect();
    let expect = |s: &str| {
        vec![
            (s.to_owned(), 0, "alice".to_owned(), 1, true),
            (s.to_owned(), 0, "bob".to_owned(), 1, true),
            (s.to_owned(), 500, "alice".to_owned(), 1, false),
            (s.to_owned(), 500, String::new(), 2, false),
        ]
    };
    let mut want = expect("moving-window");
    want.extend(expect("fixed-window"));
    assert_eq!(
        got, want,
        "keys are independent; strategies in the order given"
    );
}

#[test]
fn edge_attack_gets_twice_the_quota_through_the_clock_aligned_fixed_window_only() {
    let dir = scratch("edge");
    let out = dir.join("nested/out");
    let o = run(&[
        "--traffic",
        "edge-attack",
        "--quota",
        "5/10s",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = rows(&out);
    let admitted_within = |name: &str, from: u64, to: u64| {
        got.iter()
            .filter(|r| r.strategy == name && r.allowed && (from..=to).contains(&r.t_ms))
            .count()
    };
    // Five just before the edge at 10 s and five at it: all ten in 100 ms under the fixed window.
    assert_eq!(admitted_within("fixed-window", 9_900, 10_000), 10);
    for name in [
        "fixed-window-first-hit",
        "moving-window",
        "sliding-window",
        "token-bucket",
        "leaky-bucket",
    ] {
        assert_eq!(admitted_within(name, 9_900, 10_000), 5, "{name}");
    }
}

#[test]
fn generated_traffic_is_reproducible_from_its_seed() {
    let gen_rows = |seed: &str, name: &str| {
        let out = scratch(name).join("out");
        let o = run(&[
            "--traffic",
            "poisson:3,20",
            "--seed",
            seed,
            "--quota",
            "2/second",
            "--strategy",
            "sliding-window",
            "--out",
            out.to_str().expect("utf-8 path"),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        rows(&out)
    };
    let a = gen_rows("7", "seed-a");
    let b = gen_rows("7", "seed-b");
    let c = gen_rows("8", "seed-c");
    assert!(
        (30..=90).contains(&a.len()),
        "about 60 arrivals: {}",
        a.len()
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.windows(2).all(|w| w[0].t_ms <= w[1].t_ms));
    let dir = scratch("bursts").join("out");
    let o = run(&[
        "--traffic",
        "bursts:4,1000,3",
        "--quota",
        "3/second",
        "--strategy",
        "fixed-window",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let allowed: Vec<bool> = rows(&dir).iter().map(|r| r.allowed).collect();
    assert_eq!(allowed, [true, true, true, false].repeat(3));
}

/// Runs the simulator on `trace` with `quota` expecting exit 2 and no panic; returns stderr.
fn refused(name: &str, trace: &str, quota: &str) -> String {
    let stderr = refused_with(name, trace, &["--quota", quota]);
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    stderr
}

#[test]
fn bad_traces_and_quotas_exit_2_naming_the_line() {
    let cases = [
        ("out-of-order", "0\n# c\n2000\n1000\n", "line 4:"),
        ("negative", "0\n-5\n", "line 2:"),
        ("non-numeric-time", "abc\n", "line 1:"),
        ("non-numeric-cost", "0\n1,,x\n", "line 2:"),
        ("negative-cost", "0,,-1\n", "line 1:"),
        ("too-many-fields", "0,a,1,2\n", "line 1:"),
        ("empty", "# nothing\n\n", "no requests"),
    ];
    for (name, trace, want) in cases {
        let stderr = refused(name, trace, "10/minute");
        assert!(stderr.contains(want), "{name}: {stderr}");
    }
    let stderr = refused("bad-quota", "0\n", "10 per fortnight");
    assert!(
        stderr.contains("10 per fortnight"),
        "the parser's message: {stderr}"
    );
    let o = run(&[
        "--traffic",
        "poisson:x",
        "--quota",
        "1/second",
        "--out",
        "unused",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["--quota", "1/second", "--out", "unused"]);
    assert_eq!(o.status.code(), Some(2), "neither --trace nor --traffic");
    let o = run(&[
        "--traffic",
        "edge-attack",
        "--quota",
        "1/second",
        "--strategy",
        "nope",
        "--out",
        "unused",
    ]);
    assert_eq!(o.status.code(), Some(2), "an unknown strategy");
}

#[test]
fn a_default_strategy_that_cannot_represent_the_quota_is_skipped_with_a_note() {
    let out = simulate("big-quota", "0\n1\n", &["--quota", "2000000/hour"]);
    let got = rows(&out);
    assert_eq!(got.len(), 10, "five strategies x two requests");
    assert!(
        got.iter()
            .all(|r| r.strategy != "moving-window" && r.allowed)
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.contains("Skipped moving-window"), "{summary}");
    assert!(summary.contains("Not compared"), "{summary}");
    let stderr = refused_with(
        "named-big-quota",
        "0\n",
        &["--quota", "2000000/hour", "--strategy", "moving-window"],
    );
    assert!(
        stderr.contains("moving-window"),
        "named, it is an error: {stderr}"
    );
}

/// Runs the simulator on `trace` with `args`, expecting exit 2; returns stderr.
fn refused_with(name: &str, trace: &str, args: &[&str]) -> String {
    let (o, _) = run_trace(name, trace, args);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{name}: {stderr}");
    stderr
}
