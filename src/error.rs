//! Errors: configuration mistakes (found when a limiter is built) and store failures (per call).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::quota::{ParseError, Quota};
use crate::strategy::Strategy;

/// A rule or limiter that cannot be built. Found at build time, never per request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// A rule needs at least one quota.
    NoQuota,
    /// More quotas in one rule than the limit (16).
    TooManyQuotas(usize),
    /// A quota's text did not parse.
    Parse(ParseError),
    /// For the bucket strategies, `period / limit` must be at least one tick of the store's clock
    /// (1 ns in memory, 1 µs on Redis).
    IntervalBelowResolution {
        /// The quota.
        quota: Quota,
        /// The store's tick.
        tick: Duration,
    },
    /// The moving window keeps one timestamp per unit: its limit is capped at
    /// [`Rule::MAX_MOVING_WINDOW_LIMIT`](crate::Rule::MAX_MOVING_WINDOW_LIMIT).
    MovingWindowLimitTooLarge(Quota),
    /// `burst * period / limit` exceeds the longest period a quota may have.
    BurstTooLarge(Quota),
    /// A store refuses a rule or a setting: what a custom
    /// [`Store::validate`](crate::store::Store::validate) answers, with the store's own error
    /// (also the [`source`](std::error::Error::source), for `downcast_ref`). Made with
    /// [`ConfigError::store`].
    Store(Arc<dyn std::error::Error + Send + Sync + 'static>),
    /// The Redis store leases quotas (feature `redis`, `RedisStoreBuilder::leases`), and leasing
    /// cannot bound this strategy (unless `Leasing::skip_unleasable` checks such rules unleased):
    /// the message says why.
    Unleasable(Strategy),
    /// The Redis store's connection URL cannot be used: the URL as given (any password masked as
    /// `***`) and why.
    RedisUrl {
        /// The URL, its password masked.
        url: String,
        /// What is wrong with it.
        problem: UrlProblem,
    },
    /// The Redis store's key prefix is longer than 64 bytes or holds a brace (`{` or `}`), which
    /// would change the Cluster hash tag of every key.
    RedisPrefix(String),
    /// A TLS file given to the Redis store cannot be used.
    TlsFile {
        /// Which option: `"CA bundle"`, `"client certificate"` or `"client key"`.
        role: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        problem: TlsFileProblem,
    },
    /// A limiter name must match `[A-Za-z0-9_.-]{1,64}`.
    InvalidName(String),
    /// A limiter of this name already exists on the store.
    DuplicateName(String),
    /// A shaping queue drains a leaky bucket: the limiter's rule has this other strategy.
    QueueNeedsLeakyBucket(Strategy),
    /// A shaping queue drains one quota: the limiter's rule has this many.
    QueueNeedsOneQuota(usize),
    /// A shaping queue's longest wait is shorter than one interval of its quota
    /// (`period / limit`): no request could ever wait for its turn.
    QueueWaitTooShort {
        /// The longest wait asked for.
        max_wait: Duration,
        /// One interval of the quota.
        interval: Duration,
    },
    /// A rules file's layer takes no shaping queue: the file sets one per limit (`queue_ms`).
    QueueInRulesFile,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoQuota => f.write_str("a rule needs at least one quota"),
            Self::TooManyQuotas(n) => write!(
                f,
                "{n} quotas in one rule (at most {})",
                crate::rule::MAX_QUOTAS
            ),
            Self::Parse(e) => e.fmt(f),
            Self::IntervalBelowResolution { quota, tick } => write!(
                f,
                "quota {quota}: period / limit is below one tick ({tick:?}) of the store's clock, \
                 which the {} and {} cannot represent",
                Strategy::TokenBucket,
                Strategy::LeakyBucket
            ),
            Self::MovingWindowLimitTooLarge(q) => write!(
                f,
                "quota {q}: the moving window keeps one timestamp per request, so its limit is capped at {}",
                crate::strategy::MAX_MOVING_WINDOW_LIMIT
            ),
            Self::BurstTooLarge(q) => write!(
                f,
                "quota {q}: burst {} makes the bucket deeper than allowed",
                q.burst()
            ),
            Self::Store(e) => write!(f, "store configuration: {e}"),
            Self::Unleasable(s) => write!(
                f,
                "quota leasing is not offered for the {s} strategy: {}; use fixed-window, \
                 sliding-window or token-bucket, or a Redis store without leases",
                lease_refusal(*s).unwrap_or("leasing cannot bound it")
            ),
            Self::RedisUrl { url, problem } => write!(f, "Redis URL {url}: {problem}"),
            Self::RedisPrefix(prefix) => {
                if prefix.contains(['{', '}']) {
                    write!(
                        f,
                        "Redis key prefix {prefix:?} contains a brace, which would change the \
                         Cluster hash tag of every key"
                    )
                } else {
                    write!(
                        f,
                        "Redis key prefix is {} bytes long (at most 64)",
                        prefix.len()
                    )
                }
            }
            Self::TlsFile {
                role,
                path,
                problem,
            } => write!(f, "Redis TLS {role} {}: {problem}", path.display()),
            Self::QueueNeedsLeakyBucket(s) => write!(
                f,
                "queue: a queue needs the {} strategy, not {s}",
                Strategy::LeakyBucket
            ),
            Self::QueueNeedsOneQuota(n) => write!(
                f,
                "queue: a queue drains one quota, not {n}: give the limiter exactly one"
            ),
            Self::QueueWaitTooShort { max_wait, interval } => write!(
                f,
                "queue: the maximum wait {max_wait:?} is shorter than one interval ({interval:?}) \
                 of the quota"
            ),
            Self::QueueInRulesFile => f.write_str(
                "queue: a rules file's layer takes no queue; give each limit its own (`queue_ms`)",
            ),
            Self::InvalidName(name) => write!(
                f,
                "limiter name {name:?}: use 1 to 64 characters among A-Z a-z 0-9 _ . -"
            ),
            Self::DuplicateName(name) => write!(
                f,
                "a limiter named {name:?} already exists on this store (names are unique per store)"
            ),
        }
    }
}

