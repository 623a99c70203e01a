//! [`RateLimitService`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::core::Core;
use super::future::{Ctx, Pending, ResponseFuture, decision_span};
use super::grpc;
use super::hooks::Hooks;
use super::layer::RateLimitLayer;
use super::limits::{Limits, Prepared, Source};
use super::response::Refusal;
use crate::clock::Clock;
use crate::key::KeyExtractor;
use crate::limiter::RateLimiter;
use crate::store::Store;

/// The service a [`RateLimitLayer`] wraps around an inner service. See the
/// [module docs](crate::layer).
///
/// `poll_ready` only forwards to the inner service; the decision happens in `call`, and a rejected
/// request never reaches the inner service.
pub struct RateLimitService<S, X: Source<St, C>, St, C> {
    inner: S,
    core: Arc<Core<X::Limits>>,
    hooks: Arc<Hooks<X>>,
}

impl<S: Clone, X: Source<St, C>, St, C> Clone for RateLimitService<S, X, St, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            core: Arc::clone(&self.core),
            hooks: Arc::clone(&self.hooks),
        }
    }
}

impl<S: fmt::Debug, X: Source<St, C> + fmt::Debug, St, C> fmt::Debug
    for RateLimitService<S, X, St, C>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("key", &self.hooks.key)
            .finish_non_exhaustive()
    }
}

impl<S, X: Source<St, C>, St, C> RateLimitService<S, X, St, C> {
    pub(crate) fn from_parts(inner: S, core: Arc<Core<X::Limits>>, hooks: Arc<Hooks<X>>) -> Self {
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

    /// How many requests wait for a slot in pacing mode now.
    pub fn waiting(&self) -> usize {
        self.core
            .options
            .waiting
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<S, X: KeyExtractor, St: Store<X::Key>, C: Clock> RateLimitService<S, X, St, C> {
    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<X::Key, St, C> {
        &self.core.options.limits.limiter
    }
}

impl<X: KeyExtractor, St: Store<X::Key>, C: Clock> RateLimitService<(), X, St, C> {
    /// The layer: `RateLimitService::layer(limiter, key)` is [`RateLimitLayer::new`].
    pub fn layer(limiter: RateLimiter<X::Key, St, C>, key: X) -> RateLimitLayer<X, St, C> {
        RateLimitLayer::new(limiter, key)
    }
}

impl<S: Clone, X: Source<St, C>, St, C> RateLimitService<S, X, St, C> {
    /// The answer to a request without a key. Out of line: the decided path stays a short
    /// stretch of code.
    #[cold]
    #[inline(never)]
    fn no_key<ReqB, ResB>(
        &mut self,
        parts: &http::request::Parts,
        status: http::StatusCode,
        e: crate::key::KeyError,
    ) -> ResponseFuture<S, ReqB, ResB, X::Limits>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        let refusal = Refusal::NoKey { status, error: &e };
        let mut res = if grpc::is_grpc(&parts.headers) {
            grpc::refused(refusal)
        } else {
            self.core.refused(refusal)
        };
        res.extensions_mut().insert(e);
        // Gives back what the inner service's `poll_ready` reserved.
        let fresh = self.inner.clone();
        drop(std::mem::replace(&mut self.inner, fresh));
        ResponseFuture::ready(res)
    }
}

impl<S, ReqB, ResB, X, St, C> Service<Request<ReqB>> for RateLimitService<S, X, St, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    X: Source<St, C>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB, X::Limits>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let hooks = &*self.hooks;
        if hooks.skip(&parts) {
            let fut = self.inner.call(Request::from_parts(parts, body));
            return ResponseFuture::passthrough(fut);
        }
        let (mut keys, cost, id, marked) = match X::prepare(hooks, &self.core.options, &parts) {
            Prepared::Decide {
                keys,
                cost,
                id,
                marked,
            } => (keys, cost, id, marked),
            Prepared::Pass => {
                let fut = self.inner.call(Request::from_parts(parts, body));
                return ResponseFuture::passthrough(fut);
            }
            Prepared::NoKey(status, e) => return self.no_key(&parts, status, e),
        };
        let span = decision_span(&self.core.options.limits, cost);
        let _entered = span.as_deref().map(tracing::Span::enter);
        let answer = self.core.options.limits.check(&mut keys, cost);
        let ctx = Ctx::new(Arc::clone(&self.core), keys, cost, id, marked, span.clone());
        // The store says whether it answered at once (the memory store always does).
        let check = match X::Limits::into_now(answer) {
            Ok(result) => {
                return ResponseFuture::decided_now(result, &mut self.inner, parts, body, ctx);
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
