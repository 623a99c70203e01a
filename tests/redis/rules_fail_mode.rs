//! A rules file's `fail_mode` per limit on a Redis store with a local fallback, Redis stopped:
//! `open` lets requests through, `closed` answers 503, `local` (and a limit without a mode) decides
//! in this process with its share of the limit; the same on the multi-limit path, and after a
//! reload that changes the modes. Without a fallback, `local` is refused at its line.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::redis::RedisStore;
use tower::ServiceExt as _;

use crate::redis_support::RedisServer;

/// Limits of 4 requests an hour on a global key, each `(name, fail_mode)` on path `/NAME` (the
/// mode "" leaves `fail_mode` out).
fn limits(modes: &[(&str, &str)]) -> String {
    modes
        .iter()
        .map(|(name, mode)| {
            let mode = match *mode {
                "" => String::new(),
                m => format!("fail_mode = \"{m}\"\n"),
            };
            format!(
                "[[limit]]\nname = \"{name}\"\npath = \"/{name}\"\nkey = \"global\"\n\
                 quotas = \"4/hour\"\n{mode}\n"
            )
        })
        .collect()
}

/// One limit per mode, and one without (the store's fallback decides it).
fn four_modes() -> String {
    limits(&[
        ("open", "open"),
        ("closed", "closed"),
        ("local", "local"),
        ("default", ""),
    ])
}

/// A store on `redis` whose local fallback divides each limit by 2 instances.
async fn store_with_fallback(redis: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder(redis.url())
        .prefix(prefix)
        .timeout(Duration::from_millis(500))
        .local_fallback(2)
        .build()
        .await
        .expect("connect")
}

/// The status and `x-ratelimit-limit` (0 when absent) of a `GET path` through `rules`.
async fn get(rules: &Rules<RedisStore>, path: &str) -> (StatusCode, u64) {
    let svc = tower::ServiceBuilder::new()
        .layer(rules.layer())
        .service(tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::from("ok")))
        }));
    let res = svc
        .oneshot(Request::get(path).body(()).unwrap())
        .await
        .unwrap();
    let limit = res
        .headers()
        .get("x-ratelimit-limit")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    (res.status(), limit)
}

/// `n` requests to `path`: their statuses and limits.
async fn statuses(rules: &Rules<RedisStore>, path: &str, n: usize) -> Vec<(StatusCode, u64)> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(rules, path).await);
    }
    out
}

const OK: StatusCode = StatusCode::OK;
const LIMITED: StatusCode = StatusCode::TOO_MANY_REQUESTS;
const DOWN: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

#[test]
fn each_limit_fails_as_its_mode_says_while_redis_is_stopped() {
    let _g = crate::redis_faults::serial();
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    crate::redis_faults::rt().block_on(async {
        let store = store_with_fallback(&redis, "modes:").await;
        let rules = Rules::new(&four_modes(), RulesOptions::default(), move || {
            store.clone()
        })
        .unwrap();
        // Redis up: every limit is counted on Redis, whatever its mode (one request of 4 each).
        for path in ["/open", "/closed", "/local", "/default"] {
            assert_eq!(get(&rules, path).await, (OK, 4), "{path} with Redis up");
        }
        redis.kill9();
        // Open: every request passes, without fields, counted as failed open.
        let open = statuses(&rules, "/open", 6).await;
        assert_eq!(open, vec![(OK, 0); 6], "open");
        assert_eq!(rules.stats("open").unwrap().fail_open, 6);
        // Closed: 503.
        assert_eq!(statuses(&rules, "/closed", 3).await, vec![(DOWN, 0); 3]);
        // Local and the store's default: this instance's share (4 / 2) decided here, then 429;
        // never failed open.
        for name in ["local", "default"] {
            let got = statuses(&rules, &format!("/{name}"), 4).await;
            assert_eq!(
                got,
                vec![(OK, 2), (OK, 2), (LIMITED, 2), (LIMITED, 2)],
                "{name}"
            );
            assert_eq!(rules.stats(name).unwrap().fail_open, 0, "{name}");
        }

        // A reload that fails (its last limit names a key no extractor is registered for) keeps
        // the old rules whole: the modes of the limits it would have changed too.
        let failing = limits(&[("closed", "open")])
            + "[[limit]]\nname = \"z\"\npath = \"/z\"\nkey = \"user\"\nquotas = \"4/hour\"\n";
        assert!(rules.reload_text(&failing).is_err());
        assert_eq!(statuses(&rules, "/closed", 2).await, vec![(DOWN, 0); 2]);

        // A reload that swaps the modes applies to the limits kept (their state and stores).
        let swapped = limits(&[
            ("open", "local"),
            ("closed", "closed"),
            ("local", "closed"),
            ("default", "open"),
        ]);
        let report = rules.reload_text(&swapped).unwrap().expect("a change");
        assert_eq!(report.changed, ["open", "local", "default"], "{report}");
        assert_eq!(
            statuses(&rules, "/open", 3).await,
            vec![(OK, 2), (OK, 2), (LIMITED, 2)],
            "open, now local"
        );
        assert_eq!(
            statuses(&rules, "/local", 2).await,
            vec![(DOWN, 0); 2],
            "local, now closed"
        );
        let before = rules.stats("default").unwrap().fail_open;
        assert_eq!(
            statuses(&rules, "/default", 3).await,
            vec![(OK, 0); 3],
            "default, now open"
        );
        assert_eq!(rules.stats("default").unwrap().fail_open, before + 3);
    });
}

