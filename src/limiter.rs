//! [`RateLimiter`]: a rule, a store and a clock.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Reservation};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::quota::{Quota, parse_quotas};
use crate::rule::Rule;
use crate::stats::{Counter, Stats};
use crate::store::{Answer, MemoryStore, MemoryStoreBuilder, NameClaim, Scope, Store, TableHint};
use crate::strategy::{Op, Strategy};
use crate::wait::{Next, Waiter};

/// Checks requests against a [`Rule`], keeping per-key state in a [`Store`] and reading time from a
/// [`Clock`]. Cheap to clone (an `Arc`).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, RateLimiter, Strategy};
///
/// let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
/// let limiter = RateLimiter::builder()
///     .strategy(Strategy::MovingWindow)
///     .quotas("2/second; 3/minute").unwrap()
///     .clock(clock.clone())
///     .build()
///     .unwrap();
///
/// assert!(limiter.check_now(&"alice", 1).is_allowed());
/// assert!(limiter.check_now(&"alice", 1).is_allowed());
/// let d = limiter.check_now(&"alice", 1);
/// assert!(!d.is_allowed());
/// assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
/// assert!(limiter.check_now(&"bob", 1).is_allowed(), "keys are independent");
///
/// clock.advance(Duration::from_secs(1));
/// let d = limiter.check_now(&"alice", 1);
/// assert!(d.is_allowed());
/// assert_eq!(d.remaining(), 0, "the minute quota is the binding one now");
/// ```
pub struct RateLimiter<K, S = MemoryStore<K>, C = SystemClock> {
    inner: Arc<Inner<S, C>>,
    _key: PhantomData<fn(&K)>,
}

struct Inner<S, C> {
    rule: Rule,
    /// The limiter's name, taken on its store for as long as the limiter lives.
    name: NameClaim,
    name_hash: u64,
    /// The scope tag of the limiter's own rule ([`Scope::tag`]), computed once.
    tag: u64,
    store: S,
    clock: C,
    fail_open: Counter,
    /// Requests refused for a per-request rule the store cannot honour.
    invalid_rules: Counter,
    /// Settlements refused: their reservation was another limiter's, rule's or key's.
    settle_refused: Counter,
    /// Per-request rules the store accepted.
    validated: Validated,
    /// The memory store's packed table for `rule`, learnt on the first synchronous check
    /// ([`RateLimiter::check_now`]); other stores ignore it.
    hint: TableHint,
}

/// The fingerprints ([`Rule::tag`]) of per-request rules the store has accepted, in a small
/// direct-mapped table: a rule is validated once, and again only after another rule took its slot
/// (0: empty).
struct Validated([AtomicU64; 64]);

impl Default for Validated {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Validated {
    /// Whether `store` accepts `rule`, from the table or asked once.
    fn check<K, S: Store<K>>(&self, store: &S, rule: &Rule) -> Result<(), ConfigError> {
        let tag = rule.tag().max(1);
        let Some(slot) = self.0.get((tag % 64) as usize) else {
            return store.validate(rule);
        };
        if slot.load(Ordering::Relaxed) == tag {
            return Ok(());
        }
        store.validate(rule)?;
        slot.store(tag, Ordering::Relaxed);
        Ok(())
    }
}

impl<K, S, C> Clone for RateLimiter<K, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            _key: PhantomData,
        }
    }
}

impl<K, S: fmt::Debug, C: fmt::Debug> fmt::Debug for RateLimiter<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &self.inner.name.name())
            .field("rule", &self.inner.rule)
            .field("store", &self.inner.store)
            .field("clock", &self.inner.clock)
            .finish()
    }
}

impl<K> RateLimiter<K> {
    /// Starts a builder: in-memory store, sliding window counter, and the system clock suited to the
    /// rule ([`SystemClock::suited_to`]: a millisecond-step time when the rule allows it) by default.
    pub fn builder() -> Builder<K> {
        Builder {
            name: None,
            strategy: Strategy::default(),
            quotas: Vec::new(),
            burst: None,
            store: MemoryStoreBuilder::default(),
            clock: SystemClock::new(),
            clock_chosen: false,
            sweep_every: None,
            window_offset: crate::WindowOffset::UTC,
            _key: PhantomData,
        }
    }
}

