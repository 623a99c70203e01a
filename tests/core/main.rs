//! Core tests: the strategies against their worked examples and oracles, quotas, clocks and numbers,
//! the memory store, races, accuracy. (The fuzz corpora are replayed by the lib's unit tests.)

#[path = "../support/oracle.rs"]
mod oracle;

mod accuracy;
mod concurrency;
mod memory_store;
mod refund_and_rules;
mod strategy_examples;
mod strategy_props;
mod time_and_numbers;
