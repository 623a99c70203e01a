//! A rule: one strategy and the quotas that must all admit a request.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::ConfigError;
use crate::offset::WindowOffset;
use crate::quota::{MAX_PERIOD, Quota, parse_quotas};
use crate::strategy::{MAX_MOVING_WINDOW_LIMIT, Params, Strategy};

/// The most quotas one rule may have ([`Rule::MAX_QUOTAS`]).
pub(crate) const MAX_QUOTAS: usize = 16;

/// One strategy and one or more quotas, all of which must admit a request.
///
/// ```
/// use tollgate::{Rule, Strategy};
///
/// let rule = Rule::parse(Strategy::SlidingWindow, "5/second; 100/minute").unwrap();
/// assert_eq!(rule.quotas().len(), 2);
/// assert!(Rule::parse(Strategy::TokenBucket, "4294967295/ms").is_err(), "T below 1 ns");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    strategy: Strategy,
    quotas: Vec<Quota>,
    nanos: Vec<Params>,
    /// The time zone the clock-aligned windows follow (UTC unless set; only on the strategies
    /// that have such windows).
    offset: WindowOffset,
    /// A fingerprint of the strategy, quotas and offset, the same in every process (see
    /// [`Rule::tag`]).
    tag: u64,
    /// What a store works out from the rule once and keeps with it (see [`Rule::store_cache`]).
    cache: StoreCache,
}

impl Rule {
    /// The most quotas one rule may have.
    pub const MAX_QUOTAS: usize = MAX_QUOTAS;

    /// The largest limit a moving-window quota accepts: each admitted unit costs 8 bytes of log,
    /// so one key can hold at most 8 MiB.
    pub const MAX_MOVING_WINDOW_LIMIT: u32 = MAX_MOVING_WINDOW_LIMIT;

    /// A rule from a strategy and its quotas.
    ///
    /// # Errors
    /// [`ConfigError`] when there is no quota, more than [`Rule::MAX_QUOTAS`], or a quota the strategy
    /// cannot represent in nanoseconds (see [`ConfigError`]).
    pub fn new(
        strategy: Strategy,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<Self, ConfigError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        if quotas.is_empty() {
            return Err(ConfigError::NoQuota);
        }
        if quotas.len() > MAX_QUOTAS {
            return Err(ConfigError::TooManyQuotas(quotas.len()));
        }
        let nanos = params_in(strategy, &quotas, 1, WindowOffset::UTC)?;
        let tag = fingerprint(strategy, &quotas, WindowOffset::UTC);
        Ok(Self {
            strategy,
            quotas,
            nanos,
            offset: WindowOffset::UTC,
            tag,
            cache: StoreCache::default(),
        })
    }

    /// This rule with its clock-aligned windows following the clock of the time zone at `offset`
    /// from UTC (see [`WindowOffset`]): a `1/day` quota with `+08:00` resets at 16:00 UTC. A key's
    /// state under one offset is converted to another (its spend placed in the new offset's
    /// current window). Only [`Strategy::FixedWindow`] and [`Strategy::SlidingWindow`] have
    /// clock-aligned windows; on the others the offset is ignored, with a warning.
    ///
    /// ```
    /// use tollgate::{Rule, Strategy, WindowOffset};
    ///
    /// let rule = Rule::parse(Strategy::FixedWindow, "1/day").unwrap()
    ///     .with_window_offset("8h".parse().unwrap());
    /// assert_eq!(rule.window_offset(), "+08:00".parse::<WindowOffset>().unwrap());
    /// ```
    #[must_use]
    pub fn with_window_offset(mut self, offset: WindowOffset) -> Self {
        if !matches!(
            self.strategy,
            Strategy::FixedWindow | Strategy::SlidingWindow
        ) {
            if !offset.is_utc() {
                tracing::warn!(
                    strategy = %self.strategy,
                    %offset,
                    "a window offset has no effect on this strategy: it has no clock-aligned windows"
                );
            }
            return self;
        }
        self.offset = offset;
        for (p, q) in self.nanos.iter_mut().zip(&self.quotas) {
            p.offset = offset.phase(q.period_nanos().max(1), Duration::from_nanos(1));
        }
        self.tag = fingerprint(self.strategy, &self.quotas, offset);
        self.cache = StoreCache::default();
        self
    }

    /// The UTC offset of the time zone the rule's clock-aligned windows follow.
    pub fn window_offset(&self) -> WindowOffset {
        self.offset
    }

