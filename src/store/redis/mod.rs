//! The Redis store (feature `redis`): one limit shared by every instance of a service.
//!
//! [`RedisStore`] runs each decision as one Lua script call (`EVALSHA`), atomic across all quotas of
//! a rule, with the Redis server's `TIME` in microseconds, so app instances with skewed clocks agree.
//! It works on a single node (`redis://host:port`), on Redis Cluster
//! (`redis+cluster://host1:port1,host2:port2`) and behind Sentinel
//! (`redis+sentinel://[user:pass@]host1:port1[,host2:port2]/SERVICE[/DB]`); each with TLS through
//! rustls (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`).
//!
//! - **Arithmetic**: the scripts implement exactly the in-memory strategies, in microseconds; every
//!   number stays an integer below 2^53 (Lua numbers are doubles).
//! - **Keys**: `<prefix>{<tag>}:<name>:h`, where the tag encodes the user key injectively (hex of
//!   its length-prefixed bytes, or a SHA-256 when long) and `<name>` is the hex of the limiter
//!   name's hash. All Redis keys of one logical key share the tag, hence one Cluster slot. Every
//!   key has a TTL a second past its strategy's horizon.
//! - **Rule changes**: the state is identified by (limiter name, key), never by the rule: the hash
//!   records the rule it was written under, read in the same call as the state. A decision under
//!   another rule (a quota changed in code, a rules-file reload, a `select_rule` tier change, two
//!   versions of a rolling deploy on one Redis) converts the state inside the script, atomically,
//!   then decides: each new quota starts at no less than what the old state proves was spent in
//!   its window (the largest spend of the old windows inside it, else that of the shortest
//!   containing it; a bucket's deficit in time, capped at the new burst; the moving window's log
//!   exactly). A removed period's spend stays as a ghost, charged while it lives, so two rule
//!   versions alternating count a key once.
//! - **Failures**: each call has a timeout (50 ms by default) and is never replayed once sent: a
//!   timeout or a lost reply is an error, as Redis may already have counted the request. Only an
//!   explicit `NOSCRIPT` reply (a flushed or restarted server, a fresh Cluster node) makes the store
//!   send the script body with `EVAL`, once. While disconnected, calls fail within the timeout; the
//!   connection is re-established in the background, so decisions resume without a restart. An
//!   unreachable Redis does not fail [`RedisStoreBuilder::build`]: the store connects in the
//!   background; a Redis that answers and refuses (credentials, TLS) does, with its own message.
//! - **Overload**: at most [`max_in_flight`](RedisStoreBuilder::max_in_flight) calls (256) are in
//!   flight. Each key has a lane: two of its checks may always be in flight, and more only while
//!   a quarter of the calls in flight (64 of 256) stays free for other keys and within a 64th of
//!   the quota Redis last left the key (two once Redis rejected it). A key's further checks wait
//!   behind them and are answered from the blocked-key cache or shed at the timeout, so a hot key
//!   alone may use three quarters of the store, and floods leave other keys a quarter of it,
//!   each flooding key falling back to two calls in flight when others need the slots. A check that gets no slot or no reply within the timeout
//!   while Redis keeps answering others is shed: rejected locally (429, `outcome="shed"`), never
//!   admitted; a check of a key with nothing queued behind it waits up to 500 ms more for its reply
//!   first. Only when Redis has been silent for 2 s, or the connection broke, is a failure an
//!   outage for the failure policy.
//! - **Outages**: the layer's policy (fail-open by default, or fail-closed), or the local limiter of
//!   [`local_fallback`](RedisStoreBuilder::local_fallback); a circuit breaker
//!   ([`circuit_breaker`](RedisStoreBuilder::circuit_breaker)) skips Redis after 5 consecutive
//!   failures and probes it every 500 ms.
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

mod breaker;
mod cache;
mod degraded;
mod keys;
mod lanes;
mod leases;
mod multi;
mod quota_lease;
mod rebuild;
mod resolve;
mod scripts;
mod send;
mod sentinel;

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::Semaphore;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, RedisError, Value};

use self::breaker::{Breaker, Pass};
use self::cache::BlockCache;
use self::degraded::Local;
use self::lanes::Lanes;
pub use self::quota_lease::{LeaseCounters, Leasing};
use self::scripts::Family;
use self::send::Shed;
use super::{Answer, LimiterNames, Scope, Store, StoreKey};
use crate::decision::{Decision, Outcome, to_decision};
use crate::error::{BuildError, ConfigError, StoreError, StoreErrorKind, TlsFileProblem};
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

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<sentinel::SentinelConn>),
}

