//! Rate limiting for Tower and axum.
//!
//! `tollgate` checks each request against a per-key quota and answers `429 Too Many Requests` with
//! `Retry-After` and `x-ratelimit-*` headers when it is spent. It offers every classic algorithm
//! ([`Strategy`]), several quotas at once (`"5/second; 100/minute"`), an embedded in-memory store
//! and a Redis store (feature `redis`) for services running on many machines.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{ManualClock, RateLimiter, Strategy};
//!
//! let clock = ManualClock::new(Duration::from_secs(45));
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::FixedWindowFirstHit)
//!     .quotas("10/minute").unwrap()
//!     .clock(clock.clone())
//!     .build()
//!     .unwrap();
//! for _ in 0..10 {
//!     assert!(limiter.check_now(&"203.0.113.9", 1).is_allowed());
//! }
//! let d = limiter.check_now(&"203.0.113.9", 1);
//! assert_eq!((d.is_allowed(), d.retry_after_secs()), (false, Some(60)));
//! clock.advance(Duration::from_secs(60));
//! assert!(limiter.check_now(&"203.0.113.9", 1).is_allowed());
//! ```
//!
//! On an axum router, the layer answers `429` with the headers once a client's quota is spent (see
//! [`layer`] for every option, [`key`] for the key extractors and their trust rules):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::net::SocketAddr;
//! use axum::{Router, body::Body, extract::ConnectInfo, routing::get};
//! use http::{Request, StatusCode};
//! use tollgate::{RateLimitLayer, RateLimiter, key::PeerIp};
//! use tower::ServiceExt;
//!
//! let limiter = RateLimiter::builder().quotas("1/minute").unwrap().build().unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(RateLimitLayer::new(limiter, PeerIp::default()));
//! let request = || {
//!     let peer: SocketAddr = "203.0.113.9:5000".parse().unwrap();
//!     // axum's `into_make_service_with_connect_info::<SocketAddr>()` inserts this per connection.
//!     Request::get("/").extension(ConnectInfo(peer)).body(Body::empty()).unwrap()
//! };
//! assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), StatusCode::OK);
//! let res = app.oneshot(request()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
//! assert!(res.headers().contains_key("retry-after"));
//! # }
//! ```
//!
//! The [`guide`] has a chapter per subject: which strategy to pick (with the formulas and bounds),
//! keys and trusted proxies, headers, stores and Redis in production, leasing, rules files,
//! metrics, gRPC, settlement, concurrency, shaping queues and time zones, changing limits.
//!
//! # Features
//! Only `axum` is on by default; the others opt in.
//! - `axum` (default): the peer-IP extractor also reads axum's `ConnectInfo<SocketAddr>`.
//! - `redis`: `store::redis::RedisStore`: single node, Cluster, Sentinel, TLS.
//! - `tonic`: the peer-IP extractor also reads tonic's `TcpConnectInfo`.
//! - `metrics` (on with `rules`): every rate-limit layer records the `tollgate_*` metrics through
//!   the `metrics` facade (`tollgate::metrics`).
//! - `rules`: limits from a TOML rules file, reloaded without losing state, with metrics through
//!   the `metrics` facade (`tollgate::rules`).
//! - `serde` (on with `rules`): `Serialize`/`Deserialize` on [`Quota`] (with its burst),
//!   [`Strategy`], [`WindowOffset`] and [`Rule`] (with its window offset); each reads back what
//!   it writes as an equal value.
#![cfg_attr(docsrs, feature(doc_cfg))]
// No panics outside tests: a panic on the request path takes the service down.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod clock;
mod decision;
mod error;
// Fuzz target bodies: for cargo-fuzz (`--cfg fuzzing`) and the lib's tests only.
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
pub mod guide;
pub mod key;
pub mod layer;
mod limiter;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod offset;
mod quota;
mod rule;
#[cfg(feature = "rules")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules")))]
pub mod rules;
#[cfg(feature = "serde")]
mod serde_impls;
mod stats;
pub mod store;
mod strategy;
mod throttle;
mod wait;

pub use clock::{Clock, CoarseClock, ManualClock, SystemClock, TokioClock};
pub use decision::{Decision, Outcome, Reservation};
pub use error::{BuildError, ConfigError, StoreError, StoreErrorKind, TlsFileProblem, UrlProblem};
pub use layer::{RateLimitLayer, RateLimitService};
pub use limiter::{Builder, RateLimiter, WaitError};
pub(crate) use limiter::{DEFAULT_NAME, validate_name};
pub use offset::WindowOffset;
pub use quota::{ParseError, ParseErrorKind, Quota, QuotaError, parse_quotas};
pub use rule::Rule;
pub use stats::Stats;
pub use strategy::{Op, Strategy};

/// The README's code blocks, compiled and run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
