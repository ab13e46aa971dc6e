use std::sync::Arc;
use std::time::Duration;

use vigil_config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::health::ProbePhase;
use vigil_core::registry::Registry;
use vigil_core::{Clock, ManualClock};

use super::Metrics;
use crate::probe::tls::TlsCache;
use crate::status::StatusPage;
use crate::TlsPolicy;

fn registry(conf: &str) -> Arc<Registry> {
    let loaded = nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
        .unwrap_or_else(|e| panic!("{e}"));
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at(1_000));
    Arc::new(Registry::build(
        &loaded.config,
        None,
        Arc::new(EventBus::default()),
        clock,
    ))
}

/// Scrape cost of the whole checker `/metrics` with 50 upstreams × 20
/// checked peers: printed (run with `--nocapture`), not asserted; the text
/// must hold every target.
#[test]
fn scrape_of_50_upstreams_by_20_peers() {
    let upstream = |u| {
        let servers: String = (0..20)
            .map(|p| format!(" server 127.0.{u}.{p}:80;"))
            .collect();
        format!(" upstream u{u} {{{servers} check interval=1000 timeout=500 type=http; }}")
    };
    let conf = format!("http {{{} }}", (0..50).map(upstream).collect::<String>());
    let reg = registry(&conf);
    let metrics = Arc::new(Metrics::default());
    let planned =
        crate::target::plan(&reg, true, &TlsPolicy::default(), &TlsCache::default()).expect("plan");
    for p in &planned {
        let t = metrics.target(&p.key);
        t.record(None, Duration::from_millis(2));
        t.record(Some(ProbePhase::Status), Duration::from_millis(30));
    }
    let r = reg.clone();
    let page = StatusPage::new(move || r.clone());
    let prometheus = page.prometheus_registry(Some(metrics));
    let page = page.with_prometheus(Arc::new(prometheus));
    let start = tokio::time::Instant::now();
    let bytes = (0..20).map(|_| page.metrics_text().len()).sum::<usize>() / 20;
    let each = start.elapsed() / 20;
    println!("checker scrape, 50 upstreams x 20 peers: {each:?} per scrape, {bytes} bytes");
    let out = page.metrics_text();
    assert!(out.contains("vigil_probe_targets 1000\n"), "{out}");
    assert!(out.contains(
        "vigil_probe_results_total{peer=\"127.0.49.19:80\",type=\"http\",result=\"fail\",phase=\"status\"} 1\n"
    ));
}

/// A unix-socket peer's probes are labelled with its path, and two such
/// peers are two series (not one `0.0.0.0:0`).
#[test]
fn unix_socket_peers_are_labelled_by_their_paths() {
    let reg = registry(
        "http { upstream u { server unix:/run/a.sock; server unix:/run/b.sock; \
         check interval=1000 timeout=500 type=tcp; } }",
    );
    let metrics = Arc::new(Metrics::default());
    let planned =
        crate::target::plan(&reg, true, &TlsPolicy::default(), &TlsCache::default()).expect("plan");
    assert_eq!(planned.len(), 2);
    for p in &planned {
        metrics
            .target(&p.key)
            .record(None, Duration::from_millis(1));
    }
    let r = reg.clone();
    let page = StatusPage::new(move || r.clone());
    let prometheus = page.prometheus_registry(Some(metrics));
    let out = page.with_prometheus(Arc::new(prometheus)).metrics_text();
    for path in ["/run/a.sock", "/run/b.sock"] {
        let line = format!(
            "vigil_probe_results_total{{peer=\"unix:{path}\",type=\"tcp\",result=\"ok\",phase=\"none\"}} 1\n"
        );
        assert!(out.contains(&line), "{line} in {out}");
    }
    assert!(!out.contains("0.0.0.0:0"), "{out}");
}
