//! The stacked-layer marker: the limiters and keys a request was counted under, carried in its
//! extensions, so that a second layer on the same limiter and key lets it through uncounted.

use std::hash::BuildHasher;

use crate::clock::Clock;
use crate::limiter::RateLimiter;
use crate::store::Store;

/// The limiters and keys a request was counted under, so stacked layers count it once. Kept
/// inline (no allocation per request); past [`Counted::MAX`] layers a request is counted again.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counted {
    ids: [CountId; Counted::MAX],
    len: usize,
}

/// Marks a request as counted under `id` before it is forwarded. `marked`: whether it arrived
/// marked by an enclosing layer (known from the layer's own look-up; unmarked, one insert).
pub(crate) fn mark_counted(extensions: &mut http::Extensions, id: CountId, marked: bool) {
    let existing = if marked {
        extensions.get_mut::<Counted>()
    } else {
        None
    };
    match existing {
        Some(c) => c.push(id),
        None => {
            let mut c = Counted::default();
            c.push(id);
            extensions.insert(c);
        }
    }
}

impl Counted {
    const MAX: usize = 4;

    pub(crate) fn contains(&self, id: CountId) -> bool {
        self.ids.iter().take(self.len).any(|&x| x == id)
    }

    fn push(&mut self, id: CountId) {
        if let Some(slot) = self.ids.get_mut(self.len) {
            *slot = id;
            self.len += 1;
        }
    }
}

/// A request's identity under one limiter and rule: the store's address, the rule's address and a
/// hash of the key (seeded per process, so an attacker cannot aim a collision).
pub(crate) type CountId = (usize, usize, u64);

pub(crate) fn counted_id<K: crate::store::StoreKey, St: Store<K>, C: Clock>(
    limiter: &RateLimiter<K, St, C>,
    rule: &crate::rule::Rule,
    key: &K,
) -> CountId {
    static HASHER: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    let hash = HASHER.get_or_init(Default::default).hash_one(key);
    // The store lives inside the limiter's shared allocation: its address names the limiter. The
    // rule's address tells a route's own rule (`select_rule`) from the limiter's.
    (
        std::ptr::from_ref(limiter.store()) as usize,
        std::ptr::from_ref(rule) as usize,
        hash,
    )
}
