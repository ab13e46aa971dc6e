//! The upstreams source → stock-nginx files: same directives and order,
//! `check*` removed, text of server parameters kept; TOML too.

use std::path::Path;

use std::collections::BTreeMap;

use vigil_checker::nginx::render::{render, Mark};
use vigil_checker::nginx::source::{self, Line};
use vigil_config::literal_resolver;
use vigil_core::config::CheckKind;
use vigil_core::peer::PeerId;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("test step");
    p
}

const TENGINE: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    check_shm_size 1m;
    upstream student-service-api {
        hash $request_uri consistent;
        server 127.0.0.1:9050 weight=5 max_fails=3 fail_timeout=30s;
        server 127.0.0.1:9051;
        check interval=3000 rise=2 fall=5 timeout=1000 type=http;
        check_http_send "HEAD /health/check/status HTTP/1.0\r\n\r\n";
        check_http_expect_alive http_2xx http_3xx;
        keepalive 16;
    }
    upstream nerf {
        server 127.0.0.1:8091 weight=1;
        server 127.0.0.1:9019 weight=4 backup;
        server 127.0.0.1:9020 down;
        check interval=1000 rise=2 fall=5 timeout=500 type=tcp;
    }
    server { listen 80; location / { proxy_pass http://nerf; } }
}
"#;

#[test]
fn tengine_blocks_render_for_stock_nginx() {
    let dir = tempfile::tempdir().expect("test step");
    let src = write(dir.path(), "upstreams.conf", TENGINE);
    let s = source::load(&src, None, &literal_resolver).expect("test step");
    assert_eq!(s.blocks.len(), 2);
    let check = s.config.upstreams[0].check.as_ref().expect("test step");
    assert_eq!(check.kind, CheckKind::Http);
    assert_eq!(
        check.http.send,
        "HEAD /health/check/status HTTP/1.0\r\n\r\n"
    );
    let r = render(&s.blocks[0], &BTreeMap::new());
    let origin = format!("{}:6", src.display());
    assert_eq!(
        r.text,
        format!(
            "# Rendered by vigil check from {origin}; do not edit: vigil rewrites this file.\n\
             upstream student-service-api {{\n    hash $request_uri consistent;\n    \
             server 127.0.0.1:9050 weight=5 max_fails=3 fail_timeout=30s;\n    \
             server 127.0.0.1:9051;\n    keepalive 16;\n}}\n"
        )
    );
    // Backups come after primaries in core's peer order; lines keep file order.
    let peers: Vec<(PeerId, bool)> = s.blocks[1]
        .lines
        .iter()
        .filter_map(|l| match l {
            Line::Server { peer, down, .. } => Some((*peer, *down)),
            Line::Other(_) => None,
        })
        .collect();
    assert_eq!(
        peers,
        vec![(PeerId(0), false), (PeerId(2), false), (PeerId(1), true)]
    );
    let down = BTreeMap::from([(PeerId(2), Mark::Down("down by active check".into()))]);
    let r = render(&s.blocks[1], &down);
    assert!(r.text.contains(
        "    server 127.0.0.1:8091 weight=1;\n    server 127.0.0.1:9019 weight=4 backup down; # vigil: down by active check\n    server 127.0.0.1:9020 down;\n"
    ), "{}", r.text);
}

#[test]
fn quoted_arguments_survive_and_default_checks_apply() {
    let dir = tempfile::tempdir().expect("test step");
    let src = write(
        dir.path(),
        "u.conf",
        "upstream a { hash \"$host $request_uri\"; server 127.0.0.1:1; }\nupstream b { server 127.0.0.1:2; check type=tcp interval=2000 timeout=100; }\n",
    );
    let default = vigil_core::config::CheckConfig {
        kind: CheckKind::Http,
        ..Default::default()
    };
    let s = source::load(&src, Some(&default), &literal_resolver).expect("test step");
    assert_eq!(
        s.config.upstreams[0]
            .check
            .as_ref()
            .expect("test step")
            .kind,
        CheckKind::Http
    );
    assert_eq!(
        s.config.upstreams[1]
            .check
            .as_ref()
            .expect("test step")
            .kind,
        CheckKind::Tcp
    );
    let r = render(&s.blocks[0], &BTreeMap::new());
    assert!(
        r.text.contains("    hash \"$host $request_uri\";\n"),
        "{}",
        r.text
    );
}

#[test]
fn toml_source_renders_the_same_directives() {
    let dir = tempfile::tempdir().expect("test step");
    let src = write(
        dir.path(),
        "u.toml",
        r#"
[upstream.api]
balancer = "least_conn"
server = [
  { address = "127.0.0.1:8001", weight = 3, fail_timeout = "30s" },
  { address = "127.0.0.1:8002", backup = true },
]
check = { type = "http", interval = "2s", timeout = "500ms", send = "GET /healthz HTTP/1.0\r\n\r\n" }
"#,
    );
    let s = source::load(&src, None, &literal_resolver).expect("test step");
    let r = render(&s.blocks[0], &BTreeMap::new());
    let body: Vec<&str> = r.text.lines().skip(1).collect();
    assert_eq!(
        body,
        vec![
            "upstream api {",
            "    least_conn;",
            "    server 127.0.0.1:8001 weight=3 fail_timeout=30s;",
            "    server 127.0.0.1:8002 backup;",
            "}"
        ]
    );
}

#[test]
fn names_that_would_escape_the_render_dir_are_refused() {
    let dir = tempfile::tempdir().expect("test step");
    let src = write(
        dir.path(),
        "u.conf",
        "upstream ../etc { server 127.0.0.1:1; }\n",
    );
    let e = source::load(&src, None, &literal_resolver).expect_err("expected a failure");
    assert!(e.is_source(), "{e}");
}

#[test]
fn vigil_only_rules_and_slow_start_are_not_given_to_stock_nginx() {
    let dir = tempfile::tempdir().expect("test step");
    let src = write(
        dir.path(),
        "upstreams.conf",
        "http { upstream u {
            server 127.0.0.1:9050 weight=2 slow_start=30s;
            server 127.0.0.1:9051;
            passive_count after_header last_try;
            passive_penalty base=5s max=1m;
            max_ejected 50%;
            check interval=1000 rise=2 fall=2 timeout=500;
         } }",
    );
    let s = source::load(&src, None, &literal_resolver).expect("test step");
    let r = render(&s.blocks[0], &BTreeMap::new());
    for word in ["slow_start", "passive_", "max_ejected", "check interval"] {
        assert!(!r.text.contains(word), "{word} rendered:\n{}", r.text);
    }
    assert!(
        r.text.contains("server 127.0.0.1:9050 weight=2;"),
        "{}",
        r.text
    );
}
