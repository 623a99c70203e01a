//! Limits from a TOML rules file (feature `rules`): matched per path and method, decided
//! all-or-nothing across their keys, reloaded without losing state, with shadow limits and
//! metrics. The schema, what a request is decided on, settlement, headers, errors and reloads are
//! in the guide's chapter [rules files and reloads](crate::guide::rules).
//!
//! [`Rules::layer`] is a [`RateLimitLayer`](crate::layer::RateLimitLayer), the pipeline of a single
//! limiter with a file's limits in place of the limiter: its response hooks,
//! gRPC answers, failure policy (the [`RulesOptions`]' by default), pacing and `skip` apply here
//! too, and it wraps any inner service body (tonic's included).
//!
//! The sources, by concern: `file.rs` (the schema, parsed with lines and columns), `compile.rs`
//! (a file's limits, their limiters kept by name across reloads, tiers), `keys.rs` (a request's
//! key), `enforce.rs` (the enforced limits decided all or nothing), `limits.rs` (a request through
//! its limits: queues, shadow limits, settlement, headers), `reload.rs` (reloads and watching),
//! `named.rs` (keys registered in code), `slots.rs` (concurrency caps), `store_kind.rs` (what the
//! file needs of its store: the Redis store's local fallback per limit, its leases for caps).

mod compile;
mod decided;
mod enforce;
mod file;
mod keys;
mod limits;
mod named;
mod reload;
mod slots;
mod store_kind;
use crate::metrics;
use enforce::Held;
pub use reload::ReloadReport;
use reload::{content_hash, read_rules};

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Response;
use http::request::Parts;

pub use named::NamedKeys;

// The schema's Rust types are internal: the TOML keys are the contract.
use file::{FailMode, LimitSpec, SettleSpec};
pub use file::{MissingKey, RulesError};
pub use metrics::{METRIC_NAMES, STORE_LATENCY_BUCKETS};

use crate::key::{ForwardedIp, KeyExtractor, PeerIp};
use crate::layer::core::LAYERS;
pub use crate::layer::response::RejectedBy;
use crate::layer::response::{
    HeaderConfig, rejected_inside, reported_inside, write_allowed_headers,
};
use crate::layer::{
    ConcurrencyLimit, FailurePolicy, HeaderStyle, ResetFormat, Settle, SettleFrom, warn_bad_value,
};
use crate::store::{MemoryStore, MemoryStoreBuilder, Store};
use crate::{Clock, Decision, Op, RateLimiter, Rule, StoreError, SystemClock};
use metrics::LimitMetrics;

/// The settings that apply to every limit of a rules file (the `server` example's process-wide
/// flags).
#[derive(Clone, Debug)]
pub struct RulesOptions {
    /// Where the `ip` key comes from: the peer (the default), or a forwarded header of trusted
    /// proxies.
    pub ip: IpSource,
    /// A limit's `on_missing_key` when the file does not say (default: reject).
    pub on_missing_key: MissingKey,
    /// On a store failure (default: let the request through).
    pub failure: FailurePolicy,
    /// How `x-ratelimit-reset` is written.
    pub reset: ResetFormat,
    /// Which header fields are written.
    pub header_style: HeaderStyle,
    /// Write `x-ratelimit-shadow-limit`, `-remaining`, `-reset` for the shadow limit with the
    /// fewest remaining (default: off; shadow limits write no headers).
    pub shadow_headers: bool,
    /// Key extractors registered by name, for a file's `key = "NAME"` and `tier = "NAME"`
    /// (default: none; see [`RulesOptions::key`]).
    pub keys: NamedKeys,
}

