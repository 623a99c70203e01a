//! The general per-key entry: any strategy, any number of quotas, with the times eviction needs
//! kept next to the state. Updated under its shard's write lock.

use super::packed::{NOW_LIMIT, check_words};
use super::sketch::{self, Sketch, Spent};
use super::table::{Look, nearness};
use crate::decision::Outcome;
use crate::rule::{MAX_QUOTAS, Rule};
use crate::strategy::{
    self, FixedWindow, Gcra, Held, Op, Params, QuotaState, SharedLog, Strategy, Verdict,
};

mod recall;
mod rules;
mod words;

use crate::store::name_of;
use recall::recall;
pub(super) use recall::{clear_records, recall_held};
use rules::Shape;
pub(super) use rules::{Rules, SeenRule};
#[cfg(test)]
use words::is_new;
use words::{decode, encode, packed_words, quota_words, repack, unpacked, words_per_quota};

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
            Some(states) => Self::with_states(rules, rule, tag, states, now),
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
        let state = Self::with_states(rules, rule, tag, states, now).state;
        self.put(tag, state, now);
    }

    /// A new key's entry under `rule` converted from `old` (its state under other rules of the
    /// same limiter name, and their records) at `now`.
    pub(super) fn converted(rules: &Rules, rule: &Rule, tag: u64, old: &[Held], now: u64) -> Self {
        rules.register(rule, tag);
        Self {
            tag,
            state: KeyState::converted(rules, rule, tag, old, now),
            ..Self::new()
        }
    }

    /// Adds a state under `rule` converted from `old` (the entry holds none of the name's).
    #[cold]
    pub(super) fn add_converted(
        &mut self,
        rules: &Rules,
        rule: &Rule,
        tag: u64,
        old: &[Held],
        now: u64,
    ) {
        let state = KeyState::converted(rules, rule, tag, old, now);
        self.put(tag, state, now);
    }

    /// Puts `state` in a slot of its own: the first if that one is fresh, else among the others.
    fn put(&mut self, tag: u64, state: KeyState, now: u64) {
        if self.state.is_fresh(now) {
            self.tag = tag;
            self.state = state;
        } else {
            self.others
                .get_or_insert_with(Box::default)
                .push((tag, state));
        }
    }

    /// Before a call under `rule` in the scope of tag `tag`, when the first slot is another
    /// scope's: a state of the same limiter name under another rule is converted to `rule` (under
    /// the entry's lock) and from then on recorded under it. Returns whether the entry now holds
    /// the scope's state (it held it, or converted the name's).
    #[cold]
    pub(super) fn convert_to(&mut self, rules: &Rules, rule: &Rule, tag: u64, now: u64) -> bool {
        if self.holds(tag) {
            return true;
        }
        let name = name_of(rule, tag);
        let found = {
            let known = rules.known.read();
            let others = self.others.iter().flat_map(|v| v.iter());
            std::iter::once(self.tag)
                .chain(others.map(|(t, _)| *t))
                .position(|t| known.get(&t).is_some_and(|s| s.name == name))
        };
        let Some(at) = found else {
            return false;
        };
        let slot = match at.checked_sub(1) {
            None => Some((&mut self.tag, &mut self.state)),
            Some(i) => self
                .others
                .as_deref_mut()
                .and_then(|o| o.get_mut(i))
                .map(|(t, s)| (t, s)),
        };
        if let Some((slot_tag, state)) = slot {
            let old = state.held(rules, *slot_tag, now);
            *state = KeyState::converted(rules, rule, tag, &old, now);
            *slot_tag = tag;
        }
        true
    }

    /// A key's entry holding `states` (one per quota) under `rule`, at `now`.
    pub(super) fn with_states(
        rules: &Rules,
        rule: &Rule,
        tag: u64,
        states: Vec<QuotaState>,
        now: u64,
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
                quotas: States::new(rule, states, now),
                fresh_at,
                blocked_until: 0,
                ghosts: None,
            },
            ..Self::new()
        }
    }

    /// Applies `op` to the key's state under `rule` in the scope of tag `tag`: the index of the
    /// reported quota, its verdict, and the settled units a full moving-window log dropped.
    pub(super) fn run(&mut self, rule: &Rule, tag: u64, op: Op, now: u64) -> (usize, Verdict, u64) {
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
            near = near.max(state.with_quotas(shape, now, |quotas| match shape {
                Some(shape) if shape.params.len() == quotas.len() => {
                    // A peek: the reported quota is the one with the fewest left.
                    let (_, v) =
                        strategy::apply(quotas, shape.strategy, &shape.params, now, Op::Peek);
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
            state.with_quotas_ref(shape, now, |quotas| match shape {
                Some(shape) if shape.params.len() == quotas.len() => {
                    for (i, (q, p)) in quotas.iter().zip(shape.params.iter()).enumerate() {
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
                        rank: u8::MAX,
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
    /// Quotas of periods a rule change removed, until their windows end: charged every admitted
    /// unit, read by a later conversion (see [`strategy::convert`]). Most states have none.
    #[allow(clippy::box_collection)]
    ghosts: Option<Box<Vec<Held>>>,
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
    /// Several quotas of the fixed windows or the sliding window counter, one word each, laid out
    /// as a packed table would lay out that quota alone (the rule's [`QuotaWords`]). Only below
    /// [`NOW_LIMIT`] and while every state reads back as it was (a sliding window's previous count
    /// may read back rounded up, as in the packed table: stricter, never more lenient); otherwise
    /// the key goes over to [`States::Words`].
    Packed(Strategy, Box<[u64]>),
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
    /// `states` (of `rule`'s strategy) at `now`, held as tightly as the strategy allows.
    fn new(rule: &Rule, states: Vec<QuotaState>, now: u64) -> Self {
        let strategy = rule.strategy();
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
                if let Some(words) = packed_words(rule, &many, now) {
                    return States::Packed(strategy, words);
                }
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
    /// Runs `f` on the per-quota states under `shape`, read at `now` (a copy of them when held as
    /// words or in one log: what `f` changes there is not kept). A shared log of unknown quotas
    /// stands for [`MAX_QUOTAS`] empty logs, one-word states of unknown layouts for new states
    /// (only their number is known).
    fn with_quotas<R>(
        &mut self,
        shape: Option<&Shape>,
        now: u64,
        f: impl FnOnce(&mut [QuotaState]) -> R,
    ) -> R {
        match &mut self.quotas {
            States::One(s) => f(std::slice::from_mut(s)),
            States::Many(v) => f(v),
            _ => self.with_quotas_ref(shape, now, |q| f(&mut q.to_vec())),
        }
    }

    /// Runs `f` on the per-quota states under `shape` (see [`with_quotas`](Self::with_quotas)).
    fn with_quotas_ref<R>(
        &self,
        shape: Option<&Shape>,
        now: u64,
        f: impl FnOnce(&[QuotaState]) -> R,
    ) -> R {
        match &self.quotas {
            States::Empty => f(&[]),
            States::One(s) => f(std::slice::from_ref(s)),
            States::Many(v) => f(v),
            States::Words(strategy, words) => f(&unpacked(*strategy, words)),
            States::Packed(strategy, words) => match shape.and_then(|s| s.words.as_deref()) {
                Some(layouts) if layouts.len() == words.len() => {
                    let states: Vec<QuotaState> = words
                        .iter()
                        .zip(layouts)
                        .map(|(w, l)| l.unpack(*w, now))
                        .collect();
                    f(&states)
                }
                _ => f(&vec![QuotaState::new(*strategy); words.len()]),
            },
            States::Shared(log) => match shape {
                Some(shape) => f(&split(log, &shape.params)),
                None => f(&vec![QuotaState::new(Strategy::MovingWindow); MAX_QUOTAS]),
            },
        }
    }

    const fn new() -> Self {
        Self {
            quotas: States::Empty,
            fresh_at: 0,
            blocked_until: 0,
            ghosts: None,
        }
    }

    /// The state under `rule` (scope `tag`) converted from `old` at `now`.
    fn converted(rules: &Rules, rule: &Rule, tag: u64, old: &[Held], now: u64) -> Self {
        let c = strategy::convert(old, rule.strategy(), rule.nanos(), now);
        if !c.exact {
            rules.warn_inexact(rule, tag);
        }
        let ghosts_fresh_at = c
            .ghosts
            .iter()
            .map(|g| g.state.fresh_at(&g.params))
            .max()
            .unwrap_or(0);
        let fresh_at = fresh_at_of(&c.states, rule.nanos()).max(ghosts_fresh_at);
        Self {
            quotas: States::new(rule, c.states, now),
            fresh_at,
            blocked_until: 0,
            ghosts: (!c.ghosts.is_empty()).then(|| Box::new(c.ghosts)),
        }
    }

    /// This state (recorded under scope `tag`) as held quotas, its ghosts included; a state of a
    /// rule not remembered reads as spent in full until it would be fresh.
    fn held(&self, rules: &Rules, tag: u64, now: u64) -> Vec<Held> {
        let known = rules.known.read();
        let shape = known.get(&tag);
        let mut held = self.with_quotas_ref(shape, now, |quotas| match shape {
            Some(shape) if shape.params.len() == quotas.len() => quotas
                .iter()
                .zip(shape.params.iter())
                .map(|(q, p)| Held {
                    strategy: shape.strategy,
                    params: *p,
                    state: q.clone(),
                })
                .collect(),
            _ if self.is_fresh(now) => Vec::new(),
            _ => {
                let limit = u64::from(u32::MAX);
                let window = self.fresh_at.saturating_sub(now).max(1);
                vec![Held {
                    strategy: Strategy::FixedWindowFirstHit,
                    params: Params::bucket(limit, window, limit),
                    state: QuotaState::Fixed(FixedWindow::from_parts(now, limit)),
                }]
            }
        });
        held.extend(self.ghosts.iter().flat_map(|g| g.iter().cloned()));
        held
    }

    /// Charges the ghosts what `op` admitted (`v`), and drops those that ended.
    #[cold]
    fn charge_ghosts(&mut self, op: Op, v: &Verdict, now: u64) {
        if matches!(op, Op::Reset) {
            // A reset forgets what the key spent under every rule, removed periods included.
            self.ghosts = None;
            return;
        }
        let Some(ghosts) = self.ghosts.as_deref_mut() else {
            return;
        };
        if let Op::Check(cost) = op {
            if v.outcome == Outcome::Allowed && cost > 0 {
                for g in ghosts.iter_mut() {
                    g.charge(now, u64::from(cost));
                }
            }
        }
        ghosts.retain(|g| !g.is_fresh(now));
        let until = ghosts.iter().map(|g| g.state.fresh_at(&g.params)).max();
        match until {
            Some(until) => self.fresh_at = self.fresh_at.max(until),
            None => self.ghosts = None,
        }
    }

    /// Makes the per-quota states fit `rule`, new ones at `now` if the rule's shape changed.
    fn fit(&mut self, rule: &Rule, now: u64) {
        let strategy = rule.strategy();
        let n = rule.nanos().len();
        let fits = match &self.quotas {
            States::Empty => false,
            States::One(s) => n == 1 && s.fits(strategy),
            States::Many(v) => v.len() == n && v.iter().all(|s| s.fits(strategy)),
            States::Shared(_) => strategy == Strategy::MovingWindow && n > 1,
            States::Words(s, w) => *s == strategy && w.len() == n * words_per_quota(strategy),
            States::Packed(s, w) => *s == strategy && w.len() == n && quota_words(rule).is_some(),
        };
        // Per-quota logs all empty again are one log again.
        let emptied = matches!(&self.quotas, States::Many(v)
            if v.iter().all(|s| matches!(s, QuotaState::Moving(m) if m.len() == 0)));
        if !fits || emptied {
            self.quotas = States::new(rule, vec![QuotaState::new(strategy); n], now);
        }
    }

    /// Applies `op` under `rule`: the index of the reported quota, its verdict, and the settled
    /// units a full moving-window log could not hold (0 for anything but such a settlement).
    #[inline]
    fn run(&mut self, rule: &Rule, op: Op, now: u64) -> (usize, Verdict, u64) {
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
                if self.ghosts.is_some() {
                    self.charge_ghosts(op, &v, now);
                }
                return (0, v, 0);
            }
        }
        self.fit(rule, now);
        let (index, v, fresh_at, dropped) = match &mut self.quotas {
            States::Packed(strategy, words) => {
                let strategy = *strategy;
                // Some: `fit` kept the words only then.
                let layouts = quota_words(rule).unwrap_or_default();
                // A check: each layout's own state type, without the general state (what almost
                // every call is).
                let checked = match op {
                    Op::Check(cost) if now < NOW_LIMIT && layouts.len() == params.len() => {
                        check_words(layouts, words, now, cost)
                    }
                    _ => None,
                };
                if let Some(checked) = checked {
                    self.fresh_at = checked.2;
                    self.set_blocked(&checked.1, now);
                    if self.ghosts.is_some() {
                        self.charge_ghosts(op, &checked.1, now);
                    }
                    return (checked.0, checked.1, 0);
                }
                let n = params.len();
                // On the stack, as for `Words`.
                let mut buf: [QuotaState; MAX_QUOTAS] =
                    std::array::from_fn(|i| match (layouts.get(i), words.get(i)) {
                        (Some(l), Some(w)) => l.unpack(*w, now),
                        _ => QuotaState::Gcra(Gcra::default()),
                    });
                let states = buf.get_mut(..n).unwrap_or_default();
                let (index, v) = strategy::apply(states, strategy, params, now, op);
                let (check, spent) = match op {
                    Op::Check(cost) => (true, v.outcome == Outcome::Allowed && cost > 0),
                    Op::Peek => (false, false),
                    _ => (false, true),
                };
                // From the end of packed time on (or for a state that does not fit its word), two
                // words per quota, exact at any time.
                if now >= NOW_LIMIT || !repack(layouts, words, states, params, now, (check, spent))
                {
                    let mut two = vec![0; 2 * n].into_boxed_slice();
                    for (i, s) in states.iter().enumerate() {
                        encode(s, &mut two, i);
                    }
                    self.quotas = States::Words(strategy, two);
                }
                (index, v, fresh_at_of(states, params), 0)
            }
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
                (index, v, fresh_at_of(states, params), 0)
            }
            States::One(s) => {
                let states = std::slice::from_mut(s);
                let (index, v, dropped) =
                    strategy::apply_settling(states, strategy, params, now, op);
                (index, v, fresh_at_of(states, params), dropped)
            }
            States::Many(states) => {
                let (index, v, dropped) =
                    strategy::apply_settling(states, strategy, params, now, op);
                (index, v, fresh_at_of(states, params), dropped)
            }
            States::Shared(log) => match log.apply(params, now, op) {
                Some((index, v, dropped)) => (index, v, log.fresh_at(params), dropped),
                // Not exact on one log: per-quota logs from now on.
                None => {
                    let mut states = split(log, params);
                    let (index, v, dropped) =
                        strategy::apply_settling(&mut states, strategy, params, now, op);
                    let fresh_at = fresh_at_of(&states, params);
                    self.quotas = States::Many(states);
                    (index, v, fresh_at, dropped)
                }
            },
            States::Empty => (0, Verdict::allowed(0, 0, 0), 0, 0),
        };
        self.fresh_at = fresh_at;
        self.set_blocked(&v, now);
        if self.ghosts.is_some() {
            self.charge_ghosts(op, &v, now);
        }
        (index, v, dropped)
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
mod tests;
