//! A gRPC server limited per peer IP: the standard health service (`grpc.health.v1.Health`, from
//! `tonic-health`) behind a [`RateLimitLayer`].
//!
//! ```text
//! cargo run --example grpc_server -- --addr 127.0.0.1:0 --quota 3/minute
//! cargo run --example grpc_server -- --quota 5/second --strategy token-bucket
//! ```
//!
//! Once listening it prints exactly one line to stdout, `listening on http://ADDR`; logs go to
//! stderr (`RUST_LOG`). A request over the quota gets the trailers-only status
//! `RESOURCE_EXHAUSTED` (8) with `x-ratelimit-*` and `retry-after` metadata and a
//! `google.rpc.RetryInfo` in `grpc-status-details-bin`. A usage error (an unknown flag, a bad
//! value) exits 2; a failure at run time (the port is taken) exits 1.
//!
//! | Flag | Default | Effect |
//! | --- | --- | --- |
//! | `--addr HOST:PORT` | `127.0.0.1:50051` | listen address; port 0 picks a free port |
//! | `--quota Q` | `10/minute` | quotas, `;`-separated (`"5/second; 100/minute"`); all must admit |
//! | `--strategy NAME` | `sliding-window` | `fixed-window`, `fixed-window-first-hit`, `moving-window`, `sliding-window`, `token-bucket`, `leaky-bucket` |
//!
//! The peer IP comes from tonic's `TcpConnectInfo`: with the `tonic` feature
//! [`PeerIp`](tollgate::key::PeerIp) reads it itself; without it this example copies the address
//! into [`PeerAddr`](tollgate::key::PeerAddr).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tokio::net::TcpListener;
use tollgate::key::PeerIp;
use tollgate::layer::RateLimitLayer;
use tollgate::{RateLimiter, Strategy};

#[derive(Debug, Parser)]
#[command(about = "A gRPC health service limited per peer IP")]
struct Cli {
    /// Listen address (port 0 picks a free port)
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
    addr: String,

    /// Quotas, `;`-separated, e.g. "5/second; 100/minute"
    #[arg(long, value_name = "Q", default_value = "10/minute", value_parser = quota)]
    quota: String,

    /// fixed-window, fixed-window-first-hit, moving-window, sliding-window, token-bucket, leaky-bucket
    #[arg(long, value_name = "NAME", default_value = "sliding-window", value_parser = strategy)]
    strategy: Strategy,
}

fn strategy(s: &str) -> Result<Strategy, String> {
    s.parse().map_err(|e: tollgate::ParseError| e.to_string())
}

fn quota(s: &str) -> Result<String, String> {
    tollgate::parse_quotas(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    // clap exits 2 on a usage error.
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let limiter = match RateLimiter::builder()
        .strategy(cli.strategy)
        .quotas(&cli.quota)
        .and_then(|b| b.build())
    {
        Ok(limiter) => limiter,
        Err(e) => {
            eprintln!("grpc_server: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(&cli.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("grpc_server: cannot listen on {}: {e}", cli.addr);
            return ExitCode::from(1);
        }
    };
    let addr: SocketAddr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("grpc_server: {e}");
            return ExitCode::from(1);
        }
    };
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    #[cfg(not(feature = "tonic"))]
    let peer = tower::util::MapRequestLayer::new(|mut req: http::Request<tonic::body::Body>| {
        let peer = req
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|c| c.remote_addr());
        if let Some(peer) = peer {
            req.extensions_mut()
                .insert(tollgate::key::PeerAddr::new(peer));
        }
        req
    });
    #[cfg(feature = "tonic")]
    let peer = tower::layer::util::Identity::new();

    println!("listening on http://{addr}");
    let served = tonic::transport::Server::builder()
        .layer(peer)
        .layer(RateLimitLayer::new(limiter, PeerIp::default()))
        .add_service(health)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown(),
        )
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grpc_server: {e}");
            ExitCode::from(1)
        }
    }
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
