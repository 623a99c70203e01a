//! Decisions: the script arguments, the call, and decoding the reply.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::Value;

use super::scripts::Family;
use super::send::{self, Shed};
use super::{
    MAX_SAFE, RedisFuture, RedisStore, SILENCE, TICK_NANOS, TTL_SLACK_MS, cache, lanes, nanos,
};
use crate::decision::{Decision, Outcome, to_decision};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::rule::{Rule, horizon_ticks};
use crate::stats::Stats;
use crate::store::{AllAnswer, Answer, Item, LimiterNames, Scope, Store, StoreKey, name_of};
use crate::strategy::{self, Op, Params, Strategy, Verdict};

/// The limit reported by a decision made without Redis: the first quota's.
pub(super) fn limit_of(rule: &Rule) -> u32 {
    rule.quotas().first().map_or(0, |q| q.limit())
}

pub(super) fn family(strategy: Strategy) -> Family {
    match strategy {
        Strategy::FixedWindow | Strategy::FixedWindowFirstHit => Family::Fixed,
        Strategy::MovingWindow => Family::Moving,
        Strategy::SlidingWindow => Family::Sliding,
        _ => Family::Gcra,
    }
}

/// `<base>h`, the hash of the key's state under its limiter's name whatever the rule (every
/// strategy uses it, so a strategy change finds the old state), then for the moving window
/// `<base>m<i>`, one list per quota (the scripts derive the names of an old rule's lists the same
/// way).
pub(super) fn redis_keys(base: &str, strategy: Strategy, quotas: usize) -> Vec<String> {
    let hash = format!("{base}h");
    if family(strategy) != Family::Moving {
        return vec![hash];
    }
    let mut names = Vec::with_capacity(1 + quotas);
    names.push(hash);
    names.extend((1..=quotas).map(|i| format!("{base}m{i}")));
    names
}

/// The strategy's code in the scripts (`convert.lua`), recorded with the state.
pub(super) fn strategy_code(strategy: Strategy) -> u64 {
    match strategy {
        Strategy::FixedWindow => 1,
        Strategy::FixedWindowFirstHit => 2,
        Strategy::SlidingWindow => 3,
        Strategy::TokenBucket => 4,
        Strategy::LeakyBucket => 5,
        Strategy::MovingWindow => 6,
    }
}

/// The script's arguments for `rule`, checked against the 2^53 bound.
pub(super) fn script_args(
    rule: &Rule,
    params: &[Params],
    op: Op,
    now_us: u64,
) -> Result<Vec<u64>, String> {
    let (code, cost, at_us) = match op {
        Op::Check(c) => (0, u64::from(c), 0),
        Op::Peek => (1, 0, 0),
        // The check's time came from the same clock (server time), in µs.
        Op::Settle { reserved, at, .. } => (2, u64::from(reserved), (at / 1000).max(1)),
        Op::Reset => (3, 0, 0),
        // The reservation's end from the same clock, in µs.
        Op::StepBack { cost, end } => (4, u64::from(cost), end / 1000),
    };
    let horizon = params
        .iter()
        .map(|p| horizon_ticks(rule.strategy(), p))
        .max()
        .unwrap_or(0);
    let ttl_ms = horizon.div_ceil(1000).saturating_add(TTL_SLACK_MS);
    let strategy = strategy_code(rule.strategy());
    let mut args = Vec::with_capacity(8 + 5 * params.len());
    args.extend([code, cost, now_us, ttl_ms, strategy, params.len() as u64]);
    for p in params {
        // Sums the scripts form (a start plus two windows, a TAT plus the depth) stay below 2^53.
        if p.window.saturating_mul(4) >= MAX_SAFE / 2 || p.tau().saturating_mul(4) >= MAX_SAFE / 2 {
            return Err(format!(
                "a quota of {} per {} µs exceeds what the Redis scripts compute exactly",
                p.limit, p.window
            ));
        }
        args.extend([p.limit, p.window, p.emission, p.burst, p.offset]);
    }
    if now_us >= MAX_SAFE / 2 {
        return Err(format!(
            "time {now_us} µs is beyond what Lua computes exactly"
        ));
    }
    args.push(at_us.min(MAX_SAFE / 2));
    if let Op::Settle { actual, .. } = op {
        args.push(u64::from(actual));
    }
    Ok(args)
}

pub(super) fn bad_reply(what: &str) -> StoreError {
    StoreError::new(StoreErrorKind::BadReply, format!("script reply: {what}"))
}

/// Decodes a script's reply: `now`, then five integers per quota; picks the reported quota as the
/// memory store does.
pub(super) fn decode(v: &Value, quotas: usize) -> Result<Decision, StoreError> {
    decode_noted(v, quotas).map(|(d, _)| d)
}

