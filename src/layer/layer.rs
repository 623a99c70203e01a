//! [`RateLimitLayer`] and its configuration.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use super::core::{Core, MissingKey, Options, Pacing};
use super::hooks::{Hooks, LimiterRule, NoSkip, RequestCost, SelectRule, Skip, UnitCost};
use super::limits::{LayerKey, OneLimiter, Source};
use super::response::{DefaultRejection, FailurePolicy, HeaderConfig, HeaderStyle, ResetFormat};
use super::service::RateLimitService;
use super::settle::SettleFrom;
use crate::clock::{Clock, SystemClock};
use crate::key::KeyExtractor;
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::store::{MemoryStore, Store};

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock, R, Co, Ru, Sk>
    RateLimitLayer<X, St, C, R, Co, Ru, Sk>
{
    /// Publishes what the limiter's store counts into the [metrics](crate::metrics):
    /// `tollgate_keys` and `tollgate_evictions_total` (memory store), `tollgate_breaker_open`
    /// (Redis store's circuit breaker, 1 while open). The per-request metrics need no call; call
    /// this one before a scrape (or every few seconds).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish_stats(&self) {
        self.core.options.limits.metrics.publish_now();
    }

    /// Shaping queue mode, for a limiter with the [leaky bucket](crate::Strategy::LeakyBucket) and
    /// one quota: a FIFO queue drained at the constant rate `T = period / limit`. Each request gets
    /// its departure time when it arrives (a reservation in the store, `T` after the previous
    /// waiter's, so requests leave in arrival order, `T` apart, with no initial burst: the quota's
    /// burst is not used), waits for it on tokio's timer, and is then forwarded, with the
    /// rate-limit headers computed at departure. The only bound is the maximum wait: a request whose
    /// departure would come later than `max_wait` after its arrival (`max_wait` rounded down to a
    /// whole number of `T`) gets a `429` at once. Works on every store (on Redis the queue is
    /// shared by every instance). The headers describe the queue: `x-ratelimit-limit` is its depth
    /// (`max_wait / T + 1` places), `x-ratelimit-remaining` the places free when the request left.
    ///
    /// A waiter whose client goes away (the future is dropped before its departure) gives its slot
    /// back only if it holds the last reservation ([`Op::StepBack`](crate::Op::StepBack), one
    /// atomic step in the store; on Redis spawned, since the future is gone): the next arrival
    /// takes that departure. Otherwise the gap stays, and the waiters behind it keep their
    /// departures. Settlement does not apply in this mode: giving a slot back from the middle would
    /// put two waiters in one. Requests with a rule from
    /// [`select_rule`](Self::select_rule) use that rule as given. Needs a tokio runtime with the
    /// time driver; use [`TokioClock`](crate::TokioClock) as the limiter's clock in tests with
    /// paused time.
    ///
    /// # Errors
    /// [`ConfigError::QueueNeedsLeakyBucket`](crate::ConfigError::QueueNeedsLeakyBucket) or
    /// [`QueueNeedsOneQuota`](crate::ConfigError::QueueNeedsOneQuota) when the limiter's rule is
    /// not a leaky bucket with one quota, and
    /// [`QueueWaitTooShort`](crate::ConfigError::QueueWaitTooShort) when `max_wait` is shorter
    /// than `T`.
    pub fn queue(mut self, max_wait: Duration) -> Result<Self, crate::ConfigError> {
        let rule = self.core.options.limits.limiter.rule();
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
        let queue_rule = Rule::new(crate::Strategy::LeakyBucket, [queued])?;
        let emission = in_ticks(emission, self.core.options.limits.limiter.store().tick());
        self.core.options.pacing = Some(Pacing::Queue {
            rule: Arc::new(queue_rule),
            emission,
        });
        Ok(self)
    }
}

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
/// [module docs](crate::layer) for the behaviour and an axum example.
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
/// Type parameters: the key extractor `X`, the limiter's store `St` and clock `C`, then the hooks
/// set by the builder methods (rejection `R`, cost `Co`, rule `Ru`, skip `Sk`). Cheap to clone.
#[must_use]
pub struct RateLimitLayer<
    X: Source<St, C>,
    St = MemoryStore<<X as LayerKey>::Key>,
    C = SystemClock,
    R = DefaultRejection,
    Co = UnitCost,
    Ru = LimiterRule,
    Sk = NoSkip,
> {
    pub(crate) core: Core<X::Limits, R>,
    pub(crate) hooks: Hooks<X, Co, Ru, Sk>,
}

impl<X, St, C, R, Co, Ru, Sk> Clone for RateLimitLayer<X, St, C, R, Co, Ru, Sk>
where
    X: Source<St, C> + Clone,
    R: Clone,
    Co: Clone,
    Ru: Clone,
    Sk: Clone,
{
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
            hooks: self.hooks.clone(),
        }
    }
}

