//! The configurations nginx refuses, refused by vigil with nginx's words
//! at the same line: each case runs `nginx -t` (stock nginx 1.22) on the
//! same file in the same test and compares the messages. The TOML front
//! end refuses the same with the field path.

use std::path::Path;
use std::process::Command;

use vigil_config::{literal_resolver, nginx, toml};
use vigil_testkit::nginx_bin;

/// A whole nginx.conf around `http_body`, which starts on line 3.
fn conf(dir: &Path, http_body: &str) -> String {
    let d = dir.display();
    format!(
        "error_log {d}/error.log; pid {d}/nginx.pid; events {{ }}\nhttp {{ access_log off; client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3; uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;\n{http_body}\n}}\n"
    )
}

/// nginx's `[emerg]` for the file: (message, line), or None if `-t` passed.
fn nginx_says(dir: &Path, file: &Path) -> Option<(String, u32)> {
    let out = Command::new(nginx_bin())
        .arg("-t")
        .arg("-c")
        .arg(file)
        .arg("-p")
        .arg(dir)
        .output()
        .expect("run nginx -t");
    if out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains("[emerg]"))
        .unwrap_or_else(|| panic!("no [emerg] in: {text}"));
    let msg = line.split_once("[emerg] ").map_or(line, |(_, m)| m);
    // `NNN#NNN: MESSAGE in FILE:LINE`
    let msg = msg.split_once(": ").map_or(msg, |(_, m)| m);
    let at = format!(" in {}:", file.display());
    let (msg, n) = msg.rsplit_once(&at).expect("in FILE:LINE");
    Some((msg.to_string(), n.trim().parse().expect("line")))
}

/// vigil's refusal of the file: (message, line), or None if it loads.
fn vigil_says(file: &Path) -> Option<(String, u32)> {
    let e = match nginx::load_file(file, &literal_resolver) {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    let prefix = format!("{}:", file.display());
    let rest = e
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("no file:line:col in {e}"));
    let mut parts = rest.splitn(3, ':');
    let line = parts.next().and_then(|l| l.parse().ok()).expect("line");
    let _col = parts.next();
    let msg = parts.next().expect("message").trim_start().to_string();
    Some((msg, line))
}

/// Both refuse `http_body` with `expected` at the same line (or both accept it).
fn same_refusal(http_body: &str, expected: Option<&str>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("nginx.conf");
    std::fs::write(&file, conf(dir.path(), http_body)).expect("write");
    let theirs = nginx_says(dir.path(), &file);
    let ours = vigil_says(&file);
    assert_eq!(
        theirs.as_ref().map(|(m, _)| m.as_str()),
        expected,
        "nginx on: {http_body}"
    );
    assert_eq!(ours, theirs, "vigil and nginx on: {http_body}");
}

#[test]
fn listen_addresses_nginx_refuses() {
    for (body, msg) in [
        (
            "server { listen 99999; }",
            "invalid port in \"99999\" of the \"listen\" directive",
        ),
        (
            "server { listen 0; }",
            "invalid port in \"0\" of the \"listen\" directive",
        ),
        (
            "server { listen 127.0.0.1:0; }",
            "invalid port in \"127.0.0.1:0\" of the \"listen\" directive",
        ),
        (
            "server { listen 127.0.0.1:99999; }",
            "invalid port in \"127.0.0.1:99999\" of the \"listen\" directive",
        ),
        (
            "server { listen 127.0.0.1:80x; }",
            "invalid port in \"127.0.0.1:80x\" of the \"listen\" directive",
        ),
        (
            "server { listen 127.0.0.1:; }",
            "invalid port in \"127.0.0.1:\" of the \"listen\" directive",
        ),
        (
            "server { listen [::1]:0; }",
            "invalid port in \"[::1]:0\" of the \"listen\" directive",
        ),
        (
            "server { listen [::1; }",
            "invalid host in \"[::1\" of the \"listen\" directive",
        ),
        (
            "server { listen [::1]x; }",
            "invalid host in \"[::1]x\" of the \"listen\" directive",
        ),
        (
            "server { listen [zz]:18080; }",
            "invalid IPv6 address in \"[zz]:18080\" of the \"listen\" directive",
        ),
        (
            "server { listen :80; }",
            "no host in \":80\" of the \"listen\" directive",
        ),
    ] {
        same_refusal(body, Some(msg));
    }
    // And what both accept.
    for body in [
        "server { listen 127.0.0.1:0080; }",
        "server { listen *:18080; }",
        "server { listen [::1]:18080; }",
    ] {
        same_refusal(body, None);
    }
}

