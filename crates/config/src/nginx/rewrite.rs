//! `rewrite`, `set`, `map` and `error_page`, parsed as
//! ngx_http_rewrite_module, ngx_http_map_module and ngx_http_core_module
//! parse them (their messages, at the argument that is wrong).

use super::syntax::{Arg, Directive};
use super::{args, bad, block, origin};
use crate::{pattern, ConfigError};
use vigil_core::config::{ErrorPage, MapBlock, MapEntry, MapKey, Rewrite, RewriteFlag, SetVar};

/// The variables `set` may change: nginx's changeable built-ins.
const CHANGEABLE: &[&str] = &["args"];

/// Whether `name` is one of nginx's built-in variables (which `set` and
/// `map` may not define, except the changeable ones).
pub(super) fn builtin(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "args",
        "binary_remote_addr",
        "limit_conn_status",
        "limit_req_status",
        "body_bytes_sent",
        "bytes_sent",
        "connection",
        "connection_requests",
        "content_length",
        "content_type",
        "document_root",
        "document_uri",
        "host",
        "hostname",
        "https",
        "is_args",
        "limit_rate",
        "msec",
        "nginx_version",
        "pid",
        "pipe",
        "proxy_add_x_forwarded_for",
        "proxy_host",
        "proxy_port",
        "query_string",
        "realpath_root",
        "remote_addr",
        "remote_port",
        "remote_user",
        "request",
        "request_body",
        "request_completion",
        "request_filename",
        "request_id",
        "request_length",
        "request_method",
        "request_time",
        "request_uri",
        "scheme",
        "server_addr",
        "server_name",
        "server_port",
        "server_protocol",
        "status",
        "time_iso8601",
        "time_local",
        "uri",
        "upstream_addr",
        "upstream_status",
        "upstream_response_time",
        "upstream_connect_time",
        "upstream_header_time",
    ];
    NAMES.contains(&name)
}

/// A regular expression as nginx compiles it: the error at its argument.
pub(super) fn regex(a: &Arg, pattern_text: &str, caseless: bool) -> Result<(), ConfigError> {
    pattern::compile(pattern_text, caseless)
        .map(|_| ())
        .map_err(|e| ConfigError::invalid(&a.span, e))
}

/// `rewrite REGEX REPLACEMENT [FLAG]` (ngx_http_rewrite).
pub(super) fn rewrite(d: &Directive) -> Result<Rewrite, ConfigError> {
    let a = args(d, 2, 3)?;
    regex(&a[0], &a[0].value, false)?;
    let mut replacement = a[1].value.clone();
    if replacement.is_empty() {
        return Err(ConfigError::invalid(&a[1].span, "empty replacement"));
    }
    let drop_args = replacement.ends_with('?');
    if drop_args {
        replacement.pop();
    }
    let redirects = ["http://", "https://", "$scheme"]
        .iter()
        .any(|p| replacement.starts_with(p));
    let flag = match a.get(2).map(|f| f.value.as_str()) {
        None if redirects => RewriteFlag::Redirect,
        None => RewriteFlag::None,
        Some("last") => RewriteFlag::Last,
        Some("break") => RewriteFlag::Break,
        Some("redirect") => RewriteFlag::Redirect,
        Some("permanent") => RewriteFlag::Permanent,
        Some(v) => {
            return Err(ConfigError::invalid(
                &a[2].span,
                format!("invalid parameter \"{v}\""),
            ))
        }
    };
    // A redirecting replacement redirects whatever flag (`last` too).
    let flag = match flag {
        RewriteFlag::None | RewriteFlag::Last | RewriteFlag::Break if redirects => {
            RewriteFlag::Redirect
        }
        f => f,
    };
    Ok(Rewrite {
        regex: a[0].value.clone(),
        replacement,
        drop_args,
        flag,
        origin: origin(&d.span),
    })
}

/// `set $name VALUE` (ngx_http_rewrite_set). `builtin` says whether a
/// name is one of the variables vigil computes itself.
pub(super) fn set(d: &Directive, builtin: impl Fn(&str) -> bool) -> Result<SetVar, ConfigError> {
    let a = args(d, 2, 2)?;
    let name = variable_name(&a[0])?;
    if builtin(&name) && !CHANGEABLE.contains(&name.as_str()) {
        return Err(ConfigError::invalid(
            &a[0].span,
            format!("the duplicate \"{name}\" variable"),
        ));
    }
    Ok(SetVar {
        name,
        value: a[1].value.clone(),
        origin: origin(&d.span),
    })
}

