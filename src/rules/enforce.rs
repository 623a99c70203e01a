//! Deciding a request's enforced limits all or nothing: one `Store::apply_all` call, or one limit
//! alone, and giving back what was reserved before a rejection.

use std::cell::Cell;

use super::Compiled;
use super::decided::Stop;
use super::keys::give_back;
use crate::layer::FailurePolicy;
use crate::store::{Item, Store};
use crate::{Clock, Decision, Op, StoreError, StoreErrorKind};

/// The decision of a limit not decided yet: rejected, holding no reservation.
pub(super) const PENDING: Decision = Decision {
    outcome: crate::Outcome::Rejected,
    limit: 0,
    remaining: 0,
    reset_after: 0,
    retry_after: 0,
    time: 0,
    quota: 0,
    cost: 0,
    local: false,
    bound: 0,
    shed: false,
};

/// A reservation to give back if another limit rejects (or, before the decision, a limit to
/// decide: [`PENDING`]).
#[derive(Clone)]
pub(super) struct Held {
    pub(super) index: usize,
    pub(super) key: Vec<u8>,
    pub(super) decision: Decision,
}

/// The enforced limits a request is to decide, with their keys: one inline, the common case
/// (its key's buffer goes back to the thread once the request is done with it, see
/// [`give_back`]), or a list.
pub(super) enum Enforced {
    One { index: usize, key: Vec<u8> },
    Many(Vec<Held>),
}

