//! OpenTelemetry export against an in-process OTLP/HTTP receiver: a
//! retried request becomes one `request` span with one `attempt` child per
//! peer tried, and the metrics arrive with the same counts `/metrics` shows.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vigil_core::config::TelemetryConfig;
use vigil_core::event::EventBus;
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::{Generation, Proxy, ProxyMetrics, Telemetry, TelemetryError};

use crate::support::{eventually, get, load, Backend};

/// What the receiver was sent.
#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    other: Vec<String>,
}

/// An OTLP/HTTP collector on 127.0.0.1 decoding protobuf bodies.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Received>>,
    stop: CancellationToken,
}

impl Receiver {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let got = Arc::new(Mutex::new(Received::default()));
        let stop = CancellationToken::new();
        let (g, st) = (got.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    _ = st.cancelled() => return,
                };
                let g = g.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let g = g.clone();
                        async move { Ok::<_, Infallible>(receive(&g, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, got, stop }
    }

    fn spans(&self) -> Vec<Span> {
        let got = self.got.lock().expect("lock");
        got.traces
            .iter()
            .flat_map(|t| &t.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn receive(got: &Mutex<Received>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let is_proto = parts
        .headers
        .get("content-type")
        .is_some_and(|v| v == "application/x-protobuf");
    let mut got = got.lock().expect("lock");
    let ok = match (parts.method.as_str(), parts.uri.path()) {
        ("POST", "/v1/traces") if is_proto => ExportTraceServiceRequest::decode(body)
            .map(|t| got.traces.push(t))
            .is_ok(),
        ("POST", "/v1/metrics") if is_proto => ExportMetricsServiceRequest::decode(body)
            .map(|m| got.metrics.push(m))
            .is_ok(),
        (m, p) => {
            got.other.push(format!("{m} {p}"));
            false
        }
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    if !ok {
        *resp.status_mut() = StatusCode::BAD_REQUEST;
    }
    resp.headers_mut().insert(
        "content-type",
        "application/x-protobuf".parse().expect("value"),
    );
    resp
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(attrs: &[KeyValue], key: &str) -> String {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

fn int(attrs: &[KeyValue], key: &str) -> i64 {
    match attr(attrs, key) {
        Some(any_value::Value::IntValue(i)) => *i,
        other => panic!("{key}: {other:?}"),
    }
}

/// The latest value of the monotonic sum `name` at the data point whose
/// attributes include every `(key, value)` of `with`.
fn sum_value(got: &Received, name: &str, with: &[(&str, &str)]) -> Option<i64> {
    got.metrics
        .iter()
        .flat_map(|m| &m.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == name)
        .filter_map(|m| match &m.data {
            Some(metric::Data::Sum(s)) => Some(&s.data_points),
            _ => None,
        })
        .flatten()
        .filter(|p| {
            with.iter().all(|(k, v)| {
                attr(&p.attributes, k) == Some(&any_value::Value::StringValue(v.to_string()))
            })
        })
        .filter_map(|p| match p.value {
            Some(number_data_point::Value::AsInt(i)) => Some(i),
            _ => None,
        })
        .next_back()
}

/// A proxy serving with metrics.
struct Served {
    addr: SocketAddr,
    proxy: Arc<Proxy>,
    shutdown: CancellationToken,
}

/// A proxy with metrics and, when given, a tracer, on `{LISTEN}` of `conf`.
async fn start_proxy(
    conf: &str,
    metrics: Arc<ProxyMetrics>,
    telemetry: Option<&Telemetry>,
) -> Served {
    let addr = vigil_testkit::free_addr();
    let config = load(&conf.replace("{LISTEN}", &addr.to_string()));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    let generation =
        Generation::build(config, None, events.clone(), clock.clone()).expect("routes");
    let mut proxy =
        Proxy::new(generation, events, clock, std::env::temp_dir()).with_metrics(metrics);
    if let Some(t) = telemetry {
        proxy = proxy.with_tracer(t.tracer());
    }
    let listener = vigil_proxy::bind(addr, false, None).expect("bind proxy");
    let shutdown = CancellationToken::new();
    let proxy = Arc::new(proxy);
    tokio::spawn(vigil_proxy::serve(
        proxy.clone(),
        listener,
        shutdown.clone(),
        Duration::from_secs(1),
    ));
    Served {
        addr,
        proxy,
        shutdown,
    }
}

fn retrying_conf(failing: &Backend, healthy: &Backend) -> String {
    format!(
        "http {{ upstream u {{ server {}; server {}; }}
           server {{ listen {{LISTEN}};
             location / {{ proxy_pass http://u; proxy_next_upstream error timeout http_503; }} }} }}",
        failing.addr, healthy.addr
    )
}

#[tokio::test]
async fn a_retried_request_is_one_span_with_a_child_per_attempt_and_metrics_follow() {
    let failing = Backend::start(|_| {
        let mut r = Response::new(Full::new(Bytes::from("busy")));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    })
    .await;
    let healthy = Backend::named("ok").await;
    let receiver = Receiver::start().await;
    let metrics = Arc::new(ProxyMetrics::new());
    let config = TelemetryConfig {
        otlp_endpoint: Some(format!("http://{}/", receiver.addr)),
        service_name: "vigil-test".into(),
        // Longer than the test: only the explicit flush exports metrics.
        export_interval: Duration::from_secs(600),
    };
    let telemetry = Telemetry::start(&config, metrics.clone())
        .expect("start")
        .expect("an endpoint turns telemetry on");
    let Served { addr, shutdown, .. } = start_proxy(
        &retrying_conf(&failing, &healthy),
        metrics.clone(),
        Some(&telemetry),
    )
    .await;

    let got = get(addr, "/orders").await;
    assert_eq!(
        (got.status, got.text()),
        (200, "ok".to_string()),
        "retried on the healthy peer"
    );
    assert_eq!((failing.requests().len(), healthy.requests().len()), (1, 1));

    telemetry.flush().await.expect("flush");
    eventually("spans at the receiver", || receiver.spans().len() >= 3).await;
    let spans = receiver.spans();
    let requests: Vec<&Span> = spans.iter().filter(|s| s.name == "request").collect();
    assert_eq!(requests.len(), 1, "one span per client request: {spans:#?}");
    let request = requests[0];
    assert_eq!(text(&request.attributes, "http.request.method"), "GET");
    assert_eq!(text(&request.attributes, "http.route"), "/");
    assert_eq!(text(&request.attributes, "vigil.upstream"), "u");
    assert_eq!(int(&request.attributes, "http.response.status_code"), 200);
    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.name == "attempt").collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(attempts.len(), 2, "one child per attempt: {spans:#?}");
    for a in &attempts {
        assert_eq!(
            a.parent_span_id, request.span_id,
            "attempts are children of the request"
        );
        assert_eq!(a.trace_id, request.trace_id);
        assert!(a.start_time_unix_nano >= request.start_time_unix_nano);
        assert!(a.end_time_unix_nano <= request.end_time_unix_nano);
    }
    let seen: Vec<(String, String)> = attempts
        .iter()
        .map(|a| {
            (
                text(&a.attributes, "vigil.peer"),
                text(&a.attributes, "vigil.outcome"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (failing.addr.to_string(), "http_503".to_string()),
            (healthy.addr.to_string(), "ok".to_string()),
        ]
    );
    assert_eq!(
        int(&attempts[0].attributes, "http.response.status_code"),
        503
    );
    assert_eq!(
        int(&attempts[0].attributes, "network.peer.port"),
        i64::from(failing.addr.port())
    );
    assert!(attr(&attempts[1].attributes, "vigil.connect_time_s").is_some());
    assert!(attr(&attempts[1].attributes, "vigil.duration_s").is_some());

    eventually("metrics at the receiver", || {
        let got = receiver.got.lock().expect("lock");
        sum_value(&got, "vigil_attempts_total", &[]).is_some()
    })
    .await;
    {
        let got = receiver.got.lock().expect("lock");
        assert!(got.other.is_empty(), "unexpected requests: {:?}", got.other);
        let service = got.metrics[0].resource_metrics[0]
            .resource
            .as_ref()
            .map(|r| text(&r.attributes, "service.name"));
        assert_eq!(service.as_deref(), Some("vigil-test"));
        let (f, h) = (failing.addr.to_string(), healthy.addr.to_string());
        let attempts = |peer: &str, outcome: &str| {
            sum_value(
                &got,
                "vigil_attempts_total",
                &[("upstream", "u"), ("peer", peer), ("outcome", outcome)],
            )
        };
        assert_eq!(attempts(&f, "http_503"), Some(1));
        assert_eq!(attempts(&h, "ok"), Some(1));
        assert_eq!(attempts(&f, "ok"), Some(0));
        assert_eq!(
            sum_value(&got, "vigil_retries_total", &[("upstream", "u")]),
            Some(1)
        );
        assert_eq!(
            sum_value(
                &got,
                "vigil_failures_counted_total",
                &[("peer", &f), ("class", "http_503")]
            ),
            Some(1)
        );
        assert_eq!(
            sum_value(
                &got,
                "vigil_requests_total",
                &[("upstream", "u"), ("status_class", "2xx")]
            ),
            Some(1)
        );
        assert_eq!(
            sum_value(&got, "vigil_exclusions_total", &[("peer", &f)]),
            Some(1)
        );
        assert_eq!(
            sum_value(
                &got,
                "vigil_request_duration_seconds_bucket",
                &[("upstream", "u"), ("le", "+Inf")]
            ),
            Some(1)
        );
    }
    // The same counts on /metrics.
    let mut prom = String::new();
    metrics.write_prometheus(&mut prom);
    let line = format!(
        "vigil_attempts_total{{upstream=\"u\",peer=\"{}\",outcome=\"http_503\"}} 1",
        failing.addr
    );
    assert!(prom.lines().any(|l| l == line), "{line}\n{prom}");
    assert!(prom.lines().any(|l| l
        == format!(
            "vigil_exclusions_total{{upstream=\"u\",peer=\"{}\"}} 1",
            failing.addr
        )));

    shutdown.cancel();
    telemetry.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn without_an_endpoint_nothing_starts_and_metrics_survive_a_reload() {
    let metrics = Arc::new(ProxyMetrics::new());
    let off = Telemetry::start(&TelemetryConfig::default(), metrics.clone()).expect("start");
    assert!(off.is_none(), "telemetry is off by default");
    let (a, b) = (Backend::named("a").await, Backend::named("b").await);
    let conf = |servers: String| {
        format!(
            "http {{ upstream u {{ {servers} }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}"
        )
    };
    let p = start_proxy(&conf(format!("server {};", a.addr)), metrics.clone(), None).await;
    assert_eq!(get(p.addr, "/").await.text(), "a");
    let prom = || {
        let mut out = String::new();
        metrics.write_prometheus(&mut out);
        out
    };
    let ok_a = format!(
        "vigil_attempts_total{{upstream=\"u\",peer=\"{}\",outcome=\"ok\"}}",
        a.addr
    );
    let ok_b = format!(
        "vigil_attempts_total{{upstream=\"u\",peer=\"{}\",outcome=\"ok\"}}",
        b.addr
    );
    assert!(
        prom().lines().any(|l| l == format!("{ok_a} 1")),
        "{}",
        prom()
    );

    // Reload with b added (and b first): a's counter goes on from 1.
    let text = conf(format!("server {}; server {};", b.addr, a.addr))
        .replace("{LISTEN}", &p.addr.to_string());
    p.proxy.reload(load(&text)).expect("reload");
    let got: Vec<String> = vec![get(p.addr, "/").await.text(), get(p.addr, "/").await.text()];
    assert_eq!(got.iter().filter(|t| *t == "a").count(), 1, "{got:?}");
    let out = prom();
    assert!(out.lines().any(|l| l == format!("{ok_a} 2")), "{out}");
    assert!(out.lines().any(|l| l == format!("{ok_b} 1")), "{out}");
    assert!(
        out.lines()
            .any(|l| l == "vigil_requests_total{upstream=\"u\",status_class=\"2xx\"} 3"),
        "{out}"
    );
    assert!(out.lines().any(|l| l == "vigil_reloads_total 1"), "{out}");
    assert_eq!(p.proxy.reloads(), 1);
    p.shutdown.cancel();
}

#[test]
fn starting_outside_a_runtime_is_an_error() {
    let config = TelemetryConfig {
        otlp_endpoint: Some("http://127.0.0.1:4318".into()),
        ..TelemetryConfig::default()
    };
    let err = Telemetry::start(&config, Arc::new(ProxyMetrics::new())).expect_err("no runtime");
    assert!(matches!(err, TelemetryError::NoRuntime(_)), "{err}");
}

#[tokio::test]
async fn failures_counted_are_what_core_charged() {
    // A port nobody listens on: connects are refused.
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let healthy = Backend::named("ok").await;
    let metrics = Arc::new(ProxyMetrics::new());
    let conf = format!(
        "http {{ upstream one {{ server {refused}; }}
           upstream two {{ server {refused}; server {}; }}
           server {{ listen {{LISTEN}};
             location /one {{ proxy_pass http://one; }}
             location /two {{ proxy_pass http://two; }} }} }}",
        healthy.addr
    );
    let p = start_proxy(&conf, metrics.clone(), None).await;
    assert_eq!(get(p.addr, "/one").await.status, 502);
    // Round robin starts at the refused server: charged, then retried.
    assert_eq!(get(p.addr, "/two").await.text(), "ok");
    let mut prom = String::new();
    metrics.write_prometheus(&mut prom);
    let value = |series: String| {
        prom.lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
            .map(str::to_string)
    };
    let counted = |up: &str| {
        value(format!(
            "vigil_failures_counted_total{{upstream=\"{up}\",peer=\"{refused}\",class=\"error\"}}"
        ))
    };
    let fails = |up: &str| {
        value(format!(
            "vigil_peer_fails{{upstream=\"{up}\",peer=\"{refused}\"}}"
        ))
    };
    // nginx never charges the single server of an upstream: neither does the counter.
    assert_eq!(fails("one").as_deref(), Some("0"), "{prom}");
    assert!(
        matches!(counted("one").as_deref(), None | Some("0")),
        "{prom}"
    );
    assert_eq!(fails("two").as_deref(), Some("1"), "{prom}");
    assert_eq!(counted("two").as_deref(), Some("1"), "{prom}");
    p.shutdown.cancel();
}

/// A charge made by a vigil-only rule is counted with the others and on
/// its own by rule: `passive_count after_header` for a body cut short (the
/// charge comes while the body streams), `last_try` for a listed status
/// that could not be retried.
#[tokio::test]
async fn charges_of_the_passive_count_rules_are_counted_by_rule() {
    let cut = crate::behaviour::cut_short_backend().await;
    let unwell = Backend::start(|_| {
        let mut r = Response::new(Full::new(Bytes::from("no")));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    })
    .await;
    let ok = Backend::named("ok").await;
    let metrics = Arc::new(ProxyMetrics::new());
    let conf = format!(
        "http {{ upstream body {{ passive_count after_header; server {cut}; server {ok}; }}
           upstream last {{ passive_count last_try; server {unwell}; server {ok}; }}
           server {{ listen {{LISTEN}};
             location /body {{ proxy_pass http://body; }}
             location /last {{ proxy_pass http://last; proxy_next_upstream error http_503;
                               proxy_next_upstream_tries 1; }} }} }}",
        ok = ok.addr,
        unwell = unwell.addr
    );
    let p = start_proxy(&conf, metrics.clone(), None).await;
    // Round robin starts at the first server of each.
    let got = get(p.addr, "/body").await;
    assert!(got.body.is_err(), "cut short: {:?}", got.body);
    assert_eq!(get(p.addr, "/last").await.status, 503);
    let series = |up: &str, peer: SocketAddr, tail: &str| {
        let mut prom = String::new();
        metrics.write_prometheus(&mut prom);
        let name = format!("{{upstream=\"{up}\",peer=\"{peer}\",{tail}}} ");
        prom.lines()
            .find_map(|l| l.split_once(name.as_str()).map(|(_, v)| v.to_string()))
    };
    eventually("the after_header charge counted", || {
        series("body", cut, "rule=\"after_header\"").as_deref() == Some("1")
    })
    .await;
    assert_eq!(
        series("last", unwell.addr, "rule=\"last_try\"").as_deref(),
        Some("1")
    );
    assert_eq!(
        series("last", unwell.addr, "class=\"http_503\"").as_deref(),
        Some("1")
    );
    assert_eq!(
        series("body", cut, "rule=\"last_try\"").as_deref(),
        Some("0")
    );
    p.shutdown.cancel();
}
