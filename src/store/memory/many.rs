//! Several limits decided at once on memory stores ([`Store::apply_all`](crate::store::Store::apply_all)),
//! all-or-nothing, with no transient state visible to another decision.
//!
//! Each store owns a fixed array of lock stripes; an item's stripe is chosen by its key's hash and
//! its scope's tag. A decision takes the stripes of all its items sorted by (store address, stripe
//! index) and deduplicated (one fixed global order, so two decisions never wait on each other in
//! a cycle; no global lock), then checks every item in turn (all of them, so that a rejection can
//! name the longest wait) and, when one rejected, settles the reservations made to 0 before it
//! lets the stripes go. Every other decision on those
//! keys waits for the stripes, so none sees a reservation that is then rolled back: a request that
//! fits every limit alone is admitted. The stripes are held for a few memory operations, never
//! across an `.await` (the memory store answers at once).

use std::hash::{BuildHasher, Hash};

use parking_lot::{Mutex, MutexGuard};

use super::MemoryStore;
use crate::store::{Answers, Item};
use crate::strategy::Op;

/// Stripes per store: enough that unrelated keys rarely share one.
const STRIPES: usize = 256;

/// A store's lock stripes (see the module's documentation).
pub(super) struct Stripes([Mutex<()>; STRIPES]);

impl Default for Stripes {
    fn default() -> Self {
        Self(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K> {
    /// The stripe of `key` in the scope of `tag`.
    fn stripe(&self, key: &K, tag: u64) -> usize {
        let h = self.route.hash_one(key) ^ tag.rotate_left(17);
        // Fibonacci hashing: the top bits of the product pick the stripe.
        (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % STRIPES
    }
}

/// Requests of up to this many limits take their stripes without allocating.
const SMALL: usize = 8;

/// The order the stripe of `it` is taken in: its store's address, then the stripe.
fn place<K: Hash + Eq + Clone + Send + Sync + 'static>(
    it: &Item<'_, K, MemoryStore<K>>,
) -> (usize, usize) {
    let store: *const MemoryStore<K> = it.store;
    (store as usize, it.store.stripe(it.key, it.scope.tag()))
}

/// [`Store::apply_all`](crate::store::Store::apply_all) on memory stores: the items' stripes taken
/// in one fixed order, every item checked, and all given back when one rejects.
pub(super) fn apply_all<K: Hash + Eq + Clone + Send + Sync + 'static>(
    items: &[Item<'_, K, MemoryStore<K>>],
    now: u64,
) -> Answers {
    if items.len() <= SMALL {
        let mut order = [(0, 0, 0); SMALL];
        for ((o, it), i) in order.iter_mut().zip(items).zip(0..) {
            let (store, stripe) = place(it);
            *o = (store, stripe, i);
        }
        let order = order.get_mut(..items.len()).unwrap_or_default();
        order.sort_unstable();
        let mut guards: [Option<MutexGuard<'_, ()>>; SMALL] = Default::default();
        let mut last = None;
        for (slot, &(store, stripe, i)) in guards.iter_mut().zip(order.iter()) {
            if last == Some((store, stripe)) {
                continue;
            }
            last = Some((store, stripe));
            *slot = items
                .get(i)
                .and_then(|it| it.store.stripes.0.get(stripe))
                .map(Mutex::lock);
        }
        return decide(items, now);
    }
    let mut locks: Vec<(usize, usize, &Mutex<()>)> = Vec::with_capacity(items.len());
    for it in items {
        let (store, stripe) = place(it);
        if let Some(m) = it.store.stripes.0.get(stripe) {
            locks.push((store, stripe, m));
        }
    }
    locks.sort_unstable_by_key(|&(store, stripe, _)| (store, stripe));
    locks.dedup_by_key(|&mut (store, stripe, _)| (store, stripe));
    let _held: Vec<MutexGuard<'_, ()>> = locks.iter().map(|(_, _, m)| m.lock()).collect();
    decide(items, now)
}

/// Checks every item in turn and, when one rejects, gives back what the others reserved; the
/// caller holds the items' stripes. Every item is checked even after a rejection (nobody sees the
/// reservations made meanwhile), so the caller can answer with the longest wait.
fn decide<K: Hash + Eq + Clone + Send + Sync + 'static>(
    items: &[Item<'_, K, MemoryStore<K>>],
    now: u64,
) -> Answers {
    let mut out: Answers = Vec::with_capacity(items.len());
    let mut rejected = false;
    for (i, it) in items.iter().enumerate() {
        let (rule, tag) = (it.scope.rule(), it.scope.tag());
        let d = it
            .store
            .decide_in(it.key, rule, tag, Op::Check(it.cost), now);
        rejected |= !d.is_allowed();
        out.push((i, Ok(d)));
    }
    if rejected {
        for (j, answer) in &out {
            let (Some(it), Ok(d)) = (items.get(*j), answer) else {
                continue;
            };
            if let Some(r) = d.reservation() {
                let (rule, tag) = (it.scope.rule(), it.scope.tag());
                it.store.decide_in(it.key, rule, tag, Op::settle(r, 0), now);
            }
        }
    }
    out
}
