//! The metrics of the rules layer, through the `metrics` facade: handles resolved when a limit is
//! built, so a request costs one atomic add per metric it touches. The key is never a label.

use metrics::{Counter, counter};

/// The metric names this crate records (pinned: dashboards rely on them).
pub const METRIC_NAMES: [&str; 4] = [
    "tollgate_requests_total",
    "tollgate_units_total",
    "tollgate_store_errors_total",
    "tollgate_rules_reloads_total",
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