#[test]
fn duplicates_nginx_refuses() {
    for (body, msg) in [
        (
            "server { listen 127.0.0.1:18080; location /x { } location /x { } }",
            "duplicate location \"/x\"",
        ),
        (
            "server { listen 127.0.0.1:18080; location ^~ /x { } location /x { } }",
            "duplicate location \"/x\"",
        ),
        (
            "server { listen 127.0.0.1:18080; location = /x { } location = /x { } }",
            "duplicate location \"/x\"",
        ),
        (
            "server { listen 127.0.0.1:18080 default_server; }\nserver { listen 127.0.0.1:18080 default_server; }",
            "a duplicate default server for 127.0.0.1:18080",
        ),
        (
            "server { listen 18080 default_server; }\nserver { listen 0.0.0.0:18080 default; }",
            "a duplicate default server for 0.0.0.0:18080",
        ),
        (
            "server { listen 127.0.0.1:18080; listen 127.0.0.1:18080; }",
            "a duplicate listen 127.0.0.1:18080",
        ),
        (
            "server { listen [::1]:18080 reuseport; }\nserver { listen [::1]:18080 backlog=10; }",
            "duplicate listen options for [::1]:18080",
        ),
        (
            "server { listen 127.0.0.1:18080 default_server reuseport; }\nserver { listen 127.0.0.1:18080 default_server reuseport; }",
            "duplicate listen options for 127.0.0.1:18080",
        ),
    ] {
        same_refusal(body, Some(msg));
    }
    for body in [
        "server { listen 127.0.0.1:18080; location = /x { } location /x { } }",
        "server { listen 127.0.0.1:18080; }\nserver { listen 127.0.0.1:18080 default_server; }",
        "server { listen 127.0.0.1:18080 backlog=10; }\nserver { listen 127.0.0.1:18080; }",
        "server { listen 127.0.0.1:18081 default_server; listen 127.0.0.1:18082 default_server; }",
    ] {
        same_refusal(body, None);
    }
}

#[test]
fn upstream_addresses_nginx_refuses() {
    let listen = "server { listen 127.0.0.1:18080; }";
    for (servers, msg) in [
        (
            "server 127.0.0.1:0;",
            "invalid port in upstream \"127.0.0.1:0\"",
        ),
        (
            "server 127.0.0.1:99999;",
            "invalid port in upstream \"127.0.0.1:99999\"",
        ),
        (
            "server 127.0.0.1:;",
            "invalid port in upstream \"127.0.0.1:\"",
        ),
        (
            "server 127.0.0.1:+80;",
            "invalid port in upstream \"127.0.0.1:+80\"",
        ),
        ("server ::1;", "invalid port in upstream \"::1\""),
        ("server [::1]:0;", "invalid port in upstream \"[::1]:0\""),
        ("server [::1;", "invalid host in upstream \"[::1\""),
        (
            "server [zz]:80;",
            "invalid IPv6 address in upstream \"[zz]:80\"",
        ),
        ("server :80;", "no host in upstream \":80\""),
    ] {
        same_refusal(&format!("upstream u {{ {servers} }}\n{listen}"), Some(msg));
    }
    for (pass, msg) in [
        (
            "http://127.0.0.1:0",
            "invalid port in upstream \"127.0.0.1:0\"",
        ),
        (
            "http://127.0.0.1:99999/x",
            "invalid port in upstream \"127.0.0.1:99999/x\"",
        ),
        ("http://[::1]:0/x", "invalid port in upstream \"[::1]:0/x\""),
        ("http://u:0", "invalid port in upstream \"u:0\""),
        ("http://[::1", "invalid host in upstream \"[::1\""),
    ] {
        same_refusal(
            &format!("upstream u {{ server 127.0.0.1:1; }}\nserver {{ listen 127.0.0.1:18080; location / {{ proxy_pass {pass}; }} }}"),
            Some(msg),
        );
    }
    same_refusal(
        &format!("upstream u {{ server 127.0.0.1:0080; }}\n{listen}"),
        None,
    );
}

