//! [`ResponseFuture`]: deciding, pacing, forwarding, settling.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::Settle;
use super::layer::{Core, Pacing};
use super::response::{
    FailurePolicy, HeaderStyle, OnRejected, Refusal, Reported, item_name, text,
    write_allowed_headers, write_headers,
};
use super::service::{CountId, mark_counted};
use crate::clock::Clock;
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::rule::Rule;
use crate::store::{Answer, Store, StoreKey};
use crate::strategy::Op;

/// The request and the inner service, waiting for the decision.
pub(crate) struct Pending<S, B> {
    pub(crate) request: Request<B>,
    pub(crate) inner: S,
    /// Whether `inner` was polled ready. A paced request gives its ready service back while it
    /// sleeps (capacity reserved by `poll_ready`, e.g. a concurrency permit, is not held for the
    /// wait) and polls a fresh clone ready before the call.
    pub(crate) ready: bool,
}

impl<S: Clone, B> Pending<S, B> {
    /// Drops the ready service, keeping an unpolled clone.
    fn unready(&mut self) {
        if self.ready {
            let fresh = self.inner.clone();
            drop(std::mem::replace(&mut self.inner, fresh));
            self.ready = false;
        }
    }
}

/// Counts a waiter in pacing mode for as long as it lives.
pub(crate) struct WaitGuard(Arc<AtomicUsize>);

impl WaitGuard {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(count))
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the future needs besides its state: the shared settings and the request's key, cost,
/// rule and count marker.
pub(crate) struct Ctx<K, St, C, R> {
    core: Arc<Core<K, St, C, R>>,
    key: K,
    cost: u32,
    rule: Option<Arc<Rule>>,
    waited: Duration,
    /// In queue mode: the request's departure was reserved and it waits for it (or has left).
    departed: bool,
    /// Marks the request as counted when it is forwarded.
    id: CountId,
}

impl<K, St, C, R> Ctx<K, St, C, R> {
    pub(crate) fn new(
        core: Arc<Core<K, St, C, R>>,
        key: K,
        cost: u32,
        rule: Option<Arc<Rule>>,
        id: CountId,
    ) -> Self {
        Self {
            core,
            key,
            cost,
            rule,
            waited: Duration::ZERO,
            departed: false,
            id,
        }
    }
}

impl<K: StoreKey, St: Store<K>, C: Clock, R> Ctx<K, St, C, R> {
    fn rule(&self) -> &Rule {
        self.rule
            .as_deref()
            .unwrap_or_else(|| self.core.limiter.rule())
    }

    fn check(&self) -> Answer<St::Future> {
        self.core
            .limiter
            .apply(&self.key, self.rule.as_deref(), Op::Check(self.cost))
    }

    /// The state of the queue at departure, for the headers.
    fn peek(&self) -> Answer<St::Future> {
        self.core
            .limiter
            .apply(&self.key, self.rule.as_deref(), Op::Peek)
    }

    /// In queue mode, how long an admitted request waits for its departure: the check reserved
    /// the slot `[departure, departure + cost x T)`, and its reset is the slot's end.
    fn queue_wait(&self, d: &Decision) -> Duration {
        match (&self.core.pacing, &self.rule) {
            (Some(Pacing::Queue { rule, emission }), Some(mine))
                if !self.departed && d.is_allowed() && Arc::ptr_eq(rule, mine) =>
            {
                let slot = u64::from(self.cost).saturating_mul(*emission);
                Duration::from_nanos(d.reset_after.saturating_sub(slot))
            }
            _ => Duration::ZERO,
        }
    }

    /// Settles what the check answered by `checked` reserved for `units`, in the window it counted in.
    /// Not in queue mode, where a slot given back would put two waiters in one.
    fn settle(&self, checked: &Decision, units: u32) -> Option<Answer<St::Future>> {
        if matches!(self.core.pacing, Some(Pacing::Queue { .. })) {
            return None;
        }
        let reservation = checked.reservation()?;
        Some(self.core.limiter.apply(
            &self.key,
            self.rule.as_deref(),
            Op::settle(reservation, units),
        ))
    }

