use std::sync::Arc;
use std::time::Duration;

use vigil_config::{literal_resolver, nginx};
use vigil_core::event::{Event, EventBus, EventKind};
use vigil_core::peer::{AdminState, PeerId};
use vigil_core::registry::Registry;
use vigil_core::upstream::Accounting;
use vigil_core::{Clock, FailureClass, ManualClock, Timestamp};

use super::stats::class_index;
use super::{Outcome, ProxyMetrics};

fn registry(conf: &str, previous: Option<&Registry>) -> Arc<Registry> {
    let loaded = nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
        .unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Registry::build(
        &loaded.config,
        previous,
        Arc::new(EventBus::default()),
        clock(),
    ))
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::at(1_000))
}

const TWO: &str = "http { upstream api { server 127.0.0.1:8001; server 127.0.0.1:8002; }
    upstream static { server 127.0.0.1:9001; } }";

fn text(m: &ProxyMetrics) -> String {
    let mut out = String::new();
    m.write_prometheus(&mut out);
    out
}

/// The value of the sample `series` (name and labels exactly as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn every_metric_has_help_and_type_once_and_samples_are_well_formed() {
    let m = ProxyMetrics::new();
    let g = m.attach(&registry(TWO, None), &clock());
    g.upstream("api")
        .expect("api")
        .request(200, Duration::from_millis(3));
    let out = text(&m);
    let families = [
        ("vigil_requests_total", "counter"),
        ("vigil_request_duration_seconds", "histogram"),
        ("vigil_attempts_total", "counter"),
        ("vigil_retries_total", "counter"),
        ("vigil_failures_counted_total", "counter"),
        ("vigil_no_live_upstreams_total", "counter"),
        ("vigil_hedges_total", "counter"),
        ("vigil_retries_denied_total", "counter"),
        ("vigil_exclusions_total", "counter"),
        ("vigil_ejections_total", "counter"),
        ("vigil_rule_charges_total", "counter"),
        ("vigil_peer_active_connections", "gauge"),
        ("vigil_peer_state", "gauge"),
        ("vigil_peer_fails", "gauge"),
        ("vigil_reloads_total", "counter"),
    ];
    for (name, kind) in families {
        let type_line = format!("# TYPE {name} {kind}");
        assert_eq!(
            out.lines().filter(|l| *l == type_line).count(),
            1,
            "{name}\n{out}"
        );
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with(&format!("# HELP {name} ")))
                .count(),
            1,
            "{name}"
        );
    }
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("value");
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let name = series.split('{').next().unwrap_or("");
        assert!(
            families.iter().any(|(f, _)| name.starts_with(f)),
            "unknown family: {line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "{line}"
            );
        }
    }
}

#[test]
fn counts_land_on_their_label_sets() {
    let m = ProxyMetrics::new();
    let g = m.attach(&registry(TWO, None), &clock());
    let api = g.upstream("api").expect("api");
    api.attempt(PeerId(0), Outcome::Failed(FailureClass::Http503));
    api.charged(
        PeerId(0),
        Accounting {
            charged: Some(FailureClass::Http503),
            ..Accounting::default()
        },
    );
    api.retry();
    api.attempt(PeerId(1), Outcome::Ok);
    api.request(200, Duration::from_millis(7));
    api.request(502, Duration::from_secs(2));
    api.no_live_upstreams();
    let out = text(&m);
    let v = |s: &str| sample(&out, s).unwrap_or_else(|| panic!("no {s}\n{out}"));
    let p0 = "upstream=\"api\",peer=\"127.0.0.1:8001\"";
    let p1 = "upstream=\"api\",peer=\"127.0.0.1:8002\"";
    assert_eq!(
        v(&format!(
            "vigil_attempts_total{{{p0},outcome=\"http_503\"}}"
        )),
        1.0
    );
    assert_eq!(
        v(&format!("vigil_attempts_total{{{p0},outcome=\"ok\"}}")),
        0.0
    );
    assert_eq!(
        v(&format!("vigil_attempts_total{{{p1},outcome=\"ok\"}}")),
        1.0
    );
    assert_eq!(
        v(&format!(
            "vigil_failures_counted_total{{{p0},class=\"http_503\"}}"
        )),
        1.0
    );
    assert!(
        !out.contains("class=\"http_404\""),
        "http_403/404 are never counted, so never shown"
    );
    assert_eq!(v("vigil_retries_total{upstream=\"api\"}"), 1.0);
    assert_eq!(v("vigil_retries_total{upstream=\"static\"}"), 0.0);
    assert_eq!(v("vigil_no_live_upstreams_total{upstream=\"api\"}"), 1.0);
    assert_eq!(
        v("vigil_requests_total{upstream=\"api\",status_class=\"2xx\"}"),
        1.0
    );
    assert_eq!(
        v("vigil_requests_total{upstream=\"api\",status_class=\"5xx\"}"),
        1.0
    );
    assert_eq!(
        v("vigil_requests_total{upstream=\"static\",status_class=\"2xx\"}"),
        0.0
    );
    // The histogram is cumulative and +Inf equals _count.
    let b = |le: &str| {
        v(&format!(
            "vigil_request_duration_seconds_bucket{{upstream=\"api\",le=\"{le}\"}}"
        ))
    };
    assert_eq!(
        (b("0.005"), b("0.01"), b("1"), b("2.5"), b("+Inf")),
        (0.0, 1.0, 1.0, 2.0, 2.0)
    );
    assert_eq!(
        v("vigil_request_duration_seconds_count{upstream=\"api\"}"),
        2.0
    );
    assert!((v("vigil_request_duration_seconds_sum{upstream=\"api\"}") - 2.007).abs() < 1e-9);
}

