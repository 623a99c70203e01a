//! A key's state across its limiter name's rules: what another rule of the name holds of a key,
//! found and converted before a call under this one (see the guide's chapter on changing limits).

use std::hash::Hash;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::MemoryStore;
use super::general::{self, Entry};
use super::sketch;
use super::table::Table;
use crate::rule::Rule;
use crate::strategy::QuotaState;

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K> {
    /// What the key `key` (hash `hash`, segment `i`) holds or left under the other rules of the
    /// limiter name of `rule`'s scope `tag`, when that name was seen with several rules: its
    /// states in retired packed tables (taken out of them when `take`), and the records eviction
    /// left under each of the name's rules. `None` for a name of one rule.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn adopt(
        &self,
        i: usize,
        key: &K,
        hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
        take: bool,
    ) -> Option<Vec<crate::strategy::Held>> {
        let rules = &self.general.ctx;
        rules.register(rule, tag);
        let seen = rules.rules_of_name(rule, tag)?;
        let mut held = Vec::new();
        for (t, slot) in self.packed.iter().enumerate() {
            let Some(table) = slot.get() else { continue };
            let tag = table.ctx.tag();
            if !rules.is_retired(t) || !seen.iter().any(|s| s.0 == tag) {
                continue;
            }
            if let Some(word) = self.packed_word(table, i, key, take) {
                held.push(table.ctx.held(word, now));
                if take {
                    // A rejection cached for the key in that table is no longer its state's.
                    self.blocked.invalidate();
                }
            }
        }
        for s in &seen {
            held.extend(general::recall_held(&self.sketch, hash, s, now));
        }
        Some(held)
    }

    /// Before a call under `rule` (scope `tag`) on a held key whose first slot is another
    /// scope's: the scope's state is found, or converted from the name's state under another
    /// rule, or adopted from a retired packed table or the sketch, or recalled as before.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reconcile(
        &self,
        entry: &mut Entry,
        i: usize,
        key: &K,
        hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
    ) {
        let rules = &self.general.ctx;
        rules.register(rule, tag);
        if entry.convert_to(rules, rule, tag, now) {
            return;
        }
        match self.adopt(i, key, hash, rule, tag, now, true) {
            Some(old) if !old.is_empty() => entry.add_converted(rules, rule, tag, &old, now),
            _ => entry.recall_other(rules, &self.sketch, hash, rule, tag, now),
        }
    }

    /// Before a reset: drops what the sketch recalls of the key under the scope (and, for a name
    /// of several rules, under each of its rules), and its state in a retired packed table.
    #[cold]
    pub(super) fn forget_everywhere(
        &self,
        i: usize,
        key: &K,
        hash: u64,
        rule: &Rule,
        tag: u64,
        now: u64,
    ) {
        // A name of several rules: its state in a retired packed table goes too.
        let _ = self.adopt(i, key, hash, rule, tag, now, true);
        general::clear_records(&self.sketch, hash, rule, tag, now);
        // A name of several rules: its records under each of them too.
        for (t, _, params) in self
            .general
            .ctx
            .rules_of_name(rule, tag)
            .unwrap_or_default()
        {
            for q in 0..params.len() {
                self.sketch.clear(sketch::quota_hash(hash, t, q), now);
            }
        }
    }

    /// The state of `key` in the packed table of `rule`, if it has one and holds the key; removed
    /// from there when `take`.
    #[cold]
    pub(super) fn packed_state(
        &self,
        i: usize,
        key: &K,
        rule: &Rule,
        tag: u64,
        now: u64,
        take: bool,
    ) -> Option<QuotaState> {
        let table = self
            .packed
            .iter()
            .filter_map(OnceLock::get)
            .find(|t| t.ctx.matches(rule, tag))?;
        let word = self.packed_word(table, i, key, take)?;
        if take {
            self.handed.store(true, Ordering::Relaxed);
        }
        Some(table.ctx.state_of(word, now))
    }

    /// The word of `key` in segment `i` of a packed table, if it holds the key; removed from
    /// there (and from the key count) when `take`.
    fn packed_word(
        &self,
        table: &Table<K, AtomicU64>,
        i: usize,
        key: &K,
        take: bool,
    ) -> Option<u64> {
        let segment = table.held(i)?;
        if !take {
            return segment.get(key).map(|c| c.load(Ordering::Relaxed));
        }
        let (_, cell) = segment.remove(key)?;
        self.keys.remove(1);
        Some(cell.into_inner())
    }

    /// Whether a general entry holds `key`'s state in the scope of tag `tag`.
    #[cold]
    pub(super) fn general_holds(&self, i: usize, key: &K, tag: u64) -> bool {
        self.general
            .held(i)
            .and_then(|m| m.get(key))
            .is_some_and(|entry| entry.holds(tag))
    }
}
