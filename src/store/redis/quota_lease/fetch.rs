//! Fetching a lease: one script call under the store's overload and outage policies, its grant
//! recorded in the key's slot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::Value;
use tokio::sync::watch;

use super::{Call, Fetched, Lease};
use crate::decision::{Decision, Outcome};
use crate::error::{StoreError, StoreErrorKind};
use crate::store::redis::send::{NoReply, Script};
use crate::store::redis::{LATE_GRACE, RedisStore, TICK_NANOS, decode, nanos};
use crate::strategy::Op;

impl RedisStore {
    /// Runs one lease call and records its result in the key's slot; the slot's waiters wake when
    /// `done` is dropped.
    pub(super) async fn fetch(
        self,
        call: Call,
        cost: u32,
        done: watch::Sender<()>,
        cache_key: Option<u64>,
    ) {
        let sent_i = Instant::now();
        let fetched = self.fetch_call(&call, cost, cache_key, sent_i).await;
        let Some(leases) = &self.inner.leases else {
            return;
        };
        let mut replaced = None;
        let slot = leases.slots.get_mut(&call.id);
        if slot.is_none() {
            // No slot to hold the grant (the key was dropped meanwhile): its units die unused.
            if let Ok(lease) = &fetched {
                leases.expired.add(lease.left);
            }
        }
        if let Some(mut slot) = slot {
            slot.fetching = None;
            slot.done += 1;
            slot.last = match fetched {
                Ok(lease) => {
                    match slot.lease.take() {
                        // A lease from before a reset of the key (elsewhere): Redis forgot its
                        // units, so they are neither admitted nor given back.
                        Some(old) if old.epoch != lease.epoch => {
                            leases.expired.add(old.left);
                            slot.lease = Some(lease);
                        }
                        // One window's leases end together: they merge, and this call found the
                        // old one's units still counted, so they are as fresh as the new ones.
                        Some(mut old) if !old.bucket && old.end == lease.end => {
                            old.left += lease.left;
                            old.granted += lease.granted;
                            old.remaining = lease.remaining;
                            old.fresh = lease.fresh.min(old.until);
                            old.fresh_i = lease.fresh_i.min(old.until_i);
                            slot.lease = Some(old);
                        }
                        old => {
                            // A live lease's units, and a dead bucket lease's (still counted in
                            // the bucket), go back; a dead window lease's died with its window.
                            let now_i = Instant::now();
                            match old.filter(|o| o.left > 0) {
                                Some(o) if o.bucket || o.alive(call.now, now_i) => {
                                    replaced = Some((Arc::clone(&slot.back), o));
                                }
                                Some(o) => leases.expired.add(o.left),
                                None => {}
                            }
                            slot.lease = Some(lease);
                        }
                    }
                    Fetched::Granted
                }
                Err(Fetched::Rejected(d, c, epoch)) => {
                    // No room for more, but the reply tells the key's epoch: a lease from before a
                    // reset elsewhere goes; one still current admits on (renewed), its units
                    // counted in Redis all along.
                    match slot.lease.as_mut() {
                        Some(old) if old.epoch != epoch => {
                            leases.expired.add(old.left);
                            slot.lease = None;
                        }
                        Some(old) => {
                            (old.fresh, old.fresh_i) = fresh_until(
                                call.now,
                                sent_i,
                                leases.cfg.renew,
                                (old.until, old.until_i),
                            );
                        }
                        None => {}
                    }
                    Fetched::Rejected(d, c, epoch)
                }
                Err(f) => f,
            };
        }
        drop(done);
        if let Some((key, old)) = replaced {
            if let Err(e) = self.give_back(&key, &old, call.now).await {
                tracing::debug!(error = %e, "returning a replaced lease");
            }
        }
    }

