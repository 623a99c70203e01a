//! Rate-limit headers, the default responses (429, 400, 503), and the rejection hook.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::body::ResponseBody;
use super::numbers::{Numbers, num};
use crate::decision::{Decision, Outcome, ceil_nanos_to_secs};
use crate::rule::Rule;

/// `x-ratelimit-limit`.
pub(crate) static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`.
pub(crate) static X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`.
pub(crate) static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `ratelimit` (IETF draft structured field).
pub(crate) static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `ratelimit-policy` (IETF draft structured field).
pub(crate) static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// How `x-ratelimit-reset` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds from now, rounded up (the default).
    #[default]
    Delta,
    /// Unix time in seconds, rounded up, from the store's clock.
    Unix,
}

/// Which rate-limit header fields are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (the default).
    #[default]
    XRateLimit,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy` fields
    /// (draft-ietf-httpapi-ratelimit-headers-11).
    Ietf,
    /// Both.
    Both,
}

/// What the layer does when the store fails (Redis down, a timeout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through, without rate-limit headers; log a warning (at most about once a
    /// second) and count it in [`Stats::fail_open`](crate::Stats::fail_open). The default.
    #[default]
    FailOpen,
    /// Answer `503 Service Unavailable`.
    FailClosed,
}

/// The header settings a service writes with.
#[derive(Clone, Debug)]
pub(crate) struct HeaderConfig {
    pub(crate) on_allowed: bool,
    pub(crate) style: HeaderStyle,
    pub(crate) reset: ResetFormat,
    pub(crate) policy_name: Arc<str>,
    pub(crate) numbers: Numbers,
    /// The secret of the `pk` parameter; `None`: no `pk`.
    pub(crate) pk: Option<super::ietf::PkSecret>,
    /// The `qu` parameter; `None`: requests (not written).
    pub(crate) quota_unit: Option<Arc<str>>,
    /// The most whole seconds added at random to `t` on an allowed response.
    pub(crate) jitter: u64,
}

impl Default for HeaderConfig {
    fn default() -> Self {
        Self {
            on_allowed: true,
            style: HeaderStyle::default(),
            reset: ResetFormat::default(),
            policy_name: Arc::from("default"),
            numbers: Numbers::default(),
            pk: None,
            quota_unit: None,
            jitter: 0,
        }
    }
}

impl HeaderConfig {
    /// The default settings, with the numbers of `rule` rendered once.
    pub(crate) fn for_rule(rule: &Rule) -> Self {
        Self {
            numbers: Numbers::for_rule(rule),
            ..Self::default()
        }
    }
}

/// Writes the rate-limit fields for `d` (replacing any the inner service set, never duplicating
/// them), and `Retry-After` when `d` is a rejection that waiting can cure.
///
/// `pk` is the request's partition key (`:BASE64:`), written on the IETF items when set.
pub(crate) fn write_headers(
    headers: &mut HeaderMap,
    d: &Decision,
    rule: &Rule,
    cfg: &HeaderConfig,
    pk: Option<&str>,
) {
    let reset = match cfg.reset {
        ResetFormat::Delta => d.reset_secs(),
        ResetFormat::Unix => d.reset_unix_secs(),
    };
    if matches!(cfg.style, HeaderStyle::XRateLimit | HeaderStyle::Both) {
        let numbers = &cfg.numbers;
        headers.insert(X_RATELIMIT_LIMIT.clone(), numbers.get(u64::from(d.limit())));
        headers.insert(
            X_RATELIMIT_REMAINING.clone(),
            numbers.get(u64::from(d.remaining())),
        );
        headers.insert(X_RATELIMIT_RESET.clone(), num(reset));
    }
    if matches!(cfg.style, HeaderStyle::Ietf | HeaderStyle::Both) {
        write_ietf(headers, d, rule, cfg, pk);
    }
    if let Some(secs) = d.retry_after_secs() {
        headers.insert(RETRY_AFTER, num(secs));
    }
}

/// The IETF draft's `RateLimit-Policy` and `RateLimit` fields for `d`. Out of line: the default
/// fields' path stays a short stretch of code.
#[inline(never)]
fn write_ietf(
    headers: &mut HeaderMap,
    d: &Decision,
    rule: &Rule,
    cfg: &HeaderConfig,
    pk: Option<&str>,
) {
    let mut policy = String::new();
    for (i, (q, p)) in rule.quotas().iter().zip(rule.nanos()).enumerate() {
        if i > 0 {
            policy.push_str(", ");
        }
        // A bucket admits B at once and then one per T: B per B x T is the rate it advertises
        // without misstating it (10/s with burst 50 is 50 per 5 s, not 50 per second).
        let (limit, window) = if rule.strategy().is_bucket() {
            (q.burst(), p.tau())
        } else {
            (q.limit(), q.period_nanos())
        };
        let window = ceil_nanos_to_secs(window).max(1);
        let _ = write!(policy, "\"{}\";q={limit}", item_name(cfg, rule, i));
        if let Some(unit) = &cfg.quota_unit {
            let _ = write!(policy, ";qu=\"{}\"", escape_sf_string(unit));
        }
        let _ = write!(policy, ";w={window}");
        if let Some(pk) = pk {
            let _ = write!(policy, ";pk={pk}");
        }
    }
    // On a rejection `t` is `Retry-After`: the time until the request would pass.
    let t = match d.retry_after_secs() {
        Some(secs) => secs,
        None => d.reset_secs() + super::ietf::jitter(cfg.jitter),
    };
    let mut current = format!(
        "\"{}\";r={};t={t}",
        item_name(cfg, rule, d.quota_index()),
        d.remaining(),
    );
    if let Some(pk) = pk {
        let _ = write!(current, ";pk={pk}");
    }
    if let Ok(v) = HeaderValue::from_str(&policy) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&current) {
        headers.insert(RATELIMIT.clone(), v);
    }
}

/// Which limit of a rules file rejected a request, and its decision: in the extensions of the
/// `429` the rules layer answers, so that an outer layer can answer with a page of its own (the
/// `login` example does). Public as `tollgate::rules::RejectedBy`; without the `rules` feature
/// nothing builds it.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[cfg_attr(not(feature = "rules"), allow(dead_code, unreachable_pub))]
pub struct RejectedBy {
    /// The limit's name.
    pub limit: std::sync::Arc<str>,
    /// Its decision (the wait is [`Decision::retry_after`]).
    pub decision: Decision,
}

/// Whether a response (its `extensions`) is a rejection by a layer inside (a rate-limit layer's or a rules layer's `429`, a
/// concurrency cap's): it keeps its own, more telling, fields.
pub(crate) fn rejected_inside(extensions: &http::Extensions) -> bool {
    extensions.get::<RejectedBy>().is_some()
        || extensions.get::<Decision>().is_some()
        || extensions.get::<super::concurrency::OverCap>().is_some()
}

/// What the limiter whose `x-ratelimit-*` fields an allowed response carries reported, for the
/// layers around it: in the response's extensions, put there by a layer that wrote the fields
/// (plain or rules) when another may enclose it ([`Layers::report`](super::core::Layers::report)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reported {
    limit: u32,
    remaining: u32,
    reset_after: std::time::Duration,
}

/// What a layer inside reported on this response, taken out (none when the response carries no
/// extension at all: one layer alone, the usual case, does not look further).
#[inline]
pub(crate) fn reported_inside(extensions: &mut http::Extensions) -> Option<Reported> {
    if extensions.is_empty() {
        return None;
    }
    extensions.remove::<Reported>()
}

/// The fields of an allowed response under stacked layers: every limiter adds its items to the
/// IETF fields (`RateLimit-Policy`: one per quota, `RateLimit`: one for the limiter), and the
/// `x-ratelimit-*` fields come from the limiter with the fewest remaining (ties: the later reset),
/// so a client sees the budget that runs out first.
/// `below` is what the layers inside reported; the answer is what this one's enclosing layers see.
pub(crate) fn write_allowed_headers(
    below: Option<Reported>,
    headers: &mut HeaderMap,
    d: &Decision,
    rule: &Rule,
    cfg: &HeaderConfig,
    pk: Option<&str>,
) -> Reported {
    let mine = (d.remaining(), std::cmp::Reverse(d.reset_after()));
    let wins = below.is_none_or(|r| mine < (r.remaining, std::cmp::Reverse(r.reset_after)));
    if below.is_none() {
        write_headers(headers, d, rule, cfg, pk);
    } else {
        join_stacked(below, wins, headers, d, rule, cfg, pk);
    }
    match below {
        Some(r) if !wins => r,
        _ => Reported {
            limit: d.limit(),
            remaining: d.remaining(),
            reset_after: d.reset_after(),
        },
    }
}

/// This layer's fields joined with those of the layers inside (`below`; `wins`: this layer's
/// budget runs out first). Out of line: a lone layer's path stays a short stretch of code.
#[inline(never)]
fn join_stacked(
    below: Option<Reported>,
    wins: bool,
    headers: &mut HeaderMap,
    d: &Decision,
    rule: &Rule,
    cfg: &HeaderConfig,
    pk: Option<&str>,
) {
    // Item names stay unique per response: a name an inner limiter's items hold gets a suffix.
    let renamed = headers
        .get(&RATELIMIT_POLICY)
        .filter(|_| matches!(cfg.style, HeaderStyle::Ietf | HeaderStyle::Both))
        .and_then(|inner| {
            let taken = super::ietf::item_names(inner.as_bytes());
            let n = rule.quotas().len();
            let name = super::ietf::unique_name(&cfg.policy_name, &taken, |name| {
                let escaped = escape_sf_string(name).into_owned();
                match n {
                    1 => vec![escaped],
                    _ => (0..n).map(|i| format!("{escaped}-{i}")).collect(),
                }
            })?;
            let mut renamed = cfg.clone();
            renamed.policy_name = Arc::from(name);
            Some(renamed)
        });
    let cfg = renamed.as_ref().unwrap_or(cfg);
    let mut own = HeaderMap::new();
    write_headers(&mut own, d, rule, cfg, pk);
    for (name, value) in own {
        let Some(name) = name else { continue };
        let ietf = name == RATELIMIT || name == RATELIMIT_POLICY;
        match headers.get(&name) {
            // One list per field: this limiter's items after the inner ones'.
            Some(inner) if ietf => {
                let mut joined = inner.as_bytes().to_vec();
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(value.as_bytes());
                if let Ok(v) = HeaderValue::from_bytes(&joined) {
                    headers.insert(name, v);
                }
            }
            _ if ietf || wins => {
                headers.insert(name, value);
            }
            _ => {}
        }
    }
    // The tightest inner limiter wrote no `x-ratelimit-*` fields (IETF fields only): the
    // ones there (if any) are a looser layer's. This layer's style asks for them, so they
    // carry the tightest limiter's numbers.
    if let Some(r) = below.filter(|_| !wins) {
        let shows = |name: &HeaderName, n: u32| {
            headers
                .get(name)
                .is_some_and(|v| v.as_bytes() == n.to_string().as_bytes())
        };
        let tightest_shown =
            shows(&X_RATELIMIT_LIMIT, r.limit) && shows(&X_RATELIMIT_REMAINING, r.remaining);
        if matches!(cfg.style, HeaderStyle::XRateLimit | HeaderStyle::Both) && !tightest_shown {
            for name in [
                &X_RATELIMIT_LIMIT,
                &X_RATELIMIT_REMAINING,
                &X_RATELIMIT_RESET,
            ] {
                if let Some(v) = reported_field(name, r, d, cfg) {
                    headers.insert(name.clone(), v);
                }
            }
        }
    }
}

/// The `x-ratelimit-*` field `name` for what an inner limiter reported (`None` for another
/// field), its reset as of this layer's decision `d`.
fn reported_field(
    name: &HeaderName,
    r: Reported,
    d: &Decision,
    cfg: &HeaderConfig,
) -> Option<HeaderValue> {
    let reset_after = u64::try_from(r.reset_after.as_nanos()).unwrap_or(u64::MAX);
    if *name == X_RATELIMIT_LIMIT {
        Some(cfg.numbers.get(u64::from(r.limit)))
    } else if *name == X_RATELIMIT_REMAINING {
        Some(cfg.numbers.get(u64::from(r.remaining)))
    } else if *name == X_RATELIMIT_RESET {
        let time = u64::try_from(d.time().as_nanos()).unwrap_or(u64::MAX);
        Some(num(match cfg.reset {
            ResetFormat::Delta => ceil_nanos_to_secs(reset_after),
            ResetFormat::Unix => ceil_nanos_to_secs(time.saturating_add(reset_after)),
        }))
    } else {
        None
    }
}

/// The IETF item name of quota `i` of `rule`: the policy name, or `NAME-i` with several quotas.
/// Borrowed when the name needs no escaping and the rule has one quota (a rejection names it).
pub(crate) fn item_name<'a>(cfg: &'a HeaderConfig, rule: &Rule, i: usize) -> Cow<'a, str> {
    let name = escape_sf_string(&cfg.policy_name);
    if rule.quotas().len() > 1 {
        Cow::Owned(format!("{name}-{i}"))
    } else {
        name
    }
}

/// `s` as the content of a structured-field string: printable ASCII, `"` and `\` escaped (borrowed
/// when nothing needs it, the usual case).
fn escape_sf_string(s: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii() && !c.is_ascii_control() && c != '"' && c != '\\';
    if s.chars().all(plain) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars().filter(|c| c.is_ascii() && !c.is_ascii_control()) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    Cow::Owned(out)
}

