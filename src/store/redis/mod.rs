//! The Redis store (feature `redis`): one limit shared by every instance of a service.
//!
//! [`RedisStore`] runs each decision as one Lua script call (`EVALSHA`), atomic across all quotas of
//! a rule, with the Redis server's `TIME` in microseconds, so app instances with skewed clocks agree.
//! It works on a single node (`redis://host:port`) and on Redis Cluster
//! (`redis+cluster://host1:port1,host2:port2`).
//!
//! - **Arithmetic**: the scripts implement exactly the in-memory strategies, in microseconds; every
//!   number stays an integer below 2^53 (Lua numbers are doubles).
//! - **Keys**: `<prefix>{<tag>}:<strategy>`, where the tag encodes the user key injectively (hex of
//!   its length-prefixed bytes, or a SHA-256 when long). All Redis keys of one logical key share the
//!   tag, hence one Cluster slot. Every key has a TTL a second past its strategy's horizon.
//! - **Failures**: each call has a timeout (50 ms by default) and is never replayed once sent: a
//!   timeout or a lost reply is an error, as Redis may already have counted the request. Only an
//!   explicit `NOSCRIPT` reply (a flushed or restarted server, a fresh Cluster node) makes the store
//!   send the script body with `EVAL`, once. While disconnected, calls fail within the timeout; the
//!   connection is re-established in the background, so decisions resume without a restart.
//! - **Limits**: state lives in Redis memory: a restart without persistence forgets it (at most `N`
//!   more per key per restart), and an `allkeys-*` eviction policy can silently reset keys (the store
//!   warns at start-up). On Cluster, the client follows `MOVED`/`ASK` redirections and may resend a
//!   call after a connection reset, a limitation of the `redis` crate's Cluster client.
//!
//! ```no_run
//! use tollgate::{RateLimiter, Strategy};
//! use tollgate::store::redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::SlidingWindow)
//!     .quotas("100/minute")?
//!     .store(store)
//!     .build()?;
//! let decision = limiter.check(&"203.0.113.9".to_string(), 1).await?;
//! println!("allowed: {}", decision.is_allowed());
//! # Ok(())
//! # }
//! ```

mod cache;
mod keys;
mod leases;
mod scripts;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, RedisError, Value};

use self::cache::BlockCache;
use self::scripts::Family;
use super::memory::to_decision;
use super::{Answer, LimiterNames, Scope, Store, StoreKey};
use crate::decision::{Decision, Outcome};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::rule::{Rule, horizon_ticks};
use crate::stats::{Counter, Stats};
use crate::strategy::{self, Op, Params, Strategy, Verdict};

/// Nanoseconds per tick of the Redis store (one microsecond).
const TICK_NANOS: u64 = 1000;
/// Every number a script sees must stay below this (Lua numbers are doubles).
const MAX_SAFE: u64 = 1 << 53;
/// Slack added to every TTL past the strategy's horizon, in milliseconds.
const TTL_SLACK_MS: u64 = 1000;
/// How often the same failure may be logged.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// The answer of [`RedisStore`]: a boxed future (one allocation per call, next to a network round
/// trip).
pub type RedisFuture = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

/// A [`Store`] on Redis, single node or Cluster. Cheap to clone: clones share the connection,
/// counters and cache.
///
/// Build it with [`RedisStore::connect`] or [`RedisStore::builder`], then pass it to
/// [`Builder::store`](crate::Builder::store).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    prefix: String,
    timeout: Duration,
    client_time: bool,
    cache: Option<BlockCache>,
    /// EVALSHA hashes and sources, indexed like [`Family::ALL`].
    scripts: [(String, Arc<str>); 4],
    allowed: Counter,
    rejected: Counter,
    errors: Counter,
    last_warn: crate::throttle::Throttle,
    names: LimiterNames,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.inner.conn {
            Conn::Single(_) => "single",
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("mode", &kind)
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field(
                "block_cache",
                &self.inner.cache.as_ref().map(BlockCache::cap),
            )
            .finish_non_exhaustive()
    }
}

