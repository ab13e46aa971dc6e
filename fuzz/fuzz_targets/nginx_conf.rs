//! libFuzzer entry of [`vigil_fuzz::nginx_conf`].
#![no_main]
libfuzzer_sys::fuzz_target!(|d: &[u8]| vigil_fuzz::nginx_conf(d));
