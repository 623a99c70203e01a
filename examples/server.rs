//! A configurable demo server: every request (404s too) is rate limited.
//!
//! ```text
//! cargo run --example server -- --quota 5/minute --strategy token-bucket --burst 2
//! curl -i http://127.0.0.1:3000/
//! cargo run --example server -- --help        # every flag, with its default
//! cargo run --example server -- --rules examples/rules.toml
//! cargo run --features redis --example server -- --store redis://127.0.0.1:6379
//! ```
//!
//! `GET /` answers `ok` (after `--delay-ms`); every other path answers 404, counted like any request.
//! With `--rules FILE` (e.g. `examples/rules.toml`) every path and method answers `ok`, limited by
//! the file's limits.
//! Once listening it prints exactly one line to stdout, `listening on http://ADDR`; logs and warnings
//! go to stderr (`RUST_LOG`, e.g. `RUST_LOG=tollgate=debug` for one line per rejection). SIGINT and
//! SIGTERM stop it with exit code 0. A usage or configuration error (a bad value, a contradiction, a
//! flag whose behaviour is not available yet) exits 2 with a one-line message; a failure at run time
//! (the port is taken, Redis unreachable or refusing) exits 1. No message prints a Redis password.
//!
//! # Flags
//!
//! A flag that has no effect in the chosen combination prints one warning on stderr; one that
//! cannot apply exits 2 saying why, never ignored. With `--rules`, per-limit flags exit 2 ("set it
//! in the rules file") and process-wide flags apply to every limit of the file.
//! The `--store redis...` forms need a build with `--features redis` (or `--all-features`).
//!
//! | Flag | Default | Effect (memory store unless said) | With `--rules` |
//! | --- | --- | --- | --- |
//! | `--addr HOST:PORT` | `127.0.0.1:3000` | listen address; a host name is resolved and the first address that binds is used; port 0 picks a free port | process-wide |
//! | `--strategy NAME` | `sliding-window` | `fixed-window`, `fixed-window-first-hit`, `moving-window`, `sliding-window`, `token-bucket`, `leaky-bucket` | exit 2: set `strategy` in the file |
//! | `--quota Q` | `10/minute` | quotas, repeatable or `;`-separated (`"5/second; 100/minute"`); all must admit | exit 2: set `quotas` in the file |
//! | `--burst B` | the quota's limit | capacity of `token-bucket` and `leaky-bucket`; with a window strategy it warns and is ignored | exit 2: set `burst` in the file |
//! | `--key ip\|header:NAME\|global` | `ip` | what identifies a client | exit 2: set `key` in the file |
//! | `--on-missing-key reject\|global` | `reject` | a request without a key: 400, or the one shared global bucket; warns with `--key global` | the default of each limit's `on_missing_key` |
//! | `--trust-proxy CIDR` | none | repeatable; the `ip` key reads the forwarded header of peers in these ranges; warns with another key | the `ip` key part of every limit |
//! | `--forwarded-header xff\|forwarded\|x-real-ip` | `xff` | the header trusted proxies set; warns without `--trust-proxy` | the `ip` key part of every limit |
//! | `--store memory\|URL` | `memory` | `redis://H:P[/DB]`, `rediss://...`, `redis+cluster://H1:P1,H2:P2`, `rediss+cluster://...` (needs `--features redis`); `redis+sentinel://[user:pass@]H1:P1[,H2:P2]/SERVICE[/DB]` and `rediss+sentinel://...`; an unreachable Redis is not a start-up error (the server answers by `--fail-mode` and connects in the background) | every limit on that store: in memory one store per limit (with `--max-keys`), on Redis clones of one store, every URL form |
//! | `--fail-mode open\|closed\|local` | `open` | on a store failure: pass, 503, or a local limiter of the same rule (its limit divided by `--instances`); overload is never a failure (shed as 429); warns with the memory store, which never fails | every limit without its own `fail_mode`; `local` gives the Redis store a local limiter (its limit divided by `--instances`), which a limit's `fail_mode = "local"` needs (without it: exit 2 with `line L, column C`); a limit's `open` or `closed` still fails its own way |
//! | `--fail-closed` | off | alias of `--fail-mode closed`; with a contradicting `--fail-mode`, exit 2 | every limit |
//! | `--reset-format delta\|unix` | `delta` | `x-ratelimit-reset` as seconds from now or Unix time | every limit |
//! | `--max-keys N` | 8 x 10^6 (the store's default) | cap on the keys the memory store holds; warns with Redis | each limit's memory store; warns with Redis |
//! | `--store-timeout MS` | 50 | how long a Redis decision may take; warns with the memory store | the Redis store of every limit; warns with the memory store |
//! | `--redis-ca FILE` | none | PEM CA bundle for `rediss://`; exit 2 with a non-TLS store | the Redis store of every limit; exit 2 with a non-TLS store |
//! | `--redis-cert FILE`, `--redis-key FILE` | none | client certificate and key for `rediss://` (both or neither); exit 2 with a non-TLS store | the Redis store of every limit; exit 2 with a non-TLS store |
//! | `--instances N` | 1 | `--fail-mode local` divides the limit by N; warns without it | as without `--rules`: the local limiter of every limit |
//! | `--redis-lease [on\|off]` | `off` | quota leasing on the Redis store (bare flag = `on`) with the library's default lease sizes; a strategy leasing cannot bound (moving window, first-hit window, leaky bucket) exits 2 saying why; warns with the memory store | leasing on the store of every limit whose strategy leasing can bound; the others (moving window, first-hit window, leaky bucket, shaping queues) are checked by a Redis call each, named in one warning at start (a limit a reload adds is checked the same way, without a warning) |
//! | `--rules FILE` | none | limits from a TOML rules file (see `examples/rules.toml`), every path and method answered `ok`; a file that cannot be used exits 2 with `line L, column C` | — |
//! | `--reload-interval MS` | 1000 | how often the rules file is polled; 0 disables, below 50 exits 2; warns without `--rules` | the file is polled at this interval, compiled off the request path and swapped in |
//! | `--settle-header NAME` | none | the handler answers with header NAME set verbatim to the query parameter `used` (default: the estimate) and the limiter settles to it; a missing, negative, non-numeric or too large value leaves the estimate (warned once) | the handler sets header NAME to `used` on every path (no estimate: without `used` no header); the limits with `settle = "header:NAME"` settle to it, the others keep their estimate |
//! | `--cost N` | 1 | units each request costs (0 = a peek that never spends); the estimate with `--settle-header` (at least 1 there) | exit 2: set `cost` in the file |
//! | `--concurrency N` | none | cap on requests in flight per key (429 at once above it, `Retry-After: 1`); on Redis shared by the instances (leases: two Redis calls per request) | exit 2: set concurrency in the rules file (`concurrency = N` per limit; on Redis shared by the instances, as here) |
//! | `--delay-ms MS` | 0 | the `GET /` handler takes this long (at most 600000) | every path takes this long |
//! | `--window-offset OFFSET` | `+00:00` | UTC offset of clock-aligned windows (`+08:00`, `-5h`, `30m`, `5h30m`; under 24 h) for `fixed-window` and `sliding-window` (memory and Redis); warns with other strategies | exit 2: set `window_offset` in the file |
//! | `--queue MAX_WAIT_MS` | off | with `leaky-bucket`, a FIFO queue drained at the constant rate: each request leaves at its reserved departure, one interval after the previous, or gets 429 at once if that is more than MAX_WAIT_MS away (memory and Redis); warns with other strategies | exit 2: set `queue_ms` in the file |
//!
//! `GET /metrics` is served in every mode, never limited: the Prometheus text format of
//! the `tollgate_*` metrics (expose it on an internal port in production). With `--rules`, the file
//! is polled every `--reload-interval` ms and swapped in when its content changes; an invalid file
//! is logged and the old rules keep serving.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use clap::{CommandFactory, Parser, ValueEnum};
use http::request::Parts;
use tollgate::key::{
    Cidr, ForwardedHeader, ForwardedIp, GlobalKey, HeaderKey, KeyError, KeyExtractor, PeerIp,
};
use tollgate::layer::{
    ConcurrencyLayer, ConcurrencyLimit, FailurePolicy, Headers, KeyPolicy, Pacing, RateLimitLayer,
    ResetFormat, SettleFrom,
};
use tollgate::rules::{IpSource, MissingKey as FileMissingKey, Rules, RulesOptions};
#[cfg(feature = "redis")]
use tollgate::store::redis::Leasing;
use tollgate::store::{Store, StoreKey};
use tollgate::{Clock, RateLimiter, Strategy, WindowOffset};

