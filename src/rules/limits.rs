//! The compiled limits of a rules file as the [`Limits`] of a [`RateLimitLayer`]: the layer's one
//! pipeline (its service and response future) reads the keys, decides, answers, waits, settles,
//! reports the fields and counts the metrics of a file's limits as it does a single limiter's.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Response, StatusCode};

use super::decided::{ADMITTED, Extra, RulesAnswer, RulesDecided, Stop};
use super::enforce::{Enforced, Held, Holds, enforce_all, enforce_keyed, rollback};
use super::slots::take_slots;
use super::{Compiled, FailMode, Rules, RulesOptions, SettleSpec, write_success_headers};
use crate::Decision;
use crate::clock::Clock;
use crate::error::StoreError;
use crate::layer::response::RejectedBy;
use crate::layer::response::{item_name, write_headers};
use crate::layer::{
    AtEnd, BodySettle, FailurePolicy, Hooks, LayerKey, Limits, OnCancel, Options, OverCap,
    Prepared, RateLimitLayer, ResponseBody, Settle, Source, leave_untaken, take_marker,
};
use crate::store::Store;
use crate::strategy::Op;

/// The [`RateLimitLayer`] source of a rules file's layer ([`Rules::layer`]): the file's limits
/// read each request's keys (per limit, with its `key` and `on_missing_key`), not a key extractor.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileLimits;

impl LayerKey for FileLimits {
    type Key = Vec<u8>;
}

/// A request's keys under the limits of a rules file: the version of the rules it started on,
/// and the matching limits (enforced, shaping queues, shadow) with their keys.
pub struct RulesKeys<St, C> {
    compiled: Arc<Compiled<St, C>>,
    enforced: Enforced,
    queues: Vec<Held>,
    shadows: Vec<Held>,
    failure: FailurePolicy,
}

impl<St: Store<Vec<u8>>, C: Clock + Clone> Source<St, C> for FileLimits {
    type Limits = Rules<St, C>;

    /// The matching limits and their keys; a request without a key for an enforced limit that
    /// rejects those is answered before anything is spent.
    fn prepare(
        _hooks: &Hooks<Self>,
        o: &Options<Rules<St, C>>,
        parts: &Parts,
    ) -> Prepared<RulesKeys<St, C>> {
        let compiled = o.limits.shared.current.load_full();
        let options: &RulesOptions = &o.limits.shared.options;
        let path = parts.uri.path();
        if compiled
            .exempt
            .iter()
            .any(|e| e.matches(&parts.method, path))
        {
            return Prepared::Pass;
        }
        let (mut enforced, mut queues, mut shadows) = (Enforced::default(), Vec::new(), Vec::new());
        // The tier value of the limit whose tiers are being looked at: read once per limit, not
        // once per tier (a limit's tiers are consecutive).
        let mut tier_value = None;
        for (index, limit) in compiled.limits.iter().enumerate() {
            if !limit.spec.matches(&parts.method, path) {
                continue;
            }
            if let Some(t) = &limit.tier {
                if tier_value
                    .as_ref()
                    .is_none_or(|(id, _)| *id != t.limit_id())
                {
                    tier_value = Some((t.limit_id(), t.value(parts, options)));
                }
                let value = tier_value.as_ref().and_then(|(_, v)| v.as_deref());
                if !t.takes(value) {
                    continue;
                }
            }
            let key = match limit.key_or_global(parts, options) {
                Ok(key) => key,
                Err(error) => {
                    limit.metrics.no_key.increment(1);
                    if limit.spec.shadow {
                        continue;
                    }
                    tracing::debug!(
                        limit = limit.spec.name.as_str(),
                        reason = error.reason(),
                        "no key"
                    );
                    o.missing_keys
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Prepared::NoKey(StatusCode::BAD_REQUEST, error);
                }
            };
            if limit.spec.shadow {
                shadows.push(Held::pending(index, key));
            } else if limit.spec.queue.is_some() {
                // Shaping queues last: a slot is never given back, so it is only reserved once
                // every other limit has admitted the request.
                queues.push(Held::pending(index, key));
            } else {
                // Most requests meet one enforced limit: held inline.
                enforced.push(index, key);
            }
        }
        if enforced.is_empty() && queues.is_empty() && shadows.is_empty() {
            return Prepared::Pass;
        }
        Prepared::Decide {
            keys: RulesKeys {
                compiled,
                enforced,
                queues,
                shadows,
                failure: o.failure,
            },
            cost: 1,
            id: None,
            marked: false,
        }
    }
}

