//! A configurable demo server: every request (404s too) is rate limited.
//!
//! ```text
//! cargo run --example server -- --quota 5/minute --strategy token-bucket --burst 2
//! curl -i http://127.0.0.1:3000/
//! ```
//!
//! Flags (a bad flag exits with code 2 and a message; SIGINT/SIGTERM exit 0):
//!
//! ```text
//! --addr ADDR                 listen address (default 127.0.0.1:3000; port 0 picks a free one)
//! --strategy NAME             fixed-window | fixed-window-first-hit | moving-window |
//!                             sliding-window (default) | token-bucket | leaky-bucket
//! --burst B                   burst (capacity) of the bucket strategies
//! --quota Q                   quota, repeatable or `;`-separated (default 10/minute)
//! --key ip|header:NAME|global key (default ip)
//! --on-missing-key reject|global   no key: 400 text/plain (default) or the global bucket
//! --trust-proxy CIDR          trusted proxy range, repeatable (the ip key then reads a header)
//! --forwarded-header xff|forwarded|x-real-ip   the header trusted proxies set (default xff)
//! --store memory|redis://HOST:PORT|redis+cluster://H1:P1,H2:P2   (default memory)
//! --fail-closed               answer 503 when the store fails (default: fail open)
//! --reset-format delta|unix   x-ratelimit-reset as seconds from now (default) or Unix time
//! --max-keys N                cap on the keys the memory store holds
//! --store-timeout MS          how long a Redis decision may take (default 50)
//! ```
//!
//! Once listening it prints exactly one line to stdout, `listening on http://ADDR`; logs go to
//! stderr (`RUST_LOG`, e.g. `RUST_LOG=tollgate=debug` for one line per rejection).

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use axum::routing::get;
use http::request::Parts;
use tollgate::key::{
    Cidr, ForwardedHeader, ForwardedIp, GlobalKey, HeaderKey, KeyError, KeyExtractor, PeerIp,
};
use tollgate::layer::{FailurePolicy, RateLimitLayer, ResetFormat};
use tollgate::store::{Store, StoreKey};
use tollgate::{Clock, RateLimiter, Strategy};

const USAGE: &str = "usage: server [--addr ADDR] [--strategy NAME] [--burst B] [--quota Q]... \
[--key ip|header:NAME|global] [--on-missing-key reject|global] [--trust-proxy CIDR]... \
[--forwarded-header xff|forwarded|x-real-ip] [--store memory|redis://HOST:PORT|redis+cluster://H1:P1,H2:P2] \
[--fail-closed] [--reset-format delta|unix] [--max-keys N] [--store-timeout MS]";

/// Where the limiter keeps its state.
#[derive(Clone, Debug, PartialEq, Eq)]
enum StoreChoice {
    Memory,
    Redis(String),
}

/// The parsed command line.
#[derive(Clone, Debug)]
struct Options {
    addr: SocketAddr,
    strategy: Strategy,
    burst: Option<std::num::NonZeroU32>,
    quotas: Vec<String>,
    key: KeyChoice,
    missing_global: bool,
    trusted: Vec<Cidr>,
    header: ForwardedHeader,
    store: StoreChoice,
    fail_closed: bool,
    reset: ResetFormat,
    max_keys: Option<usize>,
    store_timeout: Option<std::time::Duration>,
}

#[derive(Clone, Debug)]
enum KeyChoice {
    Ip,
    Header(HeaderKey),
    Global,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
        strategy: Strategy::SlidingWindow,
        burst: None,
        quotas: Vec::new(),
        key: KeyChoice::Ip,
        missing_global: false,
        trusted: Vec::new(),
        header: ForwardedHeader::XForwardedFor,
        store: StoreChoice::Memory,
        fail_closed: false,
        reset: ResetFormat::Delta,
        max_keys: None,
        store_timeout: None,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if flag == "--fail-closed" {
            if inline.is_some() {
                return Err("--fail-closed takes no value".into());
            }
            o.fail_closed = true;
            continue;
        }
        let known = [
            "--addr",
            "--strategy",
            "--burst",
            "--quota",
            "--key",
            "--on-missing-key",
            "--trust-proxy",
            "--forwarded-header",
            "--store",
            "--reset-format",
            "--max-keys",
            "--store-timeout",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown argument {arg:?}"));
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
        let bad = |what: &str| format!("invalid {flag} {value:?}: {what}");
        match flag.as_str() {
            "--addr" => o.addr = value.parse().map_err(|_| bad("expected HOST:PORT"))?,
            "--strategy" => o.strategy = value.parse().map_err(|e| format!("{e}"))?,
            "--burst" => {
                o.burst = Some(
                    value
                        .parse()
                        .map_err(|_| bad("expected a positive integer"))?,
                )
            }
            "--quota" => {
                tollgate::parse_quotas(&value).map_err(|e| format!("{e}"))?;
                o.quotas.push(value);
            }
            "--key" => {
                o.key = match value.as_str() {
                    "ip" => KeyChoice::Ip,
                    "global" => KeyChoice::Global,
                    v => match v.strip_prefix("header:") {
                        Some(name) if !name.is_empty() => KeyChoice::Header(
                            HeaderKey::try_new(name).map_err(|e| bad(&e.to_string()))?,
                        ),
                        _ => return Err(bad("expected ip, header:NAME or global")),
                    },
                }
            }
            "--on-missing-key" => {
                o.missing_global = match value.as_str() {
                    "reject" => false,
                    "global" => true,
                    _ => return Err(bad("expected reject or global")),
                }
            }
            "--trust-proxy" => o.trusted.push(
                value
                    .parse()
                    .map_err(|e: tollgate::key::InvalidCidr| e.to_string())?,
            ),
            "--forwarded-header" => o.header = value.parse()?,
            "--store-timeout" => {
                let ms: u64 = value
                    .parse()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .ok_or_else(|| bad("expected milliseconds above 0"))?;
                o.store_timeout = Some(std::time::Duration::from_millis(ms));
            }
            "--store" => {
                o.store = if value == "memory" {
                    StoreChoice::Memory
                } else if value.starts_with("redis://")
                    || value.starts_with("rediss://")
                    || value.starts_with("redis+cluster://")
                {
                    StoreChoice::Redis(value)
                } else {
                    return Err(bad(
                        "expected memory, redis://HOST:PORT or redis+cluster://H1:P1,H2:P2",
                    ));
                }
            }
            "--reset-format" => {
                o.reset = match value.as_str() {
                    "delta" => ResetFormat::Delta,
                    "unix" => ResetFormat::Unix,
                    _ => return Err(bad("expected delta or unix")),
                }
            }
            "--max-keys" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| bad("expected a positive integer"))?;
                if n == 0 {
                    return Err(bad("expected a positive integer"));
                }
                o.max_keys = Some(n);
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if o.quotas.is_empty() {
        o.quotas.push("10/minute".to_owned());
    }
    Ok(o)
}

/// The demo's key: whichever extractor the flags chose, encoded to bytes (tagged by kind).
#[derive(Clone, Debug)]
enum DemoKey {
    Peer(PeerIp),
    Forwarded(ForwardedIp),
    Header(HeaderKey),
    Global,
}

/// The encoding of the global key (also the fallback for `--on-missing-key global`).
fn global_key() -> Vec<u8> {
    vec![b'g']
}

impl KeyExtractor for DemoKey {
    type Key = Vec<u8>;

