//! Replays a trace of requests through the strategies on a manual clock and draws what each admits.
//!
//! ```text
//! cargo run --example simulate -- --trace trace.csv --quota 10/minute --out sim
//! cargo run --example simulate -- --traffic edge-attack --quota 5/10s --out sim
//! cargo run --example simulate -- --traffic poisson:2,60 --seed 7 --quota 10/minute \
//!     --strategy sliding-window --strategy moving-window --out sim
//! ```
//!
//! Flags (a bad flag, a bad quota or a bad trace exits with code 2 and a message):
//!
//! ```text
//! --trace FILE                one request per line, `t_ms[,key[,cost]]` (see below)
//! --traffic SPEC              generate the trace instead: poisson:RATE_PER_S,SECONDS |
//!                             bursts:SIZE,EVERY_MS,SECONDS | edge-attack
//! --seed N                    seed of the generated traffic (default 1)
//! --quota Q                   quota, `;`-separated for several (e.g. "10/minute")
//! --burst B                   burst (capacity) of the bucket strategies
//! --strategy NAME             repeatable; default: all six, in CLI order (one that cannot
//!                             represent the quota is then skipped, with a note)
//! --out DIR                   created if missing
//! ```
//!
//! The trace: `t_ms` is integer milliseconds from the start of the trace, non-decreasing (equal
//! times are allowed); the trace starts at a whole UTC day, so clock-aligned windows start at
//! `t = 0`. `key` defaults to one key (an empty field), `cost` to 1. Blank lines and `#` comments
//! are skipped, CRLF is accepted, keys cannot contain commas.
//!
//! Writes `DIR/decisions.csv` (`strategy,t_ms,key,cost,allowed`, grouped by strategy in CLI order,
//! then in trace order), `DIR/<strategy>.svg` (the timeline: a dot per request, the windows, and the
//! admitted count in the trailing period of the first quota) and `DIR/summary.md` (admitted and
//! rejected per strategy; the sliding window counter's false allows and false rejects against the
//! exact moving window run on the same arrivals).
//!
//! Edge attack: with the first quota `N` per `W`, `N` requests 1 % of `W` before the window edge
//! at `W` and `N` at the edge, the same again at `3W`, and the trace ends at `4W`: a clock-aligned
//! fixed window admits `2N` within that 1 %.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use plotters::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tollgate::{ManualClock, Quota, RateLimiter, Strategy, parse_quotas};

/// 2023-11-14 00:00:00 UTC: the trace's `t = 0`, a whole UTC day.
const DAY_NANOS: u64 = 19_675 * 86_400 * 1_000_000_000;
const MS: u64 = 1_000_000;
/// The most requests a generated trace may hold.
const MAX_GENERATED: usize = 10_000_000;

#[derive(Parser, Debug)]
#[command(
    name = "simulate",
    about = "Replays a trace through tollgate's strategies and plots what each admits"
)]
struct Args {
    /// The trace: one request per line, `t_ms[,key[,cost]]`.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "traffic",
        conflicts_with = "traffic"
    )]
    trace: Option<PathBuf>,
    /// Generate the trace: `poisson:RATE_PER_S,SECONDS`, `bursts:SIZE,EVERY_MS,SECONDS` or `edge-attack`.
    #[arg(long, value_name = "SPEC")]
    traffic: Option<String>,
    /// Seed of the generated traffic.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The quota(s), e.g. "10/minute" or "5/second; 100/minute".
    #[arg(long)]
    quota: String,
    /// The burst (capacity) of the bucket strategies.
    #[arg(long)]
    burst: Option<NonZeroU32>,
    /// A strategy to run (repeatable); all six when none is given.
    #[arg(long = "strategy", value_name = "NAME")]
    strategies: Vec<Strategy>,
    /// The output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// One request of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Request {
    t_ms: u64,
    key: String,
    cost: u32,
}

