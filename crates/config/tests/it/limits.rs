//! `limit_req_zone` / `limit_req` and `limit_conn_zone` / `limit_conn` in
//! the model: the zones' rates as nginx keeps them, nginx's inheritance
//! (a level's own list replaces the inherited one), `vigil lint` takes
//! them, `vigil convert` refuses them by name.

use std::path::Path;

use vigil_config::{convert, literal_resolver, nginx};
use vigil_core::config::{ConnLimit, LimitLogLevel, ReqDelay, ReqLimit, ZoneKind};

const CONF: &str = r#"
http {
  limit_req_zone $binary_remote_addr zone=a:1m rate=6r/m;
  limit_req_zone $binary_remote_addr zone=b:32k rate=1r/m;
  limit_conn_zone $binary_remote_addr zone=c:1m;
  limit_req zone=a burst=2;
  limit_req_status 429;
  upstream u { server 127.0.0.1:1; }
  server { listen 127.0.0.1:8080;
    limit_req_log_level warn;
    location /inherits { proxy_pass http://u; }
    location /own { limit_req zone=b nodelay; limit_req zone=a delay=1; limit_conn c 2; proxy_pass http://u; }
  }
}
"#;

#[test]
fn zones_and_limits_are_modelled_as_nginx_reads_them() {
    let c = crate::support::nginx_load(CONF).expect("loads");
    let rates: Vec<_> = c
        .limit_zones
        .iter()
        .map(|z| (z.name.as_str(), z.kind, z.size))
        .collect();
    assert_eq!(
        rates,
        [
            ("a", ZoneKind::Req { rate: 100 }, 1 << 20),
            ("b", ZoneKind::Req { rate: 16 }, 32 << 10),
            ("c", ZoneKind::Conn, 1 << 20),
        ]
    );
    let l = |path: &str| {
        c.servers[0]
            .locations
            .iter()
            .find(|l| l.path == path)
            .expect("location")
            .proxy
            .limits
            .clone()
    };
    let inherits = l("/inherits");
    assert_eq!(
        inherits.req,
        [ReqLimit {
            zone: "a".into(),
            burst: 2,
            delay: ReqDelay::All
        }]
    );
    assert_eq!(
        (inherits.req_status, inherits.req_log_level),
        (429, LimitLogLevel::Warn)
    );
    assert!(inherits.conn.is_empty());
    let own = l("/own");
    assert_eq!(
        own.req,
        [
            ReqLimit {
                zone: "b".into(),
                burst: 0,
                delay: ReqDelay::NoDelay
            },
            ReqLimit {
                zone: "a".into(),
                burst: 0,
                delay: ReqDelay::After(1)
            },
        ]
    );
    assert_eq!(
        own.conn,
        [ConnLimit {
            zone: "c".into(),
            conn: 2
        }]
    );
}

#[test]
fn lint_takes_them_and_convert_refuses_them_by_name() {
    let loaded = lenient(CONF);
    assert!(loaded.refusals.is_empty(), "{:?}", loaded.refusals);
    let missing = convert::untranslatable(&loaded.config);
    assert!(
        missing.iter().any(|m| m.contains("limit_req_zone a")),
        "{missing:?}"
    );
    assert!(
        missing
            .iter()
            .any(|m| m.contains("limit_req/limit_conn in location /own")),
        "{missing:?}"
    );
}

/// `src` loaded as `vigil lint` loads it.
fn lenient(src: &str) -> nginx::Loaded {
    nginx::load_str_mode(
        src,
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
        nginx::syntax::Includes::Disk,
        nginx::Mode::Lenient,
    )
    .expect("parses")
}

#[test]
fn limits_in_force_where_files_are_served_are_taken() {
    // The http level's limit_req reaches a static location too (vigil
    // applies it there as nginx's preaccess phase does).
    let conf = CONF.replace(
        "location /inherits { proxy_pass http://u; }",
        "location /inherits { proxy_pass http://u; }\n    location /static/ { root /srv; }",
    );
    let loaded = lenient(&conf);
    assert!(loaded.refusals.is_empty(), "{:?}", loaded.refusals);
    let stat = loaded.config.servers[0]
        .locations
        .iter()
        .find(|l| l.path == "/static/")
        .expect("the static location");
    assert_eq!(stat.proxy.limits.req.len(), 1);
}