fn variable_name(a: &Arg) -> Result<String, ConfigError> {
    match a.value.strip_prefix('$') {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Err(ConfigError::invalid(
            &a.span,
            format!("invalid variable name \"{}\"", a.value),
        )),
    }
}

/// `map $source $variable { ... }` (ngx_http_map_block).
pub(super) fn map(d: &Directive, builtin: impl Fn(&str) -> bool) -> Result<MapBlock, ConfigError> {
    let body = block(d)?;
    if d.args.len() != 2 {
        return Err(ConfigError::invalid(
            &d.span,
            "invalid number of arguments in \"map\" directive",
        ));
    }
    let variable = variable_name(&d.args[1])?;
    if builtin(&variable) {
        return Err(ConfigError::invalid(
            &d.args[1].span,
            format!("the duplicate \"{variable}\" variable"),
        ));
    }
    let mut m = MapBlock {
        source: d.args[0].value.clone(),
        variable,
        hostnames: false,
        default: None,
        entries: Vec::new(),
        origin: origin(&d.span),
    };
    for e in body {
        if e.block.is_some() {
            return Err(ConfigError::invalid(&e.span, "unexpected \"{\""));
        }
        // nginx reads a line as its words: the directive name is the key.
        let key = &e.name;
        match (key.as_str(), e.args.as_slice()) {
            ("hostnames", []) => {
                m.hostnames = true;
                continue;
            }
            ("volatile", []) => continue,
            (_, [value]) => {
                let value = value.value.clone();
                if key == "default" {
                    if m.default.is_some() {
                        return Err(ConfigError::invalid(
                            &e.span,
                            "duplicate default map parameter",
                        ));
                    }
                    m.default = Some(value);
                    continue;
                }
                let key = if let Some(p) = key.strip_prefix("~*") {
                    regex_key(e, p, true)?
                } else if let Some(p) = key.strip_prefix('~') {
                    regex_key(e, p, false)?
                } else {
                    MapKey::Exact(key.strip_prefix('\\').unwrap_or(key).to_string())
                };
                let dup = matches!(&key, MapKey::Exact(k)
                    if m.entries.iter().any(|o| matches!(&o.key, MapKey::Exact(x) if x.eq_ignore_ascii_case(k))));
                if dup {
                    return Err(ConfigError::invalid(
                        &e.span,
                        format!("conflicting parameter \"{key}\""),
                    ));
                }
                m.entries.push(MapEntry {
                    key,
                    value,
                    origin: origin(&e.span),
                });
            }
            _ => {
                return Err(ConfigError::invalid(
                    &e.span,
                    "invalid number of the map parameters",
                ))
            }
        }
    }
    Ok(m)
}

fn regex_key(e: &Directive, p: &str, caseless: bool) -> Result<MapKey, ConfigError> {
    pattern::compile(p, caseless).map_err(|err| ConfigError::invalid(&e.span, err))?;
    Ok(MapKey::Regex {
        pattern: p.to_string(),
        caseless,
    })
}

/// `error_page CODE ... [=[RESPONSE]] URI` (ngx_http_core_error_page).
pub(super) fn error_page(d: &Directive) -> Result<ErrorPage, ConfigError> {
    let a = args(d, 2, 64)?;
    let (uri, rest) = a.split_last().ok_or_else(|| bad(&a[0], d, "a URI"))?;
    let mut answer = None;
    let mut codes = Vec::new();
    for (i, w) in rest.iter().enumerate() {
        if let Some(code) = w.value.strip_prefix('=') {
            if i + 1 != rest.len() {
                return Err(ConfigError::invalid(
                    &w.span,
                    format!("invalid value \"{}\"", w.value),
                ));
            }
            answer = Some(if code.is_empty() {
                0
            } else {
                code.parse::<u16>()
                    .ok()
                    .filter(|c| *c > 0 && *c <= 999)
                    .ok_or_else(|| {
                        ConfigError::invalid(&w.span, format!("invalid value \"{}\"", w.value))
                    })?
            });
            continue;
        }
        let code = w
            .value
            .parse::<u16>()
            .map_err(|_| ConfigError::invalid(&w.span, format!("invalid value \"{}\"", w.value)))?;
        if !(300..=599).contains(&code) || code == 499 {
            return Err(ConfigError::invalid(
                &w.span,
                format!("value \"{}\" must be between 300 and 599", w.value),
            ));
        }
        codes.push(code);
    }
    if codes.is_empty() {
        return Err(ConfigError::invalid(
            &d.span,
            "invalid number of arguments in \"error_page\" directive",
        ));
    }
    Ok(ErrorPage {
        codes,
        answer,
        uri: uri.value.clone(),
        origin: origin(&d.span),
    })
}
