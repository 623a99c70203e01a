//! Headers: what the layer writes on allowed responses and on `429`s, and how stacked layers share
//! them.
//!
//! Every [`Decision`](crate::Decision) carries the values of the headers (their formulas per
//! strategy are in [strategies](super::strategies#formulas-per-strategy)). Values are taken *after*
//! an admitted request is counted; a rejection leaves the state unchanged.
//!
//! | header | value |
//! | --- | --- |
//! | `x-ratelimit-limit` | the largest value `remaining` can take: `N` for the window strategies, `B` for the buckets ([`Decision::limit`](crate::Decision::limit)) |
//! | `x-ratelimit-remaining` | what is left after this request, clamped to `[0, limit]` ([`Decision::remaining`](crate::Decision::remaining)) |
//! | `x-ratelimit-reset` | `ceil(reset_after)` in seconds: how long until `remaining` is back at `limit` if no request comes; `0` only when it already is. Unix seconds instead with [`ResetFormat::Unix`](crate::layer::ResetFormat::Unix) (from the store's clock: the Redis server's for Redis) |
//! | `Retry-After` (`429` only) | `max(1, ceil(retry_after))` seconds: when a request of the same cost will be admitted ([`Decision::retry_after_secs`](crate::Decision::retry_after_secs)); absent when the cost can never be admitted |
//!
//! The layer replaces any of these fields the inner service set; turn them off on allowed responses
//! with [`Headers::on_allowed(false)`](crate::layer::Headers::on_allowed) given to
//! [`RateLimitLayer::headers`](crate::RateLimitLayer::headers). An allowed
//! request carries its `Decision` for the handler (to show "attempts left"):
//! [`Decision::from_extensions`](crate::Decision::from_extensions), or `Decision` /
//! `Option<Decision>` as an axum extractor; a rejected one's is in the `429`'s extensions. A `429` has a short text/plain body unless
//! [`on_rejected`](crate::RateLimitLayer::on_rejected) (a closure of the `Decision`) or
//! [`respond_with`](crate::RateLimitLayer::respond_with) (a responder, e.g. `ProblemJson`) builds
//! it; the layer still adds the fields.
//!
//! With several quotas one quota is *reported*, and `limit`, `remaining` and `reset` all come from
//! it: on a `429` the rejecting quota with the longest `retry_after` (so `Retry-After` is the real
//! wait); on a `200` the quota with the fewest remaining (ties: the later reset).
//! [`Decision::quota_index`](crate::Decision::quota_index) names it.
//!
//! A request let through because the store failed (fail-open) carries no rate-limit headers: nothing
//! true could be said about it. It is counted in [`Stats`](crate::Stats).
//!
//! With axum, keyed by the peer address (`axum::serve(.., app.into_make_service_with_connect_info::<SocketAddr>())`
//! inserts it; the test below does it by hand), on a clock the test moves:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{Router, body::Body, routing::get};
//! use http::{Request, StatusCode};
//! use tollgate::{ManualClock, RateLimiter, Strategy};
//! use tollgate::key::PeerIp;
//! use tollgate::layer::RateLimitLayer;
//! use tower::ServiceExt;
//!
//! let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::FixedWindow)
//!     .quotas("2/minute").unwrap()
//!     .clock(clock.clone())
//!     .build()
//!     .unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(RateLimitLayer::new(limiter, PeerIp::default()));
//!
//! let request = || {
//!     let mut req = Request::get("/").body(Body::empty()).unwrap();
//!     // `axum::serve(.., app.into_make_service_with_connect_info::<SocketAddr>())` does this.
//!     let peer: SocketAddr = "203.0.113.9:5000".parse().unwrap();
//!     req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
//!     req
//! };
//! let res = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["x-ratelimit-limit"], "2");
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
//! assert_eq!(res.headers()["x-ratelimit-reset"], "40", "the window ends at the next whole minute");
//! app.clone().oneshot(request()).await.unwrap();
//! let res = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["retry-after"], "40");
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
//! clock.advance(Duration::from_secs(40));
//! assert_eq!(app.oneshot(request()).await.unwrap().status(), StatusCode::OK);
//! # }
//! ```
//!
//! # The IETF fields
//!
//! The draft's structured `RateLimit` and `RateLimit-Policy` fields (draft-ietf-httpapi-ratelimit-headers-11)
//! are written instead of or beside the `x-ratelimit-*` fields with
//! [`HeaderStyle::Ietf`](crate::layer::HeaderStyle) or `Both` (set with
//! [`Headers::style`](crate::layer::Headers::style); the other settings below are
//! [`Headers`](crate::layer::Headers) methods too):
//!
//! | field | value |
//! | --- | --- |
//! | `RateLimit-Policy` | one item per quota: `"NAME";q=N;w=W` for the windows; `q=B;w=ceil(B x T)` for the buckets (a bucket admits `B` at once, then one per `T`: 10/s with burst 50 is `q=50;w=5`) |
//! | `RateLimit` | one item per limiter: `"NAME";r=REMAINING;t=T`; `t` is the reset on an allowed response and equals `Retry-After` on a `429`, for every strategy |
//! | stacked limiters | every limiter adds its items; names stay unique per response: a limiter whose item names an inner limiter already used takes the first free suffix (`"api"`, then `"api-2"`; with several quotas `"api-2-0"`, ...) |
//! | `qu` | [`quota_unit("content-bytes")`](crate::layer::Headers::quota_unit); `requests`, the default, is not written |
//! | `pk` | [`partition_key(SECRET)`](crate::layer::Headers::partition_key): the first 96 bits of HMAC-SHA256(SECRET, the key), base64, never the key. Give every instance the same secret; [`partition_key_random()`](crate::layer::Headers::partition_key_random) draws one per process and warns (instances then disagree) |
//! | jitter | [`jitter(MAX)`](crate::layer::Headers::jitter) adds up to MAX whole seconds to `t` of allowed responses, so clients told the same reset do not come back at once |
//!
//! [`ProblemJson`](crate::layer::ProblemJson) answers a `429` with the draft's `quota-exceeded`
//! problem type (RFC 9457), its `violated-policies` naming the rejecting quota's item, and
//! `retry_after`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use axum::{Router, body::Body, routing::get};
//! use http::{Request, StatusCode};
//! use tollgate::{RateLimitLayer, RateLimiter, key::GlobalKey};
//! use tollgate::layer::{HeaderStyle, Headers, ProblemJson};
//! use tower::ServiceExt;
//!
//! let limiter = RateLimiter::builder().name("api").quotas("1/minute").unwrap().build().unwrap();
//! let app = Router::new().route("/", get(|| async { "ok" })).layer(
//!     RateLimitLayer::new(limiter, GlobalKey)
//!         .headers(Headers::new().style(HeaderStyle::Ietf))
//!         .respond_with(ProblemJson),
//! );
//! let request = || Request::get("/").body(Body::empty()).unwrap();
//! let ok = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(ok.headers()["ratelimit-policy"], "\"api\";q=1;w=60");
//! let refused = app.oneshot(request()).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(refused.headers()["content-type"], "application/problem+json");
//! # }
//! ```
//!
//! # Stacked layers, order and CORS
//!
//! Stacked layers count a request once per limiter and key: a second layer on the same limiter and
//! key (route and router level) lets the request through uncounted, and a request rejected by an
//! outer layer never reaches, nor counts in, an inner one. When layers on different limiters both
//! answer, an inner layer's `429` keeps its own fields (the rejecting limiter's); on allowed
//! responses the `x-ratelimit-*` fields come from the limiter with the fewest remaining (ties: the
//! later reset), so a client sees the budget that runs out first, and every limiter adds its items
//! to the IETF fields (`RateLimit-Policy` one per quota, named after the limiter, `NAME-i` with
//! several quotas; `RateLimit` one per limiter). This holds whatever sits between the layers (a
//! middleware that rebuilds the request) and with a [rules layer](super::rules) among them; the
//! one exception is a layer nested in a clone of itself (with a rule of its own) through a
//! middleware that drops the request's extensions: the outer one's fields are shown.
//!
//! `Retry-After` and `x-ratelimit-*` are not CORS-safelisted: list them in
//! `Access-Control-Expose-Headers`, and put the rate limiter *inside* the CORS layer (added before
//! it with `Router::layer`) so `429`s carry CORS headers too. Put it after authentication when
//! keying by user. [`skip`](crate::RateLimitLayer::skip) exempts requests (health checks, CORS
//! preflight `OPTIONS`, allow-listed networks): they pass without a check and without headers.