impl RulesOptions {
    /// Registers `extractor` under `name`, so that the file can key a limit by it (`key = "user"`,
    /// or in a composite before any header: `"user+ip"`) or read tiers from it (`tier = "plan"`):
    /// e.g. a user id or a plan an authentication layer put in the request's extensions.
    ///
    /// ```
    /// use tollgate::key::ExtensionKey;
    /// use tollgate::rules::{Rules, RulesOptions};
    ///
    /// #[derive(Clone, Hash, PartialEq, Eq)]
    /// struct UserId(String);
    /// impl tollgate::store::StoreKey for UserId {
    ///     fn encode(&self, out: &mut Vec<u8>) {
    ///         out.extend_from_slice(self.0.as_bytes());
    ///     }
    /// }
    ///
    /// let options = RulesOptions::default()
    ///     .key("user", ExtensionKey::<UserId>::new())
    ///     .unwrap();
    /// let rules = Rules::memory(
    ///     "[[limit]]\nname = \"per-user\"\nkey = \"user\"\nquotas = \"100/hour\"\n",
    ///     options,
    /// );
    /// assert!(rules.is_ok());
    /// ```
    ///
    /// # Errors
    /// [`RulesError`] for a name outside `[a-z0-9_-]{1,64}`, or `ip` or `global`.
    pub fn key<X: KeyExtractor>(mut self, name: &str, extractor: X) -> Result<Self, RulesError> {
        self.keys.insert(name, extractor)?;
        Ok(self)
    }
}

impl Default for RulesOptions {
    fn default() -> Self {
        Self {
            ip: IpSource::Peer(PeerIp::default()),
            on_missing_key: MissingKey::Reject,
            failure: FailurePolicy::FailOpen,
            reset: ResetFormat::Delta,
            header_style: HeaderStyle::XRateLimit,
            shadow_headers: false,
            keys: NamedKeys::default(),
        }
    }
}

/// Where the `ip` key part comes from.
#[derive(Clone, Debug)]
pub enum IpSource {
    /// The connection's peer.
    Peer(PeerIp),
    /// The forwarded header of trusted proxies.
    Forwarded(ForwardedIp),
}

/// The limiter of a limit's name: kept across reloads, and shared by every version of the rules
/// that has the name (a name removed and added back while older rules are still in use finds it
/// again: its name is taken on the store until the last version holding it is dropped).
type SharedLimiter<St, C> = Arc<RateLimiter<Vec<u8>, St, C>>;

/// A limit ready to decide: its spec, limiter, key reader, header settings and metric handles.
struct Limit<St, C> {
    spec: LimitSpec,
    /// The limiter of the limit's name, kept across reloads.
    limiter: SharedLimiter<St, C>,
    /// The rule when it is not the limiter's own (changed by a reload: a state of its own).
    rule: Option<Rule>,
    /// The first bytes of every key: a hash of the key spec, so a changed key starts fresh.
    key_tag: [u8; 4],
    missing_global: bool,
    headers: HeaderConfig,
    metrics: LimitMetrics,
    /// The response header a `settle = "header:NAME"` limit reads.
    settle_from: Option<SettleFrom>,
    /// Whether an unusable settle value was warned about (once per limit).
    settle_warned: Arc<std::sync::atomic::AtomicBool>,
    /// The cap on requests in flight per key (`concurrency`), its counts kept across reloads.
    cap: Option<ConcurrencyLimit<Vec<u8>>>,
    /// For a limit with tiers, the requests this version of it decides (one tier, or the
    /// default): each tier is a limit of its own here, on the limit's limiter.
    tier: Option<TierMatch>,
}

/// Which requests one tier of a limit decides: those whose tier value (a header or a registered
/// key) is `want`, or, for the default tier, any other value or none.
struct TierMatch {
    from: file::KeyPart,
    /// `None`: the default tier.
    want: Option<Box<[u8]>>,
    /// Every listed tier's value.
    listed: Arc<[Box<[u8]>]>,
}

impl TierMatch {
    /// Whether the request `parts` is of this tier (the first value of a repeated header).
    fn matches(&self, parts: &Parts, options: &RulesOptions) -> bool {
        self.takes(self.value(parts, options).as_deref())
    }

