//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`, on with
//! `rules`): the [`RateLimitLayer`](crate::layer::RateLimitLayer) and the rules file's layer record
//! them for whatever recorder the application installs (none installed: they cost a branch each).
//! Handles are resolved when a layer (or a rules file's limit) is built, so a request costs one
//! atomic add per metric it touches; install the recorder before building the layers. The key is
//! never a label; a layer's `limit` label is its limiter's [name](crate::Builder::name).
//!
//! Every metric ([`METRIC_NAMES`]), its labels and what it counts, and how often the store
//! figures are refreshed, are in the guide's chapter [metrics and tracing](crate::guide::metrics);
//! [`STORE_LATENCY_BUCKETS`] are the latency histogram's buckets.
//! [`publish_stats`] publishes the store figures of every live layer and rules file at once
//! (they are otherwise refreshed once a second).
//!
//! A second limiter (or concurrency cap) with the `limit` label of one still alive in the process
//! logs one warning when its layer is built: their series add up. Two layers on one limiter
//! share it quietly, as does a cap named like a limiter (its pair); unnamed limiters keep
//! `default`.

mod live;

use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

pub(crate) use live::{Kind, LiveLabel, Refresh, refresh_every_second};

/// Publishes the store figures (`tollgate_keys`, `tollgate_evictions_total`,
/// `tollgate_breaker_open`, `tollgate_store_up`, `tollgate_settle_dropped_units_total`) of every
/// live layer and rules file now, instead of at the next refresh (every second): e.g. before a
/// scrape. The per-request metrics need no call.
pub fn publish_stats() {
    live::refresh_all_now();
}

/// The metric names this crate records (pinned: dashboards rely on them).
pub const METRIC_NAMES: [&str; 12] = [
    "tollgate_requests_total",
    "tollgate_units_total",
    "tollgate_store_errors_total",
    "tollgate_store_latency_seconds",
    "tollgate_keys",
    "tollgate_evictions_total",
    "tollgate_breaker_open",
    "tollgate_rules_reloads_total",
    "tollgate_store_up",
    "tollgate_in_flight",
    "tollgate_settle_dropped_units_total",
    "tollgate_settle_unmatched_total",
];

/// The buckets of `tollgate_store_latency_seconds`, in seconds (0.5 ms to 1 s). The histogram's
/// buckets are the exporter's setting: give these to it (the `server` example does, with
/// `metrics-exporter-prometheus`'s `set_buckets_for_metric`).
pub const STORE_LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0,
];

/// One limit's handles (a limiter of a layer, or a limit of a rules file).
pub(crate) struct LimitMetrics {
    pub(crate) allowed: Counter,
    pub(crate) rejected: Counter,
    /// Rules file only (shadow limits).
    #[cfg_attr(not(feature = "rules"), allow(dead_code))]
    pub(crate) shadow_rejected: Counter,
    pub(crate) fail_open: Counter,
    pub(crate) fail_closed: Counter,
    pub(crate) no_key: Counter,
    /// The Redis store's local fallback decided (outage).
    pub(crate) local_allowed: Counter,
    pub(crate) local_rejected: Counter,
    /// The Redis store shed the check (overload).
    pub(crate) shed: Counter,
    pub(crate) units: Counter,
    pub(crate) store_errors: Counter,
    /// Remote stores only: the time of a decision that was not ready at once.
    pub(crate) store_latency: Histogram,
    /// Memory store only (published by `publish_stats`).
    pub(crate) keys: Gauge,
    pub(crate) evictions: Counter,
    /// Settled units a full moving-window log dropped (published by `publish_stats`).
    pub(crate) settle_dropped: Counter,
    /// 1 while the store's circuit breaker is open (published by `publish_stats`).
    pub(crate) breaker_open: Gauge,
    /// 0 while the store cannot be used (published by `publish_stats`).
    pub(crate) store_up: Gauge,
    /// The label, held while these handles live (a second limiter of the name warns).
    _live: LiveLabel,
}

