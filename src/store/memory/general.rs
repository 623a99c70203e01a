//! The general per-key entry: any strategy, any number of quotas, with the times eviction needs
//! kept next to the state. Updated under its shard's write lock.

use std::collections::HashMap;

use parking_lot::RwLock;

use super::sketch::{self, Sketch, Spent};
use super::table::{Look, nearness};
use crate::decision::Outcome;
use crate::rule::Rule;
use crate::strategy::{self, Op, Params, QuotaState, Strategy, Verdict};

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
    fn register(&self, rule: &Rule) {
        if self.known.read().contains_key(&rule.tag()) {
            return;
        }
        let mut known = self.known.write();
        if known.len() < MAX_RULES {
            known
                .entry(rule.tag())
                .or_insert_with(|| (rule.strategy(), rule.nanos().into()));
        }
    }
}

/// One key's entry: its state under the rule it was first used with, and under other rules (tiers,
/// stacked layers with their own rules). It is updated under its shard's write lock
/// (`DashMap::get_mut`): two atomic operations per call, where a read lock plus a per-key mutex
/// took four.
pub(super) struct Entry {
    /// [`Rule::tag`] of `state`'s rule.
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
    /// (routed by `key_hash`), if anything. Registers `rule` in `rules` (a key's state under a
    /// further rule, not registered, is recorded at eviction as fully spent: an over-count).
    pub(super) fn recalled(
        rules: &Rules,
        sketch: &Sketch,
        key_hash: u64,
        rule: &Rule,
        now: u64,
    ) -> Self {
        let strategy = rule.strategy();
        let params = rule.nanos();
        let mut recalled = false;
        let states: Vec<QuotaState> = params
            .iter()
            .enumerate()
            .map(
                |(i, p)| match sketch.lookup(sketch::quota_hash(key_hash, rule.tag(), i), now) {
                    Some(spent) => {
                        recalled = true;
                        sketch::restore(strategy, p, spent, now)
                    }
                    None => QuotaState::new(strategy),
                },
            )
            .collect();
        rules.register(rule);
        if recalled {
            Self::with_states(rules, rule, states)
        } else {
            Self::new()
        }
    }

    /// A key's entry holding `states` (one per quota) under `rule`.
    pub(super) fn with_states(rules: &Rules, rule: &Rule, states: Vec<QuotaState>) -> Self {
        rules.register(rule);
        let fresh_at = states
            .iter()
            .zip(rule.nanos())
            .map(|(s, p)| s.fresh_at(p))
            .max()
            .unwrap_or(0);
        Self {
            tag: rule.tag(),
            state: KeyState {
                quotas: match <[QuotaState; 1]>::try_from(states) {
                    Ok([one]) => States::One(one),
                    Err(many) => States::Many(many.into_boxed_slice()),
                },
                fresh_at,
                blocked_until: 0,
            },
            ..Self::new()
        }
    }

    /// Applies `op` to the key's state under `rule`: the index of the reported quota and its verdict.
    pub(super) fn run(&mut self, rule: &Rule, op: Op, now: u64) -> (usize, Verdict) {
        self.used = true;
        self.state_for(rule, now).run(rule, op, now)
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
            let quotas = state.quotas_mut();
            match known.get(&tag) {
                Some((strategy, params)) if params.len() == quotas.len() => {
                    // A peek: the reported quota is the one with the fewest left.
                    let (_, v) = strategy::apply(quotas, *strategy, params, now, Op::Peek);
                    near = near.max(nearness(v.limit, v.remaining, false));
                }
                _ => near = near.max(nearness(1, 0, false)),
            }
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
            let quotas = state.quotas();
            match known.get(&tag) {
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
            }
        }
    }

    fn state_for(&mut self, rule: &Rule, now: u64) -> &mut KeyState {
        let tag = rule.tag();
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
    Many(Box<[QuotaState]>),
}

impl KeyState {
    /// The per-quota states, to roll.
    fn quotas_mut(&mut self) -> &mut [QuotaState] {
        match &mut self.quotas {
            States::Empty => &mut [],
            States::One(s) => std::slice::from_mut(s),
            States::Many(v) => v,
        }
    }

    /// The per-quota states.
    fn quotas(&self) -> &[QuotaState] {
        match &self.quotas {
            States::Empty => &[],
            States::One(s) => std::slice::from_ref(s),
            States::Many(v) => v,
        }
    }

    const fn new() -> Self {
        Self {
            quotas: States::Empty,
            fresh_at: 0,
            blocked_until: 0,
        }
    }

    /// The per-quota states for `rule`, replaced by new ones if the rule's shape changed.
    fn states_for(&mut self, rule: &Rule) -> &mut [QuotaState] {
        let strategy = rule.strategy();
        let n = rule.nanos().len();
        let fits = match &self.quotas {
            States::Empty => false,
            States::One(s) => n == 1 && s.fits(strategy),
            States::Many(v) => v.len() == n && v.iter().all(|s| s.fits(strategy)),
        };
        if !fits {
            self.quotas = if n == 1 {
                States::One(QuotaState::new(strategy))
            } else {
                States::Many(vec![QuotaState::new(strategy); n].into_boxed_slice())
            };
        }
        match &mut self.quotas {
            States::Empty => &mut [],
            States::One(s) => std::slice::from_mut(s),
            States::Many(v) => v,
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
        let states = self.states_for(rule);
        let (index, v) = strategy::apply(states, strategy, params, now, op);
        let fresh_at = states
            .iter()
            .zip(params)
            .map(|(s, p)| s.fresh_at(p))
            .max()
            .unwrap_or(0);
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
