//! The `grpc_server` example run as a user runs it (the binary `cargo test` builds in
//! `target/debug/examples/`; a filtered run such as `cargo test --all-features --test grpc` does not
//! rebuild it: `cargo build --all-features --examples` first): the pinned command line, one stdout
//! line, a tonic client limited after the quota, exit 2 on bad flags, exit 0 on SIGTERM.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test` (which builds the examples) or `cargo build --examples`",
        path.display()
    );
    path
}

#[tokio::test]
async fn the_pinned_command_line_serves_health_and_limits_per_peer_ip() {
    let mut child = Command::new(example("grpc_server"))
        .args(["--addr", "127.0.0.1:0", "--quota", "3/minute"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
        .await
        .expect("the example did not start")
        .unwrap();
    let base = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(
        base.starts_with("http://127.0.0.1:") && !base.ends_with(":0"),
        "{base}"
    );

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

    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let code = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("no exit after SIGTERM")
        .unwrap();
    assert_eq!(code.code(), Some(0));
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await.unwrap();
    assert_eq!(rest, "", "exactly one line on stdout");
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
