//! Several limits in one script call ([`Store::apply_all`](crate::store::Store::apply_all)).
//!
//! When every item is on this store (clones share it) and all their Redis keys are in one slot
//! (single node and Sentinel: always; Cluster: when the items share one logical key, hence one
//! hash tag, e.g. two limits on the same key), one call of the multi-limit script
//! ([`scripts::multi_source`]) loads every item's state, checks each with its strategy's own
//! arithmetic, and commits all of them only if all admit: no transient reservation, one round
//! trip. The call goes through the same send path as a single check (shedding, circuit breaker,
//! timeout, failure policy, reconnection), and a key the blocked-key cache knows to be blocked
//! answers the request's rejection without a call.
//!
//! Otherwise the two-phase protocol of [`AllAnswer::in_turn`] runs: keys in different Cluster
//! slots (a global key keeps its own tag, so it is never co-located with per-client keys, which
//! would put all traffic in one slot), leasing on (each item's lease answers locally, so the
//! reservations are local too), or a single item. A late reply of a multi-limit call (its caller
//! gave up) is not refunded: its units stay spent (under-admission, never over-admission). A call
//! that fails (no reply, or a reply of the wrong shape) is never sent again: with a local
//! fallback each item decides locally at once, as a single check does. Whether the store is a
//! Cluster comes from its URL, known before the first connection.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ::redis::Value;

use super::scripts;
use super::send::{NoReply, Script};
use super::{RedisStore, TICK_NANOS, decode, family, keys, limit_of, redis_keys, script_args};
use crate::decision::Outcome;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::{AllAnswer, Answers, Item, StoreKey, name_of};
use crate::strategy::Op;

/// The multi-limit script's hash and source, the same for every store.
fn script() -> &'static (String, Arc<str>) {
    static SCRIPT: OnceLock<(String, Arc<str>)> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let src = scripts::multi_source();
        (
            ::redis::Script::new(&src).get_hash().to_owned(),
            Arc::from(src),
        )
    })
}

/// One item as the script sees it.
struct Prepared {
    quotas: usize,
    cache_key: Option<u64>,
    cacheable: bool,
}

