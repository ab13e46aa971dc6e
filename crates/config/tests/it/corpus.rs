//! The nginx.conf corpus (tests/data/confs: Debian's stock files and
//! typical public examples) through the lenient front end and lint: no
//! panic, every refused directive in one run, the strict error is the
//! first lenient refusal, and a conf without refusals gives the same model
//! in both modes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use vigil_config::lint::{lint_loaded, Finding, Severity};
use vigil_config::nginx::syntax::{self, Directive, Includes};
use vigil_config::nginx::{self, Loaded, Mode};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/confs")
}

/// `*.example.com` names resolve without the network (`srvN` to 127.0.0.N).
fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(v) = vigil_config::literal_resolver(host, port) {
        return Ok(v);
    }
    host.strip_prefix("srv")
        .and_then(|h| h.strip_suffix(".example.com"))
        .and_then(|n| n.parse::<u8>().ok())
        .map(|n| vec![SocketAddr::from(([127, 0, 0, n], port))])
        .ok_or_else(|| std::io::ErrorKind::NotFound.into())
}

/// The conf as /etc/nginx/nginx.conf, its includes from the corpus.
fn parse(name: &str) -> Vec<Directive> {
    let d = dir().join("debian");
    let read = |p: &Path| std::fs::read_to_string(p).expect("corpus file");
    let mut files = BTreeMap::new();
    for f in ["mime.types", "fastcgi_params", "proxy_params"] {
        files.insert(PathBuf::from("/etc/nginx").join(f), read(&d.join(f)));
    }
    files.insert(
        PathBuf::from("/etc/nginx/sites-enabled/default"),
        read(&d.join("sites-available/default")),
    );
    syntax::parse_str_with(
        &read(&dir().join(name)),
        Path::new("/etc/nginx/nginx.conf"),
        Path::new("/etc/nginx"),
        Includes::Memory(&files),
    )
    .expect("corpus confs parse")
}

/// Lenient and strict loads of `name`, checked against each other.
fn load(name: &str) -> Loaded {
    let tree = parse(name);
    let lenient = nginx::build_with(&tree, &resolve, Mode::Lenient).expect("lenient never fails");
    match (nginx::build(&tree, &resolve), lenient.refusals.first()) {
        (Ok(strict), None) => {
            assert_eq!(strict.config, lenient.config, "{name}: models differ");
            assert_eq!(strict.sources, lenient.sources, "{name}: sources differ");
            assert_eq!(strict.ignored, lenient.ignored, "{name}");
        }
        (Err(e), Some(first)) => assert_eq!(e.to_string(), first.to_string(), "{name}"),
        (strict, first) => panic!("{name}: strict {strict:?}, first lenient refusal {first:?}"),
    }
    lenient
}

/// The refused directives (or parameters) as `line: word`.
fn refused(loaded: &Loaded) -> Vec<String> {
    loaded
        .refusals
        .iter()
        .map(|e| {
            let s = e.to_string();
            let mut parts = s.splitn(4, ':');
            let file = parts.next().unwrap_or_default();
            let file = Path::new(file)
                .file_name()
                .unwrap_or_default()
                .to_string_lossy();
            let line = parts.next().unwrap_or_default();
            let what = if s.contains("regular-expression locations") {
                "regex location".to_string()
            } else {
                s.split('"').nth(1).unwrap_or(&s).to_string()
            };
            let file = if file == "nginx.conf" {
                String::new()
            } else {
                format!("{file}:")
            };
            format!("{file}{line}: {what}")
        })
        .collect()
}

fn codes(found: &[Finding]) -> Vec<&'static str> {
    found
        .iter()
        .filter(|f| !f.serve_only)
        .map(|f| f.code)
        .collect()
}

#[test]
fn debian_stock_conf_is_read_whole() {
    // Before: refused at its first `gzip on;`, nothing else said (gzip is
    // served now).
    let loaded = load("debian/nginx.conf");
    // Static files are served now: nothing refused.
    assert_eq!(refused(&loaded), Vec::<String>::new());
    // The default site's server is modelled (its listens, no location
    // left that proxies).
    assert_eq!(loaded.config.servers.len(), 1);
    assert_eq!(loaded.config.servers[0].listen.len(), 2);
    let found = lint_loaded(&loaded);
    assert!(codes(&found).is_empty(), "{found:#?}");
    let ignored = found
        .iter()
        .filter(|f| f.code == "ignored-directive")
        .count();
    // ssl_protocols and ssl_prefer_server_ciphers are served now, and
    // `types` (its include mime.types).
    assert_eq!(ignored, 8, "{found:#?}");
    assert!(found
        .iter()
        .all(|f| f.severity == Severity::Error || f.severity == Severity::Info));
    assert!(found
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .all(|f| f.serve_only));
}