/// Options of a [`RedisStore`]; [`build`](Self::build) connects.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::redis::RedisStore;
///
/// let builder = RedisStore::builder("redis+cluster://10.0.0.1:7000,10.0.0.2:7000")
///     .prefix("api:")
///     .timeout(Duration::from_millis(20))
///     .block_cache(10_000);
/// # let _ = builder;
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    block_cache: Option<usize>,
    client_time: bool,
}

impl RedisStoreBuilder {
    /// The start of every Redis key (default `"tollgate:"`): keeps several limiters apart. At most
    /// 64 bytes, without braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest a call may take, from sending to decoding the reply (default 50 ms). A call that
    /// times out is an error ([`StoreErrorKind::Timeout`]) and is never retried: Redis may already
    /// have counted it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest a connection attempt may take (default 1 s), at start-up and on reconnects.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Remembers up to `capacity` keys that Redis reported blocked, and answers them locally until the
    /// reported wait is over (measured on this process's monotonic clock), so a hot blocked key stops
    /// costing a round trip. Off by default.
    pub fn block_cache(mut self, capacity: usize) -> Self {
        self.block_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// Test hook: send the limiter's clock to the scripts instead of using the server's `TIME`.
    /// Production code never needs this.
    #[doc(hidden)]
    pub fn use_client_time(mut self, yes: bool) -> Self {
        self.client_time = yes;
        self
    }

    /// Connects, loads the scripts and checks the eviction policy.
    ///
    /// # Errors
    /// [`StoreErrorKind::Other`] for a bad URL or prefix, or `rediss://` (TLS is not compiled in);
    /// [`StoreErrorKind::Connection`] when the server cannot be reached.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        keys::check_prefix(&self.prefix).map_err(|m| StoreError::new(StoreErrorKind::Other, m))?;
        let conn = connect(&self.url, self.timeout, self.connect_timeout).await?;
        let scripts = Family::ALL.map(|f| {
            let src = f.source();
            let sha = ::redis::Script::new(&src).get_hash().to_owned();
            (sha, Arc::<str>::from(src))
        });
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
                timeout: self.timeout,
                client_time: self.client_time,
                cache: self.block_cache.map(BlockCache::new),
                scripts,
                allowed: Counter::default(),
                rejected: Counter::default(),
                errors: Counter::default(),
                last_warn: crate::throttle::Throttle::default(),
                names: LimiterNames::default(),
            }),
        };
        store.prepare(self.connect_timeout).await?;
        Ok(store)
    }
}

/// `url` with any password replaced by `***`, for error messages and logs: a connection URL may
/// carry credentials (`redis://:secret@host`, `redis://user:secret@host`), which must never reach a
/// log line.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = url.get(scheme_end..).unwrap_or_default();
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest.get(..authority_end).unwrap_or_default();
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = authority.get(..at).unwrap_or_default();
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!(
                "{}{user}:***@{}",
                url.get(..scheme_end).unwrap_or_default(),
                rest.get(at + 1..).unwrap_or_default()
            )
        }
        None => url.to_owned(),
    }
}