impl RedisStore {
    /// [`Store::apply_all`](crate::store::Store::apply_all) on Redis: see the module's
    /// documentation.
    pub(super) fn apply_all_on_redis<'a, K: StoreKey + Sync>(
        &'a self,
        items: &'a [Item<'a, K, Self>],
        now: u64,
    ) -> AllAnswer<'a> {
        let same_store = items
            .iter()
            .all(|it| Arc::ptr_eq(&it.store.inner, &self.inner));
        if items.len() < 2 || !same_store || self.inner.leases.is_some() {
            return AllAnswer::in_turn(items, now);
        }
        let now_us = if self.inner.client_time {
            (now / TICK_NANOS).max(1)
        } else {
            0
        };
        let mut all_keys: Vec<String> = Vec::new();
        let mut args: Vec<u64> = vec![now_us, items.len() as u64];
        let mut prepared = Vec::with_capacity(items.len());
        let mut bases: Vec<String> = Vec::with_capacity(items.len());
        for it in items {
            let rule = it.scope.rule();
            let params = match rule.params_in(TICK_NANOS) {
                Ok(p) => p,
                Err(e) => {
                    return self.failed_all(
                        items,
                        &StoreError::new(StoreErrorKind::Other, e.to_string()),
                    );
                }
            };
            let single = match script_args(rule, &params, Op::Check(it.cost), now_us) {
                Ok(a) => a,
                Err(m) => {
                    return self.failed_all(items, &StoreError::new(StoreErrorKind::Other, m));
                }
            };
            let name = crate::store::name_hash(it.scope.name());
            let base = keys::base_key(&self.inner.prefix, it.key, name);
            let names = redis_keys(&base, rule.strategy(), params.len());
            let fam = family(rule.strategy());
            // cost, ttl_ms, the strategy's code, n, then five per quota: the single-key script's own
            // arguments, checked against the 2^53 bound there.
            let rule_args = single.get(1..6 + 5 * params.len()).unwrap_or_default();
            args.extend([fam.code(), names.len() as u64]);
            args.extend(
                rule_args
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != 1)
                    .map(|(_, v)| *v),
            );
            let cacheable = it.cost > 0
                && params
                    .iter()
                    .all(|p| u64::from(it.cost) <= p.limit.min(p.burst.max(1)));
            prepared.push(Prepared {
                quotas: params.len(),
                cache_key: self.cache_key(&names, &single, params.len()),
                cacheable,
            });
            all_keys.extend(names);
            bases.push(base);
        }
        // A Cluster routes one call to one slot: one logical key (one hash tag) for all. The
        // topology is the URL's, known from the build on (the connection may not be up yet).
        let cluster = self.inner.cluster;
        let distinct = {
            let mut k: Vec<&String> = all_keys.iter().collect();
            k.sort_unstable();
            k.windows(2).all(|w| w.first() != w.get(1))
        };
        let slots_differ = bases
            .windows(2)
            .any(|w| w.first().map(|b| keys::slot_part(b)) != w.get(1).map(|b| keys::slot_part(b)));
        if !distinct || (cluster && slots_differ) {
            return AllAnswer::in_turn(items, now);
        }
        // A key known to be blocked: the request is rejected without a call.
        if let Some(cache) = &self.inner.cache {
            let found = Instant::now();
            for (i, p) in prepared.iter().enumerate() {
                if let (true, Some(ck)) = (p.cacheable, p.cache_key) {
                    if let Some(d) = cache.get(ck, found) {
                        self.inner.rejected.add(1);
                        return AllAnswer::now(vec![(i, Ok(d))]);
                    }
                }
            }
        }
        let (sha, src) = script().clone();
        let script = Script {
            keys: all_keys,
            args,
            sha,
            src,
        };
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let removals = self.inner.cache.as_ref().map_or(0, |c| c.removals());
        AllAnswer::later(async move {
            let v = match self.send_script(script, deadline, true, None, None).await {
                Ok(v) => v,
                Err(NoReply::Overload(why)) => {
                    let limit = items.first().map_or(0, |it| limit_of(it.scope.rule()));
                    return vec![(0, Ok(self.shed(why, limit, now)))];
                }
                Err(NoReply::Outage(e) | NoReply::Late(e)) => {
                    return self.outage_all(items, &bases, &prepared, now, e);
                }
            };
            // A reply came: the script may have committed, so a bad one is never resent.
            let answers = match split(&v, &prepared, items) {
                Ok(a) => a,
                Err(e) => return self.outage_all(items, &bases, &prepared, now, e),
            };
            let inner = &self.inner;
            let admitted = answers.len() == items.len()
                && answers
                    .iter()
                    .all(|(_, a)| a.as_ref().is_ok_and(|d| d.is_allowed()));
            if admitted {
                inner.allowed.add(items.len() as u64);
            } else if let Some((i, Ok(d))) = answers.last() {
                inner.rejected.add(1);
                let p = prepared.get(*i);
                let cost = items.get(*i).map_or(0, |it| it.cost);
                if let (Some(cache), Some(ck)) = (&inner.cache, p.and_then(|p| p.cache_key)) {
                    if cost == 1 && d.outcome() == Outcome::Rejected {
                        cache.insert_unless_removed(ck, *d, Instant::now(), removals);
                    }
                }
            }
            answers
        })
    }

    /// Every item answered with `e` (nothing was sent).
    fn failed_all<'a, K>(&self, items: &[Item<'a, K, Self>], e: &StoreError) -> AllAnswer<'a> {
        let answers = items
            .iter()
            .enumerate()
            .map(|(i, _)| {
                self.inner.errors.add(1);
                (i, Err(e.clone()))
            })
            .collect();
        self.warn(e);
        AllAnswer::now(answers)
    }

    /// Redis failed (no reply, or a reply of the wrong shape): nothing is sent again. Each item
    /// whose store has a local fallback (its own store: a rules file limit may turn it off)
    /// decides by it at once, as a single check does (the items in order, the admitted ones
    /// settled to 0 on a rejection); every other item gets the error, for the failure policy.
    fn outage_all<K>(
        &self,
        items: &[Item<'_, K, Self>],
        bases: &[String],
        prepared: &[Prepared],
        now: u64,
        e: StoreError,
    ) -> Answers {
        if items.iter().all(|it| it.store.local().is_none()) {
            self.inner.errors.add(items.len() as u64);
            self.warn(&e);
            return (0..items.len()).map(|i| (i, Err(e.clone()))).collect();
        }
        let mut out: Answers = Vec::with_capacity(items.len());
        for (i, ((it, base), p)) in items.iter().zip(bases).zip(prepared).enumerate() {
            let scope = (it.scope.rule(), it.scope.tag());
            let answer =
                it.store
                    .outage(base, p.cache_key, scope, Op::Check(it.cost), now, e.clone());
            let rejected = matches!(&answer, Ok(d) if !d.is_allowed());
            out.push((i, answer));
            if rejected {
                for (j, answer) in &out {
                    let (Some(it), Some(base), Ok(d)) = (items.get(*j), bases.get(*j), answer)
                    else {
                        continue;
                    };
                    if let (Some(r), Some(local)) = (d.reservation(), it.store.local()) {
                        let scope = it.scope;
                        local.decide(base, scope.rule(), scope.tag(), Op::settle(r, 0), now);
                    }
                }
                break;
            }
        }
        out
    }
}

