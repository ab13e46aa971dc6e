//! The status page in tengine's formats, and the Prometheus endpoint.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use vigil_checker::status::StatusPage;
use vigil_core::clock::Timestamp;
use vigil_core::health::{ProbePhase, ProbeReport};
use vigil_core::peer::PeerId;

use crate::support::registry;

fn report(ok: bool) -> ProbeReport {
    ProbeReport {
        ok,
        phase: (!ok).then_some(ProbePhase::Connect),
        latency: Duration::from_millis(3),
        detail: if ok {
            "HTTP 200".into()
        } else {
            "connection refused".into()
        },
        at: Timestamp(2_000),
    }
}

async fn get(page: &StatusPage, uri: &str) -> (u16, String, String) {
    get_accepting(page, uri, "*/*").await
}

/// `get` with `accept` as the `Accept` header.
async fn get_accepting(page: &StatusPage, uri: &str, accept: &str) -> (u16, String, String) {
    let req = Request::get(uri)
        .header(http::header::ACCEPT, accept)
        .body(())
        .expect("test step");
    let resp = page.respond(&req);
    let ct = resp.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .expect("test step")
        .to_string();
    let status = resp.status().as_u16();
    let body: Bytes = resp
        .into_body()
        .collect()
        .await
        .expect("test step")
        .to_bytes();
    (
        status,
        ct,
        String::from_utf8(body.to_vec()).expect("test step"),
    )
}

fn page() -> StatusPage {
    let (r, _e, _c) = registry(
        "upstream backend { server 192.168.0.1:80; server 192.168.0.2:80; check interval=3000 rise=2 fall=5 timeout=1000 type=http port=8080; }
         upstream plain { server 10.0.0.1:80; }
         upstream db { server 10.0.0.9:5432; check interval=3000 timeout=1000 default_down=false; }",
    );
    let b = r.get("backend").expect("test step");
    b.record_probe(PeerId(0), report(true));
    b.record_probe(PeerId(0), report(true));
    b.record_probe(PeerId(1), report(false));
    StatusPage::new(move || r.clone())
}

#[tokio::test]
async fn csv_is_tengines_line_format() {
    let (status, ct, body) = get(&page(), "/status?format=csv").await;
    assert_eq!((status, ct.as_str()), (200, "text/plain"));
    assert_eq!(
        body,
        "0,backend,192.168.0.1:80,up,2,0,http,8080\n\
         1,backend,192.168.0.2:80,down,0,1,http,8080\n\
         2,db,10.0.0.9:5432,up,0,0,tcp,0\n"
    );
    let (_, _, down) = get(&page(), "/status?format=csv&status=DOWN").await;
    assert_eq!(down, "1,backend,192.168.0.2:80,down,0,1,http,8080\n");
}

#[tokio::test]
async fn json_is_tengines_layout_and_valid_with_a_filter() {
    let (_, ct, body) = get(&page(), "/status?format=json").await;
    assert_eq!(ct, "application/json");
    assert_eq!(
        body,
        "{\"servers\": {\n  \"total\": 3,\n  \"up\": 2,\n  \"down\": 1,\n  \"generation\": 1,\n  \"server\": [\n\
         \x20   {\"index\": 0, \"upstream\": \"backend\", \"name\": \"192.168.0.1:80\", \"status\": \"up\", \"rise\": 2, \"fall\": 0, \"type\": \"http\", \"port\": 8080},\n\
         \x20   {\"index\": 1, \"upstream\": \"backend\", \"name\": \"192.168.0.2:80\", \"status\": \"down\", \"rise\": 0, \"fall\": 1, \"type\": \"http\", \"port\": 8080},\n\
         \x20   {\"index\": 2, \"upstream\": \"db\", \"name\": \"10.0.0.9:5432\", \"status\": \"up\", \"rise\": 0, \"fall\": 0, \"type\": \"tcp\", \"port\": 0}\n\
         \x20 ]\n}}\n"
    );
    // The original module left a trailing comma with status=down (yaoweibin#121).
    for filter in ["up", "down"] {
        let (_, _, body) = get(&page(), &format!("/status?format=json&status={filter}")).await;
        let v: serde_json::Value = serde_json::from_str(&body).expect("valid JSON");
        let n = v["servers"]["server"].as_array().expect("test step").len() as u64;
        assert_eq!(v["servers"]["total"].as_u64(), Some(n));
        assert_eq!(v["servers"][filter].as_u64(), Some(n));
    }
}