impl ConfigError {
    /// A store's refusal of a rule or a setting ([`ConfigError::Store`]), its cause `error`.
    pub fn store(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Store(Arc::new(error))
    }
}

/// Whether the Redis store's quota leasing can bound `strategy`, and why not
/// ([`ConfigError::Unleasable`]).
pub(crate) fn lease_refusal(strategy: Strategy) -> Option<&'static str> {
    match strategy {
        Strategy::FixedWindow | Strategy::SlidingWindow | Strategy::TokenBucket => None,
        Strategy::MovingWindow => Some(
            "the moving window stamps each unit with its own time, and a lease's units would all \
             carry the lease's time: they would leave the window before the requests they admit \
             do, so more than the limit could pass within one window",
        ),
        Strategy::FixedWindowFirstHit => Some(
            "a first-hit window opens at each key's first request as Redis saw it, so no instance \
             knows its end from the clock; leases are drawn only from windows fixed by the clock \
             and from buckets",
        ),
        Strategy::LeakyBucket => Some(
            "the leaky bucket meters an even outflow (and the shaping queue paces requests by its \
             waits); a lease lets one instance release its whole slice at once, the burst a leaky \
             bucket exists to prevent: use token-bucket for a leased bucket",
        ),
    }
}

impl PartialEq for ConfigError {
    /// Variant and fields equal; two [`Store`](Self::Store) refusals are equal when they are
    /// the same error or say the same.
    fn eq(&self, other: &Self) -> bool {
        use ConfigError as E;
        match (self, other) {
            (E::NoQuota, E::NoQuota) => true,
            (E::TooManyQuotas(a), E::TooManyQuotas(b))
            | (E::QueueNeedsOneQuota(a), E::QueueNeedsOneQuota(b)) => a == b,
            (E::Parse(a), E::Parse(b)) => a == b,
            (
                E::IntervalBelowResolution { quota: a, tick: x },
                E::IntervalBelowResolution { quota: b, tick: y },
            ) => a == b && x == y,
            (E::MovingWindowLimitTooLarge(a), E::MovingWindowLimitTooLarge(b))
            | (E::BurstTooLarge(a), E::BurstTooLarge(b)) => a == b,
            (E::Store(a), E::Store(b)) => Arc::ptr_eq(a, b) || a.to_string() == b.to_string(),
            (E::Unleasable(a), E::Unleasable(b))
            | (E::QueueNeedsLeakyBucket(a), E::QueueNeedsLeakyBucket(b)) => a == b,
            (E::RedisUrl { url: a, problem: x }, E::RedisUrl { url: b, problem: y }) => {
                a == b && x == y
            }
            (E::RedisPrefix(a), E::RedisPrefix(b))
            | (E::InvalidName(a), E::InvalidName(b))
            | (E::DuplicateName(a), E::DuplicateName(b)) => a == b,
            (
                E::TlsFile {
                    role: r1,
                    path: p1,
                    problem: x,
                },
                E::TlsFile {
                    role: r2,
                    path: p2,
                    problem: y,
                },
            ) => r1 == r2 && p1 == p2 && x == y,
            (
                E::QueueWaitTooShort {
                    max_wait: a,
                    interval: x,
                },
                E::QueueWaitTooShort {
                    max_wait: b,
                    interval: y,
                },
            ) => a == b && x == y,
            (E::QueueInRulesFile, E::QueueInRulesFile) => true,
            // Listed rather than `_`: a new variant does not compile until it has its arm above.
            (
                E::NoQuota
                | E::TooManyQuotas(_)
                | E::Parse(_)
                | E::IntervalBelowResolution { .. }
                | E::MovingWindowLimitTooLarge(_)
                | E::BurstTooLarge(_)
                | E::Store(_)
                | E::Unleasable(_)
                | E::RedisUrl { .. }
                | E::RedisPrefix(_)
                | E::TlsFile { .. }
                | E::InvalidName(_)
                | E::DuplicateName(_)
                | E::QueueNeedsLeakyBucket(_)
                | E::QueueNeedsOneQuota(_)
                | E::QueueWaitTooShort { .. }
                | E::QueueInRulesFile,
                _,
            ) => false,
        }
    }
}