async fn connect(
    url: &str,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<Conn, StoreError> {
    let other = |m: String| StoreError::new(StoreErrorKind::Other, m);
    let shown = redact(url);
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("rediss") {
        return Err(other(format!(
            "{shown}: TLS (rediss://) is not compiled into this build; use redis:// behind a TLS \
             tunnel, or enable a TLS feature of the redis crate"
        )));
    }
    const CLUSTER: &str = "redis+cluster://";
    if let Some(rest) = lower
        .starts_with(CLUSTER)
        .then(|| url.get(CLUSTER.len()..).unwrap_or_default())
    {
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((a, h)) => (format!("{a}@"), h),
            None => (String::new(), rest),
        };
        let nodes: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{auth}{h}"))
            .collect();
        if nodes.is_empty() {
            return Err(other(format!("{shown}: no Cluster node given")));
        }
        let client = ClusterClient::builder(nodes)
            .retries(3)
            .min_retry_wait(5)
            .max_retry_wait(100)
            .connection_timeout(connect_timeout)
            .response_timeout(timeout)
            .build()
            .map_err(|e| other(format!("{shown}: {e}")))?;
        let c = tokio::time::timeout(connect_timeout, client.get_async_connection())
            .await
            .map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Connection,
                    format!("{shown}: no Cluster node answered within {connect_timeout:?}"),
                )
            })?
            .map_err(|e| map_error(&e))?;
        return Ok(Conn::Cluster(c));
    }
    if !lower.starts_with("redis://") && !lower.starts_with("redis+unix://") {
        return Err(other(format!(
            "{shown}: expected redis://host:port or redis+cluster://host1:port1,host2:port2"
        )));
    }
    let client = ::redis::Client::open(url).map_err(|e| other(format!("{shown}: {e}")))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(connect_timeout)
        .set_response_timeout(timeout)
        .set_factor(2)
        .set_max_delay(200)
        .set_number_of_retries(8);
    let c = tokio::time::timeout(
        connect_timeout,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| {
        StoreError::new(
            StoreErrorKind::Connection,
            format!("{shown}: no answer (or authentication refused) within {connect_timeout:?}"),
        )
    })?
    .map_err(|e| map_error(&e))?;
    Ok(Conn::Single(c))
}

impl RedisStore {
    /// Connects to `url` with the default options: `redis://host:port[/db]` for one node,
    /// `redis+cluster://host1:port1,host2:port2` for a Cluster (any reachable nodes as seeds).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate::StoreError> {
    /// let single = tollgate::store::redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let cluster = tollgate::store::redis::RedisStore::connect(
    ///     "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
    /// )
    /// .await?;
    /// # let _ = (single, cluster);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::build`].
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        Self::builder(url).build().await
    }

    /// Options for a store on `url` (see [`connect`](Self::connect) for the forms).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: "tollgate:".to_owned(),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            block_cache: None,
            client_time: false,
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The Redis keys holding `key`'s state in `scope` (a limiter's name and rule; for inspection
    /// and tests; the moving window keeps one list per quota). A key's states in different scopes
    /// are kept apart.
    pub fn redis_keys<K: StoreKey>(&self, key: &K, scope: Scope<'_>) -> Vec<String> {
        let base = keys::base_key(&self.inner.prefix, key);
        let rule = scope.rule();
        redis_keys(&base, rule.strategy(), scope.tag(), rule.quotas().len())
    }

    /// How many blocked keys the local cache holds now (0 without a cache).
    pub fn cached_keys(&self) -> usize {
        self.inner.cache.as_ref().map_or(0, BlockCache::len)
    }

    /// The Lua source of the script `strategy` runs (for benchmarks and inspection; see the
    /// calling convention in the crate's `store::redis` sources).
    #[doc(hidden)]
    pub fn script_source(strategy: Strategy) -> String {
        family(strategy).source()
    }

    /// Loads the scripts on every master and warns about an eviction policy that can drop keys.
    async fn prepare(&self, within: Duration) -> Result<(), StoreError> {
        let work = async {
            for (_, src) in &self.inner.scripts {
                let mut load = ::redis::cmd("SCRIPT");
                load.arg("LOAD").arg(&**src);
                self.inner.conn.query(&load).await?;
            }
            let mut get = ::redis::cmd("CONFIG");
            get.arg("GET").arg("maxmemory-policy");
            Ok::<_, RedisError>(self.inner.conn.query(&get).await.ok())
        };
        let policy = tokio::time::timeout(within, work)
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Timeout, "loading the scripts timed out"))?
            .map_err(|e| map_error(&e))?;
        if let Some(v) = policy {
            let mut found = Vec::new();
            strings(&v, &mut found);
            if let Some(p) = found.iter().find(|s| s.starts_with("allkeys-")) {
                tracing::warn!(
                    policy = %p,
                    "Redis maxmemory-policy {p} may evict rate-limit keys, which silently resets \
                     their limits; prefer noeviction or volatile-*"
                );
            }
        }
        Ok(())
    }

    fn warn(&self, e: &StoreError) {
        if self.inner.last_warn.ready(WARN_EVERY) {
            tracing::warn!(
                error = %e,
                store_errors = self.inner.errors.get(),
                "rate-limit Redis store failed (logged at most once per second)"
            );
        }
    }

    fn fail(&self, e: StoreError) -> RedisFuture {
        self.inner.errors.add(1);
        self.warn(&e);
        Box::pin(std::future::ready(Err(e)))
    }
}

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Map(kv) => kv.iter().for_each(|(k, v)| {
            strings(k, out);
            strings(v, out);
        }),
        _ => {}
    }
}

