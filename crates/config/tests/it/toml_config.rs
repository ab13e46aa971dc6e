//! The TOML front end (`config::toml`) and the nginx.conf → TOML converter:
//! a full file builds the expected model, every error names the field,
//! and nginx.conf → TOML → model gives the model nginx.conf gave.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use vigil_config::convert::nginx_to_toml;
use vigil_config::{literal_resolver, nginx, toml, ConfigError};
use vigil_core::config::{
    AccessLog, AddHeader, Balancer, CheckConfig, CheckKind, ClientSettings, Config, HealthRules,
    HttpVersion, InitialState, Keepalive, LocationMatch, LogFormat, PassiveCount, Penalty,
    ProxySettings, Recovery, ServerConfig, SetHeader, StatusClass, UpstreamConfig,
};
use vigil_core::{FailureClass, NextUpstream};

fn load(src: &str) -> Result<Config, ConfigError> {
    toml::load_str(src, Path::new("vigil.toml"), &literal_resolver)
}

fn load_ok(src: &str) -> Config {
    load(src).unwrap_or_else(|e| panic!("{e}\n--- source ---\n{src}"))
}

fn load_err(src: &str) -> String {
    match load(src) {
        Ok(c) => panic!("expected an error, got {c:#?}\n--- source ---\n{src}"),
        Err(e) => e.to_string(),
    }
}

