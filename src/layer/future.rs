//! [`ResponseFuture`]: deciding, pacing, forwarding, settling.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::core::{Core, Wait};
use super::counted::{CountId, mark_counted};
use super::grpc;
use super::limits::Limits;
use super::response::{FailurePolicy, Refusal, text};
use super::wait_guard::WaitGuard;
use crate::decision::Outcome;
use crate::error::StoreError;
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

/// What the future needs besides its state: the shared settings and the request's keys, cost
/// and count marker.
pub(crate) struct Ctx<L: Limits> {
    core: Arc<Core<L>>,
    keys: L::Keys,
    cost: u32,
    /// In pacing mode, how long the request has waited for its slot.
    waiter: Waiter,
    /// In queue mode, once the request's departure was reserved (it waits for it, or has left):
    /// the check that reserved it, forwarded with the request when the state cannot be read again
    /// at departure.
    reserved: Option<L::Decided>,
    /// Marks the request as counted when it is forwarded (`None`: limits that do not mark).
    id: Option<CountId>,
    /// When the store was asked, for a decision not ready at once (timed in the metrics).
    asked: Option<std::time::Instant>,
    /// Whether the request arrived marked as counted by an enclosing layer (the marker is then
    /// extended, not inserted anew).
    marked: bool,
    /// The decision's span, entered while the future is polled: built only when a subscriber
    /// wants `trace` events (boxed: the future stays small when it is not).
    span: Option<Box<tracing::Span>>,
}

impl<L: Limits> Ctx<L> {
    /// `span`: the decision's span (see [`decision_span`]), entered while the future is polled.
    pub(crate) fn new(
        core: Arc<Core<L>>,
        keys: L::Keys,
        cost: u32,
        id: Option<CountId>,
        marked: bool,
        span: Option<Box<tracing::Span>>,
    ) -> Self {
        Self {
            core,
            keys,
            cost,
            waiter: Waiter::default(),
            reserved: None,
            id,
            asked: None,
            marked,
            span,
        }
    }

    /// Times the decision the store did not give at once.
    pub(crate) fn timed(mut self) -> Self {
        if cfg!(feature = "metrics") {
            self.asked = Some(std::time::Instant::now());
        }
        self
    }

    fn limits(&self) -> &L {
        &self.core.options.limits
    }

    fn check(&mut self) -> L::Answer {
        self.core.options.limits.check(&mut self.keys, self.cost)
    }

    /// In queue mode, how long an admitted request waits for its departure.
    fn queue_wait(&self, d: &L::Decided) -> Duration {
        if self.reserved.is_some() {
            return Duration::ZERO;
        }
        L::queue_wait(&self.core.options, &self.keys, self.cost, d)
    }

    /// Marks the request as counted, with the decision `d` that admits it (`None`: failing open);
    /// limits that count no id (a rules file) leave it as it is.
    fn mark(&self, extensions: &mut http::Extensions, d: Option<&L::Decided>) {
        if let Some(id) = self.id {
            mark_counted(extensions, id, self.marked, d.map(L::decision));
        }
    }

    /// The answer to a rejected request; `is_grpc`: a trailers-only gRPC status instead of the
    /// hook's answer (read from the request only when answering, off the allowed path).
    fn reject<B>(&self, d: L::Decided, is_grpc: bool) -> Response<ResponseBody<B>> {
        let decision = L::decision(&d);
        let mut res = if is_grpc {
            grpc::rejected(&decision)
        } else {
            self.core.rejected(&decision, || {
                L::violated(&self.core.options, &self.keys, &d)
            })
        };
        L::write_rejected(&self.core.options, &self.keys, d, &mut res);
        res
    }

    /// A settlement the store failed: the estimate stands (warned at most once a second).
    fn settle_failed(&self, e: &StoreError) {
        self.limits().count_store_error();
        if self.core.options.last_warn.ready(Duration::from_secs(1)) {
            tracing::warn!(
                limit = self.limits().name(),
                error = %e,
                "rate-limit store failed to settle; the estimate stands"
            );
        }
    }