impl<St: Store<Vec<u8>>, C: Clock + Clone> Rules<St, C> {
    /// The layer deciding requests on these rules (the current ones, and later reloads): the
    /// same [`RateLimitLayer`] as a single limiter's, so its response hooks
    /// ([`on_rejected`](RateLimitLayer::on_rejected), [`ProblemJson`](crate::layer::ProblemJson)),
    /// gRPC answers, failure policy (the [`RulesOptions`]' by default) and
    /// [`skip`](RateLimitLayer::skip) apply to a file's limits too.
    pub fn layer(&self) -> RateLimitLayer<FileLimits, St, C> {
        let options = &self.shared.options;
        let headers = crate::layer::response::HeaderConfig {
            style: options.header_style,
            reset: options.reset,
            ..Default::default()
        };
        RateLimitLayer::from_limits(self.clone(), FileLimits, headers)
            .failure_policy(options.failure)
    }
}

/// The decision of one enforced limit (`index`, on `key`), read at once: as [`enforce_keyed`]
/// does, without a task.
fn one_now<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    failure: FailurePolicy,
    index: usize,
    key: Vec<u8>,
    result: Result<Decision, StoreError>,
) -> Result<RulesDecided, StoreError> {
    let Some(limit) = compiled.limits.get(index) else {
        return Ok(RulesDecided::admitted(Holds::default()));
    };
    let failure = limit.failure(failure);
    match result {
        Ok(d) if d.is_allowed() => {
            let mut held = Holds::default();
            held.push(Held {
                index,
                key,
                decision: d,
            });
            Ok(RulesDecided::admitted(held))
        }
        Ok(d) => Ok(RulesDecided::rejected(index, d)),
        Err(e) => {
            limit.store_failed(&e, failure);
            match failure {
                FailurePolicy::FailClosed => Err(e.for_limiter(&limit.spec.name)),
                _ => Ok(RulesDecided::admitted(Holds::default())),
            }
        }
    }
}

/// Decides the limits of a request: the enforced ones all-or-nothing (one alone through its
/// limiter when no request can match two), then the shaping queues, then the shadow limits.
async fn decide<St: Store<Vec<u8>>, C: Clock>(
    compiled: Arc<Compiled<St, C>>,
    failure: FailurePolicy,
    enforced: Vec<Held>,
    queues: Vec<Held>,
    shadows: Vec<Held>,
) -> Result<RulesDecided, StoreError> {
    match decide_all(&compiled, failure, enforced, queues, shadows).await {
        Ok(d) => Ok(d),
        Err(stop) => stopped(stop),
    }
}

