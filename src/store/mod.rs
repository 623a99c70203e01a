//! Where per-key state lives: in memory ([`MemoryStore`], the default) or on Redis (feature `redis`).
//!
//! A store applies an [`Op`] to one key in a [`Scope`] (a limiter's name and a [`Rule`]),
//! atomically for all quotas of the rule, and answers with an [`Answer`]: ready at once (the memory
//! store: no future, no allocation, and the layer decides during `call`) or a future (a network
//! store). A key's state is identified by the limiter's name and the key: it records the rule it
//! was written under, and a decision under another rule converts it (see
//! [the guide](crate::guide::changing_limits)).

mod key;
mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub use key::StoreKey;
pub(crate) use memory::TableHint;
pub use memory::{MemoryStore, MemoryStoreBuilder};

use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::rule::Rule;
use crate::stats::Stats;
use crate::strategy::Op;

/// A place to keep per-key state.
///
/// Implementations apply `op` to `key` atomically across all of the scope's rule's quotas, identify
/// a key's state by the scope's limiter name and the key (the state records its rule; a decision
/// under another rule converts it on access, atomically), and count their own decisions in
/// [`Store::stats`].
pub trait Store<K>: Send + Sync + 'static {
    /// The answer when it is not ready at once (a network round trip).
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Applies `op` to `key` in `scope`. `now` is the limiter's clock (nanoseconds since the Unix
    /// epoch); a store with its own time source (Redis's `TIME`) may use that instead.
    ///
    /// Answer [`Answer::now`] when the decision is known without waiting (the memory store always
    /// does): the layer then decides during `call`, without a poll through its response future.
    fn apply(&self, key: &K, scope: Scope<'_>, op: Op, now: u64) -> Answer<Self::Future>;

    /// Refuses a rule this store cannot apply (called by [`Builder::build`](crate::Builder::build)):
    /// Redis counts in microseconds, so a bucket quota finer than that is a [`ConfigError`].
    ///
    /// # Errors
    /// [`ConfigError`] for a rule the store cannot represent (a custom store's own reason:
    /// [`ConfigError::store`]).
    fn validate(&self, rule: &Rule) -> Result<(), ConfigError> {
        let _ = rule;
        Ok(())
    }

    /// The resolution of the store's clock: its decisions' times and waits are whole ticks (one
    /// microsecond on Redis). The default is one nanosecond, the limiter's clock unit; a store
    /// that wraps another forwards it (a shaping queue derives its waits from it).
    fn tick(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(1)
    }

    /// The names of the limiters built on this store: a second limiter of a name already taken is
    /// a [`ConfigError::DuplicateName`].
    fn names(&self) -> &LimiterNames;

    /// Counters: decisions, errors, evictions, keys held.
    fn stats(&self) -> Stats;

    /// Removes state that has become equivalent to a new key's. Stores that expire state
    /// themselves (Redis TTLs) do nothing.
    fn sweep(&self, now: u64) {
        let _ = now;
    }

    /// Checks several limits at once, all-or-nothing: each [`Item`] spends its cost from its key
    /// in its scope on its own store (`item.store`: one of this type, e.g. a limiter's own memory
    /// store or a clone of one Redis store), and once the answer completes, either every item
    /// admitted (each charged its cost, each answer a decision with its reservation) or none of
    /// them is charged.
    ///
    /// The answer is one `(index, answer)` pair per item decided, in the items' order, ending
    /// with the first rejection if there is one: items after it, and items before it when the
    /// store knew the rejection without asking (Redis's blocked-key cache), are not answered. An
    /// item whose store failed is answered with its error, charged nothing, and blocks no other:
    /// the caller's failure policy decides (fail-closed: settle the others to 0).
    ///
    /// The default is the two-phase protocol ([`AllAnswer::in_turn`]): the items are reserved in
    /// the given order (one [`Store::apply`] each), and on a rejection the reservations already
    /// made are settled to 0. It never over-admits (each item admits within its own quota); a
    /// concurrent request on one of the keys may be falsely rejected for the time of one
    /// decision, while a reservation that is then rolled back is held. [`MemoryStore`] decides
    /// under lock stripes taken in one fixed order, so no transient reservation is ever seen;
    /// the Redis store runs one script call when every key is in one slot.
    fn apply_all<'a>(&'a self, items: &'a [Item<'a, K, Self>], now: u64) -> AllAnswer<'a>
    where
        Self: Sized,
        K: Sync,
    {
        AllAnswer::in_turn(items, now)
    }
}

