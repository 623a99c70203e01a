//! Misconfiguration is loud, once, store failures warn at most about once a
//! second, and `tracing` events name the key only when configured.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::{ForwardedIp, GlobalKey, HeaderKey, PeerIp};
use tollgate::layer::{KeyPolicy, RateLimitLayer};
use tollgate::store::{Answer, LimiterNames, Scope, Store};
use tollgate::{Decision, ManualClock, RateLimiter, Stats, StoreError, StoreErrorKind};
use tower::{Layer, ServiceExt, service_fn};

use crate::support::Logs;

fn echo() -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    service_fn(|_req: Request<Full<Bytes>>| {
        ready(Ok::<_, Infallible>(Response::new(Full::from("ok"))))
    })
}

#[derive(Debug, Default)]
struct DownStore(LimiterNames);

impl<K> Store<K> for DownStore {
    type Future = Ready<Result<Decision, StoreError>>;
    fn apply(&self, _: &K, _: Scope<'_>, _: tollgate::Op, _: u64) -> Answer<Self::Future> {
        Answer::now(Err(StoreError::new(
            StoreErrorKind::Timeout,
            "no answer within 50 ms",
        )))
    }

    fn names(&self) -> &LimiterNames {
        &self.0
    }
    fn stats(&self) -> Stats {
        Stats::default()
    }
}

/// The once-flags are process-wide and other tests of this binary trip them too, so this test runs
/// in a process of its own.
#[test]
fn warnings_are_logged_once_not_per_request() {
    if !crate::logs::alone("layer_misconfig::warnings_are_logged_once_not_per_request") {
        return;
    }
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
            let lim = || {
                RateLimiter::builder()
                    .quotas("1000/minute")
                    .unwrap()
                    .clock(clock.clone())
                    .build()
                    .unwrap()
            };

            // Forwarded headers while keying by the peer address.
            let svc = RateLimitLayer::new(lim(), PeerIp::default()).layer(echo());
            // More than the 64 requests among which the probe looks once, whatever the thread's
            // count stood at.
            for _ in 0..70 {
                let mut req = Request::get("/")
                    .header("x-forwarded-for", "1.2.3.4")
                    .body(Full::default())
                    .unwrap();
                req.extensions_mut()
                    .insert(tollgate::key::PeerAddr::new("10.0.0.1:1".parse().unwrap()));
                assert_eq!(
                    svc.clone().oneshot(req).await.unwrap().status(),
                    StatusCode::OK
                );
            }
            assert_eq!(
                logs.count("requests carry forwarded headers"),
                1,
                "{}",
                logs.text()
            );

            // No ConnectInfo / PeerAddr: a 400 each time, a warning once, never a 500.
            for _ in 0..50 {
                let res = svc
                    .clone()
                    .oneshot(Request::get("/").body(Full::default()).unwrap())
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::BAD_REQUEST);
            }
            assert_eq!(logs.count("found no peer address"), 1);

            // Trusting every proxy: warned when configured, not per request.
            let everyone = ForwardedIp::new(["0.0.0.0/0"]).unwrap();
            assert_eq!(logs.count("trusts every proxy"), 1);
            let svc = RateLimitLayer::new(lim(), everyone).layer(echo());
            for _ in 0..20 {
                let mut req = Request::get("/")
                    .header("x-forwarded-for", "1.2.3.4")
                    .body(Full::default())
                    .unwrap();
                req.extensions_mut()
                    .insert(tollgate::key::PeerAddr::new("10.0.0.1:1".parse().unwrap()));
                svc.clone().oneshot(req).await.unwrap();
            }
            assert_eq!(logs.count("trusts every proxy"), 1);

            // Store failures: fail open, at most one warning per second of failures.
            let down: RateLimiter<(), DownStore, ManualClock> = RateLimiter::builder()
                .name("edge")
                .quotas("1/minute")
                .unwrap()
                .store(DownStore::default())
                .clock(clock.clone())
                .build()
                .unwrap();
            let svc = RateLimitLayer::new(down.clone(), GlobalKey).layer(echo());
            for _ in 0..200 {
                assert_eq!(
                    svc.clone()
                        .oneshot(Request::get("/").body(Full::default()).unwrap())
                        .await
                        .unwrap()
                        .status(),
                    StatusCode::OK
                );
            }
            assert_eq!(
                logs.count("rate-limit store failed; failing open"),
                1,
                "{}",
                logs.text()
            );
            assert!(logs.text().contains("no answer within 50 ms"));
            assert!(
                logs.text().contains("limit=\"edge\""),
                "the warning names the limiter: {}",
                logs.text()
            );
            assert_eq!(down.stats().fail_open, 200);

            // Rejections are debug events; the key appears only with `log_keys(true)`.
            logs.clear();
            let lim1 = || {
                RateLimiter::builder()
                    .quotas("1/minute")
                    .unwrap()
                    .clock(clock.clone())
                    .build()
                    .unwrap()
            };
            let quiet = RateLimitLayer::new(lim1(), HeaderKey::new("x-api-key")).layer(echo());
            let loud = RateLimitLayer::new(lim1(), HeaderKey::new("x-api-key"))
                .keys(KeyPolicy::default().log_keys(true))
                .layer(echo());
            for svc in [quiet, loud] {
                for _ in 0..2 {
                    let req = Request::get("/")
                        .header("x-api-key", "secret-customer-7")
                        .body(Full::default())
                        .unwrap();
                    svc.clone().oneshot(req).await.unwrap();
                }
            }
            assert_eq!(logs.count("rate limited"), 2, "{}", logs.text());
            assert_eq!(
                logs.count("limit=\"default\" "),
                2,
                "each rejection names its limiter, the quota's limit apart: {}",
                logs.text()
            );
            assert_eq!(logs.count("quota_limit=1 "), 2, "{}", logs.text());
            assert_eq!(
                logs.count("secret-customer-7"),
                0,
                "a header key is never logged as it is: {}",
                logs.text()
            );
            assert_eq!(
                logs.count("key=\"#"),
                1,
                "only the configured layer names the key, as a keyed hash: {}",
                logs.text()
            );
        });
    });
}

/// A rules file writes its fields as the file says: a layer's `headers(..)` beyond `on_allowed`
/// would be lost, so it is named in a warning.
#[test]
fn header_settings_a_rules_file_does_not_take_are_named_in_a_warning() {
    if !crate::logs::alone(
        "layer_misconfig::header_settings_a_rules_file_does_not_take_are_named_in_a_warning",
    ) {
        return;
    }
    use tollgate::layer::{HeaderStyle, Headers};
    use tollgate::rules::{Rules, RulesOptions};
    let file = "[[limit]]\nname = \"api\"\nquotas = \"10/minute\"\nkey = \"global\"\n";
    let rules = Rules::memory(file, RulesOptions::default()).unwrap();
    let ((), logs) = crate::logs::capturing(|| {
        let _kept = rules.layer().headers(Headers::new().on_allowed(false));
    });
    assert_eq!(logs.count("takes only `on_allowed`"), 0, "{}", logs.text());
    let ((), logs) = crate::logs::capturing(|| {
        let _warned = rules.layer().headers(
            Headers::new()
                .style(HeaderStyle::Ietf)
                .jitter(Duration::from_secs(1)),
        );
    });
    let text = logs.text();
    assert_eq!(logs.count("takes only `on_allowed`"), 1, "{text}");
    assert!(text.contains("style") && text.contains("jitter"), "{text}");
    assert!(!text.contains("reset_format"), "{text}");
}
