//! The general per-key entry: any strategy, any number of quotas, with the times eviction needs
//! kept next to the state. Updated under its shard's write lock.

use std::collections::HashMap;

use parking_lot::RwLock;

use super::sketch::{self, Sketch, Spent};
use super::table::{Look, nearness};
use crate::decision::Outcome;
use crate::rule::{MAX_QUOTAS, Rule};
use crate::strategy::{
    self, FixedWindow, Gcra, Op, Params, QuotaState, SharedLog, SlidingWindow, Strategy, Verdict,
};

/// The most rules [`Rules`] remembers; keys of further rules are recorded, when evicted, as having
/// spent their whole limit until their state would have been fresh (an over-count, never less).
const MAX_RULES: usize = 4096;

/// The strategy and quotas of the rules general entries were used with, by [`Rule::tag`]: what an
/// evicted key's states are read with. Written when a key is inserted (not on the hot path), read
/// at eviction.
#[derive(Debug, Default)]
pub(super) struct Rules {
    known: RwLock<HashMap<u64, Shape>>,
}

/// A rule's strategy and quotas.
type Shape = (Strategy, Box<[Params]>);

impl Rules {
    /// Remembers `rule`.
    fn register(&self, rule: &Rule, tag: u64) {
        if self.known.read().contains_key(&tag) {
            return;
        }
        let mut known = self.known.write();
        if known.len() < MAX_RULES {
            known
                .entry(tag)
                .or_insert_with(|| (rule.strategy(), rule.nanos().into()));
        }
    }
}

/// One key's entry: its state under the rule it was first used with, and under other rules (tiers,
/// stacked layers with their own rules). It is updated under its shard's write lock
/// (`DashMap::get_mut`): two atomic operations per call, where a read lock plus a per-key mutex
/// took four.
pub(super) struct Entry {
    /// The scope tag of `state` ([`Scope::tag`](crate::store::Scope::tag)).
    tag: u64,
    state: KeyState,
    /// States under other rules. Most keys have none: a thin pointer costs a word, a `Vec` three.
    #[allow(clippy::box_collection)]
    others: Option<Box<Vec<(u64, KeyState)>>>,
    /// Set on use, cleared by eviction: the second-chance bit.
    pub(super) used: bool,
}

impl Entry {
    /// A new key's entry.
    pub(super) const fn new() -> Self {
        Self {
            tag: 0,
            state: KeyState::new(),
            others: None,
            used: true,
        }
    }

    /// A new key's entry under `rule` at `now`: at least as spent as what `sketch` recalls of it
    /// (routed by `key_hash`), if anything. Registers `rule` in `rules`.
    pub(super) fn recalled(
        rules: &Rules,
        sketch: &Sketch,
        key_hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
    ) -> Self {
        rules.register(rule, tag);
        match recall(sketch, key_hash, rule, tag, now) {
            Some(states) => Self::with_states(rules, rule, tag, states),
            None => Self::new(),
        }
    }

    /// Whether the first slot holds the state of scope tag `tag` (the common case: one rule per key).
    #[inline]
    pub(super) fn first_is(&self, tag: u64) -> bool {
        self.tag == tag
    }

    /// Whether the entry holds a state in the scope of tag `tag`.
    pub(super) fn holds(&self, tag: u64) -> bool {
        self.tag == tag
            || self
                .others
                .as_ref()
                .is_some_and(|o| o.iter().any(|(t, _)| *t == tag))
    }

    /// Before a call under `rule` on a held key whose first slot is another rule's: a state under
    /// `rule` the entry does not hold is recalled from `sketch` (the key may have been evicted with
    /// it and come back under another rule).
    #[cold]
    pub(super) fn recall_other(
        &mut self,
        rules: &Rules,
        sketch: &Sketch,
        key_hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
    ) {
        if self.holds(tag) {
            return;
        }
        rules.register(rule, tag);
        let Some(states) = recall(sketch, key_hash, rule, tag, now) else {
            return;
        };
        let state = Self::with_states(rules, rule, tag, states).state;
        if self.state.is_fresh(now) {
            self.tag = tag;
            self.state = state;
        } else {
            self.others
                .get_or_insert_with(Box::default)
                .push((tag, state));
        }
    }

