//! Rules files and reloads: limits from a TOML file (feature `rules`), matched per path and
//! method, decided all or nothing across their keys, reloaded without losing state.
//!
//! Limits can come from a TOML file instead of code (feature `rules`):
//! `tollgate::rules::Rules::memory(text, options)` (or `Rules::new` with any store, e.g. a Redis store
//! shared by all limits), then `rules.layer()` on a router, and `rules.watch(path, interval)` to reload
//! it. The server runs one with `cargo run --example server -- --rules examples/rules.toml`. The schema
//! is pinned (scripts rely on it):
//!
//! ```toml
//! [[limit]]
//! name = "login"              # required, unique, [A-Za-z0-9_.-]{1,64}
//! path = "/login"             # default "/*"; "/api/*" = "/api/" and below (not "/api"); "{x}" = one
//!                             # non-empty segment; raw path, case-sensitive, no trailing-slash folding
//! methods = ["POST"]          # default all; case-insensitive; HEAD is not GET
//! key = "ip"                  # default "ip"; ip | global | header:NAME | A+B composite ("ip+header:x-user")
//! on_missing_key = "reject"   # reject (400) | global; default from RulesOptions (--on-missing-key)
//! strategy = "moving-window"  # the --strategy names; default sliding-window
//! quotas = "5/minute; 20/hour"
//! burst = 10                  # bucket strategies only; an error elsewhere
//! cost = 1                    # units per request, default 1
//! shadow = false              # true: decided and counted, never rejects
//! window_offset = "8h"        # fixed-window and sliding-window only: windows follow the clock of
//!                             # the time zone at this UTC offset ("+08:00", "-05:00", "5h30m")
//! queue_ms = 2000             # leaky-bucket with one quota only: a shaping queue, requests wait up
//!                             # to this long for their departure (429 at once beyond)
//! concurrency = 4             # at most 4 matching requests in flight per key: 429 at once above it,
//!                             # `Retry-After: 1`; on Redis across instances; not on a shadow limit
//! fail_mode = "closed"        # open | closed | local: a store failure on this limit skips it,
//!                             # answers 503, or (Redis with a local fallback: --fail-mode local
//!                             # --instances N) decides here with the limit divided by N; default:
//!                             # the layer's FailurePolicy (the server's --fail-mode)
//! settle = "marker"           # marker | header:NAME (before the response leaves) | trailer:NAME
//!                             # (once the body ended): where the request's actual cost comes from
//! tier = "header:x-plan"      # header:NAME | a key registered in code: where the plan is read
//! tiers = { pro = "50/minute", enterprise = "500/minute" }
//!                             # quotas per plan (the limit's strategy, burst, window offset);
//!                             # no plan, or one not listed: `quotas` (the default tier)
//!
//! [[exempt]]                  # requests no limit applies to (a health check)
//! path = "/health"            # a path pattern, as a limit's
//! methods = ["GET"]           # default all
//! ```
//!
//! A file is at most 16 MiB (a bigger one is refused before it is read whole), with at most 10,000
//! limits and 10,000 exemptions, each listing at most 16 `methods`.
//!
//! - **Keys and tiers from code.** `RulesOptions::key("user", ExtensionKey::<UserId>::new())`
//!   registers an extractor by name: a limit keys by it (`key = "user"`, or `"user+ip"`: a
//!   registered key goes before any header in a composite) or reads its plan from it
//!   (`tier = "plan"`). A name the options do not register is refused at load. A tier's value is
//!   the header's first value, or the registered key's bytes, compared with the tier names as
//!   written. All tiers of a limit share its one state per key, so a client whose plan changes
//!   keeps what it spent, converted to the new plan's quotas ([changing
//!   limits](super::changing_limits)).
//!
//! - **Every matching limit applies, all or nothing.** The enforced limits that match a request are
//!   decided together in one `Store::apply_all` call, in the file's order: either every one of them
//!   spends the request's cost, or (one rejects) none does, so a rejected request spends nothing
//!   anywhere. The `429` is the rejecting limit's with the longest `Retry-After` (a cost that can
//!   never be admitted before any wait; on the memory store every limit is checked, so the longest
//!   wait is known, and a store that ends its answer at the first rejection names that one). It
//!   never over-admits. In memory the keys'
//!   lock stripes are taken in one fixed order (no global lock) and no other request ever sees a
//!   reservation that is then rolled back: a request that fits every limit is admitted. On Redis, one
//!   script call decides all the limits when their keys are in one slot (single node and Sentinel:
//!   always; Cluster: limits on the same key): one round trip per request instead of one per limit,
//!   and no false rejection. Otherwise (a Cluster with a `global` key next to per-client keys, which
//!   keep their own hash tags so that all traffic does not land in one slot; quota leasing on, whose
//!   answers are local) the limits are reserved in the file's order and settled back to 0 on a
//!   rejection: never over-admits, and a concurrent request on one of the keys may be falsely
//!   rejected for the time of that decision. A third-party store gets the same two-phase protocol
//!   from the trait's default.
//! - **One limit, no rollback.** When no request can match two enforced limits of a file (checked
//!   pairwise at load, by method and path pattern, for files of up to 64 enforced limits), a
//!   request's one limit is decided by its limiter alone, as a plain layer does: nothing is ever
//!   rolled back. During a reload, requests still in flight on the old rules may take the
//!   all-or-nothing path while new ones take this one: at worst one false rejection per in-flight
//!   rollback, never an over-admission.
//! - **What the two-phase protocol can lose**: a settlement that fails leaves its units spent, and
//!   a multi-limit call whose reply comes after its caller gave up is not refunded (counted in the
//!   store's late replies): under-admission, never over. A multi-limit call that fails on Redis with
//!   a local fallback is never sent again: each limit decides locally at once. Whether the store is
//!   a Cluster comes from its URL, never from a connection still being made.
//! - **A failing store blocks no other limit.** Every answer is read before acting: under
//!   `FailurePolicy::FailClosed` the limits that admitted are given back once and the request is
//!   answered `503` (after a rejection the store has given them back itself); under `FailOpen` the failed limit is skipped. A limit left unanswered counts
//!   as failed. A request without a key for one of its limits is answered `400` before anything is
//!   spent.
//! - **`fail_mode` per limit.** A limit's `fail_mode` overrides the layer's policy for that limit
//!   alone: `open` skips it, `closed` answers `503`, `local` decides it in this process during a
//!   Redis outage with the store's local fallback (`RedisStoreBuilder::local_fallback(n)`, the
//!   server's `--fail-mode local --instances N`: each quota's limit divided by `n`, the blocked-key
//!   cache still answering for keys Redis had blocked). On a store with a local fallback, a limit
//!   without `fail_mode` decides locally too (the store's setting), and one with `open` or `closed`
//!   gets the store's error instead, on the single-limit path and in a multi-limit call alike (the
//!   limits of one request each fail their own way). `local` on a store without a fallback is an
//!   error at its line and column (at start: the server exits 2; on reload: the old rules stay); on
//!   the memory store, which never fails, it has no effect and is warned about once. A reload that
//!   changes a kept limit's mode applies to requests decided from then on, those in flight included.
//! - **Settlement**: a handler's `Settle` marker (`Settle::refund()` on a successful login: only
//!   failures count) settles the request's reservation with the limit it names
//!   (`Settle::for_limiter`: every limit takes a marker named for it), and an unnamed one with
//!   every matching limit whose `settle` is `marker`; a file with no such limit leaves an unnamed
//!   marker to the layer around it (never a global limit's count by accident). `settle =
//!   "header:NAME"` settles to the response header `NAME` (a decimal count; missing, unusable or
//!   repeated: the estimate stands, warned once per limit) before the response leaves; `settle =
//!   "trailer:NAME"` to the trailer `NAME` once the body has ended (a body dropped before its
//!   trailers leaves the estimate). A value above what was left is charged in full (the key's debt
//!   carries, as with `SettleFrom`). Shadow limits settle like enforced ones. See
//!   [settlement](super::settlement).
//! - **Headers** follow the stacked-limiter rule: a `429` carries the rejecting limit's fields; a
//!   success the `x-ratelimit-*` of the limit with the fewest remaining, and one IETF item per limit,
//!   named after it, counting the limits of `RateLimitLayer`s inside and around the rules layer too.
//! - **Errors** point at the file: `line L, column C: ...` for TOML that does not parse, an unknown field,
//!   strategy or key, a quota that does not parse, an empty quota list, a duplicate name, a path that can
//!   never match, a `burst` with a window strategy, a `window_offset` that does not parse or with a
//!   strategy without clock-aligned windows, a `queue_ms` on another strategy than `leaky-bucket`, on
//!   several quotas, on a shadow limit, with a `burst`, or shorter than one interval, a second
//!   `queue_ms` limit that can match a request the first one matches, and `fail_mode = "local"` on
//!   a store without a local fallback. The server exits 2 with it.
//! - **Concurrency caps** (`concurrency = N`) count the limit's requests in flight per key, from
//!   admission until the response body ends or the request is dropped (a client that goes away gives
//!   its slot back). A slot is taken only once every quota of the request (shaping queues included)
//!   admitted it; a full cap answers `429` at once with `Retry-After: 1` through the layer's rejection
//!   hook (`ProblemJson`, `respond_with`), and gives back what the quotas reserved, so its `429` spends
//!   no quota. In memory the counts live in this process; on a Redis store they are shared by every
//!   instance, as `ConcurrencyLimit::redis` counts them: a lease per request in a sorted set per
//!   key and limit name, renewed every 20 s while the request runs and expiring after 60 s if its
//!   instance dies (two more Redis calls per capped request: acquire, release); when Redis fails
//!   the request passes without a lease (warned at most once a second), whatever the limit's
//!   `fail_mode`. The counts survive a reload that keeps the limit's name (a changed `N` applies to
//!   the slots already held). A value outside `1..=4294967295`, not an integer, or on a shadow
//!   limit is an error at its line and column.
//! - **Shaping queues** (`queue_ms`) work as `RateLimitLayer::pacing(Pacing::Queue(..))`: each request gets its departure
//!   when it arrives (FIFO, one interval apart, the queue's depth `queue_ms / interval + 1`), waits for
//!   it on tokio's timer, and is forwarded with the headers of its departure. They are checked after
//!   every other enforced limit of the request admitted it (a queue's rejection settles those to 0),
//!   and their slots are never given back (a
//!   rejection by a later queue, or a refund, leaves a gap: under-admission, never two waiters in one
//!   slot). A request waits in one queue at most: two `queue_ms` limits whose methods and
//!   path patterns some request matches both of (`/api/*` and `/api/{v}/upload`, `/a` and `/{x}`)
//!   are refused at load, since a request under two queues could only leave at the later departure
//!   and share the other queue's interval with another request. A waiting request holds no capacity
//!   of the inner service (its `poll_ready` is given back and asked again at departure).
//! - **A limit removed and added back** (a rename and back, a line commented out and in) reloads
//!   while requests started on older rules are still in flight: it reuses the limiter those requests
//!   hold, so a store shared by every limit (Redis) never refuses its name, and the name of a removed
//!   limit is released on the store when the last request holding it ends.
//! - **In handlers**: `Rules::peek(limit, &parts)` reads a request's state under a limit (the attempts
//!   left), `Rules::reset(limit, &parts)` forgets it (a successful login), and a `429` of the rules
//!   layer carries `rules::RejectedBy` (the limit's name and decision) in its extensions, for an outer
//!   layer that answers with a page of its own. Each limit gets the clock the builder gives one limiter
//!   of its rule; `Rules::with_clock` runs them all on another (tests). The `login` example (`examples/login.rs`) puts it together: per IP + username and per
//!   IP from a rules file, all or nothing, only failures counted.
//! - **One layer type.** `rules.layer()` is a `RateLimitLayer` (of the file's limits), the same
//!   pipeline as a single limiter's: `respond_with(ProblemJson)`, `on_rejected(..)`,
//!   `failure_policy(..)` (the `RulesOptions`' by default), `pacing(Pacing::Delay(..))`, `skip(..)`
//!   and `headers(..)` (its `on_allowed`; the file sets the rest, and a setting it cannot take is
//!   named in a warning) apply to a file's limits, gRPC calls get trailers-only
//!   `RESOURCE_EXHAUSTED` / `INVALID_ARGUMENT` / `UNAVAILABLE` answers, and it wraps any inner body
//!   (tonic's included). A limit's `header:NAME` key is read as `HeaderKey` reads it: one value,
//!   trimmed, not empty.
//! - **Reload.** The file is polled every `--reload-interval` ms (default 1000; 0 disables) and swapped
//!   in atomically when its content hash changes; requests in flight finish on the rules they started
//!   with. A file that does not parse, vanished, or was caught half-written is refused with a log line
//!   (`rules reload refused`) and `tollgate_rules_reloads_total{result="error"}`; the old rules keep
//!   serving. Each reload logs the limits added, removed, changed, converted and started fresh. A
//!   key's state belongs to its limit's name and the key: a changed quota, strategy or window offset
//!   converts each key's state in the store when the key is next seen, strictly (it never hands back
//!   what the old state proves was spent; [changing limits](super::changing_limits) gives the bounds),
//!   in memory and on Redis alike, and instances still on the old file count the key once with the
//!   new ones. A changed key starts that limit fresh with a warning; a rename is a new limit.
//!   Instances polling one file may run the old and the new rules side by side for up to one
//!   interval.
//! - **Shadow limits** (`shadow = true`) are decided and counted after the enforced limits admitted the
//!   request; they never reject and never roll anything back, so a tighter limit can be rolled out next
//!   to the one enforced on the same key and watched in `tollgate_requests_total{outcome="shadow_rejected"}`.
//!   They write no headers unless `RulesOptions::shadow_headers` (`x-ratelimit-shadow-limit`,
//!   `-remaining`, `-reset`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use axum::{Router, body::Body, routing::post};
//! use http::{Request, StatusCode};
//! use tollgate::rules::{Rules, RulesOptions};
//! use tower::ServiceExt;
//!
//! let rules = Rules::memory(
//!     r#"
//!     [[limit]]
//!     name = "login"
//!     path = "/login"
//!     methods = ["POST"]
//!     key = "global"
//!     strategy = "moving-window"
//!     quotas = "2/minute"
//!     "#,
//!     RulesOptions::default(),
//! )
//! .unwrap();
//! let app = Router::new().route("/login", post(|| async { "ok" })).layer(rules.layer());
//! let login = || Request::post("/login").body(Body::empty()).unwrap();
//! for _ in 0..2 {
//!     assert_eq!(app.clone().oneshot(login()).await.unwrap().status(), StatusCode::OK);
//! }
//! assert_eq!(app.oneshot(login()).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
//! // A file with a mistake says where: line and column.
//! let err = Rules::memory("[[limit]]\nname = \"x\"\nquotas = \"5/fortnight\"\n", RulesOptions::default());
//! assert!(err.unwrap_err().to_string().contains("line 3"));
//! # }
//! ```