    /// The request's partition key (`pk`), when the layer writes one.
    fn partition_key(&self) -> Option<String> {
        let ietf = matches!(
            self.core.headers.style,
            HeaderStyle::Ietf | HeaderStyle::Both
        );
        let secret = self.core.headers.pk.as_ref().filter(|_| ietf)?;
        Some(secret.partition_key(&self.key))
    }

    fn key_text(&self) -> Option<String> {
        self.core.log_keys.then(|| self.key.log_text())
    }

    fn store_error(&self, e: &StoreError) {
        // At most one warning a second, however many requests fail.
        if self.core.last_warn.ready(Duration::from_secs(1)) {
            let policy = match self.core.failure {
                FailurePolicy::FailClosed => "failing closed (503)",
                _ => "failing open",
            };
            tracing::warn!(error = %e, key = self.key_text(), "rate-limit store failed; {policy}");
        }
    }

    fn reject<B: From<String>>(&self, d: Decision) -> Response<B>
    where
        R: OnRejected<B>,
    {
        tracing::debug!(
            key = self.key_text(),
            limit = d.limit(),
            retry_after = d.retry_after_secs(),
            exceeds = d.outcome() == Outcome::Exceeds,
            "rate limited"
        );
        let rule = self.rule();
        let violated = item_name(&self.core.headers, rule, d.quota_index());
        let mut res = self.core.rejection.on_rejected_by(&d, &[&violated]);
        let pk = self.partition_key();
        write_headers(
            res.headers_mut(),
            &d,
            rule,
            &self.core.headers,
            pk.as_deref(),
        );
        res.extensions_mut().insert(d);
        res
    }
}

pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService).
    pub struct ResponseFuture<S, ReqB, ResB, K, St, C, R>
    where
        S: Service<Request<ReqB>>,
        St: Store<K>,
    {
        #[pin]
        state: State<S, ReqB, ResB, K, St>,
        ctx: Option<Ctx<K, St, C, R>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, ResB, K, St>
    where
        S: Service<Request<ReqB>>,
        St: Store<K>,
    {
        Deciding { #[pin] check: Answer<St::Future>, pending: Option<Pending<S, ReqB>> },
        // The store answered at once, and the answer needs more than a forward or a rejection.
        Decided {
            result: Option<Result<Decision, StoreError>>,
            pending: Option<Pending<S, ReqB>>,
        },
        Pacing {
            #[pin] sleep: tokio::time::Sleep,
            wait: Duration,
            pending: Option<Pending<S, ReqB>>,
            guard: Option<WaitGuard>,
        },
        Readying { pending: Option<Pending<S, ReqB>>, decision: Option<Decision> },
        Forwarding { #[pin] fut: S::Future, decision: Option<Decision> },
        Settling { #[pin] settle: Answer<St::Future>, response: Option<Response<ResB>>, decision: Decision },
        Done { response: Option<Response<ResB>> },
    }
}

impl<S, ReqB, ResB, K, St, C, R> ResponseFuture<S, ReqB, ResB, K, St, C, R>
where
    S: Service<Request<ReqB>>,
    St: Store<K>,
{
    pub(crate) fn passthrough(fut: S::Future) -> Self {
        Self {
            state: State::Forwarding {
                fut,
                decision: None,
            },
            ctx: None,
        }
    }

    pub(crate) fn ready(response: Response<ResB>) -> Self {
        Self {
            state: State::Done {
                response: Some(response),
            },
            ctx: None,
        }
    }

    pub(crate) fn deciding(
        check: Answer<St::Future>,
        pending: Pending<S, ReqB>,
        ctx: Ctx<K, St, C, R>,
    ) -> Self {
        Self {
            state: State::Deciding {
                check,
                pending: Some(pending),
            },
            ctx: Some(ctx),
        }
    }
}

impl<S, ReqB, ResB, K, St, C, R> ResponseFuture<S, ReqB, ResB, K, St, C, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: From<String>,
    K: StoreKey,
    St: Store<K>,
    C: Clock,
    R: OnRejected<ResB>,
{
    /// The store answered during `call` (the memory store always does). An allowed request goes
    /// to `inner`, which was polled ready, without the ready-clone; a rejection is answered at
    /// once. The rest (pacing, store errors) goes through the state machine.
    #[inline]
    pub(crate) fn decided_now(
        result: Result<Decision, StoreError>,
        inner: &mut S,
        mut request: Request<ReqB>,
        ctx: Ctx<K, St, C, R>,
    ) -> Self {
        let state = match result {
            Ok(d) if d.is_allowed() && ctx.queue_wait(&d).is_zero() => {
                mark_counted(request.extensions_mut(), ctx.id);
                request.extensions_mut().insert(d);
                State::Forwarding {
                    fut: inner.call(request),
                    decision: Some(d),
                }
            }
            Ok(d)
                if d.outcome() == Outcome::Exceeds
                    || (!d.is_allowed() && !matches!(ctx.core.pacing, Some(Pacing::Sleep(_)))) =>
            {
                // The request never reaches `inner`: give back what its `poll_ready` reserved
                // (e.g. a concurrency permit) rather than hold it until the next request.
                let fresh = inner.clone();
                drop(std::mem::replace(inner, fresh));
                State::Done {
                    response: Some(ctx.reject(d)),
                }
            }
            result => {
                // The ready-clone idiom: the service that was polled ready goes into the future.
                let clone = inner.clone();
                State::Decided {
                    result: Some(result),
                    pending: Some(Pending {
                        request,
                        inner: std::mem::replace(inner, clone),
                        ready: true,
                    }),
                }
            }
        };
        Self {
            state,
            ctx: Some(ctx),
        }
    }
}

impl<S, ReqB, ResB, K, St, C, R> Future for ResponseFuture<S, ReqB, ResB, K, St, C, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: From<String>,
    K: StoreKey,
    St: Store<K>,
    C: Clock,
    R: OnRejected<ResB>,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { check, pending } => {
                    let result = ready!(check.poll(cx));
                    let (Some(ctx), Some(p)) = (this.ctx.as_mut(), pending.take()) else {
                        return broken("a state without its request, context or answer");
                    };
                    this.state.set(after_check(ctx, result, p));
                }
                StateProj::Decided { result, pending } => {
                    let (Some(ctx), Some(result), Some(p)) =
                        (this.ctx.as_mut(), result.take(), pending.take())
                    else {
                        return broken("a state without its request, context or answer");
                    };
                    this.state.set(after_check(ctx, result, p));
                }
                StateProj::Pacing {
                    sleep,
                    wait,
                    pending,
                    guard,
                } => {
                    ready!(sleep.poll(cx));
                    drop(guard.take());
                    let Some(ctx) = this.ctx.as_mut() else {
                        return broken("a state without its request, context or answer");
                    };
                    ctx.waited = ctx.waited.saturating_add(*wait);
                    // A queued request has its slot: at departure only the headers are left.
                    let check = if ctx.departed {
                        ctx.peek()
                    } else {
                        ctx.check()
                    };
                    let pending = pending.take();
                    this.state.set(State::Deciding { check, pending });
                }
                StateProj::Readying { pending, decision } => {
                    if let Some(p) = pending.as_mut().filter(|p| !p.ready) {
                        ready!(p.inner.poll_ready(cx))?;
                        p.ready = true;
                    }
                    let (Some(ctx), Some(mut p)) = (this.ctx.as_ref(), pending.take()) else {
                        return broken("a state without its request, context or answer");
                    };
                    mark_counted(p.request.extensions_mut(), ctx.id);
                    let mut inner = p.inner;
                    let fut = inner.call(p.request);
                    let decision = *decision;
                    this.state.set(State::Forwarding { fut, decision });
                }
                StateProj::Forwarding { fut, decision } => {
                    let mut res = ready!(fut.poll(cx))?;
                    let (Some(ctx), Some(d)) = (this.ctx.as_ref(), *decision) else {
                        return Poll::Ready(Ok(res));
                    };
                    let name = ctx.core.limiter.name();
                    if res
                        .extensions()
                        .get::<Settle>()
                        .is_some_and(|s| s.is_for(name))
                    {
                        // Taken out: an enclosing limiter never settles this one's reservation.
                        let units = res
                            .extensions_mut()
                            .remove::<Settle>()
                            .map_or(0, |s| s.charged());
                        if let Some(settle) = ctx.settle(&d, units) {
                            this.state.set(State::Settling {
                                settle,
                                response: Some(res),
                                decision: d,
                            });
                            continue;
                        }
                    }
                    finish_allowed(ctx, &mut res, &d);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Settling {
                    settle,
                    response,
                    decision,
                } => {
                    let result = ready!(settle.poll(cx));
                    let (Some(ctx), Some(mut res)) = (this.ctx.as_ref(), response.take()) else {
                        return broken("a state without its request, context or answer");
                    };
                    let d = match result {
                        Ok(d) => d,
                        Err(e) => {
                            ctx.store_error(&e);
                            *decision
                        }
                    };
                    finish_allowed(ctx, &mut res, &d);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Done { response } => {
                    return match response.take() {
                        Some(res) => Poll::Ready(Ok(res)),
                        None => broken("polled after completion"),
                    };
                }
            }
        }
    }
}

/// A broken invariant of the response future (a state without what it needs, a poll after
/// completion): loud in debug builds and tests, a clean `500` otherwise, never a future that stays
/// pending forever.
#[cold]
fn broken<B: From<String>, E>(what: &str) -> Poll<Result<Response<B>, E>> {
    debug_assert!(false, "rate-limit response future: {what}");
    tracing::error!("rate-limit response future: {what}; answering 500");
    Poll::Ready(Ok(text(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Internal Server Error: the rate limiter lost track of this request.\n".to_owned(),
    )))
}

/// The state after the store answered: forward, pace, reject, or fail open or closed.
fn after_check<S, ReqB, ResB, K, St, C, R>(
    ctx: &mut Ctx<K, St, C, R>,
    result: Result<Decision, StoreError>,
    mut p: Pending<S, ReqB>,
) -> State<S, ReqB, ResB, K, St>
where
    S: Service<Request<ReqB>> + Clone,
    ResB: From<String>,
    K: StoreKey,
    St: Store<K>,
    C: Clock,
    R: OnRejected<ResB>,
{
    let d = match result {
        Ok(d) => d,
        Err(e) => {
            ctx.store_error(&e);
            if ctx.core.failure == FailurePolicy::FailClosed {
                let mut res = ctx.core.rejection.on_refused(Refusal::StoreFailed(&e));
                res.extensions_mut().insert(e);
                return State::Done {
                    response: Some(res),
                };
            }
            ctx.core.limiter.record_fail_open();
            return State::Readying {
                pending: Some(p),
                decision: None,
            };
        }
    };
    match d.outcome() {
        Outcome::Allowed if !ctx.queue_wait(&d).is_zero() => {
            let wait = ctx.queue_wait(&d);
            ctx.departed = true;
            p.unready();
            State::Pacing {
                sleep: tokio::time::sleep(wait),
                wait,
                pending: Some(p),
                guard: Some(WaitGuard::new(&ctx.core.waiting)),
            }
        }
        Outcome::Allowed => {
            p.request.extensions_mut().insert(d);
            State::Readying {
                pending: Some(p),
                decision: Some(d),
            }
        }
        Outcome::Rejected => {
            let wait = Duration::from_nanos(d.retry_after).max(Duration::from_micros(1));
            match ctx.core.pacing {
                Some(Pacing::Sleep(max)) if ctx.waited.saturating_add(wait) <= max => {
                    p.unready();
                    State::Pacing {
                        sleep: tokio::time::sleep(wait),
                        wait,
                        pending: Some(p),
                        guard: Some(WaitGuard::new(&ctx.core.waiting)),
                    }
                }
                _ => State::Done {
                    response: Some(ctx.reject(d)),
                },
            }
        }
        Outcome::Exceeds => State::Done {
            response: Some(ctx.reject(d)),
        },
    }
}

fn finish_allowed<K: StoreKey, St: Store<K>, C: Clock, R, B>(
    ctx: &Ctx<K, St, C, R>,
    res: &mut Response<B>,
    d: &Decision,
) {
    // A rejection by an inner rate-limit layer keeps its own, more telling, fields.
    if ctx.core.headers.on_allowed && res.extensions().get::<Decision>().is_none() {
        let below = res.extensions_mut().remove::<Reported>();
        let pk = ctx.partition_key();
        let reported = write_allowed_headers(
            below,
            res.headers_mut(),
            d,
            ctx.rule(),
            &ctx.core.headers,
            pk.as_deref(),
        );
        res.extensions_mut().insert(reported);
    }
}
