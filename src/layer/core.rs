//! [`Core`]: what a [`RateLimitLayer`](super::RateLimitLayer) shares with its services and their
//! futures, as one value: the [`Options`] (limiter, header settings, policies, counters) and the
//! rejection hook.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::{Response, StatusCode};

use super::body::ResponseBody;
use super::response::{
    DefaultRejection, FailurePolicy, HeaderConfig, OnRejected, Refusal, Responder,
};
use super::settle::SettleFrom;
use crate::decision::Decision;
use crate::rule::Rule;

/// How a request that cannot pass now waits (set with [`Pacing`](super::Pacing)).
#[derive(Clone, Debug)]
pub(crate) enum Wait {
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

impl<K> Default for MissingKey<K> {
    fn default() -> Self {
        Self::Reject(StatusCode::BAD_REQUEST)
    }
}

/// The layer's settings besides its hooks, and the counters its services share.
pub struct Options<L> {
    pub(crate) limits: L,
    pub(crate) headers: HeaderConfig,
    pub(crate) failure: FailurePolicy,
    pub(crate) pacing: Option<Wait>,
    pub(crate) log_keys: bool,
    pub(crate) settle: Option<SettleFrom>,
    /// Requests waiting in pacing or queue mode now.
    pub(crate) waiting: Arc<AtomicUsize>,
    pub(crate) last_warn: Arc<crate::throttle::Throttle>,
    pub(crate) missing_keys: Arc<AtomicU64>,
    pub(crate) settle_warned: Arc<AtomicBool>,
    /// This layer's place in the count of live layers ([`LAYERS`]), shared by its clones and the
    /// services it makes.
    pub(crate) origin: Arc<Origin>,
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
            origin: Arc::new(LAYERS.enter()),
        }
    }

    /// The queue's rule, in queue mode.
    pub(crate) fn queue_rule(&self) -> Option<Arc<Rule>> {
        match &self.pacing {
            Some(Wait::Queue { rule, .. }) => Some(Arc::clone(rule)),
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
            origin: Arc::clone(&self.origin),
        }
    }
}

/// The rate-limit layers alive in the process ([`RateLimitLayer`](super::RateLimitLayer)s, a
/// rules file's included), each counted once with its clones and the services they made. An
/// allowed response reports the fields it carries to the layers around it
/// ([`Reported`](super::response::Reported), in its extensions: an extension map allocated and
/// freed, about 700 instructions a request) only when one may enclose it ([`Layers::report`]).
pub(crate) static LAYERS: Layers = Layers::new();

/// A count of live layers (see [`LAYERS`]).
#[derive(Debug)]
pub(crate) struct Layers(AtomicUsize);

impl Layers {
    pub(crate) const fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// Counts a new layer until the returned origin is dropped.
    pub(crate) fn enter(&'static self) -> Origin {
        self.0.fetch_add(1, Ordering::Relaxed);
        Origin(self)
    }

    /// Whether another layer lives besides one's own, and so may enclose it. A layer made before
    /// a request was handed to the service is seen: the request's way to the service orders it
    /// after the count.
    #[inline]
    pub(crate) fn several(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 1
    }

    /// Whether an allowed response reports its fields for an enclosing layer: one encloses it
    /// (`enclosed`: the request carries an enclosing layer's count marker, e.g. a clone of the
    /// same layer with a rule of its own) or may (another layer lives: a middleware between the
    /// two may have rebuilt the request without its marker).
    #[inline]
    pub(crate) fn report(&self, enclosed: bool) -> bool {
        enclosed || self.several()
    }
}

/// One layer's place in a [`Layers`] count, given back when dropped.
#[derive(Debug)]
pub(crate) struct Origin(&'static Layers);

impl Drop for Origin {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Settings shared by a layer's services and their futures: the options and the rejection hook.
pub(crate) struct Core<L> {
    pub(crate) options: Options<L>,
    /// The hook building the layer's own answers; `None`: the default text/plain ones, built
    /// directly in the service's body type.
    pub(crate) rejection: Option<Arc<dyn Responder>>,
}

impl<L: Clone> Clone for Core<L> {
    fn clone(&self) -> Self {
        Self {
            options: self.options.clone(),
            rejection: self.rejection.clone(),
        }
    }
}

impl<L> Core<L> {
    /// The `429` for `d`; `violated` names the rejecting quota's items (asked only of a hook).
    #[inline]
    pub(crate) fn rejected<'a, B>(
        &self,
        d: &Decision,
        violated: impl FnOnce() -> Cow<'a, str>,
    ) -> Response<ResponseBody<B>> {
        match &self.rejection {
            None => DefaultRejection.on_rejected(d),
            Some(hook) => hook.rejected(d, &[&violated()]).map(ResponseBody::cast),
        }
    }

    /// The answer to `refusal` (no key, the store failed while failing closed).
    pub(crate) fn refused<B>(&self, refusal: Refusal<'_>) -> Response<ResponseBody<B>> {
        match &self.rejection {
            None => DefaultRejection.on_refused(refusal),
            Some(hook) => hook.refused(refusal).map(ResponseBody::cast),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_counted_while_they_live() {
        // A count of its own: the process-wide one moves with every other test's layers.
        static COUNT: Layers = Layers::new();
        assert!(!COUNT.several());
        let one = Arc::new(COUNT.enter());
        // A layer's clones and the services it made share its origin: still one.
        let clone = Arc::clone(&one);
        assert!(!COUNT.several());
        let two = COUNT.enter();
        assert!(COUNT.several());
        drop(two);
        assert!(!COUNT.several());
        drop((one, clone));
        assert_eq!(COUNT.0.load(Ordering::Relaxed), 0);
    }
}