impl Conn {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Sentinel(c) => c.query(cmd).await,
        }
    }
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
    block_cache_stale: Duration,
    max_in_flight: usize,
    breaker_threshold: u32,
    breaker_cool_down: Duration,
    local_fallback: Option<NonZeroU32>,
    tls_ca: Option<std::path::PathBuf>,
    tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    client_time: bool,
    leasing: Option<Leasing>,
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

    /// Remembers up to `capacity` keys that Redis reported blocked (default 10,000; 0 turns the
    /// cache off), and answers them locally until the reported wait is over (measured on this
    /// process's monotonic clock) or for [`block_cache_staleness`](Self::block_cache_staleness),
    /// whichever is sooner, so a hot blocked key stops costing a round trip: under a flood on one
    /// key, Redis sees about one call per key per staleness period per instance.
    pub fn block_cache(mut self, capacity: usize) -> Self {
        self.block_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// The longest a cached rejection is answered without asking Redis again (default 1 s): a
    /// reset or refund made through another instance is seen within this time.
    pub fn block_cache_staleness(mut self, max: Duration) -> Self {
        self.block_cache_stale = max;
        self
    }

    /// The most calls sent to Redis and not yet answered (default 256); one key's checks hold at
    /// most two of them (the others wait behind those two, and are shed at the timeout: a key's
    /// flood costs that key). A check that finds no room is not queued: it is shed, answered locally as a rejection (`429`, `Retry-After: 1`, counted
    /// in [`RedisCounters::shed`]), never admitted, when Redis is answering other calls (overload),
    /// and by the failure policy when Redis has answered nothing for 2 s or the connection broke
    /// (an outage).
    /// A sent call keeps its slot until its reply comes, or for at most the timeout plus one
    /// second, so stale calls cannot pile up in front of a stalled server.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.clamp(1, Semaphore::MAX_PERMITS);
        self
    }

    /// The circuit breaker (defaults: opens after 5 consecutive outage failures, probes after
    /// 500 ms). While open, calls skip Redis and are answered by the failure policy at once (a dead
    /// Redis costs no timeout per request); after `cool_down`, one call probes Redis, and its reply
    /// closes the circuit. Outage failures are connection errors and timeouts during which Redis
    /// replied to nothing for 2 s (or after the connection broke); overload (timeouts while Redis
    /// answers other calls) does not count.
    pub fn circuit_breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.breaker_threshold = failures.max(1);
        self.breaker_cool_down = cool_down;
        self
    }

    /// Degraded mode: during an outage (connection lost, timeouts without any reply, an error reply
    /// such as `OOM`, the circuit open, not yet connected), decide with an in-memory limiter of the
    /// same rule, each quota's limit and burst divided by `instances` (the number of service
    /// instances sharing this Redis, at least 1), instead of returning the error to the layer's
    /// failure policy. Keys in the blocked-key cache stay blocked. Local decisions carry their
    /// rate-limit headers and are counted in [`RedisCounters::local_allowed`] and
    /// [`RedisCounters::local_rejected`]. Off by default (the layer's policy decides; fail-open by
    /// default).
    pub fn local_fallback(mut self, instances: u32) -> Self {
        self.local_fallback = Some(NonZeroU32::new(instances).unwrap_or(NonZeroU32::MIN));
        self
    }

    /// Quota leasing: an instance takes a slice of a hot key's quota from Redis in one call and
    /// decides locally against it, so a hot key costs one Redis call per lease instead of one per
    /// request. Offered for the fixed window (clock-aligned), the sliding window counter and the
    /// token bucket; [`Builder::build`](crate::Builder::build) refuses it for the other
    /// strategies with a [`ConfigError::Store`] that says why. See [`Leasing`] for the sizes and
    /// the bounds. Off by default.
    pub fn leases(mut self, leasing: Leasing) -> Self {
        self.leasing = Some(leasing);
        self
    }

    /// For `rediss://` URLs: trust the CA certificates of this PEM file instead of the built-in web
    /// roots (a private CA, a managed Redis's bundle). [`build`](RedisStoreBuilder::build) fails
    /// when the file cannot be read, is not PEM, or the URL is not a TLS one.
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls_ca = Some(path.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate (PEM) with its private key (PEM) to
    /// servers that require one (`tls-auth-clients yes`).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls_client = Some((cert.into(), key.into()));
        self
    }

    /// Test hook (feature `test-util`, not part of the API): send the limiter's clock to the
    /// scripts instead of using the server's `TIME`. Production code never needs this.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn use_client_time(mut self, yes: bool) -> Self {
        self.client_time = yes;
        self
    }

    /// Connects, loads the scripts and checks the eviction policy.
    ///
    /// An unreachable Redis is not an error: the store starts without a connection, answers by its
    /// failure policy, and tries to connect in the background every 250 ms (each attempt bounded
    /// to 750 ms) until it succeeds; limits apply from the first call after that.
    ///
    /// # Errors
    /// [`BuildError::Config`] for a configuration mistake, found before connecting: a URL that
    /// cannot be used ([`ConfigError::RedisUrl`]), a bad prefix ([`ConfigError::RedisPrefix`]), a
    /// CA bundle or client certificate with a URL that is not a TLS one
    /// ([`ConfigError::TlsNeedsTlsUrl`]), a TLS file that cannot be read or is not PEM
    /// ([`ConfigError::TlsFile`]).
    /// [`BuildError::Store`] when Redis answers and refuses: [`StoreErrorKind::Server`] for a
    /// wrong password (the server's own message, such as `WRONGPASS ...`, never the password), a
    /// connection error for a TLS handshake refused; its [`source`](std::error::Error::source) is
    /// the `redis::RedisError`.
    pub async fn build(self) -> Result<RedisStore, BuildError> {
        if keys::check_prefix(&self.prefix).is_err() {
            return Err(ConfigError::RedisPrefix(self.prefix).into());
        }
        let mut tls = TlsFiles::default();
        if let Some(path) = &self.tls_ca {
            tls.ca = Some(read_pem("CA bundle", path)?);
        }
        if let Some((cert, key)) = &self.tls_client {
            tls.client = Some((
                read_pem("client certificate", cert)?,
                read_pem("client key", key)?,
            ));
        }
        let target = Target::parse(&self.url, tls, self.timeout, self.connect_timeout)?;
        let mut unresolved = false;
        let conn = match connect(&target, self.timeout, self.connect_timeout).await {
            Ok(c) => Some(c),
            Err(e) if unreachable(&e) => {
                let missing = resolve::unresolved(&target.hosts, self.connect_timeout).await;
                unresolved = !missing.is_empty();
                if missing.is_empty() {
                    tracing::warn!(
                        error = %e,
                        "Redis is unreachable at start-up; deciding by the failure policy and \
                         reconnecting in the background"
                    );
                } else {
                    report_unresolved(&target, &missing);
                }
                None
            }
            Err(e) => return Err(e.into()),
        };
        let connected = conn.is_some();
        let cluster = matches!(target.kind, TargetKind::Cluster(..));
        let sweep = self.leasing.is_some();
        let rebuild = rebuild::Rebuild::new(target.clone(), self.connect_timeout);
        let scripts = Family::ALL.map(|f| {
            let src = f.source();
            let sha = ::redis::Script::new(&src).get_hash().to_owned();
            (sha, Arc::<str>::from(src))
        });
        let gate = Arc::new(Semaphore::new(self.max_in_flight));
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn: RwLock::new(conn),
                cluster,
                prefix: self.prefix,
                timeout: self.timeout,
                client_time: self.client_time,
                cache: self
                    .block_cache
                    .map(|cap| BlockCache::new(cap, self.block_cache_stale)),
                scripts,
                gate: Arc::clone(&gate),
                lanes: Arc::new(Lanes::new(gate, self.max_in_flight)),
                max_in_flight: self.max_in_flight,
                breaker: Breaker::new(self.breaker_threshold, self.breaker_cool_down),
                local: self.local_fallback.map(Local::new),
                leases: self.leasing.map(quota_lease::Leases::new),
                last_reply: AtomicU64::new(0),
                last_broken: AtomicU64::new(0),
                epoch: Instant::now(),
                allowed: Counter::default(),
                rejected: Counter::default(),
                errors: Counter::default(),
                shed: Counter::default(),
                shed_own_key: Counter::default(),
                shed_no_room: Counter::default(),
                shed_slow: Counter::default(),
                shed_warned: AtomicU64::new(0),
                last_shed_warn: crate::throttle::Throttle::default(),
                local_allowed: Counter::default(),
                local_rejected: Counter::default(),
                timed_out: Counter::default(),
                waited_longer: Counter::default(),
                late_replies: Counter::default(),
                late_admitted: Counter::default(),
                late_refunded: Counter::default(),
                settle_timed_out: Counter::default(),
                last_settle_warn: crate::throttle::Throttle::default(),
                last_warn: crate::throttle::Throttle::default(),
                names: LimiterNames::default(),
                rebuild,
            }),
        };
        if sweep {
            quota_lease::sweep_in_background(Arc::downgrade(&store.inner));
        }
        if connected {
            store.prepare(self.connect_timeout).await?;
        } else {
            let inner = Arc::downgrade(&store.inner);
            reconnect_in_background(inner, target, self.connect_timeout, unresolved);
        }
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

