//! `vigil` binary tests: the real executable, on 127.0.0.1.

mod admin;
mod conformance;
mod dashboard;
mod demo;
#[cfg(feature = "fleet")]
mod fleet;
mod health;
mod nginx_cli;
mod process;
mod resolve;
mod serve;
