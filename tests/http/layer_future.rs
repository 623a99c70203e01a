//! The layer's response future never stays pending forever on a broken invariant: in debug builds
//! (tests) it fails loudly.

use std::convert::Infallible;
use std::future::{Future, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::key::GlobalKey;
use tollgate::layer::RateLimitLayer;
use tollgate::{ManualClock, RateLimiter};
use tower::{Layer, Service, service_fn};

type Body = Full<Bytes>;

#[test]
#[should_panic(expected = "rate-limit response future: polled after completion")]
fn a_response_future_polled_after_completion_fails_loudly() {
    let limiter = RateLimiter::<()>::builder()
        .quotas("1/minute")
        .unwrap()
        .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<Body>| {
        ready(Ok::<_, Infallible>(Response::new(Body::default())))
    });
    let mut svc = RateLimitLayer::new(limiter, GlobalKey).layer(inner);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let first = pin!(svc.call(Request::get("/").body(Body::default()).unwrap()));
    assert!(matches!(first.poll(&mut cx), Poll::Ready(Ok(_))));
    // The second is rejected: the layer's own answer, in its final state.
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = pin!(svc.call(Request::get("/").body(Body::default()).unwrap()));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(res)) => assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS),
        other => panic!("not answered at once: {other:?}"),
    }
    let _ = fut.as_mut().poll(&mut cx);
}