#[test]
fn counts_written_by_several_workers_are_summed_in_one_scrape() {
    let m = ProxyMetrics::new();
    let g = m.attach(&registry(TWO, None), &clock());
    // Each worker adds to counters of its own (one per core; workers past
    // that share them): the scrape reads their sums, whichever shard
    // each worker's counts went to.
    let workers = crate::conn::shard::count() + 1;
    std::thread::scope(|s| {
        for w in 0..workers {
            let api = g.upstream("api").expect("api").clone();
            s.spawn(move || {
                crate::conn::shard::enter(w);
                for _ in 0..=w {
                    api.request(200, Duration::from_millis(3));
                    api.attempt(PeerId(1), Outcome::Ok);
                }
                api.request(504, Duration::from_secs(1));
            });
        }
    });
    let out = text(&m);
    let v = |s: &str| sample(&out, s).unwrap_or_else(|| panic!("no {s}\n{out}"));
    let ok = (1..=workers).sum::<usize>() as f64;
    assert_eq!(
        v("vigil_requests_total{upstream=\"api\",status_class=\"2xx\"}"),
        ok
    );
    assert_eq!(
        v("vigil_requests_total{upstream=\"api\",status_class=\"5xx\"}"),
        workers as f64
    );
    assert_eq!(
        v("vigil_attempts_total{upstream=\"api\",peer=\"127.0.0.1:8002\",outcome=\"ok\"}"),
        ok
    );
    assert_eq!(
        v("vigil_request_duration_seconds_bucket{upstream=\"api\",le=\"0.005\"}"),
        ok
    );
    assert_eq!(
        v("vigil_request_duration_seconds_count{upstream=\"api\"}"),
        ok + workers as f64
    );
    let sum = v("vigil_request_duration_seconds_sum{upstream=\"api\"}");
    assert!((sum - (ok * 0.003 + workers as f64)).abs() < 1e-9, "{sum}");
}

#[test]
fn gauges_read_core_state_at_scrape() {
    let conf = "http { upstream api { server 127.0.0.1:8001; server 127.0.0.1:8002 down;
        server 127.0.0.1:8003; } }";
    let reg = registry(conf, None);
    let m = ProxyMetrics::new();
    m.attach(&reg, &clock());
    let up = reg.get("api").expect("api");
    up.set_admin(PeerId(2), AdminState::Drain, Timestamp(1_000));
    let out = text(&m);
    let state = |peer: &str, s: &str| {
        sample(
            &out,
            &format!("vigil_peer_state{{upstream=\"api\",peer=\"{peer}\",state=\"{s}\"}}"),
        )
        .unwrap_or_else(|| panic!("{peer} {s}\n{out}"))
    };
    assert_eq!(state("127.0.0.1:8001", "eligible"), 1.0);
    assert_eq!(state("127.0.0.1:8001", "down"), 0.0);
    assert_eq!(state("127.0.0.1:8002", "down"), 1.0);
    assert_eq!(state("127.0.0.1:8002", "eligible"), 0.0);
    assert_eq!(state("127.0.0.1:8003", "draining"), 1.0);
    for peer in ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"] {
        let ones = out
            .lines()
            .filter(|l| l.starts_with("vigil_peer_state{") && l.contains(peer) && l.ends_with(" 1"))
            .count();
        assert_eq!(ones, 1, "exactly one state per peer: {peer}");
    }
    assert_eq!(
        sample(
            &out,
            "vigil_peer_active_connections{upstream=\"api\",peer=\"127.0.0.1:8001\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &out,
            "vigil_peer_fails{upstream=\"api\",peer=\"127.0.0.1:8001\"}"
        ),
        Some(0.0)
    );
}