/// A failure that ends the run with a message and an exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    fn io(what: &str, path: &Path, err: impl std::fmt::Display) -> Self {
        Self {
            code: 1,
            message: format!("{what} {}: {err}", path.display()),
        }
    }
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            // Help and version go to stdout with 0; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("simulate: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    let quotas = parse_quotas(&args.quota).map_err(|e| Failure::usage(e.to_string()))?;
    let first = *quotas
        .first()
        .ok_or_else(|| Failure::usage("no quota given"))?;
    let strategies = if args.strategies.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        args.strategies.clone()
    };
    let trace = match (&args.trace, &args.traffic) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
            parse_trace(&text).map_err(Failure::usage)?
        }
        (None, Some(spec)) => generate(spec, args.seed, &first).map_err(Failure::usage)?,
        (None, None) => return Err(Failure::usage("give --trace FILE or --traffic SPEC")),
    };
    // Build every limiter first, so a quota a strategy cannot represent fails before any output.
    // A strategy named on the command line must accept the quota; among the defaults, one that
    // cannot represent it (e.g. a moving window above its limit) is skipped with a note.
    let mut runs = Vec::with_capacity(strategies.len());
    let mut skipped = Vec::new();
    for &strategy in &strategies {
        match replay(strategy, &quotas, args.burst, &trace) {
            Ok(allowed) => runs.push(Run { strategy, allowed }),
            Err(e) if args.strategies.is_empty() => {
                eprintln!("simulate: skipping {strategy}: {e}");
                skipped.push(format!("{strategy}: {e}"));
            }
            Err(e) => return Err(Failure::usage(format!("{strategy}: {e}"))),
        }
    }
    std::fs::create_dir_all(&args.out).map_err(|e| Failure::io("cannot create", &args.out, e))?;
    write_csv(&args.out, &runs, &trace)?;
    let sliding_vs_exact = if runs.iter().any(|r| r.strategy == Strategy::SlidingWindow) {
        Some(compare_sliding(&runs, &quotas, args.burst, &trace))
    } else {
        None
    };
    let mut summary = summary_md(args, &runs, &trace, sliding_vs_exact.as_ref());
    for note in &skipped {
        let _ = writeln!(summary, "\nSkipped {note}.");
    }
    let path = args.out.join("summary.md");
    std::fs::write(&path, summary).map_err(|e| Failure::io("cannot write", &path, e))?;
    for run in &runs {
        let path = args.out.join(format!("{}.svg", run.strategy));
        plot(&path, run, &first, &trace).map_err(|e| Failure::io("cannot draw", &path, e))?;
    }
    Ok(())
}

/// Parses a trace; the error names the line (`line N: ...`).
fn parse_trace(text: &str) -> Result<Vec<Request>, String> {
    let mut out = Vec::new();
    let mut last = 0u64;
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut fields = trimmed.split(',');
        let t_field = fields.next().unwrap_or("").trim();
        let key = fields.next().unwrap_or("").trim().to_owned();
        let cost_field = fields.next().map(str::trim);
        if fields.next().is_some() {
            return Err(format!(
                "line {n}: expected t_ms[,key[,cost]] (keys cannot contain commas), got {trimmed:?}"
            ));
        }
        let t_ms =
            parse_number(t_field).map_err(|why| format!("line {n}: time {t_field:?} {why}"))?;
        if t_ms < last {
            return Err(format!(
                "line {n}: time {t_ms} ms is before the previous request's {last} ms (times must not decrease)"
            ));
        }
        last = t_ms;
        let cost = match cost_field {
            None | Some("") => 1,
            Some(c) => {
                let v = parse_number(c).map_err(|why| format!("line {n}: cost {c:?} {why}"))?;
                u32::try_from(v).map_err(|_| format!("line {n}: cost {v} is above {}", u32::MAX))?
            }
        };
        // Keep simulated times well inside what the clock can hold.
        if t_ms > 100 * 365 * 86_400_000 {
            return Err(format!("line {n}: time {t_ms} ms is more than 100 years"));
        }
        out.push(Request { t_ms, key, cost });
    }
    if out.is_empty() {
        return Err("line 1: the trace holds no requests".to_owned());
    }
    Ok(out)
}

fn parse_number(s: &str) -> Result<u64, &'static str> {
    if s.is_empty() {
        return Err("is empty");
    }
    if s.starts_with('-') {
        return Err("is negative");
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("is not a non-negative integer");
    }
    s.parse().map_err(|_| "is too large")
}

