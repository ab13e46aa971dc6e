//! `vigil lint` against `vigil serve`'s own startup: for every conf of the
//! corpus (crates/config/tests/data/confs) and a few more, each error that
//! serve's startup stops at, round after round as an operator would fix
//! them one at a time, is among the findings of one `vigil lint --for
//! serve` run. And the report formats.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vigil_config::lint::{Finding, Severity};
use vigil_config::nginx::syntax::{self, Directive, Includes};
use vigil_config::nginx::{self, Mode};
use vigil_config::ConfigError;
use vigil_core::event::EventBus;

use super::{for_audience, lint_nginx, long_report, short_line, Audience};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/tests/data/confs")
}

/// Names resolve without the network: `*.example.com` to 127.0.0.N.
fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(v) = vigil_config::literal_resolver(host, port) {
        return Ok(v);
    }
    match host
        .strip_prefix("srv")
        .and_then(|h| h.strip_suffix(".example.com"))
    {
        Some(n) => {
            let n: u8 = n.parse().map_err(|_| std::io::ErrorKind::NotFound)?;
            Ok(vec![SocketAddr::from(([127, 0, 0, n], port))])
        }
        None => Err(std::io::ErrorKind::NotFound.into()),
    }
}

/// The files a conf in /etc/nginx includes, from the corpus.
fn includes() -> BTreeMap<PathBuf, String> {
    let d = corpus_dir().join("debian");
    let read = |p: &str| std::fs::read_to_string(d.join(p)).expect("corpus file");
    let mut m = BTreeMap::new();
    for f in ["mime.types", "fastcgi_params", "proxy_params"] {
        m.insert(PathBuf::from("/etc/nginx").join(f), read(f));
    }
    m.insert(
        PathBuf::from("/etc/nginx/sites-enabled/default"),
        read("sites-available/default"),
    );
    m
}

fn parse(text: &str, files: &BTreeMap<PathBuf, String>) -> Vec<Directive> {
    syntax::parse_str_with(
        text,
        Path::new("/etc/nginx/nginx.conf"),
        Path::new("/etc/nginx"),
        Includes::Memory(files),
    )
    .expect("corpus confs parse")
}

/// `vigil lint --for serve` on the parsed tree.
fn lint_for_serve(tree: &[Directive]) -> Vec<Finding> {
    let loaded = nginx::build_with(tree, &resolve, Mode::Lenient).expect("lenient never fails");
    for_audience(lint_nginx(&loaded), Audience::Serve, false)
}

/// Removes the directive at `at` (its name or one of its arguments).
fn remove_at(tree: &mut Vec<Directive>, at: &str) -> bool {
    if let Some(i) = tree
        .iter()
        .position(|d| d.span.to_string() == at || d.args.iter().any(|a| a.span.to_string() == at))
    {
        tree.remove(i);
        return true;
    }
    tree.iter_mut()
        .filter_map(|d| d.block.as_mut())
        .any(|b| remove_at(b, at))
}

