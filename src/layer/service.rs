//! [`RateLimitService`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::core::{Core, MissingKey};
use super::counted::{Counted, counted_id};
use super::future::{Ctx, Pending, ResponseFuture};
use super::grpc;
use super::hooks::{Hooks, RequestCost, SelectRule, Skip};
use super::layer::RateLimitLayer;
use super::response::{OnRejected, Refusal};
use crate::clock::Clock;
use crate::key::KeyExtractor;
use crate::limiter::RateLimiter;
use crate::store::Store;
use crate::strategy::Op;

/// The service a [`RateLimitLayer`] wraps around an inner service. See the
/// [module docs](crate::layer).
///
/// `poll_ready` only forwards to the inner service; the decision happens in `call`, and a rejected
/// request never reaches the inner service.
pub struct RateLimitService<S, X: KeyExtractor, St, C, R, Co, Ru, Sk> {
    inner: S,
    core: Arc<Core<X::Key, St, C, R>>,
    hooks: Arc<Hooks<X, Co, Ru, Sk>>,
}

impl<S: Clone, X: KeyExtractor, St, C, R, Co, Ru, Sk> Clone
    for RateLimitService<S, X, St, C, R, Co, Ru, Sk>
{
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            core: Arc::clone(&self.core),
            hooks: Arc::clone(&self.hooks),
        }
    }
}

impl<S: fmt::Debug, X: KeyExtractor + fmt::Debug, St, C, R, Co, Ru, Sk> fmt::Debug
    for RateLimitService<S, X, St, C, R, Co, Ru, Sk>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("key", &self.hooks.key)
            .finish_non_exhaustive()
    }
}

impl<S, X: KeyExtractor, St, C, R, Co, Ru, Sk> RateLimitService<S, X, St, C, R, Co, Ru, Sk> {
    pub(crate) fn from_parts(
        inner: S,
        core: Arc<Core<X::Key, St, C, R>>,
        hooks: Arc<Hooks<X, Co, Ru, Sk>>,
    ) -> Self {
        Self { inner, core, hooks }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the wrapper.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<X::Key, St, C> {
        &self.core.options.limiter
    }

    /// How many requests wait for a slot in pacing mode now.
    pub fn waiting(&self) -> usize {
        self.core
            .options
            .waiting
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock> RateLimitService<(), X, St, C, (), (), (), ()> {
    /// The layer: `RateLimitService::layer(limiter, key)` is [`RateLimitLayer::new`].
    pub fn layer(limiter: RateLimiter<X::Key, St, C>, key: X) -> RateLimitLayer<X, St, C> {
        RateLimitLayer::new(limiter, key)
    }
}

impl<S, ReqB, ResB, X, St, C, R, Co, Ru, Sk> Service<Request<ReqB>>
    for RateLimitService<S, X, St, C, R, Co, Ru, Sk>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    X: KeyExtractor,
    St: Store<X::Key>,
    C: Clock,
    R: OnRejected<ResponseBody<ResB>>,
    Co: RequestCost,
    Ru: SelectRule,
    Sk: Skip,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB, X::Key, St, C, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let hooks = &*self.hooks;
        if hooks.skip.skip(&parts) {
            let fut = self.inner.call(Request::from_parts(parts, body));
            return ResponseFuture::passthrough(fut);
        }
        let extracted = hooks.key.extract(&parts);
        if extracted.is_err() {
            self.core
                .options
                .missing_keys
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let key = match extracted {
            Ok(key) => key,
            Err(e) => match &self.core.options.missing {
                MissingKey::Fallback(key) => {
                    tracing::debug!(reason = e.reason(), "rate limit: fallback key");
                    key.clone()
                }
                MissingKey::Reject(status) => {
                    tracing::debug!(reason = e.reason(), "rate limit: request without a key");
                    self.core.options.count_no_key();
                    let refusal = Refusal::NoKey {
                        status: *status,
                        error: &e,
                    };
                    let mut res = if grpc::is_grpc(&parts.headers) {
                        grpc::refused(refusal)
                    } else {
                        self.core.rejection.on_refused(refusal)
                    };
                    res.extensions_mut().insert(e);
                    // Gives back what the inner service's `poll_ready` reserved.
                    let fresh = self.inner.clone();
                    drop(std::mem::replace(&mut self.inner, fresh));
                    return ResponseFuture::ready(res);
                }
            },
        };
        // One request, one count: a second layer on the same limiter and key lets it through. The
        // request is marked when it is forwarded (a rejected one never meets another layer).
        // In queue mode the limiter's own rule gives way to the queue's.
        let rule = hooks
            .rule
            .rule(&parts)
            .or_else(|| self.core.options.queue_rule());
        let rule_ref = rule
            .as_deref()
            .unwrap_or_else(|| self.core.options.limiter.rule());
        let id = counted_id(&self.core.options.limiter, rule_ref, &key);
        let counted = parts.extensions.get::<Counted>();
        let marked = counted.is_some();
        if counted.is_some_and(|c| c.contains(id)) {
            let fut = self.inner.call(Request::from_parts(parts, body));
            return ResponseFuture::passthrough(fut);
        }
        let mut cost = hooks.cost.cost(&parts);
        if self.core.options.settle.is_some() {
            // A cost-0 peek must not pass a key deep in debt: settlement admits on at least 1.
            cost = cost.max(1);
        }
        let answer = self
            .core
            .options
            .limiter
            .apply(&key, rule.as_deref(), Op::Check(cost));
        let ctx = Ctx::new(Arc::clone(&self.core), key, cost, rule, id, marked);
        // The store says whether it answered at once (the memory store always does).
        let check = match answer.into_now() {
            Ok(result) => {
                let request = Request::from_parts(parts, body);
                return ResponseFuture::decided_now(result, &mut self.inner, request, ctx);
            }
            Err(later) => later,
        };
        // The ready-clone idiom: the service that was polled ready goes into the future.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let ctx = ctx.timed();
        ResponseFuture::deciding(
            check,
            Pending {
                request: Request::from_parts(parts, body),
                inner,
                ready: true,
            },
            ctx,
        )
    }
}
