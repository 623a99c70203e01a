//! Limits from a TOML rules file (feature `rules`): matched per path and method, decided
//! all-or-nothing across their keys, reloaded without losing state, with shadow limits and
//! metrics.
//!
//! [`Rules::layer`] is a [`RateLimitLayer`](crate::layer::RateLimitLayer), the pipeline of a single
//! limiter with a file's limits in place of the limiter (see [`FileLimits`]): its response hooks,
//! gRPC answers, failure policy (the [`RulesOptions`]' by default), pacing and `skip` apply here
//! too, and it wraps any inner service body (tonic's included).
//!
//! ```toml
//! [[limit]]
//! name = "login"              # required, unique, [A-Za-z0-9_.-]{1,64}
//! path = "/login"             # default "/*"; "/api/*" = "/api/" and below (not "/api");
//!                             # "{x}" = one non-empty segment; raw path, case-sensitive
//! methods = ["POST"]          # default all; case-insensitive; HEAD is not GET
//! key = "ip"                  # ip | global | header:NAME | a key registered in code
//!                             # (RulesOptions::key) | a composite "ip+header:x-user"
//! on_missing_key = "reject"   # reject (400) | global; default from RulesOptions
//! strategy = "moving-window"  # the strategy names; default sliding-window
//! quotas = "5/minute; 20/hour"
//! burst = 10                  # bucket strategies only; an error elsewhere
//! cost = 1                    # units per request, default 1
//! shadow = false              # true: decided and counted, never rejects
//! window_offset = "8h"        # fixed-window, sliding-window: windows in that time zone's clock
//! queue_ms = 2000             # leaky-bucket, one quota: a shaping queue, at most this long a wait
//! settle = "marker"           # marker | header:NAME | trailer:NAME: the actual cost's source
//! tier = "header:x-plan"      # header:NAME | a registered key: where the plan is read
//! tiers = { pro = "50/minute" } # quotas per plan; others and none take `quotas`
//!
//! [[exempt]]                  # requests no limit applies to
//! path = "/health"
//! methods = ["GET"]           # default all
//! ```
//!
//! Each tier of a limit decides on the limit's one state per key (its name's), so a client
//! whose plan changes keeps what it spent, converted to the new plan's quotas.
//!
//! A limit with `queue_ms` is a shaping queue, as [`RateLimitLayer::queue`](crate::RateLimitLayer::queue):
//! each request gets its departure when it arrives and waits for it (tokio's timer) before it is
//! forwarded. Queues are checked after every other enforced limit of the request admitted it, and
//! their slots are never given back (not on a later rejection, not by a [`Settle`] marker): a gap
//! under-admits, a slot given back would let two waiters leave together. A request waits in one
//! queue at most: two `queue_ms` limits that one request can match (their methods intersect and
//! some path matches both patterns, e.g. `/api/*` and `/api/{v}/upload`) are refused at load with
//! the second one's `line L, column C`. While a request waits, the inner service's readiness is
//! given back (e.g. a concurrency permit) and asked for again at departure.
//!
//! Every enforced limit that matches a request applies. The decision is all-or-nothing: the keys
//! of all matching enforced limits (shaping queues aside) are read first (a request without one
//! is answered `400` before anything is spent), then the limits are decided together in one
//! [`Store::apply_all`] call, in the file's order: every limit spends its cost, or, when one
//! rejects, none does, so a rejected request spends nothing anywhere once its decision completes;
//! the `429` is the rejecting limit's with the longest `Retry-After` (on the memory store every
//! limit is checked, so the longest wait is known; a store ending its answer at the first
//! rejection names that one). It never over-admits (each limit admits only within
//! its own quota). How the store keeps it atomic:
//!
//! - **Memory**: the items' lock stripes are taken in one fixed order (no global lock), and the
//!   items are reserved, then given back on a rejection, under them: no other decision sees a
//!   reservation that is rolled back, so there is no false rejection (a request that fits every
//!   limit is admitted).
//! - **Redis, one slot** (single node and Sentinel: always; Cluster: limits on the same key): one
//!   script call checks every limit with its strategy's own arithmetic and commits all or none;
//!   one round trip per request, no false rejection.
//! - **Otherwise** (Cluster keys in different slots: a `global` key keeps its own hash tag, never
//!   co-located with per-client keys, which would put all traffic in one slot; Redis quota
//!   leasing on, whose answers are local; a store without its own `apply_all`): the two-phase
//!   protocol, reserving each limit in the file's order and settling the reservations already
//!   made to 0 on a rejection. Never over-admits; while a rolled-back reservation is held (the
//!   time of one decision), a concurrent request on the same key may be falsely rejected.
//!
//! When no request can match two enforced limits of a file (checked pairwise at load, by method
//! and path pattern, for files of up to 64 enforced limits), a request's one limit is decided by
//! its limiter alone, as a plain layer does: nothing is ever rolled back, so there is nothing to
//! hide. (During a reload, requests still in flight on the old rules may take the all-or-nothing
//! path while new ones take this one: at worst one false rejection per in-flight rollback, never
//! an over-admission.)
//!
//! A limit whose store fails blocks no other (the store answers its error). Every answer is read
//! before acting: under [`FailurePolicy::FailClosed`] the limits that admitted are given back once
//! and the request is answered `503` (after a rejection the store has given them back itself);
//! under `FailOpen` the failed limit is skipped. A limit left unanswered counts as failed.
//!
//! Shaping queues are reserved after the other limits admitted the request (a queue's rejection
//! settles those to 0). Shadow limits are checked after the enforced ones admitted the request:
//! they are counted and never reject or roll anything back.
//!
//! Settlement (`settle`): a handler's [`Settle`] marker (e.g. `Settle::refund()` on a successful
//! login: only failures count) settles the request's reservation with the limit it names
//! ([`Settle::for_limiter`]: every limit takes a marker named for it), and an unnamed one with
//! every matching limit whose `settle` is `marker`; a file with no such limit leaves an unnamed
//! marker to the layer around it (never a global limit's count by accident). `settle =
//! "header:NAME"` settles to the response header `NAME` (a decimal count; missing, unusable or
//! repeated: the estimate stands, warned once per limit) before the response leaves; `settle =
//! "trailer:NAME"` to the trailer `NAME` once the body has ended (a body dropped before its
//! trailers leaves the estimate). A value above what was left is charged in full (the key's debt
//! carries, as with [`SettleFrom`]). Shadow limits settle like enforced ones.
//!
//! Headers follow the stacked-limiter rule: on a `429` the rejecting limit's; on a success the
//! `x-ratelimit-*` fields of the limit with the fewest remaining, and one IETF item per limit.
//!
//! [`Rules::reload_file`] (or [`Rules::watch`], polling at an interval) swaps a new file in
//! atomically when its content hash changes; requests in flight finish on the rules they started
//! with; an invalid file is refused (logged, counted in `tollgate_rules_reloads_total{result="error"}`)
//! and the old rules keep serving. State per limit: a limit keeps its limiter (its name) across
//! reloads, and a key's state belongs to the name and the key, so a changed rule (quotas, strategy,
//! window offset) converts each key's state when the key is next seen, in the store, strictly (see
//! [changing limits](crate::guide::changing_limits)): never a fresh start, and an instance still on
//! the old file counts the same state. A changed key starts that limit fresh; a rename is a new
//! limit.
//! disagree for up to one interval. A limit removed and added back while requests started on older
//! rules are in flight gets the limiter they hold (its name stays taken on the store until the last
//! of them ends), so such a reload never fails on the name.