#[test]
fn tls_reverse_proxy_gets_every_refusal_and_its_traps_in_one_run() {
    let loaded = load("tls_reverse_proxy.conf");
    // `expires` in its proxied asset location is served now.
    assert_eq!(refused(&loaded), Vec::<String>::new());
    // The TLS server keeps its listen addresses, with `ssl`.
    let ports: Vec<(u16, bool)> = loaded.config.servers[1]
        .listen
        .iter()
        .map(|l| (l.addr.port(), l.ssl))
        .collect();
    assert_eq!(ports, [(443, true), (443, true)]);
    // The regex location is served (and linted) as one.
    assert!(loaded.config.servers[1]
        .locations
        .iter()
        .any(|l| l.matcher == vigil_core::config::LocationMatch::RegexCaseless));
    let found = lint_loaded(&loaded);
    assert_eq!(
        codes(&found),
        [
            "keepalive-is-not-a-cap",
            "fail-timeout-vs-read-timeout",
            "inherited-headers-dropped",
            "next-upstream-4xx",
            "inherited-headers-dropped",
            "fail-timeout-vs-read-timeout",
        ],
        "{found:#?}"
    );
    // 120s / 10s is info; the websocket location's 3600s is the warning,
    // at the directive that sets it.
    let ft: Vec<&Finding> = found
        .iter()
        .filter(|f| f.code == "fail-timeout-vs-read-timeout")
        .collect();
    assert_eq!(ft[0].severity, Severity::Info);
    assert_eq!(ft[1].severity, Severity::Warning);
    assert_eq!(ft[1].at, "/etc/nginx/nginx.conf:80:13");
    // Each location's own proxy_set_header drops the server's: `/` sets
    // Host again itself, `/ws/` loses all four (X-Forwarded-For too).
    let dropped: Vec<&str> = found
        .iter()
        .filter(|f| f.code == "inherited-headers-dropped")
        .map(|f| f.title.as_str())
        .collect();
    assert!(
        dropped[0].contains("drops 3 ") && !dropped[0].contains("Host ("),
        "{dropped:?}"
    );
    assert!(
        dropped[1].contains("drops 4 ") && dropped[1].contains("X-Forwarded-For ("),
        "{dropped:?}"
    );
}

#[test]
fn wordpress_is_all_refusals() {
    let loaded = load("wordpress.conf");
    let r = refused(&loaded);
    // 2 in the file (its regex locations, `deny` and static files are
    // served now), 21 fastcgi_param lines of the included fastcgi_params.
    assert_eq!(r.len(), 23, "{r:#?}");
    assert_eq!(
        r.iter()
            .filter(|x| x.starts_with("fastcgi_params:"))
            .count(),
        21
    );
    // Its static files (root, index, try_files, expires, log_not_found)
    // are served now; FastCGI is not.
    for word in ["fastcgi_pass", "fastcgi_param"] {
        assert!(
            r.iter().any(|x| x.ends_with(&format!(": {word}"))),
            "{word}: {r:#?}"
        );
    }
    assert!(codes(&lint_loaded(&loaded)).is_empty());
}