impl<K, S: Store<K>, C: Clock> RateLimiter<K, S, C> {
    /// A limiter from parts already built, its name taken on the store.
    fn from_parts(rule: Rule, name: NameClaim, store: S, clock: C) -> Self {
        let name_hash = crate::store::name_hash(name.name());
        let tag = Scope::hashed(name.name(), name_hash, &rule).tag();
        Self {
            inner: Arc::new(Inner {
                rule,
                name,
                name_hash,
                tag,
                store,
                clock,
                fail_open: Counter::default(),
                invalid_rules: Counter::default(),
                settle_refused: Counter::default(),
                validated: Validated::default(),
                hint: TableHint::default(),
            }),
            _key: PhantomData,
        }
    }

    /// The limiter's name (see [`Builder::name`]).
    pub fn name(&self) -> &str {
        self.inner.name.name()
    }

    /// Asks whether `key` may spend `cost` now, and spends it if so (all quotas or none).
    /// Cost 0 is a peek. A cost above what a quota can ever admit gets [`Outcome::Exceeds`](crate::Outcome::Exceeds).
    /// An admitted check's [`Decision::reservation`] can be settled later ([`settle`](Self::settle)).
    pub fn check(&self, key: &K, cost: u32) -> Answer<S::Future>
    where
        K: std::hash::Hash,
    {
        self.apply(key, None, Op::Check(cost))
    }

    /// The decision a request of cost 0 would get: the state, without consuming anything.
    pub fn peek(&self, key: &K) -> Answer<S::Future>
    where
        K: std::hash::Hash,
    {
        self.apply(key, None, Op::Peek)
    }

    /// Settles what an admitted check of `key` reserved: charges `units` instead of the
    /// reservation's cost (0 gives it all back, as for "only failures count" flows; more than the
    /// reservation charges the difference), atomically, in the window or bucket the check counted
    /// it in. Per strategy: GCRA moves its TAT by `(units - reserved) x T` (not below now, and the
    /// debt never past one bucket depth); the window strategies adjust the window or bucket the
    /// reservation was counted in, or nothing if it has ended; the moving window adds or removes
    /// entries at the reservation's own timestamp, and drops a charge beyond a full log.
    ///
    /// A reservation belongs to the limiter (and rule) whose check made it: settle it there only.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, RateLimiter, Strategy};
    ///
    /// let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    /// let limiter = RateLimiter::builder()
    ///     .strategy(Strategy::FixedWindow)
    ///     .quotas("3/minute").unwrap()
    ///     .clock(clock.clone())
    ///     .build()
    ///     .unwrap();
    /// let d = limiter.check_now(&"alice", 1);
    /// assert_eq!(d.remaining(), 2);
    /// // The login succeeded: only failures count.
    /// let reservation = d.reservation().expect("admitted");
    /// assert_eq!(limiter.settle_now(&"alice", reservation, 0).remaining(), 3);
    /// assert_eq!(limiter.check_now(&"bob", 5).reservation(), None, "a rejection reserves nothing");
    /// ```
    pub fn settle(&self, key: &K, reservation: Reservation, units: u32) -> Answer<S::Future>
    where
        K: std::hash::Hash,
    {
        self.apply(key, None, Op::settle(reservation, units))
    }

    /// Forgets `key`'s state: its next request is treated as a new key's.
    pub fn reset(&self, key: &K) -> Answer<S::Future>
    where
        K: std::hash::Hash,
    {
        self.apply(key, None, Op::Reset)
    }

