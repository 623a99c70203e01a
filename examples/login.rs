//! A login form throttled the way security guidance asks (OWASP, NIST 800-63B), where only
//! failures count:
//!
//! - per IP + username: 5 failures per 15 minutes, then a hard 429 (moving window);
//! - per IP, across usernames: 100 attempts per day (password spraying);
//! - per account, across IPs: 20 failures per hour, answered by *slowing down*, not by locking
//!   the owner out: beyond the burst each attempt waits for its slot (pacing, up to 10 s) and is
//!   told when to come back otherwise, so the owner gets in within one slot (3 min) of an attack.
//!
//! The first two are a rules file ([`RULES`], the `rules` layer): decided together, all or
//! nothing, so an attempt one of them refuses spends nothing from the other. The account limit is
//! a layer of its own inside it, because it paces. A successful login is refunded from all three
//! (settlement: the handler marks its response with [`Settle::refund`], once for each layer) and
//! resets the IP + username counter. Unknown and known usernames get the same answer. The page
//! shows the attempts left and, when blocked, the wait.
//!
//! ```text
//! cargo run --example login            # http://127.0.0.1:3002/ ; demo users alice, bob
//! cargo run --example login -- 127.0.0.1:0 --trust-proxy 10.0.0.0/8
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use tollgate::key::{Cidr, ExtensionKey, ForwardedIp, ValueKey};
use tollgate::layer::{Pacing, RateLimitLayer, Settle};
use tollgate::rules::{IpSource, RejectedBy, Rules, RulesOptions};
use tollgate::store::{MemoryStore, StoreKey};
use tollgate::{Clock, Decision, RateLimiter, Strategy};

/// The two limits decided together, all or nothing; both take the success's unnamed
/// [`Settle`] marker (`settle = "marker"`). The username reaches them in the
/// [`USER_HEADER`] header, which [`read_form`] sets from the form (a client's own is dropped).
pub const RULES: &str = r#"
[[limit]]
name = "login-ip-user"
path = "/login"
methods = ["POST"]
key = "ip+header:x-login-user"
strategy = "moving-window"
quotas = "5/15m"
settle = "marker"

[[limit]]
name = "login-ip"
path = "/login"
methods = ["POST"]
key = "ip"
strategy = "fixed-window-first-hit"
quotas = "100/day"
settle = "marker"
"#;

/// The internal header carrying the normalised username to the rules' key.
pub const USER_HEADER: HeaderName = HeaderName::from_static("x-login-user");

/// The demo password of every known user.
pub const PASSWORD: &str = "correct horse battery staple";
/// The known users.
pub const USERS: [&str; 2] = ["alice", "bob"];

/// A normalised username (trimmed, lowercase; long names hashed): the account key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Username(ValueKey);

impl StoreKey for Username {
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
    }
}

/// The submitted form, parsed once by the middleware.
#[derive(Clone, Debug, Default)]
pub struct LoginForm {
    /// The username as typed.
    pub username: String,
    /// The password.
    pub password: String,
}

/// Settings of the demo.
#[derive(Clone, Debug)]
pub struct Config {
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted: Vec<Cidr>,
    /// How long an attempt on a throttled account may wait for its slot.
    pub account_max_delay: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            trusted: Vec::new(),
            account_max_delay: Duration::from_secs(10),
        }
    }
}

/// The limits.
#[derive(Clone, Debug)]
pub struct Limits<C> {
    /// IP + username (5 per 15 minutes) and IP (100 per day), all or nothing.
    pub rules: Rules<MemoryStore<Vec<u8>>, C>,
    /// Account: 20 per hour, paced.
    pub per_account: RateLimiter<Username, MemoryStore<Username>, C>,
}

impl<C: Clock + Clone> Limits<C> {
    /// The limits on `clock`, the client IP read through the `trusted` proxies.
    pub fn new(clock: C, trusted: &[Cidr]) -> Self {
        let options = RulesOptions {
            ip: IpSource::Forwarded(ForwardedIp::from_cidrs(trusted.iter().copied())),
            ..RulesOptions::default()
        };
        let rules = Rules::with_clock(RULES, options, MemoryStore::new, clock.clone());
        let per_account = RateLimiter::builder()
            .name("login-account")
            .strategy(Strategy::LeakyBucket)
            .quotas("20/hour")
            .and_then(|b| b.clock(clock).build());
        match (rules, per_account) {
            (Ok(rules), Ok(per_account)) => Self { rules, per_account },
            // The rules and quota above are constants that build.
            (Err(e), _) => unreachable!("{e}"),
            (_, Err(e)) => unreachable!("{e}"),
        }
    }
}

/// The router: `GET /` shows the form, `POST /login` checks it.
pub fn app<C: Clock + Clone>(clock: C, config: Config) -> Router {
    let limits = Limits::new(clock, &config.trusted);
    app_with(limits, config)
}

/// The router over given limits (tests read them).
pub fn app_with<C: Clock + Clone>(limits: Limits<C>, config: Config) -> Router {
    let per_account =
        RateLimitLayer::new(limits.per_account.clone(), ExtensionKey::<Username>::new())
            .pacing(Pacing::Delay(config.account_max_delay))
            .unwrap()
            .on_rejected(|d: &Decision| blocked(d, "for this account"));
    // From the outside in: the form is read, the rules decide (their 429 becomes the page), the
    // account limit decides; a success's refund is taken by the account layer, and given again
    // to the rules layer on its way out.
    let login_route = post(login::<C>)
        .route_layer(per_account)
        .route_layer(middleware::map_response(refund_rules))
        .route_layer(limits.rules.layer())
        .route_layer(middleware::map_response(rules_page))
        .route_layer(middleware::from_fn(read_form));
    Router::new()
        .route(
            "/",
            get(|| async { page(StatusCode::OK, "Please sign in.", "") }),
        )
        .route("/login", login_route)
        .with_state(limits)
}