/// Generates a trace from `poisson:RATE_PER_S,SECONDS`, `bursts:SIZE,EVERY_MS,SECONDS` or
/// `edge-attack` (shaped by the first quota).
fn generate(spec: &str, seed: u64, quota: &Quota) -> Result<Vec<Request>, String> {
    let (kind, params) = spec.split_once(':').unwrap_or((spec, ""));
    let nums = |want: usize| -> Result<Vec<f64>, String> {
        let v: Vec<f64> = params
            .split(',')
            .map(|p| p.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("--traffic {spec:?}: expected {want} numbers after {kind}:"))?;
        if v.len() != want || v.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err(format!(
                "--traffic {spec:?}: expected {want} positive numbers after {kind}:"
            ));
        }
        Ok(v)
    };
    let one = |t_ms: u64| Request {
        t_ms,
        key: String::new(),
        cost: 1,
    };
    let trace = match kind {
        "poisson" => {
            let v = nums(2)?;
            let (rate, seconds) = (v[0], v[1]);
            if rate * seconds > MAX_GENERATED as f64 {
                return Err(format!(
                    "--traffic {spec:?}: more than {MAX_GENERATED} requests"
                ));
            }
            let mut rng = StdRng::seed_from_u64(seed);
            let mut t = 0.0f64;
            let mut out = Vec::new();
            loop {
                let u: f64 = rng.random::<f64>();
                t += -(1.0 - u).ln() / rate;
                if t >= seconds {
                    break;
                }
                out.push(one((t * 1000.0).floor() as u64));
            }
            out
        }
        "bursts" => {
            let v = nums(3)?;
            let (size, every, seconds) = (v[0] as u64, v[1] as u64, v[2]);
            if size == 0 || every == 0 || v[0].fract() != 0.0 || v[1].fract() != 0.0 {
                return Err(format!(
                    "--traffic {spec:?}: SIZE and EVERY_MS must be positive integers"
                ));
            }
            let end = (seconds * 1000.0) as u64;
            if (end / every + 1).saturating_mul(size) > MAX_GENERATED as u64 {
                return Err(format!(
                    "--traffic {spec:?}: more than {MAX_GENERATED} requests"
                ));
            }
            let mut out = Vec::new();
            let mut t = 0;
            while t < end {
                out.extend((0..size).map(|_| one(t)));
                t += every;
            }
            out
        }
        "edge-attack" if params.is_empty() => {
            let n = u64::from(quota.limit());
            let w = (quota.period().as_millis() as u64).max(2);
            if n.saturating_mul(4) > MAX_GENERATED as u64 {
                return Err(format!(
                    "--traffic edge-attack: more than {MAX_GENERATED} requests"
                ));
            }
            let early = (w / 100).max(1);
            let mut out = Vec::new();
            for edge in [w, 3 * w] {
                out.extend((0..n).map(|_| one(edge - early)));
                out.extend((0..n).map(|_| one(edge)));
            }
            // One last request marks the end of the trace at 4W.
            out.push(one(4 * w));
            out
        }
        _ => {
            return Err(format!(
                "--traffic {spec:?}: expected poisson:RATE_PER_S,SECONDS, bursts:SIZE,EVERY_MS,SECONDS or edge-attack"
            ));
        }
    };
    if trace.is_empty() {
        return Err(format!("--traffic {spec:?} generates no requests"));
    }
    Ok(trace)
}

/// One strategy's decisions, one per request of the trace.
#[derive(Debug)]
struct Run {
    strategy: Strategy,
    allowed: Vec<bool>,
}

