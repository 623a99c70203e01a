//! The Tower layers: [`RateLimitLayer`] (and its [`RateLimitService`]), [`ConcurrencyLayer`] for
//! requests in flight per key, and [`PaceLayer`] for clients.
//!
//! For every request the service extracts a key ([`crate::key`]), asks the [`RateLimiter`] for a
//! [`Decision`] on it (cost 1 unless [`RateLimitLayer::cost`] says otherwise), and then forwards
//! it with the rate-limit fields on its response (and the `Decision` in its extensions), or
//! answers `429 Too Many Requests` with the fields and `Retry-After` without calling the inner
//! service. A request without a key gets `400` (or a fallback key, [`KeyPolicy`]); a store
//! failure lets the request through (fail open) or answers `503` ([`FailurePolicy`]).
//!
//! [`RateLimitLayer`]'s methods group its configuration: [`Headers`] for the fields,
//! [`KeyPolicy`] for keys, [`Pacing`] to wait instead of rejecting, closures for the cost, the
//! rule, exemptions and the 429, a responder ([`ProblemJson`]) for every answer of its own, and
//! [`SettleFrom`] or the [`Settle`] marker to charge what a request used.
//!
//! The guide has the details: [headers, stacked layers and CORS](crate::guide::headers),
//! [keys and proxies](crate::guide::keys), [store failures](crate::guide::stores),
//! [settlement](crate::guide::settlement), [concurrency caps](crate::guide::concurrency),
//! [shaping queues and pacing clients](crate::guide::shaping), [metrics and
//! tracing](crate::guide::metrics), [gRPC](crate::guide::grpc) and [rules files](crate::guide::rules).

mod body;
mod concurrency;
mod config;
pub(crate) mod core;
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

pub use body::ResponseBody;
#[cfg(feature = "rules")]
pub(crate) use body::Tail;
#[cfg(feature = "rules")]
pub(crate) use concurrency::OverCap;
#[cfg(feature = "rules")]
pub(crate) use concurrency::Slot;
pub use concurrency::{ConcurrencyLayer, ConcurrencyLimit};
pub use config::{Headers, KeyPolicy, LayerStats, Pacing};
#[cfg(feature = "rules")]
pub(crate) use core::Options;
#[cfg(feature = "rules")]
pub(crate) use hooks::Hooks;
pub use layer::RateLimitLayer;
#[cfg(feature = "rules")]
pub(crate) use layer::{in_ticks, queue_quota};
#[cfg(feature = "rules")]
pub(crate) use limits::{LayerKey, Limits, Prepared, Source};
pub use pace::{PaceError, PaceLayer};
pub use response::{FailurePolicy, HeaderStyle, OnRejected, ProblemJson, Refusal, ResetFormat};
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
