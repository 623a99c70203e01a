//! What a large rules file costs: the process's resident memory after loading LIMITS limits (one
//! per path, before any traffic), how long parsing and compiling the file takes, and the longest
//! time a request waits while [`Rules::watch`] reloads a file of LIMITS limits, all renamed (new
//! limiters; requests
//! sent back to back from 2 tasks on a 2-worker runtime, each timed).
//!
//! `cargo run --release -p tollgate-tools --bin rules_load [LIMITS]` (default 10000, the most a
//! file may have)

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Response};
use tollgate::rules::{Rules, RulesOptions};
use tower::ServiceExt as _;

/// The process's resident set, in KiB (Linux).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A file of `n` limits named `{prefix}{i}`, one per path, keyed by a header.
fn file(n: usize, prefix: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[limit]]\nname = \"{prefix}{i}\"\npath = \"/p{i}\"\nkey = \"header:x-k\"\nquotas = \"1000000/minute\"\n"
            )
        })
        .collect()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(10_000, |s| s.parse().expect("LIMITS"));
    let text = file(n, "l");
    let before = rss_kib();
    let t = Instant::now();
    let rules = Rules::memory(&text, RulesOptions::default()).expect("a valid file");
    let load = t.elapsed();
    let after = rss_kib();
    println!(
        "{n} limits: loaded in {:.0} ms; resident memory {} -> {} KiB: +{:.1} MiB ({:.1} KiB per limit)",
        load.as_secs_f64() * 1e3,
        before,
        after,
        (after - before) as f64 / 1024.0,
        (after - before) as f64 / n as f64
    );

    let dir = std::env::temp_dir().join(format!("rules_load_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join("rules.toml");
    std::fs::write(&path, &text).expect("the file written");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let svc = tower::ServiceBuilder::new()
            .layer(rules.layer())
            .service(tower::service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::from("ok")))
            }));
        rules.watch(&path, Duration::from_millis(50));
        let stop = Arc::new(AtomicBool::new(false));
        let longest = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let clients: Vec<_> = (0..2)
            .map(|c| {
                let (svc, stop, longest, sent) =
                    (svc.clone(), stop.clone(), longest.clone(), sent.clone());
                tokio::spawn(async move {
                    let mut i = c;
                    while !stop.load(Ordering::Relaxed) {
                        let req = Request::get(format!("/p{}", i % n))
                            .header("x-k", "client")
                            .body(())
                            .expect("a request");
                        let t = Instant::now();
                        let res = svc.clone().oneshot(req).await.expect("infallible");
                        assert_eq!(res.status(), 200);
                        let took = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                        longest.fetch_max(took, Ordering::Relaxed);
                        sent.fetch_add(1, Ordering::Relaxed);
                        i += 2;
                        // Yield so that the other client and the watcher get the workers too.
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let quiet = longest.swap(0, Ordering::Relaxed);
        // Every limit renamed: each one is new (its limiter and store built afresh).
        std::fs::write(&path, file(n, "m")).expect("the file rewritten");
        let t = Instant::now();
        let deadline = t + Duration::from_secs(120);
        loop {
            let probe = Request::get("/p0")
                .header("x-k", "probe")
                .body(())
                .expect("a request");
            let (parts, ()) = probe.into_parts();
            if rules.peek("m0", &parts).await.is_some() || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let swapped = t.elapsed();
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.await.expect("a client");
        }
        println!(
            "reload of {n} new limits: swapped in {:.0} ms after the write; longest request \
             {:.2} ms during the reload ({:.2} ms before it); {} requests",
            swapped.as_secs_f64() * 1e3,
            longest.load(Ordering::Relaxed) as f64 / 1e3,
            quiet as f64 / 1e3,
            sent.load(Ordering::Relaxed)
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}
