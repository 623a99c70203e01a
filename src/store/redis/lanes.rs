//! Per-key lanes: what one key's flood costs falls on that key, and a hot key alone may use the
//! store.
//!
//! Every check of a key goes through the key's lane before it may take one of the store's slots
//! among the calls in flight (`max_in_flight`, 256 by default). A key always has its first
//! [`PER_KEY`] calls in flight (sent and not yet answered, a late reply's refund included). Past
//! those, a check of the key takes a slot only if it can take it from the store's free slots at
//! once and still leave free a reserve of a quarter of the store's slots ([`reserve`]: 64 of 256)
//! and the slots of its own first two, and only while the key's calls past two stay below a 64th of the quota Redis last said
//! the key has left (none before Redis first admitted the key, none once Redis rejected it, until
//! Redis admits it again). Other checks of the key wait in the lane, in arrival order, until a
//! call of the key is answered; then they look at the blocked-key cache first: once Redis has
//! rejected the key, the waiters are answered from that rejection without a call. A waiter still
//! queued at its deadline is shed, at no cost to any other key and without Redis having counted
//! it.
//!
//! The bounds, with `m` slots (`max_in_flight`) and a reserve `r = m / 4`:
//! - Under contention: a key's calls past its first two never take the last `r + 2` free slots,
//!   so however many keys flood, they leave at least `r` slots (64 of 256) to the checks of other
//!   keys besides their own first two; once other keys' calls hold those, no flooding key gets a
//!   slot past its two, and each falls back to two calls in flight as its calls are answered
//!   (within a round trip). The calls of flooding keys past their first two thus hold at most
//!   `m - r - 2` slots between them, and none once other keys need the rest.
//! - Without contention: one key alone reaches `m - r - 2` calls in flight (190 of 256; never more
//!   than `m - r`): a hot key under its limit is not held to two round trips at a time.
//! - A flood's under-admission: when the key reaches its limit, at most `2 + remaining / 64` of
//!   its checks are in Redis's hands per store (and two once Redis rejected it), so few can be
//!   admitted by Redis after their caller gave up (each of those is refunded): at most 2 plus
//!   1.6 % of the limit per instance.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The calls of one key in flight at once that it always has, per store: the first, and one more.
pub(super) const PER_KEY: usize = 2;

/// A key's calls past its first [`PER_KEY`] stay below this share of the quota Redis last left it
/// (`remaining / 64`): when the key reaches its limit, few of its checks are in Redis's hands.
const ROOM_SHARE: u32 = 64;

/// The free slots a key's calls past its first [`PER_KEY`] leave to other keys: a quarter of the
/// store's `max_in_flight`.
pub(super) fn reserve(max_in_flight: usize) -> usize {
    max_in_flight / 4
}

/// The lanes of the keys that have a check in flight or waiting; a lane is dropped with its last
/// check.
pub(super) struct Lanes {
    map: DashMap<u64, Arc<Lane>>,
    /// The store's slots among the calls in flight, which a key's calls past its first two take
    /// here.
    gate: Arc<Semaphore>,
    reserve: usize,
    /// The most calls of one key in flight at once so far.
    peak: AtomicU64,
    /// Held while a check past its key's first two looks at the gate's free slots and takes one,
    /// so two such checks cannot both see the same free slots.
    past_two: Mutex<()>,
    /// The fewest free slots of the gate seen while a take past a key's first two held what it
    /// took (what `counters().in_flight` and other keys' checks could see meanwhile).
    #[cfg(test)]
    fewest_free: AtomicUsize,
}

/// One key's lane: its calls in flight, its waiters, and how many checks hold a place in it.
pub(super) struct Lane {
    held: AtomicUsize,
    waiting: AtomicUsize,
    places: AtomicUsize,
    /// The calls the key may have past its first two: a share of the quota Redis last left it (0
    /// before Redis first admitted it and after Redis rejected it).
    room: AtomicUsize,
    /// Wakes a waiter when a call of the key is answered.
    turn: Notify,
}

impl Lane {
    /// Whether no check of the key waits in its lane and it has no more than its first two calls
    /// in flight: the key is not flooding, so a slow reply to it is this process's or Redis's
    /// slowness, not the key's own doing.
    pub(super) fn unqueued(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0 && self.held.load(Ordering::Acquire) <= PER_KEY
    }

    /// Redis admitted a check of the key and left it `remaining`.
    pub(super) fn admitted(&self, remaining: u32) {
        let room = usize::try_from(remaining / ROOM_SHARE).unwrap_or(usize::MAX);
        self.room.store(room, Ordering::Release);
    }

    /// Redis rejected the key: no calls past two until Redis admits it again.
    pub(super) fn narrow(&self) {
        self.room.store(0, Ordering::Release);
    }

    /// One of the key's first two calls, or one past them within its room, from the store's free
    /// slots above the reserve (with its slot of the store's gate).
    fn take(self: &Arc<Self>, lanes: &Lanes) -> Option<Turn> {
        let room = || PER_KEY.saturating_add(self.room.load(Ordering::Acquire));
        let mut held = self.held.load(Ordering::Acquire);
        while held < PER_KEY {
            match self.held.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(self.turn(lanes, held, None)),
                Err(now) => held = now,
            }
        }
        if held >= room() {
            return None;
        }
        let slot = lanes.take_past_two()?;
        // Counted only with the slot in hand and within the room, so racing checks cannot
        // together pass it (a slot that does not fit goes back to the gate).
        loop {
            if held >= room() {
                return None;
            }
            match self.held.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(self.turn(lanes, held, Some(slot))),
                Err(now) => held = now,
            }
        }
    }

    /// The turn of the key's `held + 1`th call in flight.
    fn turn(
        self: &Arc<Self>,
        lanes: &Lanes,
        held: usize,
        gate: Option<OwnedSemaphorePermit>,
    ) -> Turn {
        lanes.peak.fetch_max(held as u64 + 1, Ordering::Relaxed);
        Turn {
            gate,
            lane: Arc::clone(self),
        }
    }
}