mod file;
mod limits;
mod named;
use crate::metrics;
use limits::Stop;
pub use limits::{FileLimits, RulesAnswer, RulesDecided, RulesKeys};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Response;
use http::request::Parts;

pub use named::NamedKeys;

pub use file::{
    Exempt, KeyPart, KeySpec, LimitSpec, MissingKey, PathPattern, RulesError, RulesFile, SettleSpec,
};
pub use metrics::{METRIC_NAMES, STORE_LATENCY_BUCKETS};

use crate::key::{ForwardedIp, KeyError, KeyExtractor, PeerIp};
pub use crate::layer::RejectedBy;
use crate::layer::response::{HeaderConfig, Reported, rejected_inside, write_allowed_headers};
use crate::layer::{
    ConcurrencyLimit, FailurePolicy, HeaderStyle, ResetFormat, Settle, SettleFrom, warn_bad_value,
};
use crate::store::{Item, MemoryStore, MemoryStoreBuilder, Store, StoreKey};
use crate::{Clock, Decision, Op, RateLimiter, Rule, StoreError, StoreErrorKind, SystemClock};
use file::MAX_RULES_FILE_BYTES;
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

/// What a reload changed, by limit name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Limits new in the file.
    pub added: Vec<String>,
    /// Limits no longer in the file.
    pub removed: Vec<String>,
    /// Limits whose settings changed but whose state is kept (path, methods, cost, shadow,
    /// missing-key choice).
    pub changed: Vec<String>,
    /// Limits whose rule changed (quotas, strategy or window offset; same key): the store
    /// converts each key's state to the new rule when the key is next seen (see [`Rules`]).
    pub converted: Vec<String>,
    /// Limits whose key changed: their state starts fresh.
    pub fresh: Vec<String>,
}

impl ReloadReport {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.converted.is_empty()
            && self.fresh.is_empty()
    }
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "added {:?}, removed {:?}, changed {:?}, converted {:?}, started fresh {:?}",
            self.added, self.removed, self.changed, self.converted, self.fresh
        )
    }
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
        let value: Option<std::borrow::Cow<'_, [u8]>> = match &self.from {
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
        };
        match &self.want {
            Some(want) => value.as_deref() == Some(&**want),
            None => value.is_none_or(|v| !self.listed.iter().any(|l| **l == *v)),
        }
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

