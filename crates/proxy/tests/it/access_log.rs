//! `log_format` and `access_log`: the same requests through vigil and a
//! stock nginx on the same conf write the same lines (the time masked).

use std::path::{Path, PathBuf};

use crate::support::eventually;
use crate::twin::Twin;

/// Both sides' log directory, and a twin whose `{LOG}` is each side's.
async fn twin(conf: &str) -> (Twin, tempfile::TempDir, tempfile::TempDir) {
    let (vd, nd) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let side = |d: &Path| vec![("{LOG}".to_string(), d.display().to_string())];
    let t = Twin::start_texts(conf, 1, &side(vd.path()), &side(nd.path())).await;
    (t, vd, nd)
}

/// The lines of `file` in both directories once each has `n`, with
/// `[...]` (the time) masked.
async fn lines(vd: &Path, nd: &Path, file: &str, n: usize) -> (Vec<String>, Vec<String>) {
    let read = |d: &Path| -> Vec<String> {
        let p: PathBuf = d.join(file);
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(mask_time)
            .collect()
    };
    eventually(&format!("{n} lines in {file}"), || {
        read(vd).len() >= n && read(nd).len() >= n
    })
    .await;
    (read(vd), read(nd))
}

fn mask_time(l: &str) -> String {
    match (l.find('['), l.find(']')) {
        (Some(a), Some(b)) if a < b => format!("{}[TIME]{}", &l[..a], &l[b + 1..]),
        _ => l.to_string(),
    }
}

const CONF: &str = r#"
    log_format j escape=json '{"ua":"$http_user_agent","s":$status,"b":$body_bytes_sent,'
                             '"r":"$request","x":"$http_x_missing","q":"$arg_q","u":"$remote_user"}';
    log_format raw escape=none "$request_method $uri $http_x_note|$upstream_status|$status";
    upstream u { server {B0}; }
    server { listen {LISTEN};
      access_log {LOG}/access.log;
      location /j { access_log {LOG}/j.log j; proxy_pass http://u; }
      location /raw { access_log {LOG}/raw.log raw if=$arg_log; proxy_pass http://u; }
      location /ret { return 200 "twelve bytes"; }
      location /close { return 444; }
      location /off { access_log off; proxy_pass http://u; }
      location / { proxy_pass http://u; }
    }"#;

#[tokio::test]
async fn combined_lines_are_nginx_s_byte_for_byte() {
    let (t, vd, nd) = twin(CONF).await;
    let reqs: &[&[u8]] = &[
        b"GET /a?x=1 HTTP/1.1\r\nHost: h.test\r\nUser-Agent: curl/8.5\r\nReferer: http://r.test/p\r\nConnection: close\r\n\r\n",
        b"GET /q HTTP/1.1\r\nHost: h.test\r\nUser-Agent: x \"quoted\" \\ \xe9\xff\tend\r\nConnection: close\r\n\r\n",
        b"GET /auth HTTP/1.1\r\nHost: h.test\r\nAuthorization: Basic YWxpY2U6c2VjcmV0\r\nReferer:\r\nConnection: close\r\n\r\n",
        b"HEAD /head HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
        b"GET /ret HTTP/1.0\r\n\r\n",
        b"GET /close HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
        b"GET /off HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
    ];
    for r in reqs {
        let (v, n) = t.send(r).await;
        assert_eq!(v.status, n.status, "{}", String::from_utf8_lossy(r));
    }
    let (v, n) = lines(vd.path(), nd.path(), "access.log", 6).await;
    assert_eq!(v, n);
    assert_eq!(v.len(), 6, "/off is not logged: {v:#?}");
    assert_eq!(
        v[0],
        "127.0.0.1 - - [TIME] \"GET /a?x=1 HTTP/1.1\" 200 2 \"http://r.test/p\" \"curl/8.5\""
    );
    assert!(
        v[1].contains(r#""x \x22quoted\x22 \x5C \xE9\xFF\x09end""#),
        "{}",
        v[1]
    );
    assert!(v[2].starts_with("127.0.0.1 - alice [TIME]"), "{}", v[2]);
    assert!(v[2].ends_with(" 200 2 \"\" \"-\""), "{}", v[2]);
    assert!(v[3].contains("\"HEAD /head HTTP/1.1\" 200 0 "), "{}", v[3]);
    assert!(v[4].contains("\"GET /ret HTTP/1.0\" 200 12 "), "{}", v[4]);
    assert!(v[5].contains("\"GET /close HTTP/1.1\" 444 0 "), "{}", v[5]);
}

#[tokio::test]
async fn custom_formats_escape_and_if_as_nginx() {
    let (t, vd, nd) = twin(CONF).await;
    let reqs: &[&[u8]] = &[
        b"GET /j?q=a%22b HTTP/1.1\r\nHost: h.test\r\nUser-Agent: say \"hi\"\\\t\xc3\xa9\r\nConnection: close\r\n\r\n",
        b"GET /j HTTP/1.1\r\nHost: h.test\r\nAuthorization: Basic Ym9iOng=\r\nConnection: close\r\n\r\n",
        b"GET /raw/1?log=1 HTTP/1.1\r\nHost: h.test\r\nX-Note: a \"b\"\r\nConnection: close\r\n\r\n",
        b"GET /raw/2?log=0 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
        b"GET /raw/3 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
        b"GET /raw/4?log=yes HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
    ];
    for r in reqs {
        let (v, n) = t.send(r).await;
        assert_eq!(v.status, n.status, "{}", String::from_utf8_lossy(r));
    }
    let (v, n) = lines(vd.path(), nd.path(), "j.log", 2).await;
    assert_eq!(v, n);
    assert_eq!(
        v[0],
        r#"{"ua":"say \"hi\"\\\té","s":200,"b":2,"r":"GET /j?q=a%22b HTTP/1.1","x":"","q":"a%22b","u":""}"#
    );
    assert!(v[1].ends_with(r#""u":"bob"}"#), "{}", v[1]);
    let (v, n) = lines(vd.path(), nd.path(), "raw.log", 2).await;
    assert_eq!(v, n);
    assert_eq!(
        v,
        ["GET /raw/1 a \"b\"|200|200", "GET /raw/4 |200|200"],
        "if=$arg_log: \"0\" and empty are not logged"
    );
}
