//! Per-key concurrency limits: [`ConcurrencyLayer`] caps the requests in flight per key, in
//! memory or across instances on Redis.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dashmap::DashMap;
use http::header::RETRY_AFTER;
use http::{HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::body::{ResponseBody, Tail};
use super::grpc;
use super::response::{
    DefaultRejection, OnRejected, Refusal, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
};
use crate::key::KeyExtractor;
use crate::store::StoreKey;

/// How many requests may be in flight per key, and where the count lives. In flight means from
/// admission until the response body ends or is dropped: a cancelled request (the client went
/// away) gives its slot back.
///
/// - [`memory`](Self::memory): a count per key in this process.
/// - `redis` (feature `redis`): a lease per request in a Redis sorted set per key,
///   shared by every instance using the same limiter name. A lease has a TTL (default 60 s,
///   [`lease_ttl`](Self::lease_ttl)) and is renewed every TTL/3 while its request is in flight;
///   its release is spawned when the request ends, and the TTL is the backstop for an instance
///   that dies holding leases. This costs two Redis calls per request (one script call to
///   acquire, one `ZREM` to release), plus one per TTL/3 for a request that runs longer. When
///   Redis fails the request passes without a lease (fail open, warned about at most once a
///   second).
pub struct ConcurrencyLimit<K> {
    cap: NonZeroU32,
    backend: Backend<K>,
    last_warn: Arc<crate::throttle::Throttle>,
    /// What every slot of this limit shares: the waiters' wake-up and the metrics.
    shared: Arc<Shared>,
    /// Its `limit` label, held from when a [`ConcurrencyLayer`] is built on it until the last
    /// clone goes: a second live cap of the name warns then. (Not when the cap is made: one made
    /// and renamed at once would hold `default` for a moment.)
    #[cfg(feature = "metrics")]
    live: Option<Arc<crate::metrics::LiveLabel>>,
}

/// What a limit's slots share.
pub(crate) struct Shared {
    /// The cap's name (`limit` in its log lines and metrics).
    name: Arc<str>,
    /// Woken when a slot of this process is given back, for requests waiting for one.
    released: tokio::sync::Notify,
    /// `tollgate_in_flight{limit}` and the cap's 429s in `tollgate_requests_total`.
    #[cfg(feature = "metrics")]
    metrics: CapMetrics,
}

impl Shared {
    fn named(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: Arc::from(name),
            released: tokio::sync::Notify::new(),
            #[cfg(feature = "metrics")]
            metrics: CapMetrics::new(name),
        })
    }

    /// A slot was taken.
    fn taken(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.in_flight.increment(1.0);
    }

    /// A slot's request ended (its body ended or was dropped).
    fn ended(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.in_flight.decrement(1.0);
    }

    /// A slot was given back: the count has room again.
    fn given_back(&self) {
        self.released.notify_waiters();
    }

    /// A request was refused over the cap.
    fn refused(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.rejected.increment(1);
    }
}

/// A cap's metric handles, resolved when the cap is built.
#[cfg(feature = "metrics")]
struct CapMetrics {
    in_flight: metrics::Gauge,
    rejected: metrics::Counter,
}

#[cfg(feature = "metrics")]
impl CapMetrics {
    fn new(name: &str) -> Self {
        Self {
            in_flight: metrics::gauge!("tollgate_in_flight", "limit" => name.to_owned()),
            rejected: metrics::counter!(
                "tollgate_requests_total", "limit" => name.to_owned(), "outcome" => "rejected"
            ),
        }
    }
}

enum Backend<K> {
    Memory(Arc<DashMap<K, u32, foldhash::fast::RandomState>>),
    #[cfg(feature = "redis")]
    Redis {
        store: crate::store::redis::RedisStore,
        name: Arc<str>,
        ttl: Duration,
    },
}

impl<K> Clone for ConcurrencyLimit<K> {
    fn clone(&self) -> Self {
        Self {
            cap: self.cap,
            backend: match &self.backend {
                Backend::Memory(map) => Backend::Memory(Arc::clone(map)),
                #[cfg(feature = "redis")]
                Backend::Redis { store, name, ttl } => Backend::Redis {
                    store: store.clone(),
                    name: Arc::clone(name),
                    ttl: *ttl,
                },
            },
            last_warn: Arc::clone(&self.last_warn),
            shared: Arc::clone(&self.shared),
            #[cfg(feature = "metrics")]
            live: self.live.clone(),
        }
    }
}