/// Most enforced limits checked pairwise for [`Compiled::lone`]; a larger file takes the
/// multi-limit path for every request.
const LONE_CHECK_MAX: usize = 64;

/// Whether no request can match two of `specs`' enforced limits (neither shadow nor queue).
fn lone_enforced<'a>(specs: impl Iterator<Item = &'a LimitSpec>) -> bool {
    let enforced: Vec<&LimitSpec> = specs
        .filter(|s| !s.shadow && s.queue.is_none())
        .take(LONE_CHECK_MAX + 1)
        .collect();
    enforced.len() <= LONE_CHECK_MAX
        && enforced
            .iter()
            .enumerate()
            // The tiers of one limit (one name) never meet one request together.
            .all(|(i, a)| {
                enforced
                    .iter()
                    .skip(i + 1)
                    .all(|b| a.name == b.name || !a.overlaps(b))
            })
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
    /// Every limiter a version of the rules still in use holds, by name: a reload that adds back
    /// a name whose limiter is still alive (requests in flight on older rules) reuses it instead
    /// of failing on the name, which the store keeps taken until that limiter is dropped.
    limiters: Registry<St, C>,
    /// Whether every limit has a store of its own (its stats are the limit's).
    own_stores: bool,
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
        let mut rules = Self::new(text, options, move || store.clone().build())?;
        if let Some(shared) = Arc::get_mut(&mut rules.shared) {
            shared.own_stores = true;
        }
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
        Self::with_clock(text, options, make_store, SystemClock::new())
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
        let file = RulesFile::parse(text)?;
        let shared = Shared {
            current: ArcSwap::from_pointee(Compiled {
                limits: Box::new([]),
                lone: true,
                exempt: Box::new([]),
            }),
            options,
            make_store: Box::new(make_store),
            clock,
            limiters: parking_lot::Mutex::new(HashMap::new()),
            own_stores: false,
            loaded: parking_lot::Mutex::new(content_hash(text.as_bytes())),
            reloads: metrics::ReloadMetrics::new(),
        };
        let compiled = shared.compile(file, &mut ReloadReport::default())?;
        shared.current.store(Arc::new(compiled));
        Ok(Self {
            shared: Arc::new(shared),
        })
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
        let current = self.shared.current.load();
        for limit in current.limits.iter() {
            let stats = limit.limiter.stats();
            if self.shared.own_stores {
                limit.metrics.publish(&stats);
            } else {
                // A shared store's keys are not this limit's; its health is.
                limit.metrics.publish_health(&stats);
            }
        }
    }

    /// Swaps in the rules of `text` if its content differs from the last loaded: `Ok(None)` when
    /// unchanged, the change log otherwise. Requests in flight finish on the old rules.
    ///
    /// # Errors
    /// [`RulesError`] for a file that cannot be used: the old rules stay (logged at `error` and
    /// counted in `tollgate_rules_reloads_total{result="error"}`).
    pub fn reload_text(&self, text: &str) -> Result<Option<ReloadReport>, RulesError> {
        self.reload(text).map(|(report, _old)| report)
    }

    /// [`Rules::reload_text`], handing back the rules it replaced (to be dropped off the request
    /// path: see [`retire`]).
    #[allow(clippy::type_complexity)]
    fn reload(
        &self,
        text: &str,
    ) -> Result<(Option<ReloadReport>, Option<Arc<Compiled<St, C>>>), RulesError> {
        let hash = content_hash(text.as_bytes());
        let mut loaded = self.shared.loaded.lock();
        if *loaded == hash {
            return Ok((None, None));
        }
        let mut report = ReloadReport::default();
        let result = if text.trim().is_empty() {
            // What a reader sees between a writer's truncation and its write: never "no limits".
            Err(RulesError::whole(
                "the new rules file is empty (a file with no limits holds at least a comment)",
            ))
        } else {
            RulesFile::parse(text).and_then(|f| self.shared.compile(f, &mut report))
        };
        match result {
            Ok(compiled) => {
                let old = self.shared.current.swap(Arc::new(compiled));
                *loaded = hash;
                self.shared.reloads.ok.increment(1);
                tracing::info!(
                    added = ?report.added,
                    removed = ?report.removed,
                    changed = ?report.changed,
                    converted = ?report.converted,
                    fresh = ?report.fresh,
                    "rules reloaded"
                );
                for name in &report.fresh {
                    tracing::warn!(
                        limit = %name,
                        "rules reload: the key changed: the limit starts fresh"
                    );
                }
                Ok((Some(report), Some(old)))
            }
            Err(e) => {
                self.shared.reloads.error.increment(1);
                tracing::error!(error = %e, "rules reload refused; the old rules keep serving");
                Err(e)
            }
        }
    }

    /// [`Rules::reload_text`] with the content of `path`. A file that vanished or cannot be read
    /// is an error like any invalid file: the old rules stay.
    ///
    /// # Errors
    /// As [`Rules::reload_text`].
    pub fn reload_file(&self, path: &Path) -> Result<Option<ReloadReport>, RulesError> {
        match read_rules(path) {
            Ok(text) => self.reload_text(&text),
            Err(e) => {
                self.shared.reloads.error.increment(1);
                tracing::error!(error = %e, "rules reload refused; the old rules keep serving");
                Err(e)
            }
        }
    }

    /// Polls `path` every `every` (at least 50 ms) on the tokio runtime and reloads it when its
    /// content changes and then holds still for 25 ms (a file caught in the middle of an in-place
    /// write is not loaded; an empty one is refused). A new file is parsed and compiled on a
    /// blocking thread (requests go on meanwhile on the old rules) and swapped in at once. The
    /// task ends when every [`Rules`] handle and layer is dropped. A file
    /// that stays invalid is reported once per content, not once per poll.
    pub fn watch(&self, path: impl Into<PathBuf>, every: Duration) -> tokio::task::JoinHandle<()> {
        let path = path.into();
        let weak: Weak<Shared<St, C>> = Arc::downgrade(&self.shared);
        let every = every.max(Duration::from_millis(50));
        tokio::spawn(async move {
            let mut refused: Option<[u8; 32]> = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else { break };
                let rules = Rules { shared };
                rules.publish_stats();
                let text = match read_rules(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        let hash = content_hash(e.message().as_bytes());
                        if refused != Some(hash) {
                            refused = Some(hash);
                            rules.shared.reloads.error.increment(1);
                            tracing::error!(error = %e, "rules reload refused; the old rules keep serving");
                        }
                        continue;
                    }
                };
                let hash = content_hash(text.as_bytes());
                if refused == Some(hash) || *rules.shared.loaded.lock() == hash {
                    continue;
                }
                // A change: read again a moment later and load only a content that held still,
                // so a file caught in the middle of an in-place write is not loaded.
                tokio::time::sleep(SETTLE_TIME).await;
                match read_rules(&path) {
                    Ok(again) if again == text => {}
                    _ => continue,
                }
                // Parsing and compiling a large file takes a while: on a blocking thread, so the
                // runtime's workers keep serving requests on the old rules until the swap.
                let compiling = rules.clone();
                let reload = move || {
                    let (result, old) = match compiling.reload(&text) {
                        Ok((_, old)) => (Ok(()), old),
                        Err(e) => (Err(e), None),
                    };
                    if let Some(old) = old {
                        retire(old);
                    }
                    result
                };
                match tokio::task::spawn_blocking(reload).await {
                    Ok(Ok(())) => refused = None,
                    Ok(Err(_)) => refused = Some(hash),
                    Err(e) => tracing::error!(error = %e, "rules reload failed to run"),
                }
            }
        })
    }
}

