//! [`ResponseFuture`]: deciding, pacing, forwarding, settling.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::Settle;
use super::body::ResponseBody;
use super::concurrency::OverCap;
use super::core::{Core, Pacing};
use super::counted::{CountId, mark_counted};
use super::grpc;
use super::response::{
    FailurePolicy, HeaderStyle, OnRejected, Refusal, Reported, item_name, rejected_inside, text,
    write_allowed_headers, write_headers,
};
use super::settle::{AtEnd, BodySettle, Source, warn_bad_value};
use super::wait_guard::{OnCancel, WaitGuard};
use crate::clock::Clock;
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::rule::Rule;
use crate::store::{Answer, Store, StoreKey};
use crate::strategy::Op;
use crate::wait::{Next, Waiter};

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

/// What the future needs besides its state: the shared settings and the request's key, cost,
/// rule and count marker.
pub(crate) struct Ctx<K, St, C, R> {
    core: Arc<Core<K, St, C, R>>,
    key: K,
    cost: u32,
    rule: Option<Arc<Rule>>,
    /// In pacing mode, how long the request has waited for its slot.
    waiter: Waiter,
    /// In queue mode, once the request's departure was reserved (it waits for it, or has left):
    /// the check that reserved it, forwarded with the request when the state cannot be read again
    /// at departure.
    reserved: Option<Decision>,
    /// Marks the request as counted when it is forwarded.
    id: CountId,
    /// When the store was asked, for a decision not ready at once (timed in the metrics).
    asked: Option<std::time::Instant>,
    /// Whether the request arrived marked as counted by an enclosing layer (the marker is then
    /// extended, not inserted anew).
    marked: bool,
}

impl<K, St, C, R> Ctx<K, St, C, R> {
    pub(crate) fn new(
        core: Arc<Core<K, St, C, R>>,
        key: K,
        cost: u32,
        rule: Option<Arc<Rule>>,
        id: CountId,
        marked: bool,
    ) -> Self {
        Self {
            core,
            key,
            cost,
            rule,
            waiter: Waiter::default(),
            reserved: None,
            id,
            asked: None,
            marked,
        }
    }

    /// Times the decision the store did not give at once.
    pub(crate) fn timed(mut self) -> Self {
        if cfg!(feature = "metrics") {
            self.asked = Some(std::time::Instant::now());
        }
        self
    }
}

impl<K: StoreKey, St: Store<K>, C: Clock, R> Ctx<K, St, C, R> {
    fn rule(&self) -> &Rule {
        self.rule
            .as_deref()
            .unwrap_or_else(|| self.core.options.limiter.rule())
    }

    fn check(&self) -> Answer<St::Future> {
        self.core
            .options
            .limiter
            .apply(&self.key, self.rule.as_deref(), Op::Check(self.cost))
    }

    /// The state of the queue at departure, for the headers.
    fn peek(&self) -> Answer<St::Future> {
        self.core
            .options
            .limiter
            .apply(&self.key, self.rule.as_deref(), Op::Peek)
    }

    /// In queue mode, how long an admitted request waits for its departure: the check reserved
    /// the slot `[departure, departure + cost x T)`, and its reset is the slot's end.
    fn queue_wait(&self, d: &Decision) -> Duration {
        match (&self.core.options.pacing, &self.rule) {
            (Some(Pacing::Queue { rule, emission }), Some(mine))
                if self.reserved.is_none() && d.is_allowed() && Arc::ptr_eq(rule, mine) =>
            {
                let slot = u64::from(self.cost).saturating_mul(*emission);
                Duration::from_nanos(d.reset_after.saturating_sub(slot))
            }
            _ => Duration::ZERO,
        }
    }

