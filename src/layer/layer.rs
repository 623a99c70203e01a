//! [`RateLimitLayer`] and its configuration.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use super::body::ResponseBody;
use super::config::{Headers, KeyPolicy, LayerStats, Pacing};
use super::core::{Core, Options, Wait};
use super::hooks::Hooks;
use super::limits::{LayerKey, Limits, OneLimiter, Source};
use super::response::{FailurePolicy, HeaderConfig, OnRejected, Reply, Replying, Responding};
use super::service::RateLimitService;
use super::settle::SettleFrom;
use crate::clock::{Clock, SystemClock};
use crate::key::KeyExtractor;
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::store::{MemoryStore, Store};

/// A shaping queue of `max_wait` on `quota`: the quota with a burst of the queue's depth
/// (`max_wait / T + 1` places, `T = period / limit`), and `T` in nanoseconds; `Err(T)` when
/// `max_wait` is shorter than `T`.
pub(crate) fn queue_quota(
    quota: &crate::Quota,
    max_wait: Duration,
) -> Result<(crate::Quota, u64), u64> {
    let emission = quota
        .period_nanos()
        .div_ceil(u64::from(quota.limit()))
        .max(1);
    let max_nanos = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
    let slots = max_nanos / emission;
    if slots == 0 {
        return Err(emission);
    }
    // Admitted when max(TAT, now) - now + T <= B x T: a departure at most (B - 1) x T away.
    let depth = u32::try_from(slots.saturating_add(1)).unwrap_or(u32::MAX);
    let depth = std::num::NonZeroU32::new(depth).unwrap_or(std::num::NonZeroU32::MIN);
    Ok((quota.with_burst(depth), emission))
}

/// `nanos` rounded up to whole ticks of a store's clock: a queue's interval as the store counts it
/// (Redis: `T = ceil(period / limit)` in microseconds), so that the wait it derives from a
/// decision is zero on an empty queue.
pub(crate) fn in_ticks(nanos: u64, tick: Duration) -> u64 {
    let tick = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
    nanos.div_ceil(tick).saturating_mul(tick)
}

/// Applies a [`RateLimiter`] to every request of the services it wraps. See the
/// [module docs](crate::layer) for the behaviour, and the [headers chapter](crate::guide::headers)
/// of the guide for an axum example.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::Full;
/// use tollgate::{ManualClock, RateLimiter, Strategy};
/// use tollgate::key::HeaderKey;
/// use tollgate::layer::RateLimitLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// let limiter = RateLimiter::builder()
///     .strategy(Strategy::TokenBucket)
///     .quotas("1/second").unwrap()
///     .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
///     .build()
///     .unwrap();
/// let svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")))
///     .service(service_fn(|_req: Request<Full<Bytes>>| async {
///         Ok::<_, Infallible>(Response::new(Full::<Bytes>::from("hello")))
///     }));
/// let req = || Request::get("/").header("x-api-key", "k1").body(Full::<Bytes>::default()).unwrap();
/// let res = svc.clone().oneshot(req()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::OK);
/// assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
/// assert_eq!(res.headers()["x-ratelimit-reset"], "1");
/// let res = svc.clone().oneshot(req()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(res.headers()["retry-after"], "1");
/// assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
/// let no_key = Request::get("/").body(Full::<Bytes>::default()).unwrap();
/// assert_eq!(svc.oneshot(no_key).await.unwrap().status(), StatusCode::BAD_REQUEST);
/// # }
/// ```
///
/// Type parameters: the key extractor `X` (or a rules file's source), the limiter's store `St`
/// and clock `C`: the hooks (cost, rule, skip, rejection) are not part of the type, so a
/// configured layer can be named as `RateLimitLayer<PeerIp>` (memory store, system clock). Cheap
/// to clone.
///
/// ```
/// use axum::{Json, http::StatusCode};
/// use tollgate::{RateLimiter, key::PeerIp, layer::RateLimitLayer};
///
/// fn limit() -> RateLimitLayer<PeerIp> {
///     let limiter = RateLimiter::builder().quotas("100/minute").unwrap().build().unwrap();
///     RateLimitLayer::new(limiter, PeerIp::default())
///         .cost(|parts| if parts.method == http::Method::POST { 5 } else { 1 })
///         .skip(|parts| parts.uri.path() == "/health")
///         .on_rejected(|d| {
///             let wait = d.retry_after_secs().unwrap_or(0);
///             (StatusCode::TOO_MANY_REQUESTS, Json(format!("retry in {wait} s")))
///         })
/// }
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "ok" }))
///     .layer(limit());
/// # let _ = app;
/// ```
#[must_use]
pub struct RateLimitLayer<X: Source<St, C>, St = MemoryStore<<X as LayerKey>::Key>, C = SystemClock>
{
    pub(crate) core: Core<X::Limits>,
    pub(crate) hooks: Hooks<X>,
}