/// The longest `--delay-ms` (10 minutes): a demo handler, not a way to park connections forever.
const MAX_DELAY_MS: u64 = 600_000;

/// The command line as typed. Each flag's value is checked by its parser here; what flags mean
/// together (defaults, contradictions, warnings, what is not available yet) is decided in
/// [`Settings::new`], one function per concern.
#[derive(Debug, Parser)]
#[command(
    name = "server",
    args_override_self = true,
    about = "tollgate's demo server: every request (404s too) is rate limited.",
    after_help = "Prints exactly one stdout line, `listening on http://ADDR`; logs go to stderr \
                  (RUST_LOG). Exit codes: 0 after SIGINT/SIGTERM, 2 for a usage or configuration \
                  error, 1 for a failure at run time. Per-limit flags (--strategy --quota --burst \
                  --key --cost --window-offset --queue --concurrency) cannot be combined with \
                  --rules. The redis store forms need a build with `--features redis`."
)]
struct Cli {
    /// Listen address; a host name is resolved (port 0 picks a free port) [default: 127.0.0.1:3000]
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port)]
    addr: Option<String>,

    /// fixed-window | fixed-window-first-hit | moving-window | sliding-window | token-bucket |
    /// leaky-bucket [default: sliding-window]
    #[arg(long, value_name = "NAME", value_parser = strategy)]
    strategy: Option<Strategy>,

    /// Quota, repeatable or `;`-separated, e.g. "5/second; 100/minute" [default: 10/minute]
    #[arg(long, value_name = "Q", value_parser = quota)]
    quota: Vec<String>,

    /// Burst (capacity) of token-bucket and leaky-bucket [default: the quota's limit]
    #[arg(long, value_name = "B")]
    burst: Option<NonZeroU32>,

    /// What identifies a client: ip | header:NAME | global [default: ip]
    #[arg(long, value_name = "KEY", value_parser = key_choice)]
    key: Option<KeyChoice>,

    /// A request without a key: reject (400 text/plain) or the shared global bucket [default: reject]
    #[arg(long, value_name = "WHAT", value_enum)]
    on_missing_key: Option<MissingKey>,

    /// Trusted proxy range, repeatable: the ip key then reads the forwarded header of these peers
    #[arg(long, value_name = "CIDR", value_parser = cidr)]
    trust_proxy: Vec<Cidr>,

    /// The header trusted proxies set: xff | forwarded | x-real-ip [default: xff]
    #[arg(long, value_name = "HEADER", value_parser = forwarded_header)]
    forwarded_header: Option<ForwardedHeader>,

    /// memory | redis://HOST:PORT[/DB] | rediss://... | redis+cluster://H1:P1,H2:P2 |
    /// rediss+cluster://... | redis+sentinel://[user:pass@]H1:P1[,H2:P2]/SERVICE[/DB] |
    /// rediss+sentinel://... (the redis forms need `--features redis`) [default: memory]
    #[arg(long, value_name = "STORE")]
    store: Option<String>,

    /// On a store failure: open (let requests through), closed (503) or local (a local limiter)
    /// [default: open]
    #[arg(long, value_name = "MODE", value_enum)]
    fail_mode: Option<FailMode>,

    /// Alias of --fail-mode closed
    #[arg(long)]
    fail_closed: bool,

    /// x-ratelimit-reset as seconds from now (delta) or Unix time (unix) [default: delta]
    #[arg(long, value_name = "FORMAT", value_enum)]
    reset_format: Option<ResetChoice>,

    /// Cap on the keys the memory store holds [default: 8000000, the store's own bound]
    #[arg(long, value_name = "N", value_parser = positive_usize)]
    max_keys: Option<usize>,

    /// How long a Redis decision may take, in milliseconds [default: 50]
    #[arg(long, value_name = "MS", value_parser = positive_ms)]
    store_timeout: Option<Duration>,

    /// PEM CA bundle for a rediss:// store
    #[arg(long, value_name = "FILE")]
    redis_ca: Option<PathBuf>,

    /// PEM client certificate for a rediss:// store (with --redis-key)
    #[arg(long, value_name = "FILE")]
    redis_cert: Option<PathBuf>,

    /// PEM private key of --redis-cert
    #[arg(long, value_name = "FILE")]
    redis_key: Option<PathBuf>,

    /// Instances sharing the limit: --fail-mode local divides the limit by N [default: 1]
    #[arg(long, value_name = "N")]
    instances: Option<NonZeroU32>,

    /// Quota leasing on the Redis store: on | off (the bare flag means on) [default: off]
    #[arg(long, value_name = "ON_OFF", value_enum, num_args = 0..=1, default_missing_value = "on")]
    redis_lease: Option<OnOff>,

    /// Limits from a TOML rules file (every path and method answered `ok`)
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,

    /// How often the rules file is polled, in ms; 0 disables reloading; at least 50 [default: 1000]
    #[arg(long, value_name = "MS", value_parser = reload_interval)]
    reload_interval: Option<u64>,

    /// Settle each request to the response header NAME (the handler sets it to `?used=`)
    #[arg(long, value_name = "NAME", value_parser = header_name)]
    settle_header: Option<http::HeaderName>,

    /// Units each request costs (0 = a peek that never spends) [default: 1]
    #[arg(long, value_name = "N")]
    cost: Option<u32>,

    /// Cap on requests in flight per key (429 at once above it)
    #[arg(long, value_name = "N")]
    concurrency: Option<NonZeroU32>,

    /// The `GET /` handler takes this long, in milliseconds (at most 600000) [default: 0]
    #[arg(long, value_name = "MS", value_parser = delay)]
    delay_ms: Option<Duration>,

    /// UTC offset of clock-aligned windows: [+-]HH:MM, or [+-]Nh, Nm, NhMm; under 24 h
    #[arg(long, value_name = "OFFSET", value_parser = window_offset, allow_hyphen_values = true)]
    window_offset: Option<WindowOffset>,

    /// With leaky-bucket, queue requests up to MAX_WAIT_MS instead of rejecting them
    #[arg(long, value_name = "MAX_WAIT_MS", value_parser = positive_ms)]
    queue: Option<Duration>,
}

