//! A fresh Cluster connection when the circuit breaker's probe fails.
//!
//! The `redis` crate's Cluster client can stay wedged after a failover under load: after a
//! `CLUSTER FAILOVER` during a flood, every call through the old `ClusterConnection` took its full
//! response timeout and failed, for as long as the test waited (40 s), while a new connection to
//! the same nodes decided at once (`redis_cluster_failover::
//! a_cluster_failover_under_a_flood_stays_bounded_and_recovers`). So when a probe of the open
//! circuit fails on a Cluster, the store connects again in the background and swaps the new
//! connection in; calls in flight finish on the old one. At most one attempt at a time, and at
//! most one per [`EVERY`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{Conn, Inner, Target, connect};

/// The least time between two reconnections.
const EVERY: Duration = Duration::from_secs(1);

/// What a new connection needs, kept from the build.
pub(super) struct Rebuild {
    target: Target,
    connect_timeout: Duration,
    running: AtomicBool,
    /// When the last attempt started, in [`Inner::clock`] nanoseconds (0: never).
    last: AtomicU64,
}

impl Rebuild {
    pub(super) fn new(target: Target, connect_timeout: Duration) -> Self {
        Self {
            target,
            connect_timeout,
            running: AtomicBool::new(false),
            last: AtomicU64::new(0),
        }
    }
}

/// A probe of the open circuit failed: on a Cluster, connect again in the background.
pub(super) fn after_failed_probe(inner: &Arc<Inner>) {
    if !matches!(&*inner.conn.read(), Some(Conn::Cluster(_))) {
        return;
    }
    let r = &inner.rebuild;
    let now = inner.clock();
    let every = u64::try_from(EVERY.as_nanos()).unwrap_or(u64::MAX);
    let last = r.last.load(Ordering::Acquire);
    if last != 0 && now.saturating_sub(last) < every {
        return;
    }
    if r.running.swap(true, Ordering::AcqRel) {
        return;
    }
    r.last.store(now, Ordering::Release);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        r.running.store(false, Ordering::Release);
        return;
    };
    let weak = Arc::downgrade(inner);
    rt.spawn(async move {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let r = &inner.rebuild;
        match connect(&r.target, inner.timeout, r.connect_timeout).await {
            Ok(conn @ Conn::Cluster(_)) => {
                *inner.conn.write() = Some(conn);
                tracing::info!("reconnected to the Redis Cluster after a failed probe");
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "reconnecting to the Redis Cluster"),
        }
        r.running.store(false, Ordering::Release);
    });
}
