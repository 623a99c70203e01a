//! The rules the store has seen, by scope tag and by limiter name: what an evicted key's records
//! are read with, and what a state written under another rule is converted from.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use parking_lot::{Mutex, RwLock};

use super::super::packed::PackedRule;
use super::quota_words;
use crate::rule::Rule;
use crate::store::{EstimateWarnings, LimiterNames, name_of};
use crate::strategy::{Params, Strategy};

/// The most rules [`Rules`] remembers; keys of further rules are recorded, when evicted, as having
/// spent their whole limit until their state would have been fresh (an over-count, never less).
pub(super) const MAX_RULES: usize = 4096;

/// The most rules remembered per limiter name (what a returning key's records are looked up under).
pub(super) const MAX_RULES_PER_NAME: usize = 16;

/// The strategy and quotas of the rules keys were used with, by scope tag
/// ([`Scope::tag`](crate::store::Scope::tag)): what an evicted key's states are read with, and what
/// a state recorded under one rule is converted from. And per limiter name, the rules it was used
/// with: a key's state is identified by (name, key), so a name seen with a second rule has its
/// keys converted on access. Written when a scope is first seen (not on the hot path).
#[derive(Debug, Default)]
pub(in crate::store::memory) struct Rules {
    pub(super) known: RwLock<HashMap<u64, Shape>>,
    /// Per name (the part of a scope tag that is not the rule's fingerprint): its scopes' tags.
    names: RwLock<HashMap<u64, Vec<u64>>>,
    /// Set once some name was seen with a second rule (until then no lookup by name is made).
    several: AtomicBool,
    /// The packed tables claimed: (slot, scope tag).
    tables: Mutex<Vec<(usize, u64)>>,
    /// Bit `t`: packed table `t` holds a name seen with several rules. It takes no new key: a key
    /// still in it is decided there under its own rule (the rule its state records), and taken out
    /// into a general entry (converted there, under the entry's lock) when its name's other rules
    /// or a miss reach it.
    retired: AtomicU8,
    /// The store's limiter names, to name a limit in a warning.
    limiter_names: LimiterNames,
    /// Names whose inexact conversion was logged.
    estimates: EstimateWarnings,
}

/// A rule's strategy and quotas, and how its quotas are held in one word each.
#[derive(Debug)]
pub(super) struct Shape {
    pub(super) strategy: Strategy,
    pub(super) params: Box<[Params]>,
    pub(super) words: Option<Box<[PackedRule]>>,
    /// The limiter name's part of the scope tag.
    pub(super) name: u64,
}

/// A rule the store saw under one name: its scope tag, strategy and quotas.
pub(in crate::store::memory) type SeenRule = (u64, Strategy, Box<[Params]>);

impl Rules {
    /// No rule seen yet, on a store whose limiters are `names`.
    pub(in crate::store::memory) fn new(names: LimiterNames) -> Self {
        Self {
            limiter_names: names,
            ..Self::default()
        }
    }

    /// Remembers `rule` in the scope of tag `tag`, and the name's rules.
    pub(in crate::store::memory) fn register(&self, rule: &Rule, tag: u64) {
        if self.known.read().contains_key(&tag) {
            return;
        }
        let name = name_of(rule, tag);
        // Held until the name's tables are retired: a decision that finds the rule known finds
        // its name's rules and retired tables too.
        let mut known = self.known.write();
        if known.len() >= MAX_RULES || known.contains_key(&tag) {
            return;
        }
        known.insert(
            tag,
            Shape {
                strategy: rule.strategy(),
                params: rule.nanos().into(),
                words: quota_words(rule).map(Into::into),
                name,
            },
        );
        let mut names = self.names.write();
        let tags = names.entry(name).or_default();
        if !tags.contains(&tag) {
            if tags.len() >= MAX_RULES_PER_NAME {
                tags.remove(0);
            }
            tags.push(tag);
        }
        if tags.len() > 1 {
            self.several.store(true, Ordering::Release);
            let tags = tags.clone();
            drop(names);
            self.retire(&tags);
        }
        drop(known);
    }

    /// Remembers that packed table `t` was claimed for `rule` in the scope of tag `tag`.
    pub(in crate::store::memory) fn register_table(&self, t: usize, rule: &Rule, tag: u64) {
        self.tables.lock().push((t, tag));
        self.register(rule, tag);
        let tags = self.names.read().get(&name_of(rule, tag)).cloned();
        if let Some(tags) = tags.filter(|t| t.len() > 1) {
            self.retire(&tags);
        }
    }

    /// Retires the packed tables of the scopes `tags`.
    pub(super) fn retire(&self, tags: &[u64]) {
        for &(t, tag) in self.tables.lock().iter() {
            if tags.contains(&tag) {
                self.retired.fetch_or(1 << t, Ordering::Release);
            }
        }
    }

    /// Whether packed table `t` is retired (its keys live in general entries).
    #[inline(always)]
    pub(in crate::store::memory) fn is_retired(&self, t: usize) -> bool {
        self.retired.load(Ordering::Acquire) & (1 << t) != 0
    }

    /// The rules seen under the name of `rule`'s scope `tag`, when there are several (`None`
    /// otherwise: a name of one rule has nothing to convert).
    pub(in crate::store::memory) fn rules_of_name(
        &self,
        rule: &Rule,
        tag: u64,
    ) -> Option<Vec<SeenRule>> {
        if !self.several.load(Ordering::Acquire) {
            return None;
        }
        let tags = self.names.read().get(&name_of(rule, tag)).cloned()?;
        if tags.len() < 2 {
            return None;
        }
        let known = self.known.read();
        Some(
            tags.iter()
                .filter_map(|t| known.get(t).map(|s| (*t, s.strategy, s.params.clone())))
                .collect(),
        )
    }

    /// Logs an inexact conversion, once per name.
    pub(super) fn warn_inexact(&self, rule: &Rule, tag: u64) {
        (self.estimates).warn(&self.limiter_names, rule.strategy(), name_of(rule, tag));
    }
}
