//! Core tests: the strategies against their worked examples and oracles, quotas, clocks and numbers,
//! the memory store, races, accuracy, and the fuzz corpora replayed.

#[path = "../support/oracle.rs"]
mod oracle;

mod accuracy;
mod concurrency;
mod fuzz_replay;
mod memory_store;
mod refund_and_rules;
mod strategy_examples;
mod strategy_props;
mod time_and_numbers;