impl<St: Store<Vec<u8>>, C: Clock + Clone> Shared<St, C> {
    /// Builds the limits of `file`, keeping the limiter (and so the state) of every limit whose
    /// name, rule and key are unchanged.
    fn compile(
        &self,
        file: RulesFile,
        report: &mut ReloadReport,
    ) -> Result<Compiled<St, C>, RulesError> {
        let old = self.current.load_full();
        // A limit with tiers is found by its default tier, which holds its spec as written.
        let by_name: HashMap<&str, &Limit<St, C>> = old
            .limits
            .iter()
            .filter(|l| TierMatch::is_default(l.tier.as_ref()))
            .map(|l| (l.spec.name.as_str(), l))
            .collect();
        let tiers_of =
            |spec: &LimitSpec| -> Result<Vec<(LimitSpec, Option<TierMatch>)>, RulesError> {
                self.check_named_keys(spec)?;
                Ok(tier_versions(spec))
            };
        let mut limits = Vec::with_capacity(file.limits.len());
        let mut seen = BTreeMap::new();
        let initial = old.limits.is_empty();
        for spec in file.limits {
            let kept = by_name.get(spec.name.as_str()).copied();
            if spec.concurrency.is_some() && shared_store::<St>() {
                return Err(RulesError::whole(format!(
                    "limit {:?}: concurrency is counted in this process, and this store is shared \
                     by several instances (Redis); a rules file's concurrency needs the memory \
                     store (across instances, cap in code with ConcurrencyLimit::redis)",
                    spec.name
                )));
            }
            let cap = match (spec.concurrency, kept.and_then(|l| l.cap.as_ref())) {
                (Some(n), Some(held)) => Some(held.with_cap(n)),
                (Some(n), None) => Some(
                    ConcurrencyLimit::memory(n)
                        .named(&spec.name)
                        .map_err(|e| RulesError::whole(e.to_string()))?,
                ),
                (None, _) => None,
            };
            let (limiter, rule) = match kept {
                Some(l) => {
                    if l.spec.key != spec.key {
                        report.fresh.push(spec.name.clone());
                    } else if l.spec.rule != spec.rule {
                        report.converted.push(spec.name.clone());
                    } else if l.spec != spec {
                        report.changed.push(spec.name.clone());
                    }
                    // The same limiter (its name stays taken on the store): the store converts a
                    // key's state to a changed rule when the key is next seen.
                    let rule = own_rule(&l.limiter, &spec)?;
                    (Arc::clone(&l.limiter), rule)
                }
                None => {
                    if !initial {
                        report.added.push(spec.name.clone());
                    }
                    // A name removed by an earlier reload whose limiter requests in flight on
                    // older rules still hold: the same limiter, not a second one of its name.
                    let alive = self
                        .limiters
                        .lock()
                        .get(&spec.name)
                        .and_then(|w| w.upgrade());
                    match alive {
                        Some(limiter) => {
                            let rule = own_rule(&limiter, &spec)?;
                            (limiter, rule)
                        }
                        None => (Arc::new(self.build_limiter(&spec)?), None),
                    }
                }
            };
            seen.insert(spec.name.clone(), ());
            let mut headers = HeaderConfig::for_rule(&spec.rule);
            headers.style = self.options.header_style;
            headers.reset = self.options.reset;
            headers.policy_name = Arc::from(spec.name.as_str());
            let mut versions = tiers_of(&spec)?.into_iter();
            let default_tier = versions.next().and_then(|(_, t)| t);
            limits.push(Limit {
                tier: default_tier,
                key_tag: key_tag(&spec.key),
                rule,
                missing_global: spec.on_missing_key.unwrap_or(self.options.on_missing_key)
                    == MissingKey::Global,
                metrics: LimitMetrics::new(&spec.name),
                settle_from: match &spec.settle {
                    Some(SettleSpec::Header(name)) => Some(SettleFrom::header(name.clone())),
                    _ => None,
                },
                settle_warned: Arc::default(),
                cap,
                headers,
                limiter,
                spec,
            });
            if let Some(default) = limits.last() {
                let more = self.tier_limits(default, versions)?;
                limits.extend(more);
            }
        }
        report.removed = old
            .limits
            .iter()
            .filter(|l| !seen.contains_key(&l.spec.name))
            .map(|l| l.spec.name.clone())
            .collect();
        let mut registry = self.limiters.lock();
        registry.retain(|_, w| w.strong_count() > 0);
        for l in &limits {
            registry.insert(l.spec.name.clone(), Arc::downgrade(&l.limiter));
        }
        let lone = lone_enforced(limits.iter().map(|l| &l.spec));
        Ok(Compiled {
            limits: limits.into(),
            lone,
            exempt: file.exempt.into(),
        })
    }

