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
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most checks of one key in flight at once, per store: the first, and one more.
pub(super) const PER_KEY: usize = 2;

/// The lanes of the keys that have a check in flight or waiting; a lane is dropped with its last
/// check.
#[derive(Default)]
pub(super) struct Lanes {
    map: DashMap<u64, Arc<Lane>>,
}

/// One key's lane: its slots, and how many checks hold a place in it (in flight or waiting).
pub(super) struct Lane {
    slots: Arc<Semaphore>,
    places: AtomicUsize,
}

impl Lane {
    /// Whether no check of the key waits behind the ones in flight: the key is not flooding, so
    /// a slow reply to it is this process's or Redis's slowness, not the key's own doing.
    pub(super) fn unqueued(&self) -> bool {
        self.places.load(Ordering::Acquire) <= PER_KEY
    }
}

/// A place in a key's lane: while held, the lane is kept. [`Place::admit`] waits for a slot.
pub(super) struct Place {
    lanes: Arc<Lanes>,
    key: u64,
    lane: Option<Arc<Lane>>,
}

/// One of a lane's [`PER_KEY`] slots: held by the call's task until its reply (and any refund)
/// is done.
pub(super) struct Slot {
    // Dropped before the place (field order), so the lane can be released with it.
    _permit: OwnedSemaphorePermit,
    place: Place,
}

impl Slot {
    /// The key's lane, to see whether checks wait in it.
    pub(super) fn lane(&self) -> Option<Arc<Lane>> {
        self.place.lane()
    }
}

impl Lanes {
    /// Joins the lane of `key` (a fingerprint of the key and its rule).
    pub(super) fn enter(self: &Arc<Self>, key: u64) -> Place {
        let lane = {
            let entry = self.map.entry(key).or_insert_with(|| {
                Arc::new(Lane {
                    slots: Arc::new(Semaphore::new(PER_KEY)),
                    places: AtomicUsize::new(0),
                })
            });
            // Counted under the entry's lock, so `leave` cannot drop the lane meanwhile.
            entry.places.fetch_add(1, Ordering::AcqRel);
            Arc::clone(&entry)
        };
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

    /// Leaves the lane of `key`, dropping it with its last place.
    fn leave(&self, key: u64, lane: &Lane) {
        if lane.places.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Places are only taken under the entry's lock, which `remove_if` holds.
            self.map.remove_if(&key, |_, l| {
                std::ptr::eq(&**l, lane) && l.places.load(Ordering::Acquire) == 0
            });
        }
    }
}

impl Place {
    /// A slot of the lane at once, if one is free.
    pub(super) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.lane.as_ref()?.slots)
            .try_acquire_owned()
            .ok()
    }

    /// Waits for a slot of the lane until `deadline`; `None` at the deadline.
    pub(super) async fn admit(
        &self,
        deadline: tokio::time::Instant,
    ) -> Option<OwnedSemaphorePermit> {
        let slots = Arc::clone(&self.lane.as_ref()?.slots);
        match tokio::time::timeout_at(deadline, slots.acquire_owned()).await {
            Ok(Ok(p)) => Some(p),
            _ => None,
        }
    }

    /// The key's lane, to see whether checks wait in it.
    pub(super) fn lane(&self) -> Option<Arc<Lane>> {
        self.lane.clone()
    }

    /// The slot, holding the place, to move into the call's task.
    pub(super) fn into_slot(self, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            _permit: permit,
            place: self,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            self.lanes.leave(self.key, &lane);
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
        let again = lanes.enter(1);
        assert!(again.lane().unwrap().unqueued());
        let more: Vec<_> = (0..PER_KEY).map(|_| lanes.enter(1)).collect();
        assert!(
            !again.lane().unwrap().unqueued(),
            "{} places",
            more.len() + 1
        );
    }
}
