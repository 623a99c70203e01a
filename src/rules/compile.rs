//! Compiling a rules file into limits ready to decide: limiters kept by name across reloads, tiers,
//! the check that no request can match two enforced limits.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::file::{FailMode, KeyPart, LimitSpec, MissingKey, RulesError, RulesFile, SettleSpec};
use super::keys::key_tag;
use super::reload::ReloadReport;
use super::store_kind::{self, LocalFallback};
use super::{Compiled, Limit, Shared, TierMatch};
use crate::layer::SettleFrom;
use crate::layer::response::HeaderConfig;
use crate::metrics::LimitMetrics;
use crate::store::Store;
use crate::{Clock, RateLimiter, Rule, SystemClock};

impl<St: Store<Vec<u8>>, C: Clock + Clone> Shared<St, C> {
    /// Parses `text` for this store: a limit's `fail_mode = "local"` on a store without a local
    /// fallback is an error at its line and column.
    pub(super) fn parse(&self, text: &str) -> Result<RulesFile, RulesError> {
        RulesFile::parse_on(text, self.local_fallback != LocalFallback::Missing)
    }

    /// Builds the limits of `file`, keeping the limiter (and so the state) of every limit whose
    /// name, rule and key are unchanged.
    pub(super) fn compile(
        &self,
        file: RulesFile,
        report: &mut ReloadReport,
    ) -> Result<Compiled<St, C>, RulesError> {
        let old = self.current.load_full();
        self.warn_local_on_memory(&file);
        // A limit with tiers is found by its default tier, which holds its spec as written.
        let by_name: HashMap<&str, &Limit<St, C>> = old
            .limits
            .iter()
            .filter(|l| TierMatch::is_default(l.tier.as_ref()))
            .map(|l| (l.spec.name.as_str(), l))
            .collect();
        let tiers_of =
            |spec: &LimitSpec| -> Result<Vec<(LimitSpec, Option<TierMatch>)>, RulesError> {
                self.check_named_keys(spec)?;
                Ok(tier_versions(spec))
            };
        let mut limits = Vec::with_capacity(file.limits.len());
        let mut seen = BTreeMap::new();
        let initial = old.limits.is_empty();
        for spec in file.limits {
            let kept = by_name.get(spec.name.as_str()).copied();
            let (limiter, rule) = match kept {
                Some(l) => {
                    if l.spec.key != spec.key {
                        report.fresh.push(spec.name.clone());
                    } else if l.spec.rule != spec.rule {
                        report.converted.push(spec.name.clone());
                    } else if l.spec != spec {
                        report.changed.push(spec.name.clone());
                    }
                    // The same limiter (its name stays taken on the store): the store converts a
                    // key's state to a changed rule when the key is next seen.
                    let rule = own_rule(&l.limiter, &spec)?;
                    (Arc::clone(&l.limiter), rule)
                }
                None => {
                    if !initial {
                        report.added.push(spec.name.clone());
                    }
                    // A name removed by an earlier reload whose limiter requests in flight on
                    // older rules still hold: the same limiter, not a second one of its name.
                    let alive = self
                        .limiters
                        .lock()
                        .get(&spec.name)
                        .and_then(|w| w.upgrade());
                    match alive {
                        Some(limiter) => {
                            let rule = own_rule(&limiter, &spec)?;
                            (limiter, rule)
                        }
                        None => (Arc::new(self.build_limiter(&spec)?), None),
                    }
                }
            };
            // A kept cap keeps its counts (the slots in flight stay counted).
            let cap = match (spec.concurrency, kept.and_then(|l| l.cap.as_ref())) {
                (Some(n), Some(held)) => Some(held.with_cap(n)),
                _ => store_kind::new_cap(&spec, limiter.store())
                    .map_err(|e| RulesError::whole(e.to_string()))?,
            };
            seen.insert(spec.name.clone(), ());
            let mut headers = HeaderConfig::for_rule(&spec.rule);
            headers.style = self.options.header_style;
            headers.reset = self.options.reset;
            headers.policy_name = Arc::from(spec.name.as_str());
            let mut versions = tiers_of(&spec)?.into_iter();
            let default_tier = versions.next().and_then(|(_, t)| t);
            limits.push(Limit {
                tier: default_tier,
                key_tag: key_tag(&spec.key),
                rule,
                missing_global: spec.on_missing_key.unwrap_or(self.options.on_missing_key)
                    == MissingKey::Global,
                metrics: LimitMetrics::new(&spec.name, owner_of(&limiter)),
                settle_from: match &spec.settle {
                    Some(SettleSpec::Header(name)) => Some(SettleFrom::header(name.clone())),
                    _ => None,
                },
                settle_warned: Arc::default(),
                cap,
                headers,
                limiter,
                spec,
            });
            if let Some(default) = limits.last() {
                let more = self.tier_limits(default, versions)?;
                limits.extend(more);
            }
        }
        report.removed = old
            .limits
            .iter()
            .filter(|l| !seen.contains_key(&l.spec.name))
            .map(|l| l.spec.name.clone())
            .collect();
        // Every limit compiled: only now may a kept limiter's store take its new fail mode (a
        // reload that fails keeps the old rules whole, their modes included).
        for l in &limits {
            store_kind::apply_fail_mode(l.limiter.store(), l.spec.fail_mode);
        }
        let mut registry = self.limiters.lock();
        registry.retain(|_, w| w.strong_count() > 0);
        for l in &limits {
            registry.insert(l.spec.name.clone(), Arc::downgrade(&l.limiter));
        }
        let lone = lone_enforced(limits.iter().map(|l| &l.spec));
        Ok(Compiled {
            limits: limits.into(),
            lone,
            exempt: file.exempt.into(),
        })
    }