    #[inline(always)]
    fn finish<B>(&self, mut res: Response<B>, d: &L::Decided) -> Response<ResponseBody<B>> {
        L::write_allowed(&self.core.options, &self.keys, d, self.marked, &mut res);
        L::watch_body(&self.core.options, &self.keys, d, res)
    }
}

pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService).
    pub struct ResponseFuture<S, ReqB, ResB, L>
    where
        S: Service<Request<ReqB>>,
        L: Limits,
    {
        #[pin]
        state: State<S, ReqB, ResB, L>,
        ctx: Option<Ctx<L>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, ResB, L>
    where
        S: Service<Request<ReqB>>,
        L: Limits,
    {
        Deciding { #[pin] check: L::Answer, pending: Option<Pending<S, ReqB>> },
        // The store answered at once, and the answer needs more than a forward or a rejection.
        Decided {
            result: Option<Result<L::Decided, StoreError>>,
            pending: Option<Pending<S, ReqB>>,
        },
        Pacing {
            #[pin] sleep: tokio::time::Sleep,
            pending: Option<Pending<S, ReqB>>,
            guard: Option<WaitGuard>,
        },
        Readying { pending: Option<Pending<S, ReqB>>, decision: Option<L::Decided> },
        Forwarding { #[pin] fut: S::Future, decision: Option<L::Decided> },
        // `units`: what the settlement charges, counted once it succeeds.
        Settling { #[pin] settle: L::Answer, units: u32, response: Option<Response<ResB>>, decision: Option<L::Decided> },
        Done { response: Option<Response<ResponseBody<ResB>>> },
    }
}

impl<S, ReqB, ResB, L> ResponseFuture<S, ReqB, ResB, L>
where
    S: Service<Request<ReqB>>,
    L: Limits,
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

    pub(crate) fn deciding(check: L::Answer, pending: Pending<S, ReqB>, ctx: Ctx<L>) -> Self {
        Self {
            state: State::Deciding {
                check,
                pending: Some(pending),
            },
            ctx: Some(ctx),
        }
    }
}

impl<S, ReqB, ResB, L> ResponseFuture<S, ReqB, ResB, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    L: Limits,
{
    /// The store answered during `call` (the memory store always does). An allowed request goes
    /// to `inner`, which was polled ready, without the ready-clone; a rejection is answered at
    /// once. The rest (pacing, store errors) goes through the state machine. The request comes in
    /// parts and each branch builds its future in place: a request or a future moved whole is a
    /// copy of a few hundred bytes.
    #[inline(always)]
    pub(crate) fn decided_now(
        result: Result<L::Decided, StoreError>,
        inner: &mut S,
        mut parts: http::request::Parts,
        body: ReqB,
        ctx: Ctx<L>,
    ) -> Self {
        match result {
            Ok(d) if L::outcome(&d) == Outcome::Allowed && ctx.queue_wait(&d).is_zero() => {
                ctx.limits().count_decided(&ctx.keys, ctx.cost, &d, true);
                ctx.mark(&mut parts.extensions, Some(&d));
                let fut = inner.call(Request::from_parts(parts, body));
                Self {
                    state: State::Forwarding {
                        fut,
                        decision: Some(d),
                    },
                    ctx: Some(ctx),
                }
            }
            Ok(d)
                if match L::outcome(&d) {
                    Outcome::Exceeds => true,
                    Outcome::Rejected => !matches!(ctx.core.options.pacing, Some(Wait::Sleep(_))),
                    Outcome::Allowed => false,
                } =>
            {
                Self::rejected_now(d, inner, &parts.headers, ctx)
            }
            result => Self::decided_later(result, inner, parts, body, ctx),
        }
    }

    /// A rejection answered at once. Out of line, as [`decided_later`](Self::decided_later): the
    /// allowed path above stays a short stretch of code (instruction-cache misses cost it more
    /// time than its instructions).
    #[inline(never)]
    fn rejected_now(d: L::Decided, inner: &mut S, headers: &http::HeaderMap, ctx: Ctx<L>) -> Self {
        // The request never reaches `inner`: give back what its `poll_ready` reserved
        // (e.g. a concurrency permit) rather than hold it until the next request.
        let fresh = inner.clone();
        drop(std::mem::replace(inner, fresh));
        ctx.limits().count_decided(&ctx.keys, ctx.cost, &d, false);
        let response = ctx.reject(d, grpc::is_grpc(headers));
        Self {
            state: State::Done {
                response: Some(response),
            },
            ctx: Some(ctx),
        }
    }

    /// Pacing, a shaping queue, a store error: through the state machine.
    #[cold]
    #[inline(never)]
    fn decided_later(
        result: Result<L::Decided, StoreError>,
        inner: &mut S,
        parts: http::request::Parts,
        body: ReqB,
        ctx: Ctx<L>,
    ) -> Self {
        // The ready-clone idiom: the service that was polled ready goes into the future.
        let clone = inner.clone();
        Self {
            state: State::Decided {
                result: Some(result),
                pending: Some(Pending {
                    request: Request::from_parts(parts, body),
                    inner: std::mem::replace(inner, clone),
                    ready: true,
                }),
            },
            ctx: Some(ctx),
        }
    }
}

impl<S, ReqB, ResB, L> Future for ResponseFuture<S, ReqB, ResB, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    L: Limits,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span = this.ctx.as_ref().and_then(|c| c.span.clone());
        let _entered = span.as_deref().map(tracing::Span::enter);
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { check, pending } => {
                    let result = ready!(check.poll(cx));
                    let (Some(ctx), Some(p)) = (this.ctx.as_mut(), pending.take()) else {
                        return broken("a state without its request, context or answer");
                    };
                    if let Some(asked) = ctx.asked.take() {
                        ctx.limits().time_store(asked);
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
                    let check = match &ctx.reserved {
                        Some(reserved) => ctx.limits().departure(&ctx.keys, reserved),
                        None => ctx.check(),
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
                    ctx.mark(p.request.extensions_mut(), decision.as_ref());
                    let mut inner = p.inner;
                    let fut = inner.call(p.request);
                    let decision = decision.take();
                    this.state.set(State::Forwarding { fut, decision });
                }
                StateProj::Forwarding { fut, decision } => {
                    let mut res = match ready!(fut.poll(cx)) {
                        Ok(res) => res,
                        Err(e) => {
                            // The inner service failed: the request keeps its estimate.
                            if let (Some(ctx), Some(_)) = (this.ctx.as_ref(), decision.as_ref()) {
                                ctx.limits().count_charged(ctx.cost);
                            }
                            return Poll::Ready(Err(e));
                        }
                    };
                    let (Some(ctx), Some(d)) = (this.ctx.as_ref(), decision.take()) else {
                        return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                    };
                    let o = &ctx.core.options;
                    if let Some((settle, units)) = L::settle(o, &ctx.keys, ctx.cost, &d, &mut res) {
                        this.state.set(State::Settling {
                            settle,
                            units,
                            response: Some(res),
                            decision: Some(d),
                        });
                        continue;
                    }
                    return Poll::Ready(Ok(ctx.finish(res, &d)));
                }
                StateProj::Settling {
                    settle,
                    units,
                    response,
                    decision,
                } => {
                    let result = ready!(settle.poll(cx));
                    let (Some(ctx), Some(res), Some(checked)) =
                        (this.ctx.as_ref(), response.take(), decision.take())
                    else {
                        return broken("a state without its request, context or answer");
                    };
                    let d = match result {
                        Ok(d) => {
                            ctx.limits().count_charged(*units);
                            d
                        }
                        Err(e) => {
                            ctx.limits().count_charged(ctx.cost);
                            ctx.settle_failed(&e);
                            L::settle_tried(checked)
                        }
                    };
                    return Poll::Ready(Ok(ctx.finish(res, &d)));
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

/// The span of a decision by `limits` on a request of `cost`, when a subscriber wants `trace`
/// events; `None` costs one check of the level (building a span a subscriber then discards
/// would cost hundreds of instructions a request).
#[inline]
pub(crate) fn decision_span<L: Limits>(limits: &L, cost: u32) -> Option<Box<tracing::Span>> {
    if !tracing::level_enabled!(tracing::Level::TRACE) {
        return None;
    }
    decision_span_now(limits.name(), cost)
}

#[cold]
#[inline(never)]
fn decision_span_now(limit: &str, cost: u32) -> Option<Box<tracing::Span>> {
    let span = tracing::trace_span!("tollgate.decide", layer = limit, cost);
    (!span.is_disabled()).then(|| Box::new(span))
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
fn after_check<S, ReqB, ResB, L>(
    ctx: &mut Ctx<L>,
    result: Result<L::Decided, StoreError>,
    mut p: Pending<S, ReqB>,
) -> State<S, ReqB, ResB, L>
where
    S: Service<Request<ReqB>> + Clone,
    L: Limits,
{
    if let Some(reserved) = ctx.reserved.take() {
        // A queued request holds its slot (counted when reserved): the departure's peek only
        // refreshes the headers, and a failed or refusing one leaves the reservation's.
        let d = match result {
            Ok(d) if L::outcome(&d) == Outcome::Allowed => d,
            Ok(_) => reserved,
            Err(e) => {
                ctx.limits().count_store_error();
                tracing::debug!(
                    limit = ctx.limits().name(),
                    error = %e,
                    "queue: the state at departure could not be read"
                );
                reserved
            }
        };
        return State::Readying {
            pending: Some(p),
            decision: Some(d),
        };
    }
    let d = match result {
        Ok(d) => d,
        Err(e) => {
            // A rule the store cannot honour is a configuration error: never let through.
            let closed = ctx.core.options.failure == FailurePolicy::FailClosed
                || L::STORE_ERRORS_CLOSE
                || e.kind() == crate::StoreErrorKind::InvalidRule;
            let e = L::store_failed(&ctx.core.options, &ctx.keys, e, closed);
            if closed {
                let mut res = if grpc::is_grpc(p.request.headers()) {
                    grpc::refused(Refusal::StoreFailed(&e))
                } else {
                    ctx.core.refused(Refusal::StoreFailed(&e))
                };
                res.extensions_mut().insert(e);
                return State::Done {
                    response: Some(res),
                };
            }
            return State::Readying {
                pending: Some(p),
                decision: None,
            };
        }
    };
    match L::outcome(&d) {
        Outcome::Allowed if !ctx.queue_wait(&d).is_zero() => {
            ctx.limits().count_decided(&ctx.keys, ctx.cost, &d, true);
            let wait = ctx.queue_wait(&d);
            let on_cancel = ctx.limits().on_cancel(&ctx.keys, ctx.cost, &d);
            ctx.reserved = Some(d);
            p.unready();
            let guard = WaitGuard::new(&ctx.core.options.waiting).on_cancel(on_cancel);
            State::Pacing {
                sleep: tokio::time::sleep(wait),
                pending: Some(p),
                guard: Some(guard),
            }
        }
        Outcome::Allowed => {
            ctx.limits().count_decided(&ctx.keys, ctx.cost, &d, true);
            State::Readying {
                pending: Some(p),
                decision: Some(d),
            }
        }
        Outcome::Rejected | Outcome::Exceeds => {
            let next = match ctx.core.options.pacing {
                Some(Wait::Sleep(max)) => ctx.waiter.next(&L::decision(&d), max),
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
                    ctx.limits().count_decided(&ctx.keys, ctx.cost, &d, false);
                    State::Done {
                        response: Some(ctx.reject(d, grpc::is_grpc(p.request.headers()))),
                    }
                }
            }
        }
    }
}
