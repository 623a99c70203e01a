//! [`Limits`]: what a [`RateLimitLayer`](super::RateLimitLayer)'s one pipeline decides a request
//! on. The layer's service and [`ResponseFuture`](super::ResponseFuture) decide, answer, wait,
//! settle, report headers and count metrics through it, whatever the limits are: one limiter
//! ([`OneLimiter`]), or the compiled limits of a [rules file](crate::rules).

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Response, StatusCode};

use super::Settle;
use super::body::ResponseBody;
use super::concurrency::OverCap;
use super::core::{LAYERS, MissingKey, Options, Wait};
use super::counted::{CountId, Counted, counted_id};
use super::hooks::Hooks;
use super::response::{
    HeaderStyle, item_name, rejected_inside, reported_inside, write_allowed_headers, write_headers,
};
use super::settle::{AtEnd, BodySettle, Source as SettleSource, warn_bad_value};
use super::unmatched;
use super::wait_guard::OnCancel;
use crate::clock::Clock;
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::key::{KeyError, KeyExtractor};
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::store::{Answer, Store, StoreKey};
use crate::strategy::Op;

/// The limits of a layer's requests. Implemented by [`OneLimiter`] (a [`RateLimiter`] and its
/// metrics) and by the compiled limits of a `tollgate::rules::Rules` file; not meant to be
/// implemented outside this crate (its methods are the pipeline's internals).
pub trait Limits: Clone + Sized + Send + Sync + 'static {
    /// A request's keys under these limits.
    type Keys: Send + 'static;
    /// What a check decided and holds until the response (reservations, the fields to report).
    type Decided: Send + 'static;
    /// A decision or settlement: known at once (the memory store), or later.
    type Answer: Future<Output = Result<Self::Decided, StoreError>> + Send;

    /// Whether a store error these limits return is always answered as failing closed (their
    /// own policy decided it), or by the layer's [`FailurePolicy`](super::FailurePolicy).
    #[doc(hidden)]
    const STORE_ERRORS_CLOSE: bool = false;

    /// Whether the limits write their fields as their own configuration says (a rules file's
    /// `header_style`, `reset` and names), so that a layer's [`Headers`](super::Headers) sets only
    /// `on_allowed`.
    #[doc(hidden)]
    const FIELDS_OF_THEIR_OWN: bool = false;

    #[doc(hidden)]
    fn name(&self) -> &str;
    /// The rule a shaping queue drains and the store's tick, or why these limits take no queue
    /// (a rules file sets its queues per limit).
    #[doc(hidden)]
    fn queue_base(&self) -> Result<(&Rule, Duration), crate::ConfigError> {
        Err(crate::ConfigError::QueueInRulesFile)
    }
    #[doc(hidden)]
    fn check(&self, keys: &mut Self::Keys, cost: u32) -> Self::Answer;
    #[doc(hidden)]
    fn into_now(answer: Self::Answer) -> Result<Result<Self::Decided, StoreError>, Self::Answer>;
    /// The decision that speaks for `d`: its outcome, and the fields of its `429`.
    #[doc(hidden)]
    fn decision(d: &Self::Decided) -> Decision;
    /// The outcome of `d` (what [`decision`](Self::decision) says, without building it).
    #[doc(hidden)]
    fn outcome(d: &Self::Decided) -> Outcome;
    /// How long a request admitted by `d` waits for its departure (a shaping queue).
    #[doc(hidden)]
    fn queue_wait(o: &Options<Self>, keys: &Self::Keys, cost: u32, d: &Self::Decided) -> Duration;
    /// The state at a queued request's departure (its slot is held: only the fields change).
    #[doc(hidden)]
    fn departure(&self, keys: &Self::Keys, reserved: &Self::Decided) -> Self::Answer;
    /// What a queued request whose client went away undoes.
    #[doc(hidden)]
    fn on_cancel(&self, keys: &Self::Keys, cost: u32, reserved: &Self::Decided) -> OnCancel;
    /// Settles the reservations of `d` (a request of `cost`) to what `res` says the request
    /// cost: the settlement and the units it charges; `None`: the estimate stands (for now). A
    /// [`Settle`] marker it leaves untaken is counted when the response goes, unless a layer
    /// around takes it.
    #[doc(hidden)]
    fn settle<B>(
        o: &Options<Self>,
        keys: &Self::Keys,
        cost: u32,
        d: &Self::Decided,
        res: &mut Response<B>,
    ) -> Option<(Self::Answer, u32)>;
    /// Counts the units a forwarded request was charged, once known (limits that count their
    /// units per limit do it themselves).
    #[doc(hidden)]
    fn count_charged(&self, units: u32);
    /// `d` once a settlement of it was tried (and failed): its estimate stands, and nothing
    /// settles it again at the body's end.
    #[doc(hidden)]
    fn settle_tried(d: Self::Decided) -> Self::Decided {
        d
    }
    /// The response with its body watched for a settlement at its end, when configured.
    #[doc(hidden)]
    fn watch_body<B>(
        o: &Options<Self>,
        keys: &Self::Keys,
        d: &Self::Decided,
        res: Response<B>,
    ) -> Response<ResponseBody<B>>;
    /// Counts a decision in the metrics: `admitted` with its units (once settled for a file).
    #[doc(hidden)]
    fn count_decided(&self, keys: &Self::Keys, cost: u32, d: &Self::Decided, admitted: bool);
    /// A store failure answered by the failure policy (logged, counted, `fail_open` recorded):
    /// the error, naming the limiter that failed.
    #[doc(hidden)]
    fn store_failed(
        o: &Options<Self>,
        keys: &Self::Keys,
        e: StoreError,
        closed: bool,
    ) -> StoreError;
    /// A store failure on a settlement or a departure (the estimate or reservation stands).
    #[doc(hidden)]
    fn count_store_error(&self);
    /// Records how long a decision that was not ready at once took.
    #[doc(hidden)]
    fn time_store(&self, asked: std::time::Instant);
    /// The name of the item `d` violated, for the rejection hook (`ProblemJson`).
    #[doc(hidden)]
    fn violated<'a>(o: &'a Options<Self>, keys: &'a Self::Keys, d: &Self::Decided) -> Cow<'a, str>;
    /// Logs a rejection and writes its fields and marker into `res`.
    #[doc(hidden)]
    fn write_rejected<B>(
        o: &Options<Self>,
        keys: &Self::Keys,
        d: Self::Decided,
        res: &mut Response<B>,
    );
    /// Writes the fields of an allowed response, joined with the layers' inside; `enclosed`: the
    /// request arrived marked by an enclosing layer.
    #[doc(hidden)]
    fn write_allowed<B>(
        o: &Options<Self>,
        keys: &Self::Keys,
        d: &Self::Decided,
        enclosed: bool,
        res: &mut Response<B>,
    );
}