    /// The general entry point: applies `op` to `key` under `rule` (`None`: the limiter's own),
    /// for what the verbs above do not cover, e.g. a quota chosen per request (tiers by plan).
    ///
    /// A key's state belongs to the limiter (its name) and the key, in every store: under another
    /// rule it is converted on access (strictly: never a fresh start, see
    /// [the guide](crate::guide::changing_limits)), so a key moved to another tier keeps what it
    /// spent. Limits meant to count apart need limiters of their own (one per route).
    ///
    /// A rule given here reaches the store only once the store has accepted it
    /// ([`Store::validate`], asked once per rule and remembered): one it cannot honour (on Redis, a
    /// bucket whose interval is below its microsecond) gets an error of kind
    /// [`StoreErrorKind::InvalidRule`], counted in [`Stats::invalid_rules`], and is never applied.
    #[inline]
    pub fn apply(&self, key: &K, rule: Option<&Rule>, op: Op) -> Answer<S::Future>
    where
        K: std::hash::Hash,
    {
        // Nested rather than a let chain: the crate builds on Rust 1.85 (`rust-version`).
        if let Some(r) = rule {
            if let Err(e) = self.inner.validated.check(&self.inner.store, r) {
                return Answer::now(Err(self.invalid_rule(r, &e)));
            }
        }
        let scope = self.scope(rule);
        let bound = match op {
            Op::Check(cost) if cost > 0 => bound(scope.tag(), key),
            Op::Settle { bound: of, .. } if of != bound(scope.tag(), key) => {
                return Answer::now(Err(self.foreign_reservation()));
            }
            _ => 0,
        };
        let now = self.now_under(rule);
        self.inner.store.apply(key, scope, op, now).bound_to(bound)
    }

    /// The time for a decision under `rule` (the limiter's own when `None`): the clock's reading
    /// for that rule ([`Clock::now_for`]), which a rule finer than the clock's steps reads precise.
    #[inline]
    pub(crate) fn now_under(&self, rule: Option<&Rule>) -> u64 {
        match rule {
            None => self.inner.clock.now(),
            Some(r) => self.inner.clock.now_for(r),
        }
    }

    /// `d`, made by the store for this limiter under `rule` (its own when `None`) and `key`
    /// (through [`Store::apply_all`]): its reservation bound to them.
    #[cfg(feature = "rules")]
    pub(crate) fn bind(&self, rule: Option<&Rule>, key: &K, mut d: Decision) -> Decision
    where
        K: std::hash::Hash,
    {
        if d.reservation().is_some() {
            d.bound = bound(self.scope(rule).tag(), key);
        }
        d
    }

    /// The error of a settlement whose reservation another limiter, rule or key made, counted.
    #[cold]
    fn foreign_reservation(&self) -> StoreError {
        self.inner.settle_refused.add(1);
        StoreError::new(
            StoreErrorKind::ForeignReservation,
            format!(
                "limiter {:?}: a reservation made by another limiter, rule or key is not settled here",
                self.name()
            ),
        )
    }

    /// The error of a request under `rule`, which the store refused with `e`, counted.
    #[cold]
    fn invalid_rule(&self, rule: &Rule, e: &ConfigError) -> StoreError {
        self.inner.invalid_rules.add(1);
        StoreError::new(
            StoreErrorKind::InvalidRule,
            format!(
                "limiter {:?}: a per-request rule ({} {:?}) the store cannot honour: {e}",
                self.name(),
                rule.strategy(),
                rule.quotas()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            ),
        )
        .with_source(e.clone())
    }

    /// The scope of this limiter's state under `rule` (its own rule when `None`).
    pub(crate) fn scope<'a>(&'a self, rule: Option<&'a Rule>) -> Scope<'a> {
        match rule {
            None => Scope::with_tag(self.name(), &self.inner.rule, self.inner.tag),
            Some(r) => Scope::hashed(self.name(), self.inner.name_hash, r),
        }
    }

