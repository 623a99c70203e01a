//! Degraded mode: while Redis is out, decide with an in-memory limiter of the same rule, each quota's
//! limit (and burst) divided by the number of instances sharing the Redis, so that together the
//! instances admit about the limit.
//!
//! Keys that Redis reported blocked stay blocked: the blocked-key cache is consulted before the
//! local limiter. The local state starts empty at each outage's first decision of a key and is
//! never written back to Redis; when Redis answers again, its own count rules.

use std::collections::HashMap;
use std::num::NonZeroU32;

use parking_lot::Mutex;

use crate::decision::Decision;
use crate::quota::Quota;
use crate::rule::Rule;
use crate::store::MemoryStore;
use crate::strategy::Op;

/// The most keys the local limiter holds (it evicts past that, like any capped memory store).
const LOCAL_MAX_KEYS: usize = 100_000;
/// The most distinct rules whose divided form is remembered.
const MAX_RULES: usize = 64;

pub(super) struct Local {
    instances: NonZeroU32,
    store: MemoryStore<String>,
    /// Divided rules by the original rule's tag.
    rules: Mutex<HashMap<u64, Rule>>,
}

/// `rule` with every quota's limit and burst divided by `n` (at least 1 each).
pub(super) fn divide(rule: &Rule, n: NonZeroU32) -> Rule {
    if n.get() == 1 {
        return rule.clone();
    }
    let part = |x: u32| NonZeroU32::new(x / n.get()).unwrap_or(NonZeroU32::MIN);
    let quotas: Vec<Quota> = rule
        .quotas()
        .iter()
        .map(|q| {
            let limit = part(q.limit());
            let divided = Quota::new(limit, q.period()).unwrap_or(*q);
            if q.has_explicit_burst() {
                divided.with_burst(part(q.burst()))
            } else {
                divided
            }
        })
        .collect();
    // A smaller limit over the same period is always representable when the original was.
    Rule::new(rule.strategy(), quotas).unwrap_or_else(|_| rule.clone())
}

impl Local {
    pub(super) fn new(instances: NonZeroU32) -> Self {
        Self {
            instances,
            store: MemoryStore::<String>::builder()
                .max_keys(LOCAL_MAX_KEYS)
                .build(),
            rules: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn instances(&self) -> NonZeroU32 {
        self.instances
    }

    /// Decides `op` on `key` (the key's Redis base name) under `rule` divided by the instances.
    /// The limiter's scope tag `tag` keeps the state of limiters of different names apart.
    pub(super) fn decide(&self, key: &String, rule: &Rule, tag: u64, op: Op, now: u64) -> Decision {
        if self.instances.get() == 1 {
            return self.store.decide_in(key, rule, tag, op, now);
        }
        let divided = {
            let mut rules = self.rules.lock();
            if let Some(r) = rules.get(&rule.tag()) {
                r.clone()
            } else {
                let r = divide(rule, self.instances);
                if rules.len() >= MAX_RULES {
                    rules.clear();
                }
                rules.insert(rule.tag(), r.clone());
                r
            }
        };
        self.store.decide_in(key, &divided, tag, op, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::Strategy;

    #[test]
    fn limits_and_bursts_are_divided_and_never_reach_zero() {
        let nz = |n| NonZeroU32::new(n).unwrap();
        let quotas = [
            Quota::per_hour(nz(1000)).with_burst(nz(90)),
            Quota::per_second(nz(3)),
        ];
        let rule = Rule::new(Strategy::TokenBucket, quotas).unwrap();
        let d = divide(&rule, NonZeroU32::new(4).unwrap());
        let q = d.quotas();
        assert_eq!((q[0].limit(), q[0].burst()), (250, 22));
        assert_eq!(q[1].limit(), 1, "3 / 4 rounds down but never to 0");
        assert_eq!(q[0].period(), rule.quotas()[0].period());
    }

    #[test]
    fn the_local_limiter_admits_its_share() {
        let local = Local::new(NonZeroU32::new(2).unwrap());
        let rule = Rule::parse(Strategy::FixedWindow, "10/hour").unwrap();
        let key = "k".to_owned();
        let now = 1_700_000_000_000_000_000;
        let admitted = (0..20)
            .filter(|_| {
                local
                    .decide(&key, &rule, rule.tag(), Op::Check(1), now)
                    .is_allowed()
            })
            .count();
        assert_eq!(admitted, 5);
    }
}