/// PEM files for `rediss://` read at build time: a CA bundle replacing the built-in web roots,
/// and a client certificate with its key.
#[derive(Clone, Debug, Default)]
struct TlsFiles {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    fn certificates(&self) -> ::redis::TlsCertificates {
        ::redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| ::redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Reads a PEM file for a TLS option, with the option and path in the error.
fn read_pem(role: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    let fail = |problem| ConfigError::TlsFile {
        role,
        path: path.to_owned(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(TlsFileProblem::Unreadable(e.kind())))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(fail(TlsFileProblem::NotPem));
    }
    Ok(bytes)
}

/// A `redis::Client` for one node URL, with the TLS files when given.
fn client_for(url: &str, tls: &TlsFiles) -> Result<::redis::Client, RedisError> {
    if tls.is_empty() {
        ::redis::Client::open(url)
    } else {
        ::redis::Client::build_with_tls(url, tls.certificates())
    }
}

/// Where the store connects, checked when the store is built: every mistake in the URL or the TLS
/// options is found there, before any connection, and the background reconnects reuse it.
#[derive(Clone)]
struct Target {
    /// The URL with its password masked, for messages.
    shown: String,
    /// The hosts the URL names, for telling a name that does not resolve from a silent server.
    hosts: Vec<(String, u16)>,
    tls: TlsFiles,
    kind: TargetKind,
}

#[derive(Clone)]
enum TargetKind {
    Single(::redis::Client),
    /// The Cluster client, and a client per seed node for the credential check.
    Cluster(ClusterClient, Vec<::redis::Client>),
    Sentinel(Arc<sentinel::Target>),
}

impl Target {
    fn parse(
        url: &str,
        tls: TlsFiles,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let shown = redact(url);
        let bad = |reason: String| ConfigError::RedisUrl {
            url: shown.clone(),
            reason,
        };
        let lower = url.to_ascii_lowercase();
        let secure = lower.starts_with("rediss");
        if !tls.is_empty() && !secure {
            return Err(ConfigError::TlsNeedsTlsUrl(shown));
        }
        let cluster = ["redis+cluster://", "rediss+cluster://"]
            .into_iter()
            .find(|p| lower.starts_with(p));
        let kind = if let Some(target) = sentinel::parse(url) {
            TargetKind::Sentinel(Arc::new(target.map_err(bad)?))
        } else if let Some(rest) = cluster.map(|p| url.get(p.len()..).unwrap_or_default()) {
            let scheme = if secure { "rediss" } else { "redis" };
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((a, h)) => (format!("{a}@"), h),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("{scheme}://{auth}{h}"))
                .collect();
            if nodes.is_empty() {
                return Err(bad("no Cluster node given".into()));
            }
            let mut builder = ClusterClient::builder(nodes.clone());
            if !tls.is_empty() {
                builder = builder.certs(tls.certificates());
            }
            let client = builder
                .retries(3)
                .min_retry_wait(5)
                .max_retry_wait(100)
                .connection_timeout(connect_timeout)
                .response_timeout(timeout.saturating_add(LATE_GRACE))
                .build()
                .map_err(|e| bad(redact(&e.to_string())))?;
            let seeds = nodes
                .iter()
                .map(|n| client_for(n, &tls).map_err(|e| bad(redact(&e.to_string()))))
                .collect::<Result<_, _>>()?;
            TargetKind::Cluster(client, seeds)
        } else if ["redis://", "rediss://", "redis+unix://"]
            .iter()
            .any(|p| lower.starts_with(p))
        {
            TargetKind::Single(client_for(url, &tls).map_err(|e| bad(redact(&e.to_string())))?)
        } else {
            return Err(bad("expected redis://host:port, rediss://host:port, \
                 redis+cluster://host1:port1,host2:port2 or redis+sentinel://host:port/service"
                .into()));
        };
        Ok(Self {
            shown,
            hosts: resolve::hosts(url),
            tls,
            kind,
        })
    }
}

async fn connect(
    target: &Target,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<Conn, StoreError> {
    let shown = target.shown.as_str();
    let tls = &target.tls;
    match &target.kind {
        TargetKind::Sentinel(sentinels) => {
            let certs = (!tls.is_empty()).then(|| tls.certificates());
            let c = sentinel::SentinelConn::connect(
                sentinels,
                certs,
                manager_config(timeout, connect_timeout),
                connect_timeout,
            )
            .await
            .map_err(|e| map_error(e).in_context(shown))?;
            Ok(Conn::Sentinel(c))
        }
        TargetKind::Cluster(client, seeds) => {
            // The first seed that answers tells a refused password (the Cluster client would
            // retry it until the connect timeout); seeds that do not answer are skipped.
            for seed in seeds {
                match check_credentials(seed, certs(tls), shown, connect_timeout).await {
                    Ok(()) => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            StoreErrorKind::Connection | StoreErrorKind::Timeout
                        ) => {}
                    Err(e) => return Err(e),
                }
            }
            let c = tokio::time::timeout(connect_timeout, client.get_async_connection())
                .await
                .map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Connection,
                        format!("{shown}: no Cluster node answered within {connect_timeout:?}"),
                    )
                })?
                .map_err(map_error)?;
            Ok(Conn::Cluster(c))
        }
        TargetKind::Single(client) => {
            check_credentials(client, certs(tls), shown, connect_timeout).await?;
            let config = manager_config(timeout, connect_timeout);
            let c = tokio::time::timeout(
                connect_timeout,
                ConnectionManager::new_with_config(client.clone(), config),
            )
            .await
            .map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Connection,
                    format!(
                        "{shown}: no answer (or authentication refused) within {connect_timeout:?}"
                    ),
                )
            })?
            .map_err(map_error)?;
            Ok(Conn::Single(c))
        }
    }
}

