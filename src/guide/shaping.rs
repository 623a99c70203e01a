//! Shaping queues and time zones: requests that wait for their slot instead of failing, windows
//! that follow a user's clock, and clients that pace their own calls.
//!
//! # A shaping queue (leaky bucket in delay mode)
//!
//! Requests over the limit can wait in a queue instead of being refused:
//! `layer.pacing(Pacing::Queue(MAX_WAIT))?` on a
//! `leaky-bucket` limiter with one quota (`server --strategy leaky-bucket --queue MAX_WAIT_MS`). Each
//! request gets its departure time when it arrives (a reservation in the store, memory or Redis, so the
//! queue is shared by every instance on Redis), `T = period / limit` after the previous waiter's — no
//! initial burst, `--burst` warns — and leaves in arrival order at the constant rate; its headers are
//! computed when it leaves. The only bound is the maximum wait: a request whose departure would come more
//! than MAX_WAIT after its arrival gets a `429` at once. A waiter whose client goes away gives its slot
//! back only if it holds the last reservation (the next arrival takes that departure; one atomic step in
//! memory or in the Redis script); otherwise the gap stays and the others keep their departures.
//! The headers describe the queue: `x-ratelimit-limit` is its depth (`MAX_WAIT / T + 1` places,
//! `MAX_WAIT` rounded down to a whole number of `T`), `x-ratelimit-remaining` the places free when
//! the request left. Settlement does not apply in this mode (a slot given back from the middle would
//! put two waiters in one). Departure gaps are measured in BENCHMARKS.md.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use tollgate::{RateLimitLayer, RateLimiter, Strategy, key::GlobalKey, layer::Pacing};
//!
//! // At most 10 a second, leaving 100 ms apart; a request that would wait over 2 s gets a 429.
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::LeakyBucket)
//!     .quotas("10/second").unwrap()
//!     .build()
//!     .unwrap();
//! let layer = RateLimitLayer::new(limiter, GlobalKey)
//!     .pacing(Pacing::Queue(Duration::from_secs(2)))
//!     .unwrap();
//! # let _ = layer;
//! // A queue needs the leaky bucket with one quota: anything else is a configuration error.
//! let windows = RateLimiter::builder().quotas("10/second").unwrap().build().unwrap();
//! let layer = RateLimitLayer::new(windows, GlobalKey);
//! assert!(layer.pacing(Pacing::Queue(Duration::from_secs(2))).is_err());
//! # }
//! ```
//!
//! The [rules file](super::rules)'s `queue_ms` is the same queue, per limit.
//!
//! # Windows in a user's time zone
//!
//! A daily window resets at midnight, but whose? Clock-aligned windows (`fixed-window` and
//! `sliding-window`) take the UTC offset of the time zone whose clock they follow: `[+-]HH:MM`, or `[+-]`
//! followed by `Nh`, `Nm` or `NhMm`, under 24 h, applied modulo the period. With `8h` a `1/day` window
//! resets at midnight in UTC+8 (16:00 UTC), with `-5h` at 05:00 UTC, with `30m` an hourly window resets at
//! half past every UTC hour; `Retry-After`, `x-ratelimit-reset` and `t` point at the shifted edge. Set it
//! per limiter (`Builder::window_offset`, `server --window-offset OFFSET`) or per request (a rule per
//! request: `rule.with_window_offset(offset)` through the layer's `select_rule` or `RateLimiter::apply`),
//! in memory and on Redis. A key's state is its limiter's whatever the offset: a changed offset
//! converts it (the spend carried into the window under the new offset). Other strategies have no clock-aligned edges: they warn and ignore it.
//! Fixed offsets only: daylight-saving rules and zone names are out of scope (a zone that changes its
//! offset twice a year gets a window an hour longer or shorter only if you change the offset you pass).
//!
//! A user who spends a daily quota and then changes time zone keeps what they spent: the spend moves
//! into the window under the new offset, which may reject for up to one window more, never admit
//! more. Take the offset from the account's stored settings all the same (not from a request header
//! or query parameter), so that a client cannot shift its window edges at will.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{ManualClock, RateLimiter, Strategy, WindowOffset};
//!
//! // 2026-01-01 12:00 UTC; a 1/day window in UTC+8 resets at 16:00 UTC, four hours later.
//! let clock = ManualClock::new(Duration::from_secs(1_767_268_800));
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::FixedWindow)
//!     .quotas("1/day").unwrap()
//!     .window_offset("+08:00".parse::<WindowOffset>().unwrap())
//!     .clock(clock)
//!     .build()
//!     .unwrap();
//! assert!(limiter.check_now(&"alice", 1).is_allowed());
//! assert_eq!(limiter.check_now(&"alice", 1).retry_after_secs(), Some(4 * 3600));
//! ```
//!
//! # Pacing instead of failing
//!
//! [`RateLimitLayer::pacing(max_delay)`](crate::RateLimitLayer::pacing) makes a request over the
//! limit wait up to `max_delay` for its slot instead of getting a `429`. For outgoing calls,
//! [`PaceLayer`](crate::layer::PaceLayer) wraps a client service (any `tower::Service`): each call
//! waits on tokio's timer for a slot of the limiter's quota (the "wait for a slot" API clients use to
//! stay under a provider's limit), and a call whose slot is further away than the maximum wait
//! (default 60 s) fails at once without calling the inner service; the `client` example uses it.