/// Builds the response for a rejected request. The layer then adds the rate-limit headers,
/// `Retry-After`, and the [`Decision`] (in the response's extensions) to whatever it returns.
///
/// Implemented by [`ProblemJson`]; implement it for a responder of your own, generic over every
/// body `B: From<String>` (as `ProblemJson` is), and give it to
/// [`RateLimitLayer::respond_with`](super::RateLimitLayer::respond_with) or
/// [`ConcurrencyLayer::respond_with`](super::ConcurrencyLayer::respond_with). For the `429` alone, a
/// closure given to [`RateLimitLayer::on_rejected`](super::RateLimitLayer::on_rejected) is
/// shorter.
pub trait OnRejected<B>: Send + Sync + 'static {
    /// The response for a request rejected with `decision` (its outcome is
    /// [`Outcome::Rejected`] or [`Outcome::Exceeds`]).
    fn on_rejected(&self, decision: &Decision) -> Response<B>;

    /// The response for a request rejected with `decision`, given the names of the violated
    /// policies (the IETF item names of the rejecting quota, as `RateLimit` names them). The layer
    /// calls this one; the default ignores the names and calls
    /// [`on_rejected`](Self::on_rejected). [`ProblemJson`] lists them in `violated-policies`.
    fn on_rejected_by(&self, decision: &Decision, violated: &[&str]) -> Response<B> {
        let _ = violated;
        self.on_rejected(decision)
    }

    /// The response for a request the layer answers on its own for another reason: no key
    /// (`400`, or the status of a [`KeyPolicy`](super::KeyPolicy)), or the store failed while the layer
    /// fails closed (`503`). The default is a short text/plain response; implement it to answer
    /// every refusal in one format (see [`ProblemJson`]).
    fn on_refused(&self, refusal: Refusal<'_>) -> Response<B>
    where
        B: From<String>,
    {
        match refusal {
            Refusal::NoKey { status, error } => text(status, format!("{error}\n")),
            Refusal::StoreFailed(_) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: the rate limiter cannot decide.\n".to_owned(),
            ),
            Refusal::OverCap { cap, waited } => text(
                StatusCode::TOO_MANY_REQUESTS,
                format!("Too Many Requests: {}\n", over_cap_detail(cap, waited)),
            ),
        }
    }
}