    /// Warns (once for these rules) that `fail_mode = "local"` has no effect on the memory
    /// store, which never fails.
    fn warn_local_on_memory(&self, file: &RulesFile) {
        if self.local_fallback != LocalFallback::NeverFails {
            return;
        }
        let local: Vec<&str> = file
            .limits
            .iter()
            .filter(|l| l.fail_mode == Some(FailMode::Local))
            .map(|l| l.name.as_str())
            .collect();
        if !local.is_empty() && !self.local_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limits = ?local,
                "fail_mode = \"local\" has no effect on the memory store (it never fails)"
            );
        }
    }

    /// Refuses a limit naming a key no extractor is registered for.
    pub(super) fn check_named_keys(&self, spec: &LimitSpec) -> Result<(), RulesError> {
        let named = spec
            .key
            .parts()
            .iter()
            .chain(spec.tier.as_ref())
            .filter_map(|p| match p {
                KeyPart::Named(n) => Some(n),
                _ => None,
            });
        for name in named {
            if !self.options.keys.contains(name) {
                return Err(RulesError::whole(format!(
                    "limit {:?}: {name:?} is not ip, global or header:NAME, and no key extractor \
                     of that name is registered (RulesOptions::key; registered: {:?})",
                    spec.name,
                    self.options.keys.names()
                )));
            }
        }
        Ok(())
    }

    /// The limits of the listed tiers of `default`'s limit (`versions`: each tier's spec and
    /// match): on its limiter, so a key moving between tiers keeps one state, converted.
    pub(super) fn tier_limits(
        &self,
        default: &Limit<St, C>,
        versions: impl Iterator<Item = (LimitSpec, Option<TierMatch>)>,
    ) -> Result<Vec<Limit<St, C>>, RulesError> {
        let mut out = Vec::new();
        for (spec, tier) in versions {
            let rule = own_rule(&default.limiter, &spec)?;
            let mut headers = HeaderConfig::for_rule(&spec.rule);
            headers.style = self.options.header_style;
            headers.reset = self.options.reset;
            headers.policy_name = Arc::from(spec.name.as_str());
            out.push(Limit {
                tier,
                key_tag: default.key_tag,
                rule,
                missing_global: default.missing_global,
                metrics: LimitMetrics::new(&spec.name, owner_of(&default.limiter)),
                settle_from: default.settle_from.clone(),
                settle_warned: Arc::default(),
                cap: default.cap.clone(),
                headers,
                limiter: Arc::clone(&default.limiter),
                spec,
            });
        }
        Ok(out)
    }

    /// A new limiter for `spec`, on the store `make_store` gives and the rules' clock.
    pub(super) fn build_limiter(
        &self,
        spec: &LimitSpec,
    ) -> Result<RateLimiter<Vec<u8>, St, C>, RulesError> {
        let mut builder = RateLimiter::<Vec<u8>>::builder()
            .name(spec.name.clone())
            .strategy(spec.rule.strategy())
            .window_offset(spec.rule.window_offset());
        for q in spec.rule.quotas() {
            builder = builder.quota(*q);
        }
        let mut clock = self.clock.clone();
        if self.suited_clocks {
            if let Some(c) = (&mut clock as &mut dyn std::any::Any).downcast_mut::<SystemClock>() {
                // A shaping queue spaces departures by the time it reads: a millisecond's lag
                // between two reads would bring them closer than its interval, so it reads the
                // precise time.
                *c = if spec.queue.is_some() {
                    SystemClock::precise()
                } else {
                    SystemClock::suited_to(&spec.rule)
                };
            }
        }
        builder
            .clock(clock)
            .store(store_kind::limit_store((self.make_store)()))
            .build()
            .map_err(|e| RulesError::whole(format!("limit {:?}: {e}", spec.name)).caused_by(e))
    }
}