impl<K> fmt::Debug for ConcurrencyLimit<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ConcurrencyLimit");
        d.field("cap", &self.cap);
        match &self.backend {
            Backend::Memory(_) => d.field("store", &"memory"),
            #[cfg(feature = "redis")]
            Backend::Redis { name, ttl, .. } => d.field("redis", name).field("lease_ttl", ttl),
        };
        d.finish()
    }
}

/// The default lease TTL on Redis.
#[cfg(feature = "redis")]
const DEFAULT_TTL: Duration = Duration::from_secs(60);

impl<K: StoreKey> ConcurrencyLimit<K> {
    /// At most `cap` requests in flight per key, counted in this process.
    pub fn memory(cap: NonZeroU32) -> Self {
        Self {
            cap,
            backend: Backend::Memory(Arc::default()),
            last_warn: Arc::default(),
            shared: Shared::named(crate::DEFAULT_NAME),
            #[cfg(feature = "metrics")]
            live: None,
        }
    }

    /// The name its metrics carry as `limit` (default `default` in memory; on Redis the name it
    /// shares its leases under): its 429s in `tollgate_requests_total{outcome="rejected"}` and
    /// its slots in `tollgate_in_flight` (feature `metrics`). Set it before the first request;
    /// the slots taken so far keep counting under the old name.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`](crate::ConfigError) for a name outside `[A-Za-z0-9_.-]{1,64}`.
    pub fn named(mut self, name: &str) -> Result<Self, crate::ConfigError> {
        crate::validate_name(name)?;
        self.shared = Shared::named(name);
        #[cfg(feature = "metrics")]
        {
            self.live = None;
        }
        Ok(self)
    }

