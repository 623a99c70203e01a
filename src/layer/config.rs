//! The configuration values a [`RateLimitLayer`](super::RateLimitLayer) takes as a group:
//! [`Headers`], [`KeyPolicy`], [`Pacing`], and what it reports back, [`LayerStats`].

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::core::MissingKey;
use super::ietf::PkSecret;
use super::response::{HeaderConfig, HeaderStyle, ResetFormat};

/// How a layer writes its rate-limit fields, for
/// [`RateLimitLayer::headers`](super::RateLimitLayer::headers). Each setting left unset keeps the
/// layer's: the defaults below, or a rules file's (`header_style`, `reset`).
///
/// ```
/// use std::time::Duration;
/// use tollgate::layer::{HeaderStyle, Headers, ResetFormat};
///
/// let headers = Headers::new()
///     .style(HeaderStyle::Both)
///     .policy_name("api")
///     .partition_key(b"a secret every instance shares")
///     .jitter(Duration::from_secs(5))
///     .reset_format(ResetFormat::Unix);
/// # let _ = headers;
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Headers {
    style: Option<HeaderStyle>,
    policy_name: Option<Arc<str>>,
    pk: Option<PkSecret>,
    quota_unit: Option<Arc<str>>,
    jitter: Option<u64>,
    reset: Option<ResetFormat>,
    on_allowed: Option<bool>,
}

impl Headers {
    /// Nothing set: the layer's settings stay as they are.
    pub fn new() -> Self {
        Self::default()
    }

    /// Which fields to write (default the `x-ratelimit-*` fields).
    pub fn style(mut self, style: HeaderStyle) -> Self {
        self.style = Some(style);
        self
    }

    /// The policy name in the IETF fields (default: the limiter's [name](crate::Builder::name);
    /// with several quotas `NAME-0`, `NAME-1`, ...).
    pub fn policy_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.policy_name = Some(name.into());
        self
    }

    /// Writes the IETF partition key `pk` on the limiter's `RateLimit-Policy` and `RateLimit`
    /// items: the first 96 bits of HMAC-SHA256(`secret`, the key's
    /// [encoding](crate::store::StoreKey)), base64, never the key itself. Give every instance the
    /// same secret so that they agree on a client's `pk`; keep it secret, or clients could test
    /// guesses of other clients' keys.
    pub fn partition_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.pk = Some(PkSecret::new(secret.as_ref()));
        self
    }

    /// Writes `pk` like [`partition_key`](Self::partition_key) with a secret drawn at random once
    /// per process, and warns: instances then give one client different partition keys.
    pub fn partition_key_random(mut self) -> Self {
        tracing::warn!(
            "rate-limit partition keys (pk) use a random per-process secret: instances disagree \
             on a client's pk; configure a shared secret with Headers::partition_key(..)"
        );
        self.pk = Some(PkSecret::random());
        self
    }

    /// The IETF `qu` parameter (the quota unit) on the limiter's `RateLimit-Policy` items, e.g.
    /// `"content-bytes"` when the cost is the body size. `"requests"` (the draft's default) is not
    /// written.
    pub fn quota_unit(mut self, unit: impl Into<Arc<str>>) -> Self {
        self.quota_unit = Some(unit.into());
        self
    }

    /// Adds a random whole number of seconds, up to `max` (rounded up), to the IETF `t` of allowed
    /// responses, so that clients told the same reset do not all come back at once. `t` of a 429
    /// stays equal to `Retry-After`; `x-ratelimit-reset` is not changed.
    pub fn jitter(mut self, max: Duration) -> Self {
        self.jitter = Some(max.as_secs() + u64::from(max.subsec_nanos() > 0));
        self
    }

    /// `x-ratelimit-reset` as seconds from now (default) or as Unix time.
    pub fn reset_format(mut self, format: ResetFormat) -> Self {
        self.reset = Some(format);
        self
    }

    /// Whether allowed responses carry the fields (default `true`). Rejections always do.
    pub fn on_allowed(mut self, on: bool) -> Self {
        self.on_allowed = Some(on);
        self
    }

    /// Sets what was set on `cfg`.
    /// The settings given other than `on_allowed`, by name.
    pub(crate) fn set_beyond_on_allowed(&self) -> Vec<&'static str> {
        [
            ("style", self.style.is_some()),
            ("policy_name", self.policy_name.is_some()),
            ("partition_key", self.pk.is_some()),
            ("quota_unit", self.quota_unit.is_some()),
            ("jitter", self.jitter.is_some()),
            ("reset_format", self.reset.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    pub(crate) fn apply(self, cfg: &mut HeaderConfig) {
        let Self {
            style,
            policy_name,
            pk,
            quota_unit,
            jitter,
            reset,
            on_allowed,
        } = self;
        if let Some(style) = style {
            cfg.style = style;
        }
        if let Some(name) = policy_name {
            cfg.policy_name = name;
        }
        if pk.is_some() {
            cfg.pk = pk;
        }
        if let Some(unit) = quota_unit {
            cfg.quota_unit = (&*unit != "requests").then_some(unit);
        }
        if let Some(jitter) = jitter {
            cfg.jitter = jitter;
        }
        if let Some(reset) = reset {
            cfg.reset = reset;
        }
        if let Some(on) = on_allowed {
            cfg.on_allowed = on;
        }
    }
}

/// What a layer does with its requests' keys, for
/// [`RateLimitLayer::keys`](super::RateLimitLayer::keys): the answer to a request without a usable
/// key (a status, or a shared fallback key), and whether `tracing` events name keys. The default:
/// `400 Bad Request`, keys not logged.
///
/// ```
/// use http::StatusCode;
/// use tollgate::layer::KeyPolicy;
///
/// let strict = KeyPolicy::<String>::default().missing_status(StatusCode::UNAUTHORIZED);
/// let shared = KeyPolicy::default().fallback("anonymous".to_owned()).log_keys(true);
/// # let _ = (strict, shared);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct KeyPolicy<K> {
    pub(crate) missing: MissingKey<K>,
    pub(crate) log: bool,
}

