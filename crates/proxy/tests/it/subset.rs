//! The reverse-proxy subset that real confs carry, each conf served by
//! vigil and by a stock nginx: `error_log` below main, and the variables
//! of `proxy_set_header`, compared on what the backends saw.

use crate::twin::Twin;

fn get(target: &str, extra: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: x.test\r\n{extra}Connection: close\r\n\r\n")
        .into_bytes()
}

/// The value of header `name` in every request backend `i` saw, per side.
fn header_seen(t: &Twin, i: usize, name: &str) -> (Vec<String>, Vec<String>) {
    let of = |seen: Vec<crate::support::Seen>| {
        seen.iter()
            .map(|s| {
                s.headers
                    .get(name)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .unwrap_or_else(|| "<none>".to_string())
            })
            .collect()
    };
    let (v, n) = t.seen(i);
    (of(v), of(n))
}

#[tokio::test]
async fn error_log_in_http_server_and_location_is_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display();
    let t = Twin::start(
        &format!(
            "error_log {d}/http.log warn;
             upstream u {{ server {{B0}}; }}
             server {{ listen {{LISTEN}}; error_log {d}/server.log;
               location / {{ error_log {d}/location.log info; proxy_pass http://u; }} }}"
        ),
        1,
    )
    .await;
    let (v, n) = t.send(&get("/x", "")).await;
    assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    assert_eq!(v.body, n.body);
}

#[tokio::test]
async fn args_cookies_request_and_server_name_reach_the_backend_as_from_nginx() {
    let t = Twin::start(
        "upstream u { server {B0}; }
         server { listen {LISTEN}; server_name .names.test other.test;
           location / { proxy_pass http://u;
             proxy_set_header X-A \"[$arg_a]\";
             proxy_set_header X-Args \"[$args]\";
             proxy_set_header X-C \"[$cookie_b]\";
             proxy_set_header X-R \"[$request]\";
             proxy_set_header X-S \"[$server_name]\"; } }",
        1,
    )
    .await;
    let requests: Vec<Vec<u8>> = vec![
        get("/x?a=1&b=2", "Cookie: a=1; b=2\r\n"),
        get("/x?a&a=2", "Cookie: B=3\r\n"),
        get("/x?xa=1&A=5&a=6", "Cookie: xb=1; b = 4 ; c=5\r\n"),
        get("/x?", "Cookie: a=1, b=7\r\nCookie: b=8\r\n"),
        get("/x", "Cookie: c=1\r\nCookie: b=9;d\r\n"),
        get("/x?b=%20+", "Cookie: bb=1;b\r\n"),
        b"GET /old?q HTTP/1.0\r\nHost: x.test\r\n\r\n".to_vec(),
    ];
    for r in &requests {
        let (v, n) = t.send(r).await;
        assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    }
    for h in ["x-a", "x-args", "x-c", "x-r", "x-s"] {
        let (v, n) = header_seen(&t, 0, h);
        assert_eq!(v, n, "{h} (vigil, nginx)");
        assert_eq!(v.len(), requests.len());
    }
    let (v, _) = header_seen(&t, 0, "x-c");
    assert_eq!(v[0], "[2]", "{v:?}");
    let (v, _) = header_seen(&t, 0, "x-r");
    assert_eq!(v[6], "[GET /old?q HTTP/1.0]");
}

#[tokio::test]
async fn request_id_is_32_hex_digits_new_for_each_request() {
    let t = Twin::start(
        "upstream u { server {B0}; }
         server { listen {LISTEN};
           location / { proxy_pass http://u;
             proxy_set_header X-Id $request_id; proxy_set_header X-Id2 $request_id; } }",
        1,
    )
    .await;
    for _ in 0..3 {
        let (v, n) = t.send(&get("/", "")).await;
        assert_eq!((v.status, n.status), (200, 200));
    }
    let (v, n) = header_seen(&t, 0, "x-id");
    let (v2, n2) = header_seen(&t, 0, "x-id2");
    for (ids, again, side) in [(&v, &v2, "vigil"), (&n, &n2, "nginx")] {
        assert_eq!(ids, again, "{side}: one id per request");
        assert!(
            ids.iter()
                .all(|i| i.len() == 32 && i.bytes().all(|b| b.is_ascii_hexdigit())),
            "{side}: {ids:?}"
        );
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 3, "{side}: {ids:?}");
    }
}

#[tokio::test]
async fn request_id_in_the_access_log_is_the_one_sent_upstream() {
    let b = crate::support::Backend::named("b").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let p = crate::support::start_proxy(&format!(
        "http {{ upstream u {{ server {}; }}
           server {{ listen {{LISTEN}}; access_log {} json;
             location / {{ proxy_pass http://u; proxy_set_header X-Id $request_id; }} }} }}",
        b.addr,
        log.display()
    ))
    .await;
    let r = crate::twin::raw(p.addr, &get("/", "")).await;
    assert_eq!(r.status, 200);
    crate::support::eventually("a log line", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    let line = std::fs::read_to_string(&log).expect("log");
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    let sent = b.requests()[0].headers["x-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert_eq!(sent.len(), 32);
    assert_eq!(v["request_id"], sent.as_str());
}