    /// The request's tier value: the header's first value, or the registered key's bytes.
    fn value<'a>(
        &self,
        parts: &'a Parts,
        options: &RulesOptions,
    ) -> Option<std::borrow::Cow<'a, [u8]>> {
        match &self.from {
            file::KeyPart::Header(h) => parts
                .headers
                .get(h)
                .map(|v| std::borrow::Cow::Borrowed(v.as_bytes())),
            file::KeyPart::Named(n) => options
                .keys
                .extract(n, parts)
                .ok()
                .map(std::borrow::Cow::Owned),
            file::KeyPart::Ip | file::KeyPart::Global => None,
        }
    }

    /// Whether a request of tier value `value` is this tier's.
    fn takes(&self, value: Option<&[u8]>) -> bool {
        match &self.want {
            Some(want) => value == Some(&**want),
            None => value.is_none_or(|v| !self.listed.iter().any(|l| **l == *v)),
        }
    }

    /// The tiers of one limit share `listed`: what tells a limit's tiers from another's.
    fn limit_id(&self) -> *const () {
        Arc::as_ptr(&self.listed).cast()
    }

    /// Whether this is the limit's default tier (or the limit has none).
    fn is_default(tier: Option<&Self>) -> bool {
        tier.is_none_or(|t| t.want.is_none())
    }
}

/// One version of the rules: what a request is decided on from start to end.
struct Compiled<St, C> {
    limits: Box<[Limit<St, C>]>,
    /// No request can match two enforced limits (shaping queues and shadow limits aside): each
    /// request then decides one limit at most, through its limiter alone, and no reservation is
    /// ever rolled back, so none can be seen by another request (see [`lone_enforced`]).
    lone: bool,
    /// Requests no limit applies to.
    exempt: Box<[file::Exempt]>,
}

impl<St, C> Compiled<St, C> {
    /// The limit named `name` that decides `request` (its tier's, for a limit with tiers).
    fn limit_for(
        &self,
        name: &str,
        request: &Parts,
        options: &RulesOptions,
    ) -> Option<&Limit<St, C>> {
        self.limits.iter().find(|l| {
            l.spec.name == name && l.tier.as_ref().is_none_or(|t| t.matches(request, options))
        })
    }
}

/// The limiters still alive, by name (see [`Shared::limiters`]).
type Registry<St, C> = parking_lot::Mutex<HashMap<String, Weak<RateLimiter<Vec<u8>, St, C>>>>;

/// How a new limiter's store is made.
type MakeStore<St> = Box<dyn Fn() -> St + Send + Sync>;

struct Shared<St, C> {
    current: ArcSwap<Compiled<St, C>>,
    options: RulesOptions,
    make_store: MakeStore<St>,
    clock: C,
    /// Whether `clock` is the default one: each limit's limiter then gets the clock the builder
    /// would give it ([`SystemClock::suited_to`] its rule), as one limiter in code does.
    suited_clocks: bool,
    /// Every limiter a version of the rules still in use holds, by name: a reload that adds back
    /// a name whose limiter is still alive (requests in flight on older rules) reuses it instead
    /// of failing on the name, which the store keeps taken until that limiter is dropped.
    limiters: Registry<St, C>,
    /// Whether every limit has a store of its own (its stats are the limit's).
    own_stores: std::sync::atomic::AtomicBool,
    /// What the store does for a limit's `fail_mode = "local"`.
    local_fallback: store_kind::LocalFallback,
    /// Whether `fail_mode = "local"` on the memory store was warned about.
    local_warned: std::sync::atomic::AtomicBool,
    /// The content hash of the file last loaded.
    loaded: parking_lot::Mutex<[u8; 32]>,
    reloads: metrics::ReloadMetrics,
}

/// Limits from a rules file, shared by the layers built from it and swapped on reload. Cheap to
/// clone (an `Arc`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::{Router, body::Body, routing::post};
/// use tollgate::rules::{Rules, RulesOptions};
/// use tower::ServiceExt;
///
/// let rules = Rules::memory(
///     r#"
///     [[limit]]
///     name = "login-ip"
///     path = "/login"
///     methods = ["POST"]
///     key = "header:x-client"
///     quotas = "1/minute"
///     "#,
///     RulesOptions::default(),
/// )
/// .unwrap();
/// let app = Router::new().route("/login", post(|| async { "ok" })).layer(rules.layer());
/// let req = || http::Request::post("/login").header("x-client", "a").body(Body::empty()).unwrap();
/// assert_eq!(app.clone().oneshot(req()).await.unwrap().status(), 200);
/// assert_eq!(app.oneshot(req()).await.unwrap().status(), 429);
/// # }
/// ```
pub struct Rules<St = MemoryStore<Vec<u8>>, C = SystemClock> {
    shared: Arc<Shared<St, C>>,
}