    /// The lease call itself, under the store's overload and outage policies
    /// ([`RedisStore::send_script`], shared with calls without a lease). It waits the timeout and
    /// the connection's grace: the checks waiting for it give up at the timeout, and a late grant
    /// still becomes this instance's lease. `sent_i`: when it was sent (monotonic).
    pub(super) async fn fetch_call(
        &self,
        call: &Call,
        cost: u32,
        cache_key: Option<u64>,
        sent_i: Instant,
    ) -> Result<Lease, Fetched> {
        let inner = &self.inner;
        if let Some(l) = &inner.leases {
            l.fetches.add(1);
        }
        let script = Script {
            keys: call.redis_keys.clone(),
            args: call.args.clone(),
            sha: call.sha.clone(),
            src: Arc::clone(&call.src),
        };
        let deadline = tokio::time::Instant::now() + inner.timeout.saturating_add(LATE_GRACE);
        let removals = inner.cache.as_ref().map_or(0, |c| c.removals());
        let v = match self.send_script(script, deadline, true, None, None).await {
            Ok(v) => v,
            Err(NoReply::Overload(_)) => return Err(Fetched::Shed),
            Err(NoReply::Outage(e) | NoReply::Late(e)) => return Err(Fetched::Failed(e)),
        };
        let Reply {
            grant,
            life,
            epoch,
            decision: d,
        } = decode_lease(&v, call.quotas).map_err(Fetched::Failed)?;
        if grant == 0 {
            let d = d.answering(Op::Check(cost));
            if let (Some(cache), Some(ck)) = (&inner.cache, cache_key) {
                if cost == 1 && d.outcome() == Outcome::Rejected {
                    cache.insert_unless_removed(ck, d, Instant::now(), removals);
                }
            }
            return Err(Fetched::Rejected(d, cost, epoch));
        }
        if let Some(l) = &inner.leases {
            l.granted.add(grant);
        }
        let until = call.now.saturating_add(life);
        let until_i = sent_i
            .checked_add(Duration::from_nanos(life))
            .unwrap_or(sent_i);
        let renew = inner
            .leases
            .as_ref()
            .map_or(Duration::ZERO, |l| l.cfg.renew);
        let (fresh, fresh_i) = fresh_until(call.now, sent_i, renew, (until, until_i));
        Ok(Lease {
            left: grant,
            granted: grant,
            at: d.time,
            sent: call.now,
            until,
            until_i,
            fresh,
            fresh_i,
            epoch,
            end: d.time.saturating_add(life),
            bucket: call.bucket,
            limit: d.limit,
            remaining: u64::from(d.remaining),
            reset_after: d.reset_after,
            quota: d.quota,
        })
    }
}

/// Until when a lease a call sent at `now` (limiter's clock) and `sent_i` (monotonic) granted or
/// renewed admits without renewal: `renew` from the reply's arrival (a slow reply does not leave
/// it stale on arrival), never past its death `until`.
pub(super) fn fresh_until(
    now: u64,
    sent_i: Instant,
    renew: Duration,
    (until, until_i): (u64, Instant),
) -> (u64, Instant) {
    let arrived = Instant::now();
    let took = arrived.saturating_duration_since(sent_i);
    let fresh = now.saturating_add(nanos(took.saturating_add(renew)));
    let fresh_i = arrived.checked_add(renew).unwrap_or(until_i);
    (fresh.min(until), fresh_i.min(until_i))
}

/// A lease reply, decoded.
pub(super) struct Reply {
    pub(super) grant: u64,
    /// The lease's life, ns.
    pub(super) life: u64,
    /// The key's reset epoch the lease was granted under.
    pub(super) epoch: u64,
    /// The decision of the verdicts.
    pub(super) decision: Decision,
}

/// Decodes a lease reply: `now, grant, life (µs), epoch`, then the verdicts.
pub(super) fn decode_lease(v: &Value, quotas: usize) -> Result<Reply, StoreError> {
    let bad = |m: &str| StoreError::new(StoreErrorKind::BadReply, format!("lease reply: {m}"));
    let Value::Array(items) = v else {
        return Err(bad("not an array"));
    };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| bad("a negative value")),
        _ => Err(bad("a value that is not an integer")),
    };
    let (grant, life, epoch) = (int(1)?, int(2)?, int(3)?);
    let mut rest = Vec::with_capacity(items.len().saturating_sub(3));
    rest.extend(items.first().cloned());
    rest.extend(items.iter().skip(4).cloned());
    let decision = decode(&Value::Array(rest), quotas)?;
    Ok(Reply {
        grant,
        life: life.saturating_mul(TICK_NANOS),
        epoch,
        decision,
    })
}