/// `--key`.
#[derive(Clone, Debug)]
enum KeyChoice {
    Ip,
    Header(HeaderKey),
    Global,
}

/// `--on-missing-key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum MissingKey {
    Reject,
    Global,
}

/// `--fail-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FailMode {
    Open,
    Closed,
    Local,
}

/// `--reset-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ResetChoice {
    Delta,
    Unix,
}

/// `--redis-lease`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

// ---- value parsers: one per value form; their messages are what clap prints after the flag ----

fn host_port(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(s.to_owned()),
        _ => Err("expected HOST:PORT, e.g. 127.0.0.1:3000 or localhost:0".into()),
    }
}

fn strategy(s: &str) -> Result<Strategy, String> {
    s.parse().map_err(|e: tollgate::ParseError| e.to_string())
}

fn quota(s: &str) -> Result<String, String> {
    tollgate::parse_quotas(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

fn key_choice(s: &str) -> Result<KeyChoice, String> {
    match s {
        "ip" => Ok(KeyChoice::Ip),
        "global" => Ok(KeyChoice::Global),
        v => match v.strip_prefix("header:") {
            Some(name) if !name.is_empty() => HeaderKey::try_new(name)
                .map(KeyChoice::Header)
                .map_err(|e| e.to_string()),
            _ => Err("expected ip, header:NAME or global".into()),
        },
    }
}

fn cidr(s: &str) -> Result<Cidr, String> {
    s.parse().map_err(|e: tollgate::ParseError| e.to_string())
}

fn forwarded_header(s: &str) -> Result<ForwardedHeader, String> {
    s.parse()
}

fn positive_usize(s: &str) -> Result<usize, String> {
    s.parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "expected a positive integer".into())
}

fn positive_ms(s: &str) -> Result<Duration, String> {
    s.parse()
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| "expected milliseconds above 0".into())
}

fn reload_interval(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(ms) if ms == 0 || ms >= 50 => Ok(ms),
        Ok(_) => Err("below 50 ms (0 disables reloading)".into()),
        Err(_) => Err("expected milliseconds (0 disables reloading, else at least 50)".into()),
    }
}

fn header_name(s: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(s.as_bytes()).map_err(|_| "not a valid header name".into())
}

