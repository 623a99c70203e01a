//! See `tollgate::fuzzing::key_encoding` (compiled under cargo-fuzz's `cfg(fuzzing)`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::key_encoding(data));
