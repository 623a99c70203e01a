//! The per-request hooks of a [`RateLimitLayer`](super::RateLimitLayer): the request's key (and
//! what to do without one), its cost, its rule, whether it is exempt. The closures are stored
//! type-erased, so that a configured layer's type names only its key, store and clock; an unset
//! hook is `None` and costs one branch.

use std::sync::Arc;

use http::request::Parts;

use super::core::MissingKey;
use super::limits::LayerKey;
use crate::rule::Rule;

/// A request's cost (`RateLimitLayer::cost`).
pub(crate) type CostFn = Arc<dyn Fn(&Parts) -> u32 + Send + Sync>;
/// A request's rule (`RateLimitLayer::select_rule`); `None` keeps the limiter's.
pub(crate) type RuleFn = Arc<dyn Fn(&Parts) -> Option<Arc<Rule>> + Send + Sync>;
/// Whether a request is exempt (`RateLimitLayer::skip`).
pub(crate) type SkipFn = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// The per-request hooks: key (and what to do without one), cost, rule, skip.
pub struct Hooks<X: LayerKey> {
    pub(crate) key: X,
    pub(crate) missing: MissingKey<X::Key>,
    pub(crate) cost: Option<CostFn>,
    pub(crate) rule: Option<RuleFn>,
    pub(crate) skip: Option<SkipFn>,
}

impl<X: LayerKey> Hooks<X> {
    /// No hooks: every request costs 1, under the limiter's rule, none exempt; a request without
    /// a key gets a `400`.
    pub(crate) fn new(key: X) -> Self {
        Self {
            key,
            missing: MissingKey::default(),
            cost: None,
            rule: None,
            skip: None,
        }
    }

    /// The request's cost (default 1).
    #[inline]
    pub(crate) fn cost(&self, parts: &Parts) -> u32 {
        match &self.cost {
            None => 1,
            Some(f) => call_cost(f, parts),
        }
    }

    /// The request's rule, when not the limiter's.
    #[inline]
    pub(crate) fn rule(&self, parts: &Parts) -> Option<Arc<Rule>> {
        match &self.rule {
            None => None,
            Some(f) => call_rule(f, parts),
        }
    }

    /// Whether the request bypasses the limiter.
    #[inline]
    pub(crate) fn skip(&self, parts: &Parts) -> bool {
        match &self.skip {
            None => false,
            Some(f) => call_skip(f, parts),
        }
    }
}

// The calls of set hooks, out of line: the request path without hooks stays a short stretch of
// code (its callers are inlined into the service's `call`, whose size decides what else is).

#[inline(never)]
fn call_cost(f: &CostFn, parts: &Parts) -> u32 {
    f(parts)
}

#[inline(never)]
fn call_rule(f: &RuleFn, parts: &Parts) -> Option<Arc<Rule>> {
    f(parts)
}

#[inline(never)]
fn call_skip(f: &SkipFn, parts: &Parts) -> bool {
    f(parts)
}

impl<X: LayerKey + Clone> Clone for Hooks<X> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            missing: self.missing.clone(),
            cost: self.cost.clone(),
            rule: self.rule.clone(),
            skip: self.skip.clone(),
        }
    }
}

impl<X: LayerKey + std::fmt::Debug> std::fmt::Debug for Hooks<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |hook: bool| if hook { "<fn>" } else { "default" };
        f.debug_struct("Hooks")
            .field("key", &self.key)
            .field("cost", &set(self.cost.is_some()))
            .field("rule", &set(self.rule.is_some()))
            .field("skip", &set(self.skip.is_some()))
            .finish_non_exhaustive()
    }
}