#[test]
fn reverse_proxy_confs_load_under_serve_as_they_are() {
    for name in ["load_balancing.conf", "app_proxy.conf"] {
        let loaded = load(name);
        assert!(loaded.refusals.is_empty(), "{name}: {:#?}", loaded.refusals);
        let found = lint_loaded(&loaded);
        assert!(found
            .iter()
            .all(|f| !f.serve_only || f.code == "ignored-directive"));
    }
    // nginx's load-balancing example, three servers at nginx's defaults:
    // fail_timeout against proxy_read_timeout is info (6x); retries are
    // unbounded (3 × the default 60s connect and read timeouts), at each
    // proxy_pass; ip_hash has the same trap.
    let found = lint_loaded(&load("load_balancing.conf"));
    let traps: Vec<(&str, Severity)> = found
        .iter()
        .filter(|f| !f.serve_only)
        .map(|f| (f.code, f.severity))
        .collect();
    let info = ("fail-timeout-vs-read-timeout", Severity::Info);
    let unbounded = ("retries-unbounded", Severity::Warning);
    assert_eq!(
        traps,
        [info, info, info, info, unbounded, unbounded, unbounded, unbounded],
        "{found:#?}"
    );
    // The application proxy's traps, each at its directive.
    let found = lint_loaded(&load("app_proxy.conf"));
    let at = |code: &str| {
        found
            .iter()
            .find(|f| f.code == code)
            .map(|f| f.at.clone())
            .unwrap_or_default()
    };
    assert_eq!(at("next-upstream-4xx"), "/etc/nginx/nginx.conf:39:65");
    assert_eq!(
        at("no-buffering-with-retries"),
        "/etc/nginx/nginx.conf:44:13"
    );
    assert_eq!(
        at("fail-timeout-vs-read-timeout"),
        "/etc/nginx/nginx.conf:16:43"
    );
    assert_eq!(at("keepalive-is-not-a-cap"), "/etc/nginx/nginx.conf:18:9");
}

#[test]
fn lenient_refusals_start_with_the_strict_error_for_every_prefix_of_a_conf() {
    // Cut the TLS conf after each line that closes a directive: whatever
    // parses, strict's error is lenient's first refusal (checked in load).
    let text = std::fs::read_to_string(dir().join("tls_reverse_proxy.conf")).expect("conf");
    let mut files = BTreeMap::new();
    files.insert(
        PathBuf::from("/etc/nginx/mime.types"),
        std::fs::read_to_string(dir().join("debian/mime.types")).expect("mime.types"),
    );
    let lines: Vec<&str> = text.lines().collect();
    let mut checked = 0;
    for n in 1..=lines.len() {
        let mut cut = lines[..n].join("\n");
        let open = cut
            .matches('{')
            .count()
            .saturating_sub(cut.matches('}').count());
        cut.push_str(&"\n}".repeat(open));
        let Ok(tree) = syntax::parse_str_with(
            &cut,
            Path::new("t.conf"),
            Path::new("/etc/nginx"),
            Includes::Memory(&files),
        ) else {
            continue;
        };
        let lenient = nginx::build_with(&tree, &resolve, Mode::Lenient).expect("lenient");
        match nginx::build(&tree, &resolve) {
            Ok(strict) => {
                assert!(lenient.refusals.is_empty(), "{cut}");
                assert_eq!(strict.config, lenient.config, "{cut}");
            }
            Err(e) => assert_eq!(
                Some(e.to_string()),
                lenient.refusals.first().map(ToString::to_string),
                "{cut}"
            ),
        }
        checked += 1;
    }
    assert!(checked > 40, "{checked}");
}

#[test]
fn debians_modules_enabled_load_module_lines_are_accepted_and_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("modules-enabled")).expect("mkdir");
    std::fs::write(
        dir.path().join("modules-enabled/50-mod-stream.conf"),
        "load_module modules/ngx_stream_module.so;\n",
    )
    .expect("write");
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        "include modules-enabled/*.conf;\nevents {}\nhttp { server { listen 127.0.0.1:8080; location / { return 200; } } }\n",
    )
    .expect("write");
    let loaded = vigil_config::nginx::load_file(&conf, &vigil_config::literal_resolver)
        .expect("Debian's layout loads");
    assert!(loaded.ignored.iter().any(|(n, _)| n == "load_module"));
    // What the module adds is still refused where it is used.
    std::fs::write(
        &conf,
        "load_module modules/ngx_stream_module.so;\nstream { }\n",
    )
    .expect("write");
    let e = vigil_config::nginx::load_file(&conf, &vigil_config::literal_resolver)
        .expect_err("stream is refused");
    assert!(e.to_string().contains("\"stream\""), "{e}");
    std::fs::write(&conf, "load_module;\n").expect("write");
    assert!(vigil_config::nginx::load_file(&conf, &vigil_config::literal_resolver).is_err());
}
