//! Errors: configuration mistakes (found when a limiter is built) and store failures (per call).

use std::fmt;
use std::time::Duration;

use crate::quota::{ParseQuotaError, Quota};
use crate::strategy::Strategy;

/// A rule or limiter that cannot be built. Found at build time, never per request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A rule needs at least one quota.
    NoQuota,
    /// More quotas in one rule than the limit (16).
    TooManyQuotas(usize),
    /// A quota's text did not parse.
    Parse(ParseQuotaError),
    /// For the bucket strategies, `period / limit` must be at least one tick of the store's clock
    /// (1 ns in memory, 1 µs on Redis).
    IntervalBelowResolution {
        /// The quota.
        quota: Quota,
        /// The store's tick.
        tick: Duration,
    },
    /// The moving window keeps one timestamp per unit: its limit is capped at
    /// [`MAX_MOVING_WINDOW_LIMIT`](crate::MAX_MOVING_WINDOW_LIMIT).
    MovingWindowLimitTooLarge(Quota),
    /// `burst * period / limit` exceeds the longest period a quota may have.
    BurstTooLarge(Quota),
    /// A store setting is invalid (the message says which).
    Store(String),
    /// A limiter name must match `[A-Za-z0-9_.-]{1,64}`.
    InvalidName(String),
    /// A limiter of this name already exists on the store.
    DuplicateName(String),
    /// A shaping queue cannot be set up as asked (the message says why).
    Queue(String),
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
                crate::MAX_MOVING_WINDOW_LIMIT
            ),
            Self::BurstTooLarge(q) => write!(
                f,
                "quota {q}: burst {} makes the bucket deeper than allowed",
                q.burst()
            ),
            Self::Store(msg) => write!(f, "store configuration: {msg}"),
            Self::Queue(msg) => write!(f, "queue: {msg}"),
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

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Parse(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ParseQuotaError> for ConfigError {
    fn from(e: ParseQuotaError) -> Self {
        Self::Parse(e)
    }
}

/// A store could not decide (Redis down, a timeout, a bad reply). The layer applies its failure
/// policy: fail open (default) or fail closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
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
    /// The store answered with an error (out of memory, wrong type, a script error).
    Server,
    /// The store's reply did not have the expected shape.
    BadReply,
    /// The call was refused locally (misconfiguration found at run time).
    Other,
}

impl StoreError {
    /// A new error of `kind` with a message for logs.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The class of error.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Server => "server error",
            StoreErrorKind::BadReply => "bad reply",
            StoreErrorKind::Other => "error",
        };
        write!(f, "rate-limit store {kind}: {}", self.message)
    }
}

impl std::error::Error for StoreError {}
