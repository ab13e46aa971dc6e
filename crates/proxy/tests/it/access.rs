//! `allow` / `deny` and the realip module: the same requests (from
//! 127.0.0.1, with forwarded addresses in headers) through vigil and a
//! stock nginx on the same conf: the same status, the same address in
//! `$remote_addr` upstream and in the log, `return` before access.

use std::path::Path;

use crate::support::eventually;
use crate::twin::Twin;

const CONF: &str = r#"
    log_format ip "$remote_addr $realip_remote_addr $status";
    upstream u { server {B0}; }
    server { listen {LISTEN};
      access_log {LOG}/ip.log ip;
      set_real_ip_from 127.0.0.1; set_real_ip_from 10.0.0.0/8;
      real_ip_header X-Forwarded-For; real_ip_recursive on;
      proxy_set_header X-Seen $remote_addr;
      proxy_set_header X-Fwd $proxy_add_x_forwarded_for;
      location /open { proxy_pass http://u; }
      location /acl {
        allow 10.0.0.0/8; deny 192.168.1.1; allow 192.168.1.0/24; allow 2001:db8::/32; deny all;
        proxy_pass http://u;
      }
      location /ret { deny all; return 200 "returned"; }
      location /peer { set_real_ip_from 192.0.2.1; allow 127.0.0.1; deny all; proxy_pass http://u; }
      location /xrealip { real_ip_header X-Real-IP; real_ip_recursive off; proxy_pass http://u; }
    }"#;

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: h.test\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn allow_deny_and_real_ip_decide_as_nginx() {
    let (vd, nd) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let side = |d: &Path| vec![("{LOG}".to_string(), d.display().to_string())];
    let t = Twin::start_texts(CONF, 1, &side(vd.path()), &side(nd.path())).await;
    let cases: &[(&str, &str, u16)] = &[
        ("/open", "", 200),
        ("/open", "X-Forwarded-For: 1.2.3.4\r\n", 200),
        ("/open", "X-Forwarded-For: 1.2.3.4, 10.0.0.5\r\n", 200),
        (
            "/open",
            "X-Forwarded-For: 9.9.9.9\r\nX-Forwarded-For: 8.8.8.8, 10.1.1.1\r\n",
            200,
        ),
        ("/open", "X-Forwarded-For: junk\r\n", 200),
        ("/acl", "", 403),
        ("/acl", "X-Forwarded-For: 10.2.3.4\r\n", 200),
        ("/acl", "X-Forwarded-For: 192.168.1.1\r\n", 403),
        ("/acl", "X-Forwarded-For: 192.168.1.7\r\n", 200),
        ("/acl", "X-Forwarded-For: 192.168.1.7, 8.8.8.8\r\n", 403),
        ("/acl", "X-Forwarded-For: 2001:db8::7\r\n", 200),
        ("/acl", "X-Forwarded-For: ::ffff:192.168.1.7\r\n", 200),
        ("/ret", "", 200),
        // The server's realip (nginx's post-read phase) applied first:
        // the location's own set_real_ip_from does not run again.
        ("/peer", "X-Forwarded-For: 10.2.3.4\r\n", 403),
        ("/peer", "", 200),
        (
            "/xrealip",
            "X-Real-IP: 5.6.7.8\r\nX-Forwarded-For: 10.2.3.4\r\n",
            200,
        ),
        // No X-Forwarded-For: the server's declined, the location's apply.
        ("/xrealip", "X-Real-IP: 5.6.7.8\r\n", 200),
    ];
    for (path, extra, status) in cases {
        let (v, n) = t.send(&get(path, extra)).await;
        assert_eq!((v.status, n.status), (*status, *status), "{path} {extra:?}");
        if *status == 200 && *path != "/ret" {
            let seen = |s: &[crate::support::Seen]| {
                let last = s.last().expect("a request upstream");
                let h = |n: &str| {
                    last.headers
                        .get(n)
                        .map(|v| v.to_str().unwrap_or("?").to_string())
                };
                (h("x-seen"), h("x-fwd"))
            };
            let (vs, ns) = t.seen(0);
            assert_eq!(seen(&vs), seen(&ns), "{path} {extra:?}");
        }
    }
    let read = |d: &Path| std::fs::read_to_string(d.join("ip.log")).unwrap_or_default();
    eventually("both logs", || {
        read(vd.path()).lines().count() >= cases.len()
            && read(nd.path()).lines().count() >= cases.len()
    })
    .await;
    assert_eq!(read(vd.path()), read(nd.path()));
    let log = read(vd.path());
    assert!(log.contains("192.168.1.1 127.0.0.1 403\n"), "{log}");
    assert!(log.contains("10.2.3.4 127.0.0.1 403\n"), "{log}");
    assert!(log.ends_with("5.6.7.8 127.0.0.1 200\n"), "{log}");
}