impl<St, C> Clone for Rules<St, C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St, C> std::fmt::Debug for Rules<St, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .shared
            .current
            .load()
            .limits
            .iter()
            .map(|l| l.spec.name.clone())
            .collect();
        f.debug_struct("Rules").field("limits", &names).finish()
    }
}

impl Rules<MemoryStore<Vec<u8>>> {
    /// Rules from the text of a rules file, each limit on a memory store of its own.
    ///
    /// # Errors
    /// [`RulesError`] for a file that cannot be used.
    pub fn memory(text: &str, options: RulesOptions) -> Result<Self, RulesError> {
        Self::memory_with(text, options, MemoryStoreBuilder::default())
    }

    /// [`Rules::memory`] with the memory stores' options (e.g. `max_keys`), per limit.
    ///
    /// # Errors
    /// [`RulesError`] for a file that cannot be used.
    pub fn memory_with(
        text: &str,
        options: RulesOptions,
        store: MemoryStoreBuilder,
    ) -> Result<Self, RulesError> {
        let rules = Self::new(text, options, move || store.clone().build())?;
        // Set once, before the rules are handed out (the refresh thread may already read it).
        rules
            .shared
            .own_stores
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(rules)
    }
}

impl<St: Store<Vec<u8>>> Rules<St> {
    /// Rules from the text of a rules file; `make_store` gives each new limit its store (a clone
    /// of one Redis store, or a new memory store).
    ///
    /// # Errors
    /// [`RulesError`] for a file that cannot be used (it says where and why), or a limit the store
    /// refuses.
    pub fn new(
        text: &str,
        options: RulesOptions,
        make_store: impl Fn() -> St + Send + Sync + 'static,
    ) -> Result<Self, RulesError> {
        Self::build(text, options, make_store, SystemClock::new(), true)
    }

    /// Rules read from `path` (see [`Rules::new`]).
    ///
    /// # Errors
    /// [`RulesError`] for a file that cannot be read or used.
    pub fn from_path(
        path: &Path,
        options: RulesOptions,
        make_store: impl Fn() -> St + Send + Sync + 'static,
    ) -> Result<Self, RulesError> {
        Self::new(&read_rules(path)?, options, make_store)
    }
}

impl<St: Store<Vec<u8>>, C: Clock + Clone> Rules<St, C> {
    /// [`Rules::new`] with every limiter on `clock` (e.g. a [`ManualClock`](crate::ManualClock) or
    /// a [`TokioClock`](crate::TokioClock) in tests).
    ///
    /// # Errors
    /// As [`Rules::new`].
    pub fn with_clock(
        text: &str,
        options: RulesOptions,
        make_store: impl Fn() -> St + Send + Sync + 'static,
        clock: C,
    ) -> Result<Self, RulesError> {
        Self::build(text, options, make_store, clock, false)
    }

    /// [`Rules::with_clock`]; `suited_clocks`: `clock` is the default, and each limit gets the
    /// one suited to its rule instead.
    fn build(
        text: &str,
        options: RulesOptions,
        make_store: impl Fn() -> St + Send + Sync + 'static,
        clock: C,
        suited_clocks: bool,
    ) -> Result<Self, RulesError> {
        let local_fallback = store_kind::LocalFallback::of(&make_store);
        let shared = Shared {
            current: ArcSwap::from_pointee(Compiled {
                limits: Box::new([]),
                lone: true,
                exempt: Box::new([]),
            }),
            options,
            make_store: Box::new(make_store),
            clock,
            suited_clocks,
            limiters: parking_lot::Mutex::new(HashMap::new()),
            own_stores: std::sync::atomic::AtomicBool::new(false),
            local_fallback,
            local_warned: std::sync::atomic::AtomicBool::new(false),
            loaded: parking_lot::Mutex::new(content_hash(text.as_bytes())),
            reloads: metrics::ReloadMetrics::new(),
        };
        let file = shared.parse(text)?;
        let compiled = shared.compile(file, &mut ReloadReport::default())?;
        shared.current.store(Arc::new(compiled));
        let shared = Arc::new(shared);
        let weak: Weak<dyn metrics::Refresh> = Arc::downgrade(&shared) as _;
        metrics::refresh_every_second(weak);
        Ok(Self { shared })
    }

