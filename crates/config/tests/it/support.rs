//! Helpers shared by the integration tests.

use std::path::Path;

use vigil_config::{literal_resolver, nginx, toml, ConfigError};
use vigil_core::config::Config;

/// nginx.conf text loaded as `t.conf`.
pub(crate) fn nginx_load(src: &str) -> Result<Config, ConfigError> {
    nginx::load_str(src, Path::new("t.conf"), Path::new("."), &literal_resolver).map(|l| l.config)
}

/// TOML text loaded as `vigil.toml`.
pub(crate) fn toml_load(src: &str) -> Result<Config, ConfigError> {
    toml::load_str(src, Path::new("vigil.toml"), &literal_resolver)
}

/// The error nginx.conf text must give.
pub(crate) fn nginx_err(src: &str) -> String {
    match nginx_load(src) {
        Ok(_) => panic!("loads but should not:\n{src}"),
        Err(e) => e.to_string(),
    }
}

/// The error TOML text must give.
pub(crate) fn toml_err(src: &str) -> String {
    match toml_load(src) {
        Ok(_) => panic!("loads but should not:\n{src}"),
        Err(e) => e.to_string(),
    }
}
