//! T-56: see `tollgate::fuzzing::key_encoding`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::key_encoding(data));
