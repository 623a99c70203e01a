//! gRPC: the layer on a tonic server.
//!
//! The layer wraps a tonic server (`tonic::transport::Server::builder().layer(..)`): the response body
//! is generic (`layer::ResponseBody`, the inner body or the layer's own answer). A gRPC call
//! (`content-type: application/grpc`, `application/grpc+proto`, ...; not gRPC-Web) gets the layer's own
//! answers as trailers-only responses (HTTP 200, `content-type: application/grpc`, no body); the HTTP
//! response hooks (`on_rejected`, `respond_with(ProblemJson)`) are not applied to them:
//!
//! | HTTP answer | `grpc-status` | metadata |
//! | --- | --- | --- |
//! | 429 rate limited | 8 `RESOURCE_EXHAUSTED` | `x-ratelimit-*`, `retry-after` (whole seconds) and a `google.rpc.RetryInfo` in `grpc-status-details-bin`; both absent when the cost can never be admitted |
//! | 400 no key | 3 `INVALID_ARGUMENT` | |
//! | 503 store failed, failing closed | 14 `UNAVAILABLE` | |
//!
//! Allowed calls carry the `x-ratelimit-*` fields as response metadata. With the `tonic` feature,
//! `PeerIp` reads the peer address from tonic's `TcpConnectInfo` (set by `serve`/`serve_with_incoming`
//! on TCP); without it, insert `key::PeerAddr` yourself. `examples/grpc_server.rs` serves the standard
//! health service (`grpc.health.v1.Health`, from `tonic-health`: no `protoc` at build time) limited per
//! peer IP; it prints one stdout line `listening on http://ADDR` and exits 2 on bad flags:
//!
//! ```sh
//! cargo run --example grpc_server -- --addr 127.0.0.1:0 --quota 3/minute   # --strategy NAME too
//! grpc_health_probe -addr 127.0.0.1:PORT   # or any gRPC client: the 4th call within a minute gets code 8
//! ```
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::{RateLimitLayer, RateLimiter, key::PeerIp};
//!
//! let limiter = RateLimiter::builder().quotas("3/minute")?.build()?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! tonic::transport::Server::builder()
//!     .layer(RateLimitLayer::new(limiter, PeerIp::default())) // per peer IP (feature `tonic`)
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