    /// Refuses a limit naming a key no extractor is registered for.
    fn check_named_keys(&self, spec: &LimitSpec) -> Result<(), RulesError> {
        let named = spec
            .key
            .parts()
            .iter()
            .chain(spec.tier.as_ref())
            .filter_map(|p| match p {
                file::KeyPart::Named(n) => Some(n),
                _ => None,
            });
        for name in named {
            if !self.options.keys.contains(name) {
                return Err(RulesError::whole(format!(
                    "limit {:?}: {name:?} is not ip, global or header:NAME, and no key extractor \
                     of that name is registered (RulesOptions::key; registered: {:?})",
                    spec.name,
                    self.options.keys.names()
                )));
            }
        }
        Ok(())
    }

    /// The limits of the listed tiers of `default`'s limit (`versions`: each tier's spec and
    /// match): on its limiter, so a key moving between tiers keeps one state, converted.
    fn tier_limits(
        &self,
        default: &Limit<St, C>,
        versions: impl Iterator<Item = (LimitSpec, Option<TierMatch>)>,
    ) -> Result<Vec<Limit<St, C>>, RulesError> {
        let mut out = Vec::new();
        for (spec, tier) in versions {
            let rule = own_rule(&default.limiter, &spec)?;
            let mut headers = HeaderConfig::for_rule(&spec.rule);
            headers.style = self.options.header_style;
            headers.reset = self.options.reset;
            headers.policy_name = Arc::from(spec.name.as_str());
            out.push(Limit {
                tier,
                key_tag: default.key_tag,
                rule,
                missing_global: default.missing_global,
                metrics: LimitMetrics::new(&spec.name),
                settle_from: default.settle_from.clone(),
                settle_warned: Arc::default(),
                cap: default.cap.clone(),
                headers,
                limiter: Arc::clone(&default.limiter),
                spec,
            });
        }
        Ok(out)
    }

    /// A new limiter for `spec`, on the store `make_store` gives and the rules' clock.
    fn build_limiter(&self, spec: &LimitSpec) -> Result<RateLimiter<Vec<u8>, St, C>, RulesError> {
        let mut builder = RateLimiter::<Vec<u8>>::builder()
            .name(spec.name.clone())
            .strategy(spec.rule.strategy())
            .window_offset(spec.rule.window_offset());
        for q in spec.rule.quotas() {
            builder = builder.quota(*q);
        }
        builder
            .clock(self.clock.clone())
            .store((self.make_store)())
            .build()
            .map_err(|e| RulesError::whole(format!("limit {:?}: {e}", spec.name)).caused_by(e))
    }
}

