//! vigil-proxy integration tests: real sockets on 127.0.0.1, in-process
//! backends and an in-process proxy built from nginx.conf text.

mod behaviour;
mod bodies;
mod hardening;
mod hedge;
mod reload;
mod returns;
mod routing;
mod rules;
mod subset;
mod support;
mod telemetry;
mod timeouts;
mod tls;
mod tls_listen;
mod twin;
