//! Per-key lanes: what one key's flood costs falls on that key.
//!
//! Every check of a key goes through the key's lane before it may take one of the store's slots
//! among the calls in flight: a lane lets at most [`PER_KEY`] checks of its key be in Redis's hands
//! at once (sent and not yet answered, a late reply's refund included). Later checks of the key
//! wait in the lane, in arrival order, until a check ahead of them is answered, then look at the
//! blocked-key cache first: once Redis has rejected the key, the waiters are answered from that
//! rejection without a call (they coalesce with the check ahead of them). A waiter still queued at
//! its deadline is shed, at no cost to any other key and without Redis having counted it.
//!
//! The bound: one key holds at most `PER_KEY` of the store's `max_in_flight` slots, so `n` keys
//! flooding at once leave `max_in_flight - PER_KEY * n` slots to every other key (254 of the default
//! 256 for a single flooding key). It also bounds a flood's under-admission: at most `PER_KEY` of a
//! key's checks per instance can be admitted by Redis after their caller gave up, and each of those
//! is refunded.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most checks of one key in flight at once, per store: the first, and one more.
pub(super) const PER_KEY: usize = 2;

/// The lanes of the keys that have a check in flight or waiting; a lane is dropped with its last
/// check.
#[derive(Default)]
pub(super) struct Lanes {
    map: DashMap<u64, Arc<Semaphore>>,
}

/// A place in a key's lane: while held, the lane is kept. [`Place::admit`] waits for a slot.
pub(super) struct Place {
    lanes: Arc<Lanes>,
    key: u64,
    lane: Option<Arc<Semaphore>>,
}

/// One of a lane's [`PER_KEY`] slots: held by the call's task until its reply (and any refund)
/// is done.
pub(super) struct Slot {
    // Dropped before the place (field order), so the lane can be released with it.
    _permit: OwnedSemaphorePermit,
    _place: Place,
}

impl Lanes {
    /// Joins the lane of `key` (a fingerprint of the key and its rule).
    pub(super) fn enter(self: &Arc<Self>, key: u64) -> Place {
        let lane = Arc::clone(
            &self
                .map
                .entry(key)
                .or_insert_with(|| Arc::new(Semaphore::new(PER_KEY))),
        );
        Place {
            lanes: Arc::clone(self),
            key,
            lane: Some(lane),
        }
    }

    /// Checks of keys with a lane now (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }

    /// Drops the lane of `key` if `lane` is its last handle besides the map's.
    fn leave(&self, key: u64, lane: Arc<Semaphore>) {
        // Handles are only cloned under the entry's shard lock, which `remove_if` holds: the count
        // cannot grow meanwhile. This handle and the map's: no other check is in the lane.
        self.map.remove_if(&key, |_, l| {
            Arc::ptr_eq(l, &lane) && Arc::strong_count(&lane) == 2
        });
    }
}

impl Place {
    /// A slot of the lane at once, if one is free.
    pub(super) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        self.lane.as_ref()?.clone().try_acquire_owned().ok()
    }

    /// Waits for a slot of the lane until `deadline`; `None` at the deadline.
    pub(super) async fn admit(
        &self,
        deadline: tokio::time::Instant,
    ) -> Option<OwnedSemaphorePermit> {
        let lane = Arc::clone(self.lane.as_ref()?);
        match tokio::time::timeout_at(deadline, lane.acquire_owned()).await {
            Ok(Ok(p)) => Some(p),
            _ => None,
        }
    }

    /// The slot, holding the place, to move into the call's task.
    pub(super) fn into_slot(self, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            _permit: permit,
            _place: self,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            self.lanes.leave(self.key, lane);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_key_gets_at_most_its_share_and_other_keys_are_not_held() {
        let lanes = Arc::new(Lanes::default());
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        let places: Vec<_> = (0..PER_KEY + 1).map(|_| lanes.enter(7)).collect();
        let slots: Vec<_> = places.iter().filter_map(Place::try_admit).collect();
        assert_eq!(slots.len(), PER_KEY);
        assert!(
            places[PER_KEY].admit(deadline).await.is_none(),
            "the third waits"
        );
        let other = lanes.enter(8);
        assert!(other.try_admit().is_some(), "another key is not held");
        drop(slots);
        assert!(places[PER_KEY].try_admit().is_some());
    }

    #[test]
    fn a_lane_is_dropped_with_its_last_check() {
        let lanes = Arc::new(Lanes::default());
        let a = lanes.enter(1);
        let b = lanes.enter(1);
        let permit = a.try_admit().unwrap();
        let slot = a.into_slot(permit);
        drop(b);
        assert_eq!(lanes.len(), 1, "the slot keeps the lane");
        drop(slot);
        assert_eq!(lanes.len(), 0);
    }
}