/// Replays `trace` through a fresh limiter of `strategy` on a manual clock.
fn replay(
    strategy: Strategy,
    quotas: &[Quota],
    burst: Option<NonZeroU32>,
    trace: &[Request],
) -> Result<Vec<bool>, tollgate::ConfigError> {
    let clock = ManualClock::new(Duration::from_nanos(DAY_NANOS));
    let mut builder = RateLimiter::<String>::builder()
        .strategy(strategy)
        .clock(clock.clone());
    for q in quotas {
        builder = builder.quota(*q);
    }
    if let Some(b) = burst {
        builder = builder.burst(b);
    }
    let limiter = builder.build()?;
    Ok(trace
        .iter()
        .map(|r| {
            clock.set_nanos(DAY_NANOS + r.t_ms * MS);
            limiter.check_now(&r.key, r.cost).is_allowed()
        })
        .collect())
}

fn write_csv(dir: &Path, runs: &[Run], trace: &[Request]) -> Result<(), Failure> {
    let mut csv = String::from("strategy,t_ms,key,cost,allowed\n");
    for run in runs {
        for (r, allowed) in trace.iter().zip(&run.allowed) {
            let _ = writeln!(
                csv,
                "{},{},{},{},{}",
                run.strategy, r.t_ms, r.key, r.cost, allowed
            );
        }
    }
    let path = dir.join("decisions.csv");
    std::fs::write(&path, csv).map_err(|e| Failure::io("cannot write", &path, e))
}

/// The sliding window counter against the exact log (moving window) on the same arrivals.
#[derive(Debug)]
enum Comparison {
    Counts {
        requests: usize,
        false_allows: usize,
        false_rejects: usize,
    },
    Unavailable(String),
}

fn compare_sliding(
    runs: &[Run],
    quotas: &[Quota],
    burst: Option<NonZeroU32>,
    trace: &[Request],
) -> Comparison {
    let find = |s| {
        runs.iter()
            .find(|r| r.strategy == s)
            .map(|r| r.allowed.clone())
    };
    let Some(sliding) = find(Strategy::SlidingWindow) else {
        return Comparison::Unavailable("the sliding window counter was not run".into());
    };
    let exact = match find(Strategy::MovingWindow) {
        Some(e) => e,
        None => match replay(Strategy::MovingWindow, quotas, burst, trace) {
            Ok(e) => e,
            Err(e) => return Comparison::Unavailable(format!("no exact log for this quota: {e}")),
        },
    };
    let false_allows = sliding
        .iter()
        .zip(&exact)
        .filter(|(s, e)| **s && !**e)
        .count();
    let false_rejects = sliding
        .iter()
        .zip(&exact)
        .filter(|(s, e)| !**s && **e)
        .count();
    Comparison::Counts {
        requests: trace.len(),
        false_allows,
        false_rejects,
    }
}

fn pct(part: usize, whole: usize) -> String {
    if whole == 0 {
        "0.00 %".into()
    } else {
        format!("{:.2} %", 100.0 * part as f64 / whole as f64)
    }
}

fn summary_md(args: &Args, runs: &[Run], trace: &[Request], cmp: Option<&Comparison>) -> String {
    let mut md = String::from("# Simulation summary\n\n");
    let source = match (&args.trace, &args.traffic) {
        (Some(p), _) => format!("trace `{}`", p.display()),
        (None, Some(t)) => format!("generated traffic `{t}` (seed {})", args.seed),
        (None, None) => String::new(),
    };
    let _ = writeln!(
        md,
        "{} requests from {source}, quota `{}`{}.\n",
        trace.len(),
        args.quota,
        args.burst
            .map(|b| format!(", burst {b}"))
            .unwrap_or_default()
    );
    md.push_str("| strategy | admitted | rejected | admitted share |\n|---|---:|---:|---:|\n");
    for run in runs {
        let admitted = run.allowed.iter().filter(|a| **a).count();
        let rejected = run.allowed.len() - admitted;
        let _ = writeln!(
            md,
            "| {} | {admitted} | {rejected} | {} |",
            run.strategy,
            pct(admitted, run.allowed.len())
        );
    }
    if let Some(cmp) = cmp {
        md.push_str("\n## Sliding window counter against the exact log\n\n");
        match cmp {
            Comparison::Counts {
                requests,
                false_allows,
                false_rejects,
            } => {
                let _ = writeln!(
                    md,
                    "Both run on the same arrivals, each with its own state. A false allow is a request the \
counter admitted and the exact log (moving window) rejected; a false reject the other way round. \
Rates are shares of all {requests} requests.\n"
                );
                md.push_str("| | requests | rate |\n|---|---:|---:|\n");
                let _ = writeln!(
                    md,
                    "| false allows | {false_allows} | {} |",
                    pct(*false_allows, *requests)
                );
                let _ = writeln!(
                    md,
                    "| false rejects | {false_rejects} | {} |",
                    pct(*false_rejects, *requests)
                );
            }
            Comparison::Unavailable(why) => {
                let _ = writeln!(md, "Not compared: {why}.");
            }
        }
    }
    md
}

