//! See `tollgate::fuzzing::ip_mask` (compiled under cargo-fuzz's `cfg(fuzzing)`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::ip_mask(data));