/// The connection manager's settings: a reply may take the timeout plus [`LATE_GRACE`] before the
/// manager gives up on it (the caller gives up at the timeout); reconnects back off up to 200 ms.
fn manager_config(timeout: Duration, connect_timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(connect_timeout)
        .set_response_timeout(timeout.saturating_add(LATE_GRACE))
        .set_factor(2)
        .set_max_delay(200)
        .set_number_of_retries(8)
}

/// Connects once without credentials and sends `AUTH` itself, so that a refusal reports the
/// server's own words (`WRONGPASS invalid username-password pair ...`): the `redis` crate replaces
/// them with its own message, and its connection manager retries until the connect timeout, which
/// made a wrong password look like a timeout. Unreachable servers give a connection error.
async fn check_credentials(
    client: &::redis::Client,
    certs: Option<::redis::TlsCertificates>,
    shown: &str,
    within: Duration,
) -> Result<(), StoreError> {
    match tokio::time::timeout(within, authenticate(client, certs)).await {
        Err(_) => Err(StoreError::new(
            StoreErrorKind::Connection,
            format!("{shown}: no answer within {within:?}"),
        )),
        Ok(Err(e)) => {
            let err = map_error(e);
            Err(if err.kind() == StoreErrorKind::Server {
                err.in_context(&format!("{shown}: Redis refused the connection"))
            } else {
                err
            })
        }
        Ok(Ok(())) => Ok(()),
    }
}