/// The rule a limit decides on when it is not its limiter's own (a reload changed it), checked
/// by the limiter's store.
fn own_rule<St: Store<Vec<u8>>, C: Clock>(
    limiter: &RateLimiter<Vec<u8>, St, C>,
    spec: &LimitSpec,
) -> Result<Option<Rule>, RulesError> {
    if spec.rule == *limiter.rule() {
        return Ok(None);
    }
    limiter
        .store()
        .validate(&spec.rule)
        .map_err(|e| RulesError::whole(format!("limit {:?}: {e}", spec.name)).caused_by(e))?;
    Ok(Some(spec.rule.clone()))
}

/// The versions of `spec` a request can be decided by: `spec` itself (the default tier), then
/// one per listed tier with that tier's rule; each with the requests it takes (`None`: the limit
/// has no tiers, and `spec` takes every request).
fn tier_versions(spec: &LimitSpec) -> Vec<(LimitSpec, Option<TierMatch>)> {
    let Some(from) = &spec.tier else {
        return vec![(spec.clone(), None)];
    };
    let listed: Arc<[Box<[u8]>]> = spec
        .tiers
        .iter()
        .map(|(name, _)| name.as_bytes().into())
        .collect();
    let matching = |want: Option<&str>| TierMatch {
        from: from.clone(),
        want: want.map(|w| w.as_bytes().into()),
        listed: Arc::clone(&listed),
    };
    let mut out = vec![(spec.clone(), Some(matching(None)))];
    for (name, rule) in &spec.tiers {
        let mut tier = spec.clone();
        tier.rule = rule.clone();
        out.push((tier, Some(matching(Some(name)))));
    }
    out
}

/// Drops the rules a reload replaced on this thread (a blocking one of [`Rules::watch`]), not
/// on a request's: freeing thousands of limits takes a while. Waits up to [`RETIRE_WAIT`] for the requests still deciding
/// on them; after that the last of them drops what is left.
fn retire<T>(old: Arc<T>) {
    let start = std::time::Instant::now();
    while Arc::strong_count(&old) > 1 && start.elapsed() < RETIRE_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(old);
}

/// How long a reload waits for the requests still on the rules it replaced (see [`retire`]).
const RETIRE_WAIT: Duration = Duration::from_millis(200);

/// How long a changed rules file must keep the same content before it is loaded.
const SETTLE_TIME: Duration = Duration::from_millis(25);

/// Reads a rules file, refusing one above [`RulesFile::MAX_BYTES`] before reading it whole.
fn read_rules(path: &Path) -> Result<String, RulesError> {
    use std::io::Read as _;
    let fail = |e: &dyn std::fmt::Display| RulesError::whole(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| fail(&e))?;
    let mut text = String::new();
    file.take(MAX_RULES_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(&e))?;
    if text.len() > MAX_RULES_FILE_BYTES {
        return Err(fail(&format_args!(
            "larger than the {MAX_RULES_FILE_BYTES} bytes a rules file may have"
        )));
    }
    Ok(text)
}

/// The 4 bytes every key of a limit with this key spec starts with.
fn key_tag(spec: &KeySpec) -> [u8; 4] {
    let digest = content_hash(spec.to_string().as_bytes());
    [digest[0], digest[1], digest[2], digest[3]]
}