fn delay(s: &str) -> Result<Duration, String> {
    s.parse()
        .ok()
        .filter(|&ms| ms <= MAX_DELAY_MS)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("expected milliseconds from 0 to {MAX_DELAY_MS}"))
}

/// `--window-offset`: the library's notation ([`WindowOffset`]).
fn window_offset(s: &str) -> Result<WindowOffset, String> {
    s.parse().map_err(|e: tollgate::ParseError| e.to_string())
}

// ---- the meaning of the flags together ----

/// Where the limiter keeps its state.
#[derive(Clone, Debug, PartialEq, Eq)]
enum StoreChoice {
    Memory,
    Redis(RedisUrl),
}

/// A Redis URL and the facts about its form the flags depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RedisUrl {
    url: String,
    tls: bool,
    sentinel: bool,
}

impl RedisUrl {
    /// The forms `--store` accepts besides `memory` (the Redis store checks the rest).
    const SCHEMES: [&'static str; 6] = [
        "redis://",
        "rediss://",
        "redis+cluster://",
        "rediss+cluster://",
        "redis+sentinel://",
        "rediss+sentinel://",
    ];

    fn parse(url: &str) -> Option<Self> {
        let lower = url.to_ascii_lowercase();
        Self::SCHEMES
            .iter()
            .any(|s| lower.starts_with(s))
            .then(|| RedisUrl {
                url: url.to_owned(),
                tls: lower.starts_with("rediss"),
                sentinel: lower.contains("+sentinel://"),
            })
    }

    /// `text` with this URL's password (user info) replaced by `***`: no message prints it.
    fn scrub(&self, text: &str) -> String {
        let authority = self
            .url
            .split_once("://")
            .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
            .unwrap_or_default();
        let Some((userinfo, _)) = authority.rsplit_once('@') else {
            return text.to_owned();
        };
        let secret = userinfo.split_once(':').map_or(userinfo, |(_, pass)| pass);
        if secret.is_empty() {
            return text.to_owned();
        }
        text.replace(secret, "***")
    }
}

/// The server's configuration once every flag is checked: what `main` builds from.
#[derive(Clone, Debug)]
struct Settings {
    addr: String,
    strategy: Strategy,
    quotas: Vec<String>,
    /// `None` where the strategy has no burst.
    burst: Option<NonZeroU32>,
    key: KeyChoice,
    missing_global: bool,
    trusted: Vec<Cidr>,
    header: ForwardedHeader,
    store: StoreChoice,
    failure: FailurePolicy,
    reset: ResetFormat,
    max_keys: Option<usize>,
    /// Read by the Redis store only.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    store_timeout: Option<Duration>,
    /// `--redis-lease`: quota leasing on the Redis store, with the library's default sizes.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    lease: bool,
    /// `--fail-mode local` on Redis: the local limiter's share, `--instances` (default 1).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    local_instances: Option<u32>,
    /// `--redis-ca`, and `--redis-cert` with `--redis-key`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    redis_ca: Option<PathBuf>,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    redis_client_cert: Option<(PathBuf, PathBuf)>,
    cost: u32,
    delay: Duration,
    rules: Option<PathBuf>,
    reload_every: Option<Duration>,
    /// `--window-offset` (UTC unless set, and only with a clock-aligned strategy).
    window_offset: WindowOffset,
    /// `--queue MAX_WAIT_MS` (only with `leaky-bucket`).
    queue: Option<Duration>,
    settle_header: Option<http::HeaderName>,
    concurrency: Option<NonZeroU32>,
}

/// A configuration error (exit code 2), one line.
#[derive(Debug)]
struct Usage(String);

impl Settings {
    /// Checks the flags together. `Ok` carries the settings and the warnings to print once.
    fn new(cli: &Cli) -> Result<(Self, Vec<String>), Usage> {
        let store = match cli.store.as_deref() {
            None | Some("memory") => StoreChoice::Memory,
            Some(url) => StoreChoice::Redis(RedisUrl::parse(url).ok_or_else(|| {
                // Never echo the value: a mistyped URL may still carry a password.
                Usage(
                    "invalid --store: expected memory, redis://HOST:PORT, rediss://..., \
                     redis+cluster://H1:P1,H2:P2, rediss+cluster://..., redis+sentinel://... \
                     or rediss+sentinel://..."
                        .into(),
                )
            })?),
        };
        let fail_mode = fail_mode(cli)?;
        rules_exclusions(cli)?;
        tls_files(cli, &store)?;
        let strategy = cli.strategy.unwrap_or(Strategy::SlidingWindow);
        let warnings = warnings(cli, &store, fail_mode, strategy);
        not_available_yet(cli, &store, fail_mode)?;
        let settings = Settings {
            addr: cli
                .addr
                .clone()
                .unwrap_or_else(|| "127.0.0.1:3000".to_owned()),
            strategy,
            quotas: if cli.quota.is_empty() {
                vec!["10/minute".to_owned()]
            } else {
                cli.quota.clone()
            },
            burst: cli.burst.filter(|_| strategy.is_bucket()),
            key: cli.key.clone().unwrap_or(KeyChoice::Ip),
            missing_global: cli.on_missing_key == Some(MissingKey::Global),
            trusted: cli.trust_proxy.clone(),
            header: cli
                .forwarded_header
                .unwrap_or(ForwardedHeader::XForwardedFor),
            failure: match fail_mode {
                FailMode::Closed => FailurePolicy::FailClosed,
                // `local`: the Redis store decides with its local limiter during an outage, so the
                // layer sees no failure; what still fails (none expected) is let through.
                FailMode::Open | FailMode::Local => FailurePolicy::FailOpen,
            },
            lease: cli.redis_lease == Some(OnOff::On),
            local_instances: (fail_mode == FailMode::Local)
                .then(|| cli.instances.map_or(1, NonZeroU32::get)),
            redis_ca: cli.redis_ca.clone(),
            redis_client_cert: cli.redis_cert.clone().zip(cli.redis_key.clone()),
            reset: match cli.reset_format {
                Some(ResetChoice::Unix) => ResetFormat::Unix,
                Some(ResetChoice::Delta) | None => ResetFormat::Delta,
            },
            max_keys: cli.max_keys.filter(|_| store == StoreChoice::Memory),
            store_timeout: cli.store_timeout.filter(|_| store != StoreChoice::Memory),
            store,
            cost: cli.cost.unwrap_or(1),
            delay: cli.delay_ms.unwrap_or(Duration::ZERO),
            rules: cli.rules.clone(),
            reload_every: match cli.reload_interval.unwrap_or(1000) {
                0 => None,
                ms => Some(Duration::from_millis(ms)),
            },
            window_offset: cli
                .window_offset
                .filter(|_| matches!(strategy, Strategy::FixedWindow | Strategy::SlidingWindow))
                .unwrap_or_default(),
            queue: cli.queue.filter(|_| strategy == Strategy::LeakyBucket),
            settle_header: cli.settle_header.clone(),
            concurrency: cli.concurrency,
        };
        Ok((settings, warnings))
    }
}

