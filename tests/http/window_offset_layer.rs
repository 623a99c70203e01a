//! A user's time zone chosen per request through the layer: a closure reads the offset from the
//! request and picks the rule with that offset; `x-ratelimit-reset`, `Retry-After` and the IETF `t`
//! point at that zone's midnight.

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::HeaderKey;
use tollgate::layer::{HeaderStyle, Headers, RateLimitLayer};
use tollgate::{ManualClock, RateLimiter, Rule, Strategy, WindowOffset};
use tower::{Layer, Service, ServiceExt, service_fn};

type Body = Full<Bytes>;

/// 10:00 UTC on a day.
const TEN_UTC: Duration = Duration::from_secs(1_700_006_400 + 10 * 3600);

fn get(user: &str, offset: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .header("x-utc-offset", offset)
        .body(Body::default())
        .unwrap()
}

#[tokio::test]
async fn each_users_daily_window_ends_at_their_own_midnight() {
    let clock = ManualClock::new(TEN_UTC);
    let limiter = RateLimiter::builder()
        .strategy(Strategy::FixedWindow)
        .quotas("1/day")
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let base = limiter.rule().clone();
    // The offset comes from the account in a real service; a header stands in for it here.
    let rules: Vec<(WindowOffset, Arc<Rule>)> = ["+09:00", "-05:00", "+05:30"]
        .into_iter()
        .map(|o| {
            let o: WindowOffset = o.parse().unwrap();
            (o, Arc::new(base.clone().with_window_offset(o)))
        })
        .collect();
    let pick = move |parts: &Parts| {
        let offset: WindowOffset = parts
            .headers
            .get("x-utc-offset")?
            .to_str()
            .ok()?
            .parse()
            .ok()?;
        rules
            .iter()
            .find(|(o, _)| *o == offset)
            .map(|(_, r)| Arc::clone(r))
    };
    let mut svc = RateLimitLayer::new(limiter, HeaderKey::new("x-user"))
        .headers(Headers::new().style(HeaderStyle::Both))
        .select_rule(pick)
        .layer(service_fn(|_req: Request<Body>| {
            ready(Ok::<_, Infallible>(Response::new(Body::default())))
        }));
    // 10:00 UTC: midnight is 15:00 UTC in Tokyo (5 h away), 05:00 UTC in Lima (19 h), 18:30 UTC
    // in Delhi (8.5 h).
    for (user, offset, left) in [
        ("tokyo", "+09:00", 5 * 3600),
        ("lima", "-05:00", 19 * 3600),
        ("delhi", "+05:30", 8 * 3600 + 1800),
    ] {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get(user, offset))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{user}");
        assert_eq!(
            res.headers()["x-ratelimit-reset"],
            left.to_string(),
            "{user}"
        );
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get(user, offset))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{user}");
        assert_eq!(res.headers()["retry-after"], left.to_string(), "{user}");
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"default\";r=0;t={left}").as_str(),
            "{user}"
        );
    }
    // At Tokyo's midnight only Tokyo's user has a new window.
    clock.advance(Duration::from_secs(5 * 3600));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(get("tokyo", "+09:00"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(get("lima", "-05:00"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}
