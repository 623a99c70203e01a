//! Settlement from the response: [`SettleFrom`] (a header, an extension, the body's end) and
//! [`UsedUnits`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderName, Response};

use super::body::Tail;
use crate::RateLimiter;
use crate::clock::Clock;
use crate::decision::Reservation;
use crate::rule::Rule;
use crate::store::{Store, StoreKey};
use crate::strategy::Op;

/// Put this into a response's extensions to report what the request used, for every layer
/// configured with [`SettleFrom::extension`] (each settles its own reservation to it; the value is
/// read, not taken). Values above `u32::MAX` leave the estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UsedUnits(u64);

impl UsedUnits {
    /// `units` used.
    pub const fn new(units: u64) -> Self {
        Self(units)
    }

    /// The units used.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Where a layer learns what a request actually cost, once the handler ran: the request is
/// admitted on its estimate ([`RateLimitLayer::cost`](super::RateLimitLayer::cost), at least 1
/// with settlement on, so a cost-0 peek never passes a key deep in debt), then its reservation is
/// settled to the value found here (see [`RateLimitLayer::settle_from`](super::RateLimitLayer::settle_from)).
///
/// - [`header`](Self::header): a response header holding a decimal count (`x-tokens-used: 1234`);
///   the response's rate-limit fields show the settled state.
/// - [`extension`](Self::extension): a [`UsedUnits`] in the response's extensions; the fields show
///   the settled state.
/// - [`trailer`](Self::trailer): a trailer at the body's end (gRPC trailing metadata); the fields
///   show the estimate.
/// - [`body`](Self::body): counted over the response body's data as it streams, settled when the
///   body ends (or is dropped: a client that goes away pays for what it got), capped per stream;
///   the fields show the estimate, as the head is sent before the count is known.
///
/// A value that is missing, negative, not a number, above `u32::MAX` or given more than once (a
/// header or trailer repeated) leaves the estimate charged, with one warning per layer. A [`Settle`](super::Settle) marker for the limiter wins
/// over the source.
#[derive(Clone)]
pub struct SettleFrom {
    pub(crate) source: Source,
    pub(crate) cap: Option<u32>,
}

/// Counts the units in a chunk of a response body.
pub(crate) type Counter = Arc<dyn Fn(&[u8]) -> u64 + Send + Sync>;

#[derive(Clone)]
pub(crate) enum Source {
    Header(HeaderName),
    Extension,
    Body(Counter),
    Trailer(HeaderName),
}

impl fmt::Debug for SettleFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("SettleFrom");
        match &self.source {
            Source::Header(name) => d.field("header", name),
            Source::Extension => d.field("extension", &"UsedUnits"),
            Source::Body(_) => d.field("body", &"<fn>"),
            Source::Trailer(name) => d.field("trailer", name),
        };
        d.field("cap", &self.cap).finish()
    }
}

impl SettleFrom {
    /// The response header `name`, a decimal count of units.
    pub fn header(name: HeaderName) -> Self {
        Self {
            source: Source::Header(name),
            cap: None,
        }
    }

    /// A [`UsedUnits`] in the response's extensions.
    pub fn extension() -> Self {
        Self {
            source: Source::Extension,
            cap: None,
        }
    }

    /// The sum of `count` over the response body's data frames, settled at the body's end: e.g.
    /// `|chunk| chunk.len() as u64` for bytes, or a count of the tokens in a stream's events.
    /// Capped per stream at [`cap`](Self::cap) (default: the rule's largest limit, so one stream
    /// never charges more than a whole quota).
    pub fn body(count: impl Fn(&[u8]) -> u64 + Send + Sync + 'static) -> Self {
        Self {
            source: Source::Body(Arc::new(count)),
            cap: None,
        }
    }

    /// The trailer `name` at the body's end, a decimal count of units (e.g. a gRPC service's usage
    /// in its trailing metadata, or an HTTP/2 trailer after a stream); settled when the body ends,
    /// capped like [`body`](Self::body). A body that ends without it (or is dropped first) leaves
    /// the estimate.
    pub fn trailer(name: HeaderName) -> Self {
        Self {
            source: Source::Trailer(name),
            cap: None,
        }
    }

    /// The most one response may be charged from this source.
    #[must_use]
    pub fn cap(mut self, units: u32) -> Self {
        self.cap = Some(units);
        self
    }

    /// The units reported in the head of `res`: `Ok(None)` when this source reads the body,
    /// `Err` for a missing or unusable value.
    pub(crate) fn read_head<B>(&self, res: &Response<B>) -> Result<Option<u32>, BadValue> {
        let units = match &self.source {
            Source::Header(name) => parse_units(only_value(res.headers(), name)?.as_bytes())?,
            Source::Extension => {
                let UsedUnits(n) = res.extensions().get().ok_or(BadValue::Missing)?;
                u32::try_from(*n).map_err(|_| BadValue::TooLarge)?
            }
            Source::Body(_) | Source::Trailer(_) => return Ok(None),
        };
        Ok(Some(self.cap.map_or(units, |cap| units.min(cap))))
    }
}

/// Why a settle value was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadValue {
    Missing,
    NotANumber,
    TooLarge,
    /// The header or trailer came more than once: which one counts cannot be told.
    Repeated,
}

impl BadValue {
    fn text(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::NotANumber => "not a non-negative decimal number",
            Self::TooLarge => "above u32::MAX",
            Self::Repeated => "given more than once",
        }
    }
}