/// `--fail-mode` and its alias `--fail-closed`, which must agree.
fn fail_mode(cli: &Cli) -> Result<FailMode, Usage> {
    match (cli.fail_mode, cli.fail_closed) {
        (Some(mode), true) if mode != FailMode::Closed => Err(Usage(format!(
            "--fail-closed contradicts --fail-mode {}",
            mode.to_possible_value()
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default()
        ))),
        (Some(mode), _) => Ok(mode),
        (None, true) => Ok(FailMode::Closed),
        (None, false) => Ok(FailMode::Open),
    }
}

/// With `--rules`, the per-limit flags belong in the file; the file must be readable.
fn rules_exclusions(cli: &Cli) -> Result<(), Usage> {
    let Some(file) = &cli.rules else {
        return Ok(());
    };
    let per_limit = [
        ("--strategy", cli.strategy.is_some()),
        ("--quota", !cli.quota.is_empty()),
        ("--burst", cli.burst.is_some()),
        ("--key", cli.key.is_some()),
        ("--cost", cli.cost.is_some()),
        ("--window-offset", cli.window_offset.is_some()),
        ("--queue", cli.queue.is_some()),
    ];
    if let Some((flag, _)) = per_limit.iter().find(|(_, given)| *given) {
        return Err(Usage(format!(
            "{flag} is a per-limit flag: set it in the rules file (--rules {})",
            file.display()
        )));
    }
    if cli.concurrency.is_some() {
        return Err(Usage(
            "--concurrency cannot apply with --rules: set concurrency in the rules file \
             (`concurrency = N` on each limit to cap)"
                .into(),
        ));
    }
    readable("--rules", file)
}

/// `--redis-ca`, `--redis-cert`, `--redis-key`: a TLS store, the certificate with its key, files
/// that can be read.
fn tls_files(cli: &Cli, store: &StoreChoice) -> Result<(), Usage> {
    let given = [
        ("--redis-ca", &cli.redis_ca),
        ("--redis-cert", &cli.redis_cert),
        ("--redis-key", &cli.redis_key),
    ];
    let tls = matches!(store, StoreChoice::Redis(u) if u.tls);
    for (flag, file) in given {
        if let Some(file) = file {
            if !tls {
                return Err(Usage(format!(
                    "{flag} needs a TLS store (--store rediss://..., rediss+cluster://... or \
                     rediss+sentinel://...)"
                )));
            }
            readable(flag, file)?;
        }
    }
    match (&cli.redis_cert, &cli.redis_key) {
        (Some(_), None) => Err(Usage("--redis-cert needs --redis-key".into())),
        (None, Some(_)) => Err(Usage("--redis-key needs --redis-cert".into())),
        _ => Ok(()),
    }
}

/// `file` is a regular file this process can open.
fn readable(flag: &str, file: &Path) -> Result<(), Usage> {
    let fail = |e: &dyn std::fmt::Display| Usage(format!("{flag} {}: {e}", file.display()));
    match std::fs::metadata(file) {
        Ok(m) if !m.is_file() => Err(fail(&"not a regular file")),
        Ok(_) => std::fs::File::open(file).map(drop).map_err(|e| fail(&e)),
        Err(e) => Err(fail(&e)),
    }
}

