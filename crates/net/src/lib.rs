//! vigil's network code shared by the proxy, the checker and the admin
//! API: one accept loop ([`accept`]), one TLS client configuration builder
//! with one no-verify verifier ([`tls::client`]), and TLS listeners'
//! server configurations and handshake ([`tls::server`]).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod accept;
pub mod tls;

pub use accept::{accept_loop, AcceptBackoff};
pub use tls::TlsError;