impl<K> Default for KeyPolicy<K> {
    fn default() -> Self {
        Self {
            missing: MissingKey::default(),
            log: false,
        }
    }
}

impl<K> KeyPolicy<K> {
    /// Answers requests without a usable key with `status` (default 400), text/plain (or as the
    /// [responder](super::RateLimitLayer::respond_with) says).
    pub fn missing_status(mut self, status: StatusCode) -> Self {
        self.missing = MissingKey::Reject(status);
        self
    }

    /// Counts requests without a usable key under one shared `key` instead of rejecting them.
    pub fn fallback(mut self, key: K) -> Self {
        self.missing = MissingKey::Fallback(key);
        self
    }

    /// Whether `tracing` events name the key (default `false`: keys can be personal data). Keys
    /// show as [`StoreKey::log_text`](crate::store::StoreKey::log_text) says: IP addresses as
    /// text, header, extension and other keys as a short hash keyed per process, never the secret
    /// itself.
    pub fn log_keys(mut self, on: bool) -> Self {
        self.log = on;
        self
    }
}

/// How a request that cannot pass now waits instead of being rejected at once, for
/// [`RateLimitLayer::pacing`](super::RateLimitLayer::pacing). Both need a tokio runtime with the
/// time driver; use [`TokioClock`](crate::TokioClock) as the limiter's clock in tests with paused
/// time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pacing {
    /// A request that would be rejected waits for its slot on tokio's timer, for at most this
    /// long in total, and is rejected only if the slot comes later. Waiters hold no place while
    /// they sleep, so a cancelled request (client gone) costs nothing.
    Delay(Duration),
    /// A shaping queue, for a limiter with the [leaky bucket](crate::Strategy::LeakyBucket) and
    /// one quota: a FIFO queue drained at the constant rate `T = period / limit`, whose longest
    /// wait is this. Each request gets its departure time when it arrives (a reservation in the
    /// store, `T` after the previous waiter's, so requests leave in arrival order, `T` apart, with
    /// no initial burst: the quota's burst is not used), waits for it, and is then forwarded, with
    /// the rate-limit headers computed at departure. A request whose departure would come later
    /// than the longest wait after its arrival (rounded down to a whole number of `T`) gets a
    /// `429` at once. Works on every store (on Redis the queue is shared by every instance). The
    /// headers describe the queue: `x-ratelimit-limit` is its depth (`max_wait / T + 1` places),
    /// `x-ratelimit-remaining` the places free when the request left.
    ///
    /// A waiter whose client goes away gives its slot back only if it holds the last reservation
    /// ([`Op::StepBack`](crate::Op::StepBack)): the next arrival takes that departure. Otherwise
    /// the gap stays, and the waiters behind it keep their departures. Settlement does not apply
    /// in this mode (giving a slot back from the middle would put two waiters in one). Requests
    /// with a rule from [`select_rule`](super::RateLimitLayer::select_rule) use that rule as
    /// given. A rules file sets its queues per limit (`queue`), not here.
    Queue(Duration),
}

/// What a layer counted, over every service of it (and its clones):
/// [`RateLimitLayer::stats`](super::RateLimitLayer::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LayerStats {
    /// Requests waiting for their slot now ([`Pacing`]).
    pub waiting: usize,
    /// Requests that had no usable key (answered with the missing-key status, or counted under
    /// the fallback key).
    pub missing_keys: u64,
}