/// The multi-limit script's reply as the items' answers (each decoded as a single-key reply).
fn split<K>(
    v: &Value,
    prepared: &[Prepared],
    items: &[Item<'_, K, RedisStore>],
) -> Result<Answers, StoreError> {
    let bad = |what: &str| {
        StoreError::new(
            StoreErrorKind::BadReply,
            format!("multi-limit reply: {what}"),
        )
    };
    let Value::Array(values) = v else {
        return Err(bad("not an array"));
    };
    let (Some(now), Some(Value::Int(decided))) = (values.first(), values.get(1)) else {
        return Err(bad("too short"));
    };
    let decided = usize::try_from(*decided).map_err(|_| bad("a negative count"))?;
    if decided == 0 || decided > prepared.len() {
        return Err(bad("a count out of range"));
    }
    let mut at = 2;
    let mut out = Vec::with_capacity(decided);
    for (i, (p, it)) in prepared.iter().zip(items).take(decided).enumerate() {
        let part = values
            .get(at..at + 5 * p.quotas)
            .ok_or_else(|| bad("too short"))?;
        at += 5 * p.quotas;
        let mut one = Vec::with_capacity(1 + part.len());
        one.push(now.clone());
        one.extend_from_slice(part);
        let d = decode(&Value::Array(one), p.quotas)?.answering(Op::Check(it.cost));
        out.push((i, Ok(d)));
    }
    // Then the positions (from 1) of the items whose conversion estimated.
    for v in values.get(at..).unwrap_or_default() {
        let it = match v {
            Value::Int(i) => (i.checked_sub(1))
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| items.get(i)),
            _ => None,
        };
        let Some(it) = it else {
            return Err(bad("too long"));
        };
        let rule = it.scope.rule();
        it.store
            .warn_estimated(rule.strategy(), name_of(rule, it.scope.tag()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::scripts::Family;

    /// The family codes the script knows.
    const CODES: [(Family, u64); 4] = [
        (Family::Fixed, 1),
        (Family::Sliding, 2),
        (Family::Gcra, 3),
        (Family::Moving, 4),
    ];

    /// A Cluster URL is a Cluster before the first connection: a multi-limit call never puts
    /// keys of different slots in one call while the store connects in the background.
    #[tokio::test]
    async fn the_topology_is_known_before_connecting() {
        let store = RedisStore::builder("redis+cluster://127.0.0.1:1,127.0.0.1:2")
            .connect_timeout(std::time::Duration::from_millis(200))
            .build()
            .await
            .expect("starts without Redis");
        assert!(store.inner.conn.read().is_none());
        assert!(store.inner.cluster);
        let single = RedisStore::builder("redis://127.0.0.1:1")
            .connect_timeout(std::time::Duration::from_millis(200))
            .build()
            .await
            .expect("starts without Redis");
        assert!(!single.inner.cluster);
    }

    #[test]
    fn family_codes_match_the_script() {
        for (f, code) in CODES {
            assert_eq!(f.code(), code);
        }
        let src = scripts::multi_source();
        assert!(src.contains("FAM[1] =") && src.contains("FAM[3] =") && src.contains("local MV ="));
    }
}
