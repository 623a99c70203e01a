//! The everyday tasks a rules file expresses with keys registered in code, tiers and
//! exemptions: a user-id key an auth layer sets, quotas per plan from a header or a registered
//! key (with a default tier), and an exempt health check; and the load errors of each.

use axum::Router;
use axum::body::Body;
use http::{Method, Request, StatusCode};
use tollgate::key::ExtensionKey;
use tollgate::rules::{Rules, RulesOptions};
use tollgate::store::StoreKey;
use tower::ServiceExt;

/// The authenticated user, as an auth layer would put it in the request's extensions.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct User(String);

impl StoreKey for User {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.as_bytes());
    }
}

/// The user's plan, set by the same auth layer.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Plan(&'static str);

impl StoreKey for Plan {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.as_bytes());
    }
}

fn options() -> RulesOptions {
    RulesOptions::default()
        .key("user", ExtensionKey::<User>::new())
        .unwrap()
        .key("plan", ExtensionKey::<Plan>::new())
        .unwrap()
}

fn app(rules: &Rules) -> Router {
    Router::new()
        .fallback(|| async { "ok" })
        .layer(rules.layer())
}

/// A request as the auth layer leaves it: `user` and `plan` in its extensions, when given.
fn request(
    method: Method,
    path: &str,
    user: Option<&str>,
    plan: Option<&'static str>,
) -> Request<Body> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    if let Some(u) = user {
        req.extensions_mut().insert(User(u.to_owned()));
    }
    if let Some(p) = plan {
        req.extensions_mut().insert(Plan(p));
    }
    req
}

/// How many of `n` requests `make` builds are admitted.
async fn admitted(app: &Router, n: usize, make: impl Fn() -> Request<Body>) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let res = app.clone().oneshot(make()).await.unwrap();
        match res.status() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    ok
}

#[tokio::test]
async fn a_limit_keyed_by_a_registered_user_id_counts_each_user_apart() {
    let rules = Rules::memory(
        "[[limit]]\nname = \"per-user\"\nkey = \"user\"\nquotas = \"3/minute\"\n",
        options(),
    )
    .unwrap();
    let app = app(&rules);
    let get = |u: &'static str| move || request(Method::GET, "/", Some(u), None);
    assert_eq!(admitted(&app, 5, get("alice")).await, 3);
    assert_eq!(
        admitted(&app, 5, get("bob")).await,
        3,
        "bob has his own count"
    );
    // No user (the auth layer let an anonymous request through): no key, 400.
    let res = app
        .clone()
        .oneshot(request(Method::GET, "/", None, None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_registered_key_composes_with_other_parts() {
    let rules = Rules::memory(
        "[[limit]]\nname = \"per-user-ip\"\nkey = \"user+global\"\nquotas = \"2/minute\"\n",
        options(),
    )
    .unwrap();
    let app = app(&rules);
    assert_eq!(
        admitted(&app, 4, || request(Method::GET, "/", Some("carol"), None)).await,
        2
    );
}

#[tokio::test]
async fn tiers_from_a_header_give_each_plan_its_quota_and_others_the_default() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "api"
        key = "header:x-api-key"
        quotas = "2/minute"
        tier = "header:x-plan"
        tiers = { pro = "5/minute", enterprise = "8/minute" }
        "#,
        RulesOptions::default(),
    )
    .unwrap();
    let app = app(&rules);
    let req = |key: &'static str, plan: Option<&'static str>| {
        move || {
            let mut b = Request::get("/").header("x-api-key", key);
            if let Some(p) = plan {
                b = b.header("x-plan", p);
            }
            b.body(Body::empty()).unwrap()
        }
    };
    assert_eq!(admitted(&app, 10, req("k-pro", Some("pro"))).await, 5);
    assert_eq!(
        admitted(&app, 10, req("k-ent", Some("enterprise"))).await,
        8
    );
    assert_eq!(
        admitted(&app, 10, req("k-free", None)).await,
        2,
        "no plan: the default"
    );
    assert_eq!(
        admitted(&app, 10, req("k-odd", Some("platinum"))).await,
        2,
        "an unlisted plan: the default"
    );
    // The 429 of a tier reports that tier's quota.
    let res = app
        .clone()
        .oneshot(req("k-pro", Some("pro"))())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["x-ratelimit-limit"], "5");
}

#[tokio::test]
async fn a_user_whose_plan_changes_keeps_what_they_spent() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "api"
        key = "user"
        quotas = "2/minute"
        tier = "plan"
        tiers = { pro = "6/minute" }
        "#,
        options(),
    )
    .unwrap();
    let app = app(&rules);
    let as_plan =
        |plan: Option<&'static str>| move || request(Method::GET, "/", Some("dave"), plan);
    assert_eq!(admitted(&app, 4, as_plan(Some("pro"))).await, 4);
    // Downgraded to the default tier: 4 spent in this minute is over its 2, so nothing more,
    // where a fresh state would have admitted 2.
    assert_eq!(admitted(&app, 3, as_plan(None)).await, 0);
    // Upgraded again: 2 of the pro quota's 6 are left.
    assert_eq!(admitted(&app, 5, as_plan(Some("pro"))).await, 2);
}

