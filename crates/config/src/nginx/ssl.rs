//! The `ssl_*` directives of ngx_http_ssl_module (http and server level)
//! and nginx's checks of TLS listeners: every `ssl_certificate` needs its
//! `ssl_certificate_key`, and the default server of a `listen ... ssl`
//! address needs a certificate.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::syntax::Directive;
use super::{args, bad, on_off, one, origin, time, unsupported, Context};
use crate::ConfigError;
use vigil_core::config::value::parse_size;
use vigil_core::config::{CertificatePair, Origin, ServerTls, SessionCache};

/// The `ssl_*` settings in force at one level. nginx inherits
/// `ssl_certificate` and `ssl_certificate_key` as two separate lists, each
/// replaced whole by a level that has its own.
#[derive(Clone, Debug, Default)]
pub(super) struct TlsLevel {
    settings: ServerTls,
    certs: Vec<(PathBuf, Origin)>,
    keys: Vec<(PathBuf, Origin)>,
    own_certs: bool,
    own_keys: bool,
}

// === impl TlsLevel ===

impl TlsLevel {
    /// The settings a nested level starts with.
    pub(super) fn child(&self) -> Self {
        Self {
            own_certs: false,
            own_keys: false,
            ..self.clone()
        }
    }

    /// Apply `d` if it is an `ssl_*` directive vigil knows; None otherwise.
    pub(super) fn directive(&mut self, d: &Directive) -> Option<Result<(), ConfigError>> {
        let r = match d.name.as_str() {
            "ssl_certificate" => path(d).map(|p| {
                if !self.own_certs {
                    self.certs.clear();
                    self.own_certs = true;
                }
                self.certs.push((p, origin(&d.span)));
            }),
            "ssl_certificate_key" => path(d).map(|p| {
                if !self.own_keys {
                    self.keys.clear();
                    self.own_keys = true;
                }
                self.keys.push((p, origin(&d.span)));
            }),
            "ssl_protocols" => self.protocols(d),
            "ssl_session_cache" => session_cache(d).map(|c| self.settings.session_cache = c),
            "ssl_session_timeout" => one(d)
                .and_then(|a| time(d, a))
                .map(|t| self.settings.session_timeout = t),
            "ssl_session_tickets" => on_off(d).map(|v| self.settings.session_tickets = v),
            "ssl_ciphers" => one(d).map(|a| self.settings.ciphers = Some(a.value.clone())),
            "ssl_prefer_server_ciphers" => {
                on_off(d).map(|v| self.settings.prefer_server_ciphers = v)
            }
            "ssl" => Err(unsupported(
                d,
                "the \"ssl\" directive is deprecated in nginx; write \"listen ... ssl\"",
            )),
            _ => return None,
        };
        Some(r)
    }

    fn protocols(&mut self, d: &Directive) -> Result<(), ConfigError> {
        let a = args(d, 1, 6)?;
        let (mut tls12, mut tls13, mut older) = (false, false, Vec::new());
        for p in a {
            match p.value.as_str() {
                "TLSv1.2" => tls12 = true,
                "TLSv1.3" => tls13 = true,
                "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" => older.push(p.value.clone()),
                _ => {
                    return Err(bad(
                        p,
                        d,
                        "SSLv2, SSLv3, TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3",
                    ))
                }
            }
        }
        if !tls12 && !tls13 {
            return Err(ConfigError::invalid(
                &d.span,
                format!(
                    "\"ssl_protocols\" lists only {}, which vigil cannot offer: rustls implements TLSv1.2 and TLSv1.3",
                    older.join(" ")
                ),
            ));
        }
        let s = &mut self.settings;
        (s.tls12, s.tls13, s.not_offered) = (tls12, tls13, older);
        s.protocols_origin = origin(&d.span);
        Ok(())
    }

