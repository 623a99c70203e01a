//! The concurrency caps of a rules file's limits (`concurrency = N`): a request's slots, taken once
//! every quota admitted it; counted in this process, or on Redis across instances.

use std::sync::Arc;

use super::Compiled;
use super::enforce::PENDING;
use crate::Decision;
use crate::clock::Clock;
use crate::layer::{Slot, Tail};
use crate::store::Store;

/// The concurrency slots of a request, given back when the last holder drops them.
pub(super) struct Slots {
    /// Held for their drop, which gives them back.
    _held: Vec<Slot<Vec<u8>>>,
}

impl Tail for Arc<Slots> {}

/// The decision of a concurrency cap full for the request's key: `Retry-After: 1`.
pub(super) fn over_cap(cap: u32) -> Decision {
    const SECOND: u64 = 1_000_000_000;
    Decision {
        limit: cap,
        reset_after: SECOND,
        retry_after: SECOND,
        ..PENDING
    }
}

/// Takes a slot of every capped limit among `capped` for the request (once every quota
/// admitted it): the slots, or the first full cap (the slots taken before it given back). On
/// Redis a slot is a lease shared by every instance (a round trip); a Redis failure passes
/// without one, as [`ConcurrencyLimit::redis`](crate::layer::ConcurrencyLimit::redis) does.
pub(super) async fn take_slots<St: Store<Vec<u8>>, C: Clock>(
    compiled: &Compiled<St, C>,
    capped: &[(usize, Vec<u8>)],
) -> Result<Option<Arc<Slots>>, (usize, Decision)> {
    let mut slots = Vec::with_capacity(capped.len());
    for (index, key) in capped {
        let Some(cap) = compiled.limits.get(*index).and_then(|l| l.cap.as_ref()) else {
            continue;
        };
        match cap.acquire(key).await {
            Ok(Some(slot)) => slots.push(slot),
            Ok(None) => {}
            Err(()) => return Err((*index, over_cap(cap.cap()))),
        }
    }
    Ok(Some(Arc::new(Slots { _held: slots })))
}
