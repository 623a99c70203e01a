//! A rule: one strategy and the quotas that must all admit a request.

use std::time::Duration;

use crate::error::ConfigError;
use crate::quota::{MAX_PERIOD, Quota, parse_quotas};
use crate::strategy::{MAX_MOVING_WINDOW_LIMIT, Params, Strategy};

/// The most quotas one rule may have.
pub const MAX_QUOTAS: usize = 16;

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
}

impl Rule {
    /// A rule from a strategy and its quotas.
    ///
    /// # Errors
    /// [`ConfigError`] when there is no quota, more than [`MAX_QUOTAS`], or a quota the strategy
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
        let nanos = params_in(strategy, &quotas, 1)?;
        Ok(Self {
            strategy,
            quotas,
            nanos,
        })
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
    pub fn horizon(&self) -> Duration {
        let ticks = self
            .nanos
            .iter()
            .map(|p| horizon_ticks(self.strategy, p))
            .max()
            .unwrap_or(0);
        Duration::from_nanos(ticks)
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
        params_in(self.strategy, &self.quotas, tick_nanos)
    }
}

pub(crate) fn horizon_ticks(strategy: Strategy, p: &Params) -> u64 {
    match strategy {
        Strategy::SlidingWindow => p.window.saturating_mul(2),
        Strategy::TokenBucket | Strategy::LeakyBucket => p.tau(),
        _ => p.window,
    }
}

fn params_in(
    strategy: Strategy,
    quotas: &[Quota],
    tick_nanos: u64,
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
            let p = Params::bucket(limit, window, u64::from(q.burst()));
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