#[tokio::test]
async fn an_exempt_path_and_method_is_never_limited_and_the_rest_is() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "everything"
        key = "global"
        quotas = "1/minute"

        [[exempt]]
        path = "/health"
        methods = ["GET"]

        [[exempt]]
        path = "/static/*"
        "#,
        RulesOptions::default(),
    )
    .unwrap();
    let app = app(&rules);
    let at = |m: Method, p: &'static str| move || request(m.clone(), p, None, None);
    assert_eq!(admitted(&app, 20, at(Method::GET, "/health")).await, 20);
    assert_eq!(
        admitted(&app, 20, at(Method::HEAD, "/static/app.js")).await,
        20
    );
    let first = app
        .clone()
        .oneshot(request(Method::GET, "/health", None, None))
        .await
        .unwrap();
    assert!(
        first.headers().get("x-ratelimit-limit").is_none(),
        "exempt: no fields"
    );
    // The global quota is untouched by all of that: one request of the rest is admitted.
    assert_eq!(admitted(&app, 3, at(Method::POST, "/health")).await, 1);
}

#[test]
fn a_file_naming_what_it_cannot_use_is_refused_saying_why() {
    let cases = [
        (
            "[[limit]]\nname = \"a\"\nkey = \"usr\"\nquotas = \"1/minute\"\n",
            "\"usr\" is not ip, global or header:NAME",
        ),
        (
            "[[limit]]\nname = \"a\"\nkey = \"ip\"\nquotas = \"1/minute\"\ntier = \"header:x-plan\"\n",
            "line 5, column 8: tier without tiers",
        ),
        (
            "[[limit]]\nname = \"a\"\nkey = \"ip\"\nquotas = \"1/minute\"\ntiers = { pro = \"2/minute\" }\n",
            "line 5, column 9: tiers without tier",
        ),
        (
            "[[limit]]\nname = \"a\"\nquotas = \"1/minute\"\ntier = \"ip\"\ntiers = { pro = \"2/minute\" }\n",
            "a tier is read from header:NAME or a key registered in code",
        ),
        (
            "[[limit]]\nname = \"a\"\nquotas = \"1/minute\"\ntier = \"header:x-plan\"\ntiers = { pro = \"2 per fortnight\" }\n",
            "tier \"pro\"",
        ),
        (
            "[[limit]]\nname = \"a\"\nstrategy = \"leaky-bucket\"\nquotas = \"1/second\"\nqueue_ms = 2000\ntier = \"header:x-plan\"\ntiers = { pro = \"2/second\" }\n",
            "queue_ms with tiers",
        ),
        (
            "[[exempt]]\npath = \"health\"\n",
            "line 2, column 8: path \"health\" must start with",
        ),
        (
            "[[exempt]]\npath = \"/health\"\nmethods = [\"\"]\n",
            "is not a method",
        ),
        ("[[exempt]]\nmethods = [\"GET\"]\n", "missing field `path`"),
    ];
    for (text, want) in cases {
        let e = Rules::memory(text, options()).unwrap_err().to_string();
        assert!(e.contains(want), "{text}\n  gave: {e}\n  want: {want}");
    }
    let e = RulesOptions::default()
        .key("ip", ExtensionKey::<User>::new())
        .unwrap_err();
    assert!(e.to_string().contains("not ip or global"), "{e}");
}

#[test]
fn a_limits_rule_is_its_default_tiers_and_follows_a_reload() {
    let rules = Rules::memory(
        r#"
        [[limit]]
        name = "api"
        strategy = "token-bucket"
        quotas = "10/minute"
        tier = "header:x-plan"
        tiers = { pro = "100/minute" }

        [[limit]]
        name = "login"
        strategy = "moving-window"
        quotas = "5/minute; 20/hour"
        "#,
        options(),
    )
    .unwrap();
    let api = rules.rule("api").unwrap();
    assert_eq!(api.strategy(), tollgate::Strategy::TokenBucket);
    assert_eq!(
        api.quotas(),
        &["10/minute".parse::<tollgate::Quota>().unwrap()]
    );
    let login = rules.rule("login").unwrap();
    assert_eq!(login.strategy(), tollgate::Strategy::MovingWindow);
    assert_eq!(login.quotas().len(), 2);
    assert!(rules.rule("pro").is_none() && rules.rule("nothing").is_none());
    rules
        .reload_text(
            "[[limit]]\nname = \"login\"\nstrategy = \"fixed-window\"\nquotas = \"3/minute\"\n",
        )
        .unwrap();
    assert_eq!(
        rules.rule("login").map(|r| r.strategy()),
        Some(tollgate::Strategy::FixedWindow)
    );
    assert!(rules.rule("api").is_none(), "removed by the reload");
}