#[test]
fn header_buffers_nginx_refuses() {
    // nginx finds a size below connection_pool_size only when it merges
    // the levels, and names the end of the http block; vigil names the
    // directive itself.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("nginx.conf");
    let body = "server { listen 127.0.0.1:18080; large_client_header_buffers 4 511; }";
    std::fs::write(&file, conf(dir.path(), body)).expect("write");
    let msg = "the \"large_client_header_buffers\" size must be equal to or greater than \"connection_pool_size\"";
    assert_eq!(nginx_says(dir.path(), &file), Some((msg.to_string(), 4)));
    assert_eq!(vigil_says(&file), Some((msg.to_string(), 3)));
    for (body, msg) in [
        (
            "server { listen 127.0.0.1:18080; large_client_header_buffers 0 8k; }",
            "\"large_client_header_buffers\" directive invalid value",
        ),
        (
            "server { listen 127.0.0.1:18080; large_client_header_buffers 4 0; }",
            "\"large_client_header_buffers\" directive invalid value",
        ),
        (
            "server { listen 127.0.0.1:18080; large_client_header_buffers 4 8x; }",
            "\"large_client_header_buffers\" directive invalid value",
        ),
    ] {
        same_refusal(body, Some(msg));
    }
    same_refusal(
        "server { listen 127.0.0.1:18080; large_client_header_buffers 4 512; }",
        None,
    );
}