/// The key type of a layer's hooks (a [`KeyPolicy`](super::KeyPolicy)'s fallback key): a key
/// extractor's, or a rules file's encoded keys.
pub trait LayerKey {
    /// The key.
    type Key: Clone + Send + Sync + 'static;
}

impl<X: KeyExtractor> LayerKey for X {
    type Key = X::Key;
}

/// What a [`RateLimitLayer`](super::RateLimitLayer) reads its requests' keys with, and so what
/// its limits are: a [`KeyExtractor`] (one limiter, [`OneLimiter`]), or a rules file's
/// `tollgate::rules::FileLimits` (its compiled limits). Not meant to be implemented
/// outside this crate.
pub trait Source<St, C>: LayerKey + Sized + Send + Sync + 'static {
    /// The limits the layer decides on.
    type Limits: Limits;

    /// The request's keys and cost, or why it is not decided.
    #[doc(hidden)]
    fn prepare(
        hooks: &Hooks<Self>,
        o: &Options<Self::Limits>,
        parts: &Parts,
    ) -> Prepared<<Self::Limits as Limits>::Keys>;
}

/// What a layer's service reads from a request before deciding it.
#[doc(hidden)]
#[derive(Debug)]
pub enum Prepared<Keys> {
    /// Forward it untouched (no limit applies, or it was counted under these limits already).
    Pass,
    /// It has no key: answer with this status.
    NoKey(StatusCode, KeyError),
    /// Decide it.
    Decide {
        keys: Keys,
        cost: u32,
        /// Its stacked-layer marker (`None`: limits that do not mark).
        id: Option<CountId>,
        /// Whether it arrived marked by an enclosing layer.
        marked: bool,
    },
}

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock> Source<St, C> for X {
    type Limits = OneLimiter<X::Key, St, C>;

    #[inline]
    fn prepare(
        hooks: &Hooks<X>,
        o: &Options<Self::Limits>,
        parts: &Parts,
    ) -> Prepared<Keyed<X::Key>> {
        let extracted = hooks.key.extract(parts);
        if extracted.is_err() {
            o.missing_keys
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let key = match extracted {
            Ok(key) => key,
            Err(e) => match &hooks.missing {
                MissingKey::Fallback(key) => {
                    tracing::debug!(
                        limit = o.limits.limiter.name(),
                        reason = e.reason(),
                        "rate limit: fallback key"
                    );
                    key.clone()
                }
                MissingKey::Reject(status) => {
                    tracing::debug!(
                        limit = o.limits.limiter.name(),
                        reason = e.reason(),
                        "rate limit: request without a key"
                    );
                    #[cfg(feature = "metrics")]
                    o.limits.metrics.no_key.increment(1);
                    return Prepared::NoKey(*status, e);
                }
            },
        };
        // One request, one count: a second layer on the same limiter and key lets it through. The
        // request is marked when it is forwarded (a rejected one never meets another layer).
        // In queue mode the limiter's own rule gives way to the queue's.
        let rule = hooks.rule(parts).or_else(|| o.queue_rule());
        let rule_ref = rule.as_deref().unwrap_or_else(|| o.limits.limiter.rule());
        let id = counted_id(&o.limits.limiter, rule_ref, &key);
        let counted = parts.extensions.get::<Counted>();
        let marked = counted.is_some();
        if counted.is_some_and(|c| c.contains(id)) {
            return Prepared::Pass;
        }
        let mut cost = hooks.cost(parts);
        if o.settle.is_some() {
            // A cost-0 peek must not pass a key deep in debt: settlement admits on at least 1.
            cost = cost.max(1);
        }
        Prepared::Decide {
            keys: Keyed { key, rule },
            cost,
            id: Some(id),
            marked,
        }
    }
}

/// One limiter as the [`Limits`] of a layer, with its metric handles (its name is the `limit`
/// label).
pub struct OneLimiter<K, St, C> {
    pub(crate) limiter: RateLimiter<K, St, C>,
    /// Its handles, and its gauges refreshed every second while the layer lives.
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Arc<crate::metrics::LimiterMetrics<K, St, C>>,
}

impl<K, St, C> OneLimiter<K, St, C> {
    pub(crate) fn new(limiter: RateLimiter<K, St, C>) -> Self
    where
        K: StoreKey,
        St: Store<K>,
        C: Clock,
    {
        Self {
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::LimiterMetrics::refreshed(limiter.clone()),
            limiter,
        }
    }
}

impl<K: Clone, St, C> Clone for OneLimiter<K, St, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            #[cfg(feature = "metrics")]
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// A request's key under one limiter, and the rule it is checked under when not the limiter's own
/// (`select_rule`, a shaping queue).
pub struct Keyed<K> {
    pub(crate) key: K,
    pub(crate) rule: Option<Arc<Rule>>,
}

impl<K: StoreKey, St: Store<K>, C: Clock> OneLimiter<K, St, C> {
    fn rule<'a>(&'a self, keys: &'a Keyed<K>) -> &'a Rule {
        keys.rule.as_deref().unwrap_or_else(|| self.limiter.rule())
    }

    /// The request's partition key (`pk`), when the layer writes one.
    fn partition_key(o: &Options<Self>, keys: &Keyed<K>) -> Option<String> {
        let ietf = matches!(o.headers.style, HeaderStyle::Ietf | HeaderStyle::Both);
        let secret = o.headers.pk.as_ref().filter(|_| ietf)?;
        Some(secret.partition_key(&keys.key))
    }

    fn key_text(o: &Options<Self>, keys: &Keyed<K>) -> Option<String> {
        o.log_keys.then(|| keys.key.log_text())
    }
}

impl<K: StoreKey, St: Store<K>, C: Clock> Limits for OneLimiter<K, St, C> {
    type Keys = Keyed<K>;
    type Decided = Decision;
    type Answer = Answer<St::Future>;

    fn name(&self) -> &str {
        self.limiter.name()
    }

    fn queue_base(&self) -> Result<(&Rule, Duration), crate::ConfigError> {
        Ok((self.limiter.rule(), self.limiter.store().tick()))
    }

    #[inline]
    fn check(&self, keys: &mut Keyed<K>, cost: u32) -> Self::Answer {
        self.limiter
            .apply(&keys.key, keys.rule.as_deref(), Op::Check(cost))
    }

    #[inline]
    fn into_now(answer: Self::Answer) -> Result<Result<Decision, StoreError>, Self::Answer> {
        answer.into_now()
    }

    #[inline]
    fn decision(d: &Decision) -> Decision {
        *d
    }

    #[inline]
    fn outcome(d: &Decision) -> Outcome {
        d.outcome()
    }

    /// In queue mode the check reserved the slot `[departure, departure + cost x T)`, and its
    /// reset is the slot's end.
    #[inline]
    fn queue_wait(o: &Options<Self>, keys: &Keyed<K>, cost: u32, d: &Decision) -> Duration {
        match (&o.pacing, &keys.rule) {
            (Some(Wait::Queue { rule, emission }), Some(mine))
                if d.is_allowed() && Arc::ptr_eq(rule, mine) =>
            {
                let slot = u64::from(cost).saturating_mul(*emission);
                Duration::from_nanos(d.reset_after.saturating_sub(slot))
            }
            _ => Duration::ZERO,
        }
    }

    fn departure(&self, keys: &Keyed<K>, _reserved: &Decision) -> Self::Answer {
        self.limiter
            .apply(&keys.key, keys.rule.as_deref(), Op::Peek)
    }

    /// It gives its slot back if it still holds the queue's last reservation; otherwise the gap
    /// stays. On a remote store the call is spawned (the future is gone), and a failure leaves
    /// the gap.
    fn on_cancel(&self, keys: &Keyed<K>, cost: u32, reserved: &Decision) -> OnCancel {
        let limiter = self.limiter.clone();
        let key = keys.key.clone();
        let rule = keys.rule.clone();
        let op = Op::StepBack {
            cost,
            end: reserved.time.saturating_add(reserved.reset_after),
        };
        Box::new(move || {
            if let Err(later) = limiter.apply(&key, rule.as_deref(), op).into_now() {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let name = limiter.name().to_owned();
                    rt.spawn(async move {
                        if let Err(e) = later.await {
                            tracing::debug!(limit = name, error = %e, "queue: a cancelled waiter's step back failed");
                        }
                    });
                }
            }
        })
    }

    /// The units: the response's [`Settle`] marker for this limiter (taken out: an enclosing
    /// limiter never settles this one's reservation), else the configured source's value when
    /// the head has it. Not in queue mode, where a slot given back would put two waiters in one.
    /// The estimate is counted here when it stands; a body's end counts what it settles.
    fn settle<B>(
        o: &Options<Self>,
        keys: &Keyed<K>,
        cost: u32,
        d: &Decision,
        res: &mut Response<B>,
    ) -> Option<(Self::Answer, u32)> {
        let units = if res.extensions().get::<OverCap>().is_some() {
            // Refused by a concurrency cap inside: the request never ran.
            Some(0)
        } else {
            let name = o.limits.limiter.name();
            match res.extensions().get::<Settle>() {
                Some(s) if s.is_for(name) => {
                    unmatched::take(res.extensions_mut()).map(|s| s.charged())
                }
                other => {
                    if let Some(s) = other.cloned() {
                        unmatched::leave(res.extensions_mut(), &s);
                    }
                    match o.settle.as_ref().map(|from| from.read_head(res)) {
                        // Read at the body's end, which counts what it settles.
                        Some(Ok(None)) if d.reservation().is_some() => return None,
                        Some(Ok(units)) => units,
                        Some(Err(bad)) => {
                            warn_bad_value(&o.settle_warned, name, bad);
                            None
                        }
                        None => None,
                    }
                }
            }
        };
        let queued = matches!(o.pacing, Some(Wait::Queue { .. }));
        let Some((reservation, units)) = units
            .filter(|_| !queued)
            .and_then(|units| Some((d.reservation()?, units)))
        else {
            o.limits.count_charged(cost);
            return None;
        };
        let settle = o.limits.limiter.apply(
            &keys.key,
            keys.rule.as_deref(),
            Op::settle(reservation, units),
        );
        Some((settle, units))
    }

    #[inline]
    fn count_charged(&self, units: u32) {
        #[cfg(feature = "metrics")]
        self.metrics.charged(units);
        #[cfg(not(feature = "metrics"))]
        let _ = units;
    }

    fn settle_tried(d: Decision) -> Decision {
        d.settled()
    }

    fn watch_body<B>(
        o: &Options<Self>,
        keys: &Keyed<K>,
        d: &Decision,
        res: Response<B>,
    ) -> Response<ResponseBody<B>> {
        let mut res = res.map(ResponseBody::inner);
        let (Some(from), Some(reservation)) = (o.settle.as_ref(), d.reservation()) else {
            return res;
        };
        let end = match &from.source {
            SettleSource::Body(count) => AtEnd::Count(Arc::clone(count)),
            SettleSource::Trailer(name) => AtEnd::Trailer(name.clone(), None),
            SettleSource::Header(_) | SettleSource::Extension => return res,
        };
        let cap = from.cap.map_or_else(
            || {
                o.limits
                    .rule(keys)
                    .quotas()
                    .iter()
                    .map(|q| u64::from(q.limit().max(q.burst())))
                    .max()
                    .unwrap_or(u64::MAX)
            },
            u64::from,
        );
        res.body_mut().watch(Box::new(BodySettle {
            limiter: o.limits.limiter.clone(),
            key: keys.key.clone(),
            rule: keys.rule.clone(),
            reservation,
            end,
            cap,
            units: 0,
            warned: Arc::clone(&o.settle_warned),
            #[cfg(feature = "metrics")]
            charged: Some(o.limits.metrics.units.clone()),
        }));
        res
    }

    /// The units of an admitted request are counted once settled ([`count_charged`](Limits::count_charged)).
    #[inline]
    fn count_decided(&self, _keys: &Keyed<K>, _cost: u32, d: &Decision, _admitted: bool) {
        #[cfg(feature = "metrics")]
        self.metrics.decided(d);
        #[cfg(not(feature = "metrics"))]
        let _ = d;
    }

    fn store_failed(o: &Options<Self>, keys: &Keyed<K>, e: StoreError, closed: bool) -> StoreError {
        let e = e.for_limiter(o.limits.limiter.name());
        o.limits.count_store_error();
        // At most one warning a second, however many requests fail.
        if o.last_warn.ready(Duration::from_secs(1)) {
            let policy = if closed {
                "failing closed (503)"
            } else {
                "failing open"
            };
            tracing::warn!(
                limit = o.limits.limiter.name(),
                error = %e,
                key = Self::key_text(o, keys),
                "rate-limit store failed; {policy}"
            );
        }
        #[cfg(feature = "metrics")]
        if closed {
            o.limits.metrics.fail_closed.increment(1);
        } else {
            o.limits.metrics.fail_open.increment(1);
        }
        if !closed {
            o.limits.limiter.record_fail_open();
        }
        e
    }

    fn count_store_error(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.store_errors.increment(1);
    }

    fn time_store(&self, asked: std::time::Instant) {
        #[cfg(feature = "metrics")]
        self.metrics
            .store_latency
            .record(asked.elapsed().as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = asked;
    }

    fn violated<'a>(o: &'a Options<Self>, keys: &'a Keyed<K>, d: &Decision) -> Cow<'a, str> {
        item_name(&o.headers, o.limits.rule(keys), d.quota_index())
    }

    fn write_rejected<B>(o: &Options<Self>, keys: &Keyed<K>, d: Decision, res: &mut Response<B>) {
        tracing::debug!(
            limit = o.limits.limiter.name(),
            key = Self::key_text(o, keys),
            quota_limit = d.limit(),
            retry_after = d.retry_after_secs(),
            exceeds = d.outcome() == Outcome::Exceeds,
            "rate limited"
        );
        let pk = Self::partition_key(o, keys);
        write_headers(
            res.headers_mut(),
            &d,
            o.limits.rule(keys),
            &o.headers,
            pk.as_deref(),
        );
        res.extensions_mut().insert(d);
    }

    fn write_allowed<B>(
        o: &Options<Self>,
        keys: &Keyed<K>,
        d: &Decision,
        enclosed: bool,
        res: &mut Response<B>,
    ) {
        if o.headers.on_allowed && !rejected_inside(res.extensions()) {
            let below = reported_inside(res.extensions_mut());
            let pk = Self::partition_key(o, keys);
            let reported = write_allowed_headers(
                below,
                res.headers_mut(),
                d,
                o.limits.rule(keys),
                &o.headers,
                pk.as_deref(),
            );
            if LAYERS.report(enclosed) {
                res.extensions_mut().insert(reported);
            }
        }
    }
}

impl<K, St: std::fmt::Debug, C: std::fmt::Debug> std::fmt::Debug for OneLimiter<K, St, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneLimiter")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<K: std::fmt::Debug> std::fmt::Debug for Keyed<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed")
            .field("key", &self.key)
            .field("rule", &self.rule)
            .finish()
    }
}
