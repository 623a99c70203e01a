//! [`Core`]: what a [`RateLimitLayer`](super::RateLimitLayer) shares with its services and their
//! futures, as one value: the [`Options`] (limiter, header settings, policies, counters) and the
//! rejection hook, so that a type-changing setter moves two fields, not a dozen.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use http::StatusCode;

use super::response::{FailurePolicy, HeaderConfig};
use super::settle::SettleFrom;
use crate::rule::Rule;

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
pub struct Options<L> {
    pub(crate) limits: L,
    pub(crate) headers: HeaderConfig,
    pub(crate) failure: FailurePolicy,
    pub(crate) pacing: Option<Pacing>,
    pub(crate) log_keys: bool,
    pub(crate) settle: Option<SettleFrom>,
    /// Requests waiting in pacing or queue mode now.
    pub(crate) waiting: Arc<AtomicUsize>,
    pub(crate) last_warn: Arc<crate::throttle::Throttle>,
    pub(crate) missing_keys: Arc<AtomicU64>,
    pub(crate) settle_warned: Arc<AtomicBool>,
}

impl<L> Options<L> {
    /// The defaults for `limits` with `headers`: fail open, no pacing.
    pub(crate) fn with_limits(limits: L, headers: HeaderConfig) -> Self {
        Self {
            limits,
            headers,
            failure: FailurePolicy::default(),
            pacing: None,
            log_keys: false,
            settle: None,
            waiting: Arc::default(),
            last_warn: Arc::default(),
            missing_keys: Arc::default(),
            settle_warned: Arc::default(),
        }
    }

    /// The queue's rule, in queue mode.
    pub(crate) fn queue_rule(&self) -> Option<Arc<Rule>> {
        match &self.pacing {
            Some(Pacing::Queue { rule, .. }) => Some(Arc::clone(rule)),
            _ => None,
        }
    }
}

impl<L: Clone> Clone for Options<L> {
    fn clone(&self) -> Self {
        Self {
            limits: self.limits.clone(),
            headers: self.headers.clone(),
            failure: self.failure,
            pacing: self.pacing.clone(),
            log_keys: self.log_keys,
            settle: self.settle.clone(),
            waiting: Arc::clone(&self.waiting),
            last_warn: Arc::clone(&self.last_warn),
            missing_keys: Arc::clone(&self.missing_keys),
            settle_warned: Arc::clone(&self.settle_warned),
        }
    }
}

/// Settings shared by a layer's services and their futures: the options and the rejection hook.
pub(crate) struct Core<L, R> {
    pub(crate) options: Options<L>,
    pub(crate) rejection: R,
}

impl<L: Clone, R: Clone> Clone for Core<L, R> {
    fn clone(&self) -> Self {
        Self {
            options: self.options.clone(),
            rejection: self.rejection.clone(),
        }
    }
}

impl<L: std::fmt::Debug> std::fmt::Debug for Options<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("limits", &self.limits)
            .field("failure", &self.failure)
            .field("pacing", &self.pacing)
            .finish_non_exhaustive()
    }
}