fn family(strategy: Strategy) -> Family {
    match strategy {
        Strategy::FixedWindow | Strategy::FixedWindowFirstHit => Family::Fixed,
        Strategy::MovingWindow => Family::Moving,
        Strategy::SlidingWindow => Family::Sliding,
        _ => Family::Gcra,
    }
}

/// `<base><family letter><rule tag in hex>`, and a quota number for the moving window's lists.
fn redis_keys(base: &str, strategy: Strategy, tag: u64, quotas: usize) -> Vec<String> {
    let suffix = match family(strategy) {
        Family::Fixed => "f",
        Family::Sliding => "s",
        Family::Gcra => "g",
        Family::Moving => {
            return (1..=quotas)
                .map(|i| format!("{base}m{tag:016x}.{i}"))
                .collect();
        }
    };
    vec![format!("{base}{suffix}{tag:016x}")]
}

/// The script's arguments for `rule`, checked against the 2^53 bound.
fn script_args(rule: &Rule, params: &[Params], op: Op, now_us: u64) -> Result<Vec<u64>, String> {
    let (code, cost, at_us) = match op {
        Op::Check(c) => (0, u64::from(c), 0),
        Op::Peek => (1, 0, 0),
        // The check's time came from the same clock (server time), in µs.
        Op::Settle { reserved, at, .. } => (2, u64::from(reserved), (at / 1000).max(1)),
        Op::Reset => (3, 0, 0),
    };
    let horizon = params
        .iter()
        .map(|p| horizon_ticks(rule.strategy(), p))
        .max()
        .unwrap_or(0);
    let ttl_ms = horizon.div_ceil(1000).saturating_add(TTL_SLACK_MS);
    let aligned = u64::from(rule.strategy() == Strategy::FixedWindow);
    let mut args = Vec::with_capacity(6 + 4 * params.len());
    args.extend([code, cost, now_us, ttl_ms, aligned, params.len() as u64]);
    for p in params {
        // Sums the scripts form (a start plus two windows, a TAT plus the depth) stay below 2^53.
        if p.window.saturating_mul(4) >= MAX_SAFE / 2 || p.tau().saturating_mul(4) >= MAX_SAFE / 2 {
            return Err(format!(
                "a quota of {} per {} µs exceeds what the Redis scripts compute exactly",
                p.limit, p.window
            ));
        }
        args.extend([p.limit, p.window, p.emission, p.burst]);
    }
    if now_us >= MAX_SAFE / 2 {
        return Err(format!(
            "time {now_us} µs is beyond what Lua computes exactly"
        ));
    }
    args.push(at_us.min(MAX_SAFE / 2));
    if let Op::Settle { actual, .. } = op {
        args.push(u64::from(actual));
    }
    Ok(args)
}

/// The error kind of a failed call.
fn map_error(e: &RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::TryAgain
                | ErrorKind::BusyLoadingError
                | ErrorKind::ClusterConnectionNotFound
        )
    {
        StoreErrorKind::Connection
    } else if matches!(e.kind(), ErrorKind::TypeError | ErrorKind::ParseError) {
        StoreErrorKind::BadReply
    } else {
        StoreErrorKind::Server
    };
    StoreError::new(kind, e.to_string())
}

fn bad_reply(what: &str) -> StoreError {
    StoreError::new(StoreErrorKind::BadReply, format!("script reply: {what}"))
}