impl<X, St, C, R, Co, Ru, Sk> fmt::Debug for RateLimitLayer<X, St, C, R, Co, Ru, Sk>
where
    X: Source<St, C> + fmt::Debug,
    X::Limits: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.core.options.limits)
            .field("key", &self.hooks.key)
            .field("headers", &self.core.options.headers)
            .field("failure", &self.core.options.failure)
            .field("pacing", &self.core.options.pacing)
            .field("rejection", &"<fn>")
            .field("cost", &"<fn>")
            .field("rule", &"<fn>")
            .field("skip", &"<fn>")
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
}

impl<X: Source<St, C>, St, C> RateLimitLayer<X, St, C> {
    /// The layer of `limits`, keyed by `key`, its fields written as `headers` says.
    pub(crate) fn from_limits(limits: X::Limits, key: X, headers: HeaderConfig) -> Self {
        Self {
            core: Core {
                options: Options::with_limits(limits, headers),
                rejection: DefaultRejection,
            },
            hooks: Hooks {
                key,
                missing: MissingKey::Reject(StatusCode::BAD_REQUEST),
                cost: UnitCost,
                rule: LimiterRule,
                skip: NoSkip,
            },
        }
    }
}

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock, R, Co, Ru, Sk>
    RateLimitLayer<X, St, C, R, Co, Ru, Sk>
{
    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<X::Key, St, C> {
        &self.core.options.limits.limiter
    }

    /// Which header fields to write (default the `x-ratelimit-*` fields).
    pub fn header_style(mut self, style: HeaderStyle) -> Self {
        self.core.options.headers.style = style;
        self
    }

    /// The policy name in the IETF fields (default: the limiter's [name](crate::Builder::name);
    /// with several quotas `NAME-0`, `NAME-1`, ...).
    pub fn policy_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.core.options.headers.policy_name = name.into();
        self
    }

    /// Writes the IETF partition key `pk` on this limiter's `RateLimit-Policy` and `RateLimit`
    /// items: the first 96 bits of HMAC-SHA256(`secret`, the key's [encoding](crate::store::StoreKey)),
    /// base64, never the key itself. Give every instance the same secret so that they agree on a
    /// client's `pk`; keep it secret, or clients could test guesses of other clients' keys.
    pub fn partition_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.core.options.headers.pk = Some(super::ietf::PkSecret::new(secret.as_ref()));
        self
    }

    /// Writes `pk` like [`partition_key`](Self::partition_key) with a secret drawn at random once
    /// per process, and warns: instances then give one client different partition keys.
    pub fn partition_key_random(mut self) -> Self {
        tracing::warn!(
            "rate-limit partition keys (pk) use a random per-process secret: instances disagree \
             on a client's pk; configure a shared secret with partition_key(..)"
        );
        self.core.options.headers.pk = Some(super::ietf::PkSecret::random());
        self
    }

    /// The IETF `qu` parameter (the quota unit) on this limiter's `RateLimit-Policy` items, e.g.
    /// `"content-bytes"` when the cost is the body size. `"requests"` (the draft's default) is not
    /// written.
    pub fn quota_unit(mut self, unit: impl Into<Arc<str>>) -> Self {
        let unit = unit.into();
        self.core.options.headers.quota_unit = (&*unit != "requests").then_some(unit);
        self
    }

    /// Adds a random whole number of seconds, up to `max` (rounded up), to the IETF `t` of allowed
    /// responses, so that clients told the same reset do not all come back at once. `t` of a 429
    /// stays equal to `Retry-After`; `x-ratelimit-reset` is not changed.
    pub fn jitter(mut self, max: Duration) -> Self {
        self.core.options.headers.jitter = max.as_secs() + u64::from(max.subsec_nanos() > 0);
        self
    }

    /// `x-ratelimit-reset` as seconds from now (default) or as Unix time.
    pub fn reset_format(mut self, format: ResetFormat) -> Self {
        self.core.options.headers.reset = format;
        self
    }

    /// Answers requests without a usable key with `status` (default 400), text/plain.
    pub fn missing_key_status(mut self, status: StatusCode) -> Self {
        self.hooks.missing = MissingKey::Reject(status);
        self
    }

    /// Counts requests without a usable key under one shared `key` instead of rejecting them.
    pub fn fallback_key(mut self, key: X::Key) -> Self {
        self.hooks.missing = MissingKey::Fallback(key);
        self
    }

    /// Computes each request's cost with `f` (default 1).
    pub fn cost<Co2: RequestCost>(self, f: Co2) -> RateLimitLayer<X, St, C, R, Co2, Ru, Sk> {
        let h = self.hooks;
        RateLimitLayer {
            core: self.core,
            hooks: Hooks {
                key: h.key,
                missing: h.missing,
                cost: f,
                rule: h.rule,
                skip: h.skip,
            },
        }
    }

    /// Chooses each request's rule with `f` (tiers); `None` keeps the limiter's rule.
    pub fn select_rule<Ru2: SelectRule>(self, f: Ru2) -> RateLimitLayer<X, St, C, R, Co, Ru2, Sk> {
        let h = self.hooks;
        RateLimitLayer {
            core: self.core,
            hooks: Hooks {
                key: h.key,
                missing: h.missing,
                cost: h.cost,
                rule: f,
                skip: h.skip,
            },
        }
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
    ///     .cost(|_: &http::request::Parts| 500)
    ///     .settle_from(SettleFrom::header(http::HeaderName::from_static("x-tokens-used")));
    /// # let _ = layer;
    /// ```
    pub fn settle_from(mut self, source: SettleFrom) -> Self {
        self.core.options.settle = Some(source);
        self
    }
}