/// Flags that have no effect in the chosen combination: one warning each.
fn warnings(cli: &Cli, store: &StoreChoice, fail: FailMode, strategy: Strategy) -> Vec<String> {
    let memory = *store == StoreChoice::Memory;
    let aligned = matches!(strategy, Strategy::FixedWindow | Strategy::SlidingWindow);
    let name = strategy.name();
    let mut w = Vec::new();
    let mut warn = |on: bool, text: String| {
        if on {
            w.push(text);
        }
    };
    warn(
        cli.burst.is_some() && !strategy.is_bucket(),
        format!(
            "--burst has no effect with --strategy {name} (only the bucket strategies have one)"
        ),
    );
    warn(
        cli.burst.is_some() && cli.queue.is_some() && strategy == Strategy::LeakyBucket,
        "--burst has no effect with --queue (a queue has no initial burst)".into(),
    );
    warn(
        cli.max_keys.is_some() && !memory,
        "--max-keys has no effect with a Redis store (it caps the memory store)".into(),
    );
    warn(
        cli.store_timeout.is_some() && memory,
        "--store-timeout has no effect with the memory store (it bounds Redis calls)".into(),
    );
    warn(
        memory && (cli.fail_mode.is_some() || cli.fail_closed),
        format!(
            "--{} has no effect with the memory store (it never fails)",
            if cli.fail_mode.is_some() {
                "fail-mode"
            } else {
                "fail-closed"
            }
        ),
    );
    warn(
        cli.instances.is_some() && (fail != FailMode::Local || memory),
        "--instances has no effect without --fail-mode local and a Redis store".into(),
    );
    warn(
        cli.redis_lease == Some(OnOff::On) && memory,
        "--redis-lease has no effect with the memory store".into(),
    );
    warn(
        cli.reload_interval.is_some() && cli.rules.is_none(),
        "--reload-interval has no effect without --rules".into(),
    );
    warn(
        cli.window_offset.is_some() && !aligned,
        format!("--window-offset has no effect with --strategy {name} (no clock-aligned windows)"),
    );
    warn(
        cli.queue.is_some() && strategy != Strategy::LeakyBucket,
        format!("--queue has no effect with --strategy {name} (it needs leaky-bucket)"),
    );
    warn(
        cli.forwarded_header.is_some() && cli.trust_proxy.is_empty(),
        "--forwarded-header has no effect without --trust-proxy (no peer is trusted)".into(),
    );
    warn(
        !cli.trust_proxy.is_empty() && !matches!(cli.key, None | Some(KeyChoice::Ip)),
        "--trust-proxy has no effect without --key ip".into(),
    );
    warn(
        cli.on_missing_key.is_some() && matches!(cli.key, Some(KeyChoice::Global)),
        "--on-missing-key has no effect with --key global (every request has the key)".into(),
    );
    w
}

/// Flags whose behaviour the library does not offer yet, where they would take effect: one line
/// each. Giving a flag its behaviour = deleting its line here and wiring it in `app` or `main`.
fn not_available_yet(_cli: &Cli, _store: &StoreChoice, _fail: FailMode) -> Result<(), Usage> {
    let pending: [(&str, bool); 0] = [];
    match pending.iter().find(|(_, on)| *on) {
        Some((flag, _)) => Err(Usage(format!(
            "{flag} is not available yet in this version of tollgate"
        ))),
        None => Ok(()),
    }
}

// ---- the service ----

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

/// The app: `GET /` answers `ok` (after `--delay-ms`); everything, 404s included, goes through the
/// limiter (in a shaping queue with `--queue`). A queue the library refuses is a usage error.
fn app<St: Store<Vec<u8>>, C: Clock>(
    limiter: RateLimiter<Vec<u8>, St, C>,
    inflight: Option<ConcurrencyLimit<Vec<u8>>>,
    o: &Settings,
) -> Result<Router, String> {
    let key = match &o.key {
        KeyChoice::Ip if o.trusted.is_empty() => DemoKey::Peer(PeerIp::default()),
        KeyChoice::Ip => {
            DemoKey::Forwarded(ForwardedIp::from_cidrs(o.trusted.iter().copied()).header(o.header))
        }
        KeyChoice::Header(h) => DemoKey::Header(h.clone()),
        KeyChoice::Global => DemoKey::Global,
    };
    let cost = o.cost;
    let concurrency = inflight.map(|limit| ConcurrencyLayer::new(limit, key.clone()));
    let mut layer = RateLimitLayer::new(limiter, key)
        .headers(Headers::new().reset_format(o.reset))
        .failure_policy(o.failure)
        .cost(move |_: &Parts| cost);
    if o.missing_global {
        layer = layer.keys(KeyPolicy::default().fallback(global_key()));
    }
    if let Some(max_wait) = o.queue {
        layer = layer
            .pacing(Pacing::Queue(max_wait))
            .map_err(|e| format!("--queue: {e}"))?;
    }
    if let Some(name) = &o.settle_header {
        layer = layer.settle_from(SettleFrom::header(name.clone()));
    }
    let _ = PUBLISH.set(Box::new(tollgate::metrics::publish_stats));
    let delay = o.delay;
    let settle = o
        .settle_header
        .clone()
        .map(|name| (name, Some(cost.max(1))));
    let router = Router::new().route("/", get(move |uri: http::Uri| handler(uri, delay, settle)));
    // The rate limit first, then the cap on requests in flight (inside it: a request refused by
    // the rate limit never takes a slot).
    let router = match concurrency {
        Some(concurrency) => router.layer(concurrency).layer(layer),
        None => router.layer(layer),
    };
    Ok(router.route("/metrics", get(metrics)))
}

/// The demo's handler: `ok` after `delay`; with `--settle-header NAME`, the header NAME set to the
/// query parameter `used` verbatim (the limiter judges it), else to the estimate if there is one
/// (a rules file's limits each have their own: no header then).
async fn handler(
    uri: http::Uri,
    delay: Duration,
    settle: Option<(http::HeaderName, Option<u32>)>,
) -> axum::response::Response {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut res = "ok".into_response();
    if let Some((name, estimate)) = settle {
        let used = uri
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("used=")))
            .map(str::to_owned)
            .or_else(|| estimate.map(|e| e.to_string()));
        if let Some(v) = used.and_then(|u| http::HeaderValue::from_str(&u).ok()) {
            res.headers_mut().insert(name, v);
        }
    }
    res
}

/// The Prometheus recorder's handle, installed once in `main`.
static METRICS: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
    std::sync::OnceLock::new();

/// Publishes the figures the stores count (keys held, evictions, the circuit breaker) before a
/// scrape.
type Publish = Box<dyn Fn() + Send + Sync>;
static PUBLISH: std::sync::OnceLock<Publish> = std::sync::OnceLock::new();