    /// A rule from a strategy and quota notation (`"5/second; 100/minute"`).
    ///
    /// # Errors
    /// As [`Rule::new`], plus a parse error for bad notation.
    pub fn parse(strategy: Strategy, quotas: &str) -> Result<Self, ConfigError> {
        Self::new(strategy, parse_quotas(quotas)?)
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The quotas.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// How long a key's state matters after its last change: `W` for the fixed and moving window,
    /// `2W` for the sliding window counter, `B*T` for the buckets (the longest over the quotas).
    /// A first-hit window's is `W + g - 1`, `g` the grain (a power of two, 1 ns for limits up to
    /// `2^15 - 1` per window of up to 1.6 days, `2^17` ns for `u32::MAX` per day) to which the
    /// memory store rounds up the window's start when it packs a larger one (see ARCHITECTURE.md).
    pub fn horizon(&self) -> Duration {
        let ticks = self
            .nanos
            .iter()
            .map(|p| horizon_ticks(self.strategy, p))
            .max()
            .unwrap_or(0);
        Duration::from_nanos(ticks)
    }

    /// A fingerprint of the strategy, the quotas and the offset: what a key's state records of the
    /// rule it was written under (a decision under another converts it). Stable across processes
    /// and builds (FNV-1a), so that every instance reads a key's Redis state alike.
    pub(crate) fn tag(&self) -> u64 {
        self.tag
    }

    /// What a store derives from this rule, worked out by `init` on first use and kept with the
    /// rule, so a decision reads it without a lock (the memory store keeps how each quota fits a
    /// word). `None` if a value of another type is kept already.
    #[inline]
    pub(crate) fn store_cache<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        let kept: &Arc<dyn Any + Send + Sync> = self.cache.0.get_or_init(|| Arc::new(init()));
        kept.downcast_ref::<T>()
    }

    /// The quotas in nanoseconds (the memory store's unit).
    pub(crate) fn nanos(&self) -> &[Params] {
        &self.nanos
    }

    /// The quotas in ticks of `tick_nanos` nanoseconds (1000 for Redis's microseconds).
    ///
    /// # Errors
    /// When a bucket quota's interval is below one tick.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn params_in(&self, tick_nanos: u64) -> Result<Vec<Params>, ConfigError> {
        params_in(self.strategy, &self.quotas, tick_nanos, self.offset)
    }
}

/// A value a store derives from a rule (see [`Rule::store_cache`]): opaque to the rule, and not
/// part of its identity (equal whenever the rules' other fields are).
#[derive(Clone, Default)]
struct StoreCache(OnceLock<Arc<dyn Any + Send + Sync>>);

impl std::fmt::Debug for StoreCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCache")
    }
}

impl PartialEq for StoreCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for StoreCache {}

/// FNV-1a over the strategy's name, each quota's limit, period and burst, and the window offset
/// (when not UTC, so that the keys of rules without one stay as they were).
fn fingerprint(strategy: Strategy, quotas: &[Quota], offset: WindowOffset) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(strategy.name().as_bytes());
    for q in quotas {
        eat(&q.limit().to_le_bytes());
        eat(&q.period_nanos().to_le_bytes());
        eat(&q.burst().to_le_bytes());
    }
    if !offset.is_utc() {
        eat(b"offset");
        eat(&offset.minutes().to_le_bytes());
    }
    hash
}

pub(crate) fn horizon_ticks(strategy: Strategy, p: &Params) -> u64 {
    match strategy {
        Strategy::SlidingWindow => p.window.saturating_mul(2),
        Strategy::TokenBucket | Strategy::LeakyBucket => p.tau(),
        // The memory store packs a first-hit window's start rounded up to a grain `g` (1 ns when
        // it fits whole): its window ends up to `g - 1` ns after `W` from the first request. (In
        // Redis's microsecond ticks the same sum only lengthens the key's TTL a little.)
        Strategy::FixedWindowFirstHit => p
            .window
            .saturating_add(crate::strategy::first_hit_grain(p) - 1),
        _ => p.window,
    }
}

fn params_in(
    strategy: Strategy,
    quotas: &[Quota],
    tick_nanos: u64,
    offset: WindowOffset,
) -> Result<Vec<Params>, ConfigError> {
    let max_ticks = u64::try_from(MAX_PERIOD.as_nanos()).unwrap_or(u64::MAX) / tick_nanos;
    quotas
        .iter()
        .map(|q| {
            let window = q.period_nanos().div_ceil(tick_nanos);
            let limit = u64::from(q.limit());
            if strategy.is_bucket() && window < limit {
                return Err(ConfigError::IntervalBelowResolution {
                    quota: *q,
                    tick: Duration::from_nanos(tick_nanos),
                });
            }
            if strategy == Strategy::MovingWindow && q.limit() > MAX_MOVING_WINDOW_LIMIT {
                return Err(ConfigError::MovingWindowLimitTooLarge(*q));
            }
            let mut p = Params::bucket(limit, window, u64::from(q.burst()));
            p.offset = offset.phase(window.max(1), Duration::from_nanos(tick_nanos));
            if strategy.is_bucket()
                && p.burst
                    .checked_mul(p.emission)
                    .is_none_or(|tau| tau > max_ticks)
            {
                return Err(ConfigError::BurstTooLarge(*q));
            }
            Ok(p)
        })
        .collect()
}
