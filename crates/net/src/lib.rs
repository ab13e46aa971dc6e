//! vigil's network code shared by the proxy, the checker and the admin
//! API: one accept loop ([`accept`]), one TLS client configuration builder
//! with one no-verify verifier ([`tls::client`]), TLS listeners' server
//! configurations and handshake ([`tls::server`]), and the real clock on
//! the runtime's time with the workers' cached reading of it ([`clock`]).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod accept;
pub mod clock;
pub mod tls;

pub use accept::{accept_loop, AcceptBackoff};
pub use clock::SystemClock;
pub use tls::TlsError;