/// Decodes a script's reply: `now`, then five integers per quota; picks the reported quota as the
/// memory store does.
fn decode(v: &Value, quotas: usize) -> Result<Decision, StoreError> {
    let Value::Array(items) = v else {
        return Err(bad_reply("not an array"));
    };
    if items.len() != 1 + 5 * quotas {
        return Err(bad_reply(&format!(
            "{} values for {quotas} quotas",
            items.len()
        )));
    }
    let mut ints = items.iter().map(|i| match i {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad_reply("a negative value")),
        _ => Err(bad_reply("a value that is not an integer")),
    });
    let mut next = || ints.next().unwrap_or_else(|| Err(bad_reply("too short")));
    let now = next()?;
    let mut verdicts = Vec::with_capacity(quotas);
    for _ in 0..quotas {
        let outcome = match next()? {
            0 => Outcome::Allowed,
            1 => Outcome::Rejected,
            2 => Outcome::Exceeds,
            _ => return Err(bad_reply("an unknown outcome")),
        };
        verdicts.push(Verdict {
            outcome,
            limit: next()?,
            remaining: next()?,
            reset_after: next()?,
            retry_after: next()?,
        });
    }
    let (index, v) = strategy::reported(verdicts).ok_or_else(|| bad_reply("no quota"))?;
    Ok(to_decision(index, v, now, TICK_NANOS))
}

/// [`decode`], for the fuzz targets (`crate::fuzzing`).
pub(crate) fn fuzz_decode(v: &Value, quotas: usize) -> Result<Decision, StoreError> {
    decode(v, quotas)
}

/// The Redis keys of `key` under `prefix`, for the fuzz targets (`crate::fuzzing`).
pub(crate) fn fuzz_key_names<K: StoreKey>(
    prefix: &str,
    key: &K,
    strategy: Strategy,
    tag: u64,
    quotas: usize,
) -> Vec<String> {
    redis_keys(&keys::base_key(prefix, key), strategy, tag, quotas)
}

impl<K: StoreKey> Store<K> for RedisStore {
    type Future = RedisFuture;

    fn apply(&self, key: &K, scope: Scope<'_>, op: Op, now: u64) -> Answer<RedisFuture> {
        Answer::later(self.apply_in(key, scope.rule(), scope.tag(), op, now))
    }

    fn validate(&self, rule: &Rule) -> Result<(), ConfigError> {
        rule.params_in(TICK_NANOS).map(drop)
    }

    fn names(&self) -> &LimiterNames {
        &self.inner.names
    }

    fn stats(&self) -> Stats {
        self.counters()
    }
}

