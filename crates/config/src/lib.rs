//! vigil-config: what a configuration file says, read into vigil-core's
//! model ([`vigil_core::config`]), and what it means to an operator.
//!
//! - [`lint`]: the traps of a configuration, explained;
//! - [`convert`]: nginx.conf → `vigil.toml`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod convert;
pub mod lint;
