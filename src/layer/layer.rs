//! [`RateLimitLayer`] and its configuration.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;
use tower_layer::Layer;

use super::response::{DefaultRejection, FailurePolicy, HeaderConfig, HeaderStyle, ResetFormat};
use super::service::RateLimitService;
use super::settle::SettleFrom;
use crate::clock::{Clock, SystemClock};
use crate::key::KeyExtractor;
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::store::{MemoryStore, Store};

/// The cost of a request (default 1). Implemented by [`UnitCost`] and closures
/// `Fn(&Parts) -> u32`. Cost 0 is a peek: the request passes and consumes nothing.
pub trait RequestCost: Send + Sync + 'static {
    /// The request's cost.
    fn cost(&self, parts: &Parts) -> u32;
}

/// Every request costs 1.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCost;

impl RequestCost for UnitCost {
    fn cost(&self, _parts: &Parts) -> u32 {
        1
    }
}

impl<F: Fn(&Parts) -> u32 + Send + Sync + 'static> RequestCost for F {
    fn cost(&self, parts: &Parts) -> u32 {
        self(parts)
    }
}

/// Picks the rule for a request (tiers by plan). `None` uses the limiter's own rule.
/// Implemented by [`LimiterRule`] and closures `Fn(&Parts) -> Option<Arc<Rule>>`.
///
/// A key's state follows the rule it is checked under: give each tier its own keys (e.g. key by
/// user id, one plan per user) or the tiers share counters.
pub trait SelectRule: Send + Sync + 'static {
    /// The rule for this request.
    fn rule(&self, parts: &Parts) -> Option<Arc<Rule>>;
}

/// Every request uses the limiter's rule.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimiterRule;

impl SelectRule for LimiterRule {
    fn rule(&self, _parts: &Parts) -> Option<Arc<Rule>> {
        None
    }
}

impl<F: Fn(&Parts) -> Option<Arc<Rule>> + Send + Sync + 'static> SelectRule for F {
    fn rule(&self, parts: &Parts) -> Option<Arc<Rule>> {
        self(parts)
    }
}

/// Exempts requests from the limit (health checks, CORS preflight, allow-listed networks).
/// Implemented by [`NoSkip`] and closures `Fn(&Parts) -> bool` (`true` = not limited).
pub trait Skip: Send + Sync + 'static {
    /// Whether the request bypasses the limiter.
    fn skip(&self, parts: &Parts) -> bool;
}

/// No request is exempt.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSkip;

impl Skip for NoSkip {
    fn skip(&self, _parts: &Parts) -> bool {
        false
    }
}