/// The body of the layer's own answers as a hook builds them, before they take the inner
/// service's body type ([`ResponseBody::cast`]).
pub(crate) type OwnBody = ResponseBody<std::convert::Infallible>;

/// A layer's rejection hook, type-erased: the closure of
/// [`RateLimitLayer::on_rejected`](super::RateLimitLayer::on_rejected) or the responder of
/// [`respond_with`](super::RateLimitLayer::respond_with).
pub(crate) trait Responder: Send + Sync + 'static {
    /// The `429` for `d`, given the names of the violated policies.
    fn rejected(&self, d: &Decision, violated: &[&str]) -> Response<OwnBody>;
    /// The answer to another refusal (no key, the store failed).
    fn refused(&self, refusal: Refusal<'_>) -> Response<OwnBody>;
}

/// A responder ([`OnRejected`]) as a layer's hook.
pub(crate) struct Responding<R>(pub(crate) R);

impl<R: OnRejected<OwnBody>> Responder for Responding<R> {
    fn rejected(&self, d: &Decision, violated: &[&str]) -> Response<OwnBody> {
        self.0.on_rejected_by(d, violated)
    }

    fn refused(&self, refusal: Refusal<'_>) -> Response<OwnBody> {
        self.0.on_refused(refusal)
    }
}