impl Default for Enforced {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl Enforced {
    /// Adds limit `index` with the request's `key`: inline while it is the only one.
    pub(super) fn push(&mut self, index: usize, key: Vec<u8>) {
        match self {
            Self::Many(list) if list.is_empty() => *self = Self::One { index, key },
            Self::Many(list) => list.push(Held::pending(index, key)),
            Self::One {
                index: first,
                key: first_key,
            } => {
                let first = Held::pending(*first, std::mem::take(first_key));
                *self = Self::Many(vec![first, Held::pending(index, key)]);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::One { .. } => 1,
            Self::Many(list) => list.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limits to decide, their keys copied.
    pub(super) fn to_pending(&self) -> Vec<Held> {
        match self {
            Self::One { index, key } => vec![Held::pending(*index, key.clone())],
            Self::Many(list) => list.clone(),
        }
    }
}

impl Drop for Enforced {
    fn drop(&mut self) {
        if let Self::One { key, .. } = self {
            give_back(std::mem::take(key));
        }
    }
}

impl Held {
    /// Limit `index` to decide on `key`.
    pub(super) fn pending(index: usize, key: Vec<u8>) -> Self {
        Self {
            index,
            key,
            decision: PENDING,
        }
    }
}

/// The limits that admitted a request, read as a slice. Most requests meet one limit: once the
/// request is done with them, the list's buffer and its first key go back to the thread for the
/// next request's (see [`give_back`]), so neither costs an allocation of its own.
#[derive(Clone, Default)]
pub(super) struct Holds(Vec<Held>);

/// The largest list kept for the next request.
const SPARE_LIST_MAX: usize = 8;

thread_local! {
    /// The buffer of a list of limits a request on this thread was done with, for the next one.
    static SPARE_LIST: Cell<Vec<Held>> = const { Cell::new(Vec::new()) };
}

impl Holds {
    /// Adds `h`; the first into the thread's spare buffer.
    #[inline]
    pub(super) fn push(&mut self, h: Held) {
        if self.0.capacity() == 0 {
            self.0 = SPARE_LIST.try_with(Cell::take).unwrap_or_default();
            // Room for one (most requests meet one limit), not the four a first push makes.
            self.0.reserve_exact(1);
        }
        self.0.push(h);
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        // A list that never held a limit (a rejection's decision, keys moved into their decision)
        // has nothing to give back.
        if self.0.capacity() == 0 {
            return;
        }
        let mut list = std::mem::take(&mut self.0);
        if let Some(first) = list.first_mut() {
            give_back(std::mem::take(&mut first.key));
        }
        list.clear();
        if list.capacity() > SPARE_LIST_MAX {
            return;
        }
        // Past the thread's end (no spare any more) the buffer is freed.
        let _ = SPARE_LIST.try_with(|spare| spare.set(list));
    }
}

impl From<Vec<Held>> for Holds {
    fn from(v: Vec<Held>) -> Self {
        Self(v)
    }
}

impl std::ops::Deref for Holds {
    type Target = [Held];

    fn deref(&self) -> &[Held] {
        &self.0
    }
}

impl std::ops::DerefMut for Holds {
    fn deref_mut(&mut self) -> &mut [Held] {
        &mut self.0
    }
}

/// Decides the enforced limits of a request (not shaping queues) in one [`Store::apply_all`]
/// call: the admitted ones' reservations, or the answer (429, 503) when one rejected (nothing
/// charged: the store gave back what the others reserved) or a store failed closed (every
/// admitted limit settled to 0, once). A store failing open skips its limit; a limit the store
/// did not answer counts as failed. Every answer is read before acting on any.
pub(super) async fn enforce_all<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    failure: FailurePolicy,
    mut held: Vec<Held>,
) -> Result<Vec<Held>, Stop> {
    held.retain(|h| compiled.limits.get(h.index).is_some());
    let Some(first) = held.first().and_then(|h| compiled.limits.get(h.index)) else {
        return Ok(held);
    };
    let item = |h| item_of(compiled, h);
    // One time for every item: the latest of their clocks' readings, each under its limit's rule
    // (a clock whose steps the rule cannot take reads the precise time). The coarse time is then
    // brought up to it, so that a limit decided on it later never sees time go back.
    let limits = || held.iter().filter_map(|h| compiled.limits.get(h.index));
    let (mut earliest, mut now) = (u64::MAX, 0);
    for t in limits().map(|l| l.limiter.now_under(l.rule.as_ref())) {
        (earliest, now) = (earliest.min(t), now.max(t));
    }
    if earliest < now {
        limits().for_each(|l| crate::clock::advance_to(l.limiter.clock(), now));
    }
    // One limit (the common case) needs no list of items.
    let (one, many): (Option<[RulesItem<'_, St>; 1]>, Vec<RulesItem<'_, St>>) =
        match held.as_slice() {
            [single] => (item(single).map(|i| [i]), Vec::new()),
            all => (None, all.iter().filter_map(item).collect()),
        };
    let items = one.as_ref().map_or(many.as_slice(), |one| one.as_slice());
    let answers = match first.limiter.store().apply_all(items, now).into_now() {
        Ok(ready) => ready,
        Err(later) => {
            let start = std::time::Instant::now();
            let answers = later.await;
            let took = start.elapsed().as_secs_f64();
            for h in &held {
                if let Some(limit) = compiled.limits.get(h.index) {
                    limit.metrics.store_latency.record(took);
                }
            }
            answers
        }
    };
    drop((one, many));
    // Every answer is read before acting on any: on the two-phase path a failed item blocks no
    // other, so items after it may hold a reservation, and a rejection means the store already
    // settled the admitted ones to 0. The 429 is the rejection with the longest wait (one whose
    // cost can never be admitted first), so a client never retries too early.
    let mut got: Vec<Option<Result<Decision, StoreError>>> = held.iter().map(|_| None).collect();
    let mut rejected: Option<(usize, Decision)> = None;
    for (i, answer) in answers {
        // Reservations bound to their limit and key, as a limiter's own checks make them.
        let answer = answer.map(|d| {
            let limit = held
                .get(i)
                .and_then(|h| Some((h, compiled.limits.get(h.index)?)));
            limit.map_or(d, |(h, l)| l.limiter.bind(l.rule.as_ref(), &h.key, d))
        });
        if let Ok(d) = &answer {
            if !d.is_allowed() && rejected.is_none_or(|(_, r)| waits_longer(d, &r)) {
                rejected = Some((i, *d));
            }
        }
        if let Some(slot) = got.get_mut(i) {
            *slot = Some(answer);
        }
    }
    if let Some((at, d)) = rejected {
        let Some(index) = held.get(at).map(|h| h.index) else {
            return Ok(Vec::new());
        };
        for (h, a) in held.iter().zip(got) {
            if let Some(Err(e)) = a {
                if let Some(failed) = compiled.limits.get(h.index) {
                    failed.metrics.store_errors.increment(1);
                    tracing::warn!(limit = failed.spec.name.as_str(), error = %e, "rate-limit store error");
                }
            }
        }
        return Err(Stop::Rejected(index, d));
    }
    let mut failed: Option<StoreError> = None;
    for (h, answer) in held.iter_mut().zip(got) {
        let Some(limit) = compiled.limits.get(h.index) else {
            continue;
        };
        // An item the store did not answer counts as failed, never as admitted.
        let answer = answer.unwrap_or_else(|| {
            Err(StoreError::new(
                StoreErrorKind::Other,
                "the store gave no answer for this limit",
            ))
        });
        match answer {
            Ok(d) => h.decision = d,
            Err(e) => {
                let failure = limit.failure(failure);
                if failure != FailurePolicy::FailClosed || failed.is_none() {
                    limit.store_failed(&e, failure);
                } else {
                    limit.metrics.store_errors.increment(1);
                    tracing::warn!(limit = limit.spec.name.as_str(), error = %e, "rate-limit store error");
                }
                if failure == FailurePolicy::FailClosed && failed.is_none() {
                    failed = Some(e.for_limiter(&limit.spec.name));
                }
            }
        }
    }
    if let Some(e) = failed {
        // Every limit that admitted holds a reservation: each is given back once.
        rollback(compiled, &held).await;
        return Err(Stop::Failed(e));
    }
    // A limit whose store failed open holds nothing.
    held.retain(|h| h.decision.is_allowed());
    Ok(held)
}

/// Whether rejection `a` asks the client to wait longer than `b`: a cost that can never be
/// admitted (no `Retry-After`) before any wait, then the longer wait.
pub(super) fn waits_longer(a: &Decision, b: &Decision) -> bool {
    match (a.retry_after(), b.retry_after()) {
        (None, Some(_)) => true,
        (Some(x), Some(y)) => x > y,
        _ => false,
    }
}

/// An item of a rules file's [`Store::apply_all`] call.
pub(super) type RulesItem<'a, St> = Item<'a, Vec<u8>, St>;

/// The [`Store::apply_all`] item of `h`'s limit and key.
pub(super) fn item_of<'a, St: Store<Vec<u8>>, C: Clock>(
    compiled: &'a Compiled<St, C>,
    h: &'a Held,
) -> Option<Item<'a, Vec<u8>, St>> {
    let limit = compiled.limits.get(h.index)?;
    Some(Item {
        store: limit.limiter.store(),
        key: &h.key,
        scope: limit.limiter.scope(limit.rule.as_ref()),
        cost: limit.spec.cost,
    })
}

/// Checks the enforced limit of `one` (its key read already; `one.decision` is not read):
/// `Ok(Some(decision))` when it admitted the request (held in `held`), `Ok(None)` when its store
/// failed open, `Err` when the request stops here (a rejection, or a store failing closed), what
/// the limits before it reserved given back.
pub(super) async fn enforce_keyed<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    failure: FailurePolicy,
    one: Held,
    held: &mut Vec<Held>,
) -> Result<Option<Decision>, Stop> {
    let Held { index, key, .. } = one;
    let Some(limit) = compiled.limits.get(index) else {
        return Ok(None);
    };
    let failure = limit.failure(failure);
    match limit.apply(&key, Op::Check(limit.spec.cost)).await {
        Ok(d) if d.is_allowed() => {
            held.push(Held {
                index,
                key,
                decision: d,
            });
            Ok(Some(d))
        }
        Ok(d) => {
            rollback(compiled, held).await;
            Err(Stop::Rejected(index, d))
        }
        Err(e) => {
            limit.store_failed(&e, failure);
            if failure == FailurePolicy::FailClosed {
                rollback(compiled, held).await;
                return Err(Stop::Failed(e));
            }
            Ok(None)
        }
    }
}

/// Gives back what the limits before a rejection reserved (settled to 0), except a shaping
/// queue's slot: giving it back would put two waiters in one departure, so it stays a gap
/// (under-admission, never over-admission).
pub(super) async fn rollback<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    held: &[Held],
) {
    for h in held {
        let Some(limit) = compiled.limits.get(h.index) else {
            continue;
        };
        if limit.spec.queue.is_some() {
            continue;
        }
        if let Some(r) = h.decision.reservation() {
            if let Err(e) = limit.apply(&h.key, Op::settle(r, 0)).await {
                limit.metrics.store_errors.increment(1);
                tracing::warn!(limit = limit.spec.name.as_str(), error = %e, "rollback failed");
            }
        }
    }
}