/// Removes every directive with an argument that names `$var`.
fn remove_var(tree: &mut Vec<Directive>, var: &str) -> bool {
    let names = |d: &Directive| {
        d.args.iter().any(|a| {
            a.value.match_indices(var).any(|(i, _)| {
                !a.value[i + var.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
        })
    };
    let before = tree.len();
    tree.retain(|d| !names(d));
    let mut removed = tree.len() != before;
    for b in tree.iter_mut().filter_map(|d| d.block.as_mut()) {
        removed |= remove_var(b, var);
    }
    removed
}

/// One serve startup error: where, what, and whether it comes from the
/// front end (else from compiling the routes).
struct Stop {
    at: String,
    message: String,
    front_end: bool,
}

/// `vigil serve`'s startup on `tree`, up to the listeners: the nginx front
/// end (strict), the listen check, and the generation build (registry,
/// routes). None when it would start.
fn serve_stops_at(tree: &[Directive], logs: &Path) -> Option<Stop> {
    let mut loaded = match nginx::build(tree, &resolve) {
        Ok(l) => l,
        Err(ConfigError::Invalid { at, message }) => {
            return Some(Stop {
                at,
                message,
                front_end: true,
            })
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    };
    if vigil_proxy::worker::listens(&loaded.config).is_empty() {
        return Some(Stop {
            at: String::new(),
            message: "no server block with a listen address".into(),
            front_end: false,
        });
    }
    // Certificate files, like log files, are the machine's: lint reports
    // the missing ones (as `nginx -t` does) and serve starts here with a
    // stand-in pair.
    let (cert, key) = (logs.join("cert.pem"), logs.join("key.pem"));
    if !cert.exists() {
        let key_pair = rcgen::KeyPair::generate().expect("key");
        let made = rcgen::CertificateParams::new(vec!["example.com".to_string()])
            .expect("params")
            .self_signed(&key_pair)
            .expect("cert");
        std::fs::write(&cert, made.pem()).expect("write cert");
        std::fs::write(&key, key_pair.serialize_pem()).expect("write key");
    }
    for s in &mut loaded.config.servers {
        for pair in &mut s.tls.certificates {
            pair.certificate = cert.clone();
            pair.key = key.clone();
        }
    }
    // Opening the access logs is the environment's business, not the conf's.
    for s in &mut loaded.config.servers {
        for l in &mut s.locations {
            if let Some(a) = &mut l.proxy.access_log {
                a.path = logs.join("access.log");
            }
        }
    }
    let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_net::SystemClock::new());
    match vigil_proxy::Generation::build(loaded.config, None, Arc::new(EventBus::default()), clock)
    {
        Ok(_) => None,
        Err(e) => Some(Stop {
            at: e.at,
            message: e.message,
            front_end: false,
        }),
    }
}

/// Fix serve's errors one at a time (remove what it stopped at) and check
/// each against one lint run of the original file. Returns the errors.
fn serve_errors_are_linted(name: &str, text: &str) -> Vec<String> {
    let files = includes();
    let original = parse(text, &files);
    let linted = lint_for_serve(&original);
    let logs = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let mut tree = original.clone();
    let mut stops = Vec::new();
    for _round in 0..200 {
        let Some(stop) = serve_stops_at(&tree, logs.path()) else {
            break;
        };
        let found = linted.iter().any(|f| {
            f.severity == Severity::Error
                && if stop.front_end {
                    f.at == stop.at && f.title == stop.message
                } else if stop.at.is_empty() {
                    f.code == "no-server-block"
                } else {
                    f.title.contains(&stop.message)
                }
        });
        assert!(
            found,
            "{name}: serve stops at {}: {}, which lint does not report; lint said:\n{}",
            stop.at,
            stop.message,
            linted
                .iter()
                .map(|f| short_line(f, name))
                .collect::<Vec<_>>()
                .join("\n")
        );
        stops.push(format!("{}: {}", stop.at, stop.message));
        if stop.at.is_empty() {
            break;
        }
        // (`unknown variable "$x"`, also after what it is in: `proxy_redirect: `.)
        let var = stop
            .message
            .split_once("unknown variable \"")
            .and_then(|(_, v)| v.split_once('"'))
            .map(|(v, _)| v);
        let removed = match var {
            Some(v) if !stop.front_end => remove_var(&mut tree, v),
            _ => remove_at(&mut tree, &stop.at),
        };
        assert!(removed, "{name}: nothing at {} to remove", stop.at);
    }
    stops
}

fn corpus(name: &str) -> String {
    std::fs::read_to_string(corpus_dir().join(name)).expect("corpus conf")
}

#[test]
fn serve_startup_errors_are_among_the_lint_findings_for_the_corpus() {
    // The rounds of edit-and-restart that one lint run replaces (the
    // reverse-proxy confs start at once).
    for (name, rounds) in [
        // Its static files (root, index, try_files) are served now.
        ("debian/nginx.conf", 0),
        // TLS, `map`, gzip, allow/deny, the regex location and `expires`
        // are served now.
        ("tls_reverse_proxy.conf", 0),
        // Its regex locations and `deny` are served now, so each
        // fastcgi_param in them is a round of its own (before, removing the
        // location took them all); its static files are served.
        ("wordpress.conf", 23),
        ("load_balancing.conf", 0),
        ("app_proxy.conf", 0),
    ] {
        let stops = serve_errors_are_linted(name, &corpus(name));
        assert_eq!(stops.len(), rounds, "{name}: {stops:#?}");
    }
}

#[test]
fn serve_startup_errors_of_routes_and_values_are_linted() {
    for (name, text) in [
        (
            "variables",
            "http { server { listen 127.0.0.1:8080;\n proxy_set_header X-Id $geoip_country_code;\n location / { add_header X-C $geoip_city; proxy_pass http://127.0.0.1:9; }\n location /b { proxy_set_header Bad\\ Name v; proxy_pass http://127.0.0.1:9; } } }",
        ),
        (
            "hash key",
            "http { upstream u { hash $geoip_country_code; server 127.0.0.1:9; server 127.0.0.2:9; }\n server { listen 127.0.0.1:8080; location / { proxy_pass http://u; } } }",
        ),
        (
            "default servers",
            "http { server { listen 127.0.0.1:8080 default_server; location / { proxy_pass http://127.0.0.1:9; } }\n server { listen 127.0.0.1:8080 default_server; location / { proxy_pass http://127.0.0.1:9; } } }",
        ),
        ("upstreams only", "upstream u { server 127.0.0.1:9; }"),
        (
            "log variables",
            "http { server { listen 127.0.0.1:8080;\n access_log /dev/null if=$request_length;\n location / { proxy_pass http://127.0.0.1:9; } } }",
        ),
        (
            "a set variable in proxy_redirect",
            "http { server { listen 127.0.0.1:8080;\n location / { set $r http://x/; proxy_pass http://127.0.0.1:9;\n proxy_redirect http://127.0.0.1:9/ $r; } } }",
        ),
        (
            "contexts and values",
            "http { client_header_timeout 5s; server { listen 127.0.0.1:8080;\n location / { client_header_timeout 5s; proxy_read_timeout 5x; proxy_pass http://127.0.0.1:9; }\n location ~ ^/re { proxy_pass http://127.0.0.1:9; location /in { } } } }",
        ),
    ] {
        let stops = serve_errors_are_linted(name, text);
        assert!(!stops.is_empty(), "{name}: serve should not start");
    }
}

#[test]
fn an_unknown_variable_is_reported_at_its_argument_once() {
    let text = "http {\n    proxy_set_header X-Id $geoip_country_code;\n    server {\n        listen 127.0.0.1:8080;\n        location /a { proxy_pass http://127.0.0.1:9; }\n        location /b { proxy_pass http://127.0.0.1:9; }\n    }\n}\n";
    let found = lint_for_serve(&parse(text, &BTreeMap::new()));
    let hits: Vec<&Finding> = found
        .iter()
        .filter(|f| f.code == "unsupported-variable")
        .collect();
    assert_eq!(hits.len(), 1, "{found:#?}");
    assert_eq!(hits[0].at, "/etc/nginx/nginx.conf:2:27");
    assert!(
        hits[0].title.contains("$geoip_country_code"),
        "{}",
        hits[0].title
    );
}

#[test]
fn map_set_and_capture_variables_are_known_and_return_texts_are_checked() {
    let known = "http {\n    map $http_upgrade $conn { default upgrade; \"\" close; }\n    server {\n        listen 127.0.0.1:8080;\n        server_name \"~^(?!www)(?<sub>[a-z]+)\\.t$\";\n        set $who w;\n        location ~ ^/(?<name>\\w+) { return 200 \"$conn $who $name $1 $sub\"; }\n        location / { proxy_set_header Connection $conn; proxy_pass http://127.0.0.1:9; }\n    }\n}\n";
    let found = lint_for_serve(&parse(known, &BTreeMap::new()));
    assert!(
        found.iter().all(|f| f.code != "unsupported-variable"),
        "{found:#?}"
    );
    let unknown = "http {\n    server {\n        listen 127.0.0.1:8080;\n        location /a { return 200 \"$geoip_city\"; }\n        location /b { rewrite ^ /c$geoip_x; }\n    }\n}\n";
    let found = lint_for_serve(&parse(unknown, &BTreeMap::new()));
    let hits: Vec<&str> = found
        .iter()
        .filter(|f| f.code == "unsupported-variable")
        .map(|f| f.title.as_str())
        .collect();
    assert_eq!(hits.len(), 2, "{found:#?}");
    assert!(
        hits[0].contains("$geoip_city") && hits[0].contains("return"),
        "{hits:?}"
    );
    assert!(
        hits[1].contains("$geoip_x") && hits[1].contains("rewrite"),
        "{hits:?}"
    );
}

#[test]
fn audiences_change_only_serve_refusals() {
    let text = corpus("tls_reverse_proxy.conf");
    let files = includes();
    let loaded =
        nginx::build_with(&parse(&text, &files), &resolve, Mode::Lenient).expect("lenient");
    let all = lint_nginx(&loaded);
    let nginx = for_audience(all.clone(), Audience::Nginx, false);
    let serve = for_audience(all.clone(), Audience::Serve, false);
    let hidden = for_audience(all.clone(), Audience::Nginx, true);
    assert_eq!(nginx.len(), all.len());
    for (n, s) in nginx.iter().zip(&serve) {
        assert_eq!(n.code, s.code);
        if n.serve_only && n.code != "ignored-directive" {
            assert_eq!(n.severity, Severity::Info, "{n:?}");
            assert_eq!(s.severity, Severity::Error, "{s:?}");
        } else {
            assert_eq!(n.severity, s.severity, "{n:?}");
        }
    }
    assert!(hidden.iter().all(|f| !f.serve_only));
    assert!(hidden.len() < nginx.len());
    // The traps under nginx are still found: http_404 retried, at the word.
    let f = hidden
        .iter()
        .find(|f| f.code == "next-upstream-4xx")
        .expect("next-upstream-4xx");
    let line = text
        .lines()
        .position(|l| l.contains("http_404"))
        .expect("line")
        + 1;
    let col = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.find("http_404"))
        .expect("col")
        + 1;
    assert_eq!(f.at, format!("/etc/nginx/nginx.conf:{line}:{col}"));
}

#[test]
fn the_long_report_groups_repeated_findings_and_the_short_one_does_not() {
    let text = corpus("wordpress.conf");
    let files = includes();
    let loaded =
        nginx::build_with(&parse(&text, &files), &resolve, Mode::Lenient).expect("lenient");
    let found = for_audience(lint_nginx(&loaded), Audience::Nginx, false);
    let refusals = found
        .iter()
        .filter(|f| f.code == "unsupported-directive")
        .count();
    assert!(refusals > 3, "{found:#?}");
    let long = long_report(&found, "wordpress.conf", Audience::Nginx);
    // One paragraph for all of them, with each place.
    assert_eq!(
        long.matches("vigil serve refuses a directive or parameter")
            .count(),
        1,
        "{long}"
    );
    assert!(
        long.contains(&format!("info[unsupported-directive], {refusals} places:")),
        "{long}"
    );
    assert!(long.contains("--- vigil serve:"), "{long}");
    let short: Vec<String> = found.iter().map(|f| short_line(f, "w")).collect();
    assert_eq!(short.len(), found.len());
    for (line, f) in short.iter().zip(&found) {
        assert_eq!(
            line,
            &format!("{}: {}[{}]: {}", f.at, f.severity, f.code, f.title)
        );
    }
}

#[test]
fn unreadable_files_are_exit_2_and_syntax_errors_are_findings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.conf");
    assert!(super::collect(&missing, super::Kind::Nginx).is_err());
    let includes = dir.path().join("includes.conf");
    std::fs::write(&includes, "http { include nowhere.conf; }\n").expect("write");
    assert!(super::collect(&includes, super::Kind::Nginx).is_err());
    let broken = dir.path().join("broken.conf");
    std::fs::write(&broken, "http { server {\n").expect("write");
    let found = super::collect(&broken, super::Kind::Nginx).expect("a finding");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].code, "syntax-error");
    assert_eq!(super::exit_code(&found), std::process::ExitCode::from(1));
    // Info only: 0.
    let fine = dir.path().join("fine.conf");
    std::fs::write(
        &fine,
        "worker_processes 1;\nhttp { server { listen 127.0.0.1:8080; location / { proxy_pass http://127.0.0.1:9; } } }\n",
    )
    .expect("write");
    let found = super::collect(&fine, super::Kind::Nginx).expect("findings");
    assert!(
        found.iter().all(|f| f.severity == Severity::Info),
        "{found:#?}"
    );
    assert!(!found.is_empty());
    assert_eq!(super::exit_code(&found), std::process::ExitCode::SUCCESS);
    // A refusal is info for nginx (exit 0), an error for serve (exit 1).
    let gz = dir.path().join("root.conf");
    std::fs::write(
        &gz,
        "http { server { listen 127.0.0.1:8080; location / { proxy_pass http://127.0.0.1:9; } location /php { fastcgi_pass 127.0.0.1:9; } } }\n",
    )
    .expect("write");
    let found = super::collect(&gz, super::Kind::Nginx).expect("findings");
    let nginx = for_audience(found.clone(), Audience::Nginx, false);
    let serve = for_audience(found, Audience::Serve, false);
    assert_eq!(super::exit_code(&nginx), std::process::ExitCode::SUCCESS);
    assert_eq!(super::exit_code(&serve), std::process::ExitCode::from(1));
}

#[test]
fn an_error_page_serve_cannot_answer_is_linted_at_the_directive() {
    let text = "http {\n    server {\n        listen 127.0.0.1:8080;\n        location / { proxy_pass http://127.0.0.1:9; error_page 502 @p; }\n        location /x { proxy_pass http://127.0.0.1:9; error_page 502 @none; }\n        location @p { proxy_pass http://127.0.0.1:9; }\n    }\n}\n";
    let found = lint_for_serve(&parse(text, &BTreeMap::new()));
    let hits: Vec<&Finding> = found
        .iter()
        .filter(|f| f.title.contains("error_page"))
        .collect();
    // A page that proxies (`@p`) is served; a missing one is not.
    assert_eq!(hits.len(), 1, "{found:#?}");
    assert!(
        hits[0].at.starts_with("/etc/nginx/nginx.conf:5:"),
        "{}",
        hits[0].at
    );
    assert!(
        hits[0].title.contains("no location \"@none\""),
        "{}",
        hits[0].title
    );
}