/// `GET /metrics`: the Prometheus text format, never limited (routed outside the layer).
async fn metrics() -> ([(http::HeaderName, &'static str); 1], String) {
    if let Some(publish) = PUBLISH.get() {
        publish();
    }
    let body = METRICS.get().map(|h| h.render()).unwrap_or_default();
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        body,
    )
}

/// The app of `--rules`: every path and method answers `ok` (after `--delay-ms`, with
/// `--settle-header`'s header), limited by the file; `GET /metrics` is outside the limits.
fn rules_app<St: Store<Vec<u8>>>(rules: &Rules<St>, o: &Settings) -> Router {
    let delay = o.delay;
    let settle = o.settle_header.clone().map(|name| (name, None));
    Router::new()
        .fallback(move |uri: http::Uri| handler(uri, delay, settle))
        .layer(rules.layer())
        .route("/metrics", get(metrics))
}

/// The process-wide flags as the rules file's options.
fn rules_options(o: &Settings) -> RulesOptions {
    RulesOptions {
        ip: if o.trusted.is_empty() {
            IpSource::Peer(PeerIp::default())
        } else {
            IpSource::Forwarded(ForwardedIp::from_cidrs(o.trusted.iter().copied()).header(o.header))
        },
        on_missing_key: if o.missing_global {
            FileMissingKey::Global
        } else {
            FileMissingKey::Reject
        },
        failure: o.failure,
        reset: o.reset,
        ..RulesOptions::default()
    }
}

/// Serves the rules file `path` with `rules` built, reloading it every `--reload-interval`.
async fn serve_rules<St: Store<Vec<u8>>>(rules: Rules<St>, path: &Path, o: &Settings) -> ExitCode {
    if let Some(every) = o.reload_every {
        rules.watch(path, every);
    }
    let published = rules.clone();
    let _ = PUBLISH.set(Box::new(move || published.publish_stats()));
    let app = rules_app(&rules, o);
    serve_app(app, o).await
}

/// The error of a rules file that cannot be used (exit 2).
fn rules_error(path: &Path, e: &dyn std::fmt::Display) -> ExitCode {
    usage_error(&format!("--rules {}: {e}", path.display()))
}

/// Binds the first of `--addr`'s addresses that accepts (exit 2 if the name does not resolve,
/// 1 if no address can be bound).
async fn bind(addr: &str) -> Result<tokio::net::TcpListener, ExitCode> {
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host(addr).await {
        Ok(a) => a.collect(),
        Err(e) => return Err(usage_error(&format!("--addr {addr}: {e}"))),
    };
    if addrs.is_empty() {
        return Err(usage_error(&format!("--addr {addr}: no address found")));
    }
    let mut last = None;
    for a in addrs {
        match tokio::net::TcpListener::bind(a).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(format!("{a}: {e}")),
        }
    }
    eprintln!(
        "server: cannot listen on {addr}: {}",
        last.unwrap_or_default()
    );
    Err(ExitCode::FAILURE)
}

/// Serves until SIGINT or SIGTERM. Generic over the store, so any `Store<Vec<u8>>` plugs in.
async fn serve<St: Store<Vec<u8>>, C: Clock>(
    limiter: RateLimiter<Vec<u8>, St, C>,
    inflight: Option<ConcurrencyLimit<Vec<u8>>>,
    o: &Settings,
) -> ExitCode {
    let app = match app(limiter, inflight, o) {
        Ok(app) => app,
        Err(message) => return usage_error(&message),
    };
    serve_app(app, o).await
}