    /// The state of `request`'s key under the limit named `limit` (as its next request would find
    /// it, without spending anything): e.g. the attempts left for a page to show. `None` when the
    /// current rules have no such limit or the request has no key for it.
    pub async fn peek(&self, limit: &str, request: &Parts) -> Option<Result<Decision, StoreError>> {
        self.apply_to(limit, request, Op::Peek).await
    }

    /// Forgets the state of `request`'s key under the limit named `limit` (e.g. a successful login
    /// clears the failures counted for its IP and username), whatever rule it was recorded under.
    /// `None` as for [`Rules::peek`].
    pub async fn reset(
        &self,
        limit: &str,
        request: &Parts,
    ) -> Option<Result<Decision, StoreError>> {
        let current = self.shared.current.load_full();
        let limit = current.limit_for(limit, request, &self.shared.options)?;
        let key = limit.key_or_global(request, &self.shared.options).ok()?;
        Some(limit.apply(&key, Op::Reset).await)
    }

    async fn apply_to(
        &self,
        name: &str,
        request: &Parts,
        op: Op,
    ) -> Option<Result<Decision, StoreError>> {
        let current = self.shared.current.load_full();
        let limit = current.limit_for(name, request, &self.shared.options)?;
        let key = limit.key_or_global(request, &self.shared.options).ok()?;
        Some(limit.apply(&key, op).await)
    }

    /// The counters of the limit named `limit` ([`Stats`](crate::Stats)): what its store
    /// counts, and the requests let through because its store failed (`fail_open`). `None` when
    /// the current rules have no such limit.
    pub fn stats(&self, limit: &str) -> Option<crate::Stats> {
        let current = self.shared.current.load();
        let limit = current.limits.iter().find(|l| l.spec.name == limit)?;
        Some(limit.limiter.stats())
    }

    /// The rule of the limit named `limit` now (its default tier's, for a limit with tiers): its
    /// strategy and quotas as the file gives them, except for a limit with `queue_ms`, whose rule
    /// is its queue's (the quota's burst is the queue's depth). `None` when the current rules have
    /// no such limit.
    pub fn rule(&self, limit: &str) -> Option<Rule> {
        let current = self.shared.current.load();
        current
            .limits
            .iter()
            .find(|l| l.spec.name == limit && TierMatch::is_default(l.tier.as_ref()))
            .map(|l| l.rule().clone())
    }

    /// The names of the current limits, in the file's order.
    pub fn names(&self) -> Vec<String> {
        let current = self.shared.current.load();
        current
            .limits
            .iter()
            .filter(|l| TierMatch::is_default(l.tier.as_ref()))
            .map(|l| l.spec.name.clone())
            .collect()
    }

    /// Publishes what the stores count into the gauges and counters that are not updated per
    /// request: `tollgate_keys{limit}` (keys held) and `tollgate_evictions_total{limit}`, for the
    /// limits whose store is their own (the memory store; a store shared by several limits, such
    /// as Redis, reports no keys here), and `tollgate_breaker_open{limit}` (1 while the Redis
    /// store's circuit breaker is open). [`Rules::watch`] calls it at every poll; call it before a
    /// scrape for exact figures.
    pub fn publish_stats(&self) {
        metrics::Refresh::refresh(&*self.shared);
    }
}

/// The gauges of the current limits, refreshed every second while the rules live (and by
/// [`Rules::publish_stats`]).
impl<St: Store<Vec<u8>>, C: Clock> metrics::Refresh for Shared<St, C> {
    fn refresh(&self) {
        let current = self.current.load();
        for limit in current.limits.iter() {
            let stats = limit.limiter.stats();
            if self.own_stores.load(std::sync::atomic::Ordering::Relaxed) {
                limit.metrics.publish(&stats);
            } else {
                // A shared store's keys are not this limit's; its health is.
                limit.metrics.publish_health(&stats);
            }
        }
    }
}

impl<St: Store<Vec<u8>>, C: Clock> Limit<St, C> {
    /// The limit's rule now.
    fn rule(&self) -> &Rule {
        self.rule.as_ref().unwrap_or_else(|| self.limiter.rule())
    }