impl Eq for ConfigError {}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Parse(e) => Some(e),
            Self::Store(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Why the Redis store's connection URL cannot be used ([`ConfigError::RedisUrl`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum UrlProblem {
    /// Not a Redis scheme: `redis://`, `rediss://`, `redis+unix://`, `redis+cluster://`,
    /// `rediss+cluster://`, `redis+sentinel://` or `rediss+sentinel://`.
    Scheme,
    /// A Cluster URL without a node.
    NoClusterNode,
    /// A Sentinel URL without a sentinel address.
    NoSentinel,
    /// A Sentinel URL's address (as given) without a port, or with a port that is not a number.
    SentinelAddress(String),
    /// A Sentinel URL without its service (`redis+sentinel://HOST:PORT/SERVICE[/DB]`), or with
    /// more after it.
    SentinelPath,
    /// A Sentinel URL's database (as given) that is not a number.
    Database(String),
    /// A CA bundle or client certificate was given for a URL that is not a TLS one (`rediss://`,
    /// `rediss+cluster://`, `rediss+sentinel://`).
    NotTls,
    /// The `redis` crate refuses the URL (or the TLS files with it): its error. Its message is
    /// shown with any password masked; it is not the error's
    /// [`source`](std::error::Error::source), which reporters print unmasked.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Refused(Arc<redis::RedisError>),
}

impl PartialEq for UrlProblem {
    /// Variant and fields equal; two refusals of the `redis` crate are equal when they say the
    /// same.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            #[cfg(feature = "redis")]
            (Self::Refused(a), Self::Refused(b)) => a.to_string() == b.to_string(),
            (Self::SentinelAddress(a), Self::SentinelAddress(b))
            | (Self::Database(a), Self::Database(b)) => a == b,
            // The variants without fields (those with fields differ here only across variants).
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

impl Eq for UrlProblem {}

impl fmt::Display for UrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Scheme => f.write_str(
                "expected redis://host:port, rediss://host:port, \
                 redis+cluster://host1:port1,host2:port2 or redis+sentinel://host:port/service",
            ),
            Self::NoClusterNode => f.write_str("no Cluster node given"),
            Self::NoSentinel => f.write_str("no sentinel address"),
            Self::SentinelAddress(a) => write!(f, "sentinel address {a:?} needs a numeric port"),
            Self::SentinelPath => {
                f.write_str("expected /SERVICE[/DB] (redis+sentinel://HOST:PORT/SERVICE)")
            }
            Self::Database(d) => write!(f, "bad database number {d:?}"),
            Self::NotTls => f.write_str(
                "a CA bundle or client certificate needs a TLS URL (rediss://, \
                 rediss+cluster://, rediss+sentinel://)",
            ),
            #[cfg(feature = "redis")]
            Self::Refused(e) => f.write_str(&crate::store::redis::redact(&e.to_string())),
        }
    }
}