#[test]
fn a_reload_keeps_the_counters_of_what_stayed() {
    let m = ProxyMetrics::new();
    let first = registry(TWO, None);
    let g1 = m.attach(&first, &clock());
    let api = g1.upstream("api").expect("api");
    api.attempt(PeerId(0), Outcome::Ok);
    api.attempt(PeerId(1), Outcome::Failed(FailureClass::Error));
    api.request(200, Duration::from_millis(1));
    g1.upstream("static").expect("static").retry();
    assert!(
        Arc::ptr_eq(&m.attach(&first, &clock()), &g1),
        "same registry, same counters"
    );
    assert_eq!(m.reloads(), 0);

    // 8002 leaves, 8003 joins before 8001 (so 8001 changes index), static goes, cdn comes.
    let conf = "http { upstream api { server 127.0.0.1:8003; server 127.0.0.1:8001; }
        upstream cdn { server 127.0.0.1:7001; } }";
    let g2 = m.attach(&registry(conf, Some(&first)), &clock());
    assert_eq!(m.reloads(), 1);
    let api2 = g2.upstream("api").expect("api");
    assert!(Arc::ptr_eq(&api2.totals, &api.totals));
    assert!(
        Arc::ptr_eq(&api2.peers[1], &api.peers[0]),
        "8001 keeps its counters"
    );
    api2.attempt(PeerId(1), Outcome::Ok);
    let out = text(&m);
    let v = |s: &str| sample(&out, s);
    assert_eq!(
        v("vigil_attempts_total{upstream=\"api\",peer=\"127.0.0.1:8001\",outcome=\"ok\"}"),
        Some(2.0),
        "counted before and after the reload"
    );
    assert_eq!(
        v("vigil_attempts_total{upstream=\"api\",peer=\"127.0.0.1:8003\",outcome=\"ok\"}"),
        Some(0.0)
    );
    assert!(!out.contains("127.0.0.1:8002"), "a removed peer disappears");
    assert!(
        !out.contains("upstream=\"static\""),
        "a removed upstream disappears"
    );
    assert_eq!(v("vigil_retries_total{upstream=\"cdn\"}"), Some(0.0));
    assert_eq!(
        v("vigil_requests_total{upstream=\"api\",status_class=\"2xx\"}"),
        Some(1.0)
    );
    assert_eq!(v("vigil_reloads_total"), Some(1.0));
}

#[test]
fn repeated_addresses_get_distinct_labels() {
    let conf = "http { upstream api { server 127.0.0.1:8001; server 127.0.0.1:8001; } }";
    let m = ProxyMetrics::new();
    m.attach(&registry(conf, None), &clock());
    let out = text(&m);
    assert!(out.contains("vigil_exclusions_total{upstream=\"api\",peer=\"127.0.0.1:8001\"} 0"));
    assert!(out.contains("vigil_exclusions_total{upstream=\"api\",peer=\"127.0.0.1:8001#2\"} 0"));
}

#[test]
fn exclusion_events_are_counted() {
    let m = ProxyMetrics::new();
    m.attach(&registry(TWO, None), &clock());
    let event = |kind| Event {
        seq: 1,
        at: Timestamp(1),
        unix_ms: 1,
        upstream: "api".into(),
        peer: "127.0.0.1:8002".into(),
        kind,
    };
    m.on_event(&event(EventKind::Excluded {
        cause: FailureClass::Timeout,
        fails: 1,
        max_fails: 1,
        until: Timestamp(10_001),
        nth: 0,
    }));
    m.on_event(&event(EventKind::TrialRequest));
    m.on_event(&event(EventKind::SlowEjected {
        figure_us: 300_000,
        median_us: 1_000,
        max_us: None,
        requests: 20,
        until: Timestamp(5_001),
        nth: 1,
    }));
    m.on_event(&event(EventKind::Stuck {
        waited_ms: 250,
        threshold_ms: 200,
    }));
    m.on_event(&event(EventKind::StuckEnded {
        waited_ms: 1000,
        how: "it failed",
    }));
    let out = text(&m);
    for (rule, n) in [
        ("passive", 1.0),
        ("probe_down", 0.0),
        ("slow", 1.0),
        ("stuck", 1.0),
    ] {
        let series = format!(
            "vigil_ejections_total{{upstream=\"api\",peer=\"127.0.0.1:8002\",rule=\"{rule}\"}}"
        );
        assert_eq!(sample(&out, &series), Some(n), "{series}");
    }
    assert_eq!(
        sample(
            &out,
            "vigil_exclusions_total{upstream=\"api\",peer=\"127.0.0.1:8002\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &out,
            "vigil_exclusions_total{upstream=\"api\",peer=\"127.0.0.1:8001\"}"
        ),
        Some(0.0)
    );
}

