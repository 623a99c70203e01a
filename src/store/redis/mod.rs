//! The Redis store (feature `redis`): one limit shared by every instance of a service.
//!
//! [`RedisStore`] runs each decision as one Lua script call (`EVALSHA`), atomic across the quotas of
//! a rule, on the Redis server's clock; single node, Cluster or Sentinel, each with TLS. The guide
//! tells how to run it: [stores and Redis in production](crate::guide::stores) (URL forms, TLS,
//! Sentinel, overload and shedding, outages, the circuit breaker), [leasing](crate::guide::leasing)
//! and [changing limits](crate::guide::changing_limits) (a rule change converts a key's state).
//!
//! What the sources rely on, by file: `target.rs` (URL forms), `tls.rs`, `connect.rs` (connecting,
//! credentials, reconnecting), `builder.rs`, `decide.rs` (script arguments, reply decoding, the
//! [`Store`](super::Store) impl), `outage.rs` (shedding, the local fallback), `errors.rs`, `lanes.rs`, `send.rs`.
//!
//! - Every number a script sees stays an integer below 2^53 (Lua numbers are doubles).
//! - Keys: `<prefix>{<tag>}:<name>:h`; the tag encodes the user key injectively (hex of its
//!   length-prefixed bytes, or a SHA-256 when long), `<name>` is the hex of the limiter name's hash,
//!   so all Redis keys of one logical key share one Cluster slot. Every key has a TTL a second past
//!   its strategy's horizon.
//! - A sent call is never replayed: a timeout or a lost reply is an error, as Redis may already
//!   have counted it. Only a `NOSCRIPT` reply makes the store send the script body with `EVAL`, once.
//!   On Cluster, the `redis` crate's client may resend a call after a connection reset.
//! - State lives in Redis memory: a restart without persistence forgets it (at most `N` more per key
//!   per restart), and an `allkeys-*` eviction policy can reset keys (the store warns at start-up).

mod breaker;
mod builder;
mod cache;
mod connect;
mod decide;
mod degraded;
mod errors;
mod keys;
mod lanes;
mod leases;
mod multi;
mod outage;
mod quota_lease;
mod rebuild;
mod resolve;
mod scripts;
mod send;
mod sentinel;
mod target;
mod tls;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::Semaphore;

use ::redis::{RedisError, Value};

use self::breaker::{Breaker, Pass};
pub use self::builder::RedisStoreBuilder;
use self::cache::BlockCache;
use self::connect::{Conn, authenticate, connect};
use self::decide::{decode, family, limit_of, redis_keys, script_args};
#[cfg(any(fuzzing, test))]
pub(crate) use self::decide::{fuzz_decode, fuzz_key_names};
use self::degraded::Local;
use self::errors::{error_kind, map_error};
use self::lanes::Lanes;
pub use self::quota_lease::{LeaseCounters, Leasing};
use self::target::Target;
pub(crate) use self::target::redact;
use super::{LimiterNames, Scope, StoreKey};
use crate::decision::Decision;
use crate::error::{BuildError, StoreError, StoreErrorKind};
use crate::stats::{Counter, Stats};
#[cfg(any(test, feature = "test-util"))]
use crate::strategy::Strategy;

