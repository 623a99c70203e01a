//! The server the HTTP benchmark loads (`scripts/http_bench.sh`): an axum 0.8 hello world with no
//! limiter, with tollgate (one strategy), with tower_governor 0.8, or a handler that answers a static
//! 429 (the reference for the flood case). Every limiter keys by peer IP. `identity` adds a layer
//! that does nothing (`tower::layer::util::Identity`): what any `Router::layer` costs in axum (one
//! more boxed route, cloned per request), the floor under a middleware's own work.
//!
//! ```text
//! cargo run --release -p tollgate-tools --bin http_bench_server -- VARIANT WORKLOAD [ADDR]
//!   VARIANT  none | identity | static429 | tower-governor | tower-governor-headers | tollgate:STRATEGY (e.g. tollgate:sliding-window)
//!            | metrics:STRATEGY (tollgate:STRATEGY with a metrics recorder installed: atomic
//!            counters, as an exporter keeps them) | rules:STRATEGY (the same limit from a rules file) | code2:STRATEGY (per-IP
//!            and global limits as two stacked layers) | rules2:STRATEGY (the same two limits from a
//!            rules file) | nofields:STRATEGY (tollgate:STRATEGY writing no fields on an allowed
//!            response, as tower-governor without its headers)
//!   WORKLOAD allow (a quota that never rejects) | reject (every request after the first rejected)
//! ```
//!
//! Prints `listening on http://ADDR` once ready.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use governor::middleware::NoOpMiddleware;
use tollgate::key::PeerIp;
use tollgate::layer::{Headers, RateLimitLayer};
use tollgate::{RateLimiter, Strategy};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;

async fn hello() -> &'static str {
    "Hello, World!"
}

async fn static_429() -> (StatusCode, [(&'static str, &'static str); 4], &'static str) {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [
            ("x-ratelimit-limit", "1"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "86400"),
            ("retry-after", "86400"),
        ],
        "Too Many Requests: retry after 86400 s\n",
    )
}

/// A metrics recorder that keeps every counter and gauge in an atomic (what an exporter's storage
/// does per update: one atomic add behind the handle), histograms dropped, nothing served.
/// Deterministic under callgrind, unlike an exporter whose clock calibrates at start.
struct AtomicRecorder;

impl metrics::Recorder for AtomicRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(AtomicU64::new(0)))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(Arc::new(AtomicU64::new(0)))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// tower_governor keyed by peer IP: one cell per ns with a burst of 10^9 (allow), or one cell per
/// day with a burst of 1 (reject: every request after the first).
fn governor_config(reject: bool) -> GovernorConfigBuilder<PeerIpKeyExtractor, NoOpMiddleware> {
    let mut builder = GovernorConfigBuilder::default();
    if reject {
        builder.per_second(86_400).burst_size(1);
    } else {
        builder.per_nanosecond(1).burst_size(1_000_000_000);
    }
    builder
}

fn app(variant: &str, reject: bool) -> Result<Router, String> {
    let base = Router::new().route("/", get(hello));
    Ok(match variant {
        "none" => base,
        "identity" => base.layer(tower::layer::util::Identity::new()),
        "static429" => Router::new().route("/", get(static_429)),
        "tower-governor" => base.layer(GovernorLayer::new(Arc::new(
            governor_config(reject)
                .finish()
                .ok_or("tower_governor config")?,
        ))),
        // The same with its `x-ratelimit-*` headers on every response (`use_headers`), as tollgate
        // always writes them: the like-for-like comparison on the allow path.
        "tower-governor-headers" => base.layer(GovernorLayer::new(Arc::new(
            governor_config(reject)
                .use_headers()
                .finish()
                .ok_or("tower_governor config")?,
        ))),
        v if v.starts_with("rules:") || v.starts_with("rules2:") => {
            let (kind, name) = v.split_once(':').ok_or("variant")?;
            let _: Strategy = name.parse().map_err(|e| format!("{e}"))?;
            let quota = if reject { "1/day" } else { "1000000000/s" };
            let mut text =
                format!("[[limit]]\nname = \"ip\"\nstrategy = \"{name}\"\nquotas = \"{quota}\"\n");
            if kind == "rules2" {
                text.push_str(&format!(
                    "[[limit]]\nname = \"all\"\nkey = \"global\"\nstrategy = \"{name}\"\nquotas = \"{quota}\"\n"
                ));
            }
            let rules = tollgate::rules::Rules::memory(&text, Default::default())
                .map_err(|e| e.to_string())?;
            base.layer(rules.layer())
        }
        v if v.starts_with("code2:") => {
            let name = &v["code2:".len()..];
            let strategy: Strategy = name.parse().map_err(|e| format!("{e}"))?;
            let quota = if reject { "1/day" } else { "1000000000/s" };
            let per_ip = RateLimiter::builder()
                .name("ip")
                .strategy(strategy)
                .quotas(quota)
                .map_err(|e| e.to_string())?
                .build()
                .map_err(|e| e.to_string())?;
            let global = RateLimiter::<()>::builder()
                .name("all")
                .strategy(strategy)
                .quotas(quota)
                .map_err(|e| e.to_string())?
                .build()
                .map_err(|e| e.to_string())?;
            base.layer(RateLimitLayer::new(global, tollgate::key::GlobalKey))
                .layer(RateLimitLayer::new(per_ip, PeerIp::default()))
        }
        v => {
            let fields = !v.starts_with("nofields:");
            let name = match v.strip_prefix("metrics:") {
                Some(name) => {
                    // Installed before the layer is built: it resolves its metric handles then.
                    metrics::set_global_recorder(AtomicRecorder)
                        .map_err(|e| format!("metrics recorder: {e}"))?;
                    name
                }
                None => v
                    .strip_prefix("tollgate:")
                    .or_else(|| v.strip_prefix("nofields:"))
                    .ok_or_else(|| format!("unknown variant {v}"))?,
            };
            let strategy: Strategy = name.parse().map_err(|e| format!("{e}"))?;
            let quota = if reject { "1/day" } else { "1000000000/s" };
            let limiter = RateLimiter::builder()
                .strategy(strategy)
                .quotas(quota)
                .map_err(|e| e.to_string())?
                .build()
                .map_err(|e| e.to_string())?;
            let layer = RateLimitLayer::new(limiter, PeerIp::default());
            if fields {
                base.layer(layer)
            } else {
                base.layer(layer.headers(Headers::new().on_allowed(false)))
            }
        }
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(variant), Some(workload)) = (args.first(), args.get(1)) else {
        eprintln!("usage: http_bench_server VARIANT allow|reject [ADDR]");
        return ExitCode::from(2);
    };
    let addr = args.get(2).map_or("127.0.0.1:0", String::as_str);
    let app = match app(variant, workload == "reject") {
        Ok(app) => app,
        Err(e) => {
            eprintln!("http_bench_server: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("http_bench_server: bind {addr}: {e}");
            return ExitCode::from(2);
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("listening on http://{a}"),
        Err(e) => {
            eprintln!("http_bench_server: {e}");
            return ExitCode::from(2);
        }
    }
    let serve = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    tokio::select! {
        r = serve => if let Err(e) = r { eprintln!("http_bench_server: {e}"); return ExitCode::FAILURE; },
        _ = tokio::signal::ctrl_c() => {},
        _ = tokio::time::sleep(Duration::from_secs(3600)) => {},
    }
    ExitCode::SUCCESS
}
