//! A live playground of the six strategies in the browser, and a chat demo.
//!
//! ```text
//! cargo run --example playground -- --addr 127.0.0.1:8080
//! ```
//!
//! Then open the printed address. Flags: `--addr ADDR` (default `127.0.0.1:8080`; port 0 picks a
//! free one), `--session-idle SECS` (default 600: how long an unused page session is kept). Once listening it prints exactly one line to stdout, `listening on http://ADDR`.
//!
//! The page (HTML, CSS and JS embedded in this binary; it works offline) shows a panel per strategy:
//! a timeline of requests (admitted: filled dot; rejected: cross), the window or bucket, and the
//! counts. Every decision is made here, on the server, by tollgate: one limiter per strategy, shared
//! by all page sessions (a session is a key, checked under a rule made from its settings), on a
//! [`ManualClock`] set to the current time before a request is checked, so a "hit" reaches all six
//! limiters at the same instant. The JSON API:
//!
//! ```text
//! POST /api/session  {"limit":5,"period_s":10,"burst":5}  -> the session's state (with "session")
//! POST /api/hit      {"session":"ID","count":1}            -> the new decisions and the state
//! GET  /api/state?session=ID                               -> the state (windows, buckets, counts)
//! POST /api/chat     {"session":"ID","user":"NAME"}        -> the chat limiter's decision
//! ```
//!
//! Sessions are bounded ([`MAX_SESSIONS`], least recently used evicted first) and expire after
//! `--session-idle` seconds without a request; a session keeps at most [`MAX_HISTORY`] hits. A malformed
//! request gets `400` with a JSON error, an unknown or expired session `404`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tollgate::store::MemoryStore;
use tollgate::{Clock, Decision, ManualClock, RateLimiter, Rule, Strategy, SystemClock};

/// The most page sessions kept at once; creating one more evicts the least recently used.
pub const MAX_SESSIONS: usize = 256;
/// The most hits a session remembers (for the drawings; the counts keep counting).
pub const MAX_HISTORY: usize = 1000;
/// The most requests one hit may send to every panel.
const MAX_HIT_COUNT: u32 = 50;
/// The chat demo's quota: a token bucket of 3 refilling one every 4 seconds, per user.
const CHAT_QUOTA: &str = "1/4s";
const CHAT_BURST: u32 = 3;
/// The most chat users a session's limiter holds (a page has four; a script sending more evicts).
const MAX_CHAT_USERS: usize = 64;

const INDEX_HTML: &str = include_str!("playground/index.html");
const STYLE_CSS: &str = include_str!("playground/style.css");
const APP_JS: &str = include_str!("playground/app.js");
const FAVICON_SVG: &str = include_str!("playground/favicon.svg");

#[derive(Parser, Debug)]
#[command(
    name = "playground",
    about = "A live playground of tollgate's strategies in the browser"
)]
struct Args {
    /// The address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Seconds an unused page session is kept.
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    session_idle: u64,
}

type Limiter = RateLimiter<String, MemoryStore<String>, ManualClock>;

/// The settings of a session.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct Settings {
    limit: u32,
    period_s: u32,
    burst: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            limit: 5,
            period_s: 10,
            burst: 5,
        }
    }
}

impl Settings {
    fn validate(&self) -> Result<(), String> {
        if !(1..=1000).contains(&self.limit) {
            return Err("limit must be between 1 and 1000".into());
        }
        if !(1..=3600).contains(&self.period_s) {
            return Err("period_s must be between 1 and 3600".into());
        }
        if !(1..=1000).contains(&self.burst) {
            return Err("burst must be between 1 and 1000".into());
        }
        Ok(())
    }

    /// The quota in notation, e.g. `5/10s`.
    fn quota(&self) -> String {
        format!("{}/{}s", self.limit, self.period_s)
    }

    fn period_nanos(&self) -> u64 {
        u64::from(self.period_s) * 1_000_000_000
    }
}

/// One hit: its time (Unix nanoseconds), cost and what each strategy decided.
#[derive(Clone, Debug)]
struct Hit {
    t: u64,
    cost: u32,
    allowed: [bool; 6],
}

