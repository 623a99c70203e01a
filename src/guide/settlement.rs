//! Settlement: charging what a request used (tokens, bytes, rows), known only after the handler ran.
//!
//! LLM gateways and metered APIs charge what a call used (tokens, bytes, rows), known only after the
//! handler ran. A request is admitted on an estimate (`cost`), its reservation is then settled to the
//! actual units, atomically, in the window or bucket it was counted in (in memory and on Redis). The
//! actual units come from a `Settle` marker in the response's extensions (one limiter: the innermost,
//! or the one it names), or from a source set with `RateLimitLayer::settle_from`:
//!
//! - `SettleFrom::header(name)`: a response header with a decimal count; the response's rate-limit
//!   fields show the settled state.
//! - `SettleFrom::extension()`: a `layer::UsedUnits::new(n)` in the response's extensions, read (not taken)
//!   by every stacked limiter configured with it, each settling its own reservation.
//! - `SettleFrom::trailer(name)`: a trailer at the body's end (a gRPC service's usage in its trailing
//!   metadata); a body that ends without it, or is dropped first, leaves the estimate.
//! - `SettleFrom::body(|chunk| units)`: summed over the body's data frames as it streams, settled
//!   when the body ends, or when it is dropped (a client that goes away pays for what it was sent);
//!   capped per stream (`.cap(n)`, default the rule's largest limit). The fields show the estimate:
//!   the head leaves before the count is known.
//!
//! With settlement on, the estimate is at least 1, so a cost-0 peek cannot pass a key that is deep in
//! debt. A value that is missing, negative, not a number or above `u32::MAX` leaves the estimate
//! charged, with one warning. An LLM-token budget per API key:
//!
//! ```rust,no_run
//! use axum::Router;
//! use http::HeaderName;
//! use tollgate::layer::{RateLimitLayer, SettleFrom};
//! use tollgate::{ConfigError, RateLimiter, Strategy, key::HeaderKey};
//!
//! // 200 000 tokens a day per key; a call is admitted if 1 000 tokens (a typical answer) are left,
//! // then charged what the backend reports in `x-tokens-used`.
//! fn token_budget(router: Router) -> Result<Router, ConfigError> {
//!     let tokens = RateLimiter::builder()
//!         .name("tokens")
//!         .strategy(Strategy::SlidingWindow)
//!         .quotas("200000/day")?
//!         .build()?;
//!     Ok(router.layer(
//!         RateLimitLayer::new(tokens, HeaderKey::new("x-api-key"))
//!             .cost(|_| 1_000)
//!             .settle_from(SettleFrom::header(HeaderName::from_static("x-tokens-used"))),
//!     ))
//! }
//! // A streamed answer (server-sent events) whose size is only known at its end:
//! // .settle_from(SettleFrom::body(|chunk| count_tokens(chunk)).cap(50_000))
//! ```
//!
//! A key that spends more than it had left goes into debt (at most one horizon) and waits it out.
//!
//! # The marker, and settling by hand
//!
//! A handler that inserts a [`Settle`](crate::layer::Settle) marker into its response's extensions
//! gets its request charged what it says instead of its cost: `Settle::units(n)`, or
//! `Settle::refund()` for nothing ("only failures count": a successful login gives its unit back;
//! see the `login` example). With axum: `(Extension(Settle::refund()), "welcome")`. Only one limiter
//! settles it, never another's reservation: the innermost layer that counted the request, or the one
//! [`Settle::for_limiter`](crate::layer::Settle::for_limiter) names; enclosing limiters keep their
//! count. Without a layer, [`RateLimiter::settle`](crate::RateLimiter::settle) takes the check's
//! [`Reservation`](crate::Decision::reservation) and the actual units.
//!
//! # What settling does to the state
//!
//! Settlement charges the actual cost `a` of a check that reserved `c`, where it was counted: GCRA
//! moves `TAT` by `(a - c)*T`, never below `t`; the windows adjust the window or bucket of the
//! check, or do nothing once it has ended; the moving window adds or removes entries at the check's
//! own timestamp, never another request's (a charge beyond a full log is dropped, and counted in
//! the store's `Stats::settle_dropped_units`, published as `tollgate_settle_dropped_units_total`).
//! Debt is capped at one horizon. Settling never frees room in a later window.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{ManualClock, RateLimiter, Strategy};
//!
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::FixedWindow)
//!     .quotas("100/hour").unwrap()
//!     .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
//!     .build()
//!     .unwrap();
//! // Admitted on an estimate of 10, then charged the 3 units the call used.
//! let d = limiter.check_now(&"key", 10);
//! assert_eq!(d.remaining(), 90);
//! let settled = limiter.settle_now(&"key", d.reservation().unwrap(), 3);
//! assert_eq!(settled.remaining(), 97);
//! ```
//!
//! # A reservation belongs to its check
//!
//! A [`Reservation`](crate::Reservation) settles only against the limiter, rule and key whose check
//! made it: a settlement anywhere else is refused (`StoreErrorKind::ForeignReservation`;
//! `settle_now` answers as a peek), counted in `Stats::settle_refused`, and never applied.
//! `Op::Settle` is built only from a reservation, by `Op::settle`.