/// A closure of the decision as a layer's hook: it builds the `429`; other refusals keep the
/// default answers.
pub(crate) struct Replying<F>(pub(crate) F);

impl<F, T> Responder for Replying<F>
where
    F: Fn(&Decision) -> T + Send + Sync + 'static,
    T: Reply,
{
    fn rejected(&self, d: &Decision, _violated: &[&str]) -> Response<OwnBody> {
        (self.0)(d).reply()
    }

    fn refused(&self, refusal: Refusal<'_>) -> Response<OwnBody> {
        DefaultRejection.on_refused(refusal)
    }
}

/// What a closure given to [`RateLimitLayer::on_rejected`](super::RateLimitLayer::on_rejected)
/// returns: with the `axum` feature anything `axum::response::IntoResponse`, otherwise an
/// `http::Response` whose body [`ResponseBody`] converts from. Not implemented outside this crate.
pub trait Reply {
    /// The response.
    fn reply(self) -> Response<OwnBody>;
}

#[cfg(feature = "axum")]
impl<T: axum::response::IntoResponse> Reply for T {
    fn reply(self) -> Response<OwnBody> {
        self.into_response().map(OwnBody::from)
    }
}

#[cfg(not(feature = "axum"))]
impl<B> Reply for Response<B>
where
    OwnBody: From<B>,
{
    fn reply(self) -> Response<OwnBody> {
        self.map(OwnBody::from)
    }
}

