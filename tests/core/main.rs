//! Core tests: the strategies against their worked examples and oracles, quotas, clocks and numbers,
//! the memory store, races, accuracy, and the `simulate` example replaying the worked examples from
//! trace files. (The fuzz corpora are replayed by the lib's unit tests.)

#[path = "../support/logs.rs"]
mod logs;
#[path = "../support/oracle.rs"]
mod oracle;

mod accuracy;
mod concurrency;
mod first_hit_grain;
mod key_cap;
mod memory_store;
mod refund_and_rules;
#[cfg(feature = "rules")]
mod serde_round_trips;
mod simulate;
mod state_identity;
mod strategy_examples;
mod strategy_props;
mod time_and_numbers;
mod window_offset;
