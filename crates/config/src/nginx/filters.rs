//! The response filters' directives: `gzip` and `gzip_*` (as
//! `ngx_http_gzip_filter_module` and the core module parse them, 1.22).

use super::syntax::Directive;
use super::{args, on_off, one, unsupported};
use crate::ConfigError;
use vigil_core::config::value::parse_size;
use vigil_core::config::{Gzip, HttpVersion};

/// What a `gzip*` directive did.
pub(super) enum Done {
    /// Applied.
    Set,
    /// Accepted without effect (buffer tuning).
    Ignored,
    /// Not a gzip directive.
    No,
}

/// Apply one `gzip*` directive to `g`; `own_types` says whether this
/// level has a `gzip_types` already (a second one adds to it, a first one
/// replaces the inherited list).
pub(super) fn gzip(g: &mut Gzip, d: &Directive, own_types: &mut bool) -> Result<Done, ConfigError> {
    match d.name.as_str() {
        "gzip" => g.enable = on_off(d)?,
        "gzip_vary" => g.vary = on_off(d)?,
        "gzip_comp_level" => {
            let a = one(d)?;
            let n: u32 = a
                .value
                .parse()
                .map_err(|_| directive_says(d, "invalid number"))?;
            if !(1..=9).contains(&n) {
                return Err(ConfigError::invalid(
                    &a.span,
                    "value must be between 1 and 9",
                ));
            }
            g.comp_level = n;
        }
        "gzip_min_length" => {
            let a = one(d)?;
            g.min_length = parse_size(&a.value).map_err(|_| directive_says(d, "invalid value"))?;
        }
        "gzip_http_version" => {
            let a = one(d)?;
            g.http_version = match a.value.as_str() {
                "1.0" => HttpVersion::Http10,
                "1.1" => HttpVersion::Http11,
                v => {
                    return Err(ConfigError::invalid(
                        &a.span,
                        format!("invalid value \"{v}\""),
                    ))
                }
            };
        }
        "gzip_types" => {
            let a = args(d, 1, 256)?;
            if !std::mem::replace(own_types, true) {
                g.types.clear();
            }
            g.types
                .extend(a.iter().map(|t| t.value.to_ascii_lowercase()));
        }
        "gzip_proxied" => {
            let a = args(d, 1, 16)?;
            let mut p = vigil_core::config::GzipProxied::default();
            for w in a {
                let flag = match w.value.as_str() {
                    "off" => continue,
                    "expired" => &mut p.expired,
                    "no-cache" => &mut p.no_cache,
                    "no-store" => &mut p.no_store,
                    "private" => &mut p.private,
                    "no_last_modified" => &mut p.no_last_modified,
                    "no_etag" => &mut p.no_etag,
                    "auth" => &mut p.auth,
                    "any" => &mut p.any,
                    v => {
                        return Err(ConfigError::invalid(
                            &w.span,
                            format!("invalid value \"{v}\""),
                        ))
                    }
                };
                // nginx only warns of a duplicate.
                *flag = true;
            }
            // nginx: `off` among others turns them all off.
            if a.iter().any(|w| w.value == "off") {
                p = vigil_core::config::GzipProxied::default();
            }
            g.proxied = p;
        }
        "gzip_disable" => {
            let a = args(d, 1, 64)?;
            for w in a {
                match w.value.as_str() {
                    "msie6" => g.disable_msie6 = true,
                    "degradation" => {}
                    _ => {
                        return Err(ConfigError::invalid(
                            &w.span,
                            "gzip_disable with a regular expression is not supported by vigil; only \"msie6\"",
                        ))
                    }
                }
            }
        }
        "gzip_buffers" | "gzip_window" | "gzip_hash" | "gzip_memlevel" | "postpone_gzipping" => {
            return Ok(Done::Ignored)
        }
        "gzip_static" | "gunzip" => {
            if on_off(d).unwrap_or(true) {
                return Err(unsupported(
                    d,
                    "vigil serves no files and does not decompress; use `vigil check` beside nginx for this conf",
                ));
            }
        }
        _ => return Ok(Done::No),
    }
    Ok(Done::Set)
}

/// A slot's own message, as `ngx_conf_handler` words it.
fn directive_says(d: &Directive, what: &str) -> ConfigError {
    ConfigError::invalid(&d.span, format!("\"{}\" directive {what}", d.name))
}

/// Which header lists this level has its own of.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OwnHeaders {
    redirect: bool,
    hide: bool,
    pass: bool,
}

/// `proxy_redirect default|off|REDIRECT REPLACEMENT`, `proxy_hide_header`,
/// `proxy_pass_header` (a level's first replaces the inherited list).
pub(super) fn headers(
    p: &mut vigil_core::config::ProxySettings,
    own: &mut OwnHeaders,
    d: &Directive,
) -> Result<(), ConfigError> {
    use vigil_core::config::RedirectRule;
    match d.name.as_str() {
        "proxy_redirect" => {
            let a = args(d, 1, 2)?;
            let first = !std::mem::replace(&mut own.redirect, true);
            let rule =
                match (a[0].value.as_str(), a.get(1)) {
                    ("off", None) => {
                        if !first {
                            return Err(directive_says(d, "is duplicate"));
                        }
                        p.redirect = None;
                        return Ok(());
                    }
                    ("default", None) => RedirectRule::Default,
                    (v, None) => {
                        return Err(ConfigError::invalid(
                            &a[0].span,
                            format!("invalid parameter \"{v}\""),
                        ))
                    }
                    (v, Some(_)) if v.starts_with('~') => return Err(ConfigError::invalid(
                        &a[0].span,
                        "proxy_redirect with a regular expression is not supported by vigil yet",
                    )),
                    (v, Some(r)) => RedirectRule::Rewrite {
                        redirect: v.to_string(),
                        replacement: r.value.clone(),
                    },
                };
            if !first && p.redirect.is_none() {
                return Err(directive_says(d, "is duplicate"));
            }
            if first {
                p.redirect = Some(Vec::new());
            }
            if let Some(list) = &mut p.redirect {
                list.push(rule);
            }
        }
        "proxy_hide_header" | "proxy_pass_header" => {
            let name = one(d)?.value.to_ascii_lowercase();
            let (list, own) = if d.name == "proxy_hide_header" {
                (&mut p.hide_headers, &mut own.hide)
            } else {
                (&mut p.pass_headers, &mut own.pass)
            };
            if !std::mem::replace(own, true) {
                list.clear();
            }
            list.push(name);
        }
        _ => {}
    }
    Ok(())
}
