//! The layers and caps alive in this process, by `limit` label: a second one built with a label
//! another one holds warns once (their series would add up), and the store figures of the live
//! layers (`tollgate_keys`, `tollgate_evictions_total`, `tollgate_breaker_open`,
//! `tollgate_store_up`) are refreshed once a second by one thread, off the request path.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

/// What owns a label: a limiter's layer (or a rules file's limit), or a concurrency cap. A cap
/// named like a limiter is a pair, not a clash: they are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Limiter,
    Cap,
}

impl Kind {
    fn text(self) -> &'static str {
        match self {
            Self::Limiter => "rate limiter",
            Self::Cap => "concurrency cap",
        }
    }
}

/// The owners alive per label, each with how many holders (layers of one limiter) it has.
type Labels = HashMap<(Kind, Box<str>), Vec<(usize, usize)>>;

static LABELS: LazyLock<Mutex<Labels>> = LazyLock::new(Mutex::default);

/// One holder of a `limit` label, counted until dropped. Several holders of one owner (two layers
/// on one limiter, route and router level, or a rules file's versions across reloads) share it
/// quietly.
pub(crate) struct LiveLabel {
    kind: Kind,
    label: Box<str>,
    owner: usize,
}

impl LiveLabel {
    /// Registers `owner` under `label`; warns when another owner holds it.
    pub(crate) fn new(kind: Kind, label: &str, owner: usize) -> Self {
        let mut labels = LABELS.lock();
        let owners = labels.entry((kind, label.into())).or_default();
        match owners.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, holders)) => *holders += 1,
            None => {
                if !owners.is_empty() {
                    tracing::warn!(
                        limit = label,
                        "a second {} named {label:?} is live in this process: its metrics add up \
                         with the first one's under limit=\"{label}\"; name each one \
                         (Builder::name, ConcurrencyLimit::named)",
                        kind.text()
                    );
                }
                owners.push((owner, 1));
            }
        }
        Self {
            kind,
            label: label.into(),
            owner,
        }
    }
}

impl Drop for LiveLabel {
    fn drop(&mut self) {
        let mut labels = LABELS.lock();
        let key = (self.kind, std::mem::take(&mut self.label));
        let Some(owners) = labels.get_mut(&key) else {
            return;
        };
        if let Some(at) = owners.iter().position(|(o, _)| *o == self.owner) {
            if let Some((_, holders)) = owners.get_mut(at) {
                *holders = holders.saturating_sub(1);
                if *holders == 0 {
                    owners.swap_remove(at);
                }
            }
        }
        if owners.is_empty() {
            labels.remove(&key);
        }
    }
}

impl std::fmt::Debug for LiveLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveLabel")
            .field("kind", &self.kind)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Something whose gauges are refreshed every [`REFRESH_EVERY`]: a layer's limiter, a rules
/// file's limits.
pub(crate) trait Refresh: Send + Sync {
    /// Publishes the store's figures into the gauges.
    fn refresh(&self);
}

/// How often the gauges of the live layers are refreshed.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Refreshed {
    targets: Vec<Weak<dyn Refresh>>,
    /// Whether the thread runs (it ends when no target is left).
    running: bool,
}

static REFRESHED: LazyLock<Mutex<Refreshed>> = LazyLock::new(Mutex::default);

/// Refreshes `target`'s gauges every second while it is alive (it is held weakly: dropping the
/// layer ends it). One thread serves every target of the process; it starts with the first and
/// ends when the last is gone.
pub(crate) fn refresh_every_second(target: Weak<dyn Refresh>) {
    let mut refreshed = REFRESHED.lock();
    refreshed.targets.push(target);
    if refreshed.running {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("tollgate-metrics".into())
        .spawn(refresh_loop);
    match spawned {
        Ok(_) => refreshed.running = true,
        Err(e) => tracing::warn!(
            error = %e,
            "rate limiter: the thread refreshing the metrics' gauges could not start; call \
             tollgate::metrics::publish_stats() before a scrape"
        ),
    }
}

/// Refreshes the gauges of every live target now, on the calling thread.
pub(crate) fn refresh_all_now() {
    let live: Vec<Arc<dyn Refresh>> = REFRESHED
        .lock()
        .targets
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for target in live {
        target.refresh();
    }
}

fn refresh_loop() {
    loop {
        std::thread::sleep(REFRESH_EVERY);
        let live: Vec<Arc<dyn Refresh>> = {
            let mut refreshed = REFRESHED.lock();
            refreshed.targets.retain(|t| t.strong_count() > 0);
            if refreshed.targets.is_empty() {
                refreshed.running = false;
                return;
            }
            refreshed.targets.iter().filter_map(Weak::upgrade).collect()
        };
        // Outside the lock: a layer built meanwhile registers at once.
        for target in live {
            target.refresh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holders(kind: Kind, label: &str) -> Vec<(usize, usize)> {
        LABELS
            .lock()
            .get(&(kind, label.into()))
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn a_label_counts_its_holders_per_owner_until_they_drop() {
        let label = "live-label-unit-test";
        let a = LiveLabel::new(Kind::Limiter, label, 1);
        let a2 = LiveLabel::new(Kind::Limiter, label, 1);
        let cap = LiveLabel::new(Kind::Cap, label, 2);
        assert_eq!(holders(Kind::Limiter, label), [(1, 2)]);
        let b = LiveLabel::new(Kind::Limiter, label, 3);
        assert_eq!(holders(Kind::Limiter, label), [(1, 2), (3, 1)]);
        drop(a);
        assert_eq!(holders(Kind::Limiter, label), [(1, 1), (3, 1)]);
        drop((a2, b));
        assert!(holders(Kind::Limiter, label).is_empty());
        assert_eq!(holders(Kind::Cap, label), [(2, 1)]);
        drop(cap);
        assert!(!LABELS.lock().keys().any(|(_, l)| &**l == label));
    }
}
