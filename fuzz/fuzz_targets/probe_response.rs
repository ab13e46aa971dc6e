//! libFuzzer entry of [`vigil_fuzz::probe_response`].
#![no_main]
libfuzzer_sys::fuzz_target!(|d: &[u8]| vigil_fuzz::probe_response(d));
