//! T-56: see `tollgate::fuzzing::ip_mask`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::ip_mask(data));
