//! The user's guide, one chapter per subject. This module holds documentation only.
//!
//! 1. [Strategies](strategies): which one to pick, the formulas behind every header, the bounds
//!    each keeps, several quotas, costs.
//! 2. [Keys and proxies](keys): whose quota a request spends, and whom to trust.
//! 3. [Headers](headers): the `x-ratelimit-*` fields, `Retry-After`, the IETF fields, problem
//!    documents, stacked layers and CORS.
//! 4. [Stores and Redis in production](stores): the memory store, Redis under overload, outages,
//!    TLS, Sentinel and Cluster, and the errors.
//! 5. [Quota leasing](leasing): a hot key on Redis without a call per request.
//! 6. [Rules files and reloads](rules): limits from TOML, decided all or nothing, reloaded.
//! 7. [Metrics and tracing](metrics): what is counted and logged.
//! 8. [gRPC](grpc): tonic servers.
//! 9. [Settlement](settlement): charging what a request used.
//! 10. [Concurrency](concurrency): requests in flight per key.
//! 11. [Shaping queues and time zones](shaping): waiting instead of failing, windows in a user's
//!     clock, pacing clients.
//! 12. [Changing limits](changing_limits): what a key keeps when its rule changes.
//! 13. [The `server` example](server): every flag of the demo, the playground and the simulator.
//!
//! Notation used throughout: a quota admits `N` units per period `W` (`"100/minute"`: `N = 100`,
//! `W = 60 s`); a request costs `c` units (1 unless the layer's
//! [`cost`](crate::RateLimitLayer::cost) says otherwise); `t` is now. The bucket strategies also have
//! a burst `B` (the quota's limit unless [`Quota::with_burst`](crate::Quota::with_burst) or the
//! builder's [`burst`](crate::Builder::burst) sets it) and an emission interval `T = ceil(W / N)`,
//! rounded *up* in the store's unit (nanoseconds in memory, microseconds on Redis) so that rounding
//! never admits more than the quota.

pub mod changing_limits;
pub mod concurrency;
pub mod grpc;
pub mod headers;
pub mod keys;
pub mod leasing;
pub mod metrics;
pub mod rules;
pub mod server;
pub mod settlement;
pub mod shaping;
pub mod stores;
pub mod strategies;