/// Nanoseconds per tick of the Redis store (one microsecond).
const TICK_NANOS: u64 = 1000;
/// Every number a script sees must stay below this (Lua numbers are doubles).
const MAX_SAFE: u64 = 1 << 53;
/// Slack added to every TTL past the strategy's horizon, in milliseconds.
const TTL_SLACK_MS: u64 = 1000;
/// How often the same failure may be logged.
const WARN_EVERY: Duration = Duration::from_secs(1);
/// The wait a decision shed for overload asks for.
const SHED_WAIT: Duration = Duration::from_secs(1);
/// How long Redis must have been silent (no reply to any call) for a timeout to count as an outage
/// rather than overload. Below it, a call that gets no slot or no reply in time is shed (rejected
/// locally), never admitted: a flood that slows the process or Redis cannot switch limiting off.
/// 2 s, not less: a flood on a loaded 2-core machine starved the process itself (every task, the
/// reply reader included) for 550-615 ms, and at 500 ms fail-open then let 54 requests past a
/// limit of 1000 (`tools/src/bin/redis_flood.rs`).
const SILENCE: Duration = Duration::from_secs(2);
/// The pause between two connection attempts while Redis has never been reached.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);
/// The longest one background connection attempt may take, so attempts start at least every second.
const RECONNECT_ATTEMPT: Duration = Duration::from_millis(750);
/// How long past the caller's timeout a sent call may keep its in-flight slot (waiting for the
/// reply that would free it).
const LATE_GRACE: Duration = Duration::from_secs(1);

/// The answer of [`RedisStore`]: a boxed future (one allocation per call, next to a network round
/// trip).
pub(crate) type RedisFuture = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

/// A [`Store`](super::Store) on Redis, single node or Cluster. Cheap to clone: clones share the connection,
/// counters and cache.
///
/// Build it with [`RedisStore::connect`] or [`RedisStore::builder`], then pass it to
/// [`Builder::store`](crate::Builder::store).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    /// The switch of a rules file limit's store (`None` elsewhere): when on, this limit's checks
    /// fail during an outage instead of deciding by the local fallback (its `fail_mode` is
    /// `open` or `closed`). Shared by the clones of that one store, flipped by a reload.
    no_fallback: Option<Arc<AtomicBool>>,
}

struct Inner {
    /// `None` until the first connection succeeds (start-up without Redis).
    conn: RwLock<Option<Conn>>,
    /// Whether the URL names a Cluster (known at build, before any connection).
    cluster: bool,
    prefix: String,
    timeout: Duration,
    client_time: bool,
    cache: Option<BlockCache>,
    /// EVALSHA hashes and sources, indexed like [`Family::ALL`].
    scripts: [(String, Arc<str>); 4],
    /// One permit per call sent and not yet answered (or given up past [`LATE_GRACE`]).
    gate: Arc<Semaphore>,
    /// Each key's share of the gate (`lanes.rs`).
    lanes: Arc<Lanes>,
    max_in_flight: usize,
    breaker: Breaker,
    local: Option<Local>,
    /// Quota leases ([`RedisStoreBuilder::leases`]): `None` when off.
    leases: Option<quota_lease::Leases>,
    /// When Redis last replied, in nanoseconds since `epoch` (0: never).
    last_reply: AtomicU64,
    /// When a call last failed on the connection (lost, refused), in nanoseconds since `epoch`.
    last_broken: AtomicU64,
    epoch: Instant,
    allowed: Counter,
    rejected: Counter,
    /// Settled units a full moving-window log could not hold (the scripts' replies say).
    settle_dropped: Counter,
    errors: Counter,
    shed: Counter,
    /// Shed checks by reason: their own key's flood, no room among the calls in flight, no reply
    /// in time.
    shed_own_key: Counter,
    shed_no_room: Counter,
    shed_slow: Counter,
    /// The shed total at the last warning about shedding.
    shed_warned: AtomicU64,
    last_shed_warn: crate::throttle::Throttle,
    local_allowed: Counter,
    local_rejected: Counter,
    timed_out: Counter,
    /// Checks of keys without a queue that waited past the timeout for their reply.
    waited_longer: Counter,
    late_replies: Counter,
    late_admitted: Counter,
    late_refunded: Counter,
    settle_timed_out: Counter,
    last_settle_warn: crate::throttle::Throttle,
    last_warn: crate::throttle::Throttle,
    names: LimiterNames,
    /// Limits whose estimated conversion was logged.
    estimates: crate::store::EstimateWarnings,
    /// A fresh Cluster connection after a failed probe (`rebuild.rs`).
    rebuild: rebuild::Rebuild,
}

