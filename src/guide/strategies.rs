//! Strategies: which one to pick, the formulas behind every header, and the bounds each keeps.
//!
//! | [`Strategy`](crate::Strategy) (`--strategy`) | state per key | exact? | worst case in one trailing period | pick it when |
//! | --- | --- | --- | --- | --- |
//! | [`FixedWindow`](crate::Strategy::FixedWindow) (`fixed-window`) | window start + count | per window | `2N`, across a window edge | you want the cheapest limiter and resets that line up with the clock ("5000/hour, resets on the hour", like GitHub's API) |
//! | [`FixedWindowFirstHit`](crate::Strategy::FixedWindowFirstHit) (`fixed-window-first-hit`) | window start + count | per window | `2N` | the window should start with the user's first action ("10 tries, then wait a minute") |
//! | [`MovingWindow`](crate::Strategy::MovingWindow) (`moving-window`, sliding log) | one timestamp per admitted unit, at most `N` | yes | `N` | the limit must hold in *every* trailing period (login throttling, costly operations); memory is `O(N)` per key, so keep `N` modest |
//! | [`SlidingWindow`](crate::Strategy::SlidingWindow) (`sliding-window`, the default) | two counters | approximate | `2N` for an adversary who times two bursts; within a few percent of exact on ordinary traffic | a good default: smooth, cheap, no edge bursts on ordinary traffic |
//! | [`TokenBucket`](crate::Strategy::TokenBucket) (`token-bucket`, GCRA) | one timestamp | yes, to its definition | `B + floor(L / T)` in any interval `L` (up to `2N - 1` in one period when `B = N`) | bursts up to `B`, then a steady rate: APIs and their clients |
//! | [`LeakyBucket`](crate::Strategy::LeakyBucket) (`leaky-bucket`, as a meter) | one timestamp | yes | as the token bucket | a queue of capacity `B` drained at a constant rate; with a [shaping queue](super::shaping) or [`PaceLayer`](crate::layer::PaceLayer) it smooths traffic to the rate |
//!
//! The fixed windows come in two alignments. [`FixedWindow`](crate::Strategy::FixedWindow) windows
//! are whole multiples of the period in Unix time: a `1/hour` window resets at the top of every UTC
//! hour (or of the hour in the rule's [time zone](super::shaping)), and every instance and Redis
//! agree on it. [`FixedWindowFirstHit`](crate::Strategy::FixedWindowFirstHit) opens a window at the
//! first request at or after the previous window's end (windows are not contiguous); a request that
//! could never be admitted opens nothing.
//!
//! The sliding window counter keeps the counts of the current and the previous clock-aligned bucket
//! and weighs the previous one by how much of it still lies inside the trailing period. Its buckets
//! are always clock-aligned: a variant that starts them at a key's first hit lets an attacker who
//! probes the limit pass more than it.
//!
//! # Several quotas and costs
//!
//! Several quotas (`"5/second; 100/minute"`, at most [`Rule::MAX_QUOTAS`](crate::Rule::MAX_QUOTAS)) form one
//! [`Rule`](crate::Rule): a request is admitted only when every quota admits it, and a request that
//! one quota rejects consumes nothing from the others.
//!
//! Cost `0` is a peek (admitted, changes nothing). A cost that no wait can make admissible (above
//! `N`, or above `B` for the buckets) is answered as [`Outcome::Exceeds`](crate::Outcome::Exceeds):
//! in the layer a `429` without `Retry-After`, whose body says the cost exceeds the limit, since
//! waiting would not help.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{ManualClock, Outcome, RateLimiter, Strategy};
//!
//! let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::MovingWindow)
//!     .quotas("2/second; 3/minute").unwrap()
//!     .clock(clock.clone())
//!     .build()
//!     .unwrap();
//! let key = "203.0.113.9";
//! assert!(limiter.check_now(&key, 1).is_allowed());
//! assert!(limiter.check_now(&key, 1).is_allowed());
//! // The per-second quota rejects; the per-minute one spent nothing on this request.
//! let d = limiter.check_now(&key, 1);
//! assert_eq!(d.retry_after_secs(), Some(1));
//! clock.advance(Duration::from_secs(1));
//! assert!(limiter.check_now(&key, 1).is_allowed());
//! // Three a minute now: the reported quota is the one with the longest wait.
//! assert_eq!(limiter.check_now(&key, 1).retry_after_secs(), Some(59));
//! // A cost above every limit can never be admitted: no wait would help.
//! assert_eq!(limiter.check_now(&"other", 4).outcome(), Outcome::Exceeds);
//! ```
//!
//! # Formulas per strategy
//!
//! Every [`Decision`](crate::Decision) carries `limit`, `remaining`, `reset_after` and
//! `retry_after`; the [headers](super::headers) are written from them.
//!
//! | strategy (state) | admits cost `c` when | remaining | reset_after | retry_after(c), `c` admissible |
//! | --- | --- | --- | --- | --- |
//! | fixed window (`s` = window start, `n` = count in it) | `n + c <= N` | `N - n` (`N` when no window is open) | `s + W - t` if `n > 0`, else `0` | `s + W - t` |
//! | moving window (live entries: timestamp `> t - W`; `used` = their total cost) | `used + c <= N` | `N - used` | newest live timestamp `+ W - t` (`0` if none) | `ts_k + W - t` for the oldest live entry `k` whose expiry leaves room for `c` |
//! | sliding window counter (bucket start `b`, `e = t - b`, `wc = cur + floor(prev * (W - e) / W)`) | `wc + c <= N` | `N - wc` | until the weighted count reaches `0` if no request comes (`< 2W`) | the earliest `e` at which the weighted count leaves room for `c`, in the next bucket if needed |
//! | token bucket = GCRA (theoretical arrival time `TAT`); the leaky-bucket meter uses the same arithmetic | `max(TAT, t) + c*T - t <= B*T` | `clamp(floor((B*T - max(TAT - t, 0)) / T), 0, B)` | `max(0, TAT - t)` | `max(0, TAT + (c - B)*T - t)` |
//!
//! An admitted request moves the state: the fixed window adds `c` to `n`, the moving window logs `c`
//! units at `t`, the sliding window counter adds `c` to `cur`, GCRA sets `TAT = max(TAT, t) + c*T`.
//! How a reservation is later charged its actual cost: [settlement](super::settlement).
//!
//! # Bounds
//!
//! What each strategy guarantees over admitted units, on a clock that does not go back (the test
//! suite checks each one against brute-force oracles):
//!
//! - moving window: at most `N` in *every* trailing period of length `W`;
//! - fixed window (both alignments): at most `N` per window, hence at most `2N` in a trailing period
//!   that straddles a window edge;
//! - sliding window counter: at most `2N` in a trailing period (an adversary can time two bursts);
//!   on random traffic it stays within a few percent of the exact count (about 2 % on the test
//!   suite's traffic);
//! - token and leaky bucket: at most `B + floor(L / T)` in any interval of length `L`.
//!
//! How long a key's state matters after its last request (the *horizon*: expiry in the memory store,
//! TTLs on Redis): `W` for the fixed and moving windows, `2W` for the sliding window counter, `B*T`
//! for the buckets. After that the key is as new, and forgetting it changes no decision.
//!
//! Limits on the configuration, each a typed error, never a panic:
//!
//! - a period is non-zero and at most [`Quota::MAX_PERIOD`](crate::Quota::MAX_PERIOD) (3660 days);
//! - at most [`Rule::MAX_QUOTAS`](crate::Rule::MAX_QUOTAS) quotas in one rule;
//! - the moving window's `N` is at most [`Rule::MAX_MOVING_WINDOW_LIMIT`](crate::Rule::MAX_MOVING_WINDOW_LIMIT)
//!   (2^20; its log is one entry per unit);
//! - the buckets need `T = W / N` of at least one unit of the store (1 ns in memory, 1 µs on Redis);
//!   the window strategies accept any rate.
//!
//! Limits on what a request can make the limiter do: the forwarded-header walk examines at most
//! [`ForwardedIp::MAX_ENTRIES`](crate::key::ForwardedIp::MAX_ENTRIES) entries; key values longer than
//! [`ValueKey::MAX_RAW_VALUE`](crate::key::ValueKey::MAX_RAW_VALUE) bytes are replaced by their SHA-256 digest; the
//! memory store is capped in keys ([`Builder::max_keys`](crate::Builder::max_keys)); a Redis call
//! has a timeout.
//!
//! To see the strategies side by side, run the playground or the simulator
//! ([the `server` chapter](super::server#the-playground-and-the-simulator)).
