//! nginx.conf → `vigil.toml`: the model an nginx.conf builds, written in
//! the native schema (what `vigil convert` prints). Loading the output with
//! [`config::toml::load_str`](crate::toml::load_str) gives a
//! [`Config`](vigil_core::config::Config) equal to the one the nginx.conf gave.

use crate::nginx::Loaded;
use crate::toml::to_toml_string;

/// What the TOML schema cannot carry (`rewrite`, `set`, `map`,
/// `error_page`, regex, named and nested locations, TLS listeners, the
/// filters), each with its place: `vigil convert` refuses such a file
/// rather than drop them.
pub fn untranslatable(config: &vigil_core::config::Config) -> Vec<String> {
    use vigil_core::config::{LocationMatch, RewriteStep};
    let mut out = Vec::new();
    for m in &config.maps {
        out.push(format!("{}: map ${}", m.origin, m.variable));
    }
    let script = |steps: &[RewriteStep], out: &mut Vec<String>, at: &dyn std::fmt::Display| {
        for s in steps {
            match s {
                RewriteStep::Rewrite(r) => out.push(format!("{}: rewrite", r.origin)),
                RewriteStep::Set(v) => out.push(format!("{}: set ${}", v.origin, v.name)),
                // The first `return` is the block's `return` in TOML.
                RewriteStep::Return(_) if steps.len() == 1 => {}
                RewriteStep::Return(_) => out.push(format!("{at}: return after rewrite")),
            }
        }
    };
    for s in &config.servers {
        script(&s.rewrite, &mut out, &s.origin);
        for l in &s.locations {
            script(&l.routing.script, &mut out, &l.origin);
            // `^~@x` is a prefix location named `@x` (nginx's reading), which
            // the TOML schema takes for a named one.
            if matches!(
                l.matcher,
                LocationMatch::Regex | LocationMatch::RegexCaseless | LocationMatch::Named
            ) || l.routing.parent.is_some()
                || l.path.starts_with('@')
            {
                out.push(format!("{}: location {}", l.origin, l.path));
            }
            if !l.proxy.error_pages.is_empty() || l.proxy.intercept_errors {
                out.push(format!("{}: error_page / proxy_intercept_errors", l.origin));
            }
            if l.proxy.redirects != vigil_core::config::Redirects::default() {
                out.push(format!(
                    "{}: absolute_redirect / server_name_in_redirect / port_in_redirect",
                    l.origin
                ));
            }
        }
        if s.listen.iter().any(|l| l.ssl || l.http2) || !s.tls.certificates.is_empty() {
            out.push(format!("{}: listen ... ssl / ssl_certificate", s.origin));
        }
    }
    for z in &config.limit_zones {
        let what = match z.kind {
            vigil_core::config::ZoneKind::Req { .. } => "limit_req_zone",
            vigil_core::config::ZoneKind::Conn => "limit_conn_zone",
        };
        out.push(format!(
            "{}: {what} {} (no TOML keys for request and connection limits yet)",
            z.origin, z.name
        ));
    }
    out.extend(filters(config));
    out
}

/// `loaded.config` as TOML, headed by a comment that lists the nginx
/// directives that were accepted without effect (`loaded.ignored`) and so
/// have no counterpart in the output.
pub fn nginx_to_toml(loaded: &Loaded) -> String {
    let mut out = String::from("# vigil configuration converted from nginx.conf.\n");
    if loaded.ignored.is_empty() {
        out.push_str("# Every nginx directive was carried over.\n");
    } else {
        out.push_str("# nginx directives with no meaning for vigil, not carried over:\n");
        for (name, at) in &loaded.ignored {
            out.push_str(&format!(
                "#   {} (first at {})\n",
                one_line(name),
                one_line(at)
            ));
        }
    }
    out.push('\n');
    out.push_str(&to_toml_string(&loaded.config));
    out
}

/// The filters of `config` the TOML schema cannot express yet (gzip,
/// allow/deny, real IP, proxy_redirect, hidden and passed headers, a
/// `log_format`, `if=`), each as "DIRECTIVE in location PATH (at ORIGIN)"
/// (a dropped `deny` would open the location).
fn filters(config: &vigil_core::config::Config) -> Vec<String> {
    use vigil_core::config::{FileSettings, LogFormat, ProxySettings};
    let base = ProxySettings::default();
    let mut out = Vec::new();
    for s in &config.servers {
        // The server's own files answer what no location takes; its
        // types and default_type (an `include mime.types` in nearly every
        // conf) are not judged here.
        let own = FileSettings {
            default_type: base.files.default_type.clone(),
            types: base.files.types.clone(),
            ..s.files.clone()
        };
        if own != base.files {
            out.push(format!(
                "root/alias/index/try_files/types/etag/expires (static files) in server (at {})",
                s.origin
            ));
        }
        for l in &s.locations {
            let p = &l.proxy;
            let custom = |f: &LogFormat| matches!(f, LogFormat::Custom(_));
            for (what, differs) in [
                ("gzip", p.gzip != base.gzip),
                ("allow/deny", !p.access.is_empty()),
                (
                    "set_real_ip_from",
                    !p.real_ip.from.is_empty() || !p.server_real_ip.from.is_empty(),
                ),
                ("proxy_redirect", p.redirect != base.redirect),
                ("proxy_hide_header", !p.hide_headers.is_empty()),
                (
                    "root/alias/index/try_files/types/etag/expires (static files)",
                    p.pass.is_none() && l.ret.is_none() && p.files != base.files,
                ),
                ("proxy_pass_header", !p.pass_headers.is_empty()),
                ("limit_req/limit_conn", p.limits != base.limits),
                (
                    "access_log with a log_format or if=",
                    p.access_log
                        .as_ref()
                        .is_some_and(|a| a.condition.is_some() || custom(&a.format)),
                ),
            ] {
                if differs {
                    out.push(format!("{what} in location {} (at {})", l.path, l.origin));
                }
            }
        }
    }
    out
}

