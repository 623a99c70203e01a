//! A guard against log storms: an action passes at most once per interval, across threads.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets something (a warning) through at most once per interval, measured on this process's
/// monotonic clock. Lock-free: one load on the quiet path.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    /// Milliseconds since the process's first use of a throttle, plus one (0: never passed).
    last: AtomicU64,
}

impl Throttle {
    /// `true` for the first call, then at most once per `every`.
    pub(crate) fn ready(&self, every: Duration) -> bool {
        static START: OnceLock<Instant> = OnceLock::new();
        let now = u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let every = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
        let last = self.last.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= every)
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_once_per_interval() {
        let t = Throttle::default();
        assert!(t.ready(Duration::from_secs(3600)));
        assert!(!t.ready(Duration::from_secs(3600)));
        assert!(t.ready(Duration::ZERO));
    }
}