impl LimitMetrics {
    /// The handles of the limiter `owner` (its store's address) under the label `limit`.
    pub(crate) fn new(limit: &str, owner: usize) -> Self {
        let outcome = |o: &'static str| counter!("tollgate_requests_total", "limit" => limit.to_owned(), "outcome" => o);
        Self {
            allowed: outcome("allowed"),
            rejected: outcome("rejected"),
            shadow_rejected: outcome("shadow_rejected"),
            fail_open: outcome("fail_open"),
            fail_closed: outcome("fail_closed"),
            no_key: outcome("no_key"),
            local_allowed: outcome("local_allowed"),
            local_rejected: outcome("local_rejected"),
            shed: outcome("shed"),
            units: counter!("tollgate_units_total", "limit" => limit.to_owned()),
            store_errors: counter!("tollgate_store_errors_total", "limit" => limit.to_owned()),
            store_latency: histogram!("tollgate_store_latency_seconds", "limit" => limit.to_owned()),
            keys: gauge!("tollgate_keys", "limit" => limit.to_owned()),
            evictions: counter!("tollgate_evictions_total", "limit" => limit.to_owned()),
            settle_dropped: counter!("tollgate_settle_dropped_units_total", "limit" => limit.to_owned()),
            breaker_open: gauge!("tollgate_breaker_open", "limit" => limit.to_owned()),
            store_up: gauge!("tollgate_store_up", "limit" => limit.to_owned()),
            _live: LiveLabel::new(Kind::Limiter, limit, owner),
        }
    }

    /// Counts a decision of the store: allowed or rejected, by the store or its local fallback
    /// (the units an admitted request spends are counted once settled).
    #[inline]
    pub(crate) fn decided(&self, d: &crate::Decision) {
        match (d.is_allowed(), d.decided_locally()) {
            (true, false) => self.allowed.increment(1),
            (true, true) => self.local_allowed.increment(1),
            (false, _) if d.was_shed() => self.shed.increment(1),
            (false, false) => self.rejected.increment(1),
            (false, true) => self.local_rejected.increment(1),
        }
    }

    /// Counts the units a request was charged once settled (its estimate when nothing settled it).
    #[inline]
    pub(crate) fn charged(&self, units: u32) {
        if units > 0 {
            self.units.increment(u64::from(units));
        }
    }

    /// Publishes what the store counts: keys held and evictions (memory store), the circuit
    /// breaker's state (Redis store).
    pub(crate) fn publish(&self, stats: &crate::Stats) {
        self.keys.set(stats.keys as f64);
        self.evictions.absolute(stats.evictions);
        self.settle_dropped.absolute(stats.settle_dropped_units);
        self.publish_health(stats);
    }

    /// Publishes the store's health: its circuit breaker and whether it can be used (also for a
    /// store shared by several limits).
    pub(crate) fn publish_health(&self, stats: &crate::Stats) {
        self.breaker_open
            .set(if stats.breaker_open { 1.0 } else { 0.0 });
        self.store_up.set(if stats.store_down { 0.0 } else { 1.0 });
    }
}

impl std::fmt::Debug for LimitMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitMetrics").finish_non_exhaustive()
    }
}

/// A layer's limiter and its handles: the refresh thread publishes the limiter's store figures
/// every second while the layer lives.
pub(crate) struct LimiterMetrics<K, St, C> {
    handles: LimitMetrics,
    limiter: crate::RateLimiter<K, St, C>,
}

impl<K, St, C> LimiterMetrics<K, St, C>
where
    K: crate::store::StoreKey,
    St: crate::store::Store<K>,
    C: crate::Clock,
{
    /// The handles of `limiter`, its gauges refreshed every second from now on.
    pub(crate) fn refreshed(limiter: crate::RateLimiter<K, St, C>) -> Arc<Self> {
        let owner = std::ptr::from_ref(limiter.store()) as usize;
        let this = Arc::new(Self {
            handles: LimitMetrics::new(limiter.name(), owner),
            limiter,
        });
        let weak: std::sync::Weak<dyn Refresh> = Arc::downgrade(&this) as _;
        refresh_every_second(weak);
        this
    }

    /// Publishes the limiter's store figures now.
    pub(crate) fn publish_now(&self) {
        self.handles.publish(&self.limiter.stats());
    }
}

impl<K, St, C> Refresh for LimiterMetrics<K, St, C>
where
    K: crate::store::StoreKey,
    St: crate::store::Store<K>,
    C: crate::Clock,
{
    fn refresh(&self) {
        self.publish_now();
    }
}

impl<K, St, C> std::ops::Deref for LimiterMetrics<K, St, C> {
    type Target = LimitMetrics;

    fn deref(&self) -> &LimitMetrics {
        &self.handles
    }
}

/// `tollgate_rules_reloads_total{result}` (the initial load is not counted).
#[cfg(feature = "rules")]
pub(crate) struct ReloadMetrics {
    pub(crate) ok: Counter,
    pub(crate) error: Counter,
}

#[cfg(feature = "rules")]
impl ReloadMetrics {
    pub(crate) fn new() -> Self {
        Self {
            ok: counter!("tollgate_rules_reloads_total", "result" => "ok"),
            error: counter!("tollgate_rules_reloads_total", "result" => "error"),
        }
    }
}
