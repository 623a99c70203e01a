//! The layer wrapping a tonic server (the standard health service): trailers-only statuses with
//! the pinned codes and metadata, the peer IP from tonic's `TcpConnectInfo`.

use std::future::Ready;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::key::{HeaderKey, PeerIp};
use tollgate::layer::{FailurePolicy, ProblemJson, RateLimitLayer};
use tollgate::store::{Answer, LimiterNames, Scope, Store};
use tollgate::{Decision, RateLimiter, Stats, StoreError, StoreErrorKind, Strategy};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

/// A tonic server on 127.0.0.1:0 serving the health service behind `$layer`; stopped on drop of
/// the sender (or by `stop`).
struct Serving {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

macro_rules! serve {
    ($layer:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let (tx, rx) = oneshot::channel::<()>();
        let router = tonic::transport::Server::builder()
            .layer($layer)
            .add_service(health);
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async move {
                        let _ = rx.await;
                    },
                )
                .await
                .unwrap();
        });
        Serving {
            addr,
            stop: Some(tx),
            task,
        }
    }};
}

impl Serving {
    async fn client(&self) -> HealthClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server did not stop")
            .unwrap();
    }
}

fn check() -> tonic::Request<HealthCheckRequest> {
    tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    })
}

fn meta<'a>(status: &'a tonic::Status, name: &str) -> &'a str {
    status
        .metadata()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} metadata in {status:?}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn a_tonic_client_gets_resource_exhausted_with_retry_after_after_the_quota() {
    let limiter = RateLimiter::builder()
        .strategy(Strategy::FixedWindow)
        .quotas("3/hour")
        .unwrap()
        .build()
        .unwrap();
    let server = serve!(RateLimitLayer::new(limiter, PeerIp::default()));
    let mut client = server.client().await;
    for left in (0..3).rev() {
        let res = client.check(check()).await.expect("within the quota");
        assert_eq!(
            res.metadata().get("x-ratelimit-remaining").unwrap(),
            left.to_string().as_str(),
            "the rate-limit fields are metadata of an allowed call"
        );
        assert_eq!(
            res.get_ref().status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("rate limited: retry in "),
        "{status:?}"
    );
    let retry_after: u64 = meta(&status, "retry-after").parse().unwrap();
    assert!((1..=3600).contains(&retry_after), "{retry_after}");
    assert_eq!(meta(&status, "x-ratelimit-limit"), "3");
    assert_eq!(meta(&status, "x-ratelimit-remaining"), "0");
    assert_eq!(meta(&status, "content-type"), "application/grpc");
    let info = status
        .get_details_retry_info()
        .expect("RetryInfo in grpc-status-details-bin");
    let delay = info.retry_delay.expect("a retry delay");
    assert!(
        delay.as_secs() <= retry_after && delay.as_secs() + 1 >= retry_after,
        "RetryInfo {delay:?} agrees with retry-after {retry_after}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_cost_that_can_never_be_admitted_has_no_retry_after() {
    let limiter = RateLimiter::builder()
        .strategy(Strategy::FixedWindow)
        .quotas("1/hour")
        .unwrap()
        .build()
        .unwrap();
    // The HTTP response hook is not applied to gRPC calls.
    let server = serve!(
        RateLimitLayer::new(limiter, PeerIp::default())
            .cost(|_: &http::request::Parts| 2)
            .respond_with(ProblemJson)
    );
    let status = server.client().await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("never be admitted"), "{status:?}");
    assert!(status.metadata().get("retry-after").is_none());
    assert!(status.get_details_retry_info().is_none());
    assert_eq!(meta(&status, "content-type"), "application/grpc");
    server.stop().await;
}

#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument() {
    let limiter = RateLimiter::builder()
        .quotas("5/minute")
        .unwrap()
        .build()
        .unwrap();
    let server = serve!(RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")));
    let mut client = server.client().await;
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("no rate-limit key"), "{status:?}");
    let mut keyed = check();
    keyed
        .metadata_mut()
        .insert("x-api-key", "k1".parse().unwrap());
    let res = client.check(keyed).await.expect("a keyed call passes");
    assert_eq!(res.metadata().get("x-ratelimit-remaining").unwrap(), "4");
    server.stop().await;
}

/// A store that always fails.
#[derive(Debug, Default)]
struct DownStore(LimiterNames);

impl<K> Store<K> for DownStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn apply(&self, _: &K, _: Scope<'_>, _: tollgate::Op, _: u64) -> Answer<Self::Future> {
        Answer::now(Err(StoreError::new(StoreErrorKind::Connection, "down")))
    }

    fn names(&self) -> &LimiterNames {
        &self.0
    }

    fn stats(&self) -> Stats {
        Stats::default()
    }
}

