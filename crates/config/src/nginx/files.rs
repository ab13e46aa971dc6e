//! The static-file directives (`root`, `alias`, `index`, `try_files`,
//! `internal`, `types`, `etag`, `if_modified_since`, `max_ranges`,
//! `expires`, `log_not_found`, and the file-reading ones vigil accepts
//! without effect), read as nginx's ngx_http_core_module,
//! ngx_http_index_module and ngx_http_headers_filter_module read them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::syntax::Directive;
use super::{args, bad, block, number, on_off, one};
use crate::ConfigError;
use vigil_core::config::{DocRoot, Expires, FileSettings, IfModifiedSince, LocationMatch};

/// Where a directive is written.
#[derive(Clone, Copy)]
pub(super) enum Place<'a> {
    /// `http {}` or `server {}`.
    Level,
    /// A location: its match kind and path.
    Location(LocationMatch, &'a str),
}

/// What one level set itself (nginx's "is duplicate" and array rules).
#[derive(Clone, Copy, Default)]
pub(super) struct Own {
    root: bool,
    index: bool,
    types: bool,
    try_files: bool,
    internal: bool,
    etag: bool,
    if_modified_since: bool,
    max_ranges: bool,
    expires: bool,
    log_not_found: bool,
}

/// Apply one static-file directive to `f`; false when `d` is not one.
pub(super) fn directive(
    f: &mut FileSettings,
    own: &mut Own,
    d: &Directive,
    place: Place<'_>,
) -> Result<bool, ConfigError> {
    let dup = |seen: &mut bool| {
        if std::mem::replace(seen, true) {
            Err(ConfigError::invalid(
                &d.span,
                format!("\"{}\" directive is duplicate", d.name),
            ))
        } else {
            Ok(())
        }
    };
    match d.name.as_str() {
        "root" | "alias" => root(f, own, d, place)?,
        "index" => {
            let a = args(d, 1, 64)?;
            if !std::mem::replace(&mut own.index, true) {
                f.index.clear();
            }
            for w in a {
                if w.value.is_empty() {
                    return Err(ConfigError::invalid(
                        &w.span,
                        "index \"\" in \"index\" directive is invalid",
                    ));
                }
                if w.value.contains('$') {
                    return Err(ConfigError::invalid(
                        &w.span,
                        "variables in \"index\" are not supported by vigil yet",
                    ));
                }
                f.index.push(w.value.clone());
            }
        }
        "try_files" => {
            let a = args(d, 2, 64)?;
            dup(&mut own.try_files)?;
            let last = &a[a.len() - 1];
            if let Some(code) = last.value.strip_prefix('=') {
                match code.parse::<u32>() {
                    Ok(n) if n <= 999 => {}
                    _ => {
                        return Err(ConfigError::invalid(
                            &last.span,
                            format!("invalid code \"{}\"", last.value),
                        ))
                    }
                }
            }
            f.try_files = a.iter().map(|w| w.value.clone()).collect();
        }
        "internal" => {
            if !matches!(place, Place::Location(..)) {
                return Err(not_here(d));
            }
            args(d, 0, 0)?;
            dup(&mut own.internal)?;
            f.internal = true;
        }
        "types" => {
            let body = block(d)?;
            let mut map = if std::mem::replace(&mut own.types, true) {
                (*f.types).clone()
            } else {
                BTreeMap::new()
            };
            for t in body {
                if t.block.is_some() {
                    return Err(ConfigError::invalid(
                        &t.span,
                        "unexpected \"{\" in \"types\" block",
                    ));
                }
                if t.args.is_empty() {
                    return Err(ConfigError::invalid(
                        &t.span,
                        format!("invalid number of arguments in \"{}\" directive", t.name),
                    ));
                }
                for ext in &t.args {
                    // The later type of an extension wins, as in nginx
                    // (which warns of it).
                    map.insert(ext.value.to_ascii_lowercase(), t.name.clone());
                }
            }
            f.types = Arc::new(map);
        }
        "etag" => {
            dup(&mut own.etag)?;
            f.etag = on_off(d)?;
        }
        "if_modified_since" => {
            dup(&mut own.if_modified_since)?;
            let a = one(d)?;
            f.if_modified_since = match a.value.as_str() {
                "off" => IfModifiedSince::Off,
                "exact" => IfModifiedSince::Exact,
                "before" => IfModifiedSince::Before,
                _ => return Err(bad(a, d, "off, exact or before")),
            };
        }
        "max_ranges" => {
            dup(&mut own.max_ranges)?;
            f.max_ranges = Some(number(d, one(d)?)?);
        }
        "expires" => {
            dup(&mut own.expires)?;
            f.expires = expires(d)?;
        }
        "log_not_found" => {
            dup(&mut own.log_not_found)?;
            f.log_not_found = on_off(d)?;
        }
        "autoindex" => {
            if on_off(d)? {
                return Err(ConfigError::invalid(
                    &d.span,
                    "\"autoindex on\" is not supported by vigil yet (autoindex off is)",
                ));
            }
        }
        "disable_symlinks" => {
            let a = one(d)?;
            if a.value != "off" {
                return Err(ConfigError::invalid(
                    &a.span,
                    "\"disable_symlinks\" other than off is not supported by vigil yet (it follows symbolic links, as nginx's default)",
                ));
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Directives vigil accepts without effect on how files are read (it
/// reads them itself; see docs/configuration.md).
pub(super) const ACCEPTED: &[&str] = &[
    "sendfile",
    "sendfile_max_chunk",
    "tcp_nopush",
    "aio",
    "aio_write",
    "directio",
    "directio_alignment",
    "read_ahead",
    "output_buffers",
    "open_file_cache",
    "open_file_cache_valid",
    "open_file_cache_min_uses",
    "open_file_cache_errors",
    "open_file_cache_events",
];

fn not_here(d: &Directive) -> ConfigError {
    ConfigError::invalid(
        &d.span,
        format!("\"{}\" directive is not allowed here", d.name),
    )
}

/// `root PATH` / `alias PATH` (ngx_http_core_root).
fn root(
    f: &mut FileSettings,
    own: &mut Own,
    d: &Directive,
    place: Place<'_>,
) -> Result<(), ConfigError> {
    let alias = d.name == "alias";
    let a = one(d)?;
    if std::mem::replace(&mut own.root, true) {
        let earlier_alias = matches!(f.root, DocRoot::Alias { .. });
        if earlier_alias == alias {
            return Err(ConfigError::invalid(
                &d.span,
                format!("\"{}\" directive is duplicate", d.name),
            ));
        }
        return Err(ConfigError::invalid(
            &d.span,
            format!(
                "\"{}\" directive is duplicate, \"{}\" directive was specified earlier",
                d.name,
                if earlier_alias { "alias" } else { "root" }
            ),
        ));
    }
    for v in [
        "$document_root",
        "${document_root}",
        "$realpath_root",
        "${realpath_root}",
    ] {
        if a.value.contains(v) {
            let name = v.trim_start_matches('$').trim_matches(['{', '}']);
            return Err(ConfigError::invalid(
                &a.span,
                format!(
                    "the ${name} variable cannot be used in the \"{}\" directive",
                    d.name
                ),
            ));
        }
    }
    f.root = match (alias, place) {
        (false, _) => {
            let mut p = a.value.clone();
            if p.ends_with('/') {
                p.pop();
            }
            DocRoot::Root(p)
        }
        (true, Place::Level) => return Err(not_here(d)),
        (true, Place::Location(LocationMatch::Named, _)) => {
            return Err(ConfigError::invalid(
                &d.span,
                "the \"alias\" directive cannot be used inside the named location",
            ))
        }
        (true, Place::Location(LocationMatch::Regex | LocationMatch::RegexCaseless, _)) => {
            DocRoot::Alias {
                path: a.value.clone(),
                location_len: None,
            }
        }
        (true, Place::Location(_, path)) => DocRoot::Alias {
            path: a.value.clone(),
            location_len: Some(path.len()),
        },
    };
    Ok(())
}

/// `expires [modified] TIME | epoch | max | off | @TIME`
/// (ngx_http_headers_expires, ngx_http_parse_expires).
fn expires(d: &Directive) -> Result<Expires, ConfigError> {
    let a = args(d, 1, 2)?;
    let (modified, v) = match a {
        [v] => (false, v),
        [m, v] if m.value == "modified" => (true, v),
        [m, _] => return Err(bad(m, d, "modified")),
        _ => return Err(bad(&a[0], d, "a time")),
    };
    let invalid = |why: Option<&str>| {
        let m = match why {
            Some(w) => format!(
                "invalid value \"{}\" in \"{}\" directive, {w}",
                v.value, d.name
            ),
            None => format!("invalid value \"{}\" in \"{}\" directive", v.value, d.name),
        };
        ConfigError::invalid(&v.span, m)
    };
    if v.value.contains('$') {
        return Err(ConfigError::invalid(
            &v.span,
            "variables in \"expires\" are not supported by vigil yet",
        ));
    }
    if !modified {
        match v.value.as_str() {
            "epoch" => return Ok(Expires::Epoch),
            "max" => return Ok(Expires::Max),
            "off" => return Ok(Expires::Off),
            _ => {}
        }
    }
    let (daily, minus, text) = if let Some(t) = v.value.strip_prefix('@') {
        if modified {
            return Err(invalid(Some(
                "daily time cannot be used with \"modified\" parameter",
            )));
        }
        (true, false, t)
    } else if let Some(t) = v.value.strip_prefix('+') {
        (false, false, t)
    } else if let Some(t) = v.value.strip_prefix('-') {
        (false, true, t)
    } else {
        (false, false, v.value.as_str())
    };
    let secs = vigil_core::config::value::parse_time(text)
        .map_err(|_| invalid(None))?
        .as_secs();
    let secs = i64::try_from(secs).map_err(|_| invalid(None))?;
    if daily {
        if secs > 24 * 60 * 60 {
            return Err(invalid(Some("daily time value must be less than 24 hours")));
        }
        return Ok(Expires::Daily(secs));
    }
    Ok(Expires::After {
        seconds: if minus { -secs } else { secs },
        modified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nginx::syntax::parse_str;
    use std::path::Path;

    fn apply(text: &str) -> Result<FileSettings, ConfigError> {
        let ds = parse_str(text, Path::new("t.conf"), Path::new(".")).map_err(|e| {
            ConfigError::invalid(
                &crate::nginx::syntax::Span {
                    file: Arc::new("t.conf".into()),
                    line: 1,
                    col: 1,
                },
                e.to_string(),
            )
        })?;
        let mut f = FileSettings::default();
        let mut own = Own::default();
        for d in &ds {
            assert!(directive(
                &mut f,
                &mut own,
                d,
                Place::Location(LocationMatch::Prefix, "/a/")
            )?);
        }
        Ok(f)
    }

    #[test]
    fn expires_forms() {
        let e = |t: &str| apply(t).map(|f| f.expires);
        assert_eq!(
            e("expires 1h;").ok(),
            Some(Expires::After {
                seconds: 3600,
                modified: false
            })
        );
        assert_eq!(
            e("expires -1;").ok(),
            Some(Expires::After {
                seconds: -1,
                modified: false
            })
        );
        assert_eq!(
            e("expires modified +30s;").ok(),
            Some(Expires::After {
                seconds: 30,
                modified: true
            })
        );
        assert_eq!(e("expires @15h30m;").ok(), Some(Expires::Daily(55800)));
        assert_eq!(e("expires max;").ok(), Some(Expires::Max));
        assert_eq!(e("expires epoch;").ok(), Some(Expires::Epoch));
        assert!(e("expires @25h;").is_err());
        assert!(e("expires modified @1h;").is_err());
        assert!(e("expires soon;").is_err());
    }

    #[test]
    fn root_and_alias() {
        let f = apply("alias /srv/a/;").ok().map(|f| f.root);
        assert_eq!(
            f,
            Some(DocRoot::Alias {
                path: "/srv/a/".into(),
                location_len: Some(3)
            })
        );
        assert_eq!(
            apply("root /srv/;").ok().map(|f| f.root),
            Some(DocRoot::Root("/srv".into()))
        );
        let e = apply("root /a; alias /b;")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains(
                "\"alias\" directive is duplicate, \"root\" directive was specified earlier"
            ),
            "{e}"
        );
    }

    #[test]
    fn types_lowercase_and_replace() {
        let f = apply("types { text/css CSS; } types { text/x-a a; }").ok();
        let t = f.map(|f| (*f.types).clone()).unwrap_or_default();
        assert_eq!(t.get("css").map(String::as_str), Some("text/css"));
        assert_eq!(t.get("a").map(String::as_str), Some("text/x-a"));
        assert_eq!(t.get("html"), None);
    }

    #[test]
    fn try_files_code_checked() {
        assert!(apply("try_files $uri =404;").is_ok());
        assert!(apply("try_files $uri =1000;").is_err());
        assert!(apply("try_files $uri;").is_err());
    }
}