/// One page session: its key, a rule per strategy (its settings), and what happened so far.
struct Session {
    /// The session's key in the shared limiters (its id).
    key: String,
    settings: Settings,
    /// The rule of each strategy, in [`Strategy::ALL`] order.
    rules: Vec<Rule>,
    /// Unix nanoseconds at creation: the page's time 0.
    start: u64,
    last_used: Instant,
    totals: [(u64, u64); 6],
    history: VecDeque<Hit>,
}

/// The limiters every session shares, on one clock set to the current time before each use (under
/// the registry's lock): a session is a key, checked under its own rule (a key's state belongs to
/// the rule it is used with). One memory store per strategy, whatever the number of sessions.
struct Engines {
    clock: ManualClock,
    limiters: Vec<Limiter>,
    chat: Limiter,
}

impl Engines {
    fn new() -> Result<Self, String> {
        let clock = ManualClock::default();
        let defaults = Settings::default();
        let quota = defaults.quota();
        let limiters = Strategy::ALL
            .iter()
            .map(|&s| build_limiter(s, &quota, defaults.burst, 4 * MAX_SESSIONS, &clock))
            .collect::<Result<Vec<_>, _>>()?;
        let chat = build_limiter(
            Strategy::TokenBucket,
            CHAT_QUOTA,
            CHAT_BURST,
            MAX_SESSIONS * MAX_CHAT_USERS,
            &clock,
        )?;
        Ok(Self {
            clock,
            limiters,
            chat,
        })
    }
}

/// The sessions and the limiters they share, behind one lock.
struct Registry {
    sessions: HashMap<String, Session>,
    engines: Engines,
}