/// What a moving-window script's reply adds after the verdicts (two integers, when either is set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Notes {
    /// Units a settlement could not record: the log was full.
    pub(super) dropped: u64,
    /// The state was converted to the rule by an estimate.
    pub(super) estimated: bool,
}

/// [`decode`], with the reply's [`Notes`].
pub(super) fn decode_noted(v: &Value, quotas: usize) -> Result<(Decision, Notes), StoreError> {
    let Value::Array(items) = v else {
        return Err(bad_reply("not an array"));
    };
    let noted = items.len() == 3 + 5 * quotas;
    if items.len() != 1 + 5 * quotas && !noted {
        return Err(bad_reply(&format!(
            "{} values for {quotas} quotas",
            items.len()
        )));
    }
    let mut ints = items.iter().map(|i| match i {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad_reply("a negative value")),
        _ => Err(bad_reply("a value that is not an integer")),
    });
    let mut next = || ints.next().unwrap_or_else(|| Err(bad_reply("too short")));
    let now = next()?;
    let mut verdicts = Vec::with_capacity(quotas);
    for _ in 0..quotas {
        let outcome = match next()? {
            0 => Outcome::Allowed,
            1 => Outcome::Rejected,
            2 => Outcome::Exceeds,
            _ => return Err(bad_reply("an unknown outcome")),
        };
        verdicts.push(Verdict {
            outcome,
            limit: next()?,
            remaining: next()?,
            reset_after: next()?,
            retry_after: next()?,
        });
    }
    let notes = if noted {
        Notes {
            dropped: next()?,
            estimated: next()? == 1,
        }
    } else {
        Notes::default()
    };
    let (index, v) = strategy::reported(verdicts).ok_or_else(|| bad_reply("no quota"))?;
    Ok((to_decision(index, v, now, TICK_NANOS), notes))
}

/// [`decode`], for the fuzz targets (`crate::fuzzing`).
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_decode(v: &Value, quotas: usize) -> Result<Decision, StoreError> {
    decode(v, quotas)
}

/// The Redis keys of `key` under `prefix`, for the fuzz targets (`crate::fuzzing`).
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_key_names<K: StoreKey>(
    prefix: &str,
    key: &K,
    strategy: Strategy,
    tag: u64,
    quotas: usize,
) -> Vec<String> {
    redis_keys(&super::keys::base_key(prefix, key, tag), strategy, quotas)
}

impl<K: StoreKey> Store<K> for RedisStore {
    type Future = RedisFuture;

    fn apply(&self, key: &K, scope: Scope<'_>, op: Op, now: u64) -> Answer<RedisFuture> {
        self.lease_or_apply(key, scope, op, now)
    }

    /// One script call when the items' keys share a slot (see `multi.rs`), else the two-phase
    /// protocol.
    fn apply_all<'a>(&'a self, items: &'a [Item<'a, K, Self>], now: u64) -> AllAnswer<'a>
    where
        K: Sync,
    {
        self.apply_all_on_redis(items, now)
    }

    fn validate(&self, rule: &Rule) -> Result<(), ConfigError> {
        rule.params_in(TICK_NANOS)?;
        self.validate_leasing(rule)
    }

    fn tick(&self) -> Duration {
        Duration::from_nanos(TICK_NANOS)
    }

    fn names(&self) -> &LimiterNames {
        &self.inner.names
    }

    fn stats(&self) -> Stats {
        self.stats_now()
    }
}

impl RedisStore {
    /// Counts what a reply's [`Notes`] say, for a limit of `strategy` whose name's part of its
    /// scope tag is `name_part`.
    #[cold]
    pub(super) fn noted(&self, notes: Notes, strategy: Strategy, name_part: u64) {
        self.inner.settle_dropped.add(notes.dropped);
        if notes.estimated {
            self.warn_estimated(strategy, name_part);
        }
    }

    /// Logs, once per limit, that a script converted a key's state by an estimate.
    #[cold]
    pub(super) fn warn_estimated(&self, strategy: Strategy, name_part: u64) {
        (self.inner.estimates).warn(&self.inner.names, strategy, name_part);
    }

    /// Applies `op` to the state under a key's base name ([`keys::base_key`]: the key and the
    /// limiter's name); `tag` keeps the local fallback's state of other rules apart.
    pub(super) fn apply_base(
        &self,
        base: String,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
    ) -> RedisFuture {
        self.apply_in_epoch(base, rule, tag, op, now, None)
    }