    /// A key's entry holding `states` (one per quota) under `rule`.
    pub(super) fn with_states(
        rules: &Rules,
        rule: &Rule,
        tag: u64,
        states: Vec<QuotaState>,
    ) -> Self {
        rules.register(rule, tag);
        let fresh_at = states
            .iter()
            .zip(rule.nanos())
            .map(|(s, p)| s.fresh_at(p))
            .max()
            .unwrap_or(0);
        Self {
            tag,
            state: KeyState {
                quotas: States::new(rule.strategy(), states),
                fresh_at,
                blocked_until: 0,
            },
            ..Self::new()
        }
    }

    /// Applies `op` to the key's state under `rule` in the scope of tag `tag`: the index of the
    /// reported quota and its verdict.
    pub(super) fn run(&mut self, rule: &Rule, tag: u64, op: Op, now: u64) -> (usize, Verdict) {
        self.used = true;
        self.state_for(tag, now).run(rule, op, now)
    }

    /// How the key looks to eviction at `now`: its nearness is its reported quota's (a state of
    /// a rule not in `rules` counts as fully spent). Worked out here, not on every call: the hot
    /// path pays nothing for it. Rolls the states to `now` (what any call does first).
    pub(super) fn look(&mut self, rules: &Rules, now: u64) -> Look {
        if self.is_fresh(now) {
            return Look::Fresh;
        }
        let until = self.blocked_until();
        if until > now {
            return Look::Blocked(until);
        }
        let known = rules.known.read();
        let mut near = 0;
        let others = self.others.iter_mut().flat_map(|v| v.iter_mut());
        let states =
            std::iter::once((self.tag, &mut self.state)).chain(others.map(|(t, s)| (*t, s)));
        for (tag, state) in states {
            if state.is_fresh(now) {
                continue;
            }
            let shape = known.get(&tag);
            let params = shape.map(|(_, p)| &**p);
            near = near.max(state.with_quotas(params, |quotas| match shape {
                Some((strategy, params)) if params.len() == quotas.len() => {
                    // A peek: the reported quota is the one with the fewest left.
                    let (_, v) = strategy::apply(quotas, *strategy, params, now, Op::Peek);
                    nearness(v.limit, v.remaining, false)
                }
                _ => nearness(1, 0, false),
            }));
        }
        Look::Room(near | u16::from(self.used))
    }

    /// Folds what every state of the key (routed by `key_hash`) has spent into `sketch`.
    pub(super) fn forget(&self, rules: &Rules, key_hash: u64, now: u64, sketch: &Sketch) {
        let known = rules.known.read();
        let others = self.others.iter().flat_map(|v| v.iter());
        for (tag, state) in
            std::iter::once((self.tag, &self.state)).chain(others.map(|(t, s)| (*t, s)))
        {
            if state.is_fresh(now) {
                continue;
            }
            let shape = known.get(&tag);
            let params = shape.map(|(_, p)| &**p);
            state.with_quotas_ref(params, |quotas| match shape {
                Some((_, params)) if params.len() == quotas.len() => {
                    for (i, (q, p)) in quotas.iter().zip(params.iter()).enumerate() {
                        if let Some(spent) = sketch::summary(q, p, now) {
                            sketch.record(sketch::quota_hash(key_hash, tag, i), spent, now);
                        }
                    }
                }
                // Unknown: the whole limit of every quota until the state would be fresh.
                _ => {
                    let spent = Spent {
                        units: u64::MAX,
                        until: state.fresh_at,
                    };
                    for i in 0..quotas.len() {
                        sketch.record(sketch::quota_hash(key_hash, tag, i), spent, now);
                    }
                }
            });
        }
    }

    fn state_for(&mut self, tag: u64, now: u64) -> &mut KeyState {
        if self.tag == tag {
            return &mut self.state;
        }
        // The rule's state may live among the others: found there, it is used as it is (a fresh
        // first slot must not stand in for it, or a blocked key would start afresh).
        let found = self.others.as_deref_mut().and_then(|others| {
            others.retain(|(t, s)| *t == tag || !s.is_fresh(now));
            others.iter().position(|(t, _)| *t == tag)
        });
        if let Some(i) = found {
            return match self.others.as_deref_mut().and_then(|o| o.get_mut(i)) {
                Some((_, state)) => state,
                None => &mut self.state,
            };
        }
        if self.others.as_ref().is_some_and(|o| o.is_empty()) {
            self.others = None;
        }
        if self.state.is_fresh(now) {
            // The old rule's state is spent: the slot is this rule's now, with a new state.
            self.tag = tag;
            self.state = KeyState::new();
            return &mut self.state;
        }
        let others = self.others.get_or_insert_with(Box::default);
        others.push((tag, KeyState::new()));
        let last = others.len() - 1;
        // In bounds: `last` is the element just pushed.
        #[allow(clippy::indexing_slicing)]
        &mut others[last].1
    }