/// One limit of a [`Store::apply_all`] decision: `cost` units of `key` in `scope`, on `store`.
#[derive(Debug)]
pub struct Item<'a, K, S> {
    /// The store holding the limit's state.
    pub store: &'a S,
    /// The key.
    pub key: &'a K,
    /// The limiter's name and rule.
    pub scope: Scope<'a>,
    /// The units to spend.
    pub cost: u32,
}

impl<K, S> Clone for Item<'_, K, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, S> Copy for Item<'_, K, S> {}

/// The answers of [`Store::apply_all`]: `(item index, answer)` in the items' order, ending with
/// the first rejection if any, or (the memory store) every item answered, rejections included,
/// and the admitted ones given back when one rejected.
pub(crate) type Answers = Vec<(usize, Result<Decision, StoreError>)>;

/// A future of [`Answers`] borrowing the items.
type AnswersFuture<'a> = Pin<Box<dyn Future<Output = Answers> + Send + 'a>>;

/// The answer of [`Store::apply_all`]: ready now (the memory store), or a future. Its output is
/// one `(item index, answer)` pair per item decided, in the items' order, ending with the first
/// rejection if any (the memory store answers every item, rejections included, and gives the
/// admitted ones back when one rejected).
pub struct AllAnswer<'a> {
    inner: AllInner<'a>,
}

enum AllInner<'a> {
    Now(Option<Answers>),
    Later(AnswersFuture<'a>),
}

impl std::fmt::Debug for AllAnswer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            AllInner::Now(a) => f.debug_tuple("AllAnswer::Now").field(a).finish(),
            AllInner::Later(_) => f.write_str("AllAnswer::Later"),
        }
    }
}

impl<'a> AllAnswer<'a> {
    /// Answers known at once.
    pub fn now(answers: Vec<(usize, Result<Decision, StoreError>)>) -> Self {
        Self {
            inner: AllInner::Now(Some(answers)),
        }
    }

    /// Answers that come later, from `future` (boxed here: one allocation).
    pub fn later(
        future: impl Future<Output = Vec<(usize, Result<Decision, StoreError>)>> + Send + 'a,
    ) -> Self {
        Self {
            inner: AllInner::Later(Box::pin(future)),
        }
    }

    /// The answers, if they were known at once; otherwise the answer back.
    ///
    /// # Errors
    /// The answer itself, when it is a future.
    #[allow(clippy::type_complexity)]
    pub fn into_now(self) -> Result<Vec<(usize, Result<Decision, StoreError>)>, Self> {
        match self.inner {
            AllInner::Now(Some(a)) => Ok(a),
            inner => Err(Self { inner }),
        }
    }
}

impl Future for AllAnswer<'_> {
    type Output = Vec<(usize, Result<Decision, StoreError>)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answers> {
        match &mut self.inner {
            AllInner::Now(a) => Poll::Ready(a.take().unwrap_or_default()),
            AllInner::Later(f) => f.as_mut().poll(cx),
        }
    }
}

impl<'a> AllAnswer<'a> {
    /// The two-phase [`Store::apply_all`] (its default): each item reserved in the given order with
    /// [`Store::apply`], and on a rejection the reservations already made settled to 0 (a failed
    /// settlement is logged: its units stay spent, which under-admits, never over-admits).
    pub fn in_turn<K: Sync, S: Store<K>>(items: &'a [Item<'a, K, S>], now: u64) -> Self {
        Self::later(apply_all_in_turn(items, now))
    }
}

