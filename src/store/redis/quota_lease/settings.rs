//! How leases are sized and given back ([`Leasing`]), and what they did ([`LeaseCounters`]).

use std::time::Duration;

use crate::strategy::{Params, Strategy};

/// How leases are sized and given back ([`RedisStoreBuilder::leases`](crate::store::redis::RedisStoreBuilder::leases)).
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::redis::{Leasing, RedisStore};
///
/// let builder = RedisStore::builder("redis://127.0.0.1:6379").leases(
///     Leasing::default()
///         .max_share(50) // a lease never holds more than 2% of a limit
///         .idle_return(Duration::from_millis(100)),
/// );
/// # let _ = builder;
/// ```
///
/// # Bounds
///
/// With `I` instances and leases of at most `L = limit / max_share` units:
/// - **Fixed window** (clock-aligned) and **sliding window counter**: never more than the
///   strategy's own bound across all instances. A lease is counted in Redis when it is drawn, in
///   the window (or bucket) it is used in, and dies at that window's end.
/// - **Token bucket**: a lease of `g` units dies `g x T` after it was drawn, so a unit is used at
///   most `L x T` after Redis counted it: over any span of time `d`, at most `B + L + d / T`
///   (the bucket's `B + d / T`, plus one lease).
/// - **Under-admission**: units leased by other instances and not yet used: at most
///   `(I - 1) x L` at once (and at most `room / shrink` per lease near the limit). They come back
///   when their instance returns them (after `idle_return` without use, at the latest, and a dead
///   token-bucket lease when it is replaced or swept) or, for the windows, when the window ends; a
///   dead instance's lease is lost until its window ends (`L x T` for the bucket).
/// - **Reset**: a `Reset` drops the resetting instance's lease and bumps the key's reset epoch in
///   Redis. A lease admits for at most [`renew_after`](Self::renew_after) after the reply that
///   granted or last renewed it; the next check renews it (a renewal that finds no room left
///   keeps the lease admitting), and the reply's epoch tells the instance whether the key was reset:
///   a lease drawn before the reset is dropped (counted as expired), and its return, whenever it
///   comes, is ignored by Redis. So after a reset at `t`, each other instance admits from leases
///   drawn before `t` at most the units it held or had in flight at `t` (fewer than `2 x L`: a
///   renewal asks only for what the lease lacks), and none once `renew_after` and a round trip
///   have passed; the count
///   Redis started afresh is never lowered by them. In the window of the reset, at most `limit +
///   (I - 1) x 2 x L` across all instances.
/// - **Clock**: a lease dies at its life on the limiter's clock or on the process's monotonic
///   clock, whichever comes first: a limiter clock that lags real time (a frozen
///   [`ManualClock`](crate::ManualClock), a coarse clock) cannot stretch it past Redis's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leasing {
    pub(super) max_share: u32,
    pub(super) horizon: Duration,
    pub(super) shrink: u32,
    pub(super) idle: Duration,
    pub(super) renew: Duration,
    pub(super) skip_unleasable: bool,
}

impl Default for Leasing {
    fn default() -> Self {
        Self {
            max_share: 20,
            horizon: Duration::from_millis(100),
            shrink: 4,
            idle: Duration::from_millis(250),
            renew: Duration::from_millis(250),
            skip_unleasable: false,
        }
    }
}

impl Leasing {
    /// The defaults: leases of at most 5% of a limit (`max_share(20)`), sized to 100 ms of the
    /// key's demand, at most a quarter of the room left, returned after 250 ms without use,
    /// renewed after 250 ms in use.
    pub fn new() -> Self {
        Self::default()
    }

    /// A lease holds at most `limit / n` units (at least 1; for the token bucket the limit is the
    /// burst). The bound on what other instances' leases can hold back. Default 20.
    pub fn max_share(mut self, n: u32) -> Self {
        self.max_share = n.max(1);
        self
    }

    /// A lease aims at the key's demand on this instance over this span (default 100 ms): small
    /// for cold keys (1 unit: a call per request, as without leasing), larger for hot ones.
    pub fn horizon(mut self, span: Duration) -> Self {
        self.horizon = span;
        self
    }

    /// A lease takes at most `1 / n` of the room left in Redis (default 4): leases shrink as a
    /// key nears its limit, so its last units are not stranded on an idle instance.
    pub fn shrink(mut self, n: u32) -> Self {
        self.shrink = n.max(1);
        self
    }

    /// A lease unused for this long gives its units back (default 250 ms).
    pub fn idle_return(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// A lease admits for at most this long after the reply that granted or renewed it (default
    /// 250 ms); the next check then renews it with Redis, which tells whether its key was reset
    /// meanwhile (a reset on another instance): the bound on how long a reset leaves other
    /// instances' leases admitting. A renewal asks only for what the lease lacks, and its rest
    /// merges with the grant (or, for the token bucket, goes back); one that finds no room keeps
    /// the lease admitting. The cost: the checks of a key whose lease lasts longer wait one round
    /// trip every `renew_after` (leases are sized to 100 ms of demand, so a busy key's is usually
    /// spent and fetched again sooner), and while Redis is down a lease stops admitting at its
    /// renewal, where the failure policy answers.
    pub fn renew_after(mut self, span: Duration) -> Self {
        self.renew = span;
        self
    }

    /// A rule whose strategy leasing cannot bound ([`Leasing::unleasable`]) is checked by a call
    /// per request, as without leasing, instead of refused by `build()`: for a store shared by
    /// limits of several strategies (a rules file's), leasing the limits it can.
    pub fn skip_unleasable(mut self) -> Self {
        self.skip_unleasable = true;
        self
    }

    /// Why leasing cannot bound `strategy` (the moving window, the first-hit window, the leaky
    /// bucket); `None` for the strategies it leases.
    pub fn unleasable(strategy: Strategy) -> Option<&'static str> {
        super::refusal(strategy)
    }

    /// The largest lease for `params` (at least 1).
    pub(super) fn cap(&self, strategy: Strategy, params: &[Params]) -> u64 {
        params
            .iter()
            .map(|p| {
                let limit = if strategy.is_bucket() {
                    p.burst
                } else {
                    p.limit
                };
                limit / u64::from(self.max_share)
            })
            .min()
            .unwrap_or(0)
            .max(1)
    }
}

/// What the leases of a [`RedisStore`](crate::store::redis::RedisStore) did ([`RedisStore::lease_counters`](crate::store::redis::RedisStore::lease_counters)).
///
/// Every granted unit is used, given back, dead or held: `granted = leased + returned + expired +
/// units_held` (while no fetch or return is in flight).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseCounters {
    /// Lease calls made (sent to Redis, or answered by the breaker or the overload policy).
    pub fetches: u64,
    /// Units granted by them.
    pub granted: u64,
    /// Units admitted from leases (each admitted check's cost, the check that fetched the lease
    /// included).
    pub leased: u64,
    /// Unused units given back to Redis (idle, replaced, dead token-bucket leases, and
    /// [`RedisStore::return_leases`](crate::store::redis::RedisStore::return_leases)).
    pub returned: u64,
    /// Unused units that were never given back: window leases that died with their window, leases
    /// dropped by a `Reset` of their key (on this instance, or found at a renewal on another), and
    /// returns that failed. A return that Redis ignores because the key was reset since its lease
    /// was drawn counts as returned.
    pub expired: u64,
    /// Leases held now.
    pub held: u64,
    /// Unused units in the leases held now.
    pub units_held: u64,
}
