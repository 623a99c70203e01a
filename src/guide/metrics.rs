//! Metrics and tracing: what the layers count and log.
//!
//! # Metrics
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade (pick any exporter; feature
//! `metrics`, which `rules` turns on) by the rules file's layer and by every plain `RateLimitLayer` (its
//! `limit` label is its limiter's name); handles are resolved when the rules are loaded or the layer is
//! built (install the recorder first), so a request costs one atomic add per metric. The key is never a
//! label. The gauges are refreshed every second by one thread of the process while a layer or rules
//! file lives (`metrics::publish_stats()` publishes them at once,
//! `Rules::publish_stats()` those of one file). A second
//! limiter or cap with the `limit` label of one still alive warns once when built.
//!
//! | Metric | Type | Labels | Meaning |
//! | --- | --- | --- | --- |
//! | `tollgate_requests_total` | counter | `limit`, `outcome` | per matching limit and request: `allowed` (forwarded), `rejected`, `shadow_rejected` (rules file), `fail_open`, `fail_closed`, `local_allowed` and `local_rejected` (the Redis store's local fallback, `RedisStoreBuilder::local_fallback`, decided during an outage), `no_key`, `shed` (the Redis store rejected the check without asking Redis, having no room to ask it within its timeout: overload, `Decision::was_shed`); nothing for a limit whose reservation another limit's rejection rolled back |
//! | `tollgate_units_total` | counter | `limit` | units charged to forwarded requests once settled (a `Settle` marker, a settle source, the body's end; the estimate when nothing settled them) |
//! | `tollgate_store_errors_total` | counter | `limit` | store failures (decisions and rollbacks) |
//! | `tollgate_store_latency_seconds` | histogram | `limit` | remote stores only: the time of each decision that was not ready at once; buckets `metrics::STORE_LATENCY_BUCKETS` (0.5 ms .. 1 s), set them in your exporter |
//! | `tollgate_keys` | gauge | `limit` | memory store: keys held (refreshed every second) |
//! | `tollgate_evictions_total` | counter | `limit` | memory store: keys evicted at the `max_keys` cap (published with `tollgate_keys`) |
//! | `tollgate_breaker_open` | gauge | `limit` | Redis store: 1 while its circuit breaker is open, else 0 (published with `tollgate_keys`) |
//! | `tollgate_store_up` | gauge | `limit` | 0 while the store cannot be used (the Redis store before it first connects, e.g. a host name that does not resolve, and while its circuit breaker is open), else 1 (published with `tollgate_keys`) |
//! | `tollgate_in_flight` | gauge | `limit` | requests a concurrency cap (`ConcurrencyLimit`, or a rules file's `concurrency`) holds a slot for in this process; a cap's 429 counts as `rejected` in `tollgate_requests_total` under the same name |
//! | `tollgate_settle_dropped_units_total` | counter | `limit` | units settled above a reservation that a moving window could not record, its log already full (`Stats::settle_dropped_units`: the count of the limiter's store, so limiters sharing one store each show the store's total; not published for a rules file on a shared store such as Redis) |
//! | `tollgate_rules_reloads_total` | counter | `result` = `ok`, `error` | reloads (the first load is not counted) |
//! | `tollgate_settle_unmatched_total` | counter | `limit` (the marker's name, `""` unnamed) | `Settle` markers a layer saw and no layer took, counted when the response goes (logged once per name; past 256 names, `(other)`) |
//!
//! The store figures (`tollgate_keys`, `tollgate_evictions_total`, `tollgate_breaker_open`,
//! `tollgate_store_up`, `tollgate_settle_dropped_units_total`) of every live layer and rules file
//! are refreshed once a second by one thread of the process (started with the first layer, ended
//! with the last), so they are at most about a second old.
//!
//! Every line the layers log names the limiter or limit that decided (`limit` field), and the
//! [`StoreError`](crate::StoreError) of a `503` names it too ([`StoreError::limiter`](crate::StoreError::limiter)).
//! When a subscriber wants `trace` events, each request's pass through a layer runs in a span
//! `tollgate.decide{layer, cost}` (`layer`: the limiter's name, or `rules`), and a rules file's
//! multi-limit decision in `tollgate.rules.decide`; otherwise no span is built (one level check).

//! With no recorder installed, a metric costs a branch.
//!
//! # Tracing
//!
//! The layers log through `tracing`. A store failure under fail-open is warned about at most once a
//! second; a misconfiguration (a flag or option without effect) is warned about once. Keys appear in
//! events only with [`KeyPolicy::log_keys(true)`](crate::layer::KeyPolicy::log_keys), and then as a short keyed
//! hash (`#` and 12 hex digits, keyed per process) unless the key is an IP address, so that one key's
//! events can be followed without the logs holding API keys or user ids. `RUST_LOG=tollgate=debug`
//! gives one line per rejection in the `server` example.
//!
//! ```
//! # #[cfg(feature = "metrics")] {
//! use tollgate::{RateLimitLayer, RateLimiter, key::PeerIp};
//!
//! // Install the recorder (any `metrics` exporter) before building the layers, then:
//! let limiter = RateLimiter::builder().name("api").quotas("100/minute").unwrap().build().unwrap();
//! let layer = RateLimitLayer::new(limiter, PeerIp::default());
//! # let _ = layer;
//! tollgate::metrics::publish_stats(); // optional: the gauges are refreshed every second anyway
//! # }
//! ```
