//! Rate limiting a plain hyper 1 service (no axum): hyper-util serves each connection, the peer
//! address goes into every request as `tollgate::key::PeerAddr`, and `tower::ServiceBuilder`
//! stacks the layer.
//!
//! ```text
//! cargo run --example hyper -- 127.0.0.1:3001 5/minute
//! curl -i http://127.0.0.1:3001/
//! ```
//!
//! Arguments: `[ADDR]` (default 127.0.0.1:3001; port 0 picks a free one) and `[QUOTA]` (default
//! `5/minute`). Prints `listening on http://ADDR` once listening.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate::RateLimiter;
use tollgate::key::{PeerAddr, PeerIp};
use tollgate::layer::RateLimitLayer;
use tower::{ServiceBuilder, service_fn};

async fn hello(_req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(
        b"hello from hyper\n",
    ))))
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = match args
        .next()
        .unwrap_or_else(|| "127.0.0.1:3001".into())
        .parse()
    {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hyper: bad address: {e}\nusage: hyper [ADDR] [QUOTA]");
            return ExitCode::from(2);
        }
    };
    let quota = args.next().unwrap_or_else(|| "5/minute".into());
    let limiter = match RateLimiter::builder()
        .quotas(&quota)
        .and_then(|b| b.build())
    {
        Ok(l) => l,
        Err(e) => {
            eprintln!("hyper: {e}\nusage: hyper [ADDR] [QUOTA]");
            return ExitCode::from(2);
        }
    };
    let limit = RateLimitLayer::new(limiter, PeerIp::default());
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("hyper: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("listening on http://{a}"),
        Err(e) => {
            eprintln!("hyper: {e}");
            return ExitCode::FAILURE;
        }
    }
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("hyper: accept: {e}");
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        };
        let svc = ServiceBuilder::new()
            // The peer address of this connection, for `PeerIp`.
            .map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(PeerAddr::new(peer));
                req
            })
            .layer(limit.clone())
            .service(service_fn(hello));
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            if let Err(e) = http1::Builder::new()
                .serve_connection(io, TowerToHyperService::new(svc))
                .await
            {
                eprintln!("hyper: connection: {e}");
            }
        });
    }
}
