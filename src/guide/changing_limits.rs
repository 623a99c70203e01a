//! Changing limits: what a key keeps when its rule changes.
//!
//! **A key's state is identified by the limiter's name and the key**, in every store. The rule
//! (strategy, quotas, bursts, [window offset](super::shaping)) is not part of that identity: the
//! state records the rule it was written under (in memory by the table or entry that holds it, on
//! Redis in the stored value). A decision under the recorded rule costs nothing extra; a decision
//! under another rule converts the state on access, atomically (under the key's lock in memory,
//! inside the script on Redis), decides under the new rule and records it. So:
//!
//! - **A quota changed in code** (a limiter rebuilt under its name on a shared store, or instances
//!   restarted with new code on one Redis), **a rules-file reload** ([rules](super::rules)), **a
//!   tier change per request** ([`select_rule`](crate::RateLimitLayer::select_rule), or
//!   [`RateLimiter::apply`](crate::RateLimiter::apply) with a rule: a user moving from `pro` to
//!   `free`), **a window-offset change** and **a strategy change** all convert the key's state:
//!   never a fresh start, never two counts of one key.
//! - **A rolling deploy on Redis** (old and new instances with different quotas under one name)
//!   counts each key once: every decision converts the one state to the rule of the instance that
//!   decides.
//! - **Limits meant to count apart need different names**: one limiter per route (two limiters of
//!   one name on one store are refused, `ConfigError::DuplicateName`). A route layer with its own
//!   limiter counts only the requests it sees.
//!
//! # The conversion: strict
//!
//! Each new quota starts at no less than what the old state proves was spent in its window or
//! bucket: a change may reject for up to one period, but never hands back spent quota. Per old
//! quota, its proven spend now: a fixed window's count in its current window; a sliding window's
//! `limit - remaining` (rounded up); a first-hit window's count and start; a moving window's log; a
//! bucket's deficit, `TAT - now`. Per new quota of period `W'`:
//!
//! - **fixed, sliding and first-hit windows**: the largest spend among old quotas whose period lies
//!   inside `W'`, or, if none does, the spend of the shortest old quota containing it, placed in the
//!   current window (a first-hit window starts at the oldest old start still inside `W'`). The count
//!   is not capped at a lower new limit: `100/hour -> 50/hour -> 100/hour` admits 100 in the hour,
//!   not 150.
//! - **moving window**: exact from an old moving-window log that covers `W'` (its entries of the last
//!   `W'`); otherwise topped up to the window figure above with entries stamped now (an estimate,
//!   logged at warn level once per limit and store, naming the limit, on both stores).
//! - **token and leaky bucket**: the deficit carries exactly at the new emission interval (a unit's
//!   fraction too, so two versions alternating round nothing up), capped at the new bucket's depth
//!   (a key is never shut for longer than the new bucket holds); when the cap cuts an old bucket's
//!   deficit, the old bucket stays as a ghost (below), so converting back finds what was cut and
//!   two versions alternating (say 100 and 50 an hour) hand nothing back. A leaky bucket's queue
//!   keeps the departures it already handed out.
//! - **a strategy change** goes through the same spends.
//!
//! **Removed periods become ghosts**, and so do old buckets the new depth cut: an old quota whose
//! period is not in the new rule (or whose deficit was cut) stays with
//! the state until its window ends, charged every admitted unit (not checked: the new rule decides),
//! and a later conversion back to a rule with that period reads it. So two rule versions alternating
//! (a rollout, a reload racing an instance on the old file) count one key once. At most 8 ghosts
//! per state (the least spent goes first).
//!
//! # The bounds
//!
//! For a trailing window of the new rule's period `W'` that covers a change:
//!
//! - same period, limit `L -> L'`: at most `max(L, L')` admitted (plus the strategy's own bound:
//!   `2L'` across a clock-aligned fixed-window edge or for the sliding counter's worst case, burst
//!   plus rate for the buckets). `100/hour -> 110/hour -> 120/hour` with the key idle between: 120
//!   in the hour (the window strategies; a bucket also refills meanwhile).
//! - a period raised or added beside an unchanged one: the unchanged period holds.
//!   `5/second; 20/minute -> 10/second; 20/minute`: at most 20 in the minute;
//!   `10/minute; 100/hour -> 20/minute; 100/hour`: at most 100 in the hour (a bucket: burst plus
//!   rate, 200).
//! - a bucket: `100/hour -> 50/hour -> 100/hour` admits 100 plus what it refills meanwhile (its own
//!   bound: burst plus rate; the cut deficit comes back from the ghost); lowered a lot, a bucket is
//!   shut for at most its new depth (`1000/hour` spent, then `10/hour`: one hour, the old bucket
//!   counted in a ghost until its own deficit has drained).
//! - in general, per quota `(L', W')` of the current rule: at most the largest own bound of the
//!   rules active in that window (for its quota of period `W'`, or the shortest one above) plus
//!   `L'`, and exactly `max L` when every rule in it is a moving window with a quota of period `W'`.
//!   The oracle `tests/core/state_identity.rs` checks this formula on random traffic with random
//!   quota and strategy changes, and from the other side: once a key has been idle for two of the
//!   longest periods since its last admission and the last change, it is admitted again.
//!
//! Stores: the memory store keeps a name's keys in compact packed tables until the name is seen
//! with a second rule; from then on its keys live in general entries, converted there on access.
//! A key evicted at the memory store's cap keeps a record of its spend under the rule it was
//! evicted with, and comes back under another rule of its name at least as spent as the conversion
//! of that record says (ghosts are not recorded).
//!
//! A rule given per request reaches the store only after the store accepted it
//! (`Store::validate`, asked once per rule and remembered): one it cannot honour (on Redis, a bucket
//! whose interval is below a microsecond) is refused with `StoreErrorKind::InvalidRule`, counted in
//! `Stats::invalid_rules`, and the layer answers 503 whatever its failure policy.
//!
//! With the `serde` feature, configuration read back is equal to what was written, so a
//! configuration service can store rules: a `Quota` is its notation (`"10/minute"`), or
//! `{ quota = "10/minute", burst = 50 }` when a burst was set; a `Strategy` its name; a
//! `WindowOffset` `"+08:00"`; a `Rule` `{ strategy, quotas, window_offset }` (the offset only when
//! not UTC, refused on a strategy without clock-aligned windows). A rules file is its own text:
//! store the TOML.
//!
//! ```
//! use tollgate::{Op, RateLimiter, Rule, Strategy};
//!
//! let limiter = RateLimiter::builder().quotas("2/minute").unwrap().build().unwrap();
//! let pro = Rule::parse(Strategy::SlidingWindow, "100/minute").unwrap();
//! limiter.check_now(&"alice", 2);
//! assert!(!limiter.check_now(&"alice", 1).is_allowed());
//! // Under another rule the key's state is converted: the 2 spent count against 100.
//! let d = limiter.apply_now(&"alice", Some(&pro), Op::Check(1));
//! assert_eq!(d.remaining(), 97);
//! // And back: 3 spent against 2, still rejected (never a free reset).
//! assert!(!limiter.check_now(&"alice", 1).is_allowed());
//! // Another key is untouched.
//! assert_eq!(limiter.check_now(&"bob", 1).remaining(), 1);
//! ```
//!
//! A removed period is kept as a ghost and read back:
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{ManualClock, Op, RateLimiter, Rule, Strategy};
//!
//! let clock = ManualClock::new(Duration::from_secs(1_700_002_800));
//! let limiter = RateLimiter::builder()
//!     .strategy(Strategy::FixedWindow)
//!     .quotas("10/minute; 15/hour").unwrap()
//!     .clock(clock.clone())
//!     .build()
//!     .unwrap();
//! let minute_only = Rule::parse(Strategy::FixedWindow, "10/minute").unwrap();
//! assert!(limiter.check_now(&"k", 10).is_allowed());
//! clock.advance(Duration::from_secs(60));
//! // The hour removed: 10 more in the next minute, the hour's ghost charged.
//! assert!(limiter.apply_now(&"k", Some(&minute_only), Op::Check(10)).is_allowed());
//! clock.advance(Duration::from_secs(60));
//! // The hour back: 20 of its 15 spent.
//! assert!(!limiter.check_now(&"k", 1).is_allowed());
//! ```