/// The rule a limit decides on when it is not its limiter's own (a reload changed it), checked
/// by the limiter's store.
pub(super) fn own_rule<St: Store<Vec<u8>>, C: Clock>(
    limiter: &RateLimiter<Vec<u8>, St, C>,
    spec: &LimitSpec,
) -> Result<Option<Rule>, RulesError> {
    if spec.rule == *limiter.rule() {
        return Ok(None);
    }
    limiter
        .store()
        .validate(&spec.rule)
        .map_err(|e| RulesError::whole(format!("limit {:?}: {e}", spec.name)).caused_by(e))?;
    Ok(Some(spec.rule.clone()))
}

/// The versions of `spec` a request can be decided by: `spec` itself (the default tier), then
/// one per listed tier with that tier's rule; each with the requests it takes (`None`: the limit
/// has no tiers, and `spec` takes every request).
pub(super) fn tier_versions(spec: &LimitSpec) -> Vec<(LimitSpec, Option<TierMatch>)> {
    let Some(from) = &spec.tier else {
        return vec![(spec.clone(), None)];
    };
    let listed: Arc<[Box<[u8]>]> = spec
        .tiers
        .iter()
        .map(|(name, _)| name.as_bytes().into())
        .collect();
    let matching = |want: Option<&str>| TierMatch {
        from: from.clone(),
        want: want.map(|w| w.as_bytes().into()),
        listed: Arc::clone(&listed),
    };
    let mut out = vec![(spec.clone(), Some(matching(None)))];
    for (name, rule) in &spec.tiers {
        let mut tier = spec.clone();
        tier.rule = rule.clone();
        out.push((tier, Some(matching(Some(name)))));
    }
    out
}

/// Most enforced limits checked pairwise for [`Compiled::lone`]; a larger file takes the
/// multi-limit path for every request.
pub(super) const LONE_CHECK_MAX: usize = 64;

/// Whether no request can match two of `specs`' enforced limits (neither shadow nor queue).
pub(super) fn lone_enforced<'a>(specs: impl Iterator<Item = &'a LimitSpec>) -> bool {
    let enforced: Vec<&LimitSpec> = specs
        .filter(|s| !s.shadow && s.queue.is_none())
        .take(LONE_CHECK_MAX + 1)
        .collect();
    enforced.len() <= LONE_CHECK_MAX
        && enforced
            .iter()
            .enumerate()
            // The tiers of one limit (one name) never meet one request together.
            .all(|(i, a)| {
                enforced
                    .iter()
                    .skip(i + 1)
                    .all(|b| a.name == b.name || !a.overlaps(b))
            })
}

/// The identity of a limit's limiter as an owner of its `limit` label (its store's address): a
/// limit's tiers and its versions across reloads share it.
fn owner_of<St: Store<Vec<u8>>, C: Clock>(limiter: &super::SharedLimiter<St, C>) -> usize {
    std::ptr::from_ref(limiter.store()) as usize
}
