//! A process starved past the connection's own timeout (the store's timeout plus a second) while
//! Redis answered moments before: a check still waiting gets the connection's timeout error, or
//! its deadline long gone. Either way it is overload, shed (a 429, never admitted), never an
//! outage for the circuit breaker and never a failure for the layer's policy to let through.

use crate::redis_faults::{rt, serial};
use crate::redis_support::RedisServer;

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use tollgate::store::redis::RedisStore;
use tollgate::store::{Scope, Store};
use tollgate::{Decision, Op, Rule, StoreError, Strategy};

/// Checks `key` and stalls the waiting thread for `stall` once the call is out (5 ms after it
/// started), as a starved process would: the workers, free meanwhile, see the connection time the
/// call out, and the check reads that reply only when the thread wakes.
async fn check_stalled(
    store: &RedisStore,
    key: String,
    stall: Duration,
) -> Result<Decision, StoreError> {
    let rule = Rule::parse(Strategy::FixedWindow, "1000/hour").unwrap();
    let mut call = Box::pin(store.apply(&key, Scope::new("default", &rule), Op::Check(1), 0));
    let mut out = Box::pin(tokio::time::sleep(Duration::from_millis(5)));
    let mut stalled = false;
    std::future::poll_fn(move |cx| {
        if !stalled {
            if let Poll::Ready(d) = call.as_mut().poll(cx) {
                return Poll::Ready(d);
            }
            if out.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            std::thread::sleep(stall);
            stalled = true;
        }
        call.as_mut().poll(cx)
    })
    .await
}

#[test]
fn a_check_starved_past_the_connections_timeout_is_shed_never_an_outage() {
    let _g = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    // `block_on` runs the check on this thread; the runtime's two workers run the call.
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_millis(50))
            .circuit_breaker(1, Duration::from_secs(60))
            .build()
            .await
            .expect("connect");
        let rule = Rule::parse(Strategy::FixedWindow, "1000/hour").unwrap();
        for round in 0..3 {
            // Redis answers: the store knows it is up.
            let d = store
                .apply(
                    &"warm".to_owned(),
                    Scope::new("default", &rule),
                    Op::Check(1),
                    0,
                )
                .await
                .expect("Redis answers");
            assert!(d.is_allowed());
            server.pause();
            // Past the connection's own timeout (50 ms + 1 s).
            let d = check_stalled(
                &store,
                format!("starved-{round}"),
                Duration::from_millis(1300),
            )
            .await;
            server.resume();
            let d = d.expect("overload is a decision (shed), not a store error");
            assert!(d.was_shed() && !d.is_allowed(), "{d:?}");
            let c = store.counters();
            assert_eq!(c.breaker_opens, 0, "round {round}: {c:?}");
        }
    });
}
