//! [`Core`]: what a [`RateLimitLayer`](super::RateLimitLayer) shares with its services and their
//! futures, as one value: the [`Options`] (limiter, header settings, policies, counters) and the
//! rejection hook, so that a type-changing setter moves two fields, not a dozen.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use http::StatusCode;

use super::response::{FailurePolicy, HeaderConfig};
use super::settle::SettleFrom;
use crate::clock::Clock;
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::store::{Store, StoreKey};

/// How a request that cannot pass now waits.
#[derive(Clone, Debug)]
pub(crate) enum Pacing {
    /// Sleeps for the wait the rejection names, then checks again; up to this long in total.
    Sleep(Duration),
    /// A shaping queue: every request is admitted under `rule` (the limiter's quota with a depth
    /// of the maximum wait) and leaves at its reserved departure, `emission` nanoseconds apart.
    Queue { rule: Arc<Rule>, emission: u64 },
}

/// What happens to a request whose key cannot be extracted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MissingKey<K> {
    /// Answer with this status (400 by default), text/plain.
    Reject(StatusCode),
    /// Count it under this shared key.
    Fallback(K),
}

/// The layer's settings whose types do not change with its hooks, and the counters its services
/// share.
pub(crate) struct Options<K, St, C> {
    pub(crate) limiter: RateLimiter<K, St, C>,
    pub(crate) headers: HeaderConfig,
    pub(crate) failure: FailurePolicy,
    pub(crate) missing: MissingKey<K>,
    pub(crate) pacing: Option<Pacing>,
    pub(crate) log_keys: bool,
    pub(crate) settle: Option<SettleFrom>,
    /// Requests waiting in pacing or queue mode now.
    pub(crate) waiting: Arc<AtomicUsize>,
    pub(crate) last_warn: Arc<crate::throttle::Throttle>,
    pub(crate) missing_keys: Arc<AtomicU64>,
    pub(crate) settle_warned: Arc<AtomicBool>,
    /// The metric handles of the limiter (its name is the `limit` label).
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Arc<crate::metrics::LimitMetrics>,
}

impl<K: StoreKey, St: Store<K>, C: Clock> Options<K, St, C> {
    /// The defaults for `limiter`: headers for its rule named after it, fail open, 400 without a
    /// key, no pacing.
    pub(crate) fn new(limiter: RateLimiter<K, St, C>) -> Self {
        let mut headers = HeaderConfig::for_rule(limiter.rule());
        headers.policy_name = Arc::from(limiter.name());
        Self {
            #[cfg(feature = "metrics")]
            metrics: Arc::new(crate::metrics::LimitMetrics::new(limiter.name())),
            headers,
            limiter,
            failure: FailurePolicy::default(),
            missing: MissingKey::Reject(StatusCode::BAD_REQUEST),
            pacing: None,
            log_keys: false,
            settle: None,
            waiting: Arc::default(),
            last_warn: Arc::default(),
            missing_keys: Arc::default(),
            settle_warned: Arc::default(),
        }
    }
}

impl<K, St, C> Options<K, St, C> {
    /// Counts a decision of the store in the metrics: `units` spent if it was admitted.
    #[inline]
    pub(crate) fn count_decided(&self, d: &crate::Decision, units: u32) {
        #[cfg(feature = "metrics")]
        self.metrics.decided(d, units);
        #[cfg(not(feature = "metrics"))]
        let _ = (d, units);
    }

    /// Counts a request without a usable key that was answered (not a fallback key).
    pub(crate) fn count_no_key(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.no_key.increment(1);
    }

    /// Counts a failed store call.
    pub(crate) fn count_store_error(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.store_errors.increment(1);
    }

    /// Counts a request answered by the failure policy (503 when closed, passed when open).
    pub(crate) fn count_failure(&self, closed: bool) {
        #[cfg(feature = "metrics")]
        if closed {
            self.metrics.fail_closed.increment(1);
        } else {
            self.metrics.fail_open.increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = closed;
    }

    /// Records how long a decision that was not ready at once took (remote stores).
    pub(crate) fn time_store(&self, asked: std::time::Instant) {
        #[cfg(feature = "metrics")]
        self.metrics
            .store_latency
            .record(asked.elapsed().as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = asked;
    }

    /// The queue's rule, in queue mode.
    pub(crate) fn queue_rule(&self) -> Option<Arc<Rule>> {
        match &self.pacing {
            Some(Pacing::Queue { rule, .. }) => Some(Arc::clone(rule)),
            _ => None,
        }
    }
}

impl<K: Clone, St, C> Clone for Options<K, St, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            headers: self.headers.clone(),
            failure: self.failure,
            missing: self.missing.clone(),
            pacing: self.pacing.clone(),
            log_keys: self.log_keys,
            settle: self.settle.clone(),
            waiting: Arc::clone(&self.waiting),
            last_warn: Arc::clone(&self.last_warn),
            missing_keys: Arc::clone(&self.missing_keys),
            settle_warned: Arc::clone(&self.settle_warned),
            #[cfg(feature = "metrics")]
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// Settings shared by a layer's services and their futures: the options and the rejection hook.
pub(crate) struct Core<K, St, C, R> {
    pub(crate) options: Options<K, St, C>,
    pub(crate) rejection: R,
}

impl<K: Clone, St, C, R: Clone> Clone for Core<K, St, C, R> {
    fn clone(&self) -> Self {
        Self {
            options: self.options.clone(),
            rejection: self.rejection.clone(),
        }
    }
}
