//! The library half of the `vigil` binary: the admin API ([`admin`]), kept
//! here so that the fuzz crate can drive its request decoding and router
//! without a socket. Everything else (commands, the running stack) is in
//! the binary (`main.rs`), which uses this module as `crate::admin`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admin;