    fn states(&self) -> impl Iterator<Item = &KeyState> {
        let others = self.others.iter().flat_map(|v| v.iter().map(|(_, s)| s));
        std::iter::once(&self.state).chain(others)
    }

    /// Whether every state equals a new key's at `now`.
    pub(super) fn is_fresh(&self, now: u64) -> bool {
        self.states().all(|s| s.is_fresh(now))
    }

    /// Until when some state has no room for a request of cost 1.
    pub(super) fn blocked_until(&self) -> u64 {
        self.states().map(|s| s.blocked_until).max().unwrap_or(0)
    }
}

/// One key's state: one entry per quota, plus the times eviction needs.
struct KeyState {
    quotas: States,
    /// From this time on the state equals a new key's: it may be dropped.
    fresh_at: u64,
    /// Until this time the key is blocked (no room for a request of cost 1): never evicted.
    blocked_until: u64,
}

enum States {
    Empty,
    One(QuotaState),
    /// Several quotas of the moving window: each a log (after an operation the shared log could
    /// not run exactly, until every log is empty again).
    Many(Box<[QuotaState]>),
    /// Several quotas of the moving window: one log for all ([`SharedLog`]).
    Shared(Box<SharedLog>),
    /// Several quotas of another strategy, as tightly as it allows: a bucket's TAT in one word, a
    /// window's start and count (or a sliding counter's bucket, and its two counts) in two, where a
    /// `QuotaState` takes 32 bytes.
    Words(Strategy, Box<[u64]>),
}

/// Words per quota of `strategy` in [`States::Words`] (0: not held so).
const fn words_per_quota(strategy: Strategy) -> usize {
    match strategy {
        Strategy::TokenBucket | Strategy::LeakyBucket => 1,
        Strategy::MovingWindow => 0,
        _ => 2,
    }
}

/// The state of quota `i` in `words`.
// In bounds: `words` holds `words_per_quota` words for each quota of the rule, and `i` is a quota.
#[allow(clippy::indexing_slicing)]
#[inline]
fn decode(strategy: Strategy, words: &[u64], i: usize) -> QuotaState {
    match words_per_quota(strategy) {
        1 => QuotaState::Gcra(Gcra::from_tat(words[i])),
        _ => {
            let (a, b) = (words[2 * i], words[2 * i + 1]);
            match strategy {
                Strategy::SlidingWindow => {
                    QuotaState::Sliding(SlidingWindow::from_parts(a, (b >> 32) as u32, b as u32))
                }
                _ => QuotaState::Fixed(FixedWindow::from_parts(a, b)),
            }
        }
    }
}

/// Writes `state` as quota `i` of `words`.
// In bounds: as in `decode`.
#[allow(clippy::indexing_slicing)]
#[inline]
fn encode(state: &QuotaState, words: &mut [u64], i: usize) {
    match state {
        QuotaState::Gcra(g) => words[i] = g.tat(),
        QuotaState::Fixed(f) => {
            let (start, count) = f.parts();
            words[2 * i] = start;
            words[2 * i + 1] = count;
        }
        QuotaState::Sliding(w) => {
            let (bucket, cur, prev) = w.parts();
            words[2 * i] = bucket;
            words[2 * i + 1] = (u64::from(cur) << 32) | u64::from(prev);
        }
        // Not held as words.
        QuotaState::Moving(_) => {}
    }
}

