//! T-56: see `tollgate::fuzzing::redis_reply`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate::fuzzing::redis_reply(data));