/// The largest per-key admitted cost in the trailing period `w_ms`, at every change, as steps
/// `(t_ms, count)`; and for each request its key's count just after it.
fn trailing_counts(allowed: &[bool], trace: &[Request], w_ms: u64) -> (Vec<(f64, u64)>, Vec<u64>) {
    // Events: admissions (+cost at t) and expiries (-cost at t + w), in time order; at equal times
    // expiries first (an entry at s no longer counts at s + w).
    let mut keys: HashMap<&str, u64> = HashMap::new();
    let mut pending: VecDeque<(u64, &str, u64)> = VecDeque::new();
    let mut steps = Vec::new();
    let mut per_request = Vec::with_capacity(trace.len());
    let max_of = |keys: &HashMap<&str, u64>| keys.values().copied().max().unwrap_or(0);
    let ms_to_s = |t: u64| t as f64 / 1000.0;
    steps.push((0.0, 0));
    let expire_until = |t: u64,
                        pending: &mut VecDeque<(u64, &str, u64)>,
                        keys: &mut HashMap<&str, u64>,
                        steps: &mut Vec<(f64, u64)>| {
        while let Some(&(at, key, cost)) = pending.front() {
            if at > t {
                break;
            }
            pending.pop_front();
            if let Some(c) = keys.get_mut(key) {
                *c = c.saturating_sub(cost);
            }
            steps.push((ms_to_s(at), max_of(keys)));
        }
    };
    for (r, &ok) in trace.iter().zip(allowed) {
        expire_until(r.t_ms, &mut pending, &mut keys, &mut steps);
        let c = keys.entry(r.key.as_str()).or_insert(0);
        if ok {
            *c += u64::from(r.cost);
            pending.push_back((r.t_ms + w_ms, r.key.as_str(), u64::from(r.cost)));
        }
        per_request.push(*c);
        steps.push((ms_to_s(r.t_ms), max_of(&keys)));
    }
    let end = trace.last().map_or(0, |r| r.t_ms);
    expire_until(end + w_ms, &mut pending, &mut keys, &mut steps);
    (steps, per_request)
}

/// Window edges to draw, in ms: clock-aligned for the fixed window and the sliding counter, opened
/// by the first request of the (first) key for the first-hit window, none for the others.
fn window_edges(
    strategy: Strategy,
    trace: &[Request],
    allowed: &[bool],
    w_ms: u64,
    end_ms: u64,
) -> Vec<u64> {
    match strategy {
        Strategy::FixedWindow | Strategy::SlidingWindow => (0..)
            .map(|k| k * w_ms)
            .take_while(|t| *t <= end_ms)
            .collect(),
        Strategy::FixedWindowFirstHit => {
            // Replays the opening rule on the first key's admitted requests: a window opens at a
            // request made when none is open and lasts one period.
            let Some(first) = trace.first().map(|r| r.key.as_str()) else {
                return Vec::new();
            };
            let mut edges = Vec::new();
            let mut open_until = None::<u64>;
            for (r, &ok) in trace.iter().zip(allowed) {
                if r.key != first || !ok {
                    continue;
                }
                if open_until.is_none_or(|end| r.t_ms >= end) {
                    edges.push(r.t_ms);
                    edges.push(r.t_ms + w_ms);
                    open_until = Some(r.t_ms + w_ms);
                }
            }
            edges
        }
        _ => Vec::new(),
    }
}

