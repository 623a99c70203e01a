//! Pacing outgoing calls with the client-side layer: a client that must stay under a provider's
//! limit waits for a slot instead of getting 429s.
//!
//! ```text
//! cargo run --example client -- http://127.0.0.1:3000/ 2 6
//! ```
//!
//! Arguments: `URL`, `RATE` (calls per second, default 2) and `COUNT` (default 6). Prints one line
//! per call: the time since the start and the response status.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::layer::PaceLayer;
use tollgate::store::MemoryStore;
use tollgate::{Clock, RateLimiter, Strategy};
use tower::{Layer, ServiceExt};

/// The service [`paced`] returns: `inner` behind a [`PaceLayer`].
pub type Paced<S, C> = <PaceLayer<(), MemoryStore<()>, C> as Layer<S>>::Service;

/// Wraps `inner` so its calls run at most `per_second` per second (no bursts: a token bucket
/// of capacity 1), waiting up to a minute for a slot.
pub fn paced<S, C: Clock>(
    inner: S,
    per_second: u32,
    clock: C,
) -> Result<Paced<S, C>, tollgate::ConfigError> {
    let limiter = RateLimiter::builder()
        .strategy(Strategy::TokenBucket)
        .quotas(&format!("{per_second}/second"))?
        .burst(std::num::NonZeroU32::MIN)
        .clock(clock)
        .build()?;
    Ok(PaceLayer::new(limiter, ())
        .max_wait(Duration::from_secs(60))
        .layer(inner))
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let usage = "usage: client URL [RATE] [COUNT]";
    let Some(url) = args.next() else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let rate: u32 = match args.next().map(|a| a.parse()).unwrap_or(Ok(2)) {
        Ok(r) if r > 0 => r,
        _ => {
            eprintln!("client: RATE must be a positive integer\n{usage}");
            return ExitCode::from(2);
        }
    };
    let count: u32 = match args.next().map(|a| a.parse()).unwrap_or(Ok(6)) {
        Ok(c) => c,
        Err(_) => {
            eprintln!("client: COUNT must be an integer\n{usage}");
            return ExitCode::from(2);
        }
    };
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let client = match paced(http, rate, tollgate::TokioClock::new()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("client: {e}");
            return ExitCode::from(2);
        }
    };
    let start = tokio::time::Instant::now();
    for _ in 0..count {
        let req = match Request::get(url.as_str()).body(Empty::new()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("client: bad URL: {e}");
                return ExitCode::from(2);
            }
        };
        match client.clone().oneshot(req).await {
            Ok(res) => println!("{:>6} ms  {}", start.elapsed().as_millis(), res.status()),
            Err(e) => {
                eprintln!("client: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