/// Why a TLS file given to the Redis store cannot be used ([`ConfigError::TlsFile`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFileProblem {
    /// The file cannot be read (missing, a directory, no permission).
    Unreadable(std::io::ErrorKind),
    /// The file holds no PEM block (`-----BEGIN ...`).
    NotPem,
}

impl fmt::Display for TlsFileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable(kind) => write!(f, "cannot be read ({kind})"),
            Self::NotPem => f.write_str("not a PEM file"),
        }
    }
}

impl From<ParseError> for ConfigError {
    fn from(e: ParseError) -> Self {
        Self::Parse(e)
    }
}

/// A store could not decide (Redis down, a timeout, a bad reply). The layer applies its failure
/// policy: fail open (default) or fail closed.
///
/// Its [`message`](Self::message) is complete for logs (it includes the cause's text);
/// [`source`](std::error::Error::source) gives the cause itself when there is one (on Redis, the
/// `redis::RedisError`, for `downcast_ref`). Two errors are equal when their kind and message are.
#[derive(Clone, Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    /// The limiter whose decision failed, once a layer answered with this error.
    limiter: Option<Arc<str>>,
}

/// The class of a [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The call did not finish within the configured timeout. Its effect is unknown: it may have
    /// been counted, so it is never replayed.
    Timeout,
    /// No connection to the store.
    Connection,
    /// The store answered with an error (out of memory, wrong type, a script error, refused
    /// credentials).
    Server,
    /// The store's reply did not have the expected shape.
    BadReply,
    /// The call was refused locally (misconfiguration found at run time).
    Other,
    /// The rule given for this request (a per-request rule: [`RateLimiter::apply`] with a rule,
    /// the layer's `select_rule`) is one the store cannot honour ([`Store::validate`] refused
    /// it). A configuration error, not an outage: the layer refuses the request (503) whatever its
    /// failure policy, and the limiter counts it in [`Stats::invalid_rules`](crate::Stats).
    ///
    /// [`RateLimiter::apply`]: crate::RateLimiter::apply
    /// [`Store::validate`]: crate::store::Store::validate
    InvalidRule,
    /// A settlement of a reservation that another limiter, rule or key made
    /// ([`Reservation`](crate::Reservation) is bound to the check that made it): refused, nothing
    /// applied, counted in [`Stats::settle_refused`](crate::Stats).
    ForeignReservation,
}

impl StoreError {
    /// A new error of `kind` with a message for logs.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            limiter: None,
        }
    }

    /// This error with `source` as its cause ([`std::error::Error::source`]). The message should
    /// already say what the cause says: logs print the message only.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The class of error.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The name of the limiter whose decision failed (a rules file's limit), when a
    /// [`RateLimitLayer`](crate::layer::RateLimitLayer) answered with this error: the error in a
    /// `503`'s extensions and the one a rejection hook's
    /// [`Refusal::StoreFailed`](crate::layer::Refusal) carries name it. `None` for an error
    /// returned by a limiter's own methods. Not part of equality.
    pub fn limiter(&self) -> Option<&str> {
        self.limiter.as_deref()
    }

    /// This error naming `limiter` (see [`limiter`](Self::limiter)); a name already given stays.
    pub(crate) fn for_limiter(mut self, limiter: &str) -> Self {
        if self.limiter.is_none() {
            self.limiter = Some(Arc::from(limiter));
        }
        self
    }

    /// This error with `context` (e.g. the redacted URL) before its message; the cause is kept.
    #[cfg(feature = "redis")]
    pub(crate) fn in_context(mut self, context: &str) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for StoreError {}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Server => "server error",
            StoreErrorKind::BadReply => "bad reply",
            StoreErrorKind::Other => "error",
            StoreErrorKind::InvalidRule => "invalid rule",
            StoreErrorKind::ForeignReservation => "foreign reservation",
        };
        write!(f, "rate-limit store {kind}: {}", self.message)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Why a store that connects could not be built: a configuration mistake, found before any
/// connection ([`ConfigError`]: a bad URL, prefix or TLS file), or a store that answered and
/// refused ([`StoreError`]: wrong credentials, a TLS handshake refused).
///
/// An unreachable store is not a build error: it connects in the background.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The settings cannot work, whatever the server.
    Config(ConfigError),
    /// The server answered and refused.
    Store(StoreError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => e.fmt(f),
            Self::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => e.source(),
            Self::Store(e) => e.source(),
        }
    }
}

impl From<ConfigError> for BuildError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

impl From<StoreError> for BuildError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}