/// One request meeting several limits (the multi-limit call): each limit fails by its own mode.
#[test]
fn limits_of_one_request_each_fail_by_their_own_mode() {
    let _g = crate::redis_faults::serial();
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    crate::redis_faults::rt().block_on(async {
        let text = r#"
[[limit]]
name = "all"
key = "global"
quotas = "100/hour"
fail_mode = "open"

[[limit]]
name = "closed"
path = "/closed"
key = "global"
quotas = "4/hour"
fail_mode = "closed"

[[limit]]
name = "local"
path = "/local"
key = "global"
quotas = "4/hour"
fail_mode = "local"
"#;
        let store = store_with_fallback(&redis, "multi-modes:").await;
        let rules = Rules::new(text, RulesOptions::default(), move || store.clone()).unwrap();
        for path in ["/closed", "/local", "/other"] {
            assert_eq!(get(&rules, path).await.0, OK, "{path} with Redis up");
        }
        redis.kill9();
        // `all` fails open; `local` decides its share here (the fields are its own).
        assert_eq!(
            statuses(&rules, "/local", 3).await,
            vec![(OK, 2), (OK, 2), (LIMITED, 2)]
        );
        // `closed` answers 503 whatever `all` does.
        assert_eq!(statuses(&rules, "/closed", 2).await, vec![(DOWN, 0); 2]);
        assert_eq!(statuses(&rules, "/other", 2).await, vec![(OK, 0); 2]);
        // `all` failed open for each request but the one `local` rejected (2 + 2 + 2).
        assert_eq!(rules.stats("all").unwrap().fail_open, 6);
    });
}

/// Without a local fallback, `fail_mode = "local"` is refused at its line and column, at load
/// and on reload (the old rules kept).
#[tokio::test]
async fn a_local_fail_mode_without_a_fallback_is_refused_at_its_line() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::builder(redis.url())
        .prefix("no-fallback:")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let make = {
        let store = store.clone();
        move || store.clone()
    };
    let text = four_modes();
    // Where the file says `fail_mode = "local"`: its value's line and column.
    let at = text.find("fail_mode = \"local\"").unwrap() + "fail_mode = ".len();
    let line = text[..at].matches('\n').count() + 1;
    let column = at - text[..at].rfind('\n').map_or(0, |n| n + 1) + 1;
    let e = Rules::new(&text, RulesOptions::default(), make.clone()).unwrap_err();
    assert_eq!(e.position(), Some((line, column)), "{e}");
    assert!(e.message().contains("local fallback"), "{e}");
    let without = limits(&[
        ("open", "open"),
        ("closed", "closed"),
        ("local", ""),
        ("default", ""),
    ]);
    let rules = Rules::new(&without, RulesOptions::default(), make).unwrap();
    let e = rules.reload_text(&text).unwrap_err();
    assert_eq!(e.position(), Some((line, column)), "{e}");
    assert_eq!(rules.names(), ["open", "closed", "local", "default"]);
    // The old rules serve: `local` has no mode (Redis counts it, up).
    assert_eq!(get(&rules, "/local").await, (OK, 4));
}