    /// [`apply_base`](Self::apply_base); a settlement with an `epoch` (a quota lease's return) is
    /// ignored by Redis when the key was reset since that epoch (`hash_driver.lua`).
    pub(super) fn apply_in_epoch(
        &self,
        base: String,
        rule: &Rule,
        tag: u64,
        op: Op,
        now: u64,
        epoch: Option<u64>,
    ) -> RedisFuture {
        let params = match rule.params_in(TICK_NANOS) {
            Ok(p) => p,
            Err(e) => return self.fail(StoreError::new(StoreErrorKind::Other, e.to_string())),
        };
        let now_us = if self.inner.client_time {
            (now / TICK_NANOS).max(1)
        } else {
            0
        };
        let mut args = match script_args(rule, &params, op, now_us) {
            Ok(a) => a,
            Err(m) => return self.fail(StoreError::new(StoreErrorKind::Other, m)),
        };
        if let (Op::Settle { .. }, Some(e)) = (op, epoch) {
            args.push(e);
        }
        let redis_keys = redis_keys(&base, rule.strategy(), params.len());
        let fingerprint = Self::fingerprint(&redis_keys, &args, params.len());
        let cache_key = self.inner.cache.as_ref().map(|_| fingerprint);
        // Only costs every quota could ever admit are answered from the cache: a larger one is
        // `Exceeds`, which only Redis's answer tells apart from a rejection.
        let cacheable = matches!(op, Op::Check(c) if c > 0
            && params.iter().all(|p| u64::from(c) <= p.limit.min(p.burst.max(1))));
        if let Some(cache) = &self.inner.cache {
            if cacheable {
                if let Some(d) = cache.get(fingerprint, Instant::now()) {
                    self.inner.rejected.add(1);
                    return Box::pin(std::future::ready(Ok(d)));
                }
            }
            if matches!(op, Op::Settle { .. } | Op::Reset | Op::StepBack { .. }) {
                cache.remove(fingerprint);
            }
        }
        let fam = family(rule.strategy());
        let (sha, src) = match Family::ALL.iter().position(|f| *f == fam) {
            Some(i) => match self.inner.scripts.get(i) {
                Some((sha, src)) => (sha.clone(), Arc::clone(src)),
                None => return self.fail(bad_reply("no script")),
            },
            None => return self.fail(bad_reply("no script")),
        };
        let quotas = params.len();
        let local = self.local().map(|_| (base, rule.clone()));
        let limit = limit_of(rule);
        // What a warning about an estimated conversion names: the strategy and the limiter.
        let (strategy, name_part) = (rule.strategy(), name_of(rule, tag));
        // A late reply: counted if Redis admitted the check; admitted by Redis after the check was
        // answered "shed" (a 429): the quota is given back, at the check's own time (windows
        // since moved on are left alone).
        let refund: Option<send::Refund> = match op {
            Op::Check(c) => {
                let (rule, store) = (rule.clone(), self.clone());
                Some(Box::new(move |v: &Value, shed: bool| {
                    let d = decode(v, quotas).ok().filter(Decision::is_allowed)?;
                    store.inner.late_admitted.add(1);
                    let settle = Op::Settle {
                        reserved: c,
                        actual: 0,
                        at: d.time,
                        bound: 0,
                    };
                    script_args(&rule, &params, settle, 0).ok().filter(|_| shed)
                }))
            }
            _ => None,
        };
        let store = self.clone();
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let script = send::Script {
            keys: redis_keys,
            args,
            sha,
            src,
        };
        let sheddable = matches!(op, Op::Check(_));
        // Checks go through their key's lane (`lanes.rs`); settlements, resets and peeks do not
        // (they are never shed), nor checks while the breaker is open or there is no connection
        // (the failure policy answers them at once).
        let down = self.inner.breaker.is_open() || self.inner.conn.read().is_none();
        let place = (sheddable && !down).then(|| self.inner.lanes.enter(fingerprint));
        let lane_of_key = place.as_ref().and_then(lanes::Place::lane);
        let removals = self.inner.cache.as_ref().map_or(0, |c| c.removals());
        Box::pin(async move {
            let inner = &store.inner;
            let outage = |e: StoreError| match &local {
                Some((base, rule)) => store.outage(base, cache_key, (rule, tag), op, now, e),
                None => store.outage_error(e),
            };
            let lane = match place {
                None => None,
                Some(place) => {
                    let turn = match place.try_admit() {
                        Some(p) => p,
                        None => {
                            let waited_from = inner.clock();
                            let Some(p) = place.admit(deadline).await else {
                                // The key's calls ahead got no reply: overload if Redis answers
                                // others, else an outage for the failure policy.
                                let since = waited_from.saturating_sub(nanos(SILENCE));
                                if inner.replied_since(since) {
                                    return Ok(store.shed(Shed::OwnKey, limit, now));
                                }
                                // A failure for the breaker like the calls' own timeouts.
                                inner.breaker.failure(false);
                                return outage(StoreError::new(
                                    StoreErrorKind::Timeout,
                                    format!("no reply from Redis within {:?}", inner.timeout),
                                ));
                            };
                            // The checks ahead were answered: if Redis found the key blocked, so
                            // is this one, without a call.
                            let cached = inner.cache.as_ref().filter(|_| cacheable);
                            if let Some(d) = cached.and_then(|c| c.get(fingerprint, Instant::now()))
                            {
                                inner.rejected.add(1);
                                return Ok(d);
                            }
                            p
                        }
                    };
                    Some(place.into_slot(turn))
                }
            };
            let v = match store
                .send_script(script, deadline, sheddable, refund, lane)
                .await
            {
                Ok(v) => v,
                Err(send::NoReply::Overload(why)) => return Ok(store.shed(why, limit, now)),
                Err(send::NoReply::Outage(e)) => return outage(e),
                // Counted and warned about by `send_script`; the caller's error (the estimate
                // stands), neither an outage nor a local decision.
                Err(send::NoReply::Late(e)) => return Err(e),
            };
            let d = match decode_noted(&v, quotas) {
                Ok((d, notes)) => {
                    if notes != Notes::default() {
                        store.noted(notes, strategy, name_part);
                    }
                    d.answering(op)
                }
                Err(e) => return outage(e),
            };
            if let Op::Check(c) = op {
                if d.is_allowed() {
                    inner.allowed.add(1);
                } else {
                    inner.rejected.add(1);
                }
                if let Some(lane) = &lane_of_key {
                    if d.is_allowed() {
                        lane.admitted(d.remaining());
                    } else {
                        lane.narrow();
                    }
                }
                if let (Some(cache), Some(ck)) = (&inner.cache, cache_key) {
                    if c == 1 && d.outcome() == Outcome::Rejected {
                        cache.insert_unless_removed(ck, d, Instant::now(), removals);
                    }
                }
            }
            Ok(d)
        })
    }

