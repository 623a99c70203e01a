//! See `tollgate::fuzzing::redis_reply` (compiled under cargo-fuzz's `cfg(fuzzing)`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::redis_reply(data));
