//! libFuzzer entry of [`vigil_fuzz::admin_query`].
#![no_main]
libfuzzer_sys::fuzz_target!(|d: &[u8]| vigil_fuzz::admin_query(d));
