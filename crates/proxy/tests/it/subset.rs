//! The reverse-proxy subset that real confs carry, each conf served by
//! vigil and by a stock nginx: `error_log` below main, and the variables
//! of `proxy_set_header`, compared on what the backends saw.

use crate::twin::Twin;

fn get(target: &str, extra: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: x.test\r\n{extra}Connection: close\r\n\r\n")
        .into_bytes()
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