impl<X, St, C> Clone for RateLimitLayer<X, St, C>
where
    X: Source<St, C> + Clone,
{
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
            hooks: self.hooks.clone(),
        }
    }
}

impl<X, St, C> fmt::Debug for RateLimitLayer<X, St, C>
where
    X: Source<St, C> + fmt::Debug,
    X::Limits: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.core.options.limits)
            .field("headers", &self.core.options.headers)
            .field("failure", &self.core.options.failure)
            .field("pacing", &self.core.options.pacing)
            .field("hooks", &self.hooks)
            .field(
                "rejection",
                &if self.core.rejection.is_some() {
                    "<fn>"
                } else {
                    "default"
                },
            )
            .finish()
    }
}

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock> RateLimitLayer<X, St, C> {
    /// Limits requests with `limiter`, keyed by `key`.
    pub fn new(limiter: RateLimiter<X::Key, St, C>, key: X) -> Self {
        let mut headers = HeaderConfig::for_rule(limiter.rule());
        headers.policy_name = Arc::from(limiter.name());
        Self::from_limits(OneLimiter::new(limiter), key, headers)
    }

    /// What to do with keys (see [`KeyPolicy`]): the answer to a request without a usable key
    /// (default `400`, text/plain; or a shared fallback key), and whether `tracing` events name
    /// keys (default not). Each call sets the whole policy: what `policy` leaves unset is the
    /// default, not what an earlier call set.
    pub fn keys(mut self, policy: KeyPolicy<X::Key>) -> Self {
        self.hooks.missing = policy.missing;
        self.core.options.log_keys = policy.log;
        self
    }

    /// Computes each request's cost from its head (default 1; 0 is a peek: the request passes and
    /// consumes nothing).
    ///
    /// ```
    /// use tollgate::{RateLimiter, key::GlobalKey, layer::RateLimitLayer};
    ///
    /// let limiter = RateLimiter::builder().quotas("1000/minute").unwrap().build().unwrap();
    /// let layer = RateLimitLayer::new(limiter, GlobalKey)
    ///     .cost(|parts| if parts.uri.path().starts_with("/search") { 10 } else { 1 })
    ///     .select_rule(|_parts| None)
    ///     .skip(|parts| parts.method == http::Method::OPTIONS);
    /// # let _ = layer;
    /// ```
    pub fn cost<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.hooks.cost = Some(Arc::new(f));
        self
    }

    /// Chooses each request's rule from its head (tiers by plan); `None` keeps the limiter's
    /// rule. A key's state follows the rule it is checked under: give each tier its own keys
    /// (e.g. key by user id, one plan per user) or the tiers share counters.
    pub fn select_rule<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Arc<Rule>> + Send + Sync + 'static,
    {
        self.hooks.rule = Some(Arc::new(f));
        self
    }

    /// Settles each request's reservation from its response (a header, an extension, the body's
    /// end; see [`SettleFrom`]): the request is admitted on its estimate ([`cost`](Self::cost),
    /// at least 1 here) and then charged what the response reports. Stacked layers configured with
    /// the same source each settle their own reservation from it.
    ///
    /// ```
    /// use tollgate::{RateLimiter, key::HeaderKey, layer::{RateLimitLayer, SettleFrom}};
    ///
    /// // An LLM gateway: 100 000 tokens an hour per API key, each call charged the tokens its
    /// // backend reports in `x-tokens-used`, admitted on an estimate of 500.
    /// let limiter = RateLimiter::builder().quotas("100000/hour").unwrap().build().unwrap();
    /// let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key"))
    ///     .cost(|_| 500)
    ///     .settle_from(SettleFrom::header(http::HeaderName::from_static("x-tokens-used")));
    /// # let _ = layer;
    /// ```
    pub fn settle_from(mut self, source: SettleFrom) -> Self {
        self.core.options.settle = Some(source);
        self
    }
}