async fn decide_all<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    failure: FailurePolicy,
    enforced: Vec<Held>,
    queues: Vec<Held>,
    shadows: Vec<Held>,
) -> Result<RulesDecided, Stop> {
    // The capped limits' keys, read before the quotas take them (a limit whose store fails
    // open keeps its cap).
    let capped: Vec<(usize, Vec<u8>)> = enforced
        .iter()
        .chain(&queues)
        .filter(|h| {
            compiled
                .limits
                .get(h.index)
                .is_some_and(|l| l.cap.is_some())
        })
        .map(|h| (h.index, h.key.clone()))
        .collect();
    let mut held = match <[Held; 1]>::try_from(enforced) {
        Ok([one]) if compiled.lone => {
            let mut held = Vec::new();
            enforce_keyed(compiled, failure, one, &mut held).await?;
            held
        }
        Ok([one]) => enforce_all(compiled, failure, vec![one]).await?,
        Err(enforced) => enforce_all(compiled, failure, enforced).await?,
    };
    let mut wait = Duration::ZERO;
    for one in queues {
        let index = one.index;
        if let Some(d) = enforce_keyed(compiled, failure, one, &mut held).await? {
            if let Some(limit) = compiled.limits.get(index) {
                wait = wait.max(limit.queue_wait(&d));
            }
        }
    }
    // Slots only once every quota admitted: a cap's 429 spends no quota. Boxed, and only for a
    // capped request: a Redis cap's lease calls would otherwise grow every request's decision
    // future.
    let taken = if capped.is_empty() {
        Ok(None)
    } else {
        Box::pin(take_slots(compiled, &capped)).await
    };
    let slots = match taken {
        Ok(slots) => slots,
        Err((index, d)) => {
            rollback(compiled, &held).await;
            return Err(Stop::Rejected(index, d));
        }
    };
    let mut shadow: Option<(usize, Decision)> = None;
    let mut admitted_shadows = Vec::new();
    for h in shadows {
        let Some(limit) = compiled.limits.get(h.index) else {
            continue;
        };
        match limit.apply(&h.key, Op::Check(limit.spec.cost)).await {
            Ok(d) => {
                if d.is_allowed() {
                    // Units are counted once settled.
                    limit.metrics.allowed.increment(1);
                    admitted_shadows.push(Held {
                        index: h.index,
                        key: h.key,
                        decision: d,
                    });
                } else {
                    limit.metrics.shadow_rejected.increment(1);
                    tracing::info!(
                        limit = limit.spec.name.as_str(),
                        "shadow limit would have rejected"
                    );
                }
                if shadow.is_none_or(|(_, s)| d.remaining() < s.remaining()) {
                    shadow = Some((h.index, d));
                }
            }
            Err(e) => {
                limit.metrics.store_errors.increment(1);
                tracing::warn!(limit = limit.spec.name.as_str(), error = %e, "rate-limit store error");
            }
        }
    }
    let extra =
        (!admitted_shadows.is_empty() || shadow.is_some() || !wait.is_zero() || slots.is_some())
            .then(|| {
                Box::new(Extra {
                    shadows: admitted_shadows,
                    shadow,
                    wait,
                    slots,
                })
            });
    Ok(RulesDecided {
        held: held.into(),
        rejected: None,
        extra,
    })
}

/// Turns a stop of the file's decision into its answer: a rejection to report, or the failure.
fn stopped(stop: Stop) -> Result<RulesDecided, StoreError> {
    match stop {
        Stop::Rejected(index, d) => Ok(RulesDecided::rejected(index, d)),
        Stop::Failed(e) => Err(e),
    }
}

impl<St: Store<Vec<u8>>, C: Clock + Clone> Limits for Rules<St, C> {
    type Keys = RulesKeys<St, C>;
    type Decided = RulesDecided;
    type Answer = RulesAnswer;

    /// A file's decision fails only where a limit's own policy (its `fail_mode`, or the layer's)
    /// closes: the layer answers `503` whatever its default.
    const STORE_ERRORS_CLOSE: bool = true;

    /// The file's `header_style`, `reset` and limit names write the fields.
    const FIELDS_OF_THEIR_OWN: bool = true;

    fn name(&self) -> &str {
        "rules"
    }

