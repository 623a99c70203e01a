//! The metrics of the rules layer, through the `metrics` facade: handles resolved when a limit is
//! built, so a request costs one atomic add per metric it touches. The key is never a label.

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

/// The metric names this crate records (pinned: dashboards rely on them).
pub const METRIC_NAMES: [&str; 7] = [
    "tollgate_requests_total",
    "tollgate_units_total",
    "tollgate_store_errors_total",
    "tollgate_store_latency_seconds",
    "tollgate_keys",
    "tollgate_evictions_total",
    "tollgate_rules_reloads_total",
];

/// The buckets of `tollgate_store_latency_seconds`, in seconds (0.5 ms to 1 s). The histogram's
/// buckets are the exporter's setting: give these to it (the `server` example does, with
/// `metrics-exporter-prometheus`'s `set_buckets_for_metric`).
pub const STORE_LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0,
];

/// One limit's handles.
pub(super) struct LimitMetrics {
    pub(super) allowed: Counter,
    pub(super) rejected: Counter,
    pub(super) shadow_rejected: Counter,
    pub(super) fail_open: Counter,
    pub(super) fail_closed: Counter,
    pub(super) no_key: Counter,
    pub(super) units: Counter,
    pub(super) store_errors: Counter,
    /// Remote stores only: the time of a decision that was not ready at once.
    pub(super) store_latency: Histogram,
    /// Memory store only (published by [`Rules::publish_stats`](super::Rules::publish_stats)).
    pub(super) keys: Gauge,
    pub(super) evictions: Counter,
}

impl LimitMetrics {
    pub(super) fn new(limit: &str) -> Self {
        let outcome = |o: &'static str| counter!("tollgate_requests_total", "limit" => limit.to_owned(), "outcome" => o);
        Self {
            allowed: outcome("allowed"),
            rejected: outcome("rejected"),
            shadow_rejected: outcome("shadow_rejected"),
            fail_open: outcome("fail_open"),
            fail_closed: outcome("fail_closed"),
            no_key: outcome("no_key"),
            units: counter!("tollgate_units_total", "limit" => limit.to_owned()),
            store_errors: counter!("tollgate_store_errors_total", "limit" => limit.to_owned()),
            store_latency: histogram!("tollgate_store_latency_seconds", "limit" => limit.to_owned()),
            keys: gauge!("tollgate_keys", "limit" => limit.to_owned()),
            evictions: counter!("tollgate_evictions_total", "limit" => limit.to_owned()),
        }
    }
}

/// `tollgate_rules_reloads_total{result}` (the initial load is not counted).
pub(super) struct ReloadMetrics {
    pub(super) ok: Counter,
    pub(super) error: Counter,
}

impl ReloadMetrics {
    pub(super) fn new() -> Self {
        Self {
            ok: counter!("tollgate_rules_reloads_total", "result" => "ok"),
            error: counter!("tollgate_rules_reloads_total", "result" => "error"),
        }
    }
}
