//! Field paths (`upstream.api.server[1].fail_timeout`) and the value
//! checks that report at one.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::addr::{self, Use};
use crate::{ConfigError, Resolver};
use vigil_core::config::value::{parse_size, parse_time};

/// Where a value is: the file and the dotted TOML path to it.
#[derive(Clone, Debug)]
pub(crate) struct At<'f> {
    file: &'f str,
    path: String,
}

// === impl At ===

impl<'f> At<'f> {
    /// The document root of `file`.
    pub(crate) fn root(file: &'f str) -> Self {
        Self {
            file,
            path: String::new(),
        }
    }

    /// The key `key` of this table (quoted when it is not a bare key).
    pub(crate) fn key(&self, key: &str) -> Self {
        let mut path = self.path.clone();
        if !path.is_empty() {
            path.push('.');
        }
        push_key(&mut path, key);
        Self {
            file: self.file,
            path,
        }
    }

    /// Element `i` of this array.
    pub(crate) fn index(&self, i: usize) -> Self {
        Self {
            file: self.file,
            path: format!("{}[{i}]", self.path),
        }
    }

    /// An error at this path.
    pub(crate) fn err(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self, message)
    }

    /// A duration. TOML durations need a unit (`10s`, `500ms`): a bare
    /// number is seconds to nginx but milliseconds to tengine's `check`.
    pub(crate) fn time(&self, text: &str) -> Result<Duration, ConfigError> {
        let d = parse_time(text).map_err(|e| self.err(e.to_string()))?;
        if text.bytes().all(|b| b.is_ascii_digit()) && !d.is_zero() {
            return Err(self.err(format!(
                "invalid time \"{text}\", expected a unit (\"{text}s\" or \"{text}ms\"): a bare number is seconds in nginx but milliseconds in tengine's check"
            )));
        }
        Ok(d)
    }

    /// A size (`1m`, `512k`, bytes).
    pub(crate) fn size(&self, text: &str) -> Result<u64, ConfigError> {
        parse_size(text).map_err(|e| self.err(e.to_string()))
    }

    /// Resolve `host[:port]` or `[v6]:port` to one address with nginx's
    /// rules (`config::addr`, shared with the nginx front end): for
    /// [`Use::Listen`] a bare number is a port and `*` any address.
    pub(crate) fn resolve(
        &self,
        resolve: Resolver<'_>,
        text: &str,
        default_port: u16,
        used: Use,
    ) -> Result<SocketAddr, ConfigError> {
        addr::resolve(text, default_port, used, resolve)
            .map_err(|e| self.err(e.message("", text, "")))
    }
}

impl At<'_> {
    /// As [`At::resolve`], to every address of the name (an upstream's
    /// server: one peer per address, as nginx makes).
    pub(crate) fn resolve_all(
        &self,
        resolve: Resolver<'_>,
        text: &str,
        default_port: u16,
    ) -> Result<Vec<SocketAddr>, ConfigError> {
        addr::resolve_all(text, default_port, Use::Upstream, resolve)
            .map_err(|e| self.err(e.message("", text, "")))
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(self.file)
        } else {
            write!(f, "{}: {}", self.file, self.path)
        }
    }
}

/// Append `key` as TOML writes it: bare when it can be, else quoted.
pub(crate) fn push_key(path: &mut String, key: &str) {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        path.push_str(key);
    } else {
        path.push('"');
        for c in key.chars() {
            match c {
                '"' => path.push_str("\\\""),
                '\\' => path.push_str("\\\\"),
                c => path.push(c),
            }
        }
        path.push('"');
    }
}