impl<X: Source<St, C>, St, C> RateLimitLayer<X, St, C> {
    /// The layer of `limits`, keyed by `key`, its fields written as `headers` says.
    pub(crate) fn from_limits(limits: X::Limits, key: X, headers: HeaderConfig) -> Self {
        Self {
            core: Core {
                options: Options::with_limits(limits, headers),
                rejection: None,
            },
            hooks: Hooks::new(key),
        }
    }

    /// How the rate-limit fields are written: which fields ([`HeaderStyle`](super::HeaderStyle)), the IETF policy
    /// name, partition key, quota unit and jitter, the reset format, whether allowed responses
    /// carry them. See [`Headers`]; what it leaves unset stays as it was. A rules file's layer
    /// takes `on_allowed` from it; the file sets the rest (`header_style`, `reset`, the limits'
    /// names).
    ///
    /// ```
    /// use tollgate::{RateLimiter, key::GlobalKey};
    /// use tollgate::layer::{HeaderStyle, Headers, RateLimitLayer};
    ///
    /// let limiter = RateLimiter::builder().quotas("10/second").unwrap().build().unwrap();
    /// let layer = RateLimitLayer::new(limiter, GlobalKey)
    ///     .headers(Headers::new().style(HeaderStyle::Ietf).policy_name("api"));
    /// # let _ = layer;
    /// ```
    pub fn headers(mut self, headers: Headers) -> Self {
        if X::Limits::FIELDS_OF_THEIR_OWN {
            let unused = headers.set_beyond_on_allowed();
            if !unused.is_empty() {
                tracing::warn!(
                    ?unused,
                    "a rules file's layer takes only `on_allowed` from headers(..): the file sets \
                     the others (`header_style`, `reset`, the limits' names); these are not applied"
                );
            }
        }
        headers.apply(&mut self.core.options.headers);
        self
    }