#[test]
fn without_a_generation_only_reloads_are_written() {
    let out = text(&ProxyMetrics::new());
    assert_eq!(
        out,
        "# HELP vigil_reloads_total Configuration reloads put in force since start.\n# TYPE vigil_reloads_total counter\nvigil_reloads_total 0\n"
    );
}

#[test]
fn label_values_are_escaped() {
    let conf = r#"http { upstream "a\"b\\c" { server 127.0.0.1:8001; } }"#;
    let m = ProxyMetrics::new();
    m.attach(&registry(conf, None), &clock());
    let out = text(&m);
    assert!(
        out.contains(r#"vigil_retries_total{upstream="a\"b\\c"} 0"#),
        "{out}"
    );
}

#[test]
fn outcome_and_class_indices_follow_core_order() {
    for (i, o) in Outcome::ALL.into_iter().enumerate() {
        assert_eq!(o.index(), i);
    }
    for (i, c) in FailureClass::ALL.into_iter().enumerate() {
        assert_eq!(class_index(c), i);
        assert_eq!(Outcome::Failed(c).as_str(), c.as_str());
    }
    assert_eq!(
        Outcome::of_status(503),
        Outcome::Failed(FailureClass::Http503)
    );
    assert_eq!(Outcome::of_status(200), Outcome::Ok);
    assert_eq!(Outcome::of_status(501), Outcome::Ok);
}

/// Scrape cost with 50 upstreams × 20 peers: printed (run with
/// `--nocapture`), not asserted; the text must hold every peer.
#[test]
fn scrape_of_50_upstreams_by_20_peers() {
    let mut conf = String::from("http {");
    for u in 0..50 {
        let servers: String = (0..20)
            .map(|p| format!(" server 127.0.{u}.{p}:80;"))
            .collect();
        conf += &format!(" upstream u{u} {{{servers} }}");
    }
    conf += " }";
    let m = ProxyMetrics::new();
    let g = m.attach(&registry(&conf, None), &clock());
    for u in &g.upstreams {
        u.request(200, Duration::from_millis(3));
        u.attempt(PeerId(3), Outcome::Ok);
    }
    let start = tokio::time::Instant::now();
    let bytes = (0..20).map(|_| text(&m).len()).sum::<usize>() / 20;
    let each = start.elapsed() / 20;
    println!("proxy scrape, 50 upstreams x 20 peers: {each:?} per scrape, {bytes} bytes");
    let out = text(&m);
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("vigil_peer_fails{"))
            .count(),
        1000
    );
    assert_eq!(
        sample(
            &out,
            "vigil_attempts_total{upstream=\"u49\",peer=\"127.0.49.3:80\",outcome=\"ok\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn the_counters_at_a_routes_index_are_its_upstreams_and_a_stale_index_finds_them_by_name() {
    let m = ProxyMetrics::new();
    let g = m.attach(&registry(TWO, None), &clock());
    let by_name = |name: &str| g.upstream(name).map(Arc::as_ptr);
    assert_eq!(g.upstream_at(0, "api").map(Arc::as_ptr), by_name("api"));
    assert_eq!(
        g.upstream_at(1, "static").map(Arc::as_ptr),
        by_name("static")
    );
    // An index that names another upstream, or none, falls back to the name.
    assert_eq!(
        g.upstream_at(0, "static").map(Arc::as_ptr),
        by_name("static")
    );
    assert_eq!(
        g.upstream_at(usize::MAX, "api").map(Arc::as_ptr),
        by_name("api")
    );
    assert!(g.upstream_at(0, "nowhere").is_none());
}