    /// At most `cap` requests in flight per key across every instance that uses `store` with
    /// this `name` (a limiter name, as [`Builder::name`](crate::Builder::name)).
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`](crate::ConfigError) for a name outside `[A-Za-z0-9_.-]{1,64}`.
    #[cfg(feature = "redis")]
    pub fn redis(
        store: crate::store::redis::RedisStore,
        name: &str,
        cap: NonZeroU32,
    ) -> Result<Self, crate::ConfigError> {
        crate::validate_name(name)?;
        Ok(Self {
            cap,
            backend: Backend::Redis {
                store,
                name: Arc::from(name),
                ttl: DEFAULT_TTL,
            },
            last_warn: Arc::default(),
            shared: Shared::named(name),
            #[cfg(feature = "metrics")]
            live: None,
        })
    }

    /// The TTL of a Redis lease (default 60 s, at least 3 ms); renewed every TTL/3 while its
    /// request is in flight. No effect in memory.
    #[must_use]
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        #[cfg(feature = "redis")]
        if let Backend::Redis { ttl: t, .. } = &mut self.backend {
            *t = ttl.max(Duration::from_millis(3));
        }
        #[cfg(not(feature = "redis"))]
        let _ = ttl;
        self
    }

    /// The cap per key.
    pub fn cap(&self) -> u32 {
        self.cap.get()
    }

    /// Takes a slot for `key`: `Ok(Some(slot))`, `Ok(None)` when the store failed (fail open),
    /// `Err(())` over the cap.
    pub(crate) async fn acquire(&self, key: &K) -> Result<Option<Slot<K>>, ()> {
        match &self.backend {
            Backend::Memory(map) => self.take_in(map, key).map(Some),
            #[cfg(feature = "redis")]
            Backend::Redis { store, name, ttl } => {
                let set = store.lease_key(key, name);
                let id = lease_id();
                match store.lease_acquire(&set, &id, self.cap.get(), *ttl).await {
                    Ok((true, _)) => Ok(Some(Slot::redis(
                        store.clone(),
                        set,
                        id,
                        *ttl,
                        Arc::clone(&self.shared),
                    ))),
                    Ok((false, _)) => Err(()),
                    Err(e) => {
                        if self.last_warn.ready(Duration::from_secs(1)) {
                            tracing::warn!(limit = &*self.shared.name, error = %e, "concurrency limit: Redis failed; passing without a lease");
                        }
                        Ok(None)
                    }
                }
            }
        }
    }

    fn take_in(
        &self,
        map: &Arc<DashMap<K, u32, foldhash::fast::RandomState>>,
        key: &K,
    ) -> Result<Slot<K>, ()> {
        let mut held = map.entry(key.clone()).or_insert(0);
        if *held >= self.cap.get() {
            return Err(());
        }
        *held += 1;
        self.shared.taken();
        Ok(Slot::Memory {
            map: Arc::clone(map),
            key: key.clone(),
            shared: Arc::clone(&self.shared),
        })
    }

    /// The same counts (the slots in flight stay counted) under another cap.
    #[cfg(feature = "rules")]
    pub(crate) fn with_cap(&self, cap: NonZeroU32) -> Self {
        Self {
            cap,
            ..self.clone()
        }
    }

    /// Takes a slot for `key`, waiting up to `wait` for one: woken when a slot of this process
    /// is given back, and polling every 50 ms (slots of other instances on Redis).
    async fn acquire_within(&self, key: &K, wait: Duration) -> Result<Option<Slot<K>>, ()> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the attempt, so a release between the two is not missed.
            let mut released = std::pin::pin!(self.shared.released.notified());
            released.as_mut().enable();
            if let Ok(slot) = self.acquire(key).await {
                return Ok(slot);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(());
            }
            let poll = deadline.min(now + Duration::from_millis(50));
            // Woken by a release, or the poll interval elapsed: try again either way.
            let _ = tokio::time::timeout_at(poll, released).await;
        }
    }

    /// The answer over the cap: 429 from the rejection hook (a trailers-only
    /// `RESOURCE_EXHAUSTED` to gRPC), at once or after `waited` for a slot, with the cap's fields.
    fn over<B, R: OnRejected<ResponseBody<B>>>(
        &self,
        rejection: &R,
        is_grpc: bool,
        waited: Option<Duration>,
    ) -> Response<ResponseBody<B>> {
        let cap = self.cap.get();
        self.shared.refused();
        let refusal = Refusal::OverCap { cap, waited };
        let mut res = if is_grpc {
            grpc::refused(refusal)
        } else {
            rejection.on_refused(refusal)
        };
        let headers = res.headers_mut();
        headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(cap));
        headers.insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from(0u32));
        headers.insert(RETRY_AFTER, HeaderValue::from(1u32));
        res.extensions_mut().insert(OverCap);
        res
    }
}

/// Marks the answer of a [`ConcurrencyLayer`] over its cap: an enclosing rate limit refunds the
/// request (it never ran) and keeps the answer's fields.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OverCap;

/// A unique lease id: a per-process random prefix and a counter.
#[cfg(feature = "redis")]
fn lease_id() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        foldhash::fast::RandomState::default()
            .hash_one((std::process::id(), std::time::SystemTime::now()))
    });
    format!("{prefix:016x}{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A slot in flight; given back when dropped (with the response body, or the request's future).
pub(crate) enum Slot<K: StoreKey> {
    Memory {
        map: Arc<DashMap<K, u32, foldhash::fast::RandomState>>,
        key: K,
        shared: Arc<Shared>,
    },
    #[cfg(feature = "redis")]
    Redis {
        store: crate::store::redis::RedisStore,
        set: String,
        id: String,
        renew: Option<tokio::task::JoinHandle<()>>,
        shared: Arc<Shared>,
    },
}

#[cfg(feature = "redis")]
impl<K: StoreKey> Slot<K> {
    fn redis(
        store: crate::store::redis::RedisStore,
        set: String,
        id: String,
        ttl: Duration,
        shared: Arc<Shared>,
    ) -> Self {
        shared.taken();
        let renew = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (store, set, id) = (store.clone(), set.clone(), id.clone());
            let name = Arc::clone(&shared.name);
            rt.spawn(async move {
                let every = ttl / 3;
                loop {
                    tokio::time::sleep(every).await;
                    match store.lease_renew(&set, &id, ttl).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(
                                limit = &*name,
                                "concurrency limit: a lease expired while its request was in flight"
                            );
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(limit = &*name, error = %e, "concurrency limit: renewing a lease failed")
                        }
                    }
                }
            })
        });
        Slot::Redis {
            store,
            set,
            id,
            renew,
            shared,
        }
    }
}

impl<K: StoreKey> Tail for Slot<K> {}

impl<K: StoreKey> Drop for Slot<K> {
    fn drop(&mut self) {
        match self {
            Slot::Memory { map, key, shared } => {
                let empty = map.get_mut(key).is_some_and(|mut held| {
                    *held = held.saturating_sub(1);
                    *held == 0
                });
                if empty {
                    map.remove_if(key, |_, held| *held == 0);
                }
                shared.ended();
                shared.given_back();
            }
            #[cfg(feature = "redis")]
            Slot::Redis {
                store,
                set,
                id,
                renew,
                shared,
            } => {
                if let Some(renew) = renew.take() {
                    renew.abort();
                }
                shared.ended();
                let (store, set, id) = (store.clone(), std::mem::take(set), std::mem::take(id));
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        let shared = Arc::clone(shared);
                        rt.spawn(async move {
                            let result = store.lease_release(&set, &id).await;
                            shared.given_back();
                            // A timeout is counted and warned about (once a second) by the store.
                            match result {
                                Err(e) if e.kind() != crate::StoreErrorKind::Timeout => {
                                    tracing::warn!(limit = &*shared.name, error = %e, "concurrency limit: releasing a lease failed; it expires by its TTL");
                                }
                                _ => {}
                            }
                        });
                    }
                    Err(_) => tracing::warn!(
                        limit = &*shared.name,
                        "concurrency limit: a lease dropped outside a tokio runtime expires by its TTL"
                    ),
                }
            }
        }
    }
}

/// Caps the requests in flight per key with a [`ConcurrencyLimit`]. Over the cap a request is
/// answered at once (or, with [`wait`](Self::wait), once no slot came free in time): `429 Too Many Requests` with `x-ratelimit-limit: N`,
/// `x-ratelimit-remaining: 0`, `Retry-After: 1` and a text/plain body that names the cap (to gRPC
/// calls a trailers-only `RESOURCE_EXHAUSTED` with the same metadata). A request without a key
/// gets `400` (gRPC `INVALID_ARGUMENT`). Both answers come from the rejection hook
/// ([`respond_with`](Self::respond_with), e.g. [`ProblemJson`](super::ProblemJson)) through
/// [`OnRejected::on_refused`] with [`Refusal::OverCap`] or [`Refusal::NoKey`]; the layer then
/// adds the fields above.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::num::NonZeroU32;
/// use axum::{Router, routing::post};
/// use tollgate::key::HeaderKey;
/// use tollgate::layer::{ConcurrencyLayer, ConcurrencyLimit};
///
/// // At most 4 generations in flight per API key.
/// let limit = ConcurrencyLimit::memory(NonZeroU32::new(4).unwrap());
/// let app: Router = Router::new()
///     .route("/generate", post(|| async { "..." }))
///     .layer(ConcurrencyLayer::new(limit, HeaderKey::new("x-api-key")));
/// # let _ = app;
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct ConcurrencyLayer<X: KeyExtractor, R = DefaultRejection> {
    limit: ConcurrencyLimit<X::Key>,
    key: X,
    wait: Option<Duration>,
    rejection: R,
}

impl<X: KeyExtractor> ConcurrencyLayer<X> {
    /// Caps requests in flight per key with `limit`, keyed by `key`.
    pub fn new(limit: ConcurrencyLimit<X::Key>, key: X) -> Self {
        #[cfg(feature = "metrics")]
        let limit = {
            let mut limit = limit;
            if limit.live.is_none() {
                let owner = Arc::as_ptr(&limit.shared) as usize;
                let label = crate::metrics::LiveLabel::new(
                    crate::metrics::Kind::Cap,
                    &limit.shared.name,
                    owner,
                );
                limit.live = Some(Arc::new(label));
            }
            limit
        };
        Self {
            limit,
            key,
            wait: None,
            rejection: DefaultRejection,
        }
    }
}

impl<X: KeyExtractor, R> ConcurrencyLayer<X, R> {
    /// Builds the refusals (over the cap, no key) with the responder `f`, as
    /// [`RateLimitLayer::respond_with`](super::RateLimitLayer::respond_with) does: e.g. [`ProblemJson`](super::ProblemJson),
    /// so that both layers answer in one format. The layer still adds `x-ratelimit-limit`,
    /// `x-ratelimit-remaining` and `Retry-After` over the cap.
    pub fn respond_with<R2>(self, f: R2) -> ConcurrencyLayer<X, R2> {
        ConcurrencyLayer {
            limit: self.limit,
            key: self.key,
            wait: self.wait,
            rejection: f,
        }
    }

    /// Pacing: a request over the cap waits up to `max` for a slot instead of being refused at
    /// once; it is woken when a slot of this process is given back, and retries every 50 ms (on
    /// Redis: one call per retry, for slots of other instances). Refused after `max` with a body
    /// that names the wait. A waiter that is cancelled (client gone) holds nothing.
    pub fn wait(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }
}

impl<S, X: KeyExtractor + Clone, R: Clone> Layer<S> for ConcurrencyLayer<X, R> {
    type Service = ConcurrencyService<S, X, R>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyService {
            inner,
            limit: self.limit.clone(),
            key: self.key.clone(),
            wait: self.wait,
            rejection: Arc::new(self.rejection.clone()),
        }
    }
}

/// The service of a [`ConcurrencyLayer`].
#[derive(Debug)]
pub struct ConcurrencyService<S, X: KeyExtractor, R = DefaultRejection> {
    inner: S,
    limit: ConcurrencyLimit<X::Key>,
    key: X,
    wait: Option<Duration>,
    rejection: Arc<R>,
}

impl<S: Clone, X: KeyExtractor + Clone, R> Clone for ConcurrencyService<S, X, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limit: self.limit.clone(),
            key: self.key.clone(),
            wait: self.wait,
            rejection: Arc::clone(&self.rejection),
        }
    }
}

/// The response future of a [`ConcurrencyService`].
pub(crate) type ConcurrencyFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

impl<S, ReqB, ResB, X, R> Service<Request<ReqB>> for ConcurrencyService<S, X, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    X: KeyExtractor,
    R: OnRejected<ResponseBody<ResB>>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ConcurrencyFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let is_grpc = grpc::is_grpc(&parts.headers);
        let key = match self.key.extract(&parts) {
            Ok(key) => key,
            Err(e) => {
                let refusal = Refusal::NoKey {
                    status: StatusCode::BAD_REQUEST,
                    error: &e,
                };
                let res = if is_grpc {
                    grpc::refused(refusal)
                } else {
                    self.rejection.on_refused(refusal)
                };
                return Box::pin(std::future::ready(Ok(res)));
            }
        };
        // The ready-clone idiom: the service that was polled ready goes into the future.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit.clone();
        let wait = self.wait;
        let rejection = Arc::clone(&self.rejection);
        Box::pin(async move {
            let acquired = match wait {
                None => limit.acquire(&key).await,
                Some(max) => limit.acquire_within(&key, max).await,
            };
            let Ok(slot) = acquired else {
                tracing::debug!(
                    limit = &*limit.shared.name,
                    cap = limit.cap(),
                    "concurrency limit: over the cap"
                );
                return Ok(limit.over(&*rejection, is_grpc, wait));
            };
            // Dropped with this future if the client goes away before the response.
            let res = inner.call(Request::from_parts(parts, body)).await?;
            let mut res = res.map(ResponseBody::inner);
            if let Some(slot) = slot {
                res.body_mut().watch(Box::new(slot));
            }
            Ok(res)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_slots_are_counted_and_given_back() {
        let limit = ConcurrencyLimit::<u8>::memory(NonZeroU32::new(2).unwrap());
        let a = limit.acquire(&1).await.unwrap();
        let b = limit.acquire(&1).await.unwrap();
        assert!(limit.acquire(&1).await.is_err(), "a third is over the cap");
        let other = limit.acquire(&2).await.unwrap();
        drop(a);
        let c = limit.acquire(&1).await.unwrap();
        drop((b, c, other));
        #[allow(irrefutable_let_patterns)]
        if let Backend::Memory(map) = &limit.backend {
            assert!(map.is_empty(), "keys with nothing in flight are removed");
        }
    }
}
