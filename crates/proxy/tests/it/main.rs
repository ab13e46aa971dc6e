//! vigil-proxy integration tests: real sockets on 127.0.0.1, in-process
//! backends and an in-process proxy built from nginx.conf text.

mod access;
mod access_log;
mod addresses;
mod behaviour;
mod bodies;
mod bytes;
mod client_abort;
mod error_pages;
mod evidence;
mod gzip;
mod h1;
mod hardening;
mod hedge;
mod limits;
mod local_time;
mod locations;
mod lows;
mod redirects;
mod regex;
mod reload;
mod returns;
mod routing;
mod rules;
mod static_files;
mod subset;
mod support;
mod telemetry;
mod timeouts;
mod tls;
mod tls_listen;
mod twin;
mod upstream;