/// Marks a successful login (the account layer takes its [`Settle`] marker out of the response).
#[derive(Clone, Copy, Debug)]
struct Welcome;

/// Gives the refund of a success to the rules layer too.
async fn refund_rules(mut res: Response) -> Response {
    if res.extensions().get::<Welcome>().is_some() {
        res.extensions_mut().insert(Settle::refund());
    }
    res
}

/// The rules' `429` as the page, with its headers (`Retry-After`, `x-ratelimit-*`).
async fn rules_page(res: Response) -> Response {
    let Some(rejected) = res.extensions().get::<RejectedBy>().cloned() else {
        return res;
    };
    let scope = match &*rejected.limit {
        "login-ip" => "from your network",
        _ => "for this username from your address",
    };
    let mut page = blocked(&rejected.decision, scope);
    for (name, value) in res.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            page.headers_mut().insert(name.clone(), value.clone());
        }
    }
    page
}

/// Parses the form before the limiters run, so the username can be part of the key.
async fn read_form(req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 * 1024).await else {
        return page(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large.", "");
    };
    let mut form = LoginForm::default();
    for pair in bytes.split(|&b| b == b'&') {
        let mut kv = pair.splitn(2, |&b| b == b'=');
        let (Some(k), v) = (kv.next(), kv.next()) else {
            continue;
        };
        let v = url_decode(v.unwrap_or_default());
        match k {
            b"username" => form.username = v,
            b"password" => form.password = v,
            _ => {}
        }
    }
    // Only the form says who signs in: a client's own header is dropped.
    parts.headers.remove(USER_HEADER);
    if !form.username.trim().is_empty() {
        let user = Username(ValueKey::username(&form.username));
        let mut encoded = Vec::new();
        user.encode(&mut encoded);
        let hex: String = encoded.iter().map(|b| format!("{b:02x}")).collect();
        if let Ok(value) = HeaderValue::from_str(&hex) {
            parts.headers.insert(USER_HEADER, value);
        }
        parts.extensions.insert(user);
    }
    parts.extensions.insert(form);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn url_decode(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while let Some(&b) = v.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = v
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(h) => {
                        out.push(h);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn login<C: Clock + Clone>(
    State(limits): State<Limits<C>>,
    Extension(form): Extension<LoginForm>,
    req: Request,
) -> Response {
    let (parts, _) = req.into_parts();
    // Compare for every username, known or not: the same work and the same answer.
    let known = USERS.contains(&form.username.trim().to_lowercase().as_str());
    let password_ok = constant_time_eq(form.password.as_bytes(), PASSWORD.as_bytes());
    if known && password_ok {
        // Success resets the consecutive-failure counter of this address and account.
        let _ = limits.rules.reset("login-ip-user", &parts).await;
        let mut res = page(StatusCode::OK, "Welcome!", "");
        res.extensions_mut().insert(Settle::refund());
        res.extensions_mut().insert(Welcome);
        return res;
    }
    let left = match limits.rules.peek("login-ip-user", &parts).await {
        Some(Ok(d)) => d.remaining(),
        _ => 0,
    };
    page(
        StatusCode::UNAUTHORIZED,
        "Invalid username or password.",
        &format!("{left} attempt{} left.", if left == 1 { "" } else { "s" }),
    )
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in b.iter().enumerate() {
        diff |= usize::from(x ^ a.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

fn blocked(d: &Decision, scope: &str) -> Response<Body> {
    let wait = d.retry_after_secs().unwrap_or(0);
    page(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("Too many failed sign-in attempts {scope}."),
        &format!("Try again in {wait} seconds."),
    )
}

fn page(status: StatusCode, message: &str, detail: &str) -> Response<Body> {
    let html = format!(
        "<!doctype html><title>Sign in</title><h1>Sign in</h1><p id=message>{message}</p>\
         <p id=detail>{detail}</p><form method=post action=/login>\
         <input name=username placeholder=username> <input name=password type=password> \
         <button>Sign in</button></form>\n"
    );
    let mut res = (status, Html(html)).into_response();
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    res
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut addr: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 3002));
    let mut config = Config::default();
    while let Some(a) = args.next() {
        if a == "--trust-proxy" {
            match args.next().map(|c| c.parse::<Cidr>()) {
                Some(Ok(c)) => config.trusted.push(c),
                _ => {
                    eprintln!("login: --trust-proxy needs a CIDR range");
                    return ExitCode::from(2);
                }
            }
        } else {
            match a.parse() {
                Ok(x) => addr = x,
                Err(_) => {
                    eprintln!("usage: login [ADDR] [--trust-proxy CIDR]...");
                    return ExitCode::from(2);
                }
            }
        }
    }
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("login: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Ok(a) = listener.local_addr() {
        println!("listening on http://{a}");
    }
    let app = app(tollgate::SystemClock::new(), config);
    match axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("login: {e}");
            ExitCode::FAILURE
        }
    }
}