impl Inner {
    fn clock(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn replied(&self) {
        self.last_reply.fetch_max(self.clock(), Ordering::AcqRel);
    }

    /// Whether Redis replied to anything after `since` (a [`Inner::clock`] reading), and the
    /// connection has not failed since its last reply: Redis is up, so a slow call is overload.
    fn replied_since(&self, since: u64) -> bool {
        let reply = self.last_reply.load(Ordering::Acquire);
        reply > since && reply >= self.last_broken.load(Ordering::Acquire)
    }

    fn broken(&self) {
        self.last_broken.fetch_max(self.clock(), Ordering::AcqRel);
    }
}

/// Counters of a [`RedisStore`] beyond the limiter's [`Stats`]: how its overload and outage
/// policies answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCounters {
    /// Checks rejected locally because the store had no room to send them to Redis within the
    /// timeout (overload, not an outage). Also in [`Stats::rejected`]. The sum of the three
    /// reasons below.
    pub shed: u64,
    /// Of those, checks that waited behind their own key's checks (a key has two checks in flight
    /// at once, more only from free slots other keys leave): the cost of a key's own flood.
    pub shed_own_key: u64,
    /// Of those, checks that found no room among the calls in flight
    /// ([`RedisStoreBuilder::max_in_flight`]) while Redis answered others.
    pub shed_no_room: u64,
    /// Of those, checks sent whose reply did not come within the timeout while Redis answered
    /// others (or this process was too busy to read it).
    pub shed_slow: u64,
    /// Checks admitted by the local limiter during an outage ([`RedisStoreBuilder::local_fallback`]).
    /// Also in [`Stats::allowed`].
    pub local_allowed: u64,
    /// Checks rejected by the local limiter during an outage. Also in [`Stats::rejected`].
    pub local_rejected: u64,
    /// Calls sent to Redis whose reply did not come within the timeout.
    pub timed_out: u64,
    /// Of those, checks of a key with no other check waiting (not a flooding key) that waited up
    /// to 500 ms more for their reply while Redis answered others, instead of being shed.
    pub waited_longer: u64,
    /// Replies that came after their caller had given up: Redis applied the call unseen.
    pub late_replies: u64,
    /// Of those, checks Redis admitted: quota spent on requests the caller answered otherwise.
    pub late_admitted: u64,
    /// Of those, admissions given back to Redis with a refund at the check's time (the rest spent
    /// quota unseen: under-admission, never over-admission).
    pub late_refunded: u64,
    /// Calls made after a request was decided that timed out: settlements (a refund included),
    /// resets and peeks that got no slot or no reply within the timeout while Redis answered other
    /// calls, and concurrency lease releases. Never a `fail_open` (nothing is let through by them)
    /// and, while Redis answers, not an outage for the circuit breaker. Redis may still apply such
    /// a call when it gets to it; if it does not, a refund's estimate stays charged and a lease
    /// expires by its TTL. Warned about at most once a second.
    pub settle_timed_out: u64,
    /// Times the circuit breaker opened.
    pub breaker_opens: u64,
    /// Whether the circuit breaker is open now.
    pub breaker_open: bool,
    /// Whether the store holds a connection (false until Redis is first reached).
    pub connected: bool,
    /// Calls in flight now.
    pub in_flight: u64,
    /// The most calls of one key (under its rule) in flight at once since the store was built,
    /// refunds included: two, or more for a hot key while the store had free slots.
    pub key_in_flight_peak: u64,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &*self.inner.conn.read() {
            Some(Conn::Single(_)) => "single",
            Some(Conn::Cluster(_)) => "cluster",
            Some(Conn::Sentinel(_)) => "sentinel",
            None => "connecting",
        };
        f.debug_struct("RedisStore")
            .field("mode", &kind)
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field(
                "block_cache",
                &self.inner.cache.as_ref().map(BlockCache::cap),
            )
            .field("max_in_flight", &self.inner.max_in_flight)
            .field(
                "local_fallback",
                &self.inner.local.as_ref().map(Local::instances),
            )
            .field(
                "leases",
                &self.inner.leases.as_ref().map(quota_lease::Leases::cfg),
            )
            .finish_non_exhaustive()
    }
}
impl RedisStore {
    /// Connects to `url` with the default options: `redis://host:port[/db]` for one node,
    /// `redis+cluster://host1:port1,host2:port2` for a Cluster (any reachable nodes as seeds).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate::BuildError> {
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
    pub async fn connect(url: &str) -> Result<RedisStore, BuildError> {
        Self::builder(url).build().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The Redis keys holding `key`'s state in `scope` (for inspection and tests): a hash named by
    /// the limiter's name and the key only, whatever the rule, which records the rule the state
    /// was written under (and, for the moving window, one list per quota after it). Limiters of
    /// different names are kept apart; a rule change under one name converts the state.
    pub fn redis_keys<K: StoreKey>(&self, key: &K, scope: Scope<'_>) -> Vec<String> {
        let base = keys::base_key(&self.inner.prefix, key, super::name_hash(scope.name()));
        let rule = scope.rule();
        redis_keys(&base, rule.strategy(), rule.quotas().len())
    }

    /// How many blocked keys the local cache holds now (0 without a cache).
    pub fn cached_keys(&self) -> usize {
        self.inner.cache.as_ref().map_or(0, BlockCache::len)
    }

    /// Test hook (feature `test-util`, not part of the API): the Lua source of the script
    /// `strategy` runs, for benchmarks (see the calling convention in the crate's `store::redis`
    /// sources).
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn script_source(strategy: Strategy) -> String {
        family(strategy).source()
    }

    /// Counters of the overload and outage policies.
    pub fn counters(&self) -> RedisCounters {
        let i = &self.inner;
        RedisCounters {
            shed: i.shed.get(),
            shed_own_key: i.shed_own_key.get(),
            shed_no_room: i.shed_no_room.get(),
            shed_slow: i.shed_slow.get(),
            local_allowed: i.local_allowed.get(),
            local_rejected: i.local_rejected.get(),
            timed_out: i.timed_out.get(),
            waited_longer: i.waited_longer.get(),
            late_replies: i.late_replies.get(),
            late_admitted: i.late_admitted.get(),
            late_refunded: i.late_refunded.get(),
            settle_timed_out: i.settle_timed_out.get(),
            breaker_opens: i.breaker.opens(),
            breaker_open: i.breaker.is_open(),
            connected: i.conn.read().is_some(),
            in_flight: (i.max_in_flight.saturating_sub(i.gate.available_permits())) as u64,
            key_in_flight_peak: i.lanes.peak(),
        }
    }

    /// Loads the scripts on every master and warns about an eviction policy that can drop keys.
    async fn prepare(&self, within: Duration) -> Result<(), StoreError> {
        let Some(conn) = self.inner.conn.read().clone() else {
            return Ok(());
        };
        let work = async {
            for (_, src) in &self.inner.scripts {
                let mut load = ::redis::cmd("SCRIPT");
                load.arg("LOAD").arg(&**src);
                conn.query(&load).await?;
            }
            let mut get = ::redis::cmd("CONFIG");
            get.arg("GET").arg("maxmemory-policy");
            Ok::<_, RedisError>(conn.query(&get).await.ok())
        };
        let policy = tokio::time::timeout(within, work)
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Timeout, "loading the scripts timed out"))?
            .map_err(map_error)?;
        self.inner.replied();
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
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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

impl RedisStore {
    fn stats_now(&self) -> Stats {
        Stats {
            allowed: self.inner.allowed.get(),
            rejected: self.inner.rejected.get(),
            store_errors: self.inner.errors.get(),
            settle_dropped_units: self.inner.settle_dropped.get(),
            breaker_open: self.inner.breaker.is_open(),
            store_down: self.inner.breaker.is_open() || self.inner.conn.read().is_none(),
            ..Stats::default()
        }
    }
}