fn plot(path: &Path, run: &Run, quota: &Quota, trace: &[Request]) -> Result<(), String> {
    let w_ms = (quota.period().as_millis() as u64).max(1);
    let n = u64::from(if run.strategy.is_bucket() {
        quota.burst()
    } else {
        quota.limit()
    });
    let (steps, per_request) = trailing_counts(&run.allowed, trace, w_ms);
    let end_ms = trace.last().map_or(0, |r| r.t_ms);
    let x_max = (end_ms as f64 / 1000.0).mul_add(1.04, 0.001);
    let y_top = steps.iter().map(|s| s.1).max().unwrap_or(0).max(n);
    // Headroom above the highest count for the legend.
    let y_max = (y_top as f64 * 1.7).max(2.0);
    let admitted = run.allowed.iter().filter(|a| **a).count();

    let root = SVGBackend::new(path, (900, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let caption = format!(
        "{}: {admitted} of {} admitted ({} per {} s{})",
        run.strategy,
        trace.len(),
        quota.limit(),
        quota.period().as_secs_f64(),
        if run.strategy.is_bucket() {
            format!(", burst {}", quota.burst())
        } else {
            String::new()
        }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("time since the start of the trace (s)")
        .y_desc(format!(
            "admitted in the last {} s",
            quota.period().as_secs_f64()
        ))
        .label_style(("sans-serif", 13))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|x| format!("{x}"))
        .draw()
        .map_err(|e| e.to_string())?;

    let edge_style = RGBColor(150, 150, 150).stroke_width(1);
    for t in window_edges(run.strategy, trace, &run.allowed, w_ms, end_ms) {
        let x = t as f64 / 1000.0;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max)],
                edge_style,
            )))
            .map_err(|e| e.to_string())?;
    }
    let limit_colour = RGBColor(90, 90, 90);
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, n as f64), (x_max, n as f64)],
            6,
            4,
            limit_colour.stroke_width(1),
        ))
        .map_err(|e| e.to_string())?
        .label(format!("limit ({n})"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], limit_colour));

    let line_colour = RGBColor(40, 90, 170);
    let mut stepped = Vec::with_capacity(steps.len() * 2);
    let mut prev: Option<u64> = None;
    for &(x, c) in &steps {
        if let Some(p) = prev {
            stepped.push((x, p as f64));
        }
        stepped.push((x, c as f64));
        prev = Some(c);
    }
    chart
        .draw_series(LineSeries::new(stepped, line_colour.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label("admitted in the trailing period")
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 18, y)], line_colour.stroke_width(2))
        });

    // Admitted: filled circles (blue-green); rejected: crosses (orange-red) one step above, so the
    // shape tells them apart without colour.
    let ok_colour = RGBColor(0, 140, 110);
    let no_colour = RGBColor(215, 80, 20);
    let points = trace.iter().zip(&run.allowed).zip(&per_request);
    chart
        .draw_series(
            points
                .clone()
                .filter(|((_, ok), _)| **ok)
                .map(|((r, _), c)| {
                    Circle::new((r.t_ms as f64 / 1000.0, *c as f64), 3, ok_colour.filled())
                }),
        )
        .map_err(|e| e.to_string())?
        .label("admitted request")
        .legend(move |(x, y)| Circle::new((x + 9, y), 3, ok_colour.filled()));
    // Rejections at the same time and key stack upwards, so each one stays visible.
    let mut crosses = Vec::new();
    let mut run: Option<(u64, &str, usize)> = None;
    for ((r, _), c) in points.filter(|((_, ok), _)| !**ok) {
        let j = match run {
            Some((t, k, j)) if t == r.t_ms && k == r.key => j + 1,
            _ => 0,
        };
        run = Some((r.t_ms, r.key.as_str(), j));
        let y = (j as f64).mul_add(0.6, *c as f64 + 0.5).min(y_max * 0.97);
        crosses.push(Cross::new(
            (r.t_ms as f64 / 1000.0, y),
            4,
            no_colour.stroke_width(2),
        ));
    }
    chart
        .draw_series(crosses)
        .map_err(|e| e.to_string())?
        .label("rejected request")
        .legend(move |(x, y)| Cross::new((x + 9, y), 4, no_colour.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperMiddle)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