    /// Applies `op` to `key` under the limit's rule now; a decision that is not ready at once (a
    /// remote store) is timed into `tollgate_store_latency_seconds`.
    async fn apply(&self, key: &Vec<u8>, op: Op) -> Result<Decision, crate::StoreError> {
        match self.limiter.apply(key, self.rule.as_ref(), op).into_now() {
            Ok(ready) => ready,
            Err(later) => {
                let start = std::time::Instant::now();
                let result = later.await;
                self.metrics
                    .store_latency
                    .record(start.elapsed().as_secs_f64());
                result
            }
        }
    }

    /// Whether this limit settles with `marker`: one naming it, or an unnamed one when the
    /// limit's `settle` is `marker`.
    fn takes(&self, marker: &Settle) -> bool {
        match marker.limiter() {
            Some(name) => name == self.spec.name,
            None => self.spec.settle == Some(SettleSpec::Marker),
        }
    }

    /// The units the response reports for a `settle = "header:NAME"` limit; `None` (the
    /// estimate stands) without one or for a value it cannot use (warned once).
    fn settle_value<B>(&self, res: &Response<B>) -> Option<u32> {
        match self.settle_from.as_ref()?.read_head(res) {
            Ok(units) => units,
            Err(bad) => {
                warn_bad_value(&self.settle_warned, &self.spec.name, bad);
                None
            }
        }
    }

    /// How long a request the limit's shaping queue admitted waits for its departure: the check
    /// reserved the slot `[departure, departure + cost x T)`, and its reset is the slot's end.
    /// Zero without a queue.
    fn queue_wait(&self, d: &Decision) -> Duration {
        let Some(quota) = self
            .rule()
            .quotas()
            .first()
            .filter(|_| self.spec.queue.is_some())
        else {
            return Duration::ZERO;
        };
        let emission = quota
            .period_nanos()
            .div_ceil(u64::from(quota.limit()))
            .max(1);
        let emission = crate::layer::in_ticks(emission, self.limiter.store().tick());
        let slot = u64::from(self.spec.cost).saturating_mul(emission);
        Duration::from_nanos(d.reset_after.saturating_sub(slot))
    }
}

static SHADOW_LIMIT: http::HeaderName = http::HeaderName::from_static("x-ratelimit-shadow-limit");
static SHADOW_REMAINING: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-shadow-remaining");
static SHADOW_RESET: http::HeaderName = http::HeaderName::from_static("x-ratelimit-shadow-reset");