#[tokio::test]
async fn a_failed_store_failing_closed_is_unavailable() {
    let limiter = RateLimiter::builder()
        .quotas("5/minute")
        .unwrap()
        .store(DownStore::default())
        .build()
        .unwrap();
    let server = serve!(
        RateLimitLayer::new(limiter, PeerIp::default()).failure_policy(FailurePolicy::FailClosed)
    );
    let status = server.client().await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    server.stop().await;
}

#[tokio::test]
async fn peers_are_keyed_by_the_ip_of_their_connection() {
    let limiter = RateLimiter::builder()
        .strategy(Strategy::FixedWindow)
        .quotas("2/hour")
        .unwrap()
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp::default());
    let probe = layer.clone();
    let server = serve!(layer);
    // Two connections from 127.0.0.1 share one budget: the key is the IP, not the connection.
    server.client().await.check(check()).await.unwrap();
    server.client().await.check(check()).await.unwrap();
    let status = server.client().await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(probe.stats().missing_keys, 0, "every call had a peer IP");
    server.stop().await;
}

#[tokio::test]
async fn a_call_over_the_concurrency_cap_is_resource_exhausted() {
    use std::num::NonZeroU32;
    use tollgate::layer::{ConcurrencyLayer, ConcurrencyLimit};

    // Each answer is held 300 ms after the service made it: the call stays in flight.
    let hold =
        tower::util::AndThenLayer::new(|res: http::Response<tonic::body::Body>| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, std::convert::Infallible>(res)
        });
    let limit = ConcurrencyLimit::memory(NonZeroU32::new(1).unwrap());
    let server = serve!(
        tower::ServiceBuilder::new()
            .layer(ConcurrencyLayer::new(limit, PeerIp::default()))
            .layer(hold)
            .into_inner()
    );
    let client = server.client().await;
    let (mut a, mut b) = (client.clone(), client);
    let (first, second) = tokio::join!(a.check(check()), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        b.check(check()).await
    });
    assert!(first.is_ok(), "{first:?}");
    let status = second.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("at most 1 request in flight"),
        "{status:?}"
    );
    assert_eq!(meta(&status, "x-ratelimit-limit"), "1");
    assert_eq!(meta(&status, "retry-after"), "1");
    server.stop().await;
}

/// A rules file's layer on a tonic server: the same trailers-only answers as one limiter's.
#[cfg(feature = "rules")]
mod rules_file {
    use super::*;
    use tollgate::rules::{Rules, RulesOptions};

    #[tokio::test]
    async fn a_tonic_client_gets_resource_exhausted_from_a_rules_file_layer() {
        let rules = Rules::memory(
            "[[limit]]\nname = \"per-peer\"\nkey = \"ip\"\nstrategy = \"fixed-window\"\n\
             quotas = \"2/hour\"\n",
            RulesOptions::default(),
        )
        .unwrap();
        let server = serve!(rules.layer());
        let mut client = server.client().await;
        for left in (0..2).rev() {
            let res = client.check(check()).await.expect("within the quota");
            assert_eq!(
                res.metadata().get("x-ratelimit-remaining").unwrap(),
                left.to_string().as_str(),
                "the file limit's fields are metadata of an allowed call"
            );
        }
        let status = client.check(check()).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().starts_with("rate limited: retry in "),
            "{status:?}"
        );
        let retry_after: u64 = meta(&status, "retry-after").parse().unwrap();
        assert!((1..=3600).contains(&retry_after), "{retry_after}");
        assert_eq!(meta(&status, "x-ratelimit-limit"), "2");
        assert_eq!(meta(&status, "x-ratelimit-remaining"), "0");
        assert_eq!(meta(&status, "content-type"), "application/grpc");
        let info = status
            .get_details_retry_info()
            .expect("RetryInfo in grpc-status-details-bin");
        assert!(info.retry_delay.is_some(), "{info:?}");
        server.stop().await;
    }

    #[tokio::test]
    async fn a_call_without_the_key_of_a_rules_file_limit_is_invalid_argument() {
        let rules = Rules::memory(
            "[[limit]]\nname = \"per-key\"\nkey = \"header:x-api-key\"\nquotas = \"5/hour\"\n",
            RulesOptions::default(),
        )
        .unwrap();
        let server = serve!(rules.layer());
        let mut client = server.client().await;
        let status = client.check(check()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let mut keyed = check();
        keyed
            .metadata_mut()
            .insert("x-api-key", "k1".parse().unwrap());
        client
            .check(keyed)
            .await
            .expect("a call with the key passes");
        server.stop().await;
    }
}
