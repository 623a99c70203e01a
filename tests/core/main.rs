//! Core tests: the strategies against their worked examples and oracles, quotas, clocks and numbers,
//! the memory store, races, accuracy, the fuzz corpora replayed, and the `simulate` example replaying
//! the worked examples from trace files.

#[path = "../support/oracle.rs"]
mod oracle;

mod accuracy;
mod concurrency;
mod fuzz_replay;
mod key_cap;
mod memory_store;
mod refund_and_rules;
mod simulate;
mod strategy_examples;
mod strategy_props;
mod time_and_numbers;
