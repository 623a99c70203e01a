//! T-56: see `tollgate::fuzzing::strategy`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::strategy(data));