/// The TLS files as the `redis` crate takes them; `None` without any.
fn certs(tls: &TlsFiles) -> Option<::redis::TlsCertificates> {
    (!tls.is_empty()).then(|| tls.certificates())
}

/// Connects to `client`'s server without its credentials, then sends `AUTH` and `PING`: a refusal
/// is the server's own reply (`WRONGPASS ...`), not the `redis` crate's rewording of it.
pub(super) async fn authenticate(
    client: &::redis::Client,
    certs: Option<::redis::TlsCertificates>,
) -> Result<(), RedisError> {
    let mut info = client.get_connection_info().clone();
    let password = info.redis.password.take();
    let username = info.redis.username.take();
    let bare = match certs {
        None => ::redis::Client::open(info)?,
        Some(c) => ::redis::Client::build_with_tls(info, c)?,
    };
    let mut c = bare.get_multiplexed_async_connection().await?;
    if let Some(password) = password {
        let mut auth = ::redis::cmd("AUTH");
        if let Some(user) = username {
            auth.arg(user);
        }
        auth.arg(password);
        auth.query_async::<()>(&mut c).await?;
    }
    ::redis::cmd("PING").query_async::<()>(&mut c).await
}

/// Whether a connection error means "nobody answered" (start anyway and keep trying) rather than
/// "Redis answered and refused" (authentication, TLS, a bad URL: fail at start).
fn unreachable(e: &StoreError) -> bool {
    match e.kind() {
        StoreErrorKind::Timeout => true,
        StoreErrorKind::Connection => {
            let m = e.to_string().to_ascii_lowercase();
            !(m.contains("certificate") || m.contains("tls") || m.contains("handshake"))
        }
        _ => false,
    }
}

/// A host name of the store's URL does not resolve: an error, not the warning of a Redis that is
/// still booting (a typo in a name never heals by itself).
fn report_unresolved(target: &Target, missing: &[String]) {
    tracing::error!(
        url = %target.shown,
        hosts = ?missing,
        "Redis host name {} does not resolve (DNS); the store has no connection and decides by \
         the failure policy; retrying in the background, reported every {}s while it lasts",
        missing.join(", "),
        resolve::REPORT_EVERY.as_secs()
    );
}