/// Why the layer answers a request on its own, other than a rate-limit decision.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Refusal<'a> {
    /// The request has no key.
    NoKey {
        /// The status to answer with (`400` unless configured).
        status: StatusCode,
        /// Why the key is missing.
        error: &'a crate::key::KeyError,
    },
    /// The store failed and the layer fails closed (`503`).
    StoreFailed(&'a crate::error::StoreError),
    /// A [`ConcurrencyLayer`](super::ConcurrencyLayer) is at its cap for the request's key
    /// (`429`, retry in 1 second); the layer adds `x-ratelimit-limit`, `x-ratelimit-remaining`
    /// and `Retry-After`.
    OverCap {
        /// The requests in flight allowed per key.
        cap: u32,
        /// How long the request waited for a slot (with `ConcurrencyLayer::wait`).
        waited: Option<std::time::Duration>,
    },
}

/// The default text of a [`Refusal::OverCap`] (after "Too Many Requests: ").
pub(crate) fn over_cap_detail(cap: u32, waited: Option<std::time::Duration>) -> String {
    let waited = waited.map_or_else(String::new, |w| {
        format!("; no slot came free within {} ms", w.as_millis())
    });
    format!(
        "at most {cap} request{} in flight per client{waited}; retry in 1 second.",
        if cap == 1 { "" } else { "s" }
    )
}

