//! vigil-config: what a configuration file says, read into vigil-core's
//! model ([`vigil_core::config`]), and what it means to an operator.
//!
//! - [`nginx`]: the nginx.conf front end (the grammar, `include`, every
//!   directive vigil takes, nginx's refusals in nginx's words);
//! - [`toml`](mod@self::toml): the `vigil.toml` front end and its emitter;
//! - [`read`]: how a configuration file is read from disk;
//! - [`pattern`]: nginx's regular expressions (PCRE2), compiled as nginx
//!   compiles them: the front ends refuse a bad one at load, the proxy
//!   matches with them;
//! - [`preset`]: `health_preset`, expanded into the model's rules;
//! - [`lint`]: the traps of a configuration, explained;
//! - [`convert`]: nginx.conf → `vigil.toml`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod addr;
pub mod convert;
mod error;
pub mod lint;
pub mod nginx;
pub mod pattern;
pub mod preset;
pub mod read;
mod resolve;
pub mod toml;
mod traffic;
mod validate;

pub use error::ConfigError;
pub use resolve::{literal_resolver, system_resolver, Resolver};