impl Registry {
    /// Drops a session and its limiter state.
    fn remove(&mut self, id: &str) {
        if let Some(session) = self.sessions.remove(id) {
            for (limiter, rule) in self.engines.limiters.iter().zip(&session.rules) {
                limiter.reset_rule_now(rule, &session.key);
            }
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("settings", &self.settings)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

/// A limiter on the shared clock holding at most `max_keys` keys.
fn build_limiter(
    strategy: Strategy,
    quota: &str,
    burst: u32,
    max_keys: usize,
    clock: &ManualClock,
) -> Result<Limiter, String> {
    let burst = std::num::NonZeroU32::new(burst).ok_or("burst must not be zero")?;
    RateLimiter::builder()
        .strategy(strategy)
        .quotas(quota)
        .map_err(|e| e.to_string())?
        .burst(burst)
        .max_keys(max_keys)
        .clock(clock.clone())
        .build()
        .map_err(|e| e.to_string())
}

impl Session {
    fn new(key: String, settings: Settings, now: u64) -> Result<Self, String> {
        settings.validate()?;
        let burst = std::num::NonZeroU32::new(settings.burst).ok_or("burst must not be zero")?;
        let rules = Strategy::ALL
            .iter()
            .map(|&s| {
                RateLimiter::<String>::builder()
                    .strategy(s)
                    .quotas(&settings.quota())
                    .and_then(|b| b.burst(burst).rule())
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            key,
            settings,
            rules,
            start: now,
            last_used: Instant::now(),
            totals: [(0, 0); 6],
            history: VecDeque::new(),
        })
    }

    fn ms(&self, t: u64) -> f64 {
        (t as f64 - self.start as f64) / 1e6
    }

    /// `count` requests at the same instant `now` to every limiter.
    fn hit(&mut self, engines: &Engines, now: u64, count: u32) -> Vec<serde_json::Value> {
        engines.clock.set_nanos(now);
        let mut out = Vec::new();
        for i in 0..count {
            let mut allowed = [false; 6];
            for (s, limiter) in engines.limiters.iter().enumerate() {
                let d = limiter.check_rule_now(&self.rules[s], &self.key, 1);
                allowed[s] = d.is_allowed();
                let total = &mut self.totals[s];
                if allowed[s] {
                    total.0 += 1;
                } else {
                    total.1 += 1;
                }
                out.push(json!({
                    "strategy": Strategy::ALL[s].name(),
                    "t_ms": self.ms(now),
                    "index": i,
                    "allowed": allowed[s],
                    "remaining": d.remaining(),
                    "retry_ms": d.retry_after().map(|r| r.as_secs_f64() * 1e3),
                }));
            }
            if self.history.len() == MAX_HISTORY {
                self.history.pop_front();
            }
            self.history.push_back(Hit {
                t: now,
                cost: 1,
                allowed,
            });
        }
        out
    }

    /// Admitted cost of strategy `s` with times in `[from, to)`.
    fn admitted_between(&self, s: usize, from: u64, to: u64) -> u64 {
        self.history
            .iter()
            .filter(|h| h.allowed[s] && h.t >= from && h.t < to)
            .map(|h| u64::from(h.cost))
            .sum()
    }

    /// Everything the page draws, at `now`: counts, and per strategy the state read from a peek
    /// (`remaining`, `reset`) and the windows it is counted in.
    fn state(&self, engines: &Engines, now: u64) -> serde_json::Value {
        engines.clock.set_nanos(now);
        let w = self.settings.period_nanos();
        let aligned = now - now % w;
        let panels: Vec<_> = Strategy::ALL
            .iter()
            .enumerate()
            .map(|(s, &strategy)| {
                // Cost 0: a peek.
                let d: Decision = engines.limiters[s].check_rule_now(&self.rules[s], &self.key, 0);
                let reset = d.reset_after().as_nanos() as u64;
                let mut p = json!({
                    "strategy": strategy.name(),
                    "allowed": self.totals[s].0,
                    "blocked": self.totals[s].1,
                    "limit": d.limit(),
                    "remaining": d.remaining(),
                    "reset_ms": reset as f64 / 1e6,
                });
                let window = |from: u64, to: u64| {
                    json!({"start_ms": self.ms(from), "end_ms": self.ms(to),
                           "count": self.admitted_between(s, from, to)})
                };
                match strategy {
                    Strategy::FixedWindow => p["window"] = window(aligned, aligned + w),
                    Strategy::FixedWindowFirstHit => {
                        // A window is open while something is counted; it ends at the reset.
                        if d.remaining() < d.limit() {
                            let end = now + reset;
                            p["window"] = window(end.saturating_sub(w), end);
                        }
                    }
                    Strategy::SlidingWindow => {
                        let weight = 1.0 - (now - aligned) as f64 / w as f64;
                        p["window"] = window(aligned, aligned + w);
                        let mut prev = window(aligned.saturating_sub(w), aligned);
                        prev["weight"] = json!(weight);
                        p["previous"] = prev;
                    }
                    Strategy::MovingWindow => {
                        // The trailing period: an entry at t counts until t + W.
                        p["window"] = window(now.saturating_sub(w) + 1, now + 1);
                    }
                    _ => {
                        p["bucket"] = json!({
                            "capacity": d.limit(),
                            // Token bucket: tokens left; leaky bucket: water in it.
                            "level": if strategy == Strategy::TokenBucket {
                                d.remaining()
                            } else {
                                d.limit() - d.remaining()
                            },
                        });
                    }
                }
                p
            })
            .collect();
        json!({
            "now_ms": self.ms(now),
            "start_unix_ns": self.start.to_string(),
            "settings": self.settings,
            "panels": panels,
            "hits": self.history.iter().map(|h| h.t.to_string()).collect::<Vec<_>>(),
        })
    }
}

/// The server's state: the sessions and where time comes from.
struct App {
    /// A session unused for this long is dropped.
    idle: Duration,
    registry: Mutex<Registry>,
    clock: SystemClock,
    next_id: Mutex<u64>,
}

impl App {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live session `id`, marked as used now, and the limiters; an expired session is dropped
    /// and not found.
    fn session<'a>(
        &self,
        registry: &'a mut Registry,
        id: &str,
    ) -> Option<(&'a mut Session, &'a Engines)> {
        if registry.sessions.get(id)?.last_used.elapsed() >= self.idle {
            registry.remove(id);
            return None;
        }
        let Registry { sessions, engines } = registry;
        let session = sessions.get_mut(id)?;
        session.last_used = Instant::now();
        Some((session, engines))
    }

    fn new_id(&self) -> String {
        let mut n = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.wrapping_add(1);
        // Unguessable enough for a demo: the counter mixed with the time.
        let mixed = (*n ^ self.clock.now().rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!("{mixed:016x}{:x}", *n)
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

/// The JSON body, or the `400` answer for a malformed one.
fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("bad request body: {e}"),
        ))
    })
}