    fn extract(&self, parts: &Parts) -> Result<Vec<u8>, KeyError> {
        let mut out = Vec::with_capacity(40);
        match self {
            DemoKey::Peer(x) => {
                out.push(b'i');
                x.extract(parts)?.encode(&mut out);
            }
            DemoKey::Forwarded(x) => {
                out.push(b'i');
                x.extract(parts)?.encode(&mut out);
            }
            DemoKey::Header(x) => {
                out.push(b'h');
                x.extract(parts)?.encode(&mut out);
            }
            DemoKey::Global => {
                GlobalKey.extract(parts)?;
                return Ok(global_key());
            }
        }
        Ok(out)
    }
}

/// The app: `GET /` answers `ok`; everything, 404s included, goes through the limiter.
fn app<St: Store<Vec<u8>>, C: Clock>(limiter: RateLimiter<Vec<u8>, St, C>, o: &Options) -> Router {
    let key = match &o.key {
        KeyChoice::Ip if o.trusted.is_empty() => DemoKey::Peer(PeerIp::default()),
        KeyChoice::Ip => {
            DemoKey::Forwarded(ForwardedIp::from_cidrs(o.trusted.iter().copied()).header(o.header))
        }
        KeyChoice::Header(h) => DemoKey::Header(h.clone()),
        KeyChoice::Global => DemoKey::Global,
    };
    let mut layer = RateLimitLayer::new(limiter, key)
        .reset_format(o.reset)
        .failure_policy(if o.fail_closed {
            FailurePolicy::FailClosed
        } else {
            FailurePolicy::FailOpen
        });
    if o.missing_global {
        layer = layer.fallback_key(global_key());
    }
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// Serves until SIGINT or SIGTERM. Generic over the store, so any `Store<Vec<u8>>` plugs in.
async fn serve<St: Store<Vec<u8>>, C: Clock>(
    limiter: RateLimiter<Vec<u8>, St, C>,
    o: &Options,
) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(o.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("server: cannot listen on {}: {e}", o.addr);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("server: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on http://{addr}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let app = app(limiter, o);
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("server: {message}\n{USAGE}");
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let o = match parse_args(args) {
        Ok(o) => o,
        Err(e) => return usage_error(&e),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut builder = RateLimiter::<Vec<u8>>::builder().strategy(o.strategy);
    for q in &o.quotas {
        builder = match builder.quotas(q) {
            Ok(b) => b,
            Err(e) => return usage_error(&e.to_string()),
        };
    }
    if let Some(b) = o.burst {
        builder = builder.burst(b);
    }
    match &o.store {
        StoreChoice::Memory => {
            let builder = match o.max_keys {
                Some(n) => builder.max_keys(n),
                None => builder,
            };
            match builder.build() {
                Ok(limiter) => serve(limiter, &o).await,
                Err(e) => usage_error(&e.to_string()),
            }
        }
        StoreChoice::Redis(url) => serve_redis(builder, url, &o).await,
    }
}

/// `--store redis://...` or `redis+cluster://...`: the limiter on the Redis store.
#[cfg(feature = "redis")]
async fn serve_redis(builder: tollgate::Builder<Vec<u8>>, url: &str, o: &Options) -> ExitCode {
    let store = tollgate::store::redis::RedisStore::builder(url);
    let store = match o.store_timeout {
        Some(timeout) => store.timeout(timeout),
        None => store,
    };
    let store = match store.build().await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("server: --store {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match builder.store(store).build() {
        Ok(limiter) => serve(limiter, o).await,
        Err(e) => usage_error(&e.to_string()),
    }
}

/// Without the `redis` feature there is no Redis store: say so and exit 2.
#[cfg(not(feature = "redis"))]
async fn serve_redis(_builder: tollgate::Builder<Vec<u8>>, url: &str, _o: &Options) -> ExitCode {
    usage_error(&format!(
        "--store {url}: this build has no Redis store (build with `--features redis` or `--all-features`)"
    ))
}