    /// Waits (on tokio's timer) until `key` may spend `cost`, for at most `max_wait`, then spends it.
    ///
    /// A waiter holds no place while it sleeps, so dropping the future (a cancelled caller) costs
    /// nothing. Use [`TokioClock`](crate::TokioClock) as the limiter's clock for tests with paused time.
    ///
    /// # Errors
    /// [`WaitError::TooLong`] when the wait would exceed `max_wait`, [`WaitError::Never`] for a cost
    /// that can never be admitted, [`WaitError::Store`] when the store fails.
    pub async fn until_ready(
        &self,
        key: &K,
        cost: u32,
        max_wait: Duration,
    ) -> Result<Decision, WaitError>
    where
        K: std::hash::Hash,
    {
        let mut waiter = Waiter::default();
        loop {
            let d = self.check(key, cost).await.map_err(WaitError::Store)?;
            match waiter.next(&d, max_wait) {
                Next::Go => return Ok(d),
                Next::Never => return Err(WaitError::Never(d)),
                Next::TooLong => return Err(WaitError::TooLong(d)),
                Next::Sleep(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// The rule.
    pub fn rule(&self) -> &Rule {
        &self.inner.rule
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// Counters: the store's plus fail-open passes recorded by the layer.
    pub fn stats(&self) -> Stats {
        let mut s = self.inner.store.stats();
        s.fail_open = self.inner.fail_open.get();
        s.invalid_rules = self.inner.invalid_rules.get();
        s.settle_refused = self.inner.settle_refused.get();
        s
    }

    /// Records a request let through because the store failed (called by the layer).
    pub(crate) fn record_fail_open(&self) {
        self.inner.fail_open.add(1);
    }

    /// Removes all state that has become equivalent to a new key's, now. Not needed in normal use:
    /// the memory store sweeps incrementally as traffic flows.
    pub fn sweep(&self) {
        self.inner.store.sweep(self.inner.clock.now());
    }
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static, C: Clock>
    RateLimiter<K, MemoryStore<K>, C>
{
    /// [`check`](Self::check), synchronously: the memory store answers at once.
    #[inline]
    pub fn check_now(&self, key: &K, cost: u32) -> Decision {
        self.apply_now(key, None, Op::Check(cost))
    }

    /// [`peek`](Self::peek), synchronously.
    pub fn peek_now(&self, key: &K) -> Decision {
        self.apply_now(key, None, Op::Peek)
    }

    /// [`settle`](Self::settle), synchronously.
    pub fn settle_now(&self, key: &K, reservation: Reservation, units: u32) -> Decision {
        self.apply_now(key, None, Op::settle(reservation, units))
    }

    /// [`reset`](Self::reset), synchronously.
    pub fn reset_now(&self, key: &K) -> Decision {
        self.apply_now(key, None, Op::Reset)
    }

    /// [`apply`](Self::apply), synchronously. The memory store honours every rule (its
    /// [`Store::validate`] accepts all), so a rule given here goes to it as it is.
    #[inline]
    ///
    /// A settlement of a reservation that another limiter, rule or key made is not applied: it is
    /// counted in [`Stats::settle_refused`] and answered as a peek.
    pub fn apply_now(&self, key: &K, rule: Option<&Rule>, op: Op) -> Decision {
        let inner = &*self.inner;
        let tag = match rule {
            None => inner.tag,
            Some(r) => Scope::hashed(self.name(), inner.name_hash, r).tag(),
        };
        let op = match op {
            Op::Settle { bound: of, .. } if of != bound(tag, key) => {
                let _ = self.foreign_reservation();
                Op::Peek
            }
            _ => op,
        };
        let now = self.now_under(rule);
        let mut d = match rule {
            None => inner
                .store
                .decide_hinted(&inner.hint, key, &inner.rule, tag, op, now),
            Some(r) => inner.store.decide_in(key, r, tag, op, now),
        };
        // Only an admitted check reserves: a rejection pays nothing for the binding.
        if d.cost > 0 {
            d.bound = bound(tag, key);
        }
        d
    }
}

/// The fingerprint of the limiter scope `tag` (name and rule) and `key` a reservation is bound to
/// (never 0: a store's own reservations are 0).
///
/// Not a defence against crafted keys (nobody outside the crate can build a reservation): it tells
/// a reservation's own limiter and key from others, so a fixed seed and the cheapest hash do.
#[inline]
fn bound<K: std::hash::Hash>(tag: u64, key: &K) -> u64 {
    use std::hash::BuildHasher;
    (foldhash::fast::FixedState::with_seed(tag).hash_one(key) ^ tag).max(1)
}

/// Why [`RateLimiter::until_ready`] gave up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The slot would come later than the maximum wait; the last decision says when.
    TooLong(Decision),
    /// The cost can never be admitted.
    Never(Decision),
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong(d) => write!(
                f,
                "rate limited: no slot within the maximum wait (next in {:?})",
                Duration::from_nanos(d.retry_after)
            ),
            Self::Never(_) => {
                f.write_str("rate limited: the cost exceeds what the quota can ever admit")
            }
            Self::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for WaitError {}

/// What a [`Builder`] turns into its store: the memory store's options, or a store given whole
/// ([`Builder::store`]). Sealed, and not nameable outside the crate.
pub trait IntoStore<K>: sealed::Sealed {
    /// The store.
    type Store: Store<K>;
    /// Builds it.
    fn into_store(self) -> Self::Store;
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static> IntoStore<K> for MemoryStoreBuilder {
    type Store = MemoryStore<K>;
    fn into_store(self) -> MemoryStore<K> {
        self.build()
    }
}

/// A store given to [`Builder::store`].
#[derive(Debug)]
pub struct Given<S>(S);

mod sealed {
    /// Only the crate's store choices are [`IntoStore`](super::IntoStore).
    pub trait Sealed {}
    impl Sealed for crate::store::MemoryStoreBuilder {}
    impl<S> Sealed for super::Given<S> {}
}

impl<K, S: Store<K>> IntoStore<K> for Given<S> {
    type Store = S;
    fn into_store(self) -> S {
        self.0
    }
}

/// Builds a [`RateLimiter`]. See [`RateLimiter::builder`].
#[must_use]
pub struct Builder<K, S = MemoryStoreBuilder, C = SystemClock> {
    name: Option<String>,
    strategy: Strategy,
    quotas: Vec<Quota>,
    burst: Option<std::num::NonZeroU32>,
    window_offset: crate::WindowOffset,
    store: S,
    clock: C,
    /// `false` while the clock is the default, chosen at `build` for the rule.
    clock_chosen: bool,
    sweep_every: Option<Duration>,
    _key: PhantomData<fn(&K)>,
}

impl<K, S, C: fmt::Debug> fmt::Debug for Builder<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("strategy", &self.strategy)
            .field("quotas", &self.quotas)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<K, S, C> Builder<K, S, C> {
    /// The limiter's name (default `"default"`): 1 to 64 characters among `A-Z a-z 0-9 _ . -`,
    /// unique per store. Its state is kept under it, so limiters of the same name in different
    /// processes share a limit on Redis, and two limiters of different names on one store never
    /// share counters. It also names the limiter's `RateLimit` header items and its
    /// [`Settle`](crate::layer::Settle) markers.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The algorithm (default: [`Strategy::SlidingWindow`]).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Adds one quota.
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// Adds quotas from notation (`"5/second; 100/minute"`).
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for bad notation.
    pub fn quotas(mut self, text: &str) -> Result<Self, ConfigError> {
        self.quotas.extend(parse_quotas(text)?);
        Ok(self)
    }

    /// The burst (capacity) of the bucket strategies, for every quota that has none set.
    pub fn burst(mut self, burst: std::num::NonZeroU32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Clock-aligned windows follow the clock of the time zone at `offset` from UTC (default UTC):
    /// see [`Rule::with_window_offset`]. For a user's own time zone per request, give each
    /// request a rule with its offset ([`RateLimiter::apply`] or the layer's `select_rule`).
    pub fn window_offset(mut self, offset: crate::WindowOffset) -> Self {
        self.window_offset = offset;
        self
    }

    /// Also sweep expired keys every `interval` from a background thread that holds only a weak
    /// reference (it ends when the limiter is dropped). Traffic alone sweeps too; this returns idle
    /// memory when traffic stops.
    pub fn background_sweep(mut self, interval: Duration) -> Self {
        self.sweep_every = Some(interval);
        self
    }

    /// Uses another clock (the default is [`SystemClock::suited_to`] the rule).
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<K, S, C2> {
        Builder {
            name: self.name,
            strategy: self.strategy,
            quotas: self.quotas,
            burst: self.burst,
            window_offset: self.window_offset,
            store: self.store,
            clock,
            clock_chosen: true,
            sweep_every: self.sweep_every,
            _key: PhantomData,
        }
    }

    /// Uses another store (e.g. Redis).
    pub fn store<S2: Store<K>>(self, store: S2) -> Builder<K, Given<S2>, C> {
        Builder {
            name: self.name,
            strategy: self.strategy,
            quotas: self.quotas,
            burst: self.burst,
            window_offset: self.window_offset,
            store: Given(store),
            clock: self.clock,
            clock_chosen: self.clock_chosen,
            sweep_every: self.sweep_every,
            _key: PhantomData,
        }
    }

    /// The rule these settings describe.
    ///
    /// # Errors
    /// As [`Rule::new`].
    pub fn rule(&self) -> Result<Rule, ConfigError> {
        let quotas = self.quotas.iter().map(|q| match self.burst {
            Some(b) if !q.has_explicit_burst() => q.with_burst(b),
            _ => *q,
        });
        Ok(Rule::new(self.strategy, quotas)?.with_window_offset(self.window_offset))
    }
}

impl<K, C> Builder<K, MemoryStoreBuilder, C> {
    /// Caps the memory store's number of keys (see [`MemoryStore`]).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.store = self.store.max_keys(max_keys);
        self
    }
}

impl<K, S: IntoStore<K>, C: Clock> Builder<K, S, C> {
    /// Builds the limiter.
    ///
    /// # Errors
    /// As [`Rule::new`]: no quota, or a quota the strategy cannot represent;
    /// [`ConfigError::InvalidName`], [`ConfigError::DuplicateName`] for a name already taken on
    /// the store, and what the store refuses ([`Store::validate`]).
    pub fn build(self) -> Result<RateLimiter<K, S::Store, C>, ConfigError> {
        let name = self.name.as_deref().unwrap_or(DEFAULT_NAME);
        validate_name(name)?;
        let rule = self.rule()?;
        let store = self.store.into_store();
        store.validate(&rule)?;
        let claim = store.names().claim(name)?;
        let mut clock = self.clock;
        if !self.clock_chosen {
            if let Some(c) = (&mut clock as &mut dyn std::any::Any).downcast_mut::<SystemClock>() {
                *c = SystemClock::suited_to(&rule);
            }
        }
        let limiter = RateLimiter::from_parts(rule, claim, store, clock);
        if let Some(every) = self.sweep_every {
            spawn_sweeper(Arc::downgrade(&limiter.inner), every);
        }
        Ok(limiter)
    }
}

/// The name of a limiter built without [`Builder::name`].
pub(crate) const DEFAULT_NAME: &str = "default";

/// Whether `name` is a valid limiter name: `[A-Za-z0-9_.-]{1,64}`; [`ConfigError::InvalidName`]
/// otherwise.
pub(crate) fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName(name.to_owned()))
    }
}

fn spawn_sweeper<K, S: Store<K>, C: Clock>(weak: Weak<Inner<S, C>>, every: Duration) {
    let every = every.max(Duration::from_millis(10));
    let _ = std::thread::Builder::new()
        .name("tollgate-sweep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(inner) = weak.upgrade() else { break };
                Store::<K>::sweep(&inner.store, inner.clock.now());
            }
        });
}
