//! The circuit breaker: after consecutive outage failures the store stops calling Redis for a
//! cool-down, then lets one probe through (half-open); the probe's success closes the circuit.
//!
//! Only outages count (connection errors, and timeouts during which Redis answered nothing at all);
//! calls shed for overload and rejections do not. While the circuit is open, a decision costs no
//! round trip and no timeout: the store answers by its failure policy at once.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the breaker lets a call do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// Closed: call Redis.
    Call,
    /// Half-open: call Redis as the one probe; report the outcome with `success`/`failure`.
    Probe,
    /// Open: do not call Redis.
    Refuse,
}

pub(super) struct Breaker {
    threshold: u32,
    cool_down: Duration,
    /// Consecutive outage failures since the last success.
    failures: AtomicU32,
    /// Nanoseconds since `epoch` when the circuit opened; 0 while closed.
    opened_at: AtomicU64,
    /// A probe is out (half-open).
    probing: AtomicBool,
    /// Times the circuit opened.
    opens: AtomicU64,
    epoch: Instant,
}

impl Breaker {
    pub(super) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            failures: AtomicU32::new(0),
            opened_at: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            opens: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        // +1: 0 means "closed".
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Whether a call may go to Redis now.
    pub(super) fn pass(&self) -> Pass {
        let opened = self.opened_at.load(Ordering::Acquire);
        if opened == 0 {
            return Pass::Call;
        }
        let cool = u64::try_from(self.cool_down.as_nanos()).unwrap_or(u64::MAX);
        if self.now().saturating_sub(opened) < cool {
            return Pass::Refuse;
        }
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Pass::Probe
        } else {
            Pass::Refuse
        }
    }

    /// A reply came (any reply Redis sent, a rejection included): close the circuit.
    pub(super) fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.opened_at.load(Ordering::Acquire) != 0 {
            self.opened_at.store(0, Ordering::Release);
            self.probing.store(false, Ordering::Release);
        }
    }

    /// An outage failure: open the circuit after `threshold` in a row, or at once after a failed
    /// probe.
    pub(super) fn failure(&self, probe: bool) {
        let n = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if probe || (n >= self.threshold && self.opened_at.load(Ordering::Acquire) == 0) {
            if self.opened_at.swap(self.now(), Ordering::AcqRel) == 0 {
                self.opens.fetch_add(1, Ordering::Relaxed);
            }
            self.probing.store(false, Ordering::Release);
        }
    }

    /// A probe ended without a verdict on Redis's health (it was shed, or the call never left):
    /// let another probe try.
    pub(super) fn release_probe(&self) {
        self.probing.store(false, Ordering::Release);
    }

    pub(super) fn is_open(&self) -> bool {
        self.opened_at.load(Ordering::Acquire) != 0
    }

    pub(super) fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_a_probe_closes_it() {
        let b = Breaker::new(3, Duration::from_millis(30));
        b.failure(false);
        b.failure(false);
        b.success();
        b.failure(false);
        b.failure(false);
        assert_eq!(
            b.pass(),
            Pass::Call,
            "a success in between resets the count"
        );
        b.failure(false);
        assert_eq!(b.pass(), Pass::Refuse);
        assert_eq!(b.opens(), 1);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.pass(), Pass::Probe);
        assert_eq!(b.pass(), Pass::Refuse, "one probe at a time");
        b.success();
        assert_eq!(b.pass(), Pass::Call);
        assert!(!b.is_open());
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let b = Breaker::new(1, Duration::from_millis(20));
        b.failure(false);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(b.pass(), Pass::Probe);
        b.failure(true);
        assert_eq!(b.pass(), Pass::Refuse);
        assert_eq!(b.opens(), 1, "still the same outage");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(b.pass(), Pass::Probe);
        b.release_probe();
        assert_eq!(b.pass(), Pass::Probe);
    }
}