    /// What to do when the store fails (default [`FailurePolicy::FailOpen`]; `FailClosed`
    /// answers `503`).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.core.options.failure = policy;
        self
    }

    /// Waits instead of rejecting at once: [`Pacing::Delay`] (wait for the slot, up to a maximum
    /// delay) or [`Pacing::Queue`] (a shaping queue: requests leave `T` apart, in arrival order).
    ///
    /// # Errors
    /// Only for [`Pacing::Queue`]:
    /// [`ConfigError::QueueNeedsLeakyBucket`](crate::ConfigError::QueueNeedsLeakyBucket) or
    /// [`QueueNeedsOneQuota`](crate::ConfigError::QueueNeedsOneQuota) when the limiter's rule is
    /// not a leaky bucket with one quota (a rules file's layer: set `queue` on its limits
    /// instead), and [`QueueWaitTooShort`](crate::ConfigError::QueueWaitTooShort) when the
    /// longest wait is shorter than `T`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{RateLimiter, Strategy, key::GlobalKey, layer::{Pacing, RateLimitLayer}};
    ///
    /// let limiter = RateLimiter::builder()
    ///     .strategy(Strategy::LeakyBucket)
    ///     .quotas("10/second")?
    ///     .build()?;
    /// let layer = RateLimitLayer::new(limiter, GlobalKey)
    ///     .pacing(Pacing::Queue(Duration::from_secs(2)))?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pacing(mut self, pacing: Pacing) -> Result<Self, crate::ConfigError> {
        let wait = match pacing {
            Pacing::Delay(max_delay) => Wait::Sleep(max_delay),
            Pacing::Queue(max_wait) => {
                let (rule, tick) = self.core.options.limits.queue_base()?;
                if rule.strategy() != crate::Strategy::LeakyBucket {
                    return Err(crate::ConfigError::QueueNeedsLeakyBucket(rule.strategy()));
                }
                let [quota] = rule.quotas() else {
                    return Err(crate::ConfigError::QueueNeedsOneQuota(rule.quotas().len()));
                };
                let (queued, emission) = queue_quota(quota, max_wait).map_err(|emission| {
                    crate::ConfigError::QueueWaitTooShort {
                        max_wait,
                        interval: Duration::from_nanos(emission),
                    }
                })?;
                Wait::Queue {
                    rule: Arc::new(Rule::new(crate::Strategy::LeakyBucket, [queued])?),
                    emission: in_ticks(emission, tick),
                }
            }
        };
        self.core.options.pacing = Some(wait);
        Ok(self)
    }

    /// Exempts the requests for which `f` returns `true` (health checks, CORS preflight
    /// `OPTIONS`, allow-listed networks): they pass without a check and without rate-limit
    /// headers.
    pub fn skip<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.hooks.skip = Some(Arc::new(f));
        self
    }

    /// Builds the 429 with a closure of the [`Decision`](crate::Decision). Under the `axum`
    /// feature it may return anything `IntoResponse`; otherwise an `http::Response` whose body
    /// [`ResponseBody`](super::ResponseBody) converts from (`String`, `Bytes`, `Full<Bytes>`,
    /// ...). The layer still adds the rate-limit fields, `Retry-After` and the decision; its
    /// other answers (no key, store failure) stay text/plain (see
    /// [`respond_with`](Self::respond_with) to answer those too).
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::{Json, Router, http::StatusCode, routing::get};
    /// use tollgate::{RateLimiter, key::GlobalKey, layer::RateLimitLayer};
    ///
    /// let limiter = RateLimiter::builder().quotas("10/minute").unwrap().build().unwrap();
    /// let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(
    ///     RateLimitLayer::new(limiter, GlobalKey).on_rejected(|d| {
    ///         let wait = d.retry_after_secs().unwrap_or(0);
    ///         (StatusCode::TOO_MANY_REQUESTS, Json(format!("retry in {wait} s")))
    ///     }),
    /// );
    /// # }
    /// ```
    pub fn on_rejected<F, T>(mut self, f: F) -> Self
    where
        F: Fn(&crate::Decision) -> T + Send + Sync + 'static,
        T: Reply,
    {
        self.core.rejection = Some(Arc::new(Replying(f)));
        self
    }

    /// Builds every answer the layer makes on its own with `responder` (see [`OnRejected`]): the
    /// 429, and a request without a key or a store failure while failing closed. E.g.
    /// [`ProblemJson`](super::ProblemJson) answers all of them as RFC 9457 problem documents.
    ///
    /// ```
    /// use tollgate::{RateLimiter, key::GlobalKey, layer::{ProblemJson, RateLimitLayer}};
    ///
    /// let limiter = RateLimiter::builder().quotas("10/minute").unwrap().build().unwrap();
    /// let layer = RateLimitLayer::new(limiter, GlobalKey).respond_with(ProblemJson);
    /// # let _ = layer;
    /// ```
    pub fn respond_with<R>(mut self, responder: R) -> Self
    where
        R: OnRejected<ResponseBody<std::convert::Infallible>>,
    {
        self.core.rejection = Some(Arc::new(Responding(responder)));
        self
    }

    /// What the layer counted over every service of it (and its clones): requests waiting in
    /// [pacing](Self::pacing) now, and requests that had no usable key.
    pub fn stats(&self) -> LayerStats {
        let o = &self.core.options;
        LayerStats {
            waiting: o.waiting.load(Ordering::Relaxed),
            missing_keys: o.missing_keys.load(Ordering::Relaxed),
        }
    }
}

impl<S, X, St, C> Layer<S> for RateLimitLayer<X, St, C>
where
    X: Source<St, C> + Clone,
{
    type Service = RateLimitService<S, X, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::from_parts(
            inner,
            Arc::new(self.core.clone()),
            Arc::new(self.hooks.clone()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_interval_in_store_ticks_matches_what_redis_counts() {
        let quota: crate::Quota = "3/second".parse().unwrap();
        let (_, emission) = queue_quota(&quota, Duration::from_secs(1)).unwrap();
        assert_eq!(emission, 333_333_334);
        // Redis: T = ceil(1_000_000 us / 3) = 333_334 us, so an empty queue's reset is exactly one
        // slot and its wait zero.
        assert_eq!(in_ticks(emission, Duration::from_micros(1)), 333_334_000);
        assert_eq!(in_ticks(emission, Duration::from_nanos(1)), emission);
        assert_eq!(in_ticks(emission, Duration::ZERO), emission);
    }
}
