//! The user's guide: which strategy to pick, what every header means (with the formulas), the bounds
//! each strategy keeps, how keys are found and whom to trust, and which store to use.
//!
//! This module holds documentation only.
//!
//! # Contents
//!
//! 1. [Choosing a strategy](#choosing-a-strategy)
//! 2. [Headers](#headers)
//! 3. [Formulas per strategy](#formulas-per-strategy)
//! 4. [Bounds](#bounds)
//! 5. [Keys and trust](#keys-and-trust)
//! 6. [Choosing a store](#choosing-a-store)
//! 7. [Errors](#errors)
//! 8. [The `server` example's flags](#the-server-examples-flags)
//!
//! Notation used throughout: a quota admits `N` units per period `W` (`"100/minute"`: `N = 100`,
//! `W = 60 s`); a request costs `c` units (1 unless the layer's
//! [`cost`](crate::RateLimitLayer::cost) says otherwise); `t` is now. The bucket strategies also have
//! a burst `B` (the quota's limit unless [`Quota::with_burst`](crate::Quota::with_burst) or the
//! builder's [`burst`](crate::Builder::burst) sets it) and an emission interval `T = ceil(W / N)`,
//! rounded *up* in the store's unit (nanoseconds in memory, microseconds on Redis) so that rounding
//! never admits more than the quota.
//!
//! # Choosing a strategy
//!
//! | [`Strategy`](crate::Strategy) (`--strategy`) | state per key | exact? | worst case in one trailing period | pick it when |
//! | --- | --- | --- | --- | --- |
//! | [`FixedWindow`](crate::Strategy::FixedWindow) (`fixed-window`) | window start + count | per window | `2N`, across a window edge | you want the cheapest limiter and resets that line up with the clock ("5000/hour, resets on the hour") |
//! | [`FixedWindowFirstHit`](crate::Strategy::FixedWindowFirstHit) (`fixed-window-first-hit`) | window start + count | per window | `2N` | the window should start with the user's first action ("10 tries, then wait a minute") |
//! | [`MovingWindow`](crate::Strategy::MovingWindow) (`moving-window`, sliding log) | one timestamp per admitted unit, at most `N` | yes | `N` | the limit must hold in *every* trailing period (login throttling, costly operations); memory is `O(N)` per key, so keep `N` modest |
//! | [`SlidingWindow`](crate::Strategy::SlidingWindow) (`sliding-window`, the default) | two counters | approximate | `2N` for an adversary who times two bursts; within a few percent of exact on ordinary traffic | a good default: smooth, cheap, no edge bursts on ordinary traffic |
//! | [`TokenBucket`](crate::Strategy::TokenBucket) (`token-bucket`, GCRA) | one timestamp | yes, to its definition | `B + floor(L / T)` in any interval `L` (up to `2N - 1` in one period when `B = N`) | bursts up to `B`, then a steady rate: APIs and their clients |
//! | [`LeakyBucket`](crate::Strategy::LeakyBucket) (`leaky-bucket`, as a meter) | one timestamp | yes | as the token bucket | a queue of capacity `B` drained at a constant rate; with [`PaceLayer`](crate::layer::PaceLayer) it smooths outgoing traffic to the rate |
//!
//! The fixed windows come in two alignments. [`FixedWindow`](crate::Strategy::FixedWindow) windows
//! are whole multiples of the period in Unix time: a `1/hour` window resets at the top of every UTC
//! hour, and every instance and Redis agree on it. [`FixedWindowFirstHit`](crate::Strategy::FixedWindowFirstHit)
//! opens a window at the first request at or after the previous window's end (windows are not
//! contiguous); a request that could never be admitted opens nothing.
//!
//! The sliding window counter keeps the counts of the current and the previous clock-aligned bucket
//! and weighs the previous one by how much of it still lies inside the trailing period. Its buckets
//! are always clock-aligned: a variant that starts them at a key's first hit lets an attacker who
//! probes the limit pass more than it.
//!
//! Several quotas (`"5/second; 100/minute"`, at most [`MAX_QUOTAS`](crate::MAX_QUOTAS)) form one
//! [`Rule`](crate::Rule): a request is admitted only when every quota admits it, and a request that
//! one quota rejects consumes nothing from the others.
//!
//! Costs: cost `0` is a peek (admitted, changes nothing). A cost that no wait can make admissible
//! (above `N`, or above `B` for the buckets) is answered as [`Outcome::Exceeds`](crate::Outcome::Exceeds):
//! in the layer a `429` without `Retry-After`, whose body says the cost exceeds the limit.
//!
//! # Headers
//!
//! Every [`Decision`](crate::Decision) carries the values of the headers; the layer writes them on
//! allowed responses and on `429`s. Values are taken *after* an admitted request is counted; a
//! rejection leaves the state unchanged.
//!
//! | header | value |
//! | --- | --- |
//! | `x-ratelimit-limit` | the largest value `remaining` can take: `N` for the window strategies, `B` for the buckets ([`Decision::limit`](crate::Decision::limit)) |
//! | `x-ratelimit-remaining` | what is left after this request, clamped to `[0, limit]` ([`Decision::remaining`](crate::Decision::remaining)) |
//! | `x-ratelimit-reset` | `ceil(reset_after)` in seconds: how long until `remaining` is back at `limit` if no request comes; `0` only when it already is. Unix seconds instead with [`ResetFormat::Unix`](crate::layer::ResetFormat::Unix) (from the store's clock: the Redis server's for Redis) |
//! | `Retry-After` (`429` only) | `max(1, ceil(retry_after))` seconds: when a request of the same cost will be admitted ([`Decision::retry_after_secs`](crate::Decision::retry_after_secs)) |
//!
//! The IETF draft's structured `RateLimit` and `RateLimit-Policy` fields are available instead of or
//! beside these with [`HeaderStyle`](crate::layer::HeaderStyle) (draft-ietf-httpapi-ratelimit-headers-11):
//! `RateLimit-Policy` has one item per quota, `q=N;w=W` for the windows and `q=B;w=ceil(B x T)` for
//! the buckets (a bucket admits `B` at once, then one per `T`); `RateLimit` one item per limiter,
//! `r` the remaining and `t` the reset, or on a `429` the `Retry-After` value. Item names are
//! unique per response: under stacked limiters that share a name, a limiter whose item names an
//! inner one already used takes the first free suffix (`api`, then `api-2`). The layer adds the
//! partition key `pk` (a keyed hash of the key, [`partition_key`](crate::layer::RateLimitLayer::partition_key)),
//! the quota unit `qu` ([`quota_unit`](crate::layer::RateLimitLayer::quota_unit)) and jitter on `t`
//! ([`jitter`](crate::layer::RateLimitLayer::jitter)) on request, and
//! [`ProblemJson`](crate::layer::ProblemJson) answers a `429` with the draft's `quota-exceeded` problem
//! type.
//!
//! Clock-aligned windows (fixed window, sliding window counter) follow UTC unless the rule has a
//! [`WindowOffset`](crate::WindowOffset): then every edge, and the headers, are at the offset zone's
//! times. A shaping queue instead of rejections:
//! [`RateLimitLayer::queue`](crate::layer::RateLimitLayer::queue).
//!
//! With several quotas one quota is *reported*, and `limit`, `remaining` and `reset` all come from
//! it: on a `429` the rejecting quota with the longest `retry_after` (so `Retry-After` is the real
//! wait); on a `200` the quota with the fewest remaining (ties: the later reset).
//! [`Decision::quota_index`](crate::Decision::quota_index) names it.
//!
//! A request let through because the store failed (fail-open) carries no rate-limit headers: nothing
//! true could be said about it. It is counted in [`Stats`](crate::Stats).
//!
//! # Formulas per strategy
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
//! Settlement ([`RateLimiter::settle`](crate::RateLimiter::settle) with the check's
//! [`Reservation`](crate::Decision::reservation), the layer's [`Settle`](crate::layer::Settle)
//! marker on a response, or a source of [`settle_from`](crate::layer::RateLimitLayer::settle_from):
//! a response header, a [`UsedUnits`](crate::layer::UsedUnits) extension, a trailer or a count over
//! the body) charges the actual cost `a` of a check that reserved `c`, where it was
//! counted: GCRA moves `TAT` by `(a - c)*T`, never below `t`; the windows adjust the window or
//! bucket of the check, or do nothing once it has ended; the moving window adds or removes entries
//! at the check's own timestamp, never another request's (a charge beyond a full log is dropped).
//! Debt is capped at one horizon. Settling never frees room in a later window.
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
//!   on random traffic it stays within a few percent of the exact count;
//! - token and leaky bucket: at most `B + floor(L / T)` in any interval of length `L`.
//!
//! How long a key's state matters after its last request (the *horizon*: expiry in the memory store,
//! TTLs on Redis): `W` for the fixed and moving windows, `2W` for the sliding window counter, `B*T`
//! for the buckets. After that the key is as new, and forgetting it changes no decision.
//!
//! Limits on the configuration, each a typed error, never a panic:
//!
//! - a period is non-zero and at most [`MAX_PERIOD`](crate::MAX_PERIOD) (3660 days);
//! - at most [`MAX_QUOTAS`](crate::MAX_QUOTAS) quotas in one rule;
//! - the moving window's `N` is at most [`MAX_MOVING_WINDOW_LIMIT`](crate::MAX_MOVING_WINDOW_LIMIT)
//!   (its log is one entry per unit);
//! - the buckets need `T = W / N` of at least one unit of the store (1 ns in memory, 1 µs on Redis);
//!   the window strategies accept any rate.
//!
//! Limits on what a request can make the limiter do: the forwarded-header walk examines at most
//! [`MAX_FORWARDED_ENTRIES`](crate::key::MAX_FORWARDED_ENTRIES) entries; key values longer than
//! [`MAX_RAW_VALUE`](crate::key::MAX_RAW_VALUE) bytes are replaced by their SHA-256 digest; the
//! memory store can be capped in keys ([`Builder::max_keys`](crate::Builder::max_keys)); a Redis call
//! has a timeout.
//!
//! # Keys and trust
//!
//! The key decides whose quota a request spends, so whoever controls the key controls the limit.
//!
//! - The default key, [`PeerIp`](crate::key::PeerIp), is the peer address of the connection, never a
//!   header. axum users serve with `into_make_service_with_connect_info::<SocketAddr>()`; plain hyper
//!   users insert a [`PeerAddr`](crate::key::PeerAddr) into each request's extensions.
//! - Forwarded headers are read only by [`ForwardedIp`](crate::key::ForwardedIp), which is given the
//!   trusted proxy ranges and exactly one source header ([`ForwardedHeader`](crate::key::ForwardedHeader)):
//!   `X-Forwarded-For` by default (all its lines, in order), `Forwarded` (RFC 7239) or `X-Real-IP`.
//!   It ignores the header when the peer itself is not a trusted proxy; otherwise it walks the entries
//!   from the right and takes the right-most address outside the trusted ranges, so addresses a
//!   client writes to the left of what your proxies appended change nothing. It stops at an entry that
//!   is not an address and examines at most [`MAX_FORWARDED_ENTRIES`](crate::key::MAX_FORWARDED_ENTRIES)
//!   entries. It never takes "the first header that parses".
//! - IPv6 clients are keyed by their `/56` ([`DEFAULT_IPV6_PREFIX`](crate::key::DEFAULT_IPV6_PREFIX),
//!   configurable): one subscriber usually holds at least a `/64`, often a `/56`. IPv4-mapped IPv6
//!   addresses are keyed as the IPv4 address.
//! - A key taken from a header a client chooses freely (an API key on an unauthenticated route) gives
//!   an attacker a new bucket per request: put the layer after authentication and key by the
//!   authenticated identity ([`ExtensionKey`](crate::key::ExtensionKey)), or combine the value with the
//!   IP (a tuple of extractors is a composite key).
//! - Long values are hashed with SHA-256 (domain-separated), not a fast hash: nobody can craft a value
//!   that lands in a victim's bucket.
//! - A request without a usable key gets `400` by default, or a shared fallback key
//!   ([`fallback_key`](crate::RateLimitLayer::fallback_key)): never a panic and never a silent pass.
//!
//! ```
//! use tollgate::key::{ForwardedHeader, ForwardedIp};
//!
//! // Behind proxies in 10.0.0.0/8 that append to `Forwarded`:
//! let key = ForwardedIp::new(["10.0.0.0/8"]).unwrap().header(ForwardedHeader::Forwarded);
//! # let _ = key;
//! // A range that does not parse is an error, not a panic:
//! assert!(ForwardedIp::new(["10.0.0.0/33"]).is_err());
//! ```
//!
//! # Choosing a store
//!
//! A key's state belongs to the rule it is used with, in every store: a route layer with its own
//! rule counts only the requests it sees, and a key moved to another rule starts afresh there while
//! its old state expires by itself.
//!
//! - **In memory** ([`MemoryStore`](crate::store::MemoryStore), the default): for one process, or
//!   when every instance may count on its own. Decisions are atomic per key (no lost updates under
//!   concurrency) and cost no I/O. Under a one-quota rule of the fixed window, the sliding window
//!   counter or the buckets a key costs its own size plus a few bytes. Expired keys are evicted
//!   incrementally as traffic flows, and their memory is returned. An optional cap on the number of
//!   keys ([`Builder::max_keys`](crate::Builder::max_keys)) bounds memory under a flood of new keys;
//!   the cap never evicts a blocked key, so a flood cannot reset an attacker's quota. The clock a
//!   limiter gets by default ([`SystemClock::suited_to`](crate::SystemClock::suited_to) its rule)
//!   reads a process-wide time refreshed every millisecond when every quota has windows of a second
//!   or more and buckets at least 2 ms deep: a read costs a load instead of a monotonic clock call,
//!   and a time that lags never admits more (see [`SystemClock`](crate::SystemClock)).
//! - **Redis** (`RedisStore` in [`store::redis`](crate::store), feature `redis`): when several
//!   instances must share one limit. Single node or Cluster; one script call per decision, time from
//!   the Redis server (instances need not agree on the time), all keys of one logical key in one
//!   Cluster slot, TTLs on every key. Each call has a short timeout (50 ms by default); on a store
//!   error the layer fails open by default (the request passes, without headers, and is counted and
//!   logged) or answers `503` with [`fail_closed`](crate::RateLimitLayer::fail_closed).
//! - **Your own**: implement [`Store`](crate::store::Store); the strategies are shared, so the
//!   arithmetic above holds for any store that applies them atomically per key.
//!
//! # Errors
//!
//! Two kinds, never mixed: what can be fixed only by changing the configuration, found when
//! something is built, and what a store fails to do per call.
//!
//! - [`ConfigError`](crate::ConfigError) at build time: a quota, rule, name or queue that cannot
//!   work, and for the Redis store a URL, key prefix or TLS option or file that cannot
//!   ([`ConfigError::RedisUrl`](crate::ConfigError::RedisUrl),
//!   [`RedisPrefix`](crate::ConfigError::RedisPrefix),
//!   [`TlsNeedsTlsUrl`](crate::ConfigError::TlsNeedsTlsUrl),
//!   [`TlsFile`](crate::ConfigError::TlsFile)), found before any connection. Its message says what
//!   to fix (a URL's password masked). A rules file's mistakes are
//!   [`RulesError`](crate::rules::RulesError)s with their line and column.
//! - [`StoreError`](crate::StoreError) per call (and when a store that answered refuses to connect):
//!   its [`kind`](crate::StoreError::kind) drives the failure policy; its message is complete for
//!   logs; [`source`](std::error::Error::source) is the cause (on Redis, the `redis::RedisError`,
//!   for `downcast_ref`).
//! - [`BuildError`](crate::BuildError), from building a store that connects, is one or the other.
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
//!
//! # The `server` example's flags
//!
//! `cargo run --example server -- FLAGS` (the `--store redis...` forms need `--features redis`).
//! A flag that has no effect in the chosen combination prints one warning on stderr; one that
//! cannot apply exits 2 saying why. With `--rules FILE` (a rules file, see [`crate::rules`] and
//! `examples/rules.toml`, whose every field is annotated there), the per-limit flags exit 2 and
//! the process-wide ones apply to every limit of the file; the last column says how.
//!
//! | Flag | Default | Effect (memory store unless said) | With `--rules` |
//! | --- | --- | --- | --- |
//! | `--addr HOST:PORT` | `127.0.0.1:3000` | listen address; a host name is resolved and the first address that binds is used; port 0 picks a free port | process-wide |
//! | `--strategy NAME` | `sliding-window` | `fixed-window`, `fixed-window-first-hit`, `moving-window`, `sliding-window`, `token-bucket`, `leaky-bucket` | exit 2: set `strategy` in the file |
//! | `--quota Q` | `10/minute` | quotas, repeatable or `;`-separated (`"5/second; 100/minute"`); all must admit | exit 2: set `quotas` in the file |
//! | `--burst B` | the quota's limit | capacity of `token-bucket` and `leaky-bucket`; with a window strategy it warns and is ignored | exit 2: set `burst` in the file |
//! | `--key ip\|header:NAME\|global` | `ip` | what identifies a client | exit 2: set `key` in the file |
//! | `--on-missing-key reject\|global` | `reject` | a request without a key: 400, or the one shared global bucket; warns with `--key global` | the default of each limit's `on_missing_key` |
//! | `--trust-proxy CIDR` | none | repeatable; the `ip` key reads the forwarded header of peers in these ranges; warns with another key | the `ip` key part of every limit |
//! | `--forwarded-header xff\|forwarded\|x-real-ip` | `xff` | the header trusted proxies set; warns without `--trust-proxy` | the `ip` key part of every limit |
//! | `--store memory\|URL` | `memory` | `redis://H:P[/DB]`, `rediss://...`, `redis+cluster://H1:P1,H2:P2`, `rediss+cluster://...` (needs `--features redis`); `redis+sentinel://[user:pass@]H1:P1[,H2:P2]/SERVICE[/DB]` and `rediss+sentinel://...`; an unreachable Redis is not a start-up error (the server answers by `--fail-mode` and connects in the background) | every limit on that store: in memory one store per limit (with `--max-keys`), on Redis clones of one store, every URL form |
//! | `--fail-mode open\|closed\|local` | `open` | on a store failure: pass, 503, or a local limiter of the same rule (its limit divided by `--instances`); overload is never a failure (shed as 429); warns with the memory store, which never fails | every limit; `local` gives each limit the Redis store's local limiter (its limit divided by `--instances`) |
//! | `--fail-closed` | off | alias of `--fail-mode closed`; with a contradicting `--fail-mode`, exit 2 | every limit |
//! | `--reset-format delta\|unix` | `delta` | `x-ratelimit-reset` as seconds from now or Unix time | every limit |
//! | `--max-keys N` | 8 x 10^6 (the store's default) | cap on the keys the memory store holds; warns with Redis | each limit's memory store; warns with Redis |
//! | `--store-timeout MS` | 50 | how long a Redis decision may take; warns with the memory store | the Redis store of every limit; warns with the memory store |
//! | `--redis-ca FILE` | none | PEM CA bundle for `rediss://`; exit 2 with a non-TLS store | the Redis store of every limit; exit 2 with a non-TLS store |
//! | `--redis-cert FILE`, `--redis-key FILE` | none | client certificate and key for `rediss://` (both or neither); exit 2 with a non-TLS store | the Redis store of every limit; exit 2 with a non-TLS store |
//! | `--instances N` | 1 | `--fail-mode local` divides the limit by N; warns without it | as without `--rules`: the local limiter of every limit |
//! | `--redis-lease [on\|off]` | `off` | quota leasing on the Redis store (bare flag = `on`) with the library's default lease sizes; a strategy leasing cannot bound (moving window, first-hit window, leaky bucket) exits 2 saying why; warns with the memory store | leasing on the store of every limit; a limit whose strategy leasing cannot bound exits 2 naming the limit (a reload adding one is refused, the old rules kept) |
//! | `--rules FILE` | none | limits from a TOML rules file (see `examples/rules.toml`), every path and method answered `ok`; a file that cannot be used exits 2 with `line L, column C` | — |
//! | `--reload-interval MS` | 1000 | how often the rules file is polled; 0 disables, below 50 exits 2; warns without `--rules` | the file is polled at this interval, compiled off the request path and swapped in |
//! | `--settle-header NAME` | none | the handler answers with header NAME set verbatim to the query parameter `used` (default: the estimate) and the limiter settles to it; a missing, negative, non-numeric or too large value leaves the estimate (warned once) | the handler sets header NAME to `used` on every path (no estimate: without `used` no header); the limits with `settle = "header:NAME"` settle to it, the others keep their estimate |
//! | `--cost N` | 1 | units each request costs (0 = a peek that never spends); the estimate with `--settle-header` (at least 1 there) | exit 2: set `cost` in the file |
//! | `--concurrency N` | none | cap on requests in flight per key (429 at once above it, `Retry-After: 1`); on Redis shared by the instances (leases: two Redis calls per request) | exit 2: a rules file has no concurrency cap |
//! | `--delay-ms MS` | 0 | the `GET /` handler takes this long (at most 600000) | every path takes this long |
//! | `--window-offset OFFSET` | `+00:00` | UTC offset of clock-aligned windows (`+08:00`, `-5h`, `30m`, `5h30m`; under 24 h) for `fixed-window` and `sliding-window` (memory and Redis); warns with other strategies | exit 2: set `window_offset` in the file |
//! | `--queue MAX_WAIT_MS` | off | with `leaky-bucket`, a FIFO queue drained at the constant rate: each request leaves at its reserved departure, one interval after the previous, or gets 429 at once if that is more than MAX_WAIT_MS away (memory and Redis); warns with other strategies | exit 2: set `queue_ms` in the file |
