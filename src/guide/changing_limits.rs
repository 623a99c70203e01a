//! Changing limits: what a key keeps when its rule changes, as the crate behaves today.
//!
//! A key's state belongs to the rule it is used with, in every store. A rule is identified by its
//! strategy, its quotas (limits, periods, bursts) and its [window offset](super::shaping): the memory
//! store keeps one state per key and rule, and the Redis store names its keys after the rule.
//!
//! - **A rule per request** ([`select_rule`](crate::RateLimitLayer::select_rule), or
//!   [`RateLimiter::apply`](crate::RateLimiter::apply) with a rule): a key moved to another rule (a
//!   user who upgrades to another tier) starts afresh under it, and its state under the old rule
//!   expires by itself after that rule's horizon. A key whose time-zone offset changes gets a fresh
//!   window under the new offset (up to one window more: take the offset from stored account
//!   settings, not from the request).
//!   A rule given per request reaches the store only after the store accepted it
//!   (`Store::validate`, asked once per rule and remembered): one it cannot honour (on Redis, a
//!   bucket whose interval is below a microsecond) is refused with `StoreErrorKind::InvalidRule`,
//!   counted in `Stats::invalid_rules`, and the layer answers 503 whatever its failure policy.
//! - **Route layers**: a route layer with its own rule counts only the requests it sees.
//! - **A limiter built in code with other quotas** is a new rule: on the memory store a new limiter
//!   also has a new store, and on Redis its keys have other names, so every key starts afresh, and
//!   the old keys expire by their TTLs. A rolling deploy that changes a limit in code therefore runs
//!   the old and the new limit side by side until the last old instance is gone.
//! - **A rules file reload** ([rules](super::rules)) keeps what can be kept: a limit whose name,
//!   strategy, quotas and key are unchanged keeps every key's state (a changed path, method list,
//!   cost or shadow flag keeps it too). Changed quotas convert each key's state when the key is next
//!   seen, for as long as the old rule's horizon: the units spent under the old rule (its binding
//!   quota's `limit - remaining`, so rounded toward the stricter state) are charged to the new rule,
//!   capped at its smallest limit (never a stuck counter), when the new list has a quota of the same
//!   period; a removed period's count is dropped, a new period starts empty. The same holds in memory
//!   and on Redis, the limit remembering the old rule. The conversion costs one extra peek per request
//!   during that horizon, and two concurrent first requests of one key may both convert it (stricter,
//!   never more lenient). A changed strategy or key starts that limit fresh, with a warning; a rename
//!   is a new limit. Instances polling one file may run the old and the new rules side by side for up
//!   to one polling interval.
//!
//! With the `serde` feature, configuration read back is equal to what was written, so a
//! configuration service can store rules: a `Quota` is its notation (`"10/minute"`), or
//! `{ quota = "10/minute", burst = 50 }` when a burst was set; a `Strategy` its name; a
//! `WindowOffset` `"+08:00"`; a `Rule` `{ strategy, quotas, window_offset }` (the offset only when
//! not UTC, refused on a strategy without clock-aligned windows); a rules file's `LimitSpec` its
//! `[[limit]]` table, read back through the file's own validation.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::{RateLimiter, Rule, Strategy};
//!
//! let limiter = RateLimiter::builder().quotas("2/minute").unwrap().build().unwrap();
//! let paid = Rule::parse(Strategy::SlidingWindow, "100/minute").unwrap();
//! limiter.check_now(&"alice", 2);
//! assert!(!limiter.check_now(&"alice", 1).is_allowed());
//! // Under another rule the same key starts afresh.
//! let d = limiter.apply_now(&"alice", Some(&paid), tollgate::Op::Check(1));
//! assert_eq!(d.remaining(), 99);
//! # let _ = Arc::new(paid);
//! ```