/// Serves `app` until SIGINT or SIGTERM.
async fn serve_app(app: Router, o: &Settings) -> ExitCode {
    let listener = match bind(&o.addr).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("server: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = shutdown_signal();
    println!("listening on http://{addr}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, before the
/// `listening` line is printed, so a signal sent right after that line stops the server cleanly.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let int = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        async move {
            match (int, term) {
                (Ok(mut int), Ok(mut term)) => {
                    tokio::select! {
                        _ = int.recv() => {},
                        _ = term.recv() => {},
                    }
                }
                // No handler could be installed: run until killed.
                _ => std::future::pending::<()>().await,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Prints a usage or configuration error (one line) and the usage line; exit code 2.
fn usage_error(message: &str) -> ExitCode {
    let usage = Cli::command().render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage: ");
    eprintln!("server: {message}\nusage: {usage} (see `server --help` for every flag)");
    ExitCode::from(2)
}

/// clap's own outcome: `--help` on stdout (exit 0), anything else a usage error.
fn clap_exit(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            print!("{}", e.render());
            ExitCode::SUCCESS
        }
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or_default();
            usage_error(first.strip_prefix("error: ").unwrap_or(first))
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(e),
    };
    let (o, warnings) = match Settings::new(&cli) {
        Ok(s) => s,
        Err(Usage(message)) => return usage_error(&message),
    };
    for w in warnings {
        eprintln!("server: warning: {w}");
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().set_buckets_for_metric(
        metrics_exporter_prometheus::Matcher::Full("tollgate_store_latency_seconds".into()),
        &tollgate::rules::STORE_LATENCY_BUCKETS,
    );
    match recorder.and_then(|r| r.install_recorder()) {
        Ok(handle) => {
            let _ = METRICS.set(handle);
        }
        Err(e) => eprintln!("server: warning: no /metrics: {e}"),
    }
    if let Some(path) = o.rules.clone() {
        return match &o.store {
            StoreChoice::Memory => {
                let mut store = tollgate::store::MemoryStoreBuilder::default();
                if let Some(n) = o.max_keys {
                    store = store.max_keys(n);
                }
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) => return rules_error(&path, &e),
                };
                match Rules::memory_with(&text, rules_options(&o), store) {
                    Ok(rules) => serve_rules(rules, &path, &o).await,
                    Err(e) => rules_error(&path, &e),
                }
            }
            StoreChoice::Redis(url) => serve_redis_rules(url, &path, &o).await,
        };
    }
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
    builder = builder.window_offset(o.window_offset);
    match &o.store {
        StoreChoice::Memory => {
            let builder = match o.max_keys {
                Some(n) => builder.max_keys(n),
                None => builder,
            };
            match builder.build() {
                Ok(limiter) => {
                    let inflight = o.concurrency.map(ConcurrencyLimit::memory);
                    serve(limiter, inflight, &o).await
                }
                Err(e) => usage_error(&e.to_string()),
            }
        }
        StoreChoice::Redis(url) => serve_redis(builder, url, &o).await,
    }
}

/// The Redis store every flag asks for (`--store-timeout`, `--fail-mode local --instances N`,
/// `--redis-lease`, `--redis-ca`, `--redis-cert`/`--redis-key`), for one limiter or a rules
/// file alike (`rules`: leasing skips the limits it cannot bound instead of refusing them). A
/// store the library refuses as configured is a configuration error (exit 2); one that cannot be
/// reached or refuses the connection is a run-time failure (exit 1).
#[cfg(feature = "redis")]
async fn redis_store(
    url: &RedisUrl,
    o: &Settings,
    rules: bool,
) -> Result<tollgate::store::redis::RedisStore, ExitCode> {
    let store = tollgate::store::redis::RedisStore::builder(url.url.as_str());
    let store = match o.store_timeout {
        Some(timeout) => store.timeout(timeout),
        None => store,
    };
    let store = match o.local_instances {
        Some(n) => store.local_fallback(n),
        None => store,
    };
    let store = match (o.lease, rules) {
        (true, false) => store.leases(Leasing::default()),
        (true, true) => store.leases(Leasing::default().skip_unleasable()),
        (false, _) => store,
    };
    let store = match &o.redis_ca {
        Some(ca) => store.tls_ca_file(ca),
        None => store,
    };
    let store = match &o.redis_client_cert {
        Some((cert, key)) => store.tls_client_cert(cert, key),
        None => store,
    };
    match store.build().await {
        Ok(store) => Ok(store),
        Err(tollgate::BuildError::Config(e)) => {
            Err(usage_error(&url.scrub(&format!("--store: {e}"))))
        }
        Err(e) => {
            eprintln!(
                "server: cannot start the Redis store at {}: {}",
                url.scrub(&url.url),
                url.scrub(&e.to_string())
            );
            Err(ExitCode::FAILURE)
        }
    }
}

/// `--store redis://...` or `redis+cluster://...`: the limiter on the Redis store.
#[cfg(feature = "redis")]
async fn serve_redis(
    builder: tollgate::Builder<Vec<u8>>,
    url: &RedisUrl,
    o: &Settings,
) -> ExitCode {
    let store = match redis_store(url, o, false).await {
        Ok(store) => store,
        Err(exit) => return exit,
    };
    match builder.store(store.clone()).build() {
        Ok(limiter) => {
            let inflight = match o
                .concurrency
                .map(|cap| ConcurrencyLimit::redis(store, "default", cap))
            {
                Some(Ok(limit)) => Some(limit),
                Some(Err(e)) => return usage_error(&e.to_string()),
                None => None,
            };
            serve(limiter, inflight, o).await
        }
        Err(e) => usage_error(&e.to_string()),
    }
}

/// `--rules` on a Redis store: every limit on a clone of one store, built from the same flags as
/// a single limiter's. With `--redis-lease`, the limits leasing cannot bound are checked unleased,
/// named in one warning.
#[cfg(feature = "redis")]
async fn serve_redis_rules(url: &RedisUrl, path: &Path, o: &Settings) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return rules_error(path, &e),
    };
    let store = match redis_store(url, o, true).await {
        Ok(store) => store,
        Err(exit) => return exit,
    };
    match Rules::new(&text, rules_options(o), move || store.clone()) {
        Ok(rules) => {
            if o.lease {
                warn_unleased(&rules);
            }
            serve_rules(rules, path, o).await
        }
        Err(e) => rules_error(path, &e),
    }
}

/// Names the rules file's limits `--redis-lease` does not lease (their strategy leasing cannot
/// bound), in one warning.
#[cfg(feature = "redis")]
fn warn_unleased<St: tollgate::store::Store<Vec<u8>>>(rules: &Rules<St>) {
    let unleased: Vec<String> = rules
        .names()
        .into_iter()
        .filter_map(|name| {
            let strategy = rules.rule(&name)?.strategy();
            Leasing::unleasable(strategy).map(|_| format!("{name:?} ({strategy})"))
        })
        .collect();
    if !unleased.is_empty() {
        eprintln!(
            "server: warning: --redis-lease leases no quota of {}: leasing cannot bound their \
             strategy, so each of their checks is a Redis call (a limit added by a reload is \
             checked the same way, without a warning)",
            unleased.join(", ")
        );
    }
}

/// Without the `redis` feature there is no Redis store: say so and exit 2.
#[cfg(not(feature = "redis"))]
async fn serve_redis_rules(url: &RedisUrl, _path: &Path, _o: &Settings) -> ExitCode {
    usage_error(&format!(
        "--store {}: this build has no Redis store (build with `--features redis` or `--all-features`)",
        url.scrub(&url.url)
    ))
}

/// Without the `redis` feature there is no Redis store: say so and exit 2.
#[cfg(not(feature = "redis"))]
async fn serve_redis(
    _builder: tollgate::Builder<Vec<u8>>,
    url: &RedisUrl,
    _o: &Settings,
) -> ExitCode {
    usage_error(&format!(
        "--store {}: this build has no Redis store (build with `--features redis` or `--all-features`)",
        url.scrub(&url.url)
    ))
}