impl RedisStore {
    fn apply_in<K: StoreKey>(
        &self,
        key: &K,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> RedisFuture {
        let params = match rule.params_in(TICK_NANOS) {
            Ok(p) => p,
            Err(e) => return self.fail(StoreError::new(StoreErrorKind::Other, e.to_string())),
        };
        let now_us = if self.inner.client_time {
            (now / TICK_NANOS).max(1)
        } else {
            0
        };
        let args = match script_args(rule, &params, op, now_us) {
            Ok(a) => a,
            Err(m) => return self.fail(StoreError::new(StoreErrorKind::Other, m)),
        };
        let base = keys::base_key(&self.inner.prefix, key);
        let redis_keys = redis_keys(&base, rule.strategy(), tag, params.len());
        let cache_key = self
            .inner
            .cache
            .as_ref()
            .map(|_| cache::fingerprint(&redis_keys, args.get(4..).unwrap_or_default()));
        if let (Some(cache), Some(ck)) = (&self.inner.cache, cache_key) {
            match op {
                Op::Check(c) if c > 0 => {
                    if let Some(d) = cache.get(ck, Instant::now()) {
                        self.inner.rejected.add(1);
                        return Box::pin(std::future::ready(Ok(d)));
                    }
                }
                Op::Settle { .. } | Op::Reset => cache.remove(ck),
                _ => {}
            }
        }
        let fam = family(rule.strategy());
        let (sha, src) = match Family::ALL.iter().position(|f| *f == fam) {
            Some(i) => match self.inner.scripts.get(i) {
                Some((sha, src)) => (sha.clone(), Arc::clone(src)),
                None => return self.fail(bad_reply("no script")),
            },
            None => return self.fail(bad_reply("no script")),
        };
        let store = self.clone();
        let quotas = params.len();
        Box::pin(async move {
            let inner = &store.inner;
            let call = |name: &str, body: &str| {
                let mut c = ::redis::cmd(name);
                c.arg(body)
                    .arg(redis_keys.len())
                    .arg(&redis_keys)
                    .arg(&args);
                c
            };
            let run = async {
                match inner.conn.query(&call("EVALSHA", &sha)).await {
                    Err(e) if e.kind() == ErrorKind::NoScriptError => {
                        inner.conn.query(&call("EVAL", &src)).await
                    }
                    r => r,
                }
            };
            let result = match tokio::time::timeout(inner.timeout, run).await {
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!("no reply within {:?}", inner.timeout),
                )),
                Ok(Err(e)) => Err(map_error(&e)),
                Ok(Ok(v)) => decode(&v, quotas).map(|d| d.answering(op)),
            };
            match result {
                Ok(d) => {
                    if let Op::Check(c) = op {
                        if d.is_allowed() {
                            inner.allowed.add(1);
                        } else {
                            inner.rejected.add(1);
                        }
                        if let (Some(cache), Some(ck)) = (&inner.cache, cache_key) {
                            if c == 1 && d.outcome() == Outcome::Rejected {
                                cache.insert(ck, d, Instant::now());
                            }
                        }
                    }
                    Ok(d)
                }
                Err(e) => {
                    inner.errors.add(1);
                    store.warn(&e);
                    Err(e)
                }
            }
        })
    }

    fn counters(&self) -> Stats {
        Stats {
            allowed: self.inner.allowed.get(),
            rejected: self.inner.rejected.get(),
            store_errors: self.inner.errors.get(),
            ..Stats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bug (found by `redis_faults::wrong_password_is_a_store_error_and_fail_closed_never_admits`):
    /// connection errors quoted the URL verbatim, password included, into messages that are logged.
    #[test]
    fn connection_urls_are_redacted_in_messages() {
        assert_eq!(
            redact("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(
            redact("redis://user:s3cret@h:1/2"),
            "redis://user:***@h:1/2"
        );
        assert_eq!(redact("redis://user@h:1"), "redis://:***@h:1");
        assert_eq!(
            redact("redis+cluster://:p@ss@a:1,b:2"),
            "redis+cluster://:***@a:1,b:2"
        );
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn arguments_stay_below_two_to_the_53() {
        let rule = Rule::parse(Strategy::SlidingWindow, "4294967295/3660d").unwrap();
        let params = rule.params_in(TICK_NANOS).unwrap();
        let args = script_args(&rule, &params, Op::Check(1), 1_800_000_000_000_000).unwrap();
        assert!(args.iter().all(|&a| a < MAX_SAFE));
        assert!(script_args(&rule, &params, Op::Check(1), MAX_SAFE).is_err());
    }

    #[test]
    fn replies_of_the_wrong_shape_are_bad_replies() {
        let short = Value::Array(vec![Value::Int(5)]);
        assert_eq!(
            decode(&short, 1).unwrap_err().kind(),
            StoreErrorKind::BadReply
        );
        let negative = Value::Array(vec![
            Value::Int(5),
            Value::Int(0),
            Value::Int(1),
            Value::Int(-1),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert_eq!(
            decode(&negative, 1).unwrap_err().kind(),
            StoreErrorKind::BadReply
        );
        let ok = Value::Array(vec![
            Value::Int(5),
            Value::Int(1),
            Value::Int(3),
            Value::Int(0),
            Value::Int(7),
            Value::Int(7),
        ]);
        let d = decode(&ok, 1).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_micros(7)));
        assert_eq!(d.time(), Duration::from_micros(5));
        assert_eq!(
            decode(&Value::Nil, 1).unwrap_err().kind(),
            StoreErrorKind::BadReply
        );
    }
}