fn content_hash(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
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

    /// The request's key under this limit, or the global one when the limit counts requests
    /// without a key there.
    fn key_or_global(&self, parts: &Parts, options: &RulesOptions) -> Result<Vec<u8>, KeyError> {
        match self.key(parts, options) {
            Err(_) if self.missing_global => Ok(self.global_key()),
            other => other,
        }
    }

    /// The key of a request without one, when the limit counts those in one global bucket.
    fn global_key(&self) -> Vec<u8> {
        let mut out = self.key_tag.to_vec();
        out.push(b'G');
        out
    }

    /// The request's key under this limit: the key spec's tag, then each part.
    fn key(&self, parts: &Parts, options: &RulesOptions) -> Result<Vec<u8>, KeyError> {
        let mut out = Vec::with_capacity(40);
        out.extend_from_slice(&self.key_tag);
        for part in self.spec.key.parts() {
            match part {
                file::KeyPart::Ip => {
                    out.push(b'i');
                    match &options.ip {
                        IpSource::Peer(p) => p.extract(parts)?.encode(&mut out),
                        IpSource::Forwarded(f) => f.extract(parts)?.encode(&mut out),
                    }
                }
                file::KeyPart::Global => out.push(b'g'),
                file::KeyPart::Named(name) => {
                    let v = options.keys.extract(name, parts)?;
                    out.push(b'n');
                    let len = u32::try_from(v.len()).unwrap_or(u32::MAX);
                    out.extend_from_slice(&len.to_be_bytes());
                    out.extend_from_slice(&v);
                }
                file::KeyPart::Header(name) => {
                    let v = crate::key::header_value_key(&parts.headers, name)?;
                    out.push(b'h');
                    let at = out.len();
                    out.extend_from_slice(&[0; 4]);
                    v.encode(&mut out);
                    let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
                    if let Some(slot) = out.get_mut(at..at + 4) {
                        slot.copy_from_slice(&len.to_be_bytes());
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The decision of a limit not decided yet: rejected, holding no reservation.
const PENDING: Decision = Decision {
    outcome: crate::Outcome::Rejected,
    limit: 0,
    remaining: 0,
    reset_after: 0,
    retry_after: 0,
    time: 0,
    quota: 0,
    cost: 0,
    local: false,
    bound: 0,
    shed: false,
};

/// A reservation to give back if another limit rejects (or, before the decision, a limit to
/// decide: [`PENDING`]).
#[derive(Clone)]
struct Held {
    index: usize,
    key: Vec<u8>,
    decision: Decision,
}

/// Decides the enforced limits of a request (not shaping queues) in one [`Store::apply_all`]
/// call: the admitted ones' reservations, or the answer (429, 503) when one rejected (nothing
/// charged: the store gave back what the others reserved) or a store failed closed (every
/// admitted limit settled to 0, once). A store failing open skips its limit; a limit the store
/// did not answer counts as failed. Every answer is read before acting on any.
async fn enforce_all<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    failure: FailurePolicy,
    mut held: Vec<Held>,
) -> Result<Vec<Held>, Stop> {
    held.retain(|h| compiled.limits.get(h.index).is_some());
    let Some(first) = held.first().and_then(|h| compiled.limits.get(h.index)) else {
        return Ok(held);
    };
    let item = |h| item_of(compiled, h);
    let now = first.limiter.clock().now();
    // One limit (the common case) needs no list of items.
    let (one, many): (Option<[RulesItem<'_, St>; 1]>, Vec<RulesItem<'_, St>>) =
        match held.as_slice() {
            [single] => (item(single).map(|i| [i]), Vec::new()),
            all => (None, all.iter().filter_map(item).collect()),
        };
    let items = one.as_ref().map_or(many.as_slice(), |one| one.as_slice());
    let answers = match first.limiter.store().apply_all(items, now).into_now() {
        Ok(ready) => ready,
        Err(later) => {
            let start = std::time::Instant::now();
            let answers = later.await;
            let took = start.elapsed().as_secs_f64();
            for h in &held {
                if let Some(limit) = compiled.limits.get(h.index) {
                    limit.metrics.store_latency.record(took);
                }
            }
            answers
        }
    };
    drop((one, many));
    // Every answer is read before acting on any: on the two-phase path a failed item blocks no
    // other, so items after it may hold a reservation, and a rejection means the store already
    // settled the admitted ones to 0. The 429 is the rejection with the longest wait (one whose
    // cost can never be admitted first), so a client never retries too early.
    let mut got: Vec<Option<Result<Decision, StoreError>>> = held.iter().map(|_| None).collect();
    let mut rejected: Option<(usize, Decision)> = None;
    for (i, answer) in answers {
        // Reservations bound to their limit and key, as a limiter's own checks make them.
        let answer = answer.map(|d| {
            let limit = held
                .get(i)
                .and_then(|h| Some((h, compiled.limits.get(h.index)?)));
            limit.map_or(d, |(h, l)| l.limiter.bind(l.rule.as_ref(), &h.key, d))
        });
        if let Ok(d) = &answer {
            if !d.is_allowed() && rejected.is_none_or(|(_, r)| waits_longer(d, &r)) {
                rejected = Some((i, *d));
            }
        }
        if let Some(slot) = got.get_mut(i) {
            *slot = Some(answer);
        }
    }
    if let Some((at, d)) = rejected {
        let Some(index) = held.get(at).map(|h| h.index) else {
            return Ok(Vec::new());
        };
        for (h, a) in held.iter().zip(got) {
            if let Some(Err(e)) = a {
                if let Some(failed) = compiled.limits.get(h.index) {
                    failed.metrics.store_errors.increment(1);
                    tracing::warn!(limit = %failed.spec.name, error = %e, "rate-limit store error");
                }
            }
        }
        return Err(Stop::Rejected(index, d));
    }
    let mut failed: Option<StoreError> = None;
    for (h, answer) in held.iter_mut().zip(got) {
        let Some(limit) = compiled.limits.get(h.index) else {
            continue;
        };
        // An item the store did not answer counts as failed, never as admitted.
        let answer = answer.unwrap_or_else(|| {
            Err(StoreError::new(
                StoreErrorKind::Other,
                "the store gave no answer for this limit",
            ))
        });
        match answer {
            Ok(d) => h.decision = d,
            Err(e) => {
                let failure = limit.failure(failure);
                if failure != FailurePolicy::FailClosed || failed.is_none() {
                    limit.store_failed(&e, failure);
                } else {
                    limit.metrics.store_errors.increment(1);
                    tracing::warn!(limit = %limit.spec.name, error = %e, "rate-limit store error");
                }
                if failure == FailurePolicy::FailClosed && failed.is_none() {
                    failed = Some(e);
                }
            }
        }
    }
    if let Some(e) = failed {
        // Every limit that admitted holds a reservation: each is given back once.
        rollback(compiled, &held).await;
        return Err(Stop::Failed(e));
    }
    // A limit whose store failed open holds nothing.
    held.retain(|h| h.decision.is_allowed());
    Ok(held)
}

/// Whether rejection `a` asks the client to wait longer than `b`: a cost that can never be
/// admitted (no `Retry-After`) before any wait, then the longer wait.
fn waits_longer(a: &Decision, b: &Decision) -> bool {
    match (a.retry_after(), b.retry_after()) {
        (None, Some(_)) => true,
        (Some(x), Some(y)) => x > y,
        _ => false,
    }
}

/// An item of a rules file's [`Store::apply_all`] call.
type RulesItem<'a, St> = Item<'a, Vec<u8>, St>;

/// The [`Store::apply_all`] item of `h`'s limit and key.
fn item_of<'a, St: Store<Vec<u8>>, C: Clock>(
    compiled: &'a Compiled<St, C>,
    h: &'a Held,
) -> Option<Item<'a, Vec<u8>, St>> {
    let limit = compiled.limits.get(h.index)?;
    Some(Item {
        store: limit.limiter.store(),
        key: &h.key,
        scope: limit.limiter.scope(limit.rule.as_ref()),
        cost: limit.spec.cost,
    })
}

/// Checks the enforced limit of `one` (its key read already; `one.decision` is not read):
/// `Ok(Some(decision))` when it admitted the request (held in `held`), `Ok(None)` when its store
/// failed open, `Err` when the request stops here (a rejection, or a store failing closed), what
/// the limits before it reserved given back.
async fn enforce_keyed<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    failure: FailurePolicy,
    one: Held,
    held: &mut Vec<Held>,
) -> Result<Option<Decision>, Stop> {
    let Held { index, key, .. } = one;
    let Some(limit) = compiled.limits.get(index) else {
        return Ok(None);
    };
    let failure = limit.failure(failure);
    match limit.apply(&key, Op::Check(limit.spec.cost)).await {
        Ok(d) if d.is_allowed() => {
            held.push(Held {
                index,
                key,
                decision: d,
            });
            Ok(Some(d))
        }
        Ok(d) => {
            rollback(compiled, held).await;
            Err(Stop::Rejected(index, d))
        }
        Err(e) => {
            limit.store_failed(&e, failure);
            if failure == FailurePolicy::FailClosed {
                rollback(compiled, held).await;
                return Err(Stop::Failed(e));
            }
            Ok(None)
        }
    }
}

/// Whether `St` is shared by several instances (the Redis store), where a count kept in this
/// process would not be the cluster's.
fn shared_store<St: 'static>() -> bool {
    #[cfg(feature = "redis")]
    {
        std::any::TypeId::of::<St>() == std::any::TypeId::of::<crate::store::redis::RedisStore>()
    }
    #[cfg(not(feature = "redis"))]
    false
}

/// Gives back what the limits before a rejection reserved (settled to 0), except a shaping
/// queue's slot: giving it back would put two waiters in one departure, so it stays a gap
/// (under-admission, never over-admission).
async fn rollback<St: Store<Vec<u8>>, C: Clock>(compiled: &Compiled<St, C>, held: &[Held]) {
    for h in held {
        let Some(limit) = compiled.limits.get(h.index) else {
            continue;
        };
        if limit.spec.queue.is_some() {
            continue;
        }
        if let Some(r) = h.decision.reservation() {
            if let Err(e) = limit.apply(&h.key, Op::settle(r, 0)).await {
                limit.metrics.store_errors.increment(1);
                tracing::warn!(limit = %limit.spec.name, error = %e, "rollback failed");
            }
        }
    }
}

static SHADOW_LIMIT: http::HeaderName = http::HeaderName::from_static("x-ratelimit-shadow-limit");
static SHADOW_REMAINING: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-shadow-remaining");
static SHADOW_RESET: http::HeaderName = http::HeaderName::from_static("x-ratelimit-shadow-reset");

/// The fields of a forwarded request's response, joined with those of the rate-limit layers inside
/// (what they reported, [`Reported`]), and what this layer reports for the layers around it. A
/// rejection by a layer inside keeps its own fields.
fn write_success_headers<St, C, B>(
    compiled: &Compiled<St, C>,
    options: &RulesOptions,
    on_allowed: bool,
    allowed: &[Held],
    shadow: Option<(usize, Decision)>,
    res: &mut Response<B>,
) where
    St: Store<Vec<u8>>,
    C: Clock,
{
    if on_allowed && !rejected_inside(res.extensions()) {
        let mut below = res.extensions_mut().remove::<Reported>();
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
        if let Some(reported) = below {
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
    use super::*;

    fn lone(text: &str) -> bool {
        let file = RulesFile::parse(text).expect("a valid file");
        lone_enforced(file.limits.iter())
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