/// A place in a key's lane: while held, the lane is kept. [`Place::admit`] waits for a turn.
pub(super) struct Place {
    lanes: Arc<Lanes>,
    key: u64,
    lane: Option<Arc<Lane>>,
}

/// A call of the key in flight: counted in its lane until dropped, with its slot of the store's
/// gate when it is past the key's first two.
pub(super) struct Turn {
    gate: Option<OwnedSemaphorePermit>,
    lane: Arc<Lane>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        // The gate's slot first, so the woken waiter sees it free.
        drop(self.gate.take());
        self.lane.held.fetch_sub(1, Ordering::AcqRel);
        self.lane.turn.notify_one();
    }
}

/// A call's turn in its lane with its place: held by the call's task until its reply (and any
/// refund) is done.
pub(super) struct Slot {
    // Dropped before the place (field order), so the lane can be released with it.
    turn: Turn,
    place: Place,
}

impl Slot {
    /// The key's lane, to see whether checks wait in it.
    pub(super) fn lane(&self) -> Option<Arc<Lane>> {
        self.place.lane()
    }

    /// The store's slot taken with the turn (a call past the key's first two), if any.
    pub(super) fn take_gate(&mut self) -> Option<OwnedSemaphorePermit> {
        self.turn.gate.take()
    }
}

impl Lanes {
    /// The lanes of a store whose calls in flight are `gate`'s `max_in_flight` slots.
    pub(super) fn new(gate: Arc<Semaphore>, max_in_flight: usize) -> Self {
        Lanes {
            map: DashMap::new(),
            gate,
            reserve: reserve(max_in_flight),
            peak: AtomicU64::new(0),
            past_two: Mutex::new(()),
            #[cfg(test)]
            fewest_free: AtomicUsize::new(usize::MAX),
        }
    }

    /// The most calls of one key in flight at once so far.
    pub(super) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// A slot of the gate for a call past its key's first two, only if the reserve and the slots
    /// of the key's first two (taken when they are sent) stay free after it.
    ///
    /// One slot is taken, never more: taking the reserve with it and giving the reserve back
    /// (`try_acquire_many`, then keeping one) showed the store full meanwhile, to its `in_flight`
    /// counter (a lone flooding key read as 8 calls in flight of 8, with 3 sent) and to other
    /// keys' checks. Other calls take their slots without this lock, one at a time: one taken
    /// between the look and the take is as if it came after this one, which found its slots free.
    fn take_past_two(&self) -> Option<OwnedSemaphorePermit> {
        let _one_at_a_time = self.past_two.lock();
        if self.gate.available_permits() < self.reserve + PER_KEY + 1 {
            return None;
        }
        let slot = Arc::clone(&self.gate).try_acquire_owned().ok()?;
        #[cfg(test)]
        self.fewest_free
            .fetch_min(self.gate.available_permits(), Ordering::Relaxed);
        Some(slot)
    }

    /// Joins the lane of `key` (a fingerprint of the key and its rule).
    pub(super) fn enter(self: &Arc<Self>, key: u64) -> Place {
        let lane = {
            let entry = self.map.entry(key).or_insert_with(|| {
                Arc::new(Lane {
                    held: AtomicUsize::new(0),
                    waiting: AtomicUsize::new(0),
                    places: AtomicUsize::new(0),
                    room: AtomicUsize::new(0),
                    turn: Notify::new(),
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

/// Counts a check among its lane's waiters while it waits.
struct Waiting<'a>(&'a Lane);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Place {
    /// A turn at once, if one is free and no check of the key waits ahead of this one.
    pub(super) fn try_admit(&self) -> Option<Turn> {
        let lane = self.lane.as_ref()?;
        if lane.waiting.load(Ordering::Acquire) > 0 {
            return None;
        }
        lane.take(&self.lanes)
    }

    /// Waits for a turn until `deadline`, woken when a call of the key is answered; `None` at
    /// the deadline.
    pub(super) async fn admit(&self, deadline: tokio::time::Instant) -> Option<Turn> {
        let lane = self.lane.as_ref()?;
        lane.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(lane);
        loop {
            let mut woken = pin!(lane.turn.notified());
            // Registered before looking, so an answer in between is not missed.
            woken.as_mut().enable();
            if let Some(turn) = lane.take(&self.lanes) {
                // The next waiter may find a turn too (calls past two need no answer to wait for).
                lane.turn.notify_one();
                return Some(turn);
            }
            tokio::time::timeout_at(deadline, woken).await.ok()?;
        }
    }

    /// The key's lane, to see whether checks wait in it.
    pub(super) fn lane(&self) -> Option<Arc<Lane>> {
        self.lane.clone()
    }

    /// The slot, holding the place, to move into the call's task.
    pub(super) fn into_slot(self, turn: Turn) -> Slot {
        Slot { turn, place: self }
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
mod tests;