#[tokio::test]
async fn html_has_tengines_table_and_red_down_rows() {
    let (_, ct, body) = get(&page(), "/status").await;
    assert_eq!(ct, "text/html");
    assert!(body.contains("<h1>Nginx http upstream check status</h1>\n<h2>Check upstream server number: 3, generation: 1</h2>\n"), "{body}");
    assert!(body.contains("    <th>Index</th>\n    <th>Upstream</th>\n    <th>Name</th>\n    <th>Status</th>\n    <th>Rise counts</th>\n    <th>Fall counts</th>\n    <th>Check type</th>\n    <th>Check port</th>\n"));
    assert!(body.contains("  <tr bgcolor=\"#FF0000\">\n    <td>1</td>\n    <td>backend</td>\n    <td>192.168.0.2:80</td>\n    <td>down</td>\n    <td>0</td>\n    <td>1</td>\n    <td>http</td>\n    <td>8080</td>\n  </tr>\n"));
    assert!(body.ends_with("</table>\n</body>\n</html>\n"));
}

#[tokio::test]
async fn metrics_are_typed_prometheus_text() {
    let (status, ct, body) = get(&page(), "/metrics").await;
    assert_eq!(
        (status, ct.as_str()),
        (200, "text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        body.contains("# TYPE nginx_upstream_count_total gauge\nnginx_upstream_count_total 3\n")
    );
    assert!(
        body.contains("# TYPE nginx_upstream_server_rise gauge\n"),
        "rise resets: a gauge"
    );
    assert!(body.contains(
        "nginx_upstream_server_active{index=\"1\",upstream=\"backend\",name=\"192.168.0.2:80\",type=\"http\",port=\"8080\"} 0\n"
    ));
    assert!(body.contains("vigil_peer_up{upstream=\"backend\",peer=\"192.168.0.1:80\"} 1\n"));
    assert!(body.contains("vigil_peer_probe_decided{upstream=\"db\",peer=\"10.0.0.9:5432\"} 0\n"));
    // Every sample belongs to a metric declared once, with its samples together.
    assert_families_are_blocks(&body);
}

/// Each sample's family is declared once by `# TYPE`, its samples together.
fn assert_families_are_blocks(body: &str) {
    let mut declared = Vec::new();
    let mut last = String::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().expect("test step").to_string();
            assert!(!declared.contains(&name), "{name} declared twice");
            declared.push(name.clone());
            last = name;
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().expect("test step");
            assert!(name.starts_with(&last), "{name} outside its block ({last})");
        }
    }
}

#[tokio::test]
async fn metrics_are_openmetrics_when_the_scraper_asks() {
    let page = page();
    let probes = std::sync::Arc::new(vigil_checker::Metrics::default());
    let prometheus = page.prometheus_registry(Some(probes));
    let page = page.with_prometheus(std::sync::Arc::new(prometheus));
    // What Prometheus 3 sends by default.
    let accept = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
                  application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;\
                  escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
    let (_, ct, body) = get_accepting(&page, "/metrics", accept).await;
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(body.ends_with("\n# EOF\n"), "{body}");
    assert!(
        body.contains("# TYPE nginx_upstream_count_total gauge\nnginx_upstream_count_total 3\n")
    );
    assert!(body.contains(
        "nginx_upstream_server_active{index=\"1\",upstream=\"backend\",name=\"192.168.0.2:80\",type=\"http\",port=\"8080\"} 0\n"
    ));
    // A counter's family is named without `_total`; its sample has it.
    assert!(
        body.contains(
            "# TYPE vigil_probe_transitions counter\nvigil_probe_transitions_total{to=\"up\"} 0\n"
        ),
        "{body}"
    );
    assert_families_are_blocks(&body);
    let req = Request::get("/metrics").body(()).expect("test step");
    assert_eq!(
        page.respond(&req).headers()[http::header::VARY],
        "accept",
        "the format depends on Accept"
    );
    // Refused (q=0) or not named: Prometheus text 0.0.4.
    for accept in ["application/openmetrics-text;q=0, text/plain", "*/*"] {
        let (_, ct, body) = get_accepting(&page, "/metrics", accept).await;
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8", "{accept}");
        assert!(body.contains("# TYPE vigil_probe_transitions_total counter\n"));
        assert!(!body.contains("# EOF"));
    }
}

#[tokio::test]
async fn only_get_and_head() {
    let page = page();
    let req = Request::post("/status").body(()).expect("test step");
    assert_eq!(page.respond(&req).status().as_u16(), 405);
    let req = Request::head("/status?format=csv")
        .body(())
        .expect("test step");
    let resp = page.respond(&req);
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp
        .into_body()
        .collect()
        .await
        .expect("test step")
        .to_bytes()
        .is_empty());
    let (status, _, _) = get(&page, "/nope").await;
    assert_eq!(status, 404);
}