/// The fields of a forwarded request's response, joined with those of the rate-limit layers inside
/// (what they reported, [`Reported`](crate::layer::response::Reported)), and what this layer
/// reports for the layers around it (`enclosed`: the request arrived marked by an enclosing
/// layer). A rejection by a layer inside keeps its own fields.
fn write_success_headers<St, C, B>(
    compiled: &Compiled<St, C>,
    options: &RulesOptions,
    on_allowed: bool,
    allowed: &[Held],
    shadow: Option<(usize, Decision)>,
    enclosed: bool,
    res: &mut Response<B>,
) where
    St: Store<Vec<u8>>,
    C: Clock,
{
    if on_allowed && !rejected_inside(res.extensions()) {
        let mut below = reported_inside(res.extensions_mut());
        for h in allowed {
            let Some(limit) = compiled.limits.get(h.index) else {
                continue;
            };
            below = Some(write_allowed_headers(
                below,
                res.headers_mut(),
                &h.decision,
                limit.rule(),
                &limit.headers,
                None,
            ));
        }
        if let Some(reported) = below.filter(|_| LAYERS.report(enclosed)) {
            res.extensions_mut().insert(reported);
        }
    }
    let headers = res.headers_mut();
    if options.shadow_headers {
        if let Some((_, d)) = shadow {
            let num = |n: u64| http::HeaderValue::from(n);
            headers.insert(SHADOW_LIMIT.clone(), num(u64::from(d.limit())));
            headers.insert(SHADOW_REMAINING.clone(), num(u64::from(d.remaining())));
            headers.insert(SHADOW_RESET.clone(), num(d.reset_secs()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::compile::{LONE_CHECK_MAX, lone_enforced};
    use super::file::{PathPattern, RulesFile};

    fn lone(text: &str) -> bool {
        let file = RulesFile::parse(text).expect("a valid file");
        lone_enforced(file.limits.iter())
    }

    #[test]
    fn each_limit_gets_the_clock_suited_to_its_rule_unless_one_is_given() {
        use std::time::Duration;
        let text = "[[limit]]\nname = \"slow\"\nquotas = \"100/minute\"\n\
                    [[limit]]\nname = \"fine\"\npath = \"/f\"\nstrategy = \"token-bucket\"\n\
                    quotas = \"10000/s\"\nburst = 1\n\
                    [[limit]]\nname = \"queued\"\npath = \"/q\"\nstrategy = \"leaky-bucket\"\n\
                    quotas = \"10/minute\"\nqueue_ms = 60000\n";
        let resolutions = |rules: &super::Rules| -> Vec<(String, Duration)> {
            let current = rules.shared.current.load();
            current
                .limits
                .iter()
                .map(|l| (l.spec.name.clone(), l.limiter.clock().resolution()))
                .collect()
        };
        let ms = Duration::from_millis(1);
        let ns = Duration::from_nanos(1);
        // The default: what the builder gives one limiter of the same rule; a shaping queue
        // spaces departures by the time it reads, precisely.
        let rules = super::Rules::memory(text, Default::default()).unwrap();
        assert_eq!(
            resolutions(&rules),
            [
                ("slow".to_owned(), ms),
                ("fine".to_owned(), ns),
                ("queued".to_owned(), ns)
            ]
        );
        // A clock given is every limit's.
        let rules = super::Rules::with_clock(
            text,
            Default::default(),
            crate::store::MemoryStore::new,
            crate::SystemClock::new(),
        )
        .unwrap();
        assert_eq!(
            resolutions(&rules),
            [
                ("slow".to_owned(), ns),
                ("fine".to_owned(), ns),
                ("queued".to_owned(), ns)
            ]
        );
    }

    #[test]
    fn a_file_whose_enforced_limits_never_meet_is_lone() {
        assert!(lone(
            "[[limit]]\nname = \"a\"\nquotas = \"5/minute\"\n\
             [[limit]]\nname = \"s\"\nshadow = true\nquotas = \"1/minute\"\n"
        ));
        assert!(lone(
            "[[limit]]\nname = \"login\"\npath = \"/login\"\nmethods = [\"POST\"]\nquotas = \"5/minute\"\n\
             [[limit]]\nname = \"api\"\npath = \"/api/*\"\nquotas = \"100/minute\"\n\
             [[limit]]\nname = \"get-login\"\npath = \"/login\"\nmethods = [\"GET\"]\nquotas = \"9/minute\"\n"
        ));
        // `/*` meets every path; two limits on one path meet.
        assert!(!lone(
            "[[limit]]\nname = \"all\"\nquotas = \"50/minute\"\n\
             [[limit]]\nname = \"login\"\npath = \"/login\"\nquotas = \"5/minute\"\n"
        ));
        assert!(!lone(
            "[[limit]]\nname = \"ip\"\npath = \"/login\"\nquotas = \"5/minute\"\n\
             [[limit]]\nname = \"user\"\npath = \"/login\"\nkey = \"header:x-user\"\nquotas = \"5/minute\"\n"
        ));
    }

    #[test]
    fn a_file_of_many_enforced_limits_takes_the_multi_limit_path() {
        let text: String = (0..=LONE_CHECK_MAX)
            .map(|i| {
                format!("[[limit]]\nname = \"l{i}\"\npath = \"/p{i}\"\nquotas = \"5/minute\"\n")
            })
            .collect();
        assert!(!lone(&text));
        let text: String = (0..LONE_CHECK_MAX)
            .map(|i| {
                format!("[[limit]]\nname = \"l{i}\"\npath = \"/p{i}\"\nquotas = \"5/minute\"\n")
            })
            .collect();
        assert!(lone(&text));
    }

    #[test]
    fn the_default_pattern_matches_every_path_without_splitting() {
        let all = PathPattern::parse("/*").expect("the default pattern");
        for path in ["/", "/a", "/a/b/", "//"] {
            assert!(all.matches(path), "{path}");
        }
        assert!(!all.matches(""));
        assert!(!all.matches("a"));
    }
}
