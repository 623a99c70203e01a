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
//! # Features
//! - `axum` (default): the peer-IP extractor also reads axum's `ConnectInfo<SocketAddr>`.
//! - `redis`: [`store::redis::RedisStore`], single node and Cluster.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
mod decision;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod key;
pub mod layer;
mod limiter;
mod quota;
mod rule;
mod stats;
pub mod store;
mod strategy;

pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use decision::{Decision, Outcome};
pub use error::{ConfigError, StoreError, StoreErrorKind};
pub use layer::{RateLimitLayer, RateLimitService};
pub use limiter::{Builder, Given, IntoStore, RateLimiter, WaitError};
pub use quota::{
    MAX_PERIOD, ParseQuotaError, ParseQuotaErrorKind, Quota, QuotaError, parse_quotas,
};
pub use rule::{MAX_QUOTAS, Rule};
pub use stats::Stats;
pub use strategy::{MAX_MOVING_WINDOW_LIMIT, Op, Strategy, UnknownStrategy};