impl<F: Fn(&Parts) -> bool + Send + Sync + 'static> Skip for F {
    fn skip(&self, parts: &Parts) -> bool {
        self(parts)
    }
}

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock, R, Co, Ru, Sk>
    RateLimitLayer<X, St, C, R, Co, Ru, Sk>
{
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
    /// A waiter whose client goes away (the future is dropped) keeps its slot: the gap stays, and
    /// the waiters behind it keep their departures. Settlement does not apply in this mode: giving
    /// a slot back would put two waiters in one. Requests with a rule from
    /// [`select_rule`](Self::select_rule) use that rule as given. Needs a tokio runtime with the
    /// time driver; use [`TokioClock`](crate::TokioClock) as the limiter's clock in tests with
    /// paused time.
    ///
    /// # Errors
    /// [`ConfigError::Queue`](crate::ConfigError::Queue) when the limiter's rule is not a leaky
    /// bucket with one quota, or `max_wait` is shorter than `T`.
    pub fn queue(mut self, max_wait: Duration) -> Result<Self, crate::ConfigError> {
        let rule = self.limiter.rule();
        let err = |why: String| Err(crate::ConfigError::Queue(why));
        if rule.strategy() != crate::Strategy::LeakyBucket {
            return err(format!(
                "a queue needs the {} strategy, not {}",
                crate::Strategy::LeakyBucket,
                rule.strategy()
            ));
        }
        let [quota] = rule.quotas() else {
            return err("a queue drains one quota: give the limiter exactly one".into());
        };
        let (queued, emission) = queue_quota(quota, max_wait).map_err(|emission| {
            crate::ConfigError::Queue(format!(
                "the maximum wait {max_wait:?} is shorter than one interval ({:?}) of {quota}",
                Duration::from_nanos(emission)
            ))
        })?;
        let queue_rule = Rule::new(crate::Strategy::LeakyBucket, [queued])?;
        self.pacing = Some(Pacing::Queue {
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

/// Settings shared by a layer's services and their futures.
pub(crate) struct Core<K, St, C, R> {
    pub(crate) limiter: RateLimiter<K, St, C>,
    pub(crate) headers: HeaderConfig,
    pub(crate) failure: FailurePolicy,
    pub(crate) missing: MissingKey<K>,
    pub(crate) pacing: Option<Pacing>,
    pub(crate) log_keys: bool,
    pub(crate) rejection: R,
    pub(crate) waiting: Arc<AtomicUsize>,
    pub(crate) last_warn: Arc<crate::throttle::Throttle>,
    pub(crate) missing_keys: Arc<AtomicU64>,
    pub(crate) settle: Option<SettleFrom>,
    pub(crate) settle_warned: Arc<AtomicBool>,
}

impl<K, St, C, R> Core<K, St, C, R> {
    /// The queue's rule, in queue mode.
    pub(crate) fn queue_rule(&self) -> Option<Arc<Rule>> {
        match &self.pacing {
            Some(Pacing::Queue { rule, .. }) => Some(Arc::clone(rule)),
            _ => None,
        }
    }
}

/// The per-request hooks: key, cost, rule, skip.
pub(crate) struct Hooks<X, Co, Ru, Sk> {
    pub(crate) key: X,
    pub(crate) cost: Co,
    pub(crate) rule: Ru,
    pub(crate) skip: Sk,
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
    X: KeyExtractor,
    St = MemoryStore<<X as KeyExtractor>::Key>,
    C = SystemClock,
    R = DefaultRejection,
    Co = UnitCost,
    Ru = LimiterRule,
    Sk = NoSkip,
> {
    pub(crate) limiter: RateLimiter<X::Key, St, C>,
    pub(crate) key: X,
    pub(crate) headers: HeaderConfig,
    pub(crate) failure: FailurePolicy,
    pub(crate) missing: MissingKey<X::Key>,
    pub(crate) pacing: Option<Pacing>,
    pub(crate) log_keys: bool,
    pub(crate) rejection: R,
    pub(crate) cost: Co,
    pub(crate) rule: Ru,
    pub(crate) skip: Sk,
    pub(crate) waiting: Arc<AtomicUsize>,
    pub(crate) last_warn: Arc<crate::throttle::Throttle>,
    pub(crate) missing_keys: Arc<AtomicU64>,
    pub(crate) settle: Option<SettleFrom>,
    pub(crate) settle_warned: Arc<AtomicBool>,
}

impl<X, St, C, R, Co, Ru, Sk> Clone for RateLimitLayer<X, St, C, R, Co, Ru, Sk>
where
    X: KeyExtractor + Clone,
    R: Clone,
    Co: Clone,
    Ru: Clone,
    Sk: Clone,
{
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            headers: self.headers.clone(),
            failure: self.failure,
            missing: self.missing.clone(),
            pacing: self.pacing.clone(),
            log_keys: self.log_keys,
            rejection: self.rejection.clone(),
            cost: self.cost.clone(),
            rule: self.rule.clone(),
            skip: self.skip.clone(),
            waiting: Arc::clone(&self.waiting),
            last_warn: Arc::clone(&self.last_warn),
            missing_keys: Arc::clone(&self.missing_keys),
            settle: self.settle.clone(),
            settle_warned: Arc::clone(&self.settle_warned),
        }
    }
}

impl<X, St, C, R, Co, Ru, Sk> fmt::Debug for RateLimitLayer<X, St, C, R, Co, Ru, Sk>
where
    X: KeyExtractor + fmt::Debug,
    St: fmt::Debug,
    C: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("key", &self.key)
            .field("headers", &self.headers)
            .field("failure", &self.failure)
            .field("pacing", &self.pacing)
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
        Self {
            headers,
            limiter,
            key,
            failure: FailurePolicy::default(),
            missing: MissingKey::Reject(StatusCode::BAD_REQUEST),
            pacing: None,
            log_keys: false,
            rejection: DefaultRejection,
            cost: UnitCost,
            rule: LimiterRule,
            skip: NoSkip,
            waiting: Arc::default(),
            last_warn: Arc::default(),
            missing_keys: Arc::default(),
            settle: None,
            settle_warned: Arc::default(),
        }
    }
}

impl<X: KeyExtractor, St, C, R, Co, Ru, Sk> RateLimitLayer<X, St, C, R, Co, Ru, Sk> {
    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<X::Key, St, C> {
        &self.limiter
    }

    /// Whether allowed responses carry the rate-limit headers (default `true`). Rejections always
    /// do.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.headers.on_allowed = on;
        self
    }

    /// Which header fields to write (default the `x-ratelimit-*` fields).
    pub fn header_style(mut self, style: HeaderStyle) -> Self {
        self.headers.style = style;
        self
    }

    /// The policy name in the IETF fields (default: the limiter's [name](crate::Builder::name);
    /// with several quotas `NAME-0`, `NAME-1`, ...).
    pub fn policy_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.headers.policy_name = name.into();
        self
    }

    /// Writes the IETF partition key `pk` on this limiter's `RateLimit-Policy` and `RateLimit`
    /// items: the first 96 bits of HMAC-SHA256(`secret`, the key's [encoding](crate::store::StoreKey)),
    /// base64, never the key itself. Give every instance the same secret so that they agree on a
    /// client's `pk`; keep it secret, or clients could test guesses of other clients' keys.
    pub fn partition_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.headers.pk = Some(super::ietf::PkSecret::new(secret.as_ref()));
        self
    }

    /// Writes `pk` like [`partition_key`](Self::partition_key) with a secret drawn at random once
    /// per process, and warns: instances then give one client different partition keys.
    pub fn partition_key_random(mut self) -> Self {
        tracing::warn!(
            "rate-limit partition keys (pk) use a random per-process secret: instances disagree \
             on a client's pk; configure a shared secret with partition_key(..)"
        );
        self.headers.pk = Some(super::ietf::PkSecret::random());
        self
    }

    /// The IETF `qu` parameter (the quota unit) on this limiter's `RateLimit-Policy` items, e.g.
    /// `"content-bytes"` when the cost is the body size. `"requests"` (the draft's default) is not
    /// written.
    pub fn quota_unit(mut self, unit: impl Into<Arc<str>>) -> Self {
        let unit = unit.into();
        self.headers.quota_unit = (&*unit != "requests").then_some(unit);
        self
    }

    /// Adds a random whole number of seconds, up to `max` (rounded up), to the IETF `t` of allowed
    /// responses, so that clients told the same reset do not all come back at once. `t` of a 429
    /// stays equal to `Retry-After`; `x-ratelimit-reset` is not changed.
    pub fn jitter(mut self, max: Duration) -> Self {
        self.headers.jitter = max.as_secs() + u64::from(max.subsec_nanos() > 0);
        self
    }

    /// `x-ratelimit-reset` as seconds from now (default) or as Unix time.
    pub fn reset_format(mut self, format: ResetFormat) -> Self {
        self.headers.reset = format;
        self
    }

    /// What to do when the store fails (default [`FailurePolicy::FailOpen`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Shorthand for `failure_policy(FailurePolicy::FailClosed)`: answer 503 when the store fails.
    pub fn fail_closed(self) -> Self {
        self.failure_policy(FailurePolicy::FailClosed)
    }

    /// Answers requests without a usable key with `status` (default 400), text/plain.
    pub fn missing_key_status(mut self, status: StatusCode) -> Self {
        self.missing = MissingKey::Reject(status);
        self
    }

    /// Counts requests without a usable key under one shared `key` instead of rejecting them.
    pub fn fallback_key(mut self, key: X::Key) -> Self {
        self.missing = MissingKey::Fallback(key);
        self
    }

    /// Pacing (delay) mode: a request that would be rejected waits for its slot on tokio's timer,
    /// for at most `max_delay` in total, and is rejected only if the slot comes later. Waiters
    /// hold no place while they sleep, so a cancelled request (client gone) costs nothing.
    /// Needs a tokio runtime with the time driver; use [`TokioClock`](crate::TokioClock) as the
    /// limiter's clock in tests with paused time.
    pub fn pacing(mut self, max_delay: Duration) -> Self {
        self.pacing = Some(Pacing::Sleep(max_delay));
        self
    }

    /// Whether `tracing` events name the key (default `false`: keys can be personal data). Keys
    /// show as [`StoreKey::log_text`](crate::store::StoreKey::log_text) says: IP addresses as text,
    /// header, extension and other keys as a short hash keyed per process, never the secret itself.
    pub fn log_keys(mut self, on: bool) -> Self {
        self.log_keys = on;
        self
    }

    /// How many requests are waiting for a slot in pacing mode now, over every service of this
    /// layer (and its clones).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// How many requests had no usable key (answered with the missing-key status, or counted
    /// under the fallback key), over every service of this layer.
    pub fn missing_keys(&self) -> u64 {
        self.missing_keys.load(Ordering::Relaxed)
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
            limiter: self.limiter,
            key: self.key,
            headers: self.headers,
            failure: self.failure,
            missing: self.missing,
            pacing: self.pacing,
            log_keys: self.log_keys,
            rejection: f,
            cost: self.cost,
            rule: self.rule,
            skip: self.skip,
            waiting: self.waiting,
            last_warn: self.last_warn,
            missing_keys: self.missing_keys,
            settle: self.settle,
            settle_warned: self.settle_warned,
        }
    }

    /// Computes each request's cost with `f` (default 1).
    pub fn cost<Co2: RequestCost>(self, f: Co2) -> RateLimitLayer<X, St, C, R, Co2, Ru, Sk> {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            headers: self.headers,
            failure: self.failure,
            missing: self.missing,
            pacing: self.pacing,
            log_keys: self.log_keys,
            rejection: self.rejection,
            cost: f,
            rule: self.rule,
            skip: self.skip,
            waiting: self.waiting,
            last_warn: self.last_warn,
            missing_keys: self.missing_keys,
            settle: self.settle,
            settle_warned: self.settle_warned,
        }
    }

    /// Chooses each request's rule with `f` (tiers); `None` keeps the limiter's rule.
    pub fn select_rule<Ru2: SelectRule>(self, f: Ru2) -> RateLimitLayer<X, St, C, R, Co, Ru2, Sk> {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            headers: self.headers,
            failure: self.failure,
            missing: self.missing,
            pacing: self.pacing,
            log_keys: self.log_keys,
            rejection: self.rejection,
            cost: self.cost,
            rule: f,
            skip: self.skip,
            waiting: self.waiting,
            last_warn: self.last_warn,
            missing_keys: self.missing_keys,
            settle: self.settle,
            settle_warned: self.settle_warned,
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
        self.settle = Some(source);
        self
    }

    /// Exempts the requests for which `f` returns `true`: they pass without a check and without
    /// rate-limit headers.
    pub fn skip<Sk2: Skip>(self, f: Sk2) -> RateLimitLayer<X, St, C, R, Co, Ru, Sk2> {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            headers: self.headers,
            failure: self.failure,
            missing: self.missing,
            pacing: self.pacing,
            log_keys: self.log_keys,
            rejection: self.rejection,
            cost: self.cost,
            rule: self.rule,
            skip: f,
            waiting: self.waiting,
            last_warn: self.last_warn,
            missing_keys: self.missing_keys,
            settle: self.settle,
            settle_warned: self.settle_warned,
        }
    }
}

impl<S, X, St, C, R, Co, Ru, Sk> Layer<S> for RateLimitLayer<X, St, C, R, Co, Ru, Sk>
where
    X: KeyExtractor + Clone,
    R: Clone,
    Co: Clone,
    Ru: Clone,
    Sk: Clone,
{
    type Service = RateLimitService<S, X, St, C, R, Co, Ru, Sk>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::from_parts(
            inner,
            Arc::new(Core {
                limiter: self.limiter.clone(),
                headers: self.headers.clone(),
                failure: self.failure,
                missing: self.missing.clone(),
                pacing: self.pacing.clone(),
                log_keys: self.log_keys,
                rejection: self.rejection.clone(),
                waiting: Arc::clone(&self.waiting),
                last_warn: Arc::clone(&self.last_warn),
                missing_keys: Arc::clone(&self.missing_keys),
                settle: self.settle.clone(),
                settle_warned: Arc::clone(&self.settle_warned),
            }),
            Arc::new(Hooks {
                key: self.key.clone(),
                cost: self.cost.clone(),
                rule: self.rule.clone(),
                skip: self.skip.clone(),
            }),
        )
    }
}
