//! Concurrency: at most N requests in flight per key.
//!
//! `ConcurrencyLayer` caps the requests in flight per key ("at most 4 generations at a time per API
//! key"), where tower's `ConcurrencyLimit` is unkeyed and per process. In flight means from admission
//! until the response body ends or is dropped: a cancelled request (client gone) gives its slot back.
//! Over the cap a request gets `429` at once with `x-ratelimit-limit: N`, `x-ratelimit-remaining: 0`,
//! `Retry-After: 1` and a body that names the cap (gRPC: `RESOURCE_EXHAUSTED` with the same metadata).
//! With `.wait(max)` a request over the cap waits up to `max` for a slot instead (woken when a slot
//! of the process comes free, retrying every 50 ms), then gets the 429 with a body that names the wait.
//! Both refusals (over the cap, no key) come from the same hook as the rate limit's:
//! `.respond_with(ProblemJson)` answers them as problem documents (`OnRejected::on_refused` with
//! `Refusal::OverCap`); the layer still adds the fields above. Put it inside the rate-limit layer (added before it with `Router::layer`): a request the rate limit
//! refuses never takes a slot, and a request the cap refuses is refunded by the rate limits around it.
//!
//! ```rust,no_run
//! use std::num::NonZeroU32;
//! use axum::Router;
//! use tollgate::key::HeaderKey;
//! use tollgate::layer::{ConcurrencyLayer, ConcurrencyLimit};
//!
//! fn at_most_four_in_flight(router: Router) -> Router {
//!     let cap = NonZeroU32::new(4).unwrap();
//!     // In this process; `ConcurrencyLimit::redis(store, "gpu", cap)?` shares it between instances
//!     // (feature `redis`), with `.lease_ttl(..)` for the leases' backstop.
//!     let limit = ConcurrencyLimit::memory(cap);
//!     // Add the rate-limit layer after this one, so that it runs first.
//!     router.layer(ConcurrencyLayer::new(limit, HeaderKey::new("x-api-key")))
//! }
//! ```
//!
//! On Redis each request holds a lease in a sorted set per key: **two Redis calls per request** (a
//! script call to acquire, a `ZREM` to release, spawned when the request ends), plus one renewal every
//! TTL/3 for a request that runs longer than that. A lease's TTL (default 60 s) is the backstop for an
//! instance that dies holding it. When Redis fails, the request passes without a lease (fail open,
//! warned about at most once a second).