/// Tries to connect every [`RECONNECT_PAUSE`] until it succeeds or the store is dropped; while a
/// host name does not resolve (`unresolved` at start-up), says so every
/// [`resolve::REPORT_EVERY`] instead of warning about each attempt.
fn reconnect_in_background(
    inner: Weak<Inner>,
    target: Target,
    connect_timeout: Duration,
    mut unresolved: bool,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let within = connect_timeout.min(RECONNECT_ATTEMPT);
        let mut resolved_at = Instant::now();
        loop {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            let Some(timeout) = inner.upgrade().map(|i| i.timeout) else {
                return;
            };
            match connect(&target, timeout, within).await {
                Ok(conn) => {
                    let Some(strong) = inner.upgrade() else {
                        return;
                    };
                    *strong.conn.write() = Some(conn);
                    let store = RedisStore { inner: strong };
                    if let Err(e) = store.prepare(within).await {
                        // EVALSHA falls back to EVAL on NOSCRIPT: decisions work regardless.
                        tracing::debug!(error = %e, "loading the scripts after reconnecting");
                    }
                    tracing::info!("connected to Redis; limiting resumes");
                    return;
                }
                Err(e) => {
                    if resolved_at.elapsed() >= resolve::REPORT_EVERY {
                        resolved_at = Instant::now();
                        let missing = resolve::unresolved(&target.hosts, within).await;
                        unresolved = !missing.is_empty();
                        if unresolved {
                            report_unresolved(&target, &missing);
                        }
                    }
                    if unresolved {
                        continue;
                    }
                    if let Some(strong) = inner.upgrade() {
                        RedisStore { inner: strong }.warn(&e);
                    }
                }
            }
        }
    });
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

    /// Options for a store on `url` (see [`connect`](Self::connect) for the forms).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: "tollgate:".to_owned(),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            block_cache: Some(10_000),
            block_cache_stale: Duration::from_secs(1),
            max_in_flight: 256,
            breaker_threshold: 5,
            breaker_cool_down: Duration::from_millis(500),
            local_fallback: None,
            tls_ca: None,
            tls_client: None,
            client_time: false,
            leasing: None,
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

    fn warn(&self, e: &StoreError) {
        if self.inner.last_warn.ready(WARN_EVERY) {
            tracing::warn!(
                error = %e,
                store_errors = self.inner.errors.get(),
                "rate-limit Redis store failed (logged at most once per second)"
            );
        }
    }

    /// A check rejected locally because the store has no room to ask Redis in time (overload),
    /// counted by reason and warned about at most once a second.
    fn shed(&self, why: Shed, limit: u32, now: u64) -> Decision {
        let i = &self.inner;
        i.shed.add(1);
        i.rejected.add(1);
        match why {
            Shed::OwnKey => i.shed_own_key.add(1),
            Shed::NoRoom => i.shed_no_room.add(1),
            Shed::Slow => i.shed_slow.add(1),
        }
        if i.last_shed_warn.ready(WARN_EVERY) {
            let total = i.shed.get();
            let since = total.saturating_sub(i.shed_warned.swap(total, Ordering::Relaxed));
            tracing::warn!(
                shed = since,
                shed_total = total,
                own_key = i.shed_own_key.get(),
                no_room = i.shed_no_room.get(),
                no_reply_in_time = i.shed_slow.get(),
                timeout = ?i.timeout,
                "rate-limit Redis store shed {since} checks since the last warning (answered 429 \
                 without asking Redis): own_key = a key's own flood waited behind its own checks in \
                 flight; no_room = {} calls in flight to Redis; no_reply_in_time = Redis or this \
                 process slower than the timeout, raise the store timeout if this keeps growing \
                 while Redis is healthy (logged at most once per second)",
                i.max_in_flight
            );
        }
        let wait = nanos(SHED_WAIT);
        Decision {
            outcome: Outcome::Rejected,
            limit,
            remaining: 0,
            reset_after: wait,
            retry_after: wait,
            time: now,
            quota: 0,
            cost: 0,
            local: false,
            bound: 0,
            shed: true,
        }
    }

    /// Redis failed: the local limiter decides in degraded mode, else the error goes to the
    /// layer's failure policy.
    fn outage(
        &self,
        base: &String,
        cache_key: Option<u64>,
        (rule, tag): (&Rule, u64),
        op: Op,
        now: u64,
        e: StoreError,
    ) -> Result<Decision, StoreError> {
        let Some(local) = &self.inner.local else {
            return self.outage_error(e);
        };
        self.inner.errors.add(1);
        self.warn(&e);
        // Keys Redis reported blocked stay blocked for the wait it reported.
        if let (Op::Check(c), Some(cache), Some(ck)) = (op, &self.inner.cache, cache_key) {
            if c > 0 {
                if let Some(mut d) = cache.get_stale(ck, Instant::now()) {
                    self.inner.local_rejected.add(1);
                    self.inner.rejected.add(1);
                    d.local = true;
                    return Ok(d);
                }
            }
        }
        let mut d = local.decide(base, rule, tag, op, now);
        d.local = true;
        if let Op::Check(_) = op {
            if d.is_allowed() {
                self.inner.local_allowed.add(1);
                self.inner.allowed.add(1);
            } else {
                self.inner.local_rejected.add(1);
                self.inner.rejected.add(1);
            }
        }
        Ok(d)
    }

    fn outage_error(&self, e: StoreError) -> Result<Decision, StoreError> {
        self.inner.errors.add(1);
        self.warn(&e);
        Err(e)
    }

    fn fail(&self, e: StoreError) -> RedisFuture {
        self.inner.errors.add(1);
        self.warn(&e);
        Box::pin(std::future::ready(Err(e)))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The limit reported by a decision made without Redis: the first quota's.
fn limit_of(rule: &Rule) -> u32 {
    rule.quotas().first().map_or(0, |q| q.limit())
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

/// `<base>h`, the hash of the key's state under its limiter's name whatever the rule (every
/// strategy uses it, so a strategy change finds the old state), then for the moving window
/// `<base>m<i>`, one list per quota (the scripts derive the names of an old rule's lists the same
/// way).
fn redis_keys(base: &str, strategy: Strategy, quotas: usize) -> Vec<String> {
    let hash = format!("{base}h");
    if family(strategy) != Family::Moving {
        return vec![hash];
    }
    let mut names = Vec::with_capacity(1 + quotas);
    names.push(hash);
    names.extend((1..=quotas).map(|i| format!("{base}m{i}")));
    names
}

/// The strategy's code in the scripts (`convert.lua`), recorded with the state.
fn strategy_code(strategy: Strategy) -> u64 {
    match strategy {
        Strategy::FixedWindow => 1,
        Strategy::FixedWindowFirstHit => 2,
        Strategy::SlidingWindow => 3,
        Strategy::TokenBucket => 4,
        Strategy::LeakyBucket => 5,
        Strategy::MovingWindow => 6,
    }
}

/// The script's arguments for `rule`, checked against the 2^53 bound.
fn script_args(rule: &Rule, params: &[Params], op: Op, now_us: u64) -> Result<Vec<u64>, String> {
    let (code, cost, at_us) = match op {
        Op::Check(c) => (0, u64::from(c), 0),
        Op::Peek => (1, 0, 0),
        // The check's time came from the same clock (server time), in µs.
        Op::Settle { reserved, at, .. } => (2, u64::from(reserved), (at / 1000).max(1)),
        Op::Reset => (3, 0, 0),
        // The reservation's end from the same clock, in µs.
        Op::StepBack { cost, end } => (4, u64::from(cost), end / 1000),
    };
    let horizon = params
        .iter()
        .map(|p| horizon_ticks(rule.strategy(), p))
        .max()
        .unwrap_or(0);
    let ttl_ms = horizon.div_ceil(1000).saturating_add(TTL_SLACK_MS);
    let strategy = strategy_code(rule.strategy());
    let mut args = Vec::with_capacity(8 + 5 * params.len());
    args.extend([code, cost, now_us, ttl_ms, strategy, params.len() as u64]);
    for p in params {
        // Sums the scripts form (a start plus two windows, a TAT plus the depth) stay below 2^53.
        if p.window.saturating_mul(4) >= MAX_SAFE / 2 || p.tau().saturating_mul(4) >= MAX_SAFE / 2 {
            return Err(format!(
                "a quota of {} per {} µs exceeds what the Redis scripts compute exactly",
                p.limit, p.window
            ));
        }
        args.extend([p.limit, p.window, p.emission, p.burst, p.offset]);
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

/// A failed call's error: owned, it is kept as the [`StoreError`]'s cause; borrowed, a copy of its
/// kind and text is.
pub(super) trait RedisFailure {
    fn error(&self) -> &RedisError;
    fn into_cause(self) -> RedisError;
}

impl RedisFailure for RedisError {
    fn error(&self) -> &RedisError {
        self
    }

    fn into_cause(self) -> RedisError {
        self
    }
}

impl RedisFailure for &RedisError {
    fn error(&self) -> &RedisError {
        self
    }

    fn into_cause(self) -> RedisError {
        RedisError::from((self.kind(), "Redis", self.to_string()))
    }
}

/// The [`StoreError`] of a failed call, with the Redis error as its cause.
pub(super) fn map_error(e: impl RedisFailure) -> StoreError {
    let kind = error_kind(e.error());
    let message = e.error().to_string();
    StoreError::new(kind, message).with_source(e.into_cause())
}

/// The class of a failed call's error.
fn error_kind(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
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
    }
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
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_decode(v: &Value, quotas: usize) -> Result<Decision, StoreError> {
    decode(v, quotas)
}

/// The Redis keys of `key` under `prefix`, for the fuzz targets (`crate::fuzzing`).
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_key_names<K: StoreKey>(
    prefix: &str,
    key: &K,
    strategy: Strategy,
    tag: u64,
    quotas: usize,
) -> Vec<String> {
    redis_keys(&keys::base_key(prefix, key, tag), strategy, quotas)
}

impl<K: StoreKey> Store<K> for RedisStore {
    type Future = RedisFuture;

    fn apply(&self, key: &K, scope: Scope<'_>, op: Op, now: u64) -> Answer<RedisFuture> {
        self.lease_or_apply(key, scope, op, now)
    }

    /// One script call when the items' keys share a slot (see `multi.rs`), else the two-phase
    /// protocol.
    fn apply_all<'a>(
        &'a self,
        items: &'a [super::Item<'a, K, Self>],
        now: u64,
    ) -> super::AllAnswer<'a>
    where
        K: Sync,
    {
        self.apply_all_on_redis(items, now)
    }

    fn validate(&self, rule: &Rule) -> Result<(), ConfigError> {
        rule.params_in(TICK_NANOS)?;
        self.validate_leasing(rule)
    }

    fn tick(&self) -> Duration {
        Duration::from_nanos(TICK_NANOS)
    }

    fn names(&self) -> &LimiterNames {
        &self.inner.names
    }

    fn stats(&self) -> Stats {
        self.stats_now()
    }
}

impl RedisStore {
    /// Applies `op` to the state under a key's base name ([`keys::base_key`]: the key and the
    /// limiter's name); `tag` keeps the local fallback's state of other rules apart.
    fn apply_base(&self, base: String, rule: &Rule, tag: u64, op: Op, now: u64) -> RedisFuture {
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
        let redis_keys = redis_keys(&base, rule.strategy(), params.len());
        let fingerprint = Self::fingerprint(&redis_keys, &args, params.len());
        let cache_key = self.inner.cache.as_ref().map(|_| fingerprint);
        // Only costs every quota could ever admit are answered from the cache: a larger one is
        // `Exceeds`, which only Redis's answer tells apart from a rejection.
        let cacheable = matches!(op, Op::Check(c) if c > 0
            && params.iter().all(|p| u64::from(c) <= p.limit.min(p.burst.max(1))));
        if let Some(cache) = &self.inner.cache {
            if cacheable {
                if let Some(d) = cache.get(fingerprint, Instant::now()) {
                    self.inner.rejected.add(1);
                    return Box::pin(std::future::ready(Ok(d)));
                }
            }
            if matches!(op, Op::Settle { .. } | Op::Reset | Op::StepBack { .. }) {
                cache.remove(fingerprint);
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
        let quotas = params.len();
        let local = self.inner.local.as_ref().map(|_| (base, rule.clone()));
        let limit = limit_of(rule);
        // A late reply: counted if Redis admitted the check; admitted by Redis after the check was
        // answered "shed" (a 429): the quota is given back, at the check's own time (windows
        // since moved on are left alone).
        let refund: Option<send::Refund> = match op {
            Op::Check(c) => {
                let (rule, store) = (rule.clone(), self.clone());
                Some(Box::new(move |v: &Value, shed: bool| {
                    let d = decode(v, quotas).ok().filter(Decision::is_allowed)?;
                    store.inner.late_admitted.add(1);
                    let settle = Op::Settle {
                        reserved: c,
                        actual: 0,
                        at: d.time,
                        bound: 0,
                    };
                    script_args(&rule, &params, settle, 0).ok().filter(|_| shed)
                }))
            }
            _ => None,
        };
        let store = self.clone();
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let script = send::Script {
            keys: redis_keys,
            args,
            sha,
            src,
        };
        let sheddable = matches!(op, Op::Check(_));
        // Checks go through their key's lane (`lanes.rs`); settlements, resets and peeks do not
        // (they are never shed), nor checks while the breaker is open or there is no connection
        // (the failure policy answers them at once).
        let down = self.inner.breaker.is_open() || self.inner.conn.read().is_none();
        let place = (sheddable && !down).then(|| self.inner.lanes.enter(fingerprint));
        let lane_of_key = place.as_ref().and_then(lanes::Place::lane);
        let removals = self.inner.cache.as_ref().map_or(0, |c| c.removals());
        Box::pin(async move {
            let inner = &store.inner;
            let outage = |e: StoreError| match &local {
                Some((base, rule)) => store.outage(base, cache_key, (rule, tag), op, now, e),
                None => store.outage_error(e),
            };
            let lane = match place {
                None => None,
                Some(place) => {
                    let turn = match place.try_admit() {
                        Some(p) => p,
                        None => {
                            let waited_from = inner.clock();
                            let Some(p) = place.admit(deadline).await else {
                                // The key's calls ahead got no reply: overload if Redis answers
                                // others, else an outage for the failure policy.
                                let since = waited_from.saturating_sub(nanos(SILENCE));
                                if inner.replied_since(since) {
                                    return Ok(store.shed(Shed::OwnKey, limit, now));
                                }
                                // A failure for the breaker like the calls' own timeouts.
                                inner.breaker.failure(false);
                                return outage(StoreError::new(
                                    StoreErrorKind::Timeout,
                                    format!("no reply from Redis within {:?}", inner.timeout),
                                ));
                            };
                            // The checks ahead were answered: if Redis found the key blocked, so
                            // is this one, without a call.
                            let cached = inner.cache.as_ref().filter(|_| cacheable);
                            if let Some(d) = cached.and_then(|c| c.get(fingerprint, Instant::now()))
                            {
                                inner.rejected.add(1);
                                return Ok(d);
                            }
                            p
                        }
                    };
                    Some(place.into_slot(turn))
                }
            };
            let v = match store
                .send_script(script, deadline, sheddable, refund, lane)
                .await
            {
                Ok(v) => v,
                Err(send::NoReply::Overload(why)) => return Ok(store.shed(why, limit, now)),
                Err(send::NoReply::Outage(e)) => return outage(e),
                // Counted and warned about by `send_script`; the caller's error (the estimate
                // stands), neither an outage nor a local decision.
                Err(send::NoReply::Late(e)) => return Err(e),
            };
            let d = match decode(&v, quotas) {
                Ok(d) => d.answering(op),
                Err(e) => return outage(e),
            };
            if let Op::Check(c) = op {
                if d.is_allowed() {
                    inner.allowed.add(1);
                } else {
                    inner.rejected.add(1);
                }
                if let Some(lane) = &lane_of_key {
                    if d.is_allowed() {
                        lane.admitted(d.remaining());
                    } else {
                        lane.narrow();
                    }
                }
                if let (Some(cache), Some(ck)) = (&inner.cache, cache_key) {
                    if c == 1 && d.outcome() == Outcome::Rejected {
                        cache.insert_unless_removed(ck, d, Instant::now(), removals);
                    }
                }
            }
            Ok(d)
        })
    }

    /// A logical key under its rule, for the blocked-key cache and the key's lane: its Redis keys
    /// and the rule's part of the arguments only (not the op's time or units), so a settlement or
    /// reset finds the entry its key's check cached.
    fn fingerprint(redis_keys: &[String], args: &[u64], quotas: usize) -> u64 {
        let rule_args = args.get(4..6 + 4 * quotas).unwrap_or_default();
        cache::fingerprint(redis_keys, rule_args)
    }

    /// The blocked-key cache's key ([`fingerprint`](Self::fingerprint)); `None` without a cache.
    fn cache_key(&self, redis_keys: &[String], args: &[u64], quotas: usize) -> Option<u64> {
        self.inner
            .cache
            .as_ref()
            .map(|_| Self::fingerprint(redis_keys, args, quotas))
    }

    fn stats_now(&self) -> Stats {
        Stats {
            allowed: self.inner.allowed.get(),
            rejected: self.inner.rejected.get(),
            store_errors: self.inner.errors.get(),
            breaker_open: self.inner.breaker.is_open(),
            store_down: self.inner.breaker.is_open() || self.inner.conn.read().is_none(),
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
