use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::nginx::{load_str, Loaded};
use crate::ConfigError;
use vigil_core::config::SessionCache;

fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let ip = if host == "*" || host.is_empty() {
        "0.0.0.0"
    } else {
        host
    };
    Ok(vec![SocketAddr::new(
        ip.parse().map_err(std::io::Error::other)?,
        port,
    )])
}

fn load(http: &str) -> Result<Loaded, ConfigError> {
    load_str(
        &format!("http {{\n{http}\n}}\n"),
        Path::new("t.conf"),
        Path::new("."),
        &resolve,
    )
}

#[test]
fn listen_ssl_http2_and_the_settings_inherited_from_http() {
    let l = load(
        "ssl_protocols TLSv1 TLSv1.2 TLSv1.3;
         ssl_certificate_key /k/http.key;
         ssl_session_cache shared:SSL:10m;
         ssl_session_timeout 1d;
         ssl_prefer_server_ciphers on;
         ssl_ciphers HIGH:!aNULL;
         server { listen 127.0.0.1:8443 ssl http2; ssl_certificate /c/a.crt;
                  ssl_session_tickets off; }",
    )
    .unwrap();
    let s = &l.config.servers[0];
    assert!(s.listen[0].ssl && s.listen[0].http2);
    let t = &s.tls;
    assert_eq!(t.certificates.len(), 1);
    assert_eq!(t.certificates[0].certificate, PathBuf::from("/c/a.crt"));
    assert_eq!(t.certificates[0].key, PathBuf::from("/k/http.key"));
    assert_eq!(
        t.certificates[0].certificate_origin.to_string(),
        "t.conf:8:52"
    );
    assert!(t.tls12 && t.tls13);
    assert_eq!(t.not_offered, ["TLSv1"]);
    assert_eq!(t.session_cache, SessionCache::Sessions(40000));
    assert_eq!(t.session_timeout.as_secs(), 86400);
    assert!(!t.session_tickets && t.prefer_server_ciphers);
    assert_eq!(t.ciphers.as_deref(), Some("HIGH:!aNULL"));
    assert!(
        l.ignored.iter().all(|(k, _)| !k.starts_with("ssl")),
        "{:?}",
        l.ignored
    );
}

#[test]
fn nginx_1_22_defaults() {
    let l = load("server { listen 8443 ssl; ssl_certificate a; ssl_certificate_key k; }").unwrap();
    let t = &l.config.servers[0].tls;
    assert!(t.tls12 && !t.tls13, "1.22 offers TLSv1.3 only when listed");
    assert_eq!(t.session_cache, SessionCache::None);
    assert_eq!(t.session_timeout.as_secs(), 300);
    assert!(t.session_tickets && !t.prefer_server_ciphers);
}

#[test]
fn a_server_level_certificate_list_replaces_the_inherited_one() {
    let l = load(
        "ssl_certificate /h.crt; ssl_certificate_key /h.key;
         server { listen 8443 ssl; ssl_certificate /s1.crt; ssl_certificate /s2.crt;
                  ssl_certificate_key /s1.key; ssl_certificate_key /s2.key; }
         server { listen 8443 ssl; server_name b; }",
    )
    .unwrap();
    let certs = |i: usize| -> Vec<String> {
        l.config.servers[i]
            .tls
            .certificates
            .iter()
            .map(|c| format!("{} {}", c.certificate.display(), c.key.display()))
            .collect()
    };
    assert_eq!(certs(0), ["/s1.crt /s1.key", "/s2.crt /s2.key"]);
    assert_eq!(certs(1), ["/h.crt /h.key"]);
}

#[test]
fn nginx_refusals() {
    let e = |http: &str| load(http).unwrap_err().to_string();
    assert_eq!(
        e("server {\n listen 8443 ssl; }"),
        "t.conf:2:1: no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive"
    );
    // The default server must have one; others take its certificate.
    assert!(load(
        "server { listen 8443 ssl; ssl_certificate a; ssl_certificate_key k; }
         server { listen 8443; server_name b; }"
    )
    .is_ok());
    assert!(e(
        "server { listen 8443; ssl_certificate a; ssl_certificate_key k; }
               server { listen 8443 ssl default_server; }"
    )
    .contains("t.conf:3:16: no \"ssl_certificate\""));
    assert_eq!(
        e("server { listen 80; ssl_certificate /a.crt; }"),
        "t.conf:2:21: no \"ssl_certificate_key\" is defined for certificate \"/a.crt\""
    );
    assert!(e("server { ssl_protocols SSLv3 TLSv1; }")
        .contains("rustls implements TLSv1.2 and TLSv1.3"));
    assert!(e("server { ssl_protocols TLSv1.4; }").contains("invalid value \"TLSv1.4\""));
    assert!(e("server { ssl_session_cache shared:SSL; }").contains("invalid session cache"));
    assert!(e("server { ssl_certificate $ssl_server_name.crt; }").contains("name a file"));
    assert!(e("server { ssl on; }").contains("listen ... ssl"));
}