/// The one value of `name` in `map`: a field given twice is refused, not read from its first
/// copy (a proxy or the handler may have appended a second).
fn only_value<'a>(
    map: &'a http::HeaderMap,
    name: &HeaderName,
) -> Result<&'a http::HeaderValue, BadValue> {
    let mut values = map.get_all(name).iter();
    let first = values.next().ok_or(BadValue::Missing)?;
    if values.next().is_some() {
        return Err(BadValue::Repeated);
    }
    Ok(first)
}

/// A decimal count of units, surrounding spaces allowed; no sign.
fn parse_units(bytes: &[u8]) -> Result<u32, BadValue> {
    let s = std::str::from_utf8(bytes)
        .map_err(|_| BadValue::NotANumber)?
        .trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadValue::NotANumber);
    }
    s.parse::<u32>().map_err(|_| BadValue::TooLarge)
}

/// Logs an unusable settle value, once per layer.
pub(crate) fn warn_bad_value(warned: &AtomicBool, limiter: &str, bad: BadValue) {
    if !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            limit = limiter,
            "rate limiter: the settle value of a response is {}; the estimate stands (warned once)",
            bad.text()
        );
    }
}

/// Settles a reservation to what the body's data counted, when the body ends or is dropped.
pub(crate) struct BodySettle<K: StoreKey, St: Store<K>, C: Clock> {
    pub(crate) limiter: RateLimiter<K, St, C>,
    pub(crate) key: K,
    pub(crate) rule: Option<Arc<Rule>>,
    pub(crate) reservation: Reservation,
    pub(crate) end: AtEnd,
    pub(crate) cap: u64,
    pub(crate) units: u64,
    pub(crate) warned: Arc<AtomicBool>,
    /// `tollgate_units_total` of the limit: what the body's end charged (the estimate when it
    /// stands).
    #[cfg(feature = "metrics")]
    pub(crate) charged: Option<metrics::Counter>,
}

/// What a body's end settles to: a count over its data, or a trailer's value (once seen).
pub(crate) enum AtEnd {
    Count(Counter),
    Trailer(HeaderName, Option<Result<u32, BadValue>>),
}

impl<K: StoreKey, St: Store<K>, C: Clock> Tail for BodySettle<K, St, C> {
    fn data(&mut self, chunk: &[u8]) {
        if let AtEnd::Count(count) = &self.end {
            self.units = self.units.saturating_add(count(chunk)).min(self.cap);
        }
    }

    fn trailers(&mut self, trailers: &http::HeaderMap) {
        if let AtEnd::Trailer(name, value) = &mut self.end {
            let found = only_value(trailers, name).and_then(|v| parse_units(v.as_bytes()));
            *value = Some(found);
        }
    }
}

impl<K: StoreKey, St: Store<K>, C: Clock> Drop for BodySettle<K, St, C> {
    fn drop(&mut self) {
        let name = self.limiter.name().to_owned();
        let estimate = self.reservation.cost();
        #[cfg(feature = "metrics")]
        let charged = Charged(self.charged.take());
        #[cfg(not(feature = "metrics"))]
        let charged = Charged;
        if let AtEnd::Trailer(_, value) = &self.end {
            let bad = match value {
                Some(Ok(units)) => {
                    self.units = u64::from(*units);
                    None
                }
                Some(Err(bad)) => Some(*bad),
                None => Some(BadValue::Missing),
            };
            if let Some(bad) = bad {
                charged.count(estimate);
                return warn_bad_value(&self.warned, &name, bad);
            }
        }
        let units = u32::try_from(self.units.min(self.cap)).unwrap_or(u32::MAX);
        let answer = self.limiter.apply(
            &self.key,
            self.rule.as_deref(),
            Op::settle(self.reservation, units),
        );
        match answer.into_now() {
            Ok(Ok(_)) => charged.count(units),
            Ok(Err(e)) => {
                charged.count(estimate);
                settle_failed(&name, &e);
            }
            // A store that answers later (Redis): settled in the background.
            Err(later) => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        match later.await {
                            Ok(_) => charged.count(units),
                            Err(e) => {
                                charged.count(estimate);
                                settle_failed(&name, &e);
                            }
                        }
                    });
                }
                Err(_) => {
                    charged.count(estimate);
                    tracing::warn!(
                        limit = name,
                        "rate limiter: a body ended outside a tokio runtime; its settlement is lost"
                    );
                }
            },
        }
    }
}

/// Where a body's end counts the units it charged (`tollgate_units_total`, feature `metrics`).
#[cfg(feature = "metrics")]
struct Charged(Option<metrics::Counter>);
#[cfg(not(feature = "metrics"))]
struct Charged;

impl Charged {
    fn count(&self, units: u32) {
        #[cfg(feature = "metrics")]
        if let (Some(counter), true) = (&self.0, units > 0) {
            counter.increment(u64::from(units));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = units;
    }
}

fn settle_failed(limit: &str, e: &crate::error::StoreError) {
    tracing::warn!(limit, error = %e, "rate limiter: settling at the body's end failed; the estimate stands");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_plain_decimal_counts() {
        assert_eq!(parse_units(b"0"), Ok(0));
        assert_eq!(parse_units(b" 1234 "), Ok(1234));
        assert_eq!(parse_units(b"4294967295"), Ok(u32::MAX));
        assert_eq!(parse_units(b"4294967296"), Err(BadValue::TooLarge));
        assert_eq!(
            parse_units(b"99999999999999999999999"),
            Err(BadValue::TooLarge)
        );
        for bad in [
            &b"-1"[..],
            b"+1",
            b"1.5",
            b"",
            b"  ",
            b"ten",
            b"0x10",
            b"\xff",
        ] {
            assert_eq!(parse_units(bad), Err(BadValue::NotANumber), "{bad:?}");
        }
    }
}