/// `text` safe inside a `#` comment line.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{literal_resolver, toml};
    use std::path::Path;

    /// `src` as an nginx.conf named `nginx.conf`, names taken literally.
    fn load(src: &str) -> Loaded {
        crate::nginx::load_str(
            src,
            Path::new("nginx.conf"),
            Path::new("."),
            &literal_resolver,
        )
        .expect("nginx.conf loads")
    }

    #[test]
    fn header_lists_ignored_directives_and_body_loads_back() {
        let src = "worker_processes 1; events { worker_connections 1024; }\n\
                   http { sendfile on; upstream u { server 127.0.0.1:8001; }\n\
                   server { listen 8080; location / { proxy_pass http://u; } } }";
        let loaded = load(src);
        let text = nginx_to_toml(&loaded);
        assert!(
            text.contains("#   worker_processes (first at nginx.conf:1:1)"),
            "{text}"
        );
        assert!(text.contains("#   sendfile"), "{text}");
        let back = toml::load_str(&text, Path::new("out.toml"), &literal_resolver)
            .expect("converted TOML loads");
        assert_eq!(back, loaded.config);
    }

    #[test]
    fn static_files_are_named_not_dropped() {
        // A location that serves files with settings of its own.
        let src = "http { types { text/css css; }\n\
                   server { listen 8080; root /srv/www;\n\
                   location /assets/ { expires 1h; }\n\
                   location / { proxy_pass http://127.0.0.1:9; } } }";
        let out = untranslatable(&load(src).config);
        assert!(
            out.iter()
                .any(|o| o.contains("static files") && o.contains("location /assets/")),
            "{out:#?}"
        );
        assert!(
            out.iter().any(|o| o.contains("static files) in server")),
            "the server's root: {out:#?}"
        );
        // `types` alone (an include mime.types) with proxying locations
        // converts: nothing is served from files there.
        let src = "http { types { text/css css; }\n\
                   server { listen 8080; location / { proxy_pass http://127.0.0.1:9; } } }";
        assert!(untranslatable(&load(src).config).is_empty());
    }

    #[test]
    fn returns_survive_the_round_trip() {
        let src = "events { }\n\
                   http { upstream u { server 127.0.0.1:8001; }\n\
                   server { listen 8080; return 301 https://$host$request_uri; }\n\
                   server { listen 8081; location /gone { return 410; }\n\
                   location /hi { default_type application/json; return 200 \"hi $arg_a\"; }\n\
                   location / { proxy_pass http://u; } } }";
        let loaded = load(src);
        let text = nginx_to_toml(&loaded);
        assert!(
            text.contains("[server.return]") || text.contains("return ="),
            "{text}"
        );
        let back = toml::load_str(&text, Path::new("out.toml"), &literal_resolver)
            .expect("converted TOML loads");
        assert_eq!(back, loaded.config);
        let s = &back.servers;
        assert_eq!(s[0].ret.as_ref().map(|r| r.code), Some(301));
        assert_eq!(
            s[1].locations[1]
                .ret
                .as_ref()
                .and_then(|r| r.text.as_deref()),
            Some("hi $arg_a")
        );
        assert_eq!(
            s[1].locations[1]
                .ret
                .as_ref()
                .map(|r| r.content_type.as_str()),
            Some("application/json")
        );
    }

    #[test]
    fn confs_with_nginx_only_filters_are_untranslatable() {
        let with_body = |body: &str| {
            load(&format!(
                "events {{ }} http {{ upstream u {{ server 127.0.0.1:8001; }}\n{body}\n\
                 server {{ listen 8080; location / {{ proxy_pass http://u; }} }} }}"
            ))
            .config
        };
        assert!(untranslatable(&with_body("")).is_empty());
        assert!(untranslatable(&with_body("access_log /tmp/a.log;")).is_empty());
        for (body, what) in [
            ("gzip on;", "gzip"),
            ("deny all;", "allow/deny"),
            ("set_real_ip_from 10.0.0.0/8;", "set_real_ip_from"),
            ("proxy_redirect off;", "proxy_redirect"),
            ("proxy_hide_header X-A;", "proxy_hide_header"),
            (
                "log_format m '$status'; access_log /tmp/a.log m;",
                "log_format",
            ),
        ] {
            let lost = untranslatable(&with_body(body));
            assert!(
                lost.len() == 1 && lost[0].contains(what) && lost[0].contains("location /"),
                "{body}: {lost:?}"
            );
        }
    }

    #[test]
    fn what_toml_cannot_carry_is_listed() {
        let plain = load(
            "http { server { listen 8080; return 301 https://$host$request_uri; }\n\
             server { listen 8081; location /gone { return 410; } } }",
        );
        assert!(untranslatable(&plain.config).is_empty());
        let rich = load(
            "http { map $host $m { default x; }\n\
             server { listen 8080; rewrite ^/a /b; set $v 1;\n\
             location ~ ^/r { return 200; } location /p { location /pp { } } } }",
        );
        let lost = untranslatable(&rich.config);
        assert_eq!(lost.len(), 5, "{lost:#?}");
        assert!(lost[0].starts_with("nginx.conf:1:") && lost[0].ends_with("map $m"));
    }
}
