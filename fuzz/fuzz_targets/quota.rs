//! T-56: see `tollgate::fuzzing::quota`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::quota(data));
