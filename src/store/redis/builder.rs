//! The options of a [`RedisStore`] and connecting at build time.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::Semaphore;

use super::breaker::Breaker;
use super::cache::BlockCache;
use super::connect::{connect, reconnect_in_background, report_unresolved, unreachable};
use super::degraded::Local;
use super::lanes::Lanes;
use super::quota_lease::{self, Leasing};
use super::scripts::Family;
use super::target::{Target, TargetKind};
use super::tls::{TlsFiles, read_pem};
use super::{Inner, RedisStore, keys, rebuild, resolve};
use crate::error::{BuildError, ConfigError};
use crate::stats::Counter;
use crate::store::LimiterNames;

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
    /// times out is an error ([`StoreErrorKind::Timeout`](crate::error::StoreErrorKind::Timeout)) and is never retried: Redis may already
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
    /// in [`RedisCounters::shed`](super::RedisCounters::shed)), never admitted, when Redis is answering other calls (overload),
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
    /// rate-limit headers and are counted in [`RedisCounters::local_allowed`](super::RedisCounters::local_allowed) and
    /// [`RedisCounters::local_rejected`](super::RedisCounters::local_rejected). Off by default (the layer's policy decides; fail-open by
    /// default).
    pub fn local_fallback(mut self, instances: u32) -> Self {
        self.local_fallback = Some(NonZeroU32::new(instances).unwrap_or(NonZeroU32::MIN));
        self
    }

    /// Quota leasing: an instance takes a slice of a hot key's quota from Redis in one call and
    /// decides locally against it, so a hot key costs one Redis call per lease instead of one per
    /// request. Offered for the fixed window (clock-aligned), the sliding window counter and the
    /// token bucket; [`Builder::build`](crate::Builder::build) refuses it for the other
    /// strategies with a [`ConfigError::Unleasable`] (its message says why). See [`Leasing`] for the sizes and
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
    /// cannot be used ([`ConfigError::RedisUrl`], also for a CA bundle or client certificate with
    /// a URL that is not a TLS one), a bad prefix ([`ConfigError::RedisPrefix`]), a TLS file that
    /// cannot be read or is not PEM ([`ConfigError::TlsFile`]).
    /// [`BuildError::Store`] when Redis answers and refuses: [`StoreErrorKind::Server`](crate::error::StoreErrorKind::Server) for a
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
        let store = RedisStore::of(Arc::new(Inner {
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
            settle_dropped: Counter::default(),
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
            estimates: Default::default(),
            rebuild,
        }));
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

impl RedisStore {
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
}