/// What `sketch` recalls of the key routed by `key_hash` under `rule` at `now`: a state per quota
/// at least as spent as the key's when it was evicted, or `None` if nothing is recorded.
fn recall(
    sketch: &Sketch,
    key_hash: u64,
    rule: &Rule,
    tag: u64,
    now: u64,
) -> Option<Vec<QuotaState>> {
    let strategy = rule.strategy();
    let mut recalled = false;
    let states = rule
        .nanos()
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

/// The states held in `words` (eviction; a check decodes them on the stack instead).
fn unpacked(strategy: Strategy, words: &[u64]) -> Vec<QuotaState> {
    let n = words.len() / words_per_quota(strategy).max(1);
    (0..n).map(|i| decode(strategy, words, i)).collect()
}

/// The per-quota logs of `log` under `params`.
fn split(log: &SharedLog, params: &[Params]) -> Box<[QuotaState]> {
    log.split(params)
        .into_iter()
        .map(QuotaState::Moving)
        .collect()
}

/// When `states` (under `params`) become a new key's.
fn fresh_at_of(states: &[QuotaState], params: &[Params]) -> u64 {
    states
        .iter()
        .zip(params)
        .map(|(s, p)| s.fresh_at(p))
        .max()
        .unwrap_or(0)
}

impl States {
    /// `states` (of `strategy`), held as tightly as the strategy allows.
    fn new(strategy: Strategy, states: Vec<QuotaState>) -> Self {
        let per = words_per_quota(strategy);
        match <[QuotaState; 1]>::try_from(states) {
            Ok([one]) => States::One(one),
            Err(many) if per == 0 => {
                if many
                    .iter()
                    .all(|s| matches!(s, QuotaState::Moving(m) if m.len() == 0))
                {
                    States::Shared(Box::default())
                } else {
                    States::Many(many.into_boxed_slice())
                }
            }
            Err(many) => {
                let mut words = vec![0; per * many.len()].into_boxed_slice();
                for (i, s) in many.iter().enumerate() {
                    encode(s, &mut words, i);
                }
                States::Words(strategy, words)
            }
        }
    }
}

impl KeyState {
    /// Runs `f` on the per-quota states under `params` (a copy of them when held as words or in
    /// one log: what `f` changes there is not kept). A shared log of unknown quotas stands for
    /// [`MAX_QUOTAS`] empty logs.
    fn with_quotas<R>(
        &mut self,
        params: Option<&[Params]>,
        f: impl FnOnce(&mut [QuotaState]) -> R,
    ) -> R {
        match &mut self.quotas {
            States::One(s) => f(std::slice::from_mut(s)),
            States::Many(v) => f(v),
            _ => self.with_quotas_ref(params, |q| f(&mut q.to_vec())),
        }
    }

    /// Runs `f` on the per-quota states under `params` (see [`with_quotas`](Self::with_quotas)).
    fn with_quotas_ref<R>(
        &self,
        params: Option<&[Params]>,
        f: impl FnOnce(&[QuotaState]) -> R,
    ) -> R {
        match &self.quotas {
            States::Empty => f(&[]),
            States::One(s) => f(std::slice::from_ref(s)),
            States::Many(v) => f(v),
            States::Words(strategy, words) => f(&unpacked(*strategy, words)),
            States::Shared(log) => match params {
                Some(params) => f(&split(log, params)),
                None => f(&vec![QuotaState::new(Strategy::MovingWindow); MAX_QUOTAS]),
            },
        }
    }

    const fn new() -> Self {
        Self {
            quotas: States::Empty,
            fresh_at: 0,
            blocked_until: 0,
        }
    }

    /// Makes the per-quota states fit `rule`, new ones if the rule's shape changed.
    fn fit(&mut self, rule: &Rule) {
        let strategy = rule.strategy();
        let n = rule.nanos().len();
        let fits = match &self.quotas {
            States::Empty => false,
            States::One(s) => n == 1 && s.fits(strategy),
            States::Many(v) => v.len() == n && v.iter().all(|s| s.fits(strategy)),
            States::Shared(_) => strategy == Strategy::MovingWindow && n > 1,
            States::Words(s, w) => *s == strategy && w.len() == n * words_per_quota(strategy),
        };
        // Per-quota logs all empty again are one log again.
        let emptied = matches!(&self.quotas, States::Many(v)
            if v.iter().all(|s| matches!(s, QuotaState::Moving(m) if m.len() == 0)));
        if !fits || emptied {
            self.quotas = States::new(strategy, vec![QuotaState::new(strategy); n]);
        }
    }

    /// Applies `op` under `rule`: the index of the reported quota and its verdict.
    #[inline]
    fn run(&mut self, rule: &Rule, op: Op, now: u64) -> (usize, Verdict) {
        let params = rule.nanos();
        let strategy = rule.strategy();
        // A check under a one-quota rule without the general loop over quotas: what
        // `strategy::apply` does for one quota (check, then commit if allowed and cost > 0).
        if let (Op::Check(cost), [p], States::One(s)) = (op, params, &mut self.quotas) {
            if s.fits(strategy) {
                let cost = u64::from(cost);
                let v = s.check(strategy, p, now, cost);
                if v.outcome == Outcome::Allowed && cost > 0 {
                    s.commit(strategy, p, now, cost);
                }
                self.fresh_at = s.fresh_at(p);
                self.set_blocked(&v, now);
                return (0, v);
            }
        }
        self.fit(rule);
        let (index, v, fresh_at) = match &mut self.quotas {
            States::Words(strategy, words) => {
                // On the stack: no allocation per check.
                let n = params.len();
                let mut buf: [QuotaState; MAX_QUOTAS] = std::array::from_fn(|i| {
                    if i < n {
                        decode(*strategy, words, i)
                    } else {
                        QuotaState::Gcra(Gcra::default())
                    }
                });
                let states = buf.get_mut(..n).unwrap_or_default();
                let (index, v) = strategy::apply(states, *strategy, params, now, op);
                for (i, s) in states.iter().enumerate() {
                    encode(s, words, i);
                }
                (index, v, fresh_at_of(states, params))
            }
            States::One(s) => {
                let states = std::slice::from_mut(s);
                let (index, v) = strategy::apply(states, strategy, params, now, op);
                (index, v, fresh_at_of(states, params))
            }
            States::Many(states) => {
                let (index, v) = strategy::apply(states, strategy, params, now, op);
                (index, v, fresh_at_of(states, params))
            }
            States::Shared(log) => match log.apply(params, now, op) {
                Some((index, v)) => (index, v, log.fresh_at(params)),
                // Not exact on one log: per-quota logs from now on.
                None => {
                    let mut states = split(log, params);
                    let (index, v) = strategy::apply(&mut states, strategy, params, now, op);
                    let fresh_at = fresh_at_of(&states, params);
                    self.quotas = States::Many(states);
                    (index, v, fresh_at)
                }
            },
            States::Empty => (0, Verdict::allowed(0, 0, 0), 0),
        };
        self.fresh_at = fresh_at;
        self.set_blocked(&v, now);
        (index, v)
    }

    #[inline]
    fn set_blocked(&mut self, v: &Verdict, now: u64) {
        self.blocked_until = if v.remaining == 0 {
            let wait = if v.outcome == Outcome::Rejected {
                v.retry_after
            } else {
                v.reset_after
            };
            now.saturating_add(wait)
        } else {
            0
        };
    }

    /// Whether the state equals a new key's at `now`. A `fresh_at` saturated at the end of time
    /// (`u64::MAX`) never becomes fresh: dropping it would reset a live key.
    fn is_fresh(&self, now: u64) -> bool {
        self.fresh_at <= now && self.fresh_at != u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn moving_window_quotas_share_one_log_and_split_when_they_must() {
        // 16 quotas (10i per 60i s): checks and prompt refunds stay on one log, answering as the
        // pure arithmetic on per-quota logs; a clock step back splits the log, and the per-quota
        // logs become one again once empty.
        let text: Vec<String> = (1..=16)
            .map(|i| format!("{}/{}s", 10 * i, 60 * i))
            .collect();
        let rule = Rule::parse(Strategy::MovingWindow, &text.join("; ")).unwrap();
        let tag = rule.tag();
        let mut entry = Entry::new();
        let mut reference = vec![QuotaState::new(Strategy::MovingWindow); 16];
        let mut now = 1_000 * S;
        let mut step = |entry: &mut Entry, now: u64, op: Op| {
            let got = entry.run(&rule, tag, op, now);
            let want = strategy::apply(&mut reference, rule.strategy(), rule.nanos(), now, op);
            assert_eq!(got, want, "{op:?} at {now}");
        };
        for i in 0..600u64 {
            now += 170_000_000;
            let op = match i % 4 {
                0 => Op::Settle {
                    reserved: 1,
                    actual: 0,
                    at: now - 170_000_000,
                },
                _ => Op::Check(1),
            };
            step(&mut entry, now, op);
            assert!(matches!(entry.state.quotas, States::Shared(_)), "step {i}");
        }
        step(&mut entry, now - S, Op::Check(1));
        assert!(matches!(entry.state.quotas, States::Many(_)));
        // Every log empty after the longest period: one log again.
        now += 961 * S;
        step(&mut entry, now, Op::Peek);
        step(&mut entry, now + 1, Op::Check(1));
        assert!(matches!(entry.state.quotas, States::Shared(_)));
    }
}