/// The answers of [`AllAnswer::in_turn`].
async fn apply_all_in_turn<K: Sync, S: Store<K>>(items: &[Item<'_, K, S>], now: u64) -> Answers {
    let mut out: Answers = Vec::with_capacity(items.len());
    for (i, it) in items.iter().enumerate() {
        let answer = it
            .store
            .apply(it.key, it.scope, Op::Check(it.cost), now)
            .await;
        let rejected = matches!(&answer, Ok(d) if !d.is_allowed());
        out.push((i, answer));
        if rejected {
            for (j, answer) in &out {
                let (Some(it), Ok(d)) = (items.get(*j), answer) else {
                    continue;
                };
                if let Some(r) = d.reservation() {
                    if let Err(e) = it
                        .store
                        .apply(it.key, it.scope, Op::settle(r, 0), now)
                        .await
                    {
                        tracing::warn!(limit = %it.scope.name(), error = %e, "rollback failed");
                    }
                }
            }
            break;
        }
    }
    out
}

/// Whose state an operation applies to: a limiter (by name) under one rule. A key's state belongs to
/// the name, whatever the rule (a scope of another rule converts it); limiters of the same name in
/// different processes share it (that is how instances share a limit on Redis).
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    name: &'a str,
    rule: &'a Rule,
    tag: u64,
}

impl<'a> Scope<'a> {
    /// The scope of the limiter named `name` under `rule`.
    pub fn new(name: &'a str, rule: &'a Rule) -> Self {
        Self::hashed(name, name_hash(name), rule)
    }

    /// [`Scope::new`] with the name's hash ([`name_hash`]) known.
    #[inline]
    pub(crate) fn hashed(name: &'a str, name_hash: u64, rule: &'a Rule) -> Self {
        Self {
            name,
            rule,
            tag: rule.tag() ^ name_hash.rotate_left(29),
        }
    }

    /// A scope whose tag is known already.
    #[inline]
    pub(crate) fn with_tag(name: &'a str, rule: &'a Rule, tag: u64) -> Self {
        Self { name, rule, tag }
    }

    /// The limiter's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The rule.
    pub fn rule(&self) -> &'a Rule {
        self.rule
    }

    /// A 64-bit fingerprint of the name and the rule, the same in every process and build: what a
    /// state records of the scope that wrote it (the name's part is the identity; the rule's says
    /// whether a decision must convert).
    pub fn tag(&self) -> u64 {
        self.tag
    }
}

/// The name's part of the scope tag `tag` of `rule` (see [`Scope::tag`]): what a state's
/// identity is, whatever the rule.
#[inline]
pub(crate) fn name_of(rule: &Rule, tag: u64) -> u64 {
    tag ^ rule.tag()
}

/// The stable hash of a limiter name (FNV-1a), mixed into [`Scope::tag`].
pub(crate) fn name_hash(name: &str) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for b in name.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

pin_project_lite::pin_project! {
    /// A store's answer: ready now, or a future.
    ///
    /// It is a future itself, so `limiter.check(..).await` works with any store.
    #[derive(Debug)]
    pub struct Answer<F> {
        #[pin]
        inner: AnswerInner<F>,
        // The limiter and key the decision is for (0: none), set on the decision it answers.
        bound: u64,
    }
}

