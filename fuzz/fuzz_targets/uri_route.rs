//! The `uri_route` fuzz target: see `vigil_fuzz::uri_route`.
#![no_main]
libfuzzer_sys::fuzz_target!(|d: &[u8]| vigil_fuzz::uri_route(d));