/// An [RFC 9457](https://www.rfc-editor.org/rfc/rfc9457) `application/problem+json` answer for
/// every response the layer makes on its own: `429` as the IETF draft's `quota-exceeded` problem
/// type (draft-ietf-httpapi-ratelimit-headers-11, section 5.1) with `violated-policies` (the item
/// names of the rejecting quota, as the `RateLimit` field names them) and `retry_after` in seconds
/// (absent when the cost can never be admitted); `400` without a key and `503` when failing closed
/// as `about:blank`.
///
/// ```
/// use tollgate::layer::{OnRejected, ProblemJson};
/// use tollgate::{ManualClock, RateLimiter, Strategy};
/// # use std::time::Duration;
/// let limiter = RateLimiter::<()>::builder()
///     .strategy(Strategy::FixedWindow)
///     .quotas("1/minute").unwrap()
///     .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
///     .build().unwrap();
/// limiter.check_now(&(), 1);
/// let res: http::Response<String> =
///     ProblemJson.on_rejected_by(&limiter.check_now(&(), 1), &["default"]);
/// assert_eq!(res.status(), 429);
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// assert_eq!(
///     res.body(),
///     r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"retry in 40 seconds","violated-policies":["default"],"retry_after":40}"#
/// );
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ProblemJson;

/// The `quota-exceeded` problem type of the IETF draft.
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// `s` as a JSON string, quotes included.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The body of a problem document: `type`, `title`, `status`, `detail`, then `extra` members
/// (already JSON).
fn problem(kind: &str, title: &str, status: StatusCode, detail: &str, extra: &str) -> String {
    format!(
        "{{\"type\":{},\"title\":{},\"status\":{},\"detail\":{}{extra}}}",
        json_string(kind),
        json_string(title),
        status.as_u16(),
        json_string(detail),
    )
}

/// A problem document of type `about:blank`, titled after the status.
fn blank_problem(status: StatusCode, detail: &str) -> String {
    let title = status.canonical_reason().unwrap_or("Error");
    problem("about:blank", title, status, detail, "")
}