async fn create_session(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let settings = if body.iter().all(u8::is_ascii_whitespace) {
        Settings::default()
    } else {
        match parse::<Settings>(&body) {
            Ok(s) => s,
            Err(r) => return *r,
        }
    };
    let id = app.new_id();
    let mut registry = app.registry();
    // Read under the lock, so the shared clock is set in the order requests are served.
    let now = app.clock.now();
    let session = match Session::new(id.clone(), settings, now) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let idle = app.idle;
    let expired: Vec<String> = registry
        .sessions
        .iter()
        .filter(|(_, s)| s.last_used.elapsed() >= idle)
        .map(|(k, _)| k.clone())
        .collect();
    for k in expired {
        registry.remove(&k);
    }
    while registry.sessions.len() >= MAX_SESSIONS {
        let oldest = registry
            .sessions
            .iter()
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => registry.remove(&k),
            None => break,
        }
    }
    let mut state = session.state(&registry.engines, now);
    state["session"] = json!(id);
    registry.sessions.insert(id, session);
    axum::Json(state).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HitRequest {
    session: String,
    #[serde(default = "one")]
    count: u32,
}

fn one() -> u32 {
    1
}

async fn hit(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let req = match parse::<HitRequest>(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if !(1..=MAX_HIT_COUNT).contains(&req.count) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("count must be between 1 and {MAX_HIT_COUNT}"),
        );
    }
    let mut registry = app.registry();
    // Read under the lock, so the shared clock is set in the order requests are served.
    let now = app.clock.now();
    let Some((session, engines)) = app.session(&mut registry, &req.session) else {
        return error(StatusCode::NOT_FOUND, "unknown or expired session");
    };
    let decisions = session.hit(engines, now, req.count);
    let mut state = session.state(engines, now);
    state["decisions"] = json!(decisions);
    axum::Json(state).into_response()
}

#[derive(Deserialize)]
struct StateQuery {
    session: String,
}

async fn state(
    State(app): State<Arc<App>>,
    query: Result<Query<StateQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error(StatusCode::BAD_REQUEST, "expected ?session=ID");
    };
    let mut registry = app.registry();
    // Read under the lock, so the shared clock is set in the order requests are served.
    let now = app.clock.now();
    let Some((session, engines)) = app.session(&mut registry, &q.session) else {
        return error(StatusCode::NOT_FOUND, "unknown or expired session");
    };
    axum::Json(session.state(engines, now)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatRequest {
    session: String,
    user: String,
}

async fn chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let req = match parse::<ChatRequest>(&body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if req.user.is_empty() || req.user.len() > 32 {
        return error(StatusCode::BAD_REQUEST, "user must be 1 to 32 bytes");
    }
    let mut registry = app.registry();
    // Read under the lock, so the shared clock is set in the order requests are served.
    let now = app.clock.now();
    let Some((session, engines)) = app.session(&mut registry, &req.session) else {
        return error(StatusCode::NOT_FOUND, "unknown or expired session");
    };
    let key = format!("{}/{}", session.key, req.user);
    engines.clock.set_nanos(now);
    let d = engines.chat.check_now(&key, 1);
    axum::Json(json!({
        "user": req.user,
        "allowed": d.is_allowed(),
        "remaining": d.remaining(),
        "retry_ms": d.retry_after().map(|r| r.as_secs_f64() * 1e3),
    }))
    .into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
        .route(
            "/favicon.ico",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
        .route("/api/session", post(create_session))
        .route("/api/hit", post(hit))
        .route("/api/state", get(state))
        .route("/api/chat", post(chat))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not found") })
        .with_state(app)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("playground: cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("playground: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on http://{addr}");
    let engines = match Engines::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("playground: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = Arc::new(App {
        registry: Mutex::new(Registry {
            sessions: HashMap::new(),
            engines,
        }),
        clock: SystemClock::new(),
        idle: Duration::from_secs(args.session_idle),
        next_id: Mutex::new(0),
    });
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match axum::serve(listener, router(app))
        .with_graceful_shutdown(shutdown)
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("playground: {e}");
            ExitCode::FAILURE
        }
    }
}
