//! The Tower layer: [`RateLimitLayer`] and [`RateLimitService`], plus [`PaceLayer`] for clients.
//!
//! For every request the service extracts a key ([`crate::key`]), asks the [`RateLimiter`] for a
//! [`Decision`] on it (cost 1 unless [`RateLimitLayer::cost`] says otherwise), and then:
//!
//! - **allowed**: marks the request with its `Decision` (handlers show "attempts left": an axum
//!   extractor, or [`Decision::from_extensions`]), calls the inner service, and writes
//!   `x-ratelimit-limit`, `x-ratelimit-remaining` and `x-ratelimit-reset` on its response
//!   (replacing any the inner service set; turn off with
//!   [`headers_on_allowed(false)`](RateLimitLayer::headers_on_allowed));
//! - **rejected**: answers `429 Too Many Requests` without calling the inner service, with the same
//!   fields, `Retry-After` (whole seconds, rounded up, at least 1), a short text/plain body, and the
//!   `Decision` in the response's extensions. A request whose cost can never be admitted gets a 429
//!   without `Retry-After` whose body says so;
//! - **no key**: `400 Bad Request` (text/plain), or a shared fallback key
//!   ([`fallback_key`](RateLimitLayer::fallback_key));
//! - **store failure**: passes the request without rate-limit headers (fail open, the default:
//!   warned about at most once a second and counted in [`Stats::fail_open`](crate::Stats)), or
//!   answers `503` ([`fail_closed`](RateLimitLayer::fail_closed)).
//!
//! Header values follow the [guide](crate::guide::headers) (the formulas per strategy are
//! [there](crate::guide::strategies#formulas-per-strategy) too): `x-ratelimit-reset` is the delay in seconds
//! (rounded up; [`ResetFormat::Unix`] for Unix time), the IETF draft's `RateLimit` and
//! `RateLimit-Policy` fields are available with [`HeaderStyle`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{Router, body::Body, routing::get};
//! use http::{Request, StatusCode};
//! use tollgate::{ManualClock, RateLimiter, Strategy};
//! use tollgate::key::PeerIp;
//! use tollgate::layer::RateLimitLayer;
//! use tower::ServiceExt;
//!
//! let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::FixedWindow)
//!     .quotas("2/minute").unwrap()
//!     .clock(clock.clone())
//!     .build()
//!     .unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(RateLimitLayer::new(limiter, PeerIp::default()));
//!
//! let request = || {
//!     let mut req = Request::get("/").body(Body::empty()).unwrap();
//!     // `axum::serve(.., app.into_make_service_with_connect_info::<SocketAddr>())` does this.
//!     let peer: SocketAddr = "203.0.113.9:5000".parse().unwrap();
//!     req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
//!     req
//! };
//! let res = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["x-ratelimit-limit"], "2");
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
//! assert_eq!(res.headers()["x-ratelimit-reset"], "40", "the window ends at the next whole minute");
//! app.clone().oneshot(request()).await.unwrap();
//! let res = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["retry-after"], "40");
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
//! clock.advance(Duration::from_secs(40));
//! assert_eq!(app.oneshot(request()).await.unwrap().status(), StatusCode::OK);
//! # }
//! ```
//!
//! # Options
//! - [`cost`](RateLimitLayer::cost): a request's cost from its head (default 1; 0 = peek).
//! - [`select_rule`](RateLimitLayer::select_rule): a rule per request, for tiers by plan.
//! - [`skip`](RateLimitLayer::skip): exempt health checks, CORS preflight `OPTIONS`, allow-listed
//!   networks.
//! - [`on_rejected`](RateLimitLayer::on_rejected): build the 429 yourself (the layer still adds the
//!   headers and the `Decision`).
//! - [`pacing`](RateLimitLayer::pacing): wait up to a maximum delay for a slot instead of rejecting.
//! - Settlement: a handler that inserts [`Settle`] into its response's extensions gets its request
//!   charged what it says instead of its cost (`Settle::refund()`: nothing, "only failures count",
//!   see the `login` example). Only the innermost layer that counted the request settles it (or the
//!   one [`Settle::for_limiter`] names): enclosing limiters keep their count.
//! - [`log_keys`](RateLimitLayer::log_keys): name keys in `tracing` events (off by default).
//!
//! # Layer order and CORS
//! `Retry-After` and `x-ratelimit-*` are not CORS-safelisted: list them in
//! `Access-Control-Expose-Headers`, and put the rate limiter *inside* the CORS layer (added before
//! it with `Router::layer`) so 429s carry CORS headers too. Put it after authentication when
//! keying by user. Stacked layers count a request once per limiter and key: a second layer on the
//! same limiter and key (route and router level) lets the request through uncounted, and a request
//! rejected by an outer layer never reaches, nor counts in, an inner one. When layers on different
//! limiters both answer, an inner layer's 429 keeps its own fields (the rejecting limiter's); on
//! allowed responses the `x-ratelimit-*` fields come from the limiter with the fewest remaining
//! (ties: the later reset), so a client sees the budget that runs out first, and every limiter
//! adds its items to the IETF fields: `RateLimit-Policy` one per quota (named after the limiter,
//! `NAME-i` with several quotas), `RateLimit` one per limiter (its reported quota). Item names
//! stay unique per response: a limiter whose names an inner one already used takes the first free
//! suffix (`NAME-2`, ...). This holds whatever sits between the layers (a middleware that rebuilds
//! the request) and with a rules layer (`tollgate::rules`) among them.
//!
//! # Metrics
//! With the `metrics` feature (on with `rules`) the layer records the `tollgate_*` metrics of
//! `tollgate::metrics` under its limiter's name: outcomes, units, store errors and latency per
//! request (units once settled); keys, evictions and the circuit breaker refreshed every second
//! (or at once with `RateLimitLayer::publish_stats`).
//!
//! # Plain hyper
//! Insert [`PeerAddr`](crate::key::PeerAddr) into each request of a connection (see the `hyper`
//! example); `tower::ServiceBuilder` stacks the layer as usual.

