#![no_main]
libfuzzer_sys::fuzz_target!(|d: &[u8]| vigil_fuzz::upstream_response(d));
