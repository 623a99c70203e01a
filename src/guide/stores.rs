//! Stores and Redis in production: where the state lives, and what happens when the store is slow
//! or gone.
//!
//! A key's state belongs to its limiter's name and the key, in every store: a route layer with a
//! limiter of its own counts only the requests it sees, and a key moved to another rule of the same
//! limiter (another tier, a per-request rule, a reload, a rolling deploy) keeps its state, converted
//! strictly ([changing limits](super::changing_limits)).
//!
//! - **In memory** ([`MemoryStore`](crate::store::MemoryStore), the default): for one process, or
//!   when every instance may count on its own. Decisions are atomic per key (no lost updates under
//!   concurrency) and cost no I/O.
//! - **Redis** (`RedisStore` in `store::redis`, feature `redis`): when several instances must share
//!   one limit. Single node, Cluster or Sentinel; one Lua script call per decision, time from the
//!   Redis server (instances need not agree on the time), all keys of one logical key in one Cluster
//!   slot (hash tags), TTLs on every key. Each call has a short timeout (50 ms by default); on a store
//!   error the layer fails open by default (the request passes, without headers, and is counted and
//!   logged, warned about at most once a second), answers `503` with
//!   [`FailurePolicy::FailClosed`](crate::layer::FailurePolicy::FailClosed)
//!   ([`failure_policy`](crate::RateLimitLayer::failure_policy)), or decides locally (below).
//! - **Your own**: implement [`Store`](crate::store::Store); the strategies are shared, so the
//!   arithmetic of [strategies](super::strategies) holds for any store that applies them atomically
//!   per key.
//!
//! ```
//! use tollgate::{RateLimiter, SystemClock};
//!
//! // A memory store of at most 100 000 keys, on the precise clock.
//! let limiter = RateLimiter::builder()
//!     .quotas("10/second").unwrap()
//!     .max_keys(100_000)
//!     .clock(SystemClock::new())
//!     .build()
//!     .unwrap();
//! assert!(limiter.check_now(&42u64, 1).is_allowed());
//! ```
//!
//! # The memory store
//!
//! - [`MemoryStore`](crate::store::MemoryStore) (default): `dashmap`, no lost updates. Under a one-quota rule of the fixed window
//!   (clock-aligned or from the first hit), the sliding window counter (any limit up to `u32::MAX` per
//!   period) or the buckets a key costs its own size plus 8 bytes in the map (the state packed in one
//!   word, updated by compare-and-swap; a first-hit window whose start does not fit whole stores it
//!   rounded up, by less than 131 µs for windows up to a day and 0.54 s for a ten-year window: the window
//!   ends that much later, never sooner; a sliding window counter whose two counts do not fit whole
//!   rounds the previous window's count up, by under 1.2 x 10^-4 of the limit at `u32::MAX` per
//!   second; a window index that does not fit whole is kept on a ring of two days at least, so a
//!   custom [`Clock`](crate::Clock) stepped back more than 6 hours forgets the counts, where the
//!   crate's clocks never go back). A rule of several window quotas keeps one word per quota in the key's entry; keys
//!   known to be blocked are answered from a small front cache without touching the map (the flood case).
//!   The default clock (`SystemClock::suited_to` the rule) reads a process-wide time refreshed every
//!   millisecond when every quota has windows of a second or more and buckets at least 2 ms deep, and
//!   the precise monotonic clock otherwise: a lagging time never admits more, and the rules it is kept
//!   from are those where a millisecond step would admit less ([`SystemClock`](crate::SystemClock)); a
//!   per-request rule or a tier such a step would cut reads the precise time on the same line. Pass
//!   `.clock(SystemClock::new())` for the precise clock always. Expired keys are evicted incrementally as traffic
//!   flows (no call needed) and memory is returned, moving-window logs included as their entries expire.
//! - The memory store is bounded by default: at most 8 x 10^6 keys (`MemoryStoreBuilder::DEFAULT_MAX_KEYS`, about 430 MiB of
//!   one-quota `u64` keys at 56 B each), more than a single service holds by accident and a ceiling an attacker's key
//!   flood cannot pass. Change it with `.max_keys(n)` on the limiter's builder (or
//!   `MemoryStore::builder().max_keys(n)`); `.max_keys(usize::MAX)` lifts it. At the cap a new key makes
//!   room by evicting the keys nearest a new key's state (fresh ones, then the least spent); a blocked key
//!   is never evicted; and what an evicted key had spent is kept in a bounded table of records (16
//!   bytes a slot, four slots per capped key, 256 KiB to 64 MiB, allocated at the first such eviction), so a flood of new
//!   keys never gives a key back quota it spent less of than the flood's keys. A returning key is
//!   charged only its own record, so a flood cannot lock new keys out (below). When every held key
//!   is blocked, new keys share one overflow quota and a warning is logged.
//! - With millions of keys a check waits on memory: each lookup touches pages spread over the whole table,
//!   and with 4 KiB pages most miss the CPU's address cache. On glibc 2.35 or later,
//!   `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` in the service's environment lets the allocator use
//!   transparent huge pages: at 10^6 keys a check took 298 ns instead of 346 ns on the machine of
//!   BENCHMARKS.md (governor: 306 instead of 367 ns).
//! - When most keys expire at once (a long idle gap, the end of a flood), the sweep frees most of
//!   the store's tables within seconds, and glibc hands the freed memory back to the system (a
//!   heap trim: `brk` or `madvise`) inside whichever decision's free sets it off. On the machine of
//!   BENCHMARKS.md, at 8 x 10^6 keys, the slowest of 10^4 decisions after an idle gap took
//!   4.6-9.3 ms. A service that would rather keep its peak heap sets
//!   `GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967295` in its environment: the slowest then
//!   took 0.17-0.55 ms.
//!
//! # What the key cap forgets, and its bounds
//!
//! At the cap a new key makes room by dropping keys whose state equals a new key's, then the keys
//! with room *nearest a new key's state*: the least spent share of the reported quota first, and
//! among equals those not used since the last look (a second-chance bit). Recency alone would let a
//! flood of new keys evict, and so reset, a client that had spent 9 of its 10. A blocked key is never
//! evicted.
//!
//! An evicted key that still had spent quota is recorded before it is dropped: per quota,
//! `(units spent, time its state would be fresh, spent share)` goes into one bucket of 8 slots chosen
//! by a hash of the key, its rule and the quota index; the slot keeps 32 more bits of that hash (a
//! fingerprint). A key inserted later reads only the live slot with its own fingerprint and is
//! restored at least as spent (per strategy: a window's count, a sliding counter's current or
//! previous bucket, a moving window's entries at the latest time they could have, a bucket's `TAT`);
//! a key with no record starts as new. A later record of the same key replaces its earlier one.
//!
//! - **Over-count: a constant, never a ratchet.** A key is charged another key's record only on a
//!   fingerprint collision within its bucket: at most 8 in 2^32 (under 2 x 10^-9) per lookup, and
//!   then by one record, less than the limit (blocked keys are never evicted). A restored state
//!   holds only the key's own spend, so what it writes back at its next eviction is its own spend:
//!   the over-count does not grow with the number of evict-and-return generations or the flood's
//!   size. After floods of 20 to 60 times the cap of one-request keys, at caps of 2000 and 100,000,
//!   every new key is admitted and a client that had spent 3 of 10 keeps 7.
//! - **Under-count: only to keys at least as spent.** While held, a record is never less than what
//!   the key spent in its horizon. A full bucket gives up its least-spent-share record, and only to
//!   a strictly more spent one (ties keep the record held first): a key comes back as new only when
//!   8 other live records, each of a share at least as spent, held its bucket within its horizon.
//!   With one-request keys flooding 10 times a cap of 200 (about 1800 records in 2048 buckets of
//!   8), a 9th equally spent record lands in some bucket in about 1 flood in 1700, and that one
//!   key comes back as new. A flood of
//!   keys that each spend less of their quota than a key never gives it anything back. No bounded
//!   memory can both charge every flooded key strictly and keep new keys' over-count constant once
//!   a flood holds more keys than it can tell apart; this design keeps the constant bound. Set the
//!   cap well above the legitimate key count, so that eviction is rare.
//! - **Memory bound.** 4 slots of 16 bytes per capped key, rounded up to a power of two between
//!   2^14 and 2^22 slots: 256 KiB (the minimum, up to a cap of 4096) to 64 MiB (`MemoryStoreBuilder::MAX_SKETCH_BYTES`,
//!   reached at a cap of 2^20 and kept above it, the default cap included).
//! - A peek (or a refund) of an evicted key answers from its record, as its next check would, so a
//!   rules-file reload converts what it spent; a reset forgets its record, held or not. A key held under a rule the store has not seen a key inserted with (a
//!   tier change on an existing key) is recorded as fully spent until its state would be fresh
//!   (over-count, never less); so are keys of rules beyond the 4096 distinct rules remembered.
//! - After a clock step back, a key that the blocked-key cache holds is answered as blocked at that
//!   earlier time (its rejection is true for that time), where the map alone may admit. Never an
//!   extra admission.
//!
//! # Redis in production: overload, outages, TLS, Sentinel
//!
//! - **Overload is not an outage.** The store keeps at most 256 calls in flight
//!   (`RedisStoreBuilder::max_in_flight`); a check waits for a slot only until its timeout (50 ms by
//!   default), never longer. A check that gets no slot or no reply in time while Redis is answering other
//!   calls (any reply within the last 2 s, connection intact) is **shed**: rejected locally (`429`,
//!   `Retry-After: 1`), never admitted and never a 5xx, in every failure policy. A shed check whose reply
//!   comes late and admitted is refunded at its own time. Bound: a key is never admitted past its limit by
//!   overload, on one instance or many, for one hot key or many keys (each key is still decided by Redis or
//!   rejected). A hung Redis is shed for its first 2 s, then handled as an outage. A caller whose own
//!   timer fired a whole timeout late (a process starved by the flood, its reply reader with it) sheds
//!   too, rather than failing open. A sent call keeps its slot until its reply comes (at most the
//!   timeout + 1 s), so at most 256 stale calls queue in front of a stalled server; the refund of a
//!   late admission waits up to the timeout + 1 s more (no caller waits for it).
//!   `RedisStore::counters()` reports shed, timed-out, late and refunded calls.
//! - **One key's flood costs that key, not the others (lanes).** Each key (under its rule) has a
//!   lane on each store. Two checks of a key may always be in flight to Redis; more go only while a
//!   quarter of the store's calls in flight (64 of 256) stays free for other keys, and only within a
//!   64th of the quota Redis last reported left for the key (none once Redis has rejected it). So a
//!   hot key under its limit may use up to three quarters of the store (190 of 256 calls) when it is
//!   alone; when other keys need slots each flooding key falls back to two calls within a round trip,
//!   and floods together always leave other keys a quarter of the store. Further checks of a key wait
//!   in its lane in arrival order: once Redis has rejected the key they are answered from the
//!   blocked-key cache; otherwise they are shed at the timeout and Redis never counts them. So under a
//!   flood a key is admitted to at least 95 % of its limit and at most the limit + 2 %, and other keys
//!   keep being decided by Redis (20 clients at 5 requests a second next to a 2000-connection flood:
//!   1000 of 1000 admitted, one and two instances). A key with nothing waiting and at most two calls
//!   in flight waits up to 500 ms past the timeout for its reply while Redis answers. A lane's check
//!   waiting while Redis is silent for 2 s is an outage, not a shed.
//! - **Shedding is visible**: `tollgate_requests_total{outcome="shed"}`, `Decision::was_shed`, and a
//!   warning at most once a second with the count by reason: `own_key` (a key's own flood: nothing to
//!   do), `no_room` (256 calls in flight: Redis or the network is saturated), `no_reply_in_time`
//!   (Redis or this process is slower than the timeout). **Raise the store timeout**
//!   (`RedisStoreBuilder::timeout`, `server --store-timeout`) when `no_reply_in_time` keeps growing
//!   while Redis is healthy (`redis-cli --latency` low): the process is starved of CPU or the network
//!   is slow, and keys under their limit are being shed. Under a 2000-connection flood on one key on a
//!   loaded 2-core machine at the default 50 ms, `no_reply_in_time` was 453 against 28,305 `own_key`
//!   and no well-behaved client was refused: the default was enough. `RedisCounters::key_in_flight_peak`
//!   shows the most calls one key has had in flight.
//! - **A host name that does not resolve** is logged at error level at start-up and every 10 s while it
//!   lasts (the store keeps trying, as for a Redis still booting); alert on `tollgate_store_up == 0`,
//!   which is also 0 while the circuit breaker is open.
//! - **Blocked-key cache on by default** (10,000 keys): a key Redis rejected is answered locally until its
//!   wait is over, but at most 1 s (`block_cache_staleness`), so a reset or refund through another instance
//!   is seen within 1 s; under a flood on one key Redis sees about one call per second per instance.
//! - **Outages** (connection refused or lost, no reply for 2 s, error replies such as `OOM`) go to the
//!   failure policy: **open** (the layer's default: let the request through, counted in
//!   `Stats::fail_open`), **closed** (`503`), or **local** (`RedisStoreBuilder::local_fallback(instances)`:
//!   an in-memory limiter of the same rule with each limit divided by `instances`; keys Redis reported
//!   blocked stay blocked for the wait it reported; local decisions carry their headers and are counted in
//!   `counters().local_allowed/local_rejected`). The library default stays fail-open, because a rate limiter
//!   that takes the service down with its store is usually the worse failure; choose local when the limit
//!   protects something (logins, paid APIs), closed when nothing may pass unchecked. Bound in local mode:
//!   at most the limit per key per outage across `instances` instances (plus what Redis had admitted).
//! - **Circuit breaker**, for every policy: after 5 consecutive outage failures the store stops calling
//!   Redis and answers by the policy at once (no timeout per request); every 500 ms one call probes Redis,
//!   and its reply closes the circuit (`circuit_breaker(failures, cool_down)`).
//! - **Start-up**: an unreachable Redis does not fail `build()`: the store serves by its policy and connects
//!   in the background (an attempt every 250 ms, each at most 750 ms), limiting from the first call after
//!   Redis accepts connections. Redis answering and refusing (a wrong password, an unknown TLS CA) fails
//!   at start with the server's own words (`WRONGPASS invalid username-password pair ...`), never the
//!   password.
//! - **TLS** (rustls, no OpenSSL): `rediss://host:port`, `rediss+cluster://H1:P1,H2:P2` and
//!   `rediss+sentinel://...` (TLS to the sentinels and to the primary), with the web roots by default, or `tls_ca_file(PEM)` for a private CA and `tls_client_cert(cert, key)` for servers
//!   that require client certificates. TLS options with a plain URL are an error.
//! - **Sentinel**: `redis+sentinel://[user:pass@]H1:P1[,H2:P2]/SERVICE[/DB]` and `rediss+sentinel://...`.
//!   The store asks the sentinels for the primary, again whenever the connection fails or a demoted
//!   primary answers `READONLY`, and every 250 ms (a demoted primary that stays up keeps accepting writes
//!   until the sentinels reconfigure it, up to 10 s later). Bound across a failover: Redis replication is
//!   asynchronous, so the counts the old primary had not yet replicated are lost, and so are the checks a
//!   live old primary took after the promotion, before the store switched (at most 250 ms of them); each
//!   key may admit that many again (at most its limit). Decisions made during the switch (seconds: the
//!   sentinels' `down-after-milliseconds` plus the election) follow the policy. Redis's
//!   `min-replicas-to-write` / `min-replicas-max-lag` turn a lagging or isolated primary's writes into
//!   errors (the policy) instead of lost counts.
//! - **Cluster failover**: the store follows `MOVED` after a failover and, if the `redis` crate's Cluster
//!   connection stays stuck after one, builds a new one when a probe of the open circuit fails. The
//!   circuit breaker is per store: while a master is down (the node timeout plus the replica's election)
//!   it can open, and then every key follows the failure policy, not only the keys of that master's
//!   slots.
//!
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::store::redis::RedisStore;
//! use tollgate::{RateLimiter, Strategy};
//!
//! // Three instances share a login limit; during an outage each decides locally with a third of it.
//! let store = RedisStore::builder("rediss+sentinel://:secret@10.0.0.5:26379,10.0.0.6:26379/main")
//!     .tls_ca_file("/etc/ssl/private-ca.pem")
//!     .timeout(Duration::from_millis(20))
//!     .circuit_breaker(5, Duration::from_millis(500))
//!     .local_fallback(3)
//!     .build()
//!     .await?;
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::MovingWindow)
//!     .quotas("5/15m")?
//!     .store(store)
//!     .build()?;
//! # let _: RateLimiter<String, _> = limiter;
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! Two kinds, never mixed: what can be fixed only by changing the configuration, found when
//! something is built, and what a store fails to do per call.
//!
//! - [`ConfigError`](crate::ConfigError) at build time: a quota, rule, name or queue that cannot
//!   work, and for the Redis store a URL, key prefix or TLS option or file that cannot
//!   ([`ConfigError::RedisUrl`](crate::ConfigError::RedisUrl) with its
//!   [`UrlProblem`](crate::UrlProblem): a scheme, Sentinel or Cluster URL that cannot work, a CA
//!   bundle or client certificate with a plain URL, or the `redis` crate's refusal, its error the
//!   `source`; [`RedisPrefix`](crate::ConfigError::RedisPrefix): a brace or more than 64 bytes;
//!   [`TlsFile`](crate::ConfigError::TlsFile): a TLS file missing, unreadable or not PEM), found
//!   before any connection, and a limiter whose strategy quota leasing cannot bound
//!   ([`Unleasable`](crate::ConfigError::Unleasable)). Its message says what to fix (a URL's
//!   password masked). A custom store's refusal is
//!   [`ConfigError::Store`](crate::ConfigError::Store) with the store's own error. A rules file's
//!   mistakes are `RulesError`s with their line and column
//!   ([rules](super::rules)).
//! - [`StoreError`](crate::StoreError) per call (and when a store that answered refuses to connect):
//!   its [`kind`](crate::StoreError::kind) drives the failure policy; its message, what logs print,
//!   is complete; [`source`](std::error::Error::source) is the cause (on Redis, the
//!   `redis::RedisError`, for `downcast_ref`).
//! - [`BuildError`](crate::BuildError), from building a store that connects
//!   (`RedisStoreBuilder::build`, `RedisStore::connect`), is one or the other:
//!   `BuildError::Config` for a mistake in the settings, `BuildError::Store` when Redis answered and
//!   refused.
//!
//! ```
//! use tollgate::{BuildError, ConfigError};
//! # #[cfg(feature = "redis")]
//! # async fn demo() {
//! use tollgate::store::redis::RedisStore;
//!
//! match RedisStore::builder("redis://127.0.0.1:6379").prefix("api{v2}:").build().await {
//!     Err(BuildError::Config(ConfigError::RedisPrefix(p))) => eprintln!("fix the prefix {p:?}"),
//!     Err(BuildError::Config(e)) => eprintln!("fix the settings: {e}"),
//!     Err(e) => eprintln!("Redis refused: {e}"),
//!     Ok(_store) => {}
//! }
//! # }
//! # let _ = std::marker::PhantomData::<(BuildError, ConfigError)>;
//! ```