fn toml_err(src: &str) -> String {
    match toml::load_str(src, Path::new("vigil.toml"), &literal_resolver) {
        Ok(c) => panic!("expected a refusal, got {c:#?}\n{src}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_toml_front_end_refuses_the_same() {
    for (src, expected) in [
        (
            "[[server]]\nlisten = [99999]",
            "vigil.toml: server[0].listen[0]: invalid port in \"99999\"",
        ),
        (
            "[[server]]\nlisten = [\"[::1\"]",
            "vigil.toml: server[0].listen[0]: invalid host in \"[::1\"",
        ),
        (
            "[[server]]\nlisten = [{ addr = \"127.0.0.1:0\" }]",
            "vigil.toml: server[0].listen[0].addr: invalid port in \"127.0.0.1:0\"",
        ),
        (
            "[[server]]\nlisten = [\"127.0.0.1:8080\", \"127.0.0.1:8080\"]",
            "vigil.toml: server[0].listen[1]: a duplicate listen 127.0.0.1:8080",
        ),
        (
            "[[server]]\nlisten = [{ addr = \"127.0.0.1:8080\", default_server = true }]\n[[server]]\nlisten = [{ addr = \"127.0.0.1:8080\", default_server = true }]",
            "vigil.toml: server[1].listen[0]: a duplicate default server for 127.0.0.1:8080",
        ),
        (
            "[[server]]\nlisten = [{ addr = \"127.0.0.1:8080\", reuseport = true }]\n[[server]]\nlisten = [{ addr = \"127.0.0.1:8080\", backlog = 5 }]",
            "vigil.toml: server[1].listen[0]: duplicate listen options for 127.0.0.1:8080",
        ),
        (
            "[[server]]\n[[server.location]]\npath = \"/x\"\n[[server.location]]\npath = \"/x\"\nmatch = \"prefix_no_regex\"",
            "vigil.toml: server[0].location[1].path: duplicate location \"/x\"",
        ),
        (
            "[upstream.u]\nserver = [{ address = \"127.0.0.1:0\" }]",
            "vigil.toml: upstream.u.server[0].address: invalid port in \"127.0.0.1:0\"",
        ),
        (
            "[[server]]\n[[server.location]]\npath = \"/\"\nproxy_pass = \"http://127.0.0.1:0\"",
            "vigil.toml: server[0].location[0].proxy_pass: no upstream \"127.0.0.1:0\" is defined, and invalid port in \"127.0.0.1:0\"",
        ),
        (
            "[admin]\nlisten = \"127.0.0.1:99999\"",
            "vigil.toml: admin.listen: invalid port in \"127.0.0.1:99999\"",
        ),
    ] {
        assert_eq!(toml_err(src), expected, "{src}");
    }
    // An exact and a prefix location of one path may coexist, as in nginx.
    let ok = "[[server]]\n[[server.location]]\npath = \"/x\"\nmatch = \"exact\"\n[[server.location]]\npath = \"/x\"";
    assert!(toml::load_str(ok, Path::new("vigil.toml"), &literal_resolver).is_ok());
}

#[test]
fn log_formats_and_access_logs_nginx_refuses() {
    for (body, msg) in [
        (
            "log_format combined '$status';",
            "duplicate \"log_format\" name \"combined\"",
        ),
        (
            "log_format a '$status';\nlog_format a '$status';",
            "duplicate \"log_format\" name \"a\"",
        ),
        (
            "log_format a escape=xml '$status';",
            "unknown log format escaping \"xml\"",
        ),
        ("log_format a 'x $';", "invalid parameter \"$\""),
        (
            "log_format a '${status';",
            "the closing bracket in \"status\" variable is missing",
        ),
        (
            "server { listen 127.0.0.1:18080;\naccess_log x.log nope; }",
            "unknown log format \"nope\"",
        ),
        ("access_log off x;", "invalid parameter \"x\""),
        (
            "access_log x.log combined flush=1s;",
            "no buffer is defined for access_log \"x.log\"",
        ),
        (
            "access_log x.log combined buffer=0;",
            "invalid buffer size \"0\"",
        ),
        (
            "access_log x.log combined bogus;",
            "invalid parameter \"bogus\"",
        ),
        (
            "server { listen 127.0.0.1:18080;\nlog_format a '$status'; }",
            "\"log_format\" directive is not allowed here",
        ),
    ] {
        same_refusal(body, Some(msg));
    }
    for body in [
        "log_format main '$remote_addr - $remote_user [$time_local] \"$request\"' ' $status';\n\
         access_log x.log main buffer=32k flush=5s if=$arg_x;",
        "log_format MAIN escape=json '{\"s\":$status}';\nserver { listen 127.0.0.1:18080; access_log x.log main; }",
        "server { listen 127.0.0.1:18080; location / { access_log off; } }",
    ] {
        same_refusal(body, None);
    }
}

#[test]
fn gzip_settings_nginx_refuses() {
    for (body, msg) in [
        ("gzip_comp_level 0;", "value must be between 1 and 9"),
        (
            "gzip_comp_level x;",
            "\"gzip_comp_level\" directive invalid number",
        ),
        (
            "gzip_min_length 1x;",
            "\"gzip_min_length\" directive invalid value",
        ),
        ("gzip_http_version 2.0;", "invalid value \"2.0\""),
        ("gzip_proxied any bogus;", "invalid value \"bogus\""),
    ] {
        same_refusal(body, Some(msg));
    }
    for body in [
        "gzip on; gzip_types text/css application/json; gzip_types text/xml; gzip_vary on;\n\
         gzip_min_length 1k; gzip_comp_level 9; gzip_proxied expired no-cache no-store private auth;\n\
         gzip_http_version 1.0; gzip_disable \"msie6\"; gzip_buffers 16 8k;",
        "server { listen 127.0.0.1:18080; location / { gzip off; gzip_types *; } }",
        "gzip_proxied any any;",
    ] {
        same_refusal(body, None);
    }
}

#[test]
fn access_rules_and_real_ip_nginx_refuses() {
    for (body, msg) in [
        ("allow 10.0.0.256;", "invalid parameter \"10.0.0.256\""),
        ("deny 10.0.0.0/33;", "invalid parameter \"10.0.0.0/33\""),
        ("deny 10.0.0.0/;", "invalid parameter \"10.0.0.0/\""),
        (
            "server { listen 127.0.0.1:18080;\ndeny all x; }",
            "invalid number of arguments in \"deny\" directive",
        ),
        (
            "set_real_ip_from;",
            "invalid number of arguments in \"set_real_ip_from\" directive",
        ),
    ] {
        same_refusal(body, Some(msg));
    }
    for body in [
        "allow 10.1.1.0/16; allow 2001:db8::/32; deny unix:; deny all;",
        "set_real_ip_from 10.0.0.0/8; set_real_ip_from ::1; set_real_ip_from unix:;\n\
         real_ip_header CF-Connecting-IP; real_ip_recursive on;",
        "server { listen 127.0.0.1:18080; location / { allow 127.0.0.1; deny all;\n\
         set_real_ip_from 127.0.0.1; real_ip_header X-Forwarded-For; } }",
    ] {
        same_refusal(body, None);
    }
}

#[test]
fn proxy_redirect_forms_nginx_refuses() {
    for (body, msg) in [
        (
            "server { listen 127.0.0.1:18080;\nproxy_redirect foo; }",
            "invalid parameter \"foo\"",
        ),
        (
            "server { listen 127.0.0.1:18080;\nproxy_redirect off; proxy_redirect http://a/ /; }",
            "\"proxy_redirect\" directive is duplicate",
        ),
        (
            "server { listen 127.0.0.1:18080;\nproxy_redirect http://a/ /; proxy_redirect off; }",
            "\"proxy_redirect\" directive is duplicate",
        ),
    ] {
        same_refusal(body, Some(msg));
    }
    same_refusal(
        "server { listen 127.0.0.1:18080; proxy_redirect http://a/ /b/; proxy_redirect http://c/ $scheme://$host/;\n\
         proxy_hide_header X-Powered-By; proxy_pass_header Server;\n\
         location / { proxy_pass http://127.0.0.1:9/x/; proxy_redirect default; proxy_redirect off_not http://z/; } }",
        None,
    );
}

#[test]
fn limits_nginx_refuses() {
    let z = "limit_req_zone $binary_remote_addr zone=one:1m rate=1r/s; limit_conn_zone $binary_remote_addr zone=c:1m;";
    for (body, msg) in [
        (
            "limit_req_zone $binary_remote_addr zone=one:10m rate=1r/s sync;".to_string(),
            "invalid number of arguments in \"limit_req_zone\" directive",
        ),
        (
            "limit_req_zone $binary_remote_addr zone=one:10m rate=1r/h;".to_string(),
            "invalid rate \"rate=1r/h\"",
        ),
        (
            "limit_req_zone $binary_remote_addr zone=one:10m rate=0r/m;".to_string(),
            "invalid rate \"rate=0r/m\"",
        ),
        (
            "limit_req_zone $binary_remote_addr zone=one:16k rate=1r/s;".to_string(),
            "zone \"zone=one:16k\" is too small",
        ),
        (
            "limit_req_zone $binary_remote_addr zone=one rate=1r/s;".to_string(),
            "invalid zone size \"zone=one\"",
        ),
        (
            "limit_req_zone $binary_remote_addr zone=one:1g rate=1r/s;".to_string(),
            "invalid zone size \"zone=one:1g\"",
        ),
        (
            "limit_req_zone $binary_remote_addr zone=:1m rate=1r/s;".to_string(),
            "\"limit_req_zone\" must have \"zone\" parameter",
        ),
        (
            "limit_req_zone $binary_remote_addr rate=1r/s x;".to_string(),
            "invalid parameter \"x\"",
        ),
        (
            format!("{z} limit_req_zone $remote_addr zone=one:1m rate=1r/s;"),
            "limit_req_zone \"one\" is already bound to key \"$binary_remote_addr\"",
        ),
        (
            format!("{z} limit_conn_zone $remote_addr zone=one:1m;"),
            "the shared memory zone \"one\" is already declared for a different use",
        ),
        (
            "server { limit_req_zone $binary_remote_addr zone=one:1m rate=1r/s; }".to_string(),
            "\"limit_req_zone\" directive is not allowed here",
        ),
        (
            format!("{z} limit_req zone=one; limit_req zone=one;"),
            "\"limit_req\" directive is duplicate",
        ),
        (
            format!("{z} limit_req zone=one burst=0;"),
            "invalid burst value \"burst=0\"",
        ),
        (
            format!("{z} limit_req zone=one delay=x;"),
            "invalid delay value \"delay=x\"",
        ),
        (
            format!("{z} limit_req zone=one burst=5 nodelay delay=2;"),
            "invalid number of arguments in \"limit_req\" directive",
        ),
        (
            format!("{z} limit_req burst=3;"),
            "\"limit_req\" must have \"zone\" parameter",
        ),
        (
            format!("{z} limit_req zone=one foo;"),
            "invalid parameter \"foo\"",
        ),
        (
            format!("{z} limit_req_status 399;"),
            "value must be between 400 and 599",
        ),
        (
            format!("{z} limit_conn_log_level debug;"),
            "invalid value \"debug\"",
        ),
        (
            format!("{z} limit_req_dry_run yes;"),
            "invalid value \"yes\" in \"limit_req_dry_run\" directive, it must be \"on\" or \"off\"",
        ),
        (
            format!("{z} limit_conn c 0;"),
            "invalid number of connections \"0\"",
        ),
        (
            format!("{z} limit_conn c 65536;"),
            "connection limit must be less 65536",
        ),
    ] {
        same_refusal(&body, Some(msg));
    }
    for body in [
        format!("{z} limit_req zone=one burst=5 delay=2; limit_req_log_level info; limit_conn c 10; server {{ limit_req_status 429; location / {{ limit_conn_dry_run on; return 204; }} }}"),
        "limit_req zone=later; limit_req_zone $binary_remote_addr zone=later:1m rate=5;".to_string(),
    ] {
        same_refusal(&body, None);
    }
    // An undeclared zone: nginx says so when it binds the shared memory
    // (no line); vigil at the directive that names it.
    for body in [
        "server { location / { limit_req zone=none; return 204; } }",
        "server { limit_conn none 1; }",
    ] {
        let e = nginx::load_str(
            &format!("http {{ {body} }}"),
            Path::new("nginx.conf"),
            Path::new("."),
            &literal_resolver,
        )
        .expect_err("refused");
        assert!(
            e.to_string()
                .ends_with("zero size shared memory zone \"none\""),
            "{e}"
        );
    }
    let e = nginx::load_str(
        &format!("http {{ {z} limit_conn one 1; }}"),
        Path::new("nginx.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect_err("refused");
    assert!(
        e.to_string()
            .contains("already declared for a different use"),
        "{e}"
    );
}
