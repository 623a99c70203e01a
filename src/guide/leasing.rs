//! Quota leasing: one Redis call per lease on a hot key (feature `redis`).
//!
//! One Redis node answers on the order of 10^5 script calls per second, and a store that asks it once
//! per decision is bound by that (and by the round trip: about 40,000 decisions per second per process on
//! the machine of BENCHMARKS.md). Redis Cluster spreads keys, not one hot key. With leasing, an instance takes a slice of a hot
//! key's quota in one atomic call and decides locally against it:
//!
//! ```rust,no_run
//! # #[cfg(feature = "redis")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::store::redis::{Leasing, RedisStore};
//! use tollgate::{RateLimiter, Strategy};
//!
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .leases(Leasing::default()) // leases of at most 5% of a limit
//!     .build()
//!     .await?;
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::SlidingWindow)
//!     .quotas("1000000/minute")?
//!     .store(store)
//!     .build()?;
//! # let _: RateLimiter<String, _> = limiter;
//! # Ok(())
//! # }
//! ```
//!
//! - **How**: the slice is charged in Redis at once, by the strategy's own Lua arithmetic (a check of
//!   cost = the slice), so the global state is exact: every admitted request and every unit held in a
//!   lease is counted. Unused units go back through the settlement arithmetic when a lease is idle for
//!   250 ms (`Leasing::idle_return`), replaced, or returned by `RedisStore::return_leases()` (call it
//!   before a graceful shutdown, also on keys with a lease call in flight); a window lease whose window
//!   ended needs no return, a dead token-bucket lease's units (still counted in the bucket) go back when
//!   it is replaced or swept. A lease dies at its life on the limiter's clock or on the process's
//!   monotonic clock, whichever comes first, so a lagging limiter clock cannot stretch it. A check
//!   admitted from a lease needs no call and no future: it is answered at once.
//! - **Sizes**: a lease aims at the key's demand on this instance over 100 ms (`horizon`), so a cold key
//!   gets 1 unit (one call per request, as without leasing) and a hot one up to `limit / 20`
//!   (`max_share`); it grows at most fourfold per lease and takes at most a quarter of the room left in
//!   Redis (`shrink`), so leases shrink as the key nears its limit. Concurrent checks of one key in one
//!   process share one lease call.
//! - **Bounds** (tested on real Redis, RELIABILITY.md): the clock-aligned fixed window and the sliding
//!   window counter never admit more than without leasing, across all instances (a lease is drawn from
//!   the current window or bucket and dies at its end). The token bucket's leases die `size x T` after
//!   they are drawn: over any span `d`, at most `B + L + d / T` (one lease `L` more than the bucket).
//!   `build()` refuses leasing for the moving window, the first-hit window and the leaky bucket with a
//!   `ConfigError::Unleasable` whose message says why.
//! - **What it costs in accuracy**: under-admission only. Units leased by other instances and not yet
//!   used are held back from this one: at most `(instances - 1) x limit / 20` at once, for at most the
//!   idle time (250 ms), or until the window ends when their instance died holding them. Near the limit,
//!   leases are a quarter of the room at most, so the last units are spread thin.
//! - **Faults**: Redis down, leases in hand keep admitting until they are spent, dead or due for
//!   renewal (`Leasing::renew_after`, 250 ms), then the failure
//!   policy applies (open, closed or local, as without leasing). A lease call that times out still
//!   becomes the lease when its reply comes (its units are not lost). Lease calls go through the same
//!   path as other calls (in-flight bound, timeout, circuit breaker; on a Cluster, a failed probe
//!   reconnects).
//! - **Reset**: a reset drops the resetting instance's lease of the key and bumps the key's reset epoch
//!   in Redis. A lease admits for at most 250 ms after it was drawn (`Leasing::renew_after`); the next
//!   check then renews it, and the renewal's reply carries the epoch: a lease drawn before a reset is
//!   dropped, neither admitted nor merged, and its return is ignored by Redis. So after a reset at `t`,
//!   each other instance admits unseen at most the units it held or had in flight at `t` (fewer than
//!   `2 x L`, `L = limit / max_share`), and none after `t + renew_after`: at most `limit + (instances
//!   - 1) x 2 x L` in the window of the reset, and the fresh count is never lowered by an old lease.
//! - **When to turn it on**: keys hotter than a Redis call per request can serve (thousands per second
//!   per key), or a Redis node near its call rate. Leave it off for small limits (a limit below 20 per
//!   window leases 1 unit: nothing gained) and where exact admission up to the last unit matters more
//!   than throughput. Settlements, peeks and resets go to Redis as without leasing; a cost above the
//!   largest lease is checked by its own call. The blocked-key cache works as without leasing: a key
//!   Redis refused a lease is answered locally for up to 1 s. `RedisStore::lease_counters()` reports
//!   lease calls, units granted, units leased, returned and expired units, and what is held now
//!   (`granted = leased + returned + expired + units_held`). `server --redis-lease`
//!   turns it on in the demo.