    /// The settings of a `server` block: certificates paired with their
    /// keys in order, as nginx does.
    pub(super) fn finish(&self) -> Result<ServerTls, ConfigError> {
        if self.keys.len() < self.certs.len() {
            let (cert, at) = &self.certs[self.keys.len()];
            return Err(ConfigError::invalid(
                at,
                format!(
                    "no \"ssl_certificate_key\" is defined for certificate \"{}\"",
                    cert.display()
                ),
            ));
        }
        let mut tls = self.settings.clone();
        tls.certificates = self
            .certs
            .iter()
            .zip(&self.keys)
            .map(|((certificate, c), (key, k))| CertificatePair {
                certificate: certificate.clone(),
                key: key.clone(),
                certificate_origin: c.clone(),
                key_origin: k.clone(),
            })
            .collect();
        Ok(tls)
    }
}

fn path(d: &Directive) -> Result<PathBuf, ConfigError> {
    let a = one(d)?;
    if a.value.contains('$') || a.value.starts_with("data:") {
        return Err(ConfigError::invalid(
            &a.span,
            format!(
                "\"{}\" with variables or \"data:\" is not supported by vigil; name a file",
                d.name
            ),
        ));
    }
    Ok(PathBuf::from(&a.value))
}

/// `ssl_session_cache off | none | [builtin[:size]] [shared:name:size]`.
fn session_cache(d: &Directive) -> Result<SessionCache, ConfigError> {
    let a = args(d, 1, 2)?;
    let invalid = |v: &str| ConfigError::invalid(&d.span, format!("invalid session cache \"{v}\""));
    if let [only] = a {
        match only.value.as_str() {
            "off" => return Ok(SessionCache::Off),
            "none" => return Ok(SessionCache::None),
            _ => {}
        }
    }
    let mut sessions = 0u64;
    for p in a {
        let v = p.value.as_str();
        if v == "builtin" {
            // OpenSSL's default cache size.
            sessions += 20480;
        } else if let Some(n) = v.strip_prefix("builtin:") {
            sessions += n
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| invalid(v))?;
        } else if let Some(rest) = v.strip_prefix("shared:") {
            let (name, size) = rest.rsplit_once(':').ok_or_else(|| invalid(v))?;
            let bytes = parse_size(size).map_err(|_| invalid(v))?;
            if name.is_empty() || bytes < 8 * 4096 {
                return Err(ConfigError::invalid(
                    &p.span,
                    format!("session cache \"{v}\" is too small or unnamed"),
                ));
            }
            // nginx's documentation: one megabyte stores about 4000 sessions.
            sessions += bytes.saturating_mul(4000) >> 20;
        } else {
            return Err(invalid(v));
        }
    }
    Ok(SessionCache::Sessions(sessions.max(1)))
}

/// nginx's check of TLS addresses (`ngx_http_ssl_init`): an address is a
/// TLS address when any `listen` of it has `ssl`, and its default server
/// (the `default_server`, else the first block listing it) needs a
/// certificate; other blocks without one get the default server's.
pub(super) fn check_listeners(cx: &mut Context<'_>) -> Result<(), ConfigError> {
    // By address: (is TLS, default server index).
    let mut addrs: HashMap<SocketAddr, (bool, usize)> = HashMap::new();
    let mut order = Vec::new();
    for (i, s) in cx.config.servers.iter().enumerate() {
        for l in &s.listen {
            let e = addrs.entry(l.addr).or_insert_with(|| {
                order.push(l.addr);
                (false, i)
            });
            e.0 |= l.ssl;
            if l.default_server {
                e.1 = i;
            }
        }
    }
    let mut errors = Vec::new();
    for addr in order {
        let Some(&(true, default)) = addrs.get(&addr) else {
            continue;
        };
        let Some(s) = cx.config.servers.get(default) else {
            continue;
        };
        if s.tls.certificates.is_empty() && !errors.iter().any(|(i, _)| *i == default) {
            errors.push((
                default,
                ConfigError::invalid(
                    &s.origin,
                    "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive",
                ),
            ));
        }
    }
    for (_, e) in errors {
        cx.refuse(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
