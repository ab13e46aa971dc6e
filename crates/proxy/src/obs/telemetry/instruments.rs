//! The OpenTelemetry side of [`ProxyMetrics`]: observable instruments
//! whose callbacks read the same atomics `/metrics` shows, when the SDK
//! collects (every `export_interval`). Nothing is recorded twice on the
//! request path.
//!
//! Names, labels and meanings are those of [`crate::obs::metrics`]. The OTel
//! metrics API has no asynchronous histogram, so the request-duration
//! histogram goes out as Prometheus writes it: cumulative counters
//! `vigil_request_duration_seconds_bucket{upstream,le}`, `_sum` and `_count`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::{AsyncInstrument, Meter};
use opentelemetry::KeyValue;
use vigil_core::{FailureClass, RetryDenied};

use crate::obs::metrics::{
    class_index, help, state_index, GenerationStats, Outcome, PeerStats, ProxyMetrics, BUCKETS,
    COUNT_RULES, EJECTION_RULES, PEER_STATES, STATUS_CLASSES,
};

/// Register every instrument on `meter`. (Long: a list, one registration
/// an instrument, read as the table of what vigil exports.)
pub(crate) fn register(meter: &Meter, metrics: &Arc<ProxyMetrics>) {
    counter(
        meter,
        metrics,
        "vigil_requests_total",
        help::REQUESTS,
        |g, o| {
            for u in &g.upstreams {
                let t = &u.totals;
                for (i, class) in STATUS_CLASSES.iter().enumerate() {
                    o.observe(
                        t.requests(i),
                        &[up(&t.name), KeyValue::new("status_class", *class)],
                    );
                }
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_attempts_total",
        help::ATTEMPTS,
        |g, o| {
            for (name, p) in peers(g) {
                for out in Outcome::ALL {
                    let v = p.attempts(out);
                    o.observe(
                        v,
                        &[up(name), peer(p), KeyValue::new("outcome", out.as_str())],
                    );
                }
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_retries_total",
        help::RETRIES,
        |g, o| {
            for u in &g.upstreams {
                o.observe(load(&u.totals.retries), &[up(&u.totals.name)]);
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_failures_counted_total",
        help::COUNTED,
        |g, o| {
            for (name, p) in peers(g) {
                for c in FailureClass::ALL.into_iter().filter(|c| c.is_counted()) {
                    o.observe(
                        load(&p.counted[class_index(c)]),
                        &[up(name), peer(p), KeyValue::new("class", c.as_str())],
                    );
                }
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_rule_charges_total",
        help::RULE_CHARGES,
        |g, o| {
            for (name, p) in peers(g) {
                for (rule, n) in COUNT_RULES.iter().zip(&p.by_rule) {
                    o.observe(load(n), &[up(name), peer(p), KeyValue::new("rule", *rule)]);
                }
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_no_live_upstreams_total",
        help::NO_LIVE,
        |g, o| {
            for u in &g.upstreams {
                o.observe(load(&u.totals.no_live), &[up(&u.totals.name)]);
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_exclusions_total",
        help::EXCLUSIONS,
        |g, o| {
            for (name, p) in peers(g) {
                o.observe(load(&p.exclusions), &[up(name), peer(p)]);
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_hedges_total",
        help::HEDGES,
        |g, o| {
            for u in &g.upstreams {
                o.observe(load(&u.totals.hedges), &[up(&u.totals.name)]);
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_retries_denied_total",
        help::DENIED,
        |g, o| {
            for u in &g.upstreams {
                for why in RetryDenied::ALL {
                    o.observe(
                        load(&u.totals.denied[why.index()]),
                        &[up(&u.totals.name), KeyValue::new("reason", why.as_str())],
                    );
                }
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_ejections_total",
        help::EJECTIONS,
        |g, o| {
            for (name, p) in peers(g) {
                for (rule, n) in EJECTION_RULES.iter().zip(&p.ejections) {
                    o.observe(load(n), &[up(name), peer(p), KeyValue::new("rule", *rule)]);
                }
            }
        },
    );
    histogram(meter, metrics);
    gauges(meter, metrics);
    let m = metrics.clone();
    meter
        .u64_observable_counter("vigil_reloads_total")
        .with_description(help::RELOADS)
        .with_callback(move |o| o.observe(m.reloads(), &[]))
        .build();
}

fn histogram(meter: &Meter, metrics: &Arc<ProxyMetrics>) {
    counter(
        meter,
        metrics,
        "vigil_request_duration_seconds_bucket",
        "Requests whose response header was sent within `le` seconds (cumulative).",
        |g, o| {
            for u in &g.upstreams {
                let t = &u.totals;
                let mut cumulative = 0;
                for (le, n) in BUCKETS.iter().zip(t.buckets()) {
                    cumulative += n;
                    o.observe(
                        cumulative,
                        &[up(&t.name), KeyValue::new("le", le.to_string())],
                    );
                }
                o.observe(t.count(), &[up(&t.name), KeyValue::new("le", "+Inf")]);
            }
        },
    );
    counter(
        meter,
        metrics,
        "vigil_request_duration_seconds_count",
        "Requests timed by vigil_request_duration_seconds.",
        |g, o| {
            for u in &g.upstreams {
                o.observe(u.totals.count(), &[up(&u.totals.name)]);
            }
        },
    );
    let m = metrics.clone();
    meter
        .f64_observable_counter("vigil_request_duration_seconds_sum")
        .with_description("Total seconds to the response header, over all requests.")
        .with_unit("s")
        .with_callback(move |o| {
            if let Some(g) = m.current() {
                for u in &g.upstreams {
                    o.observe(u.totals.sum_us() as f64 / 1e6, &[up(&u.totals.name)]);
                }
            }
        })
        .build();
}

fn gauges(meter: &Meter, metrics: &Arc<ProxyMetrics>) {
    gauge(
        meter,
        metrics,
        "vigil_peer_active_connections",
        help::CONNS,
        |g, o| {
            for (up_name, stats, s) in statuses(g) {
                o.observe(u64::from(s.peer.conns()), &[up(up_name), peer(stats)]);
            }
        },
    );
    gauge(meter, metrics, "vigil_peer_state", help::STATE, |g, o| {
        for (up_name, stats, s) in statuses(g) {
            let current = state_index(&s);
            for (i, state) in PEER_STATES.iter().enumerate() {
                o.observe(
                    u64::from(i == current),
                    &[
                        up(up_name),
                        peer(stats),
                        KeyValue::new("state", state.as_str()),
                    ],
                );
            }
        }
    });
    gauge(meter, metrics, "vigil_peer_fails", help::FAILS, |g, o| {
        for (up_name, stats, s) in statuses(g) {
            o.observe(u64::from(s.passive.fails), &[up(up_name), peer(stats)]);
        }
    });
}

type Observe = dyn Fn(&GenerationStats, &dyn AsyncInstrument<u64>) + Send + Sync;

fn counter(
    meter: &Meter,
    metrics: &Arc<ProxyMetrics>,
    name: &'static str,
    help: &'static str,
    f: impl Fn(&GenerationStats, &dyn AsyncInstrument<u64>) + Send + Sync + 'static,
) {
    let cb = callback(metrics, Box::new(f));
    meter
        .u64_observable_counter(name)
        .with_description(help)
        .with_callback(cb)
        .build();
}

fn gauge(
    meter: &Meter,
    metrics: &Arc<ProxyMetrics>,
    name: &'static str,
    help: &'static str,
    f: impl Fn(&GenerationStats, &dyn AsyncInstrument<u64>) + Send + Sync + 'static,
) {
    let cb = callback(metrics, Box::new(f));
    meter
        .u64_observable_gauge(name)
        .with_description(help)
        .with_callback(cb)
        .build();
}

/// `f` over the generation in force, if any.
fn callback(
    metrics: &Arc<ProxyMetrics>,
    f: Box<Observe>,
) -> impl Fn(&dyn AsyncInstrument<u64>) + Send + Sync + 'static {
    let m = metrics.clone();
    move |o| {
        if let Some(g) = m.current() {
            f(&g, o);
        }
    }
}

fn peers(g: &GenerationStats) -> impl Iterator<Item = (&Arc<str>, &Arc<PeerStats>)> {
    g.upstreams
        .iter()
        .flat_map(|u| u.peers.iter().map(move |p| (&u.totals.name, p)))
}

/// Each peer's status now, with its counters.
fn statuses(
    g: &GenerationStats,
) -> Vec<(&Arc<str>, &Arc<PeerStats>, vigil_core::upstream::PeerStatus)> {
    let now = g.clock.now();
    let mut out = Vec::new();
    for (u, stats) in g.registry.upstreams().iter().zip(&g.upstreams) {
        for (s, p) in u.status(now).into_iter().zip(stats.peers.iter()) {
            out.push((&stats.totals.name, p, s));
        }
    }
    out
}

fn up(name: &Arc<str>) -> KeyValue {
    KeyValue::new("upstream", name.clone())
}

fn peer(p: &PeerStats) -> KeyValue {
    KeyValue::new("peer", p.peer.clone())
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}