pin_project_lite::pin_project! {
    #[project = AnswerProj]
    #[derive(Debug)]
    enum AnswerInner<F> {
        Now { result: Option<Result<Decision, StoreError>> },
        Later { #[pin] future: F },
    }
}

impl<F> Answer<F> {
    /// An answer known at once.
    #[inline]
    pub fn now(result: Result<Decision, StoreError>) -> Self {
        Self {
            inner: AnswerInner::Now {
                result: Some(result),
            },
            bound: 0,
        }
    }

    /// An answer that comes later.
    pub fn later(future: F) -> Self {
        Self {
            inner: AnswerInner::Later { future },
            bound: 0,
        }
    }

    /// This answer, its decision made for the limiter and key of fingerprint `bound`.
    #[inline]
    pub(crate) fn bound_to(mut self, bound: u64) -> Self {
        self.bound = bound;
        self
    }

    /// The answer, if it was known at once; otherwise the answer back.
    ///
    /// # Errors
    /// The answer itself, when it is a future.
    #[inline]
    pub fn into_now(self) -> Result<Result<Decision, StoreError>, Self> {
        match self.inner {
            AnswerInner::Now {
                result: Some(result),
            } => Ok(bind(result, self.bound)),
            inner => Err(Self {
                inner,
                bound: self.bound,
            }),
        }
    }
}

impl<F: Future<Output = Result<Decision, StoreError>>> Future for Answer<F> {
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let bound = *this.bound;
        match this.inner.project() {
            AnswerProj::Now { result } => Poll::Ready(bind(
                result.take().unwrap_or_else(|| {
                    Err(StoreError::new(
                        crate::error::StoreErrorKind::Other,
                        "an answer polled after it completed",
                    ))
                }),
                bound,
            )),
            AnswerProj::Later { future } => future.poll(cx).map(|r| bind(r, bound)),
        }
    }
}

/// `result`'s decision made for the limiter and key of fingerprint `bound` (0: left as it is).
#[inline]
fn bind(result: Result<Decision, StoreError>, bound: u64) -> Result<Decision, StoreError> {
    result.map(|mut d| {
        if bound != 0 {
            d.bound = bound;
        }
        d
    })
}

/// The names of the limiters built on one store (see [`Store::names`]).
#[derive(Clone, Debug, Default)]
pub struct LimiterNames {
    taken: Arc<parking_lot::Mutex<HashSet<Box<str>>>>,
}

impl LimiterNames {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a limiter of this name exists on the store.
    pub fn contains(&self, name: &str) -> bool {
        self.taken.lock().contains(name)
    }

    /// Takes `name` until the claim is dropped.
    pub(crate) fn claim(&self, name: &str) -> Result<NameClaim, ConfigError> {
        if !self.taken.lock().insert(name.into()) {
            return Err(ConfigError::DuplicateName(name.to_owned()));
        }
        Ok(NameClaim {
            names: self.clone(),
            name: name.into(),
        })
    }
}

/// Says, once per limiter name, that a key's state was converted to a changed rule by an estimate
/// (a moving window whose old log did not cover the new period: entries stamped now).
#[derive(Debug, Default)]
pub(crate) struct EstimateWarnings {
    /// The name parts of scope tags warned about.
    warned: parking_lot::Mutex<HashSet<u64>>,
}

impl EstimateWarnings {
    /// Warns for the limiter whose name's part of a scope tag ([`Scope::tag`] without the rule's)
    /// is `part`, unless it was warned about; the name is looked up among the store's `names`.
    #[cold]
    pub(crate) fn warn(&self, names: &LimiterNames, strategy: crate::Strategy, part: u64) {
        if !self.warned.lock().insert(part) {
            return;
        }
        let name = names
            .taken
            .lock()
            .iter()
            .find(|n| name_hash(n).rotate_left(29) == part)
            .map(|n| n.to_string());
        tracing::warn!(
            limit = name.as_deref().unwrap_or("(dropped)"),
            %strategy,
            "a key's state was converted to a changed rule by an estimate (the moving window's \
             old log did not cover the new period: the units it proves spent are stamped now); \
             logged once per limit"
        );
    }
}

/// A name taken on a store, given back when the limiter is dropped.
pub(crate) struct NameClaim {
    names: LimiterNames,
    name: Box<str>,
}

impl NameClaim {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for NameClaim {
    fn drop(&mut self) {
        self.names.taken.lock().remove(&self.name);
    }
}