    fn check(&self, keys: &mut RulesKeys<St, C>, _cost: u32) -> RulesAnswer {
        // One enforced limit, and no request can match two: its limiter alone decides, at once on
        // the memory store (no task, no lock stripes).
        if let (Enforced::One { index, key }, true, true, true) = (
            &mut keys.enforced,
            keys.compiled.lone,
            keys.queues.is_empty(),
            keys.shadows.is_empty(),
        ) {
            let index = *index;
            if let Some(limit) = keys.compiled.limits.get(index).filter(|l| l.cap.is_none()) {
                let answer =
                    limit
                        .limiter
                        .apply(key, limit.rule.as_ref(), Op::Check(limit.spec.cost));
                return match answer.into_now() {
                    // Rejected: the key stays with the keys.
                    Ok(Ok(d)) if !d.is_allowed() => {
                        RulesAnswer::Now(Some(Ok(RulesDecided::rejected(index, d))))
                    }
                    // Admitted (or failed): the key moves into the decision (no copy).
                    Ok(result) => RulesAnswer::Now(Some(one_now(
                        &keys.compiled,
                        keys.failure,
                        index,
                        std::mem::take(key),
                        result,
                    ))),
                    Err(later) => {
                        let (compiled, key, failure) =
                            (Arc::clone(&keys.compiled), key.clone(), keys.failure);
                        RulesAnswer::Later(Box::pin(async move {
                            let start = std::time::Instant::now();
                            let result = later.await;
                            if let Some(limit) = compiled.limits.get(index) {
                                limit
                                    .metrics
                                    .store_latency
                                    .record(start.elapsed().as_secs_f64());
                            }
                            one_now(&compiled, failure, index, key, result)
                        }))
                    }
                };
            }
        }
        let compiled = Arc::clone(&keys.compiled);
        let again = |v: &[Held]| v.to_vec();
        let (enforced, queues, shadows) = (
            keys.enforced.to_pending(),
            again(&keys.queues),
            again(&keys.shadows),
        );
        let limits = enforced.len() + queues.len() + shadows.len();
        let decided = decide(compiled, keys.failure, enforced, queues, shadows);
        // The span only when a subscriber wants `trace`: building a disabled span still costs a
        // few hundred instructions (its `log` fallback) per request.
        if tracing::level_enabled!(tracing::Level::TRACE) {
            let span = tracing::trace_span!("tollgate.rules.decide", limits);
            return RulesAnswer::Later(Box::pin(tracing::Instrument::instrument(decided, span)));
        }
        RulesAnswer::Later(Box::pin(decided))
    }

    fn into_now(answer: RulesAnswer) -> Result<Result<RulesDecided, StoreError>, RulesAnswer> {
        match answer {
            RulesAnswer::Now(Some(result)) => Ok(result),
            other => Err(other),
        }
    }

    #[inline]
    fn outcome(d: &RulesDecided) -> crate::Outcome {
        d.rejected
            .map_or(crate::Outcome::Allowed, |(_, d)| d.outcome())
    }

    fn decision(d: &RulesDecided) -> Decision {
        if let Some((_, d)) = d.rejected {
            return d;
        }
        d.held
            .iter()
            .map(|h| h.decision)
            .min_by_key(|d| (d.remaining(), std::cmp::Reverse(d.reset_after())))
            .unwrap_or(ADMITTED)
    }

    fn queue_wait(
        _o: &Options<Self>,
        _keys: &RulesKeys<St, C>,
        _cost: u32,
        d: &RulesDecided,
    ) -> Duration {
        d.extra.as_ref().map_or(Duration::ZERO, |e| e.wait)
    }

    /// Reads the shaping queues' state at departure, for the fields.
    fn departure(&self, keys: &RulesKeys<St, C>, reserved: &RulesDecided) -> RulesAnswer {
        let compiled = Arc::clone(&keys.compiled);
        let mut d = reserved.clone();
        RulesAnswer::Later(Box::pin(async move {
            for h in d.held.iter_mut() {
                let Some(limit) = compiled.limits.get(h.index) else {
                    continue;
                };
                if limit.spec.queue.is_some() {
                    if let Ok(now) = limit.apply(&h.key, Op::Peek).await {
                        h.decision = now;
                    }
                }
            }
            if let Some(extra) = d.extra.as_mut() {
                extra.wait = Duration::ZERO;
            }
            Ok(d)
        }))
    }

    /// A file's queue slot is never given back (two waiters would share one departure): the gap
    /// stays.
    fn on_cancel(
        &self,
        _keys: &RulesKeys<St, C>,
        _cost: u32,
        _reserved: &RulesDecided,
    ) -> OnCancel {
        Box::new(|| {})
    }