fn nginx_load(src: &str) -> nginx::Loaded {
    nginx::load_str(
        src,
        Path::new("nginx.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .unwrap_or_else(|e| panic!("{e}\n--- nginx.conf ---\n{src}"))
}

/// nginx.conf → model → TOML → model: the two models are equal.
fn assert_round_trip(nginx_conf: &str) -> String {
    let loaded = nginx_load(nginx_conf);
    let text = nginx_to_toml(&loaded);
    let back = load(&text).unwrap_or_else(|e| panic!("{e}\n--- converted ---\n{text}"));
    assert_eq!(back, loaded.config, "--- converted ---\n{text}");
    text
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("n > 0")
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

const FULL: &str = r#"
[admin]
listen = "127.0.0.1:9901"
token = "s3cret"

[upstream.zeta]
hash = "$request_uri"
consistent = true
keepalive = 16
keepalive_timeout = "30s"
zone = "zeta"
server = [{ address = "10.0.0.1:80" }, { address = "10.0.0.2", weight = 5 }]

[upstream.api]
balancer = "least_conn"

[[upstream.api.server]]
address = "127.0.0.1:8001"
weight = 3
max_fails = 2
fail_timeout = "5s"
max_conns = 100

[[upstream.api.server]]
address = "localhost:8002"
backup = true

[upstream.api.check]
type = "http"
interval = "3s"
rise = 1
fall = 2
timeout = "500ms"
port = 8081
initial = "first-result"
jitter = "100ms"
send = "GET /health HTTP/1.0\r\n\r\n"
expect = ["http_2xx", "204"]
body_contains = "ok"

[[server]]
listen = ["127.0.0.1:8080", { addr = "127.0.0.1:8443", reuseport = true, backlog = 511, default_server = true }]
server_name = ["example.com", "www.example.com"]
read_timeout = "5s"
set_header = [{ name = "Host", value = "$host" }]
access_log = { path = "/var/log/vigil/access.log", format = "json" }

[[server.location]]
path = "/"
proxy_pass = "http://api"
next_upstream = ["error", "timeout", "http_503"]
next_upstream_tries = 2

[[server.location]]
path = "/exact"
match = "exact"
proxy_pass = "https://127.0.0.1:9000/v1"
set_header = [{ name = "X-Real-IP", value = "$remote_addr" }]
add_header = [{ name = "X-Upstream", value = "$upstream_addr", always = true }]
access_log = "off"
http_version = "1.1"
client_max_body_size = "10m"
ssl_verify = false
ssl_trusted_certificate = "/etc/ssl/ca.pem"

[[server]]
listen = [8081]
"#;

#[test]
fn full_example_builds_the_expected_model() {
    let c = load_ok(FULL);
    assert_eq!(c.admin.listen, Some(addr("127.0.0.1:9901")));
    assert_eq!(c.admin.token.as_deref(), Some("s3cret"));
    assert!(c.admin.dashboard, "the dashboard is on unless switched off");

    // File order, not sorted, plus the implicit upstream proxy_pass made.
    let names: Vec<&str> = c.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["zeta", "api", "127.0.0.1:9000"]);

    let zeta = &c.upstreams[0];
    assert_eq!(
        zeta.balancer,
        Balancer::Hash {
            key: "$request_uri".into(),
            consistent: true
        }
    );
    assert_eq!(
        zeta.keepalive,
        Some(Keepalive {
            idle: nz(16),
            timeout: secs(30),
            requests: 1000,
            origin: Default::default(),
        })
    );
    assert_eq!(zeta.zone.as_deref(), Some("zeta"));
    assert_eq!(
        zeta.servers[1].addr,
        addr("10.0.0.2:80"),
        "port 80 by default"
    );
    assert_eq!(
        zeta.servers[1].address, "10.0.0.2",
        "address kept as written"
    );
    assert_eq!(zeta.servers[1].weight, nz(5));
    assert_eq!(zeta.check, None);

    let api = &c.upstreams[1];
    assert_eq!(api.balancer, Balancer::LeastConn);
    assert_eq!(api.keepalive, None);
    let s0 = &api.servers[0];
    assert_eq!(
        (s0.weight, s0.max_fails, s0.fail_timeout, s0.max_conns),
        (nz(3), 2, secs(5), 100)
    );
    assert_eq!(s0.slow_start, None);
    let s1 = &api.servers[1];
    assert_eq!(s1.addr, addr("127.0.0.1:8002"));
    assert!(s1.backup && !s1.down);
    // nginx's defaults where nothing is written.
    assert_eq!(
        (
            s1.weight,
            s1.max_fails,
            s1.fail_timeout,
            s1.max_conns,
            s1.slow_start
        ),
        (nz(1), 1, secs(10), 0, None)
    );
    let check = api.check.as_ref().expect("check");
    assert_eq!(check.kind, CheckKind::Http);
    assert_eq!(
        (check.interval, check.timeout, check.jitter),
        (
            secs(3),
            Duration::from_millis(500),
            Duration::from_millis(100)
        )
    );
    assert_eq!(
        (check.rise, check.fall, check.port),
        (nz(1), nz(2), Some(8081))
    );
    assert_eq!(check.initial, InitialState::FirstResult);
    assert_eq!(check.http.send, "GET /health HTTP/1.0\r\n\r\n");
    assert_eq!(
        check.http.expect,
        [StatusClass::Class(2), StatusClass::Exact(204)]
    );
    assert_eq!(check.http.body_contains.as_deref(), Some("ok"));

    let implicit = &c.upstreams[2];
    assert_eq!(
        implicit.servers,
        [ServerConfig::new("127.0.0.1:9000", addr("127.0.0.1:9000"))]
    );

    let s = &c.servers[0];
    assert_eq!(s.server_names, ["example.com", "www.example.com"]);
    assert_eq!(s.listen[0].addr, addr("127.0.0.1:8080"));
    assert!(!s.listen[0].default_server && !s.listen[0].reuseport);
    assert_eq!(s.listen[1].addr, addr("127.0.0.1:8443"));
    assert!(s.listen[1].default_server && s.listen[1].reuseport);
    assert_eq!(s.listen[1].backlog, Some(511));

    let root = &s.locations[0];
    assert_eq!(
        (root.matcher, root.path.as_str()),
        (LocationMatch::Prefix, "/")
    );
    let p = &root.proxy;
    let pass = p.pass.as_ref().expect("proxy_pass");
    assert_eq!(
        (pass.tls, pass.upstream.as_str(), pass.uri.as_deref()),
        (false, "api", None)
    );
    assert_eq!(
        p.next_upstream,
        NextUpstream::nginx_default().with(FailureClass::Http503)
    );
    assert_eq!(p.next_upstream_tries, 2);
    // Inherited from the server.
    assert_eq!(p.read_timeout, secs(5));
    assert_eq!(
        p.set_headers,
        [SetHeader {
            name: "Host".into(),
            value: "$host".into()
        }]
    );
    assert_eq!(
        p.access_log,
        Some(AccessLog {
            path: "/var/log/vigil/access.log".into(),
            format: LogFormat::Json,
            condition: None,
        })
    );
    // nginx's defaults (and vigil's safer TLS ones).
    assert_eq!(
        (p.connect_timeout, p.send_timeout, p.next_upstream_timeout),
        (secs(60), secs(60), None)
    );
    assert_eq!(p.http_version, HttpVersion::Http10);
    assert!(p.buffering && p.request_buffering && p.ssl_verify && p.ssl_server_name);
    assert_eq!(p.client_max_body_size, 1 << 20);
    assert!(p.add_headers.is_empty());

    let exact = &s.locations[1];
    assert_eq!(exact.matcher, LocationMatch::Exact);
    let p = &exact.proxy;
    let pass = p.pass.as_ref().expect("proxy_pass");
    assert_eq!(
        (pass.tls, pass.upstream.as_str(), pass.uri.as_deref()),
        (true, "127.0.0.1:9000", Some("/v1"))
    );
    // A list given here replaces the server's; a scalar is inherited.
    assert_eq!(p.set_headers[0].name, "X-Real-IP");
    assert_eq!(p.set_headers.len(), 1);
    assert_eq!(
        p.add_headers,
        [AddHeader {
            name: "X-Upstream".into(),
            value: "$upstream_addr".into(),
            always: true
        }]
    );
    assert_eq!(p.read_timeout, secs(5));
    assert_eq!(p.access_log, None);
    assert_eq!(p.http_version, HttpVersion::Http11);
    assert_eq!(p.client_max_body_size, 10 << 20);
    assert!(!p.ssl_verify);
    assert_eq!(
        p.ssl_trusted_certificate.as_deref(),
        Some(Path::new("/etc/ssl/ca.pem"))
    );

    // A bare port listens on all addresses; no locations is allowed.
    assert_eq!(c.servers[1].listen[0].addr, addr("0.0.0.0:8081"));
    assert!(c.servers[1].locations.is_empty());
}

/// Origins point into the file, so lint findings on a TOML config do.
#[test]
fn origins_point_into_the_file() {
    let c = load_ok(FULL);
    // `file:line:col` of the `n`th line (0-based) containing `needle`, at `col`.
    let at = |needle: &str, n: usize, col: usize| {
        let line = FULL
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .nth(n)
            .map(|(i, _)| i + 1)
            .expect("needle in FULL");
        format!("vigil.toml:{line}:{col}")
    };
    let zeta = &c.upstreams[0];
    assert_eq!(zeta.origin.to_string(), at("[upstream.zeta]", 0, 11));
    assert_eq!(zeta.servers[1].origin.to_string(), at("10.0.0.2", 0, 40));
    let keepalive = zeta.keepalive.as_ref().expect("keepalive");
    assert_eq!(keepalive.origin.to_string(), at("keepalive = 16", 0, 1));
    let api = &c.upstreams[1];
    assert_eq!(
        api.servers[1].origin.to_string(),
        at("[[upstream.api.server]]", 1, 1)
    );
    let check = api.check.as_ref().expect("check");
    assert_eq!(check.origin.to_string(), at("[upstream.api.check]", 0, 15));
    assert_eq!(c.servers[1].origin.to_string(), at("[[server]]", 1, 1));
    let exact = &c.servers[0].locations[1];
    assert_eq!(exact.origin.to_string(), at("[[server.location]]", 1, 1));
    // The implicit upstream is where its proxy_pass is.
    assert_eq!(
        c.upstreams[2].origin.to_string(),
        at("https://127.0.0.1:9000", 0, 1)
    );
    assert_eq!(
        c.upstreams[2].servers[0].origin.to_string(),
        at("https://127.0.0.1:9000", 0, 1)
    );
}

#[test]
fn empty_file_is_the_default_model() {
    assert_eq!(load_ok(""), Config::default());
}

#[test]
fn server_without_listen_gets_nginx_default() {
    let c = load_ok("[[server]]\n");
    assert_eq!(c.servers[0].listen[0].addr, addr("0.0.0.0:80"));
}

#[test]
fn every_error_names_the_field() {
    let up = "[upstream.api]\nserver = [{ address = \"127.0.0.1:8001\" }]\n";
    let cases: &[(&str, String, &str)] = &[
        (
            "bad duration",
            "[upstream.api]\n[[upstream.api.server]]\naddress = \"127.0.0.1:1\"\n[[upstream.api.server]]\naddress = \"127.0.0.1:2\"\nfail_timeout = \"10x\"\n".into(),
            "vigil.toml: upstream.api.server[1].fail_timeout: invalid time \"10x\", expected",
        ),
        (
            "bare number duration",
            format!("{up}[upstream.api.check]\ninterval = \"3000\"\n"),
            "vigil.toml: upstream.api.check.interval: invalid time \"3000\", expected a unit",
        ),
        (
            "zero weight",
            "[upstream.api]\nserver = [{ address = \"127.0.0.1:1\", weight = 0 }]\n".into(),
            "vigil.toml: upstream.api.server[0].weight: invalid weight 0",
        ),
        (
            "unknown key",
            "[upstream.api]\n[[upstream.api.server]]\naddress = \"127.0.0.1:1\"\n[[upstream.api.server]]\naddress = \"127.0.0.1:2\"\nwieght = 3\n".into(),
            "vigil.toml: upstream.api.server[1].wieght: unknown field `wieght`",
        ),
        (
            "unknown key in a location",
            "[[server]]\n[[server.location]]\npath = \"/\"\nproxy_read_timeout = \"5s\"\n".into(),
            "vigil.toml: server[0].location[0].proxy_read_timeout: unknown field `proxy_read_timeout`",
        ),
        (
            "wrong type",
            format!("{up}[upstream.api.check]\nrise = \"2\"\n"),
            "vigil.toml: upstream.api.check.rise: invalid type: string \"2\"",
        ),
        (
            "timeout >= interval",
            format!("{up}[upstream.api.check]\ninterval = \"1s\"\ntimeout = \"2s\"\n"),
            "vigil.toml: upstream.api.check.timeout: check timeout (2s) must be shorter than interval (1s)",
        ),
        (
            "jitter >= interval",
            format!("{up}[upstream.api.check]\ninterval = \"1s\"\ntimeout = \"100ms\"\njitter = \"1s\"\n"),
            "vigil.toml: upstream.api.check.jitter: check jitter must be shorter",
        ),
        (
            "backup with hash",
            "[upstream.api]\nhash = \"$uri\"\nserver = [{ address = \"127.0.0.1:1\" }, { address = \"127.0.0.1:2\", backup = true }]\n".into(),
            "vigil.toml: upstream.api.server[1].backup: \"backup\" cannot be used with the hash balancer",
        ),
        (
            "backup with ip_hash",
            "[upstream.api]\nbalancer = \"ip_hash\"\nserver = [{ address = \"127.0.0.1:1\", backup = true }]\n".into(),
            "vigil.toml: upstream.api.server[0].backup: \"backup\" cannot be used with the ip_hash balancer",
        ),
        (
            "bad balancer word",
            "[upstream.api]\nbalancer = \"leastconn\"\nserver = [{ address = \"127.0.0.1:1\" }]\n".into(),
            "vigil.toml: upstream.api.balancer: invalid balancer \"leastconn\", expected round_robin",
        ),
        (
            "balancer and hash",
            "[upstream.api]\nbalancer = \"least_conn\"\nhash = \"$uri\"\nserver = [{ address = \"127.0.0.1:1\" }]\n".into(),
            "vigil.toml: upstream.api.balancer: balancer = \"least_conn\" conflicts with hash",
        ),
        (
            "consistent without hash",
            "[upstream.api]\nconsistent = true\nserver = [{ address = \"127.0.0.1:1\" }]\n".into(),
            "vigil.toml: upstream.api.consistent: \"consistent\" applies only with hash",
        ),
        (
            "empty upstream",
            "[upstream.api]\nzone = \"api\"\n".into(),
            "vigil.toml: upstream.api.server: no servers are inside upstream \"api\"",
        ),
        (
            "zero rise",
            format!("{up}[upstream.api.check]\nrise = 0\n"),
            "vigil.toml: upstream.api.check.rise: invalid rise 0",
        ),
        (
            "unsupported check type",
            format!("{up}[upstream.api.check]\ntype = \"mysql\"\n"),
            "vigil.toml: upstream.api.check.type: check type \"mysql\" is not supported",
        ),
        (
            "bad expect",
            format!("{up}[upstream.api.check]\nexpect = [\"http_2xx\", \"http_6xx\"]\n"),
            "vigil.toml: upstream.api.check.expect[1]: invalid status \"http_6xx\"",
        ),
        (
            "keepalive_timeout without keepalive",
            format!("{up}keepalive_timeout = \"5s\"\n"),
            "vigil.toml: upstream.api.keepalive_timeout: \"keepalive_timeout\" has no effect without \"keepalive\"",
        ),
        (
            "unresolvable server",
            "[upstream.api]\nserver = [{ address = \"backend.internal:80\" }]\n".into(),
            "vigil.toml: upstream.api.server[0].address: host not found in \"backend.internal:80\"",
        ),
        (
            "bad next_upstream word",
            "[[server]]\n[[server.location]]\npath = \"/\"\nnext_upstream = [\"error\", \"http_418\"]\n".into(),
            "vigil.toml: server[0].location[0].next_upstream[1]: invalid proxy_next_upstream value \"http_418\"",
        ),
        (
            "off with others",
            "[[server]]\nnext_upstream = [\"off\", \"error\"]\n".into(),
            "vigil.toml: server[0].next_upstream: \"off\" cannot be combined",
        ),
        (
            "bad size",
            "[[server]]\nclient_max_body_size = \"1t\"\n".into(),
            "vigil.toml: server[0].client_max_body_size: invalid size \"1t\"",
        ),
        (
            "proxy_pass to an unknown name",
            "[[server]]\n[[server.location]]\npath = \"/\"\nproxy_pass = \"http://apii\"\n".into(),
            "vigil.toml: server[0].location[0].proxy_pass: no upstream \"apii\" is defined, and host not found",
        ),
        (
            "proxy_pass without scheme",
            format!("{up}[[server]]\n[[server.location]]\npath = \"/\"\nproxy_pass = \"api\"\n"),
            "vigil.toml: server[0].location[0].proxy_pass: invalid proxy_pass \"api\"",
        ),
        (
            "regex location",
            "[[server]]\n[[server.location]]\npath = \"/\"\nmatch = \"regex\"\n".into(),
            "vigil.toml: server[0].location[0].match: regular-expression locations are not supported",
        ),
        (
            "bad listen parameter",
            "[[server]]\nlisten = [{ addr = \"127.0.0.1:80\", ssl = true }]\n".into(),
            "vigil.toml: server[0].listen[0].ssl: unknown field `ssl`",
        ),
        (
            "bad log format",
            "[[server]]\naccess_log = { path = \"/tmp/a.log\", format = \"main\" }\n".into(),
            "vigil.toml: server[0].access_log.format: invalid log format \"main\"",
        ),
        (
            "open admin",
            "[admin]\nlisten = \"0.0.0.0:9901\"\n".into(),
            "vigil.toml: admin.token: admin.listen 0.0.0.0:9901 is not a loopback address",
        ),
        (
            "quoted upstream name",
            "[upstream.\"a.b\"]\nserver = [{ address = \"127.0.0.1:1\", max_fails = -1 }]\n".into(),
            "vigil.toml: upstream.\"a.b\".server[0].max_fails: invalid value: integer `-1`",
        ),
    ];
    for (what, src, expected) in cases {
        let e = load_err(src);
        assert!(
            e.starts_with(expected),
            "{what}:\n  got      {e}\n  expected {expected}..."
        );
    }
}

#[test]
fn schema_errors_give_line_and_column() {
    let e = load_err("[upstream.api]\nserver = []\nbogus = 1\n");
    assert!(e.ends_with("(line 3, column 1)"), "{e}");
    let e = load_err("[upstream.api\n");
    assert!(e.starts_with("vigil.toml: "), "{e}");
    assert!(e.contains("line 1"), "{e}");
    assert!(matches!(
        load("x = ").expect_err("syntax error"),
        ConfigError::Toml { .. }
    ));
    assert!(matches!(
        load("[upstream.a]\n").expect_err("no servers"),
        ConfigError::Invalid { .. }
    ));
}

#[test]
fn load_file_reports_a_missing_file() {
    let e = toml::load_file(Path::new("/nonexistent/vigil.toml"), &literal_resolver)
        .expect_err("no such file");
    assert!(matches!(e, ConfigError::Io { .. }), "{e}");
}

const EXAMPLE_NGINX: &str = "
worker_processes 1; events { worker_connections 1024; }
http {
  upstream api { least_conn; server 127.0.0.1:8001 weight=3 max_fails=2 fail_timeout=5s; server 127.0.0.1:8002 backup; keepalive 8; }
  server { listen 127.0.0.1:8080; proxy_read_timeout 5s;
    location / { proxy_pass http://api; proxy_next_upstream error timeout http_503; proxy_next_upstream_tries 2; }
    location = /exact { proxy_pass http://127.0.0.1:9000/v1; } }
}
";

#[test]
fn round_trip_example() {
    let text = assert_round_trip(EXAMPLE_NGINX);
    assert!(
        text.contains("#   worker_processes (first at nginx.conf:2:1)"),
        "{text}"
    );
    assert!(text.contains("#   events"), "{text}");
    // The implicit upstream is left for proxy_pass to make again.
    assert!(!text.contains("[upstream.\"127.0.0.1:9000\"]"), "{text}");
    // Shared by both locations: written once, on the server.
    assert_eq!(text.matches("read_timeout").count(), 1, "{text}");
}

#[test]
fn round_trip_hash_consistent_with_check() {
    assert_round_trip(
        "
http {
  upstream cache {
    hash $request_uri consistent;
    server 10.0.0.1:80 weight=2;
    server 10.0.0.2:80 max_conns=50;
    server 10.0.0.3 down;
    zone cache 64k;
    keepalive 32; keepalive_timeout 120s; keepalive_requests 500;
    check interval=3000 rise=2 fall=3 timeout=1000 type=http default_down=false port=8081;
    check_http_send \"HEAD /status HTTP/1.1\\r\\nHost: cache\\r\\n\\r\\n\";
    check_http_expect_alive http_2xx 418;
  }
  upstream rand { random two least_conn; server 10.0.0.4:80; server 10.0.0.5:80; check; }
  upstream sticky { ip_hash; server 10.0.0.6:80; server 10.0.0.7:80 max_fails=0; }
  server { listen 80; location / { proxy_pass http://cache; } location /r { proxy_pass http://rand/x; } location /s { proxy_pass https://sticky; } }
}
",
    );
}

#[test]
fn round_trip_backups_least_conn() {
    assert_round_trip(
        "
http {
  upstream app {
    least_conn;
    server 127.0.0.1:7001 weight=5 fail_timeout=1m30s;
    server 127.0.0.1:7002 max_fails=0;
    server 127.0.0.1:7003 backup;
    server 127.0.0.1:7004 backup weight=2 down;
  }
  upstream plain { server 127.0.0.1:7005 backup; server 127.0.0.1:7006; }
  server { listen 127.0.0.1:80 default_server reuseport backlog=1024; listen [::1]:8080; server_name a.example b.example;
    location ^~ /app { proxy_pass http://app; }
    location /plain { proxy_pass http://plain; proxy_next_upstream off; }
  }
  server { listen 127.0.0.1:81; location / { proxy_pass http://127.0.0.1:7005; } location /again { proxy_pass https://127.0.0.1:7005/b; } }
}
",
    );
}

#[test]
fn round_trip_every_proxy_setting_and_header_inheritance() {
    let text = assert_round_trip(
        "
http {
  proxy_set_header Host $host;
  proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
  add_header X-Http http;
  proxy_connect_timeout 3s;
  access_log /var/log/http.log;
  upstream u { server 127.0.0.1:8001; }
  server {
    listen 127.0.0.1:8080;
    proxy_next_upstream error timeout invalid_header http_500 http_502 http_504 http_403 http_404 http_429 non_idempotent;
    proxy_next_upstream_tries 3;
    proxy_next_upstream_timeout 10s;
    proxy_connect_timeout 2s;
    proxy_send_timeout 20s;
    proxy_read_timeout 30s;
    proxy_request_buffering off;
    proxy_buffering off;
    proxy_http_version 1.1;
    proxy_set_header Connection \"\";
    client_max_body_size 8m;
    proxy_ssl_verify off;
    proxy_ssl_server_name off;
    proxy_ssl_trusted_certificate /etc/ssl/ca.pem;
    access_log /var/log/server.log json;
    location / { proxy_pass http://u; }
    location /own {
      proxy_pass http://u/own;
      proxy_next_upstream off;
      proxy_next_upstream_tries 0;
      proxy_next_upstream_timeout 0;
      proxy_connect_timeout 1s;
      proxy_send_timeout 500ms;
      proxy_read_timeout 1m;
      proxy_request_buffering on;
      proxy_buffering on;
      proxy_http_version 1.0;
      proxy_set_header X-Own yes;
      add_header X-Own yes always;
      add_header X-Two two;
      client_max_body_size 0;
      proxy_ssl_verify on;
      proxy_ssl_server_name on;
      proxy_ssl_trusted_certificate /etc/ssl/other.pem;
      access_log off;
    }
    location /inherits { proxy_pass http://u/i; }
    location /nopass { }
  }
  server { listen 127.0.0.1:8081; location / { proxy_pass http://u; } }
}
",
    );
    // The second server's single location carries the http-level settings.
    assert!(text.contains("/var/log/http.log"), "{text}");
}

#[test]
fn round_trip_top_level_blocks() {
    // Loose upstream/server blocks (the checker's SRC file form).
    assert_round_trip(
        "upstream a { server 127.0.0.1:1; } upstream b { server 127.0.0.1:2; } server { listen 9000; location / { proxy_pass http://b; } }",
    );
}

#[test]
fn round_trip_implicit_upstream_order_kept_when_written() {
    // An upstream block shaped like an implicit one, before a real one:
    // leaving it out would move it, so it is written.
    let text = assert_round_trip(
        "http { upstream 127.0.0.1:9 { server 127.0.0.1:9; } upstream z { server 127.0.0.1:10; }
           server { listen 1; location / { proxy_pass http://127.0.0.1:9; } location /z { proxy_pass http://z; } } }",
    );
    assert!(text.contains("[upstream.\"127.0.0.1:9\"]"), "{text}");
}

/// Every recorded conformance scenario's nginx.conf (as `conformance.rs`
/// builds it) converts and loads back equal.
#[test]
fn round_trip_conformance_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/conformance")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for f in files {
        let g: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f).expect("read")).expect("json");
        let mut text = format!(
            "worker_processes 1; events {{ worker_connections 1024; }}\nhttp {{\n access_log off;\n{}\n server {{\n  listen 127.0.0.1:8080;\n  add_header X-Upstream-Addr $upstream_addr always;\n{}\n }}\n}}\n",
            g["upstreams"].as_str().expect("upstreams"),
            g["locations"].as_str().expect("locations"),
        );
        for (i, p) in g["peers"].as_array().expect("peers").iter().enumerate() {
            let label = p.as_str().expect("label");
            text = text.replace(
                &format!("{{{label}}}"),
                &format!("127.0.0.1:{}", 20_000 + i),
            );
        }
        assert_round_trip(&text);
    }
}

#[test]
fn to_toml_string_leaves_defaults_out() {
    let mut up = UpstreamConfig::new("api");
    up.servers
        .push(ServerConfig::new("127.0.0.1:8001", addr("127.0.0.1:8001")));
    let c = Config {
        upstreams: vec![up],
        ..Config::default()
    };
    let text = toml::to_toml_string(&c);
    assert_eq!(
        text.trim(),
        "[upstream.api]\nbalancer = \"round_robin\"\n\n[[upstream.api.server]]\naddress = \"127.0.0.1:8001\""
    );
    assert_eq!(load_ok(&text), c);
}

#[test]
fn examples_vigil_toml_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vigil.toml");
    let c = toml::load_file(&path, &literal_resolver).unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.upstreams.is_empty() && !c.servers.is_empty());
    // And it survives a write and read.
    assert_eq!(load_ok(&toml::to_toml_string(&c)), c);
}

/// `docs/configuration-toml.md`'s full example is what it says: the TOML
/// form of the nginx.conf printed after it.
#[test]
fn docs_example_equals_its_nginx_conf() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration-toml.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration-toml.md");
    let example = &doc[doc.find("## Full example").expect("full example section")..];
    let block = |fence: &str| {
        let start = example.find(fence).expect("code block") + fence.len();
        let len = example[start..].find("```").expect("closing fence");
        example[start..start + len].to_string()
    };
    let mut from_toml = load_ok(&block("```toml\n"));
    assert_eq!(from_toml.admin.listen, Some(addr("127.0.0.1:9901")));
    from_toml.admin = Default::default();
    assert_eq!(from_toml, nginx_load(&block("```nginx\n")).config);
}

#[test]
fn client_keys_build_the_server_settings() {
    let c = load_ok(
        "[[server]]\nclient_header_timeout = \"10s\"\nlarge_client_header_buffers = \"8 16k\"\nunderscores_in_headers = true\nignore_invalid_headers = false\nmerge_slashes = false\nclient_body_timeout = \"5s\"\nclient_send_timeout = \"6s\"\nclient_keepalive_timeout = \"0s\"\n[[server.location]]\npath = \"/\"\n[[server]]\nlarge_client_header_buffers = { number = 2, size = \"1k\" }\nlisten = [81]\n",
    );
    assert_eq!(
        c.servers[0].client,
        ClientSettings {
            header_timeout: secs(10),
            header_buffers: 8,
            header_buffer_size: 16 * 1024,
            underscores_in_headers: true,
            ignore_invalid_headers: false,
            merge_slashes: false,
        }
    );
    let p = &c.servers[0].locations[0].proxy;
    assert_eq!(
        (
            p.client_body_timeout,
            p.client_send_timeout,
            p.client_keepalive_timeout
        ),
        (secs(5), secs(6), Duration::ZERO)
    );
    assert_eq!(
        (
            c.servers[1].client.header_buffers,
            c.servers[1].client.header_buffer_size
        ),
        (2, 1024)
    );
    assert_eq!(c.servers[1].client.header_timeout, secs(60));
    // The same as nginx.conf gives.
    let n = nginx_load(
        "http { server { listen 80; client_header_timeout 10s; large_client_header_buffers 8 16k; underscores_in_headers on; ignore_invalid_headers off; merge_slashes off; } }",
    );
    assert_eq!(n.config.servers[0].client, c.servers[0].client);
}

#[test]
fn client_key_errors_name_the_field() {
    for (src, expected) in [
        (
            "[[server]]\nlarge_client_header_buffers = \"4\"",
            "vigil.toml: server[0].large_client_header_buffers: invalid value \"4\", expected \"NUMBER SIZE\" (e.g. \"4 8k\")",
        ),
        (
            "[[server]]\nlarge_client_header_buffers = \"x 8k\"",
            "vigil.toml: server[0].large_client_header_buffers: invalid number \"x\" in \"x 8k\", expected \"NUMBER SIZE\" (e.g. \"4 8k\")",
        ),
        (
            "[[server]]\nlarge_client_header_buffers = \"4 100\"",
            "vigil.toml: server[0].large_client_header_buffers: the \"large_client_header_buffers\" size must be equal to or greater than \"connection_pool_size\"",
        ),
        (
            "[[server]]\nlarge_client_header_buffers = { number = 0, size = \"8k\" }",
            "vigil.toml: server[0].large_client_header_buffers: \"large_client_header_buffers\" directive invalid value",
        ),
        (
            "[[server]]\nlarge_client_header_buffers = { number = 4, size = \"8q\" }",
            "vigil.toml: server[0].large_client_header_buffers.size: invalid size \"8q\", expected bytes with an optional k or m unit (e.g. 512k, 1m)",
        ),
        (
            "[[server]]\nclient_header_timeout = \"60\"",
            "vigil.toml: server[0].client_header_timeout: invalid time \"60\", expected a unit (\"60s\" or \"60ms\"): a bare number is seconds in nginx but milliseconds in tengine's check",
        ),
    ] {
        assert_eq!(load_err(src), expected, "{src}");
    }
    // Server level only, as in nginx ("not allowed here" in a location).
    let e = load_err("[[server]]\n[[server.location]]\npath = \"/\"\nmerge_slashes = false\n");
    assert!(e.contains("unknown field `merge_slashes`"), "{e}");
}

#[test]
fn round_trip_client_settings() {
    let text = assert_round_trip(
        "
http {
  client_header_timeout 15s;
  large_client_header_buffers 2 1k;
  server { listen 127.0.0.1:8080; underscores_in_headers on; merge_slashes off;
    client_body_timeout 7s; send_timeout 8s; keepalive_timeout 0;
    location / { proxy_pass http://127.0.0.1:9000; } }
  server { listen 127.0.0.1:8081; ignore_invalid_headers off; large_client_header_buffers 4 8k;
    location / { proxy_pass http://127.0.0.1:9000; keepalive_timeout 30s; } }
}
",
    );
    assert_eq!(
        text.matches("client_header_timeout = \"15s\"").count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("large_client_header_buffers = \"2 1k\""),
        "{text}"
    );
}

fn duration_ms(max: u64) -> impl Strategy<Value = Duration> {
    (0..=max).prop_map(Duration::from_millis)
}

fn server_strategy() -> impl Strategy<Value = ServerConfig> {
    let address = prop_oneof![
        (1u8..=254, 1u16..=65535).prop_map(|(h, p)| format!("127.0.0.{h}:{p}")),
        (1u8..=254).prop_map(|h| format!("10.1.2.{h}")),
        (1u16..=65535).prop_map(|p| format!("[::1]:{p}")),
        (1u16..=65535).prop_map(|p| format!("localhost:{p}")),
    ];
    (
        address,
        1u32..=100,
        0u32..=10,
        duration_ms(600_000),
        0u32..=1000,
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(duration_ms(600_000)),
    )
        .prop_map(
            |(address, weight, max_fails, fail_timeout, max_conns, backup, down, slow_start)| {
                let resolved = address.rsplit_once(':').filter(|(h, _)| !h.is_empty());
                let sa = match resolved {
                    Some((h, p)) if !address.starts_with("10.") => {
                        literal_resolver(h, p.parse().expect("port")).expect("literal")[0]
                    }
                    _ => literal_resolver(&address, 80).expect("literal")[0],
                };
                let mut s = ServerConfig::new(address, sa);
                s.weight = nz(weight);
                s.max_fails = max_fails;
                s.fail_timeout = fail_timeout;
                s.max_conns = max_conns;
                s.backup = backup;
                s.down = down;
                s.slow_start = slow_start;
                s
            },
        )
}

fn balancer_strategy() -> impl Strategy<Value = Balancer> {
    prop_oneof![
        Just(Balancer::RoundRobin),
        Just(Balancer::LeastConn),
        Just(Balancer::IpHash),
        any::<bool>().prop_map(|two| Balancer::Random { two }),
        ("\\$[a-z_]{1,12}( \\$[a-z_]{1,8})?", any::<bool>())
            .prop_map(|(key, consistent)| Balancer::Hash { key, consistent }),
    ]
}

fn check_strategy() -> impl Strategy<Value = CheckConfig> {
    (
        (1u64..=120_000, 1u32..=10, 1u32..=10, 0u64..1000, 0u64..1000),
        prop_oneof![
            Just(CheckKind::Tcp),
            Just(CheckKind::Http),
            Just(CheckKind::Https)
        ],
        proptest::option::of(1u16..=65535),
        prop_oneof![
            Just(InitialState::Up),
            Just(InitialState::Down),
            Just(InitialState::FirstResult)
        ],
        "\\PC{0,40}",
        proptest::collection::vec(
            prop_oneof![
                (1u8..=5).prop_map(StatusClass::Class),
                (100u16..=599).prop_map(StatusClass::Exact)
            ],
            1..4,
        ),
        proptest::option::of("\\PC{0,10}"),
    )
        .prop_map(
            |((interval, rise, fall, t, j), kind, port, initial, send, expect, body)| {
                let interval = Duration::from_millis(interval.max(2));
                // timeout and jitter strictly inside the interval.
                let span = u64::try_from(interval.as_millis()).expect("ms") - 1;
                CheckConfig {
                    kind,
                    interval,
                    rise: nz(rise),
                    fall: nz(fall),
                    timeout: Duration::from_millis(1 + t * span / 1000),
                    port,
                    initial,
                    jitter: Duration::from_millis(j * span / 1000),
                    http: vigil_core::config::HttpCheck {
                        send: format!("GET / HTTP/1.0\r\n{send}\r\n\r\n"),
                        expect,
                        body_contains: body,
                    },
                    origin: Default::default(),
                }
            },
        )
}

/// vigil's peer rules; `probe` recovery is made `window` when there is no check.
fn rules_strategy() -> impl Strategy<Value = HealthRules> {
    (
        any::<(bool, bool)>(),
        prop_oneof![
            Just(Recovery::Window),
            Just(Recovery::Probe),
            (1u32..=20).prop_map(|n| Recovery::Probation(nz(n))),
        ],
        proptest::option::of((1u64..=600_000, 1u64..=3_600_000, 0u8..=100)),
        proptest::option::of(0u8..=100),
    )
        .prop_map(
            |((after_header, last_try), recovery, penalty, max_ejected)| HealthRules {
                count: PassiveCount {
                    after_header,
                    last_try,
                },
                recovery,
                penalty: penalty.map(|(base, max, jitter_percent)| Penalty {
                    base: Duration::from_millis(base),
                    max: Duration::from_millis(max),
                    jitter_percent,
                }),
                max_ejected,
                ..HealthRules::default()
            },
        )
}

fn upstream_strategy() -> impl Strategy<Value = UpstreamConfig> {
    (
        "[a-z][a-z0-9_.:-]{0,12}",
        balancer_strategy(),
        proptest::collection::vec(server_strategy(), 1..6),
        proptest::option::of((1u32..=64, duration_ms(600_000), 0u32..=5000)),
        proptest::option::of(check_strategy()),
        proptest::option::of("[a-z]{1,8}"),
        rules_strategy(),
    )
        .prop_map(
            |(name, balancer, mut servers, keepalive, check, zone, mut rules)| {
                if !matches!(balancer, Balancer::RoundRobin | Balancer::LeastConn) {
                    for s in &mut servers {
                        s.backup = false;
                    }
                }
                if matches!(balancer, Balancer::Hash { .. } | Balancer::IpHash) {
                    for s in &mut servers {
                        s.slow_start = None;
                    }
                }
                if check.is_none() && rules.recovery == Recovery::Probe {
                    rules.recovery = Recovery::Window;
                }
                let mut up = UpstreamConfig::new(name);
                up.balancer = balancer;
                up.servers = servers;
                up.keepalive = keepalive.map(|(idle, timeout, requests)| Keepalive {
                    idle: nz(idle),
                    timeout,
                    requests,
                    origin: Default::default(),
                });
                up.check = check;
                up.zone = zone;
                up.rules = rules;
                up
            },
        )
}

fn client_strategy() -> impl Strategy<Value = ClientSettings> {
    (
        duration_ms(600_000),
        1u32..64,
        prop_oneof![512u64..100_000, (1u64..64).prop_map(|k| k << 10)],
        (any::<bool>(), any::<bool>(), any::<bool>()),
    )
        .prop_map(|(t, n, size, (u, i, m))| ClientSettings {
            header_timeout: t,
            header_buffers: n,
            header_buffer_size: size,
            underscores_in_headers: u,
            ignore_invalid_headers: i,
            merge_slashes: m,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn client_settings_round_trip(
        clients in proptest::collection::vec(client_strategy(), 1..4),
        timeouts in (duration_ms(100_000), duration_ms(100_000), duration_ms(100_000)),
    ) {
        let mut config = Config::default();
        for (i, c) in clients.into_iter().enumerate() {
            let text = format!("[[server]]\nlisten = [{}]\n[[server.location]]\npath = \"/\"\n", 8000 + i);
            let mut s = load(&text).expect("base").servers.remove(0);
            s.client = c;
            s.locations[0].proxy.client_body_timeout = timeouts.0;
            s.locations[0].proxy.client_send_timeout = timeouts.1;
            s.locations[0].proxy.client_keepalive_timeout = timeouts.2;
            config.servers.push(s);
        }
        let text = toml::to_toml_string(&config);
        let back = load(&text);
        prop_assert!(back.is_ok(), "{:?}\n{}", back.err(), text);
        prop_assert_eq!(back.ok(), Some(config), "{}", text);
    }

    #[test]
    fn upstreams_round_trip(ups in proptest::collection::vec(upstream_strategy(), 1..4)) {
        let mut config = Config::default();
        for mut u in ups {
            if config.upstream(&u.name).is_some() {
                u.name.push_str("-2");
            }
            if config.upstream(&u.name).is_none() {
                config.upstreams.push(u);
            }
        }
        let text = toml::to_toml_string(&config);
        let back = load(&text);
        prop_assert!(back.is_ok(), "{:?}\n{}", back.err(), text);
        prop_assert_eq!(back.ok(), Some(config), "{}", text);
    }

    #[test]
    fn proxy_settings_round_trip(
        tries in 0u32..10,
        timeouts in (duration_ms(100_000), duration_ms(100_000), duration_ms(100_000), duration_ms(100_000)),
        flags in (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        body in prop_oneof![Just(0u64), 1u64..10_000_000, (1u64..64).prop_map(|k| k << 20)],
        headers in proptest::collection::vec(("[A-Za-z-]{1,10}", "\\PC{0,12}"), 0..3),
        classes in proptest::collection::vec(0usize..10, 0..4),
    ) {
        let mut p = ProxySettings {
            pass: None,
            next_upstream_tries: tries,
            next_upstream_timeout: (!timeouts.0.is_zero()).then_some(timeouts.0),
            connect_timeout: timeouts.1,
            send_timeout: timeouts.2,
            read_timeout: timeouts.3,
            request_buffering: flags.0,
            buffering: flags.1,
            http_version: if flags.2 { HttpVersion::Http11 } else { HttpVersion::Http10 },
            ssl_verify: flags.3,
            ssl_server_name: flags.4,
            client_max_body_size: body,
            ..ProxySettings::default()
        };
        p.next_upstream = classes
            .iter()
            .fold(NextUpstream::OFF, |n, i| n.with(FailureClass::ALL[*i]));
        p.set_headers = headers
            .iter()
            .map(|(n, v)| SetHeader { name: n.clone(), value: v.clone() })
            .collect();
        p.add_headers = headers
            .iter()
            .map(|(n, v)| AddHeader { name: n.clone(), value: v.clone(), always: flags.0 })
            .collect();
        let text = "[[server]]\n[[server.location]]\npath = \"/\"\n[[server.location]]\npath = \"/b\"\nread_timeout = \"7s\"\n";
        let mut config = load(text).expect("base");
        config.servers[0].locations[0].proxy = p.clone();
        let text = toml::to_toml_string(&config);
        let back = load(&text);
        prop_assert!(back.is_ok(), "{:?}\n{}", back.err(), text);
        prop_assert_eq!(back.ok(), Some(config), "{}", text);
    }
}

#[test]
fn the_admin_dashboard_can_be_switched_off_and_round_trips() {
    let c = load_ok("[admin]\ndashboard = false\n");
    assert!(!c.admin.dashboard);
    let text = vigil_config::toml::to_toml_string(&c);
    assert!(text.contains("dashboard = false"), "{text}");
    assert!(!load_ok(&text).admin.dashboard);
    assert!(!vigil_config::toml::to_toml_string(&load_ok("")).contains("dashboard"));
    assert!(load_err("[admin]\ndashboard = \"off\"\n").contains("dashboard"));
}

#[test]
fn worker_shutdown_timeout_bounds_a_graceful_stop_in_both_front_ends() {
    let conf = "worker_shutdown_timeout 30s; http { server { listen 9000; } }";
    assert_eq!(nginx_load(conf).config.shutdown_timeout, Some(secs(30)));
    let text = assert_round_trip(conf);
    assert!(text.contains("worker_shutdown_timeout = \"30s\""), "{text}");
    assert_eq!(
        load_ok("worker_shutdown_timeout = \"1m\"").shutdown_timeout,
        Some(secs(60))
    );
    assert_eq!(
        nginx_load("http {}").config.shutdown_timeout,
        None,
        "nginx: no limit"
    );
    let e = load_err("worker_shutdown_timeout = \"soon\"");
    assert!(e.contains("worker_shutdown_timeout"), "{e}");
    let twice = nginx::load_str(
        "worker_shutdown_timeout 1s;\nworker_shutdown_timeout 2s;\n",
        Path::new("nginx.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect_err("duplicate");
    assert!(
        twice
            .to_string()
            .contains("nginx.conf:2:1: \"worker_shutdown_timeout\" directive is duplicate"),
        "{twice}"
    );
}

#[test]
fn admin_hosts_are_names_made_canonical_and_round_trip() {
    let c = load_ok("[admin]\nhosts = [\"Vigil.Internal.\", \"ops_1\"]\n");
    assert_eq!(c.admin.hosts, ["vigil.internal", "ops_1"]);
    let text = vigil_config::toml::to_toml_string(&c);
    assert_eq!(load_ok(&text).admin.hosts, c.admin.hosts, "{text}");
    assert!(load_ok("").admin.hosts.is_empty());
    for (src, expected) in [
        (
            "[admin]\nhosts = [\"ok\", \"*.example.com\"]\n",
            "vigil.toml: admin.hosts[1]: \"*.example.com\" is not a host name (letters, digits, '-' and '_' in dot-separated labels; no port, no wildcard)",
        ),
        (
            "[admin]\nhosts = [\"vigil:9901\"]\n",
            "vigil.toml: admin.hosts[0]: \"vigil:9901\" is not a host name (letters, digits, '-' and '_' in dot-separated labels; no port, no wildcard)",
        ),
        (
            "[admin]\nhosts = [\"10.0.0.1\"]\n",
            "vigil.toml: admin.hosts[0]: \"10.0.0.1\" is an address: any IP address is accepted already; list host names only",
        ),
        (
            "[admin]\nhosts = [\"\"]\n",
            "vigil.toml: admin.hosts[0]: \"\" is not a host name (letters, digits, '-' and '_' in dot-separated labels; no port, no wildcard)",
        ),
    ] {
        assert_eq!(load_err(src), expected, "{src}");
    }
}