    /// A logical key under its rule, for the blocked-key cache and the key's lane: its Redis keys
    /// and the rule's part of the arguments only (not the op's time or units), so a settlement or
    /// reset finds the entry its key's check cached.
    pub(super) fn fingerprint(redis_keys: &[String], args: &[u64], quotas: usize) -> u64 {
        let rule_args = args.get(4..6 + 4 * quotas).unwrap_or_default();
        cache::fingerprint(redis_keys, rule_args)
    }

    /// The blocked-key cache's key ([`fingerprint`](Self::fingerprint)); `None` without a cache.
    pub(super) fn cache_key(
        &self,
        redis_keys: &[String],
        args: &[u64],
        quotas: usize,
    ) -> Option<u64> {
        self.inner
            .cache
            .as_ref()
            .map(|_| Self::fingerprint(redis_keys, args, quotas))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::Rule;

    #[test]
    fn arguments_stay_below_two_to_the_53() {
        let rule = Rule::parse(Strategy::SlidingWindow, "4294967295/3660d").unwrap();
        let params = rule.params_in(TICK_NANOS).unwrap();
        let args = script_args(&rule, &params, Op::Check(1), 1_800_000_000_000_000).unwrap();
        assert!(args.iter().all(|&a| a < MAX_SAFE));
        assert!(script_args(&rule, &params, Op::Check(1), MAX_SAFE).is_err());
    }

    #[test]
    fn replies_of_the_wrong_shape_are_bad_replies() {
        let short = Value::Array(vec![Value::Int(5)]);
        assert_eq!(
            decode(&short, 1).unwrap_err().kind(),
            StoreErrorKind::BadReply
        );
        let negative = Value::Array(vec![
            Value::Int(5),
            Value::Int(0),
            Value::Int(1),
            Value::Int(-1),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert_eq!(
            decode(&negative, 1).unwrap_err().kind(),
            StoreErrorKind::BadReply
        );
        let ok = Value::Array(vec![
            Value::Int(5),
            Value::Int(1),
            Value::Int(3),
            Value::Int(0),
            Value::Int(7),
            Value::Int(7),
        ]);
        let d = decode(&ok, 1).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_micros(7)));
        assert_eq!(d.time(), Duration::from_micros(5));
        assert_eq!(
            decode(&Value::Nil, 1).unwrap_err().kind(),
            StoreErrorKind::BadReply
        );
    }
}