    /// A limit takes a [`Settle`] marker named for it, and an unnamed one when its `settle` is
    /// `marker` (the marker is then taken out: an enclosing layer never settles it again; a file
    /// without such a limit leaves an unnamed marker to the layer around it); a `settle =
    /// "header:NAME"` limit reads that header (a value it cannot use leaves the estimate, warned
    /// once per limit); a request a concurrency cap inside refused is settled to 0. A shaping
    /// queue's slot is never given back (two waiters would share one departure). The units of
    /// the limits left on their estimate are counted here, the others' once settled (at the
    /// body's end for `settle = "trailer:NAME"`). A marker no limit took is counted when no
    /// layer encloses this one.
    fn settle<B>(
        _o: &Options<Self>,
        keys: &RulesKeys<St, C>,
        _cost: u32,
        d: &RulesDecided,
        res: &mut Response<B>,
    ) -> Option<(RulesAnswer, u32)> {
        let compiled = &keys.compiled;
        let over_cap = res.extensions().get::<OverCap>().is_some();
        let marker = res.extensions().get::<Settle>().cloned();
        let mut taken = false;
        let mut wanted: Vec<(usize, u32)> = Vec::new();
        for (at, h) in d.held.iter().chain(d.shadows()).enumerate() {
            let Some(limit) = compiled.limits.get(h.index) else {
                continue;
            };
            let units = if over_cap {
                Some(0)
            } else {
                match marker.as_ref().filter(|m| limit.takes(m)) {
                    Some(m) => {
                        taken = true;
                        Some(m.charged())
                    }
                    None => limit.settle_value(res),
                }
            };
            let settles = limit.spec.queue.is_none() && h.decision.reservation().is_some();
            match units.filter(|_| settles) {
                Some(units) => wanted.push((at, units)),
                // The body's end settles it, and counts what it charges.
                None if settles && matches!(limit.spec.settle, Some(SettleSpec::Trailer(_))) => {}
                None => limit.metrics.charged(limit.spec.cost),
            }
        }
        if taken {
            take_marker(res.extensions_mut());
        } else if let Some(m) = marker.as_ref() {
            leave_untaken(res.extensions_mut(), m);
        }
        if wanted.is_empty() {
            return None;
        }
        let compiled = Arc::clone(compiled);
        let mut d = d.clone();
        let settle = RulesAnswer::Later(Box::pin(async move {
            let enforced = d.held.len();
            for (at, units) in wanted {
                let h = match at.checked_sub(enforced) {
                    None => d.held.get_mut(at),
                    Some(i) => d.extra.as_mut().and_then(|e| e.shadows.get_mut(i)),
                };
                let Some(h) = h else { continue };
                let (Some(limit), Some(r)) =
                    (compiled.limits.get(h.index), h.decision.reservation())
                else {
                    continue;
                };
                let charged = match limit.apply(&h.key, Op::settle(r, units)).await {
                    Ok(settled) => {
                        h.decision = settled;
                        units
                    }
                    Err(e) => {
                        limit.metrics.store_errors.increment(1);
                        tracing::warn!(limit = limit.spec.name.as_str(), error = %e, "settle failed");
                        // The estimate stands, counted here: nothing settles it again at the
                        // body's end.
                        h.decision = h.decision.settled();
                        limit.spec.cost
                    }
                };
                limit.metrics.charged(charged);
            }
            Ok(d)
        }));
        // The units are counted per limit above.
        Some((settle, 0))
    }

    /// Counted per limit, in [`settle`](Limits::settle) and at the body's end.
    fn count_charged(&self, _units: u32) {}

    /// The concurrency slots of `d` are held until the body ends (or is dropped), and the limits
    /// whose `settle` is `trailer:NAME` settle when the body's trailers have gone by (missing,
    /// unusable or repeated: the estimate stands, warned once per limit).
    fn watch_body<B>(
        _o: &Options<Self>,
        keys: &RulesKeys<St, C>,
        d: &RulesDecided,
        res: Response<B>,
    ) -> Response<ResponseBody<B>> {
        let mut res = res.map(ResponseBody::inner);
        if let Some(slots) = d.extra.as_ref().and_then(|e| e.slots.clone()) {
            res.body_mut().watch(Box::new(slots));
        }
        for h in d.held.iter().chain(d.shadows()) {
            let Some(limit) = keys.compiled.limits.get(h.index) else {
                continue;
            };
            let (Some(SettleSpec::Trailer(name)), Some(reservation)) =
                (&limit.spec.settle, h.decision.reservation())
            else {
                continue;
            };
            res.body_mut().watch(Box::new(BodySettle {
                limiter: (*limit.limiter).clone(),
                key: h.key.clone(),
                rule: limit.rule.clone().map(Arc::new),
                reservation,
                end: AtEnd::Trailer(name.clone(), None),
                // A value above the budget is charged in full: the key's debt carries.
                cap: u64::MAX,
                units: 0,
                warned: Arc::clone(&limit.settle_warned),
                charged: Some(limit.metrics.units.clone()),
            }));
        }
        res
    }