fn problem_response<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut res = Response::new(B::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

impl<B: From<String>> OnRejected<B> for ProblemJson {
    /// The `quota-exceeded` problem without `violated-policies` (the layer calls
    /// [`on_rejected_by`](OnRejected::on_rejected_by), which names them).
    fn on_rejected(&self, d: &Decision) -> Response<B> {
        self.on_rejected_by(d, &[])
    }

    fn on_rejected_by(&self, d: &Decision, violated: &[&str]) -> Response<B> {
        let status = StatusCode::TOO_MANY_REQUESTS;
        let mut extra = String::new();
        if !violated.is_empty() {
            let names: Vec<String> = violated.iter().map(|n| json_string(n)).collect();
            let _ = write!(extra, ",\"violated-policies\":[{}]", names.join(","));
        }
        let detail = match d.retry_after_secs() {
            Some(secs) => {
                let _ = write!(extra, ",\"retry_after\":{secs}");
                format!("retry in {secs} second{}", plural(secs))
            }
            None => format!(
                "the request's cost exceeds the rate limit ({}); it can never be admitted",
                d.limit()
            ),
        };
        let title = "Request cannot be satisfied as assigned quota has been exceeded";
        problem_response(
            status,
            problem(QUOTA_EXCEEDED, title, status, &detail, &extra),
        )
    }

    fn on_refused(&self, refusal: Refusal<'_>) -> Response<B> {
        match refusal {
            Refusal::NoKey { status, error } => {
                problem_response(status, blank_problem(status, error.reason()))
            }
            Refusal::StoreFailed(_) => {
                let status = StatusCode::SERVICE_UNAVAILABLE;
                problem_response(
                    status,
                    blank_problem(status, "the rate limiter cannot decide"),
                )
            }
            Refusal::OverCap { cap, waited } => {
                let status = StatusCode::TOO_MANY_REQUESTS;
                let title = "Request cannot be satisfied as assigned quota has been exceeded";
                let detail = over_cap_detail(cap, waited);
                problem_response(
                    status,
                    problem(QUOTA_EXCEEDED, title, status, &detail, ",\"retry_after\":1"),
                )
            }
        }
    }
}

/// The default rejection: `429 Too Many Requests` with a short text/plain body that says when to
/// retry, or that the request's cost can never be admitted; the other refusals text/plain too.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRejection;

impl<B: From<String>> OnRejected<B> for DefaultRejection {
    fn on_rejected(&self, d: &Decision) -> Response<B> {
        let body = match (d.outcome(), d.retry_after_secs()) {
            (Outcome::Exceeds, _) => format!(
                "Too Many Requests: the request's cost exceeds the rate limit ({}); it can never be admitted.\n",
                d.limit()
            ),
            (_, Some(secs)) => {
                // Pieces instead of `format!`: this is the flood path.
                let mut body = String::with_capacity(48);
                body.push_str("Too Many Requests: retry in ");
                body.push_str(itoa::Buffer::new().format(secs));
                body.push_str(" second");
                body.push_str(plural(secs));
                body.push_str(".\n");
                body
            }
            _ => "Too Many Requests.\n".to_owned(),
        };
        text(StatusCode::TOO_MANY_REQUESTS, body)
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A text/plain response.
pub(crate) fn text<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut res = Response::new(B::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN.clone());
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, RateLimiter, Strategy};
    use std::time::Duration;

    #[test]
    fn ietf_fields_and_escaping() {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let lim = RateLimiter::<()>::builder()
            .strategy(Strategy::TokenBucket)
            .quotas("10/minute")
            .unwrap()
            .burst(std::num::NonZeroU32::new(4).unwrap())
            .clock(clock)
            .build()
            .unwrap();
        let d = lim.check_now(&(), 1);
        let cfg = HeaderConfig {
            style: HeaderStyle::Ietf,
            policy_name: Arc::from("a\"b"),
            ..HeaderConfig::default()
        };
        let mut h = HeaderMap::new();
        write_headers(&mut h, &d, lim.rule(), &cfg, None);
        assert_eq!(
            h["ratelimit-policy"], "\"a\\\"b\";q=4;w=24",
            "q is the burst, w the time it takes to drain (B x T)"
        );
        assert_eq!(h["ratelimit"], "\"a\\\"b\";r=3;t=6");
        assert!(h.get("x-ratelimit-limit").is_none());
        assert!(h.get("retry-after").is_none());
    }

    #[test]
    fn large_numbers_render_exactly_whether_cached_or_not() {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let lim = RateLimiter::<()>::builder()
            .strategy(Strategy::FixedWindow)
            .quotas("1000000000/second; 5000/minute")
            .unwrap()
            .clock(clock)
            .build()
            .unwrap();
        let cfg = HeaderConfig::for_rule(lim.rule());
        assert_eq!(cfg.numbers.cached(), 2, "both limits are cached");
        for (n, text) in [
            (1_000_000_000, "1000000000"),
            (5000, "5000"),
            (4999, "4999"),
            (4096, "4096"),
            (4095, "4095"),
            (0, "0"),
            (u64::MAX, "18446744073709551615"),
        ] {
            assert_eq!(cfg.numbers.get(n), text);
            assert_eq!(cfg.numbers.get(n), text, "a second use of a cached value");
        }
        let d = lim.check_now(&(), 1);
        let mut h = HeaderMap::new();
        write_headers(&mut h, &d, lim.rule(), &cfg, None);
        assert_eq!(
            h["x-ratelimit-limit"], "5000",
            "the minute quota has fewer left"
        );
        assert_eq!(h["x-ratelimit-remaining"], "4999");
    }

    #[test]
    fn default_rejection_bodies() {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let lim = RateLimiter::<()>::builder()
            .strategy(Strategy::FixedWindow)
            .quotas("1/second")
            .unwrap()
            .clock(clock)
            .build()
            .unwrap();
        let never = lim.check_now(&(), 2);
        let res: Response<String> = DefaultRejection.on_rejected(&never);
        assert!(
            res.body().contains("can never be admitted"),
            "{}",
            res.body()
        );
        lim.check_now(&(), 1);
        let later = lim.check_now(&(), 1);
        let res: Response<String> = DefaultRejection.on_rejected(&later);
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.body(), "Too Many Requests: retry in 1 second.\n");
        assert_eq!(res.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        let lim = RateLimiter::<()>::builder()
            .strategy(Strategy::TokenBucket)
            .quotas("1/minute")
            .unwrap()
            .clock(ManualClock::new(Duration::from_secs(1_700_000_000)))
            .build()
            .unwrap();
        lim.check_now(&(), 1);
        let res: Response<String> = DefaultRejection.on_rejected(&lim.check_now(&(), 1));
        assert_eq!(res.body(), "Too Many Requests: retry in 60 seconds.\n");
    }
}
