//! The Redis store's errors: configuration mistakes (URL, prefix, TLS options and files) are
//! `ConfigError`s when the store is built, before any connection, with a message that says what
//! to fix; a store error keeps the Redis error that caused it as its `source()`.

use crate::redis_support::{self, RedisServer};

use std::error::Error as _;

use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{
    BuildError, ConfigError, Op, Rule, StoreErrorKind, Strategy, TlsFileProblem, UrlProblem,
};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The configuration error of a build that must fail on its settings.
async fn config_error(builder: tollgate::store::redis::RedisStoreBuilder) -> ConfigError {
    match builder.build().await {
        Err(BuildError::Config(e)) => e,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn configuration_mistakes_are_config_errors_at_build_with_a_clear_message() {
    rt().block_on(async {
        // Nothing listens on these ports: every error below is found before connecting.
        let port = redis_support::free_port();
        let plain = format!("redis://127.0.0.1:{port}");

        let e = config_error(RedisStore::builder("http://127.0.0.1:1")).await;
        assert!(
            matches!(
                e,
                ConfigError::RedisUrl {
                    problem: UrlProblem::Scheme,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("expected redis://host:port"), "{e}");
        let e = config_error(RedisStore::builder("redis+sentinel://127.0.0.1:26379")).await;
        assert!(
            matches!(
                e,
                ConfigError::RedisUrl {
                    problem: UrlProblem::SentinelPath,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("/SERVICE"), "{e}");
        // A URL the `redis` crate refuses: its error is kept, the message masks the password, and
        // no error in the chain a reporter prints shows it.
        let e = config_error(RedisStore::builder("redis://:s3cret@127.0.0.1:notaport")).await;
        let ConfigError::RedisUrl {
            problem: UrlProblem::Refused(cause),
            ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert!(!cause.to_string().is_empty());
        let mut chain: Option<&dyn std::error::Error> = Some(&e);
        while let Some(link) = chain {
            assert!(!link.to_string().contains("s3cret"), "{link}");
            chain = link.source();
        }
        let e = config_error(RedisStore::builder("redis+cluster://:s3cret@")).await;
        assert!(
            matches!(
                e,
                ConfigError::RedisUrl {
                    problem: UrlProblem::NoClusterNode,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("no Cluster node"), "{e}");
        assert!(
            !e.to_string().contains("s3cret"),
            "no password in messages: {e}"
        );

        let e = config_error(RedisStore::builder(&plain).prefix("a{b}")).await;
        assert_eq!(e, ConfigError::RedisPrefix("a{b}".into()));
        assert!(e.to_string().contains("brace"), "{e}");
        let e = config_error(RedisStore::builder(&plain).prefix("p".repeat(65))).await;
        assert!(e.to_string().contains("65 bytes long"), "{e}");

        // A CA file that exists, with a URL that is not a TLS one.
        let dir = std::env::temp_dir().join(format!("tollgate-errors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = config_error(
            RedisStore::builder(format!("redis://:s3cret@127.0.0.1:{port}")).tls_ca_file(&ca),
        )
        .await;
        assert_eq!(
            e,
            ConfigError::RedisUrl {
                url: format!("redis://:***@127.0.0.1:{port}"),
                problem: UrlProblem::NotTls,
            }
        );
        assert!(e.to_string().contains("needs a TLS URL (rediss://"), "{e}");

        // A client certificate file that does not exist.
        let missing = dir.join("missing.crt");
        let e = config_error(
            RedisStore::builder(format!("rediss://127.0.0.1:{port}"))
                .tls_client_cert(&missing, &ca),
        )
        .await;
        assert_eq!(
            e,
            ConfigError::TlsFile {
                role: "client certificate",
                path: missing.clone(),
                problem: TlsFileProblem::Unreadable(std::io::ErrorKind::NotFound),
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("client certificate") && text.contains(&*missing.to_string_lossy()),
            "{text}"
        );
        // A key file that is not PEM.
        let not_pem = dir.join("key.txt");
        std::fs::write(&not_pem, "not a key").unwrap();
        let e = config_error(
            RedisStore::builder(format!("rediss://127.0.0.1:{port}"))
                .tls_client_cert(&ca, &not_pem),
        )
        .await;
        assert!(e.to_string().ends_with("not a PEM file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();

        // An unreachable server is not a configuration error: the store builds, and its calls
        // fail with a connection error (answered by the layer's failure policy) until it connects.
        let store = RedisStore::builder(&plain)
            .build()
            .await
            .expect("an unreachable Redis does not fail the build");
        let rule = Rule::parse(Strategy::FixedWindow, "1/second").unwrap();
        let e = store
            .apply(
                &"k".to_string(),
                Scope::new("default", &rule),
                Op::Check(1),
                0,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Connection, "{e}");
        assert!(!store.counters().connected);
    });
}

#[test]
fn a_store_error_exposes_its_redis_cause() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .prefix("errors:")
            .block_cache(0)
            .build()
            .await
            .expect("connect");
        let rule = Rule::parse(Strategy::MovingWindow, "5/hour").unwrap();
        let key = "k".to_string();
        let scope = Scope::new("default", &rule);
        // The moving window keeps a list: a string in its place makes the script fail.
        for name in store.redis_keys(&key, scope) {
            assert_eq!(server.cli(&["SET", &name, "not a list"]), "OK");
        }
        let e = store.apply(&key, scope, Op::Check(1), 0).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Server, "{e}");
        let cause = e
            .source()
            .and_then(|c| c.downcast_ref::<redis::RedisError>())
            .unwrap_or_else(|| panic!("the Redis error is the cause: {e:?}"));
        assert!(cause.to_string().contains("WRONGTYPE"), "{cause}");
        assert!(e.message().contains("WRONGTYPE"), "logs see the cause: {e}");

        // A refused password at build: a store error, with the server's refusal as its cause.
        assert_eq!(server.cli(&["CONFIG", "SET", "requirepass", "right"]), "OK");
        let e = match RedisStore::connect(&server.url()).await {
            Err(BuildError::Store(e)) => e,
            other => panic!("a refused connection is a store error: {other:?}"),
        };
        assert_eq!(e.kind(), StoreErrorKind::Server, "{e}");
        assert!(
            e.source().is_some_and(|c| c.is::<redis::RedisError>()),
            "{e:?}"
        );
    });
}

#[test]
fn a_per_request_bucket_finer_than_a_microsecond_is_refused_never_applied() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .prefix("finer:")
            .build()
            .await
            .expect("connect");
        let limiter: tollgate::RateLimiter<String, RedisStore> = tollgate::RateLimiter::builder()
            .quotas("10/minute")
            .unwrap()
            .store(store)
            .build()
            .unwrap();
        // T = 100 ns, below the store's microsecond: it would fail open on every request.
        let fine = Rule::parse(Strategy::TokenBucket, "10000/ms").unwrap();
        assert!(Store::<String>::validate(limiter.store(), &fine).is_err());
        let key = "k".to_string();
        for i in 1..=5 {
            let e = limiter
                .apply(&key, Some(&fine), Op::Check(1))
                .await
                .unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::InvalidRule, "{e}");
            assert!(
                e.message().contains("microsecond") || e.message().contains("tick"),
                "{e}"
            );
            assert_eq!(limiter.stats().invalid_rules, i);
        }
        assert_eq!(limiter.stats().store_errors, 0, "never sent to Redis");
        assert_eq!(server.cli(&["DBSIZE"]), "0", "nothing written");
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    });
}