    fn count_decided(&self, keys: &RulesKeys<St, C>, _cost: u32, d: &RulesDecided, admitted: bool) {
        let limits = &keys.compiled.limits;
        if admitted {
            for h in d.held.iter() {
                if let Some(limit) = limits.get(h.index) {
                    // Units are counted once settled.
                    limit.metrics.decided(&h.decision);
                }
            }
        } else if let Some((limit, d)) = d.rejected.and_then(|(i, d)| Some((limits.get(i)?, d))) {
            limit.metrics.decided(&d);
        }
    }

    /// Counted, logged and named per limit where it failed (every reservation already given
    /// back).
    fn store_failed(
        _o: &Options<Self>,
        _keys: &RulesKeys<St, C>,
        e: StoreError,
        _closed: bool,
    ) -> StoreError {
        e
    }

    fn count_store_error(&self) {}

    fn time_store(&self, _asked: std::time::Instant) {
        // Timed per limit where the store was asked.
    }

    fn violated<'a>(
        _o: &'a Options<Self>,
        keys: &'a RulesKeys<St, C>,
        d: &RulesDecided,
    ) -> Cow<'a, str> {
        match d
            .rejected
            .and_then(|(i, d)| Some((keys.compiled.limits.get(i)?, d)))
        {
            Some((limit, d)) => item_name(&limit.headers, limit.rule(), d.quota_index()),
            None => Cow::Borrowed(""),
        }
    }

    fn write_rejected<B>(
        _o: &Options<Self>,
        keys: &RulesKeys<St, C>,
        d: RulesDecided,
        res: &mut Response<B>,
    ) {
        let Some((limit, d)) = d
            .rejected
            .and_then(|(i, d)| Some((keys.compiled.limits.get(i)?, d)))
        else {
            return;
        };
        tracing::debug!(
            limit = limit.spec.name.as_str(),
            quota_limit = d.limit(),
            retry_after = d.retry_after_secs(),
            "rate limited"
        );
        write_headers(res.headers_mut(), &d, limit.rule(), &limit.headers, None);
        res.extensions_mut().insert(RejectedBy {
            limit: Arc::clone(&limit.headers.policy_name),
            decision: d,
        });
    }

    fn write_allowed<B>(
        o: &Options<Self>,
        keys: &RulesKeys<St, C>,
        d: &RulesDecided,
        enclosed: bool,
        res: &mut Response<B>,
    ) {
        write_success_headers(
            &keys.compiled,
            &o.limits.shared.options,
            o.headers.on_allowed,
            &d.held,
            d.extra.as_ref().and_then(|e| e.shadow),
            enclosed,
            res,
        );
    }
}

impl<St: Store<Vec<u8>>, C: Clock> super::Limit<St, C> {
    /// What a store failure on this limit does: its `fail_mode`, or the layer's `failure`. A
    /// `local` limit's store decides in this process during an outage (no failure reaches here);
    /// whatever else fails takes the layer's policy.
    pub(super) fn failure(&self, failure: FailurePolicy) -> FailurePolicy {
        match self.spec.fail_mode {
            Some(FailMode::Open) => FailurePolicy::FailOpen,
            Some(FailMode::Closed) => FailurePolicy::FailClosed,
            Some(FailMode::Local) | None => failure,
        }
    }

    /// Counts and logs a store failure of this limit answered by `failure` (a limit failing open
    /// is skipped and counted in its [`Stats`](crate::Stats)).
    pub(super) fn store_failed(&self, e: &StoreError, failure: FailurePolicy) {
        self.metrics.store_errors.increment(1);
        tracing::warn!(limit = self.spec.name.as_str(), error = %e, "rate-limit store error");
        if failure == FailurePolicy::FailClosed {
            self.metrics.fail_closed.increment(1);
        } else {
            self.metrics.fail_open.increment(1);
            self.limiter.record_fail_open();
        }
    }
}

impl<St, C> std::fmt::Debug for RulesKeys<St, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RulesKeys")
            .field("enforced", &self.enforced.len())
            .field("queues", &self.queues.len())
            .field("shadows", &self.shadows.len())
            .finish_non_exhaustive()
    }
}
