//! The `grpc_server` example run as a user runs it (the binary `cargo test` builds in
//! `target/debug/examples/`; a filtered run such as `cargo test --all-features --test grpc` does not
//! rebuild it: `cargo build --all-features --examples` first): the pinned command line, one stdout
//! line, a tonic client limited after the quota, exit 2 on bad flags, exit 0 on SIGTERM.

use std::time::Duration;

use tokio::process::Command;

use crate::examples::{example, start};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn the_pinned_command_line_serves_health_and_limits_per_peer_ip() {
    let running = start(
        "grpc_server",
        &["--addr", "127.0.0.1:0", "--quota", "3/minute"],
    )
    .await;
    let base = running.base.clone();

    let channel = tonic::transport::Endpoint::from_shared(base)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let request = || {
        tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        })
    };
    // The sliding window: 3 a minute, whichever second of the window it is.
    for _ in 0..3 {
        client.check(request()).await.expect("within the quota");
    }
    let status = client.check(request()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");

    running.stop_with("-TERM").await;
}

#[tokio::test]
async fn bad_flags_exit_2() {
    for args in [
        &["--quota", "three/minute"][..],
        &["--strategy", "fastest"],
        &["--no-such-flag"],
        &["--addr"],
    ] {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            Command::new(example("grpc_server")).args(args).output(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}
