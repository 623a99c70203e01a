//! The per-request hooks of a [`RateLimitLayer`](super::RateLimitLayer): the request's cost, its
//! rule, whether it is exempt; and [`Hooks`], the four of them (with the key extractor) as one
//! value carried through the layer's type-changing setters.

use std::sync::Arc;

use http::request::Parts;

use crate::rule::Rule;

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

/// The per-request hooks: key (and what to do without one), cost, rule, skip.
#[derive(Clone)]
pub struct Hooks<X: super::limits::LayerKey, Co, Ru, Sk> {
    pub(crate) key: X,
    pub(crate) missing: super::core::MissingKey<X::Key>,
    pub(crate) cost: Co,
    pub(crate) rule: Ru,
    pub(crate) skip: Sk,
}

impl<X: super::limits::LayerKey + std::fmt::Debug, Co, Ru, Sk> std::fmt::Debug
    for Hooks<X, Co, Ru, Sk>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
