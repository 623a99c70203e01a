//! [`WaitGuard`]: counts a request among the waiters of a layer (pacing, the shaping queue, the
//! client-side [`PaceLayer`](super::PaceLayer)) for as long as it waits, and runs what a waiter
//! that goes away must undo (a queued request's step back).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a waiter dropped before its wait ended undoes.
pub(crate) type OnCancel = Box<dyn FnOnce() + Send + Sync>;

/// Counts a waiter for as long as it lives; dropped before [`done`](Self::done), it runs its
/// cancel action.
pub(crate) struct WaitGuard {
    count: Arc<AtomicUsize>,
    on_cancel: Option<OnCancel>,
}

impl WaitGuard {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self {
            count: Arc::clone(count),
            on_cancel: None,
        }
    }

    /// A waiter that runs `f` if it is dropped before its wait ends.
    pub(crate) fn on_cancel(mut self, f: OnCancel) -> Self {
        self.on_cancel = Some(f);
        self
    }

    /// The wait ended: no longer a waiter, nothing to undo.
    pub(crate) fn done(mut self) {
        self.on_cancel = None;
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        if let Some(f) = self.on_cancel.take() {
            f();
        }
    }
}
