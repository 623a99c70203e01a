//! [`PaceLayer`]: a client-side layer that paces outgoing calls to a quota.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::wait_guard::WaitGuard;

use crate::clock::Clock;
use crate::limiter::{RateLimiter, WaitError};
use crate::store::{Store, StoreKey};

/// Wraps a client service (any `tower::Service`) so that each call first waits, on tokio's timer,
/// for a slot of the limiter's quota: the "wait for a slot" limiter API clients use to stay under a
/// provider's limit. All calls count against one key.
///
/// A call whose slot is further away than the maximum wait (default 60 s) fails with
/// [`PaceError::Limited`] without calling the inner service. Waiters hold no place while they
/// sleep, so dropping a waiting call (cancellation) gives nothing away and blocks no one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::convert::Infallible;
/// use tollgate::{RateLimiter, Strategy, TokioClock};
/// use tollgate::layer::PaceLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// let limiter = RateLimiter::builder()
///     .strategy(Strategy::TokenBucket)
///     .quotas("2/second").unwrap()
///     .burst(std::num::NonZeroU32::MIN)
///     .clock(TokioClock::new())
///     .build()
///     .unwrap();
/// let client = ServiceBuilder::new()
///     .layer(PaceLayer::new(limiter, ()))
///     .service(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
/// let start = tokio::time::Instant::now();
/// for n in 0..5 {
///     assert_eq!(client.clone().oneshot(n).await.unwrap(), n);
/// }
/// assert_eq!(start.elapsed().as_millis(), 2000, "5 calls at 2/s: the 5th at 2 s");
/// # }
/// ```
#[must_use]
pub struct PaceLayer<K, St, C> {
    limiter: RateLimiter<K, St, C>,
    key: K,
    cost: u32,
    max_wait: Duration,
    waiting: Arc<AtomicUsize>,
}

impl<K: Clone, St, C> Clone for PaceLayer<K, St, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            cost: self.cost,
            max_wait: self.max_wait,
            waiting: Arc::clone(&self.waiting),
        }
    }
}

impl<K, St, C> fmt::Debug for PaceLayer<K, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("cost", &self.cost)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl<K: StoreKey, St: Store<K>, C: Clock> PaceLayer<K, St, C> {
    /// Paces calls against `key` of `limiter` (cost 1 each, at most 60 s of waiting).
    pub fn new(limiter: RateLimiter<K, St, C>, key: K) -> Self {
        Self {
            limiter,
            key,
            cost: 1,
            max_wait: Duration::from_secs(60),
            waiting: Arc::default(),
        }
    }

    /// The longest a call waits for its slot.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The cost of each call (default 1).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// How many calls are waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl<S, K: Clone, St, C> Layer<S> for PaceLayer<K, St, C> {
    type Service = PaceService<S, K, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PaceService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`PaceLayer`].
pub struct PaceService<S, K, St, C> {
    inner: S,
    layer: PaceLayer<K, St, C>,
}

impl<S: Clone, K: Clone, St, C> Clone for PaceService<S, K, St, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K, St, C> fmt::Debug for PaceService<S, K, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, St, C> PaceService<S, K, St, C> {
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
}

/// Why a paced call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum PaceError<E> {
    /// No slot within the maximum wait, a cost that can never be admitted, or a store failure.
    Limited(WaitError),
    /// The inner service failed.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for PaceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limited(e) => e.fmt(f),
            Self::Inner(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for PaceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Limited(e) => Some(e),
            Self::Inner(e) => Some(e),
        }
    }
}

/// The future of a [`PaceService`] call.
pub(crate) type PaceFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, PaceError<E>>> + Send>>;

impl<S, Req, K, St, C> Service<Req> for PaceService<S, K, St, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    Req: Send + 'static,
    K: StoreKey,
    St: Store<K>,
    C: Clock,
{
    type Response = S::Response;
    type Error = PaceError<S::Error>;
    type Future = PaceFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(PaceError::Inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // An unpolled clone waits for the slot and is polled ready only then: the ready service
        // stays here, so no capacity it reserved is held for the wait.
        let mut inner = self.inner.clone();
        let limiter = self.layer.limiter.clone();
        let key = self.layer.key.clone();
        let (cost, max_wait) = (self.layer.cost, self.layer.max_wait);
        let waiter = WaitGuard::new(&self.layer.waiting);
        Box::pin(async move {
            let admitted = limiter.until_ready(&key, cost, max_wait).await;
            drop(waiter);
            admitted.map_err(PaceError::Limited)?;
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(PaceError::Inner)?;
            inner.call(req).await.map_err(PaceError::Inner)
        })
    }
}