impl<X: Source<St, C>, St, C, R, Co, Ru, Sk> RateLimitLayer<X, St, C, R, Co, Ru, Sk> {
    /// Whether allowed responses carry the rate-limit headers (default `true`). Rejections always
    /// do.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.core.options.headers.on_allowed = on;
        self
    }

    /// What to do when the store fails (default [`FailurePolicy::FailOpen`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.core.options.failure = policy;
        self
    }

    /// Shorthand for `failure_policy(FailurePolicy::FailClosed)`: answer 503 when the store fails.
    pub fn fail_closed(self) -> Self {
        self.failure_policy(FailurePolicy::FailClosed)
    }

    /// Pacing (delay) mode: a request that would be rejected waits for its slot on tokio's timer,
    /// for at most `max_delay` in total, and is rejected only if the slot comes later. Waiters
    /// hold no place while they sleep, so a cancelled request (client gone) costs nothing.
    /// Needs a tokio runtime with the time driver; use [`TokioClock`](crate::TokioClock) as the
    /// limiter's clock in tests with paused time.
    pub fn pacing(mut self, max_delay: Duration) -> Self {
        self.core.options.pacing = Some(Pacing::Sleep(max_delay));
        self
    }

    /// Whether `tracing` events name the key (default `false`: keys can be personal data). Keys
    /// show as [`StoreKey::log_text`](crate::store::StoreKey::log_text) says: IP addresses as text,
    /// header, extension and other keys as a short hash keyed per process, never the secret itself.
    pub fn log_keys(mut self, on: bool) -> Self {
        self.core.options.log_keys = on;
        self
    }

    /// How many requests are waiting for a slot in pacing mode now, over every service of this
    /// layer (and its clones).
    pub fn waiting(&self) -> usize {
        self.core.options.waiting.load(Ordering::Relaxed)
    }

    /// How many requests had no usable key (answered with the missing-key status, or counted
    /// under the fallback key), over every service of this layer.
    pub fn missing_keys(&self) -> u64 {
        self.core.options.missing_keys.load(Ordering::Relaxed)
    }

    /// Builds the 429 with a closure of the [`Decision`](crate::Decision) whose type is inferred
    /// where it is written (no higher-ranked lifetime error at `Router::layer`). Under the `axum`
    /// feature it may return anything `IntoResponse`; otherwise an `http::Response` of the inner
    /// service's body. The layer still adds the rate-limit fields, `Retry-After` and the decision.
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::{Json, Router, http::StatusCode, routing::get};
    /// use tollgate::{RateLimiter, key::GlobalKey, layer::RateLimitLayer};
    ///
    /// let limiter = RateLimiter::builder().quotas("10/minute").unwrap().build().unwrap();
    /// let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(
    ///     RateLimitLayer::new(limiter, GlobalKey).respond_with(|d| {
    ///         let wait = d.retry_after_secs().unwrap_or(0);
    ///         (StatusCode::TOO_MANY_REQUESTS, Json(format!("retry in {wait} s")))
    ///     }),
    /// );
    /// # }
    /// ```
    pub fn respond_with<F, T>(
        self,
        f: F,
    ) -> RateLimitLayer<X, St, C, super::response::RespondWith<F>, Co, Ru, Sk>
    where
        F: Fn(&crate::Decision) -> T + Send + Sync + 'static,
    {
        self.on_rejected(super::response::RespondWith(f))
    }

    /// Builds rejections with `f` (see [`OnRejected`](super::OnRejected)): a responder such as
    /// [`ProblemJson`](super::ProblemJson), or a closure `Fn(&Decision) -> Response<B>` (prefer
    /// [`respond_with`](Self::respond_with) for closures: their type is inferred there).
    pub fn on_rejected<R2>(self, f: R2) -> RateLimitLayer<X, St, C, R2, Co, Ru, Sk> {
        RateLimitLayer {
            core: Core {
                options: self.core.options,
                rejection: f,
            },
            hooks: self.hooks,
        }
    }

    /// Exempts the requests for which `f` returns `true`: they pass without a check and without
    /// rate-limit headers.
    pub fn skip<Sk2: Skip>(self, f: Sk2) -> RateLimitLayer<X, St, C, R, Co, Ru, Sk2> {
        let h = self.hooks;
        RateLimitLayer {
            core: self.core,
            hooks: Hooks {
                key: h.key,
                missing: h.missing,
                cost: h.cost,
                rule: h.rule,
                skip: f,
            },
        }
    }
}

impl<S, X, St, C, R, Co, Ru, Sk> Layer<S> for RateLimitLayer<X, St, C, R, Co, Ru, Sk>
where
    X: Source<St, C> + Clone,
    R: Clone,
    Co: Clone,
    Ru: Clone,
    Sk: Clone,
{
    type Service = RateLimitService<S, X, St, C, R, Co, Ru, Sk>;

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