mod body;
mod concurrency;
mod core;
mod counted;
mod future;
mod grpc;
mod hooks;
mod ietf;
#[allow(clippy::module_inception)]
mod layer;
mod limits;
mod numbers;
mod pace;
pub(crate) mod response;
mod service;
mod settle;
mod unmatched;
mod wait_guard;

#[cfg(feature = "rules")]
pub(crate) use body::Tail;
pub use body::{BoxError, ResponseBody};
#[cfg(feature = "rules")]
pub(crate) use concurrency::OverCap;
#[cfg(feature = "rules")]
pub(crate) use concurrency::Slot;
pub use concurrency::{ConcurrencyFuture, ConcurrencyLayer, ConcurrencyLimit, ConcurrencyService};
#[doc(hidden)]
pub use core::Options;
#[cfg(feature = "rules")]
pub use future::ResponseFuture;
#[doc(hidden)]
pub use hooks::Hooks;
pub use hooks::{LimiterRule, NoSkip, RequestCost, SelectRule, Skip, UnitCost};
pub use layer::RateLimitLayer;
#[cfg(feature = "rules")]
pub(crate) use layer::{in_ticks, queue_quota};
pub use limits::{Keyed, LayerKey, Limits, OneLimiter, Prepared, Source};
pub use pace::{PaceError, PaceFuture, PaceLayer, PaceService};
pub use response::{
    DefaultRejection, FailurePolicy, HeaderStyle, OnRejected, ProblemJson, QUOTA_EXCEEDED,
    RATELIMIT, RATELIMIT_POLICY, Refusal, RejectedBy, ResetFormat, RespondWith, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use service::RateLimitService;
#[cfg(feature = "rules")]
pub(crate) use settle::{AtEnd, BodySettle, warn_bad_value};
pub use settle::{SettleFrom, UsedUnits};
#[cfg(feature = "rules")]
pub(crate) use unmatched::{leave as leave_untaken, take as take_marker};
#[cfg(feature = "rules")]
pub(crate) use wait_guard::OnCancel;

#[allow(unused_imports)]
use crate::{Decision, RateLimiter};

/// Put this into a response's extensions to settle the request's reservation: the layer charges
/// [`units`](Settle::units) instead of the request's cost (0 gives it all back: "only failures
/// count", see the `login` example), and the headers show the settled state. With axum:
/// `(Extension(Settle::refund()), "welcome")`.
///
/// Only one limiter settles it, never another's reservation: by default the innermost layer that
/// counted the request (it takes the marker out of the response, so enclosing layers keep their
/// count); [`for_limiter`](Settle::for_limiter) names another layer's limiter instead. A
/// rules file (`tollgate::rules`) takes an unnamed marker only for its limits with `settle =
/// "marker"` (and a named one for the limit of that name), and otherwise leaves it to the layer
/// around it. A marker that no layer takes (no limiter of its name counted the request, or no
/// limit settles unnamed markers) is counted, when the response goes, in
/// `tollgate_settle_unmatched_total{limit}` (feature `metrics`; `""` when unnamed) and logged
/// once per name: the request keeps its charge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Settle {
    units: u32,
    limiter: Option<std::borrow::Cow<'static, str>>,
}

impl Settle {
    /// Gives the whole cost back (charges 0 units).
    pub fn refund() -> Self {
        Self::default()
    }

    /// Charges `units` instead of the request's cost.
    pub fn units(units: u32) -> Self {
        Self {
            units,
            limiter: None,
        }
    }

    /// Settles with the layer whose limiter is named `name` (see
    /// [`Builder::name`](crate::Builder::name)) instead of the innermost one that counted the
    /// request.
    #[must_use]
    pub fn for_limiter(mut self, name: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.limiter = Some(name.into());
        self
    }

    /// The units to charge.
    pub fn charged(&self) -> u32 {
        self.units
    }

    /// The limiter named, if one is.
    pub fn limiter(&self) -> Option<&str> {
        self.limiter.as_deref()
    }

    /// Whether the layer of limiter `name` settles this marker.
    pub(crate) fn is_for(&self, name: &str) -> bool {
        self.limiter.as_deref().is_none_or(|n| n == name)
    }
}
