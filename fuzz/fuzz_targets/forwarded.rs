//! T-56: see `tollgate::fuzzing::forwarded`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::forwarded(data));
