//! What the store recalls of an evicted key from the sketch's records, as states at least as spent
//! as the key's were.

use super::super::sketch::{self, Sketch};
use super::SeenRule;
use crate::rule::Rule;
use crate::strategy::{Held, Params, QuotaState, Strategy};

/// Drops what `sketch` recalls of the key routed by `key_hash` under `rule` (a reset).
pub(in crate::store::memory) fn clear_records(
    sketch: &Sketch,
    key_hash: u64,
    rule: &Rule,
    tag: u64,
    now: u64,
) {
    for i in 0..rule.nanos().len() {
        sketch.clear(sketch::quota_hash(key_hash, tag, i), now);
    }
}

/// What `sketch` recalls of the key routed by `key_hash` under `rule` at `now`: a state per quota
/// at least as spent as the key's when it was evicted, or `None` if nothing is recorded.
pub(super) fn recall(
    sketch: &Sketch,
    key_hash: u64,
    rule: &Rule,
    tag: u64,
    now: u64,
) -> Option<Vec<QuotaState>> {
    recall_quotas(sketch, key_hash, rule.strategy(), rule.nanos(), tag, now)
}

/// What `sketch` recalls of the key routed by `key_hash` under the quotas `params` of `strategy`
/// in the scope of tag `tag`, as held quotas (empty when nothing is recorded).
pub(in crate::store::memory) fn recall_held(
    sketch: &Sketch,
    key_hash: u64,
    (tag, strategy, params): &SeenRule,
    now: u64,
) -> Vec<Held> {
    recall_quotas(sketch, key_hash, *strategy, params, *tag, now)
        .into_iter()
        .flatten()
        .zip(params.iter())
        .map(|(state, p)| Held {
            strategy: *strategy,
            params: *p,
            state,
        })
        .collect()
}

pub(super) fn recall_quotas(
    sketch: &Sketch,
    key_hash: u64,
    strategy: Strategy,
    params: &[Params],
    tag: u64,
    now: u64,
) -> Option<Vec<QuotaState>> {
    let mut recalled = false;
    let states = params
        .iter()
        .enumerate()
        .map(
            |(i, p)| match sketch.lookup(sketch::quota_hash(key_hash, tag, i), now) {
                Some(spent) => {
                    recalled = true;
                    sketch::restore(strategy, p, spent, now)
                }
                None => QuotaState::new(strategy),
            },
        )
        .collect();
    recalled.then_some(states)
}