    /// What a queued request whose client went away before its departure undoes: it gives its
    /// slot back if it still holds the queue's last reservation (`reserved` is the check that
    /// made it); otherwise the gap stays. On a remote store the call is spawned (the future is
    /// gone), and a failure leaves the gap.
    fn step_back(&self, reserved: &Decision) -> OnCancel {
        let limiter = self.core.options.limiter.clone();
        let key = self.key.clone();
        let rule = self.rule.clone();
        let op = Op::StepBack {
            cost: self.cost,
            end: reserved.time.saturating_add(reserved.reset_after),
        };
        Box::new(move || {
            if let Err(later) = limiter.apply(&key, rule.as_deref(), op).into_now() {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        if let Err(e) = later.await {
                            tracing::debug!(error = %e, "queue: a cancelled waiter's step back failed");
                        }
                    });
                }
            }
        })
    }

    /// Settles what the check answered by `checked` reserved for `units`, in the window it counted in.
    /// Not in queue mode, where a slot given back would put two waiters in one.
    fn settle(&self, checked: &Decision, units: u32) -> Option<Answer<St::Future>> {
        if matches!(self.core.options.pacing, Some(Pacing::Queue { .. })) {
            return None;
        }
        let reservation = checked.reservation()?;
        Some(self.core.options.limiter.apply(
            &self.key,
            self.rule.as_deref(),
            Op::settle(reservation, units),
        ))
    }

    /// The request's partition key (`pk`), when the layer writes one.
    fn partition_key(&self) -> Option<String> {
        let ietf = matches!(
            self.core.options.headers.style,
            HeaderStyle::Ietf | HeaderStyle::Both
        );
        let secret = self.core.options.headers.pk.as_ref().filter(|_| ietf)?;
        Some(secret.partition_key(&self.key))
    }

    /// What the response says the request cost, for this limiter: its [`Settle`] marker (taken
    /// out: an enclosing limiter never settles this one's reservation), else the configured
    /// source's value when the head has it. `None`: the estimate stands (for now).
    fn settled_units<B>(&self, res: &mut Response<B>) -> Option<u32> {
        if res.extensions().get::<OverCap>().is_some() {
            // Refused by a concurrency cap inside: the request never ran.
            return Some(0);
        }
        let name = self.core.options.limiter.name();
        if res
            .extensions()
            .get::<Settle>()
            .is_some_and(|s| s.is_for(name))
        {
            return res.extensions_mut().remove::<Settle>().map(|s| s.charged());
        }
        match self.core.options.settle.as_ref()?.read_head(res) {
            Ok(units) => units,
            Err(bad) => {
                warn_bad_value(&self.core.options.settle_warned, name, bad);
                None
            }
        }
    }

    /// The response with its body watched for a settlement at the body's end, when configured.
    fn watch_body<B>(&self, res: Response<B>, d: &Decision) -> Response<ResponseBody<B>> {
        let mut res = res.map(ResponseBody::inner);
        let (Some(from), Some(reservation)) = (self.core.options.settle.as_ref(), d.reservation())
        else {
            return res;
        };
        let end = match &from.source {
            Source::Body(count) => AtEnd::Count(Arc::clone(count)),
            Source::Trailer(name) => AtEnd::Trailer(name.clone(), None),
            Source::Header(_) | Source::Extension => return res,
        };
        let cap = from.cap.map_or_else(
            || {
                self.rule()
                    .quotas()
                    .iter()
                    .map(|q| u64::from(q.limit().max(q.burst())))
                    .max()
                    .unwrap_or(u64::MAX)
            },
            u64::from,
        );
        res.body_mut().watch(Box::new(BodySettle {
            limiter: self.core.options.limiter.clone(),
            key: self.key.clone(),
            rule: self.rule.clone(),
            reservation,
            end,
            cap,
            units: 0,
            warned: Arc::clone(&self.core.options.settle_warned),
        }));
        res
    }

    fn key_text(&self) -> Option<String> {
        self.core.options.log_keys.then(|| self.key.log_text())
    }

    fn store_error(&self, e: &StoreError) {
        self.core.options.count_store_error();
        // At most one warning a second, however many requests fail.
        if self.core.options.last_warn.ready(Duration::from_secs(1)) {
            let policy = match self.core.options.failure {
                FailurePolicy::FailClosed => "failing closed (503)",
                _ => "failing open",
            };
            tracing::warn!(
                limit = self.core.options.limiter.name(),
                error = %e,
                key = self.key_text(),
                "rate-limit store failed; {policy}"
            );
        }
    }

    /// The answer to a rejected request; `is_grpc`: a trailers-only gRPC status instead of the
    /// hook's answer (read from the request only when answering, off the allowed path).
    fn reject<B>(&self, d: Decision, is_grpc: bool) -> Response<ResponseBody<B>>
    where
        R: OnRejected<ResponseBody<B>>,
    {
        tracing::debug!(
            limit = self.core.options.limiter.name(),
            key = self.key_text(),
            quota_limit = d.limit(),
            retry_after = d.retry_after_secs(),
            exceeds = d.outcome() == Outcome::Exceeds,
            "rate limited"
        );
        let rule = self.rule();
        let violated = item_name(&self.core.options.headers, rule, d.quota_index());
        let mut res = if is_grpc {
            grpc::rejected(&d)
        } else {
            self.core.rejection.on_rejected_by(&d, &[&violated])
        };
        let pk = self.partition_key();
        write_headers(
            res.headers_mut(),
            &d,
            rule,
            &self.core.options.headers,
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
            pending: Option<Pending<S, ReqB>>,
            guard: Option<WaitGuard>,
        },
        Readying { pending: Option<Pending<S, ReqB>>, decision: Option<Decision> },
        Forwarding { #[pin] fut: S::Future, decision: Option<Decision> },
        Settling { #[pin] settle: Answer<St::Future>, response: Option<Response<ResB>>, decision: Decision },
        Done { response: Option<Response<ResponseBody<ResB>>> },
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

    pub(crate) fn ready(response: Response<ResponseBody<ResB>>) -> Self {
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
    K: StoreKey,
    St: Store<K>,
    C: Clock,
    R: OnRejected<ResponseBody<ResB>>,
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
                ctx.core.options.count_decided(&d, ctx.cost);
                mark_counted(request.extensions_mut(), ctx.id, ctx.marked);
                request.extensions_mut().insert(d);
                State::Forwarding {
                    fut: inner.call(request),
                    decision: Some(d),
                }
            }
            Ok(d)
                if d.outcome() == Outcome::Exceeds
                    || (!d.is_allowed()
                        && !matches!(ctx.core.options.pacing, Some(Pacing::Sleep(_)))) =>
            {
                // The request never reaches `inner`: give back what its `poll_ready` reserved
                // (e.g. a concurrency permit) rather than hold it until the next request.
                let fresh = inner.clone();
                drop(std::mem::replace(inner, fresh));
                ctx.core.options.count_decided(&d, 0);
                State::Done {
                    response: Some(ctx.reject(d, grpc::is_grpc(request.headers()))),
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
    K: StoreKey,
    St: Store<K>,
    C: Clock,
    R: OnRejected<ResponseBody<ResB>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { check, pending } => {
                    let result = ready!(check.poll(cx));
                    let (Some(ctx), Some(p)) = (this.ctx.as_mut(), pending.take()) else {
                        return broken("a state without its request, context or answer");
                    };
                    if let Some(asked) = ctx.asked.take() {
                        ctx.core.options.time_store(asked);
                    }
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
                    pending,
                    guard,
                } => {
                    ready!(sleep.poll(cx));
                    if let Some(guard) = guard.take() {
                        guard.done();
                    }
                    let Some(ctx) = this.ctx.as_mut() else {
                        return broken("a state without its request, context or answer");
                    };
                    // A queued request has its slot: at departure only the headers are left.
                    let check = if ctx.reserved.is_some() {
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
                    mark_counted(p.request.extensions_mut(), ctx.id, ctx.marked);
                    let mut inner = p.inner;
                    let fut = inner.call(p.request);
                    let decision = *decision;
                    this.state.set(State::Forwarding { fut, decision });
                }
                StateProj::Forwarding { fut, decision } => {
                    let mut res = ready!(fut.poll(cx))?;
                    let (Some(ctx), Some(d)) = (this.ctx.as_ref(), *decision) else {
                        return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                    };
                    if let Some(units) = ctx.settled_units(&mut res) {
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
                    return Poll::Ready(Ok(ctx.watch_body(res, &d)));
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
                    return Poll::Ready(Ok(ctx.watch_body(res, &d)));
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
    K: StoreKey,
    St: Store<K>,
    C: Clock,
    R: OnRejected<ResponseBody<ResB>>,
{
    if let Some(reserved) = ctx.reserved {
        // A queued request holds its slot (counted when reserved): the departure's peek only
        // refreshes the headers, and a failed or refusing one leaves the reservation's.
        let d = match result {
            Ok(d) if d.is_allowed() => d,
            Ok(_) => reserved,
            Err(e) => {
                ctx.core.options.count_store_error();
                tracing::debug!(error = %e, "queue: the state at departure could not be read");
                reserved
            }
        };
        p.request.extensions_mut().insert(d);
        return State::Readying {
            pending: Some(p),
            decision: Some(d),
        };
    }
    let d = match result {
        Ok(d) => d,
        Err(e) => {
            ctx.store_error(&e);
            // A rule the store cannot honour is a configuration error: never let through.
            let closed = ctx.core.options.failure == FailurePolicy::FailClosed
                || e.kind() == crate::StoreErrorKind::InvalidRule;
            ctx.core.options.count_failure(closed);
            if closed {
                let mut res = if grpc::is_grpc(p.request.headers()) {
                    grpc::refused(Refusal::StoreFailed(&e))
                } else {
                    ctx.core.rejection.on_refused(Refusal::StoreFailed(&e))
                };
                res.extensions_mut().insert(e);
                return State::Done {
                    response: Some(res),
                };
            }
            ctx.core.options.limiter.record_fail_open();
            return State::Readying {
                pending: Some(p),
                decision: None,
            };
        }
    };
    match d.outcome() {
        Outcome::Allowed if !ctx.queue_wait(&d).is_zero() => {
            ctx.core.options.count_decided(&d, ctx.cost);
            let wait = ctx.queue_wait(&d);
            ctx.reserved = Some(d);
            p.unready();
            let guard = WaitGuard::new(&ctx.core.options.waiting).on_cancel(ctx.step_back(&d));
            State::Pacing {
                sleep: tokio::time::sleep(wait),
                pending: Some(p),
                guard: Some(guard),
            }
        }
        Outcome::Allowed => {
            ctx.core.options.count_decided(&d, ctx.cost);
            p.request.extensions_mut().insert(d);
            State::Readying {
                pending: Some(p),
                decision: Some(d),
            }
        }
        Outcome::Rejected | Outcome::Exceeds => {
            let next = match ctx.core.options.pacing {
                Some(Pacing::Sleep(max)) => ctx.waiter.next(&d, max),
                _ => Next::TooLong,
            };
            match next {
                Next::Sleep(wait) => {
                    p.unready();
                    State::Pacing {
                        sleep: tokio::time::sleep(wait),
                        pending: Some(p),
                        guard: Some(WaitGuard::new(&ctx.core.options.waiting)),
                    }
                }
                _ => {
                    ctx.core.options.count_decided(&d, 0);
                    State::Done {
                        response: Some(ctx.reject(d, grpc::is_grpc(p.request.headers()))),
                    }
                }
            }
        }
    }
}

fn finish_allowed<K: StoreKey, St: Store<K>, C: Clock, R, B>(
    ctx: &Ctx<K, St, C, R>,
    res: &mut Response<B>,
    d: &Decision,
) {
    if ctx.core.options.headers.on_allowed && !rejected_inside(res.extensions()) {
        let below = res.extensions_mut().remove::<Reported>();
        let pk = ctx.partition_key();
        let reported = write_allowed_headers(
            below,
            res.headers_mut(),
            d,
            ctx.rule(),
            &ctx.core.options.headers,
            pk.as_deref(),
        );
        // Always, for whatever layer encloses this one: whether one does cannot be told from the
        // request (a middleware between two layers may rebuild it without its extensions).
        res.extensions_mut().insert(reported);
    }
}
